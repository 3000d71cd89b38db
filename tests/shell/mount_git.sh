#!/usr/bin/env bash
# git in a hydra-8+2-d1 mount: a clone of this project's repository (--no-local, so every
# object is copied through the file system) passes `git fsck --full`, and its checked-out tree
# equals a clone on the local disk, also after a commit and `git gc` (which rewrites the
# packs) and with the page cache dropped, so that every byte is read back from the cluster.
set -euo pipefail
. "$(dirname "$0")/lib/mount.sh"
need_mount
need git git

git clone -q --bare --no-local . "$dir/origin.git"
git clone -q --no-local "$dir/origin.git" "$dir/local"

NODES=10 start_nodes
mount_fs --scheme hydra-8+2-d1 --size 1GiB

# same_tree: the clone in the mount is clean, fsck finds nothing, and its files (names,
# modes, bytes) equal the local clone's.
same_tree() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
  git -C "$MNT/repo" fsck --full --strict --no-progress || fail "git fsck found errors in the mount ($1)"
  [ -z "$(git -C "$MNT/repo" status --porcelain)" ] || fail "git status is not clean in the mount ($1)"
  diff -r --no-dereference -x .git "$dir/local" "$MNT/repo" || fail "the checked-out tree differs ($1)"
  [ "$(cd "$dir/local" && find . -path ./.git -prune -o ! -type d -printf '%p %M %s\n' | sort)" = \
    "$(cd "$MNT/repo" && find . -path ./.git -prune -o ! -type d -printf '%p %M %s\n' | sort)" ] || fail "names, modes or sizes differ ($1)"
  echo "$1: fsck clean, status clean, $(git -C "$MNT/repo" ls-files | wc -l) files identical to the local clone"
}

git clone -q --no-local "$dir/origin.git" "$MNT/repo"
same_tree "git clone --no-local"

for r in "$dir/local" "$MNT/repo"; do
  printf 'a line added in both clones\n' >>"$r/README.md"
  git -C "$r" -c user.name=test -c user.email=test@example.invalid commit -q -am "a commit in the test"
done
[ "$(git -C "$MNT/repo" rev-parse HEAD^{tree})" = "$(git -C "$dir/local" rev-parse HEAD^{tree})" ] ||
  fail "the same commit has another tree in the mount"
git -C "$MNT/repo" gc -q --aggressive --prune=now
same_tree "after a commit and git gc --aggressive"
stop_mount SIGTERM
echo "PASS mount_git"
