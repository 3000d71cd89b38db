#!/usr/bin/env bash
# fio's NBD engine runs a random read/write workload at queue depth 8 over two connections
# with --verify=crc32c: every block read back matches what was written, and fio reports no
# error.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need fio fio
fio --enghelp=nbd >/dev/null 2>&1 || skip "this fio has no nbd engine"
start_export 64MiB
cd "$dir" # fio keeps its verify state files in the working directory
fio --name=randrw --ioengine=nbd --uri="$URI" --rw=randrw --rwmixread=50 --bs=4k,16k \
  --size=32M --iodepth=8 --numjobs=2 --offset_increment=32M --verify=crc32c \
  --verify_fatal=1 --do_verify=1 --output-format=json --output="$dir/fio.json"
cd - >/dev/null
python3 - "$dir/fio.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for j in d["jobs"]:
    assert j["error"] == 0, j["error"]
    assert j["write"]["io_bytes"] > 0 and j["read"]["io_bytes"] > 0, j["jobname"]
    print(f'{j["jobname"]}: {j["write"]["io_bytes"] >> 20} MiB written, {j["read"]["io_bytes"] >> 20} MiB read and verified, error {j["error"]}')
PY
stop_export
echo "PASS nbd_fio"
