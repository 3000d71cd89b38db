#!/usr/bin/env bash
# fio with verification on files of a hydra-8+2-d1 mount: psync and libaio (queue depth 16),
# O_DIRECT and buffered, 4 KiB random and 1 MiB sequential writes, all eight at once, each
# verified with crc32c as it runs; then, with the page cache dropped, every block is read
# back from the cluster and verified again (verify_only).
set -euo pipefail
. "$(dirname "$0")/lib/mount.sh"
need_mount
need fio fio
need python3 python3

NODES=10 start_nodes
mount_fs --scheme hydra-8+2-d1 --size 1GiB

jobs="$dir/mount.fio"
printf '[global]\nsize=32M\nverify=crc32c\nverify_fatal=1\ndo_verify=1\n' >"$jobs"
for engine in psync libaio; do
  for direct in 1 0; do
    for pattern in randwrite:4k write:1M; do
      name="$engine-direct$direct-${pattern%%:*}-${pattern##*:}"
      printf '[%s]\nfilename=%s\nioengine=%s\niodepth=%d\ndirect=%d\nrw=%s\nbs=%s\n' \
        "$name" "$MNT/$name" "$engine" $([ "$engine" = libaio ] && echo 16 || echo 1) "$direct" \
        "${pattern%%:*}" "${pattern##*:}" >>"$jobs"
    done
  done
done

check() { # fio's JSON report: no job failed, every job wrote and verified all its bytes
  python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["jobs"]) == 8, len(d["jobs"])
for j in d["jobs"]:
    assert j["error"] == 0, (j["jobname"], j["error"])
    written, read = j["write"]["io_bytes"], j["read"]["io_bytes"]
    if sys.argv[2] == "write":
        assert written == 32 << 20, (j["jobname"], written)
    assert read == 32 << 20, (j["jobname"], "verified", read)
    done = f"{written >> 20} MiB written, " if sys.argv[2] == "write" else ""
    print(f'  {j["jobname"]}: {done}{read >> 20} MiB read and verified')
PY
}

cd "$dir" # fio keeps its verify state files in the working directory
fio --output-format=json --output="$dir/write.json" "$jobs" || { cat "$dir/write.json"; fail "fio failed"; }
echo "fio wrote and verified (crc32c) 8 files at once:"
check "$dir/write.json" write
sync
echo 3 >/proc/sys/vm/drop_caches
fio --verify_only --output-format=json --output="$dir/verify.json" "$jobs" ||
  { cat "$dir/verify.json"; fail "fio's verification from the cluster failed"; }
echo "page cache dropped; every block read back from the cluster and verified again:"
check "$dir/verify.json" verify
cd - >/dev/null
stop_mount SIGTERM
echo "PASS mount_fio"
