#!/usr/bin/env bash
# hydramem run and memory the program locks (mlock): python3 fills a 48 MiB mapping it locked
# and a 48 MiB bytearray it did not, under a 48 MiB budget (rep2), and hashes both four times. The
# kernel refuses to drop a locked page; the pager must then keep it resident and say so — not
# record it as sent out (it used to write it to the cluster and never evict it again, with its
# buffer and slot held) — and must not try it again: each locked page is refused at most once.
# Once the program unlocks it (munlock), the mapping is paged again. Every hash equals the
# plain run's.
set -euo pipefail
. "$(dirname "$0")/lib/run.sh"
need_run

prog='import ctypes, hashlib, mmap, sys
libc = ctypes.CDLL(None, use_errno=True)
locked = mmap.mmap(-1, 48 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
view = (ctypes.c_char * len(locked)).from_buffer(locked)
if libc.mlock(ctypes.c_void_p(ctypes.addressof(view)), ctypes.c_size_t(len(locked))) != 0:
    print("mlock failed: errno", ctypes.get_errno()); sys.exit(3)
free = bytearray(48 << 20)
page = bytes(range(256)) * 16
for m in (locked, free):
    for i in range(0, len(m), 4096):
        m[i:i + 4096] = page
        m[i:i + 8] = i.to_bytes(8, "little")
for _ in range(4):
    print(hashlib.sha256(locked).hexdigest(), hashlib.sha256(free).hexdigest())
# Unlocked, its pages may go out again.
addr, n = ctypes.c_void_p(ctypes.addressof(view)), len(locked) // 4096
if libc.munlock(addr, ctypes.c_size_t(len(locked))) != 0:
    print("munlock failed: errno", ctypes.get_errno()); sys.exit(4)
for _ in range(4):
    print(hashlib.sha256(locked).hexdigest(), hashlib.sha256(free).hexdigest())
vec = (ctypes.c_ubyte * n)()
libc.mincore(addr, ctypes.c_size_t(len(locked)), vec)
print("resident after munlock:", sum(b & 1 for b in vec), "of", n, file=sys.stderr)
'
plain=$(/usr/bin/python3 -c "$prog" 2>/dev/null) || {
  [ $? -eq 3 ] && skip "this user may not lock 48 MiB (ulimit -l): $plain"
  fail "the plain run exited with an error: $plain"
}

NODES=4 start_nodes
run_paged rep2 48MiB /usr/bin/python3 -c "$prog" || fail "python3 under hydramem run exited with $?"
[ "$(grep '^[0-9a-f]\{64\} ' "$dir/run.out")" = "$plain" ] ||
  fail "the hashes differ from the plain run's: $plain"
check_paged "python3 with a locked mapping"
refused=$(sed -nE 's/.*the kernel refused to drop ([0-9]+) pages \(the program locked them.*/\1/p' "$dir/run.out")
[ -n "$refused" ] || fail "the run does not say that the kernel refused to drop locked pages"
# 12,288 locked pages of 4 KiB: a page refused more than once would go past them.
[ "$refused" -le 12288 ] || fail "$refused refusals for 12,288 locked pages: locked pages are tried again"
# After munlock the mapping is paged like any other: under the budget, part of it is out.
left=$(sed -nE 's/^resident after munlock: ([0-9]+) of 12288$/\1/p' "$dir/run.out")
[ -n "$left" ] || fail "the program did not say how much of the unlocked mapping is resident"
[ "$left" -lt 12288 ] || fail "none of the unlocked mapping was paged out: its pages stay locked for the pager"
echo "python3 with a 48 MiB locked mapping under a 48 MiB budget: $refused locked pages refused once and kept, hashes right; after munlock $left of its 12,288 pages resident"
echo "PASS run_locked"
