# Sourced by the tests/shell/run_*.sh scripts: `hydramem run` on memory nodes started one by
# one (lib/nbd.sh's start_nodes, so a script holds each node's pid and can kill some), and the
# checks every such script makes on what the command printed. The scripts run from the
# repository root.
# shellcheck source=lib/nbd.sh
. "$(dirname "${BASH_SOURCE[0]}")/nbd.sh"
. scripts/lib/swap.sh # wait_until

PROBE=${HYDRAMEM_PROBE:-target/release/hydramem-fault-probe}

# fail MESSAGE: the test failed; say why, with the end of the program's output.
fail() {
  echo "FAIL $(basename "$0" .sh): $1"
  [ -f "$dir/run.out" ] && tail -n 20 "$dir/run.out"
  exit 1
}

# need_run: what every run test needs (userfaultfd for this user, the binaries), or a skip.
need_run() {
  [ -x "$BIN" ] || fail "$BIN is missing (cargo build --release -p hydramem)"
  [ -f "$(dirname "$BIN")/libhydramem_pager.so" ] ||
    fail "the pager library is missing (cargo build --release -p hydramem-pager)"
  if [ "$(id -u)" -ne 0 ] && [ "$(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null)" != 1 ] &&
    ! [ -r /dev/userfaultfd ]; then
    skip "this user may not use userfaultfd (run as root or set vm.unprivileged_userfaultfd=1)"
  fi
}

# run_paged SCHEME LOCAL PROGRAM ARGS...: runs PROGRAM under hydramem run on the nodes of
# start_nodes, output (both streams) in $dir/run.out; returns the program's status.
run_paged() {
  local scheme=$1 local=$2
  shift 2
  rm -f "$dir/report.jsonl"
  PAGED_REPORT=$dir/report.jsonl
  "$BIN" run --cluster "$dir/cluster.toml" --scheme "$scheme" --local-memory "$local" \
    --report "$PAGED_REPORT" -- "$@" >"$dir/run.out" 2>&1
}

# check_paged WHAT: the run summary says pages went out and came back, none lost, and the
# remote memory was released; after run_paged, the report, that the pager threads'
# destructors were its own.
check_paged() {
  local line ins written
  line=$(grep 'hydramem run: pid .* page-ins' "$dir/run.out" | tail -n 1) ||
    fail "$1: no report from the pager"
  ins=$(sed -E 's/.*: ([0-9]+) page-ins.*/\1/' <<<"$line")
  written=$(sed -E 's/.* ([0-9]+) pages written out.*/\1/' <<<"$line")
  [ "$ins" -gt 0 ] && [ "$written" -gt 0 ] || fail "$1 was not paged: $line"
  grep -q ' 0 lost' <<<"$line" || fail "$1 lost pages: $line"
  grep -q 'released .* of remote memory' "$dir/run.out" || fail "$1: remote memory not released"
  # The pager's threads keep their thread-locals' destructors on the library's own list, off
  # the C library's (which takes the dynamic loader's lock): the library's definition is bound.
  # Checked for runs made with run_paged, which keeps the report.
  if [ -n "${PAGED_REPORT:-}" ]; then
    grep -q '"own_thread_dtors":[1-9]' "$PAGED_REPORT" ||
      fail "$1: the pager's threads registered no destructor with the library's own list"
    PAGED_REPORT=
  fi
  echo "$1: $ins page-ins, $written pages written out"
}

# need_numpy: the system python3 with numpy (Debian python3-numpy), or a skip.
need_numpy() {
  /usr/bin/python3 -c 'import numpy' 2>/dev/null || install_package python3-numpy ||
    skip "python3-numpy is missing and could not be installed"
}

# start_numpy SCHEME MIB LOCAL [run options...]: starts tests/shell/lib/numpy_pages.py with a MIB
# MiB array under hydramem run (pid in $run_pid, output in $dir/run.out), waits until it has
# filled the array and its resident memory is back under LOCAL MiB + 8 (the rest is out in the
# cluster); it then waits for $dir/go before updating and hashing the array again.
start_numpy() {
  local scheme=$1 mib=$2 local=$3
  shift 3
  # Not the output of a run before: the wait below must see this run's (the shell truncates
  # the file only once the background process has started, which can be later).
  rm -f "$dir/run.out" "$dir/go"
  GO_FILE="$dir/go" "$BIN" run --cluster "$dir/cluster.toml" --scheme "$scheme" \
    --local-memory "${local}MiB" "$@" -- /usr/bin/python3 tests/shell/lib/numpy_pages.py "$mib" \
    >"$dir/run.out" 2>&1 &
  run_pid=$!
  wait_until 120 grep -qs '^waiting' "$dir/run.out" || fail "the program did not fill its array"
  program_pid=$(pgrep -P "$run_pid")
  wait_until 60 resident_under $((local + 8)) || fail "the program's memory did not go out"
}
resident_under() {
  local kb
  kb=$(awk '/^RssAnon:/ {print $2}' "/proc/$program_pid/status")
  [ "$kb" -lt $(($1 * 1024)) ]
}
