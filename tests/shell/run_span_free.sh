#!/usr/bin/env bash
# Memory a program frees stops costing remote memory under span coding: python3 fills a
# 96 MiB bytearray at 32 MiB local (span-8+2), so most of it goes out to the nodes, then frees
# it (the C library unmaps it) and exits. The pager tells the span store that those pages
# will never be read again: the run summary shows them forgotten and the span rows holding
# almost nothing, where before they stayed live (and compaction moved them) until their
# slots were written again.
set -euo pipefail
. "$(dirname "$0")/lib/run.sh"
need_run

NODES=12 start_nodes
prog='a = bytearray(range(256)) * (96 << 12); print(sum(a[1::4096])); del a; b = bytearray(range(256)) * (4 << 12); print(len(b))'
run_paged span-8+2 32MiB /usr/bin/python3 -c "$prog" || fail "python3 under hydramem run exited with $?"
grep -qx 4194304 "$dir/run.out" || fail "python3 did not run to its end"
check_paged "python3 bytearray freed (span-8+2)"
span_rows "$dir/run.out"
# 96 MiB less the 32 MiB budget is 16384 pages out at the least.
[ "$forgotten" -ge 16384 ] || fail "only $forgotten pages forgotten after the program freed 96 MiB: $line"
[ "$live" -le 1024 ] || fail "$live pages still live in the span rows after the program freed them: $line"
echo "python3 freed 96 MiB (span-8+2): $forgotten pages forgotten, $live left in the span rows"
echo "PASS run_span_free"
