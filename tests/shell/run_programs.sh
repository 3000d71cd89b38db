#!/usr/bin/env bash
# Real programs under `hydramem run` at about half of their memory local, each on another
# scheme, each with its data verified: python3 with a numpy array (SHA-256 of the array after
# filling and after in-place updates, equal to those of the same program run plainly),
# sqlite3 with a large page cache (an in-memory database, checksum of every row equal to the
# plain run's), redis-server and memcached (every value read back exactly over the network).
# The run summary must show pages going out and coming back, none lost, memory released
# (and for the span scheme, its rows' cost).
set -euo pipefail
. "$(dirname "$0")/lib/run.sh"
need_run
need sqlite3 sqlite3
need redis-server redis-server
need memcached memcached
/usr/bin/python3 -c 'import numpy' 2>/dev/null || install_package python3-numpy ||
  skip "python3-numpy is missing and could not be installed"

NODES=10 start_nodes

# python3 + numpy: 48 MiB array (and its 48 MiB copy while hashing) with 48 MiB local.
plain=$(/usr/bin/python3 tests/shell/lib/numpy_pages.py 48)
run_paged hydra-8+2-d1 48MiB /usr/bin/python3 tests/shell/lib/numpy_pages.py 48 ||
  fail "python3 under hydramem run exited with $?"
[ "$(grep -E '^(filled|updated)' "$dir/run.out")" = "$plain" ] ||
  fail "numpy array differs from the plain run: $(grep -E '^(filled|updated)' "$dir/run.out")"
check_paged "python3/numpy (hydra-8+2-d1)"
# It fills and hashes its array in order: its page-ins follow each other, and the pager reads
# ahead of them (it reads ahead only while that pays: crates/pager/src/ahead.rs).
line=$(grep 'hydramem run: pid .* page-ins' "$dir/run.out" | tail -n 1)
ahead=$(sed -E 's/.* ([0-9]+) pages read ahead.*/\1/' <<<"$line")
[[ $ahead =~ ^[0-9]+$ && $ahead -gt 0 ]] ||
  fail "python3/numpy (hydra-8+2-d1): nothing read ahead of its in-order page-ins: $line"
echo "python3/numpy (hydra-8+2-d1): $ahead pages read ahead"

# sqlite3: ~30 MiB database in memory with its cache, 16 MiB local.
cat >"$dir/db.sql" <<'SQL'
PRAGMA cache_size=-131072;
CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 10000)
INSERT INTO t SELECT i, replace(printf('%.47c','x'),'x',hex(sha3(i))) FROM n;
UPDATE t SET v = zeroblob(100) || v WHERE id % 7 = 0;
DELETE FROM t WHERE id % 13 = 0;
SELECT count(*), hex(sha3_query('SELECT * FROM t ORDER BY id')) FROM t;
SQL
plain=$(sqlite3 :memory: <"$dir/db.sql")
# With a compaction ceiling of its own (through the environment, as an operator's unit
# file would give it): the pager's span store must get it.
HYDRAMEM_SPAN_MAX_COST=1.8 run_paged span-8+2 16MiB sqlite3 :memory: <"$dir/db.sql" ||
  fail "sqlite3 under hydramem run exited with $?"
grep -qx "$plain" "$dir/run.out" || fail "sqlite3 checksum differs from the plain run ($plain)"
check_paged "sqlite3 (span-8+2)"
# A span scheme's summary also says what its rows cost, what compaction moved, and above what
# it starts.
grep -Eq "span rows: [1-9][0-9]* pages in [1-9][0-9]* rows, [0-9.]+ remote bytes per byte.*\(it starts above 1\.80\)" "$dir/run.out" ||
  fail "sqlite3 (span-8+2): no span rows with the ceiling of 1.8 in the run summary: $(grep 'hydramem run:' "$dir/run.out")"

port_open() {
  /usr/bin/python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 1)" 2>/dev/null
}
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# kv_server PROTOCOL SCHEME PROGRAM ARGS...: the server PROGRAM (listening on $port) under
# hydramem run at 48 MiB local; 20,000 values of 4 KiB (~90 MiB with the server's overhead)
# loaded and read back exactly over the network; SIGTERM must end it cleanly.
kv_server() {
  local protocol=$1 scheme=$2 name=$3
  shift 2
  # Not run_paged in the background: that would be a subshell, which SIGTERM would end
  # instead of hydramem run.
  "$BIN" run --cluster "$dir/cluster.toml" --scheme "$scheme" --local-memory 48MiB -- "$@" \
    >"$dir/run.out" 2>&1 &
  local pid=$!
  wait_until 30 port_open "$port" || fail "$name did not start"
  /usr/bin/python3 tests/shell/lib/kv_check.py "$protocol" "127.0.0.1:$port" load 20000 4096
  /usr/bin/python3 tests/shell/lib/kv_check.py "$protocol" "127.0.0.1:$port" verify 20000 4096 ||
    fail "$name returned a wrong value"
  kill -TERM "$pid"
  wait "$pid" || fail "$name under hydramem run exited with $? after SIGTERM"
  check_paged "$name ($scheme)"
}

port=$(free_port)
kv_server redis rep2 redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no
port=$(free_port)
kv_server memcached hydra-8+2-d1 memcached -u "$(id -un)" -m 1024 -p "$port" -l 127.0.0.1 -U 0
echo "PASS run_programs"
