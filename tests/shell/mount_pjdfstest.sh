#!/usr/bin/env bash
# POSIX conformance of `hydramem mount`: pjdfstest (the Rust version of the suite FreeBSD,
# ZFS and FUSE file systems are checked with; 398 cases of chmod, chown, link, mkdir, mkfifo,
# mknod, open, posix_fallocate, rename, rmdir, symlink, truncate, ftruncate, unlink and
# utimensat, as root and as two other users) on a hydra 8+2 mount. Every case must pass but
# those pjdfstest itself skips here: the EROFS cases (they remount the file system read-only),
# the EXDEV cases (they need a second file system) and link_count_max (too many links to
# make).
set -euo pipefail
. "$(dirname "$0")/lib/mount.sh"
need_mount
command -v pjdfstest >/dev/null 2>&1 || fail "pjdfstest is missing (HYDRAMEM_SETUP_TEST=1 scripts/setup)"
if ! getent passwd nobody daemon >/dev/null || ! getent group nogroup daemon >/dev/null; then
  skip "pjdfstest's other users (nobody:nogroup, daemon:daemon) do not exist here"
fi
cat >"$dir/pjdfstest.toml" <<'TOML'
[features]
posix_fallocate = {}
utimensat = {}
utime_now = {}
rename_ctime = {}
[settings]
# Longer than the kernel's timestamp granularity, as on ext4 (0.001 fails there too).
naptime = 0.02
allow_remount = false
[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
TOML
NODES=10 start_nodes
mount_fs --scheme hydra-8+2-d1 --size 256MiB --allow-other
# The other users must reach the mount point.
chmod 755 "$dir" "$MNT"
(cd "$MNT" && pjdfstest -c "$dir/pjdfstest.toml" -p "$MNT") >"$dir/pjdfstest.log" 2>&1 || true
summary=$(grep '^Summary:' "$dir/pjdfstest.log") || fail "pjdfstest did not finish: $(tail -n 20 "$dir/pjdfstest.log")"
echo "  $summary"
grep -q '^Summary: 0 failed' <<<"$summary" ||
  fail "pjdfstest failed: $(grep -A 1 'FAILED$' "$dir/pjdfstest.log" | grep -v -- '^--')"
unexpected=$(awk '$NF == "skipped" {print $1}' "$dir/pjdfstest.log" |
  grep -v -E '::erofs_|::exdev_target$|^link::link_count_max$' || true)
[ -z "$unexpected" ] || fail "pjdfstest skipped cases it should run: $unexpected"
echo "PASS mount_pjdfstest"
