# Sourced by the tests/shell/nbd_*.sh scripts (and by lib/mount.sh): memory node processes (started one by one,
# so that a script holds each one's pid and can kill some) and `hydramem nbd` serving an
# export on a Unix socket, all stopped on exit; and the real NBD clients the scripts drive,
# installed from Debian when missing (a script is skipped, with the reason, only when a tool
# is missing and cannot be installed).
# The scripts run from the repository root, like every shell test (scripts/test).

BIN=${HYDRAMEM_BIN:-target/release/hydramem}
# A command that fails where the script checks nothing ends it (set -e): say which one, also
# in a function (-E), so that no failure is silent. (Only where it ends the script: not under
# set +e, nor inside a command substitution, whose output is a value.)
set -E
# (Each exit trap starts with `trap - ERR`: a cleanup's failures are not the test's.)
trap 'err_status=$?; [[ $- != *e* || $BASH_SUBSHELL -ne 0 ]] ||
  echo "FAIL $(basename "$0" .sh): \`$BASH_COMMAND\` failed (status $err_status) in ${FUNCNAME[0]:-the script}, near line $LINENO"' ERR
dir=$(mktemp -d)
NODE_PIDS=()
nbd_pid=""

nbd_cleanup() {
  [ -n "$nbd_pid" ] && kill -TERM "$nbd_pid" 2>/dev/null && wait "$nbd_pid" 2>/dev/null
  local p
  for p in "${NODE_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap 'trap - ERR; nbd_cleanup' EXIT

# skip REASON: this script cannot run here; say why and pass.
skip() {
  echo "SKIP $(basename "$0"): $1"
  exit 0
}

# interrupt PID: Ctrl-C for a script started in the background under job control (set -m),
# which then receives SIGINT as from a terminal. A process started in the background by a
# non-interactive shell (as some CI runners start the tests) inherits SIGINT ignored, and an
# ignored signal cannot be trapped: there it is interrupted with SIGTERM, which the scripts
# handle alike.
interrupt() {
  local ignored
  ignored=$(awk '/^SigIgn:/ {print $2}' "/proc/$1/status")
  if (((16#$ignored & 2) != 0)); then
    echo "SIGINT is ignored in this environment; interrupting with SIGTERM"
    kill -TERM "$1"
  else
    kill -INT "$1"
  fi
}

# need TOOL PACKAGE: TOOL on PATH, installing the Debian PACKAGE if it is missing.
need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  install_package "$2" || skip "$1 is missing and the Debian package $2 could not be installed"
  command -v "$1" >/dev/null 2>&1 || skip "$1 is still missing after installing $2"
}

install_package() {
  command -v apt-get >/dev/null 2>&1 || return 1
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  echo "installing the Debian package $1"
  $sudo apt-get install -y -qq "$1" >/dev/null 2>&1 ||
    { $sudo apt-get update -qq >/dev/null 2>&1 && $sudo apt-get install -y -qq "$1" >/dev/null 2>&1; }
}

# need_bench_nbd: what scripts/bench-nbd needs (fio with its nbd engine, nbdkit) and the built
# binary it measures.
need_bench_nbd() {
  need fio fio
  fio --enghelp=nbd >/dev/null 2>&1 || skip "this fio has no nbd engine"
  need nbdkit nbdkit
  [ -x "$BIN" ] || { echo "FAIL: $BIN is missing (cargo build --release -p hydramem)"; exit 1; }
}

# Sets NBDSH to a command running nbdsh with a Python that has the libnbd bindings (the
# first python3 on PATH may be another installation without them).
need_nbdsh() {
  local p
  for attempt in 1 2; do
    for p in $(type -ap python3); do
      if "$p" -c 'import nbd' 2>/dev/null; then
        NBDSH=("$p" -m nbd)
        return 0
      fi
    done
    [ "$attempt" = 1 ] && ! install_package python3-libnbd && break
  done
  skip "no python3 with the libnbd bindings (Debian package python3-libnbd)"
}

# kill_node I: SIGKILLs memory node I (quietly: no job notice from the shell).
kill_node() {
  kill -KILL "${NODE_PIDS[$1]}"
  wait "${NODE_PIDS[$1]}" 2>/dev/null || true
}

# start_nodes: starts $NODES (default 10) memory nodes one by one, each donating
# $NODE_CAPACITY (default 1GiB) in slabs of $NODE_SLAB (default 4MiB), and writes their cluster
# file $dir/cluster.toml; NODE_PIDS[i] is node i's pid.
start_nodes() {
  local i addr slab=${NODE_SLAB:-4MiB}
  # Nodes read the cluster file (their membership) only when asked to regenerate, by then whole.
  printf 'slab_size = %d\n' $((${slab%MiB} << 20)) >"$dir/cluster.toml"
  for i in $(seq 0 $((${NODES:-10} - 1))); do
    "$BIN" node --listen 127.0.0.1:0 --id "$i" --cluster "$dir/cluster.toml" --slab-size "$slab" \
      --capacity "${NODE_CAPACITY:-1GiB}" --announce --log warn >"$dir/node$i.out" 2>>"$dir/nodes.log" &
    NODE_PIDS+=($!)
    for _ in $(seq 100); do grep -q listening "$dir/node$i.out" 2>/dev/null && break; sleep 0.05; done
    addr=$(sed -n 's/^listening //p' "$dir/node$i.out")
    [ -n "$addr" ] || { echo "FAIL: memory node $i did not start"; cat "$dir/nodes.log"; exit 1; }
    printf '\n[[node]]\nid = %d\naddr = "%s"\n' "$i" "$addr" >>"$dir/cluster.toml"
  done
}

# start_export SIZE [hydramem nbd options...]: starts the memory nodes (start_nodes) and the
# NBD server; sets URI (an NBD URI of the export over its Unix socket) and SOCK.
start_export() {
  local size=$1
  shift
  start_nodes
  SOCK="$dir/nbd.sock"
  "$BIN" nbd --cluster "$dir/cluster.toml" --size "$size" --socket "$SOCK" --log warn "$@" \
    >"$dir/nbd.out" 2>"$dir/nbd.err" &
  nbd_pid=$!
  for _ in $(seq 100); do grep -q '^serving' "$dir/nbd.out" 2>/dev/null && break; sleep 0.1; done
  grep -q '^serving' "$dir/nbd.out" || { echo "FAIL: nbd did not start"; cat "$dir/nbd.err"; exit 1; }
  cat "$dir/nbd.out"
  URI="nbd+unix:///hydramem?socket=$SOCK"
}

# serve_again SIZE [hydramem nbd options...]: starts the NBD server again on the nodes and the
# socket of start_export (after the first one stopped), and waits until it serves.
serve_again() {
  local size=$1
  shift
  # Not the output of a server before (the shell truncates the file only once the server has
  # started, which can be after the wait below has read it).
  rm -f "$dir/nbd2.out" "$dir/nbd2.err"
  "$BIN" nbd --cluster "$dir/cluster.toml" --size "$size" --socket "$SOCK" --log warn "$@" \
    >"$dir/nbd2.out" 2>"$dir/nbd2.err" &
  nbd_pid=$!
  for _ in $(seq 100); do grep -q '^serving' "$dir/nbd2.out" 2>/dev/null && break; sleep 0.1; done
  grep -q '^serving' "$dir/nbd2.out" || { echo "FAIL: the server did not start again"; cat "$dir/nbd2.err"; exit 1; }
}

# qemu_io_check READS [-c COMMAND]...: runs qemu-io's commands on the export ($URI) and fails
# unless it reported no error and ran READS reads (a pattern read that fails says so).
qemu_io_check() {
  local reads=$1
  shift
  qemu-io -f raw "$@" "$URI" | tee "$dir/qemu-io.log"
  if grep -qiE 'pattern verification failed|error|failed' "$dir/qemu-io.log"; then
    echo "FAIL $(basename "$0" .sh): qemu-io reported an error"
    exit 1
  fi
  [ "$(grep -c '^read ' "$dir/qemu-io.log")" = "$reads" ] ||
    { echo "FAIL $(basename "$0" .sh): not every read ran"; exit 1; }
}

# span_rows FILE: reads the `span rows:` summary a front end printed into FILE and sets
# `line` to it, `live` and `forgotten` to its counts of live and forgotten pages; fails the
# test if there is none. Call it in the script's shell, not in $(...).
span_rows() {
  line=$(grep "span rows:" "$1") ||
    { echo "FAIL $(basename "$0" .sh): no span rows in the summary: $(cat "$1")"; exit 1; }
  live=$(sed -E 's/.*span rows: ([0-9]+) pages in.*/\1/' <<<"$line")
  forgotten=$(sed -E 's/.* ([0-9]+) pages forgotten.*/\1/' <<<"$line")
  [[ $live =~ ^[0-9]+$ && $forgotten =~ ^[0-9]+$ ]] ||
    { echo "FAIL $(basename "$0" .sh): no count of live and forgotten pages in: $line"; exit 1; }
}

# stop_export: SIGTERM; the server must exit 0, release its memory and remove its socket.
stop_export() {
  kill -TERM "$nbd_pid"
  wait "$nbd_pid" || { echo "FAIL: hydramem nbd exited with an error on SIGTERM"; cat "$dir/nbd.err"; exit 1; }
  nbd_pid=""
  grep -q 'remote memory released' "$dir/nbd.out" || { echo "FAIL: no release at exit"; exit 1; }
  [ ! -e "$SOCK" ] || { echo "FAIL: the socket file was left behind"; exit 1; }
}
