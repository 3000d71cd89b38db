#!/usr/bin/env bash
# hydramem run survives the loss of r memory nodes while the program pages: python3 fills a
# 96 MiB numpy array at 48 MiB local under hydra-8+2-d1 on 10 nodes; once most of it is out in
# the cluster, two nodes are killed, and the program updates and hashes the whole array. Both
# SHA-256s must equal those of the same program run plainly, and the pager must have lost
# nothing.
set -euo pipefail
. "$(dirname "$0")/lib/run.sh"
need_run
need_numpy

plain=$(/usr/bin/python3 tests/shell/lib/numpy_pages.py 96)
NODES=10 start_nodes
start_numpy hydra-8+2-d1 96 48
kill_node 2
kill_node 7
echo "killed memory nodes 2 and 7 with the program's pages out"
touch "$dir/go"
wait "$run_pid" || fail "the program under hydramem run exited with $? after two node losses"
[ "$(grep -E '^(filled|updated)' "$dir/run.out")" = "$plain" ] ||
  fail "the array differs from the plain run's"
check_paged "python3/numpy after 2 of 10 nodes lost (hydra-8+2-d1)"
echo "PASS run_node_kills"
