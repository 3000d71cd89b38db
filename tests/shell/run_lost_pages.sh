#!/usr/bin/env bash
# With more memory nodes lost than the scheme survives, a program under hydramem run gets
# SIGBUS on a page that cannot be brought back, with a log line naming it — never other
# bytes. python3 fills a 96 MiB numpy array at 48 MiB local under hydra-8+2-d1 on 10 nodes
# (each coding group spans all of them); once most of it is out, three nodes are killed and
# the program's next page-in must end it with SIGBUS.
set -euo pipefail
. "$(dirname "$0")/lib/run.sh"
need_run
need_numpy

NODES=10 start_nodes
start_numpy hydra-8+2-d1 96 48 --op-timeout 5
kill_node 1
kill_node 4
kill_node 8
echo "killed memory nodes 1, 4 and 8 (the scheme survives two)"
touch "$dir/go"
status=0
wait "$run_pid" || status=$?
[ "$status" -eq $((128 + 7)) ] || fail "expected SIGBUS (exit status 135), got $status"
grep -q 'could not be read from the cluster.*SIGBUS' "$dir/run.out" ||
  fail "no log line naming the lost page"
! grep -q '^updated' "$dir/run.out" || fail "the program went on past a lost page"
grep -m 1 'could not be read' "$dir/run.out" | sed 's/\x1b\[[0-9;]*m//g'
echo "PASS run_lost_pages"
