# Sourced by scripts/bench-apps: the workloads. For workload W (memcached-etc → memcached_etc):
#   W_size         sets W's data size and measured phase ($small: a few tens of MiB, else a few
#                  hundred) and prints one line saying what they are
#   W_needs        prints the commands W needs that are missing
#   W_run          starts the server in the memory cgroup (in_cgroup), loads the data, runs the
#                  measured phase, checks the data, stops the server; reports with `record OP
#                  THROUGHPUT UNIT P50_MS P99_MS` and `verdict ok|FAIL TEXT`. With $calibrating
#                  (the first, unlimited run) it keeps what later runs are checked against in
#                  $ref (a directory of the workload's own).
# Clients run outside the cgroup: only the server's memory is limited. $port is free; $wdir is
# the run's scratch directory, removed after it.

LIB_APPS=$(dirname "${BASH_SOURCE[0]}")

# --- redis: redis-benchmark GETs then SETs of random keys, 4 KiB values ---------------------
redis_size() {
  if [ "$small" = 1 ]; then r_keys=24000 r_gets=20000 r_sets=5000; else r_keys=60000 r_gets=200000 r_sets=50000; fi
  r_value=4096
  echo "redis: $r_keys keys × $r_value B (redis-cli --pipe), $r_gets GETs then $r_sets SETs of random keys from 16 connections (redis-benchmark)"
}
redis_needs() { for c in redis-server redis-cli redis-benchmark; do command -v "$c" >/dev/null || echo "$c"; done; }
# redis_bench TEST COUNT: redis-benchmark's CSV line for TEST → record.
redis_bench() {
  local line
  line=$(redis-benchmark -p "$port" -t "$1" -n "$2" -r "$r_keys" -d "$r_value" -c 16 --csv | grep "^\"${1^^}\"")
  # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
  record "${1^^}" "$(cut -d'"' -f4 <<<"$line")" op/s "$(cut -d'"' -f10 <<<"$line")" "$(cut -d'"' -f14 <<<"$line")"
}
redis_run() {
  start_in_cgroup redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
    --enable-debug-command local --dir "$wdir" --logfile "$wdir/redis.log"
  wait_until 20 redis-cli -p "$port" ping >/dev/null 2>&1 || die "redis-server did not start: $(cat "$wdir/redis.log")"
  local t0 t1 loaded before after
  t0=$(date +%s.%N)
  loaded=$(python3 "$LIB_APPS/kv.py" redis-load "$r_keys" "$r_value" | redis-cli -p "$port" --pipe | tail -n 1)
  t1=$(date +%s.%N)
  [[ $loaded == *"errors: 0, replies: $r_keys" ]] || die "redis load failed: $loaded"
  record load "$(awk -v n="$r_keys" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", n / (b - a) }')" keys/s "" ""
  # Loaded with no limit, then limited by run_one's limiter (see memcached_limits_after_load).
  touch "$wdir/loaded"
  wait_until 600 test -e "$wdir/go" || die "the limit was never put in place after loading"
  if [ "$failover" = 1 ]; then
    # kv.py's driver: GETs and SETs with every value checked, counted per second.
    kv_verdict "$(python3 "$LIB_APPS/kv.py" redis --port "$port" --keys "$r_keys" --value "$r_value" \
      --seconds "$fo_seconds" --timeline "$wdir/timeline.json" --started "$wdir/started")" MIX
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    return
  fi
  # The digest of the whole data set, after it went out to swap and back in, and again after
  # the GETs; the unlimited run's is the reference.
  before=$(redis-cli -p "$port" debug digest)
  redis_bench get "$r_gets"
  after=$(redis-cli -p "$port" debug digest)
  [ "$calibrating" = 1 ] && echo "$before" >"$ref/digest"
  if [ "$before" = "$(cat "$ref/digest")" ] && [ "$after" = "$before" ]; then
    verdict ok "digest $before"
  else
    verdict FAIL "DEBUG DIGEST $before after loading, $after after the GETs; the unlimited run's: $(cat "$ref/digest")"
  fi
  redis_bench set "$r_sets"
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
}

# --- memcached: Facebook's ETC and SYS mixes (kv.py), zipf or uniform key popularity -------
memcached_size() {
  if [ "$small" = 1 ]; then m_etc=250000 m_sys=22000 m_seconds=5; else m_etc=800000 m_sys=70000 m_seconds=20; fi
  echo "memcached-etc: $m_etc keys of 64–512 B, memcached-sys: $m_sys keys of 1–8 KiB; $m_seconds s of 95% (etc) or 75% (sys) GETs, $popularity keys, 2 × 8 connections (kv.py); every key re-read"
}
memcached_needs() { command -v memcached >/dev/null || echo memcached; }
memcached_run() { # MIX KEYS
  start_in_cgroup memcached -p "$port" -l 127.0.0.1 -U 0 -t 2 -m 2048 -u nobody
  wait_until 20 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null || die "memcached did not start"
  local timed=(--seconds "$m_seconds")
  [ "$failover" = 1 ] && timed=(--seconds "$fo_seconds" --timeline "$wdir/timeline.json" --started "$wdir/started")
  # Loaded with no limit, then limited (run_one's limiter): see memcached_limits_after_load.
  timed+=(--loaded "$wdir/loaded" --go "$wdir/go")
  kv_verdict "$(python3 "$LIB_APPS/kv.py" memcached --port "$port" --keys "$2" --mix "$1" --popularity "$popularity" \
    "${timed[@]}")" "${1^^}" "$2"
  # Ended, not killed: under a *-run backend its pager reports its numbers as it exits.
  local p
  while read -r p; do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = memcached ] && kill -TERM "$p"
  done <"$cg/cgroup.procs"
  wait "${app_pids[-1]}" || true
}
# kv_verdict JSON OP [KEYS]: records kv.py's result (the load rate when KEYS is given) and its
# verdict: ok when every value read was one that was set and the server never failed.
kv_verdict() {
  local load_s ops p50 p99 checked wrong errors
  read -r load_s ops p50 p99 checked wrong errors < <(python3 -c 'import json, sys; j = json.loads(sys.argv[1]); print(j["load_s"], j["ops_per_s"], j["p50_ms"], j["p99_ms"], j["checked"], j["wrong"], "; ".join(j.get("errors", [])) or "-")' "$1")
  [ -n "${3:-}" ] && record load "$(awk -v n="$3" -v s="$load_s" 'BEGIN { printf "%.0f", n / s }')" keys/s "" ""
  record "$2" "$ops" op/s "$p50" "$p99"
  if [ "$errors" != - ]; then
    verdict FAIL "the server failed mid-run ($errors); $wrong wrong values before"
  elif [ "$wrong" -eq 0 ]; then
    verdict ok "$checked keys re-read, all as last set"
  else
    verdict FAIL "$wrong wrong values ($checked keys re-read)"
  fi
}
# memcached and redis are loaded before their limit is put in place (redis's 24,000 keys of
# 4 KiB through redis-cli --pipe burst the same way, and so does PageRank's graph
# generation): loading 250,000 keys at ~270k keys/s outruns any swap device's reclaim, and
# the cgroup's OOM killer then ended about half the runs at 75 and 50% within two seconds of
# the start, on every backend alike (zram and the local disk included) — a measure of the
# load burst, not of the swap path. The timed phase runs with the limit in place, after the
# kernel has pushed the excess out.
memcached_limits_after_load() { :; }
redis_limits_after_load() { :; }
pagerank_limits_after_load() { :; }
memcached_etc_limits_after_load() { :; }
memcached_sys_limits_after_load() { :; }
memcached_etc_size() { memcached_size; }
memcached_sys_size() { memcached_size >/dev/null; }
memcached_etc_needs() { memcached_needs; }
memcached_sys_needs() { memcached_needs; }
memcached_etc_run() { memcached_run etc "$m_etc"; }
memcached_sys_run() { memcached_run sys "$m_sys"; }

# --- PostgreSQL: pgbench (TPC-B-like), shared buffers sized to the data ---------------------
pg_bin() { local b; b=$(pg_config --bindir 2>/dev/null) || b=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1); echo "$b"; }
pgbench_size() {
  if [ "$small" = 1 ]; then p_scale=3 p_seconds=10; else p_scale=20 p_seconds=30; fi
  p_buffers=$((16 * p_scale + 32))
  echo "pgbench: scale $p_scale (~$((15 * p_scale)) MiB), shared_buffers ${p_buffers}MB, fsync off, $p_seconds s of TPC-B-like transactions from 4 clients"
}
pgbench_needs() { local b; b=$(pg_bin); for c in initdb postgres pg_ctl pgbench psql; do [ -x "$b/$c" ] || echo "$c"; done; id postgres >/dev/null 2>&1 || echo "the postgres user"; }
as_postgres() { setpriv --reuid postgres --regid postgres --init-groups -- "$@"; }
pgbench_run() {
  local b pg=$wdir/pg
  b=$(pg_bin)
  mkdir -p "$pg" && chown postgres: "$pg"
  as_postgres "$b/initdb" -D "$pg/data" -A trust -U postgres --no-sync -E UTF8 >"$pg/initdb.log" 2>&1 ||
    die "initdb failed: $(tail -n 5 "$pg/initdb.log")"
  start_in_cgroup_as postgres "$b/postgres" -D "$pg/data" -k "$pg" \
    -p "$port" -c listen_addresses= -c "shared_buffers=${p_buffers}MB" -c fsync=off -c synchronous_commit=off \
    -c full_page_writes=off -c huge_pages=off -c max_wal_size=2GB 2>"$pg/server.log"
  wait_until 30 "$b/pg_isready" -q -h "$pg" -p "$port" || die "postgres did not start: $(tail -n 5 "$pg/server.log")"
  local t0 t1
  t0=$(date +%s.%N)
  as_postgres "$b/pgbench" -h "$pg" -p "$port" -i -q -s "$p_scale" postgres >"$pg/init.log" 2>&1 ||
    die "pgbench -i failed: $(tail -n 5 "$pg/init.log")"
  t1=$(date +%s.%N)
  record load "$(awk -v n=$((p_scale * 100000)) -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", n / (b - a) }')" rows/s "" ""
  (cd "$pg" && as_postgres "$b/pgbench" -h "$pg" -p "$port" -c 4 -j 2 -T "$p_seconds" -l --log-prefix=tx postgres) \
    >"$pg/bench.log" 2>&1 || die "pgbench failed: $(tail -n 5 "$pg/bench.log")"
  # The per-transaction logs: client, transaction, latency µs, ...
  local tps
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$pg/bench.log" | tail -n 1)
  read -r p50 p99 < <(cat "$pg"/tx.* | awk '{ print $3 / 1000 }' | sort -n |
    awk '{ v[NR] = $1 } END { printf "%.3f %.3f\n", v[int(NR * 0.5) + 1], v[int(NR * 0.99) + 1] }')
  record TPC-B "$tps" tx/s "$p50" "$p99"
  # TPC-B's invariant: every balance moved by exactly the deltas in the history.
  local sums
  sums=$(as_postgres "$b/psql" -h "$pg" -p "$port" -Atq -F ' ' postgres -c \
    "select (select sum(abalance) from pgbench_accounts), (select sum(bbalance) from pgbench_branches),
            (select sum(tbalance) from pgbench_tellers), (select sum(delta) from pgbench_history),
            (select count(*) from pgbench_accounts), (select count(*) from pgbench_history)")
  read -r a br t h n tx <<<"$sums"
  if [ "$a" = "$br" ] && [ "$a" = "$t" ] && [ "$a" = "$h" ] && [ "$n" = $((p_scale * 100000)) ]; then
    verdict ok "balances of accounts, branches and tellers = the $tx transactions' deltas ($a)"
  else
    verdict FAIL "accounts $a, branches $br, tellers $t, history $h; $n accounts (not $((p_scale * 100000)))"
  fi
  as_postgres "$b/pg_ctl" -D "$pg/data" -m fast -w stop >/dev/null
}

# --- PageRank with python3-igraph on a generated power-law graph ----------------------------
pagerank_size() {
  if [ "$small" = 1 ]; then g_nodes=120000 g_runs=5; else g_nodes=500000 g_runs=10; fi
  echo "pagerank: Barabási–Albert graph of $g_nodes vertices × 8 edges (python3-igraph), PageRank $g_runs times"
}
# A python3 that has igraph (python3-igraph is Debian's; the first python3 on PATH may be another).
igraph_python() { local p; for p in $(type -ap python3) /usr/bin/python3; do "$p" -c 'import igraph' 2>/dev/null && { echo "$p"; return; }; done; }
pagerank_needs() { [ -n "$(igraph_python)" ] || echo "python3 with igraph (python3-igraph)"; }
pagerank_run() {
  local json refopt=()
  [ "$calibrating" = 1 ] || refopt=("$ref/ranks")
  # Generated with no limit, then limited by run_one's limiter (see memcached_limits_after_load).
  json=$(in_cgroup "$(igraph_python)" "$LIB_APPS/pagerank.py" --loaded "$wdir/loaded" --go "$wdir/go" \
    "$g_nodes" "$g_runs" "$wdir/ranks" "${refopt[@]}") || die "pagerank failed"
  [ "$calibrating" = 1 ] && cp "$wdir/ranks" "$ref/ranks"
  read -r gen job p50 p99 diff < <(python3 -c 'import json, sys; j = json.loads(sys.argv[1]); print(j["gen_s"], j["job_s"], j["iter_p50_ms"], j["iter_p99_ms"], j["max_diff"])' "$json")
  record generate "$(awk -v n="$g_nodes" -v s="$gen" 'BEGIN { printf "%.0f", n / s }')" vertices/s "" ""
  record PageRank "$(awk -v n="$g_runs" -v s="$job" 'BEGIN { printf "%.3f", n / s }')" runs/s "$p50" "$p99"
  if awk -v d="$diff" 'BEGIN { exit !(d <= 1e-12) }'; then
    verdict ok "ranks within $diff of the unlimited run's"
  else
    verdict FAIL "ranks differ from the unlimited run's by up to $diff"
  fi
}

# --- pagein: hydramem-fault-probe, 4 KiB major faults as a program sees them (paper Fig. 9a) --
PROBE=${HYDRAMEM_PROBE:-$(dirname "$BIN")/hydramem-fault-probe}
pagein_size() {
  if [ "$small" = 1 ]; then p_mib=96 p_accesses=5000; else p_mib=384 p_accesses=20000; fi
  echo "pagein: hydramem-fault-probe writes $p_mib MiB of incompressible pages, then times $p_accesses random page reads (major faults: the swap-in latency) and checks every page"
}
pagein_needs() { [ -x "$PROBE" ] || echo "$PROBE (cargo build --release -p hydramem-fault-probe)"; }
pagein_run() {
  in_cgroup "$PROBE" --mib "$p_mib" --accesses "$p_accesses" --seed 7 --json "$wdir/probe.json" \
    >"$wdir/probe.out" 2>"$wdir/probe.err" || true
  if [ ! -s "$wdir/probe.json" ]; then
    verdict FAIL "the probe ended without a report: $(tail -n 2 "$wdir/probe.err" | tr '\n' ' ')"
    return
  fi
  # Each run's report, with its CDFs, for plots (the probe's JSON as written).
  [ "$calibrating" = 1 ] || cp "$wdir/probe.json" "$out/pagein-$b-$f-r$r.json"
  local faults p50 p99 absent a50 a99 writes writes_p50 writes_p99 sweep wrong
  read -r faults p50 p99 absent a50 a99 writes writes_p50 writes_p99 sweep wrong < <(python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
m, a, w = j["major_faults"], j["absent_reads"], j["page_writes"]
ms = lambda us: round(us / 1000, 3)
mib_s = "%.1f" % (float(sys.argv[2]) / j["populate_seconds"])
print(m["count"], ms(m["p50_us"]), ms(m["p99_us"]), a["count"], ms(a["p50_us"]), ms(a["p99_us"]), mib_s, ms(w["p50_us"]), ms(w["p99_us"]), round(j["sweep_mib_per_s"], 1), j["wrong_pages"])' "$wdir/probe.json" "$p_mib")
  record major-fault "$faults" faults "$p50" "$p99"
  # Reads of pages not resident just before (mincore): the swap-ins, and under `run` the
  # pager's page-ins, which are no major faults to the kernel.
  record page-in "$absent" reads "$a50" "$a99"
  record page-write "$writes" MiB/s "$writes_p50" "$writes_p99"
  record read-back "$sweep" MiB/s "" ""
  if [ "$wrong" -eq 0 ]; then
    verdict ok "every page read back as written"
  else
    verdict FAIL "$wrong pages read back wrong"
  fi
}
