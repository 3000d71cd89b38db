#!/usr/bin/env bash
# fork under hydramem run: the pager does not follow a child, so before fork it brings every
# page of the program back. python3 fills a 64 MiB numpy array at 48 MiB local under rep2;
# once part of it is out, it forks: the child hashes the array as it sees it, and the parent
# then updates and hashes its own. The child's hash must equal the filled array's, and the
# parent's the plain run's.
set -euo pipefail
. "$(dirname "$0")/lib/run.sh"
need_run
need_numpy

plain=$(/usr/bin/python3 tests/shell/lib/numpy_pages.py 64)
NODES=4 start_nodes
export FORK_CHECK=1
start_numpy rep2 64 48
touch "$dir/go"
wait "$run_pid" || fail "the program under hydramem run exited with $?"
filled=$(sed -n 's/^filled //p' "$dir/run.out")
child=$(sed -n 's/^child //p' "$dir/run.out")
[ -n "$child" ] || fail "the child printed nothing"
[ "$child" = "$filled" ] || fail "the child saw another array ($child) than the one filled ($filled)"
[ "$(grep -E '^(filled|updated)' "$dir/run.out")" = "$plain" ] ||
  fail "the parent's array differs from the plain run's"
check_paged "python3/numpy with a fork (rep2)"

# A child that outlives the program (a daemon's fork) does not keep the program's remote
# memory: it closes the pager's connections it inherited, so the nodes let `hydramem run`
# release the program's identity as soon as the program ends.
unset FORK_CHECK
export FORK_LINGER="$dir/linger"
start_numpy rep2 64 48
touch "$dir/go"
wait "$run_pid" || fail "the program with a lingering child exited with $?"
child_pid=$(pgrep -f 'numpy_pages.py 64' || true)
[ -n "$child_pid" ] || fail "the lingering child is gone before the check"
if grep -q 'did not release' "$dir/run.out"; then
  fail "the program's memory was kept while its child lived: $(grep 'did not release' "$dir/run.out" | head -n 1)"
fi
check_paged "python3/numpy with a child that outlives it (rep2)"
touch "$dir/linger"
echo "PASS run_fork"
