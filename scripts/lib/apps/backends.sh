# Sourced by scripts/bench-apps: the swap backends. start_backend NAME sets up NAME's swap
# device and turns it on (none for local); stop_backend turns it off and removes everything it
# set up. Uses $BIN, $dir (the run's scratch directory), $swapsize and $cluster_pid; sets
# $swapdev (the device as /proc/swaps names it). The *-run backends have no swap device: the
# server runs under `hydramem run` with the limit as its --local-memory (run_prefix), and the
# cgroup only measures.

ALL_BACKENDS=local,disk,zram,nbdkit-memory,hydra,span,rep2,single,ssd-backup,ram-mount,hydra-mount,span-mount,rep2-mount,single-mount,ssd-backup-mount,hydra-run,span-run,rep2-run
bk_pids=() loop="" swapdev="" zram=""

# backend_scheme NAME: the `--scheme` (and its options) of a hydramem backend, one per line;
# nothing for the others.
backend_scheme() {
  local b=${1%-mount}
  b=${b%-run}
  case "$b" in
    hydra) echo --scheme; echo hydra-8+2-d1 ;;
    span) echo --scheme; echo span-8+2 ;;
    rep2 | single) echo --scheme; echo "$b" ;;
    ssd-backup) printf '%s\n' --scheme ssd-backup --backup-dir "$dir/backup" ;;
  esac
}

# backend_unavailable NAME: why NAME cannot run on this machine (empty: it can).
backend_unavailable() {
  case "$1" in
    zram)
      [ -w /sys/class/zram-control/hot_add ] || [ -e /sys/module/zram ] || command -v modprobe >/dev/null ||
        echo "this kernel has no zram (no /sys/class/zram-control, no modprobe)" ;;
    nbdkit-memory | hydra | span | rep2 | single | ssd-backup)
      for c in nbdkit nbdfuse; do command -v "$c" >/dev/null || echo "$c is missing (scripts/setup)"; done ;;
  esac
  case "$1" in
    ssd-backup*) "$BIN" nbd --help | grep -q ssd-backup || echo "this hydramem has no ssd-backup scheme yet" ;;
    span*) "$BIN" nbd --help | grep -q span-K+R || echo "this hydramem has no span scheme yet" ;;
  esac
  case "$1" in
    *-mount | hydra | span | rep2 | single | ssd-backup | nbdkit-memory) [ -e /dev/fuse ] || echo "no /dev/fuse" ;;
    *-run) [ -f "$(dirname "$BIN")/libhydramem_pager.so" ] ||
      echo "the pager library is missing (cargo build --release -p hydramem-pager)" ;;
  esac
}

# is_run_backend NAME: whether NAME pages the server with `hydramem run` (no swap device).
is_run_backend() { [[ $1 == *-run ]]; }

# run_prefix BACKEND LIMIT: the command words that start a server under `hydramem run` with
# LIMIT bytes local, one per line (nothing for the other backends).
run_prefix() {
  is_run_backend "$1" || return 0
  printf '%s\n' "$BIN" run --cluster "$dir/cluster.toml"
  backend_scheme "$1"
  printf '%s\n' --local-memory "$2" --report "$wdir/pager.json" --
}

# swap_counters: the kernel's pages swapped in and out, and major faults, since boot
# ("IN OUT FAULTS").
swap_counters() {
  awk '$1 == "pswpin" { i = $2 } $1 == "pswpout" { o = $2 } $1 == "pgmajfault" { f = $2 }
    END { print i + 0, o + 0, f + 0 }' /proc/vmstat
}

# pages_moved BACKEND BEFORE: pages read from and written to BACKEND during the run, and the
# faults that waited for a read ("IN OUT FAULTS"): the swap counters' growth since BEFORE
# (swap_counters; the backend's device is the only swap device, and the machine's other major
# faults, few on a machine running only the benchmark, count too), or for a *-run backend the
# pager's report ($wdir/pager.json, summed over the server's processes: pages fetched on a
# fault and read ahead with them; pages written out; faults that fetched).
pages_moved() {
  if is_run_backend "$1"; then
    python3 - "$wdir/pager.json" <<'PY'
import json, sys
n_in = n_out = faults = 0
try:
    for line in open(sys.argv[1]):
        s = json.loads(line).get("stats") or {}
        n_in += s.get("page_ins", 0) + s.get("read_ahead", 0)
        n_out += s.get("written", 0)
        faults += s.get("page_ins", 0)
except OSError:
    print(" ")
    sys.exit()
print(n_in, n_out, faults)
PY
  elif [ "$1" = local ]; then
    echo "0 0 0"
  else
    local i0 o0 f0 i1 o1 f1
    read -r i0 o0 f0 <<<"$2"
    read -r i1 o1 f1 < <(swap_counters)
    echo "$((i1 - i0)) $((o1 - o0)) $((f1 - f0))"
  fi
}

# pager_own: the most memory the pager of a *-run backend took for itself in one of the
# server's processes (its heap less the standby pool, from $wdir/pager.json; 0 without a
# report). It is outside --local-memory, as a swap path's daemon is outside the cgroup.
pager_own() {
  python3 - "$wdir/pager.json" <<'PY'
import json, sys
own = 0
try:
    for line in open(sys.argv[1]):
        own = max(own, (json.loads(line).get("stats") or {}).get("peak_own", 0))
except OSError:
    pass
print(own)
PY
}

# backend_needs_cluster NAME: whether NAME keeps its memory on the nodes of `hydramem up`.
backend_needs_cluster() { [ -n "$(backend_scheme "$1")" ]; }

# wait_no_swap: waits (up to 30 minutes) until no swap device is active: each backend's must be
# the only one, and the machine may be shared.
no_swap() { [ "$(awk 'NR > 1' /proc/swaps | wc -l)" -eq 0 ]; }
wait_no_swap() {
  no_swap && return 0
  echo "bench-apps: another swap device is active; waiting for it to go: $(awk 'NR > 1 {print $1}' /proc/swaps | tr '\n' ' ')" >&2
  wait_until 1800 no_swap || die "another swap device stayed active for 30 minutes"
}

# Serves NBD on $dir/nbd.sock for backend $1 and puts it behind nbdfuse and a loop device
# with direct I/O. A buffered loop device would keep every page it swaps in or out in the page
# cache of nbdfuse's file, outside the workload's cgroup: redis at 50% then ran with its whole
# swapped set (301 MiB) in that cache, at 2.5× the GETs of the direct path
# (docs/benchmarks.md §12, "The NBD swap path held the limit only with direct I/O").
nbd_swap() {
  local opts=()
  if [ "$1" = nbdkit-memory ]; then
    nbdkit --exit-with-parent -f -U "$dir/nbd.sock" memory "${swapsize%iB}" &
    bk_pids+=($!)
    wait_until 10 test -S "$dir/nbd.sock" || { backend_error "nbdkit did not start"; return 1; }
  else
    mapfile -t opts < <(backend_scheme "$1")
    mkdir -p "$dir/backup"
    "$BIN" nbd --cluster "$dir/cluster.toml" "${opts[@]}" --size "$swapsize" \
      --socket "$dir/nbd.sock" --log warn >"$dir/nbd.out" 2>"$dir/nbd.err" &
    bk_pids+=($!)
    wait_until 10 grep -q '^serving' "$dir/nbd.out" ||
      { backend_error "hydramem nbd did not start: $(cat "$dir/nbd.err")"; return 1; }
  fi
  mkdir -p "$dir/fuse"
  nbdfuse -P "$dir/nbdfuse.pid" "$dir/fuse/swap" "nbd+unix:///?socket=$dir/nbd.sock" &
  bk_pids+=($!)
  wait_until 10 test -e "$dir/fuse/swap" ||
    { backend_error "nbdfuse did not mount the export of $1 (hydramem nbd said: $(tail -n 3 "$dir/nbd.err" 2>/dev/null))"; return 1; }
  loop=$(losetup --find --show --direct-io=on "$dir/fuse/swap")
  swapdev=$loop
}

# Mounts `hydramem mount` for backend $1 and puts a file in it behind a loop device with direct
# I/O, as scripts/swap does.
mount_swap() {
  local how=(--in-memory)
  [ "$1" = ram-mount ] || { mapfile -t how < <(backend_scheme "$1"); how+=(--cluster "$dir/cluster.toml"); }
  mkdir -p "$dir/mnt" "$dir/backup"
  # In a failover run the mount serves its metrics, so that its regenerations can be followed
  # second by second beside the application's rate (regen_sampler).
  metrics_addr=""
  if [ "${failover:-0}" = 1 ] && [ "$1" != ram-mount ]; then
    metrics_addr=127.0.0.1:$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    how+=(--metrics "$metrics_addr")
  fi
  # One MiB more than the swap file: the mount keeps a page for its superblock.
  "$BIN" mount "$dir/mnt" --size $(($(bytes "$swapsize") + (1 << 20))) "${how[@]}" --log warn \
    >"$dir/mount.out" 2>"$dir/mount.err" &
  bk_pids+=($!)
  wait_until 10 mountpoint -q "$dir/mnt" ||
    { backend_error "hydramem mount did not start: $(cat "$dir/mount.err")"; return 1; }
  fallocate -l "$swapsize" "$dir/mnt/swap"
  loop=$(losetup --find --show --direct-io=on "$dir/mnt/swap")
  swapdev=$loop
}

# A zram device of our own (hot_add), $swapsize, lz4 when the kernel has it.
zram_swap() {
  [ -w /sys/class/zram-control/hot_add ] || modprobe zram num_devices=0 ||
    { backend_error "zram is not available"; return 1; }
  zram=$(cat /sys/class/zram-control/hot_add)
  grep -q lz4 "/sys/block/zram$zram/comp_algorithm" && echo lz4 >"/sys/block/zram$zram/comp_algorithm"
  bytes "$swapsize" >"/sys/block/zram$zram/disksize"
  swapdev=/dev/zram$zram
}

# backend_error MESSAGE: says why a backend could not be set up (its run is then an ERROR).
backend_error() { echo "bench-apps: $*" >&2; }

# start_backend NAME: sets up backend NAME's swap device (none for local) and turns it on;
# fails (after saying why) when it cannot, leaving what it set up for stop_backend.
start_backend() {
  [ "$1" = local ] && return
  is_run_backend "$1" && return
  wait_no_swap
  case "$1" in
    disk)
      fallocate -l "$swapsize" "$dir/swapfile"
      chmod 600 "$dir/swapfile"
      swapdev="$dir/swapfile" ;;
    zram) zram_swap || return 1 ;;
    *-mount) mount_swap "$1" || return 1 ;;
    *) nbd_swap "$1" || return 1 ;;
  esac
  mkswap -q "$swapdev" && swapon "$swapdev"
}

# stop_backend: swap off, then everything under it, in reverse order.
stop_backend() {
  set +e
  [ -n "$swapdev" ] && grep -q "^$swapdev " /proc/swaps && swapoff "$swapdev"
  swapdev=""
  [ -n "$loop" ] && losetup -d "$loop"
  loop=""
  if [ -n "$zram" ]; then
    echo 1 >"/sys/block/zram$zram/reset"
    echo "$zram" >/sys/class/zram-control/hot_remove
    zram=""
  fi
  mountpoint -q "$dir/fuse" && umount "$dir/fuse"
  mountpoint -q "$dir/mnt" && umount "$dir/mnt"
  local p
  for p in "${bk_pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  bk_pids=()
  rm -rf "$dir/swapfile" "$dir"/*.sock "$dir/backup"
  set -e
}

# start_cluster: the memory nodes the hydramem backends share (12 on this machine), on the
# CPUs of --node-cpus if given.
start_cluster() {
  local pin=()
  [ -z "${node_cpus:-}" ] || pin=(taskset -c "$node_cpus")
  "${pin[@]}" "$BIN" up --nodes 12 --slab-size 64MiB --capacity "$swapsize" --cluster "$dir/cluster.toml" \
    --log warn >"$dir/up.log" 2>&1 &
  cluster_pid=$!
  wait_until 20 test -f "$dir/cluster.toml" || die "hydramem up did not start: $(cat "$dir/up.log")"
  echo "memory nodes: $(taskset -c -p "$cluster_pid")" >>"$out/cpus.txt"
}
