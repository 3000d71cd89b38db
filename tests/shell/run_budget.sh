#!/usr/bin/env bash
# hydramem run holds --local-memory: (1) python3 fills a 256 MiB bytearray at full speed under
# a 64 MiB budget (rep2) — the pager starts and registers the program's memory before it
# connects, and holds faults back while the evictor catches up, so the program's peak
# resident memory stays under 1.5 times the budget (74-77 MiB measured; 128-148 MiB before
# both), the pager's own memory (counted apart) is said and bounded, and the hash equals the
# plain run's; the same with the program and the pager on one CPU;
# (2) under span-8+2, a program that fits its budget is not paged at all — the client's own
# tables and buffers (made zeroed, untouched) do not take the program's memory, nor does the
# standby pool; (3) a standby pool of more than half the budget is refused, with the reason.
set -euo pipefail
. "$(dirname "$0")/lib/run.sh"
need_run

NODES=12 start_nodes

fill='import hashlib; a = bytearray(range(256)) * (1 << 20); a[::4096] = bytes(len(a) // 4096); print(hashlib.sha256(a).hexdigest())'
plain=$(/usr/bin/python3 -c "$fill")
# fill_within_budget WHAT [CMD...]: the fill under a 64 MiB budget (rep2), `hydramem run`
# started through CMD (taskset) if given: the hash is the plain run's, pages went out and came
# back, none lost, and the peak resident memory ($peak) is under 1.5 times the budget.
fill_within_budget() {
  local what=$1
  shift
  "$@" "$BIN" run --cluster "$dir/cluster.toml" --scheme rep2 --local-memory 64MiB \
    -- /usr/bin/python3 -c "$fill" >"$dir/run.out" 2>&1 || fail "$what under hydramem run exited with $?"
  grep -qx "$plain" "$dir/run.out" || fail "$what: the bytearray's hash differs from the plain run's ($plain)"
  check_paged "$what"
  peak=$(sed -nE 's/.*peak resident ([0-9]+)\.[0-9] MiB of 64\.0 MiB.*/\1/p' "$dir/run.out")
  [ -n "$peak" ] || fail "$what: no peak resident memory in the run summary"
  [ "$peak" -le 96 ] || fail "$what: the peak resident memory was $peak MiB against a budget of 64 MiB"
}

fill_within_budget "python3 bytearray (rep2)"
# The pager's own memory is counted apart and said (17-22 MiB measured for rep2 with twelve
# connections; about 5 MiB plus 150 bytes per page of the program's): the bound catches a
# pager whose own memory grows well past that.
own=$(sed -nE "s/.*the pager's own ([0-9]+)\.[0-9] MiB.*/\1/p" "$dir/run.out")
[ -n "$own" ] || fail "the run summary does not say the pager's own memory"
[ "$own" -le 48 ] || fail "the pager's own memory was $own MiB"
echo "python3 bytearray (rep2): peak resident $peak MiB of 64 MiB, the pager's own $own MiB"

# The same on one CPU: the evictor shares it with the program, so its first batch over the
# budget takes long, and faults must be held from its start (272 MiB of 64 when they were
# held only once a batch had dropped pages).
command -v taskset >/dev/null || skip "no taskset (util-linux) to put a program on one CPU"
cpu=$(python3 -c 'import os; print(min(os.sched_getaffinity(0)))')
fill_within_budget "python3 bytearray (rep2) on one CPU" taskset -c "$cpu"
echo "python3 bytearray (rep2) on one CPU: peak resident $peak MiB of 64 MiB"

fits='b = bytearray(40 << 20); b[::4096] = b"x" * len(b[::4096]); print(sum(b[::4096]))'
run_paged span-8+2 64MiB /usr/bin/python3 -c "$fits" || fail "python3 under hydramem run exited with $?"
grep -qx "$((120 * 10240))" "$dir/run.out" || fail "the 40 MiB bytearray read back wrong"
line=$(grep 'hydramem run: pid .* page-ins' "$dir/run.out") || fail "no report from the pager"
if ! grep -q ': 0 page-ins' <<<"$line" || ! grep -q ' 0 pages written out' <<<"$line"; then
  fail "a program within its budget was paged under span-8+2: $line"
fi
echo "python3 within its budget (span-8+2): not paged"

if "$BIN" run --cluster "$dir/cluster.toml" --scheme rep2 --local-memory 64MiB --standby 40MiB \
  -- true 2>"$dir/standby.err"; then
  fail "a standby pool of 40 MiB in a budget of 64 MiB was accepted"
fi
grep -q 'must be at most half of --local-memory' "$dir/standby.err" ||
  fail "the refusal of --standby 40MiB does not say why: $(cat "$dir/standby.err")"
echo "--standby above half the budget: refused"
echo "PASS run_budget"
