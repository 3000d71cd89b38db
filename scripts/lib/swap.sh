# Sourced by scripts/swap, scripts/nbd-swap and scripts/bench-apps (and wait_until by the
# shell tests): sizes, waiting for an event, the default program, and running a program in a
# memory cgroup (v1) limited to half its working set while following how much of it lives on
# the swap device.

# bytes SIZE: SIZE (a count with an optional K, M, G or T suffix, KiB/KB alike) in bytes; fails
# on anything else.
bytes() {
  local n=${1%%[KMGTkmgt]*} unit=${1##*[0-9]}
  [[ $n =~ ^[0-9]+$ ]] || return 1
  case "${unit,,}" in
    "" | b) echo "$n" ;;
    k | kb | kib) echo $((n << 10)) ;;
    m | mb | mib) echo $((n << 20)) ;;
    g | gb | gib) echo $((n << 30)) ;;
    t | tb | tib) echo $((n << 40)) ;;
    *) return 1 ;;
  esac
}

# wait_until SECONDS CMD...: polls CMD every 0.1 s until it succeeds; false after SECONDS.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# default_program WORKING_SET_BYTES: sets `program` to plain python3 filling an array of that
# many bytes with known values, then reading every value back and checking the sum and random
# samples.
default_program() {
  program=(python3 -c '
import array, random, sys, time
n = int(sys.argv[1]) // 4
a = array.array("I", bytes(4 * n))
chunk = 1 << 20
t = time.time()
for i in range(0, n, chunk):
    a[i:i + chunk] = array.array("I", range(i, min(i + chunk, n)))
total = sum(sum(a[i:i + chunk]) for i in range(0, n, chunk))
assert total == n * (n - 1) // 2, "the sum of the array is wrong"
rng = random.Random(1)
for _ in range(20000):
    j = rng.randrange(n)
    assert a[j] == j, "value %d is wrong" % j
print("program: %d MiB filled and read back: sum and 20000 samples correct (%.1f s)" % (4 * n >> 20, time.time() - t))
' "$1")
}

# run_in_cgroup STEP: runs "${program[@]}" in the new memory cgroup $cg limited to $limit bytes
# (half of $ws_bytes, swappiness 100) while following how much is on the swap device $loop;
# prints steps STEP and STEP+1 ("STEP. running ...", none when STEP is empty), keeps the
# program's pid in prog_pid while it runs (for the caller's teardown) and its exit status in
# prog_status.
run_in_cgroup() {
  local step=$1 max_swap=0 used peak
  mkdir "$cg"
  echo "$limit" >"$cg/memory.limit_in_bytes"
  [ -e "$cg/memory.swappiness" ] && echo 100 >"$cg/memory.swappiness"
  echo "${step:+$step. }running in a memory cgroup limited to $((limit >> 20)) MiB (half the $((ws_bytes >> 20)) MiB working set): ${program[0]}"
  # The child joins the cgroup before it execs the program, so every page it touches counts.
  sh -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "${program[@]}" &
  prog_pid=$!
  # Follow how much of the program lives on the swap device while it runs.
  while kill -0 "$prog_pid" 2>/dev/null; do
    used=$(awk -v d="$loop" '$1 == d {print $4}' /proc/swaps)
    [ "${used:-0}" -gt "$max_swap" ] && max_swap=$used
    sleep 0.2
  done
  prog_status=0
  wait "$prog_pid" || prog_status=$?
  prog_pid=""
  peak=$(cat "$cg/memory.max_usage_in_bytes" 2>/dev/null || echo 0)
  echo "${step:+$((step + 1)). }program exited with status $prog_status; peak resident $((peak >> 20)) MiB (limit $((limit >> 20)) MiB)"
  echo "   up to $((max_swap >> 10)) MiB were on the swap device, that is in remote memory"
}
