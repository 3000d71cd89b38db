#!/usr/bin/env bash
# hydramem run with programs that run as another user: (1) `--user nobody` — the program runs
# as nobody (uid checked from inside), pages out and back with its data intact, although
# nobody may not make a userfaultfd here unless the kernel allows every user
# (vm.unprivileged_userfaultfd): hydramem run passes /dev/userfaultfd on; (2) memcached with
# `-u nobody`, which drops root itself after the pager started: the pager opened what it needs
# (its pagemap, the cluster file, the report) before, and pages on, every value read back.
set -euo pipefail
. "$(dirname "$0")/lib/run.sh"
need_run
[ "$(id -u)" -eq 0 ] || skip "changing users needs root"
id nobody >/dev/null 2>&1 || skip "there is no user nobody"

NODES=6 start_nodes
# nobody reaches the cluster file (read-only), as a service user reaches /etc/hydramem.
chmod 711 "$dir"
chmod 644 "$dir/cluster.toml"

fill='import hashlib, os; a = bytearray(range(256)) * (96 << 12); a[::4096] = bytes(len(a) // 4096); print(os.getuid(), hashlib.sha256(a).hexdigest(), hashlib.sha256(a).hexdigest())'
plain=$(/usr/bin/python3 -c "$fill" | cut -d' ' -f2-)
"$BIN" run --cluster "$dir/cluster.toml" --scheme rep2 --local-memory 32MiB --user nobody \
  -- /usr/bin/python3 -c "$fill" >"$dir/run.out" 2>&1 || fail "python3 as nobody exited with $?"
grep -qx "$(id -u nobody) $plain" "$dir/run.out" ||
  fail "python3 as nobody: not uid $(id -u nobody), or its hashes differ from the plain run's ($plain)"
check_paged "python3 as nobody (rep2)"

out=$("$BIN" run --cluster "$dir/cluster.toml" --scheme rep2 --local-memory 32MiB \
  --user no-such-user-hm -- true 2>&1) && fail "an unknown --user was accepted"
grep -q 'no such user' <<<"$out" || fail "an unknown --user: $out"

need memcached memcached
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BIN" run --cluster "$dir/cluster.toml" --scheme rep2 --local-memory 48MiB \
  -- memcached -u nobody -m 1024 -p "$port" -l 127.0.0.1 -U 0 >"$dir/run.out" 2>&1 &
pid=$!
wait_until 30 /usr/bin/python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null ||
  fail "memcached -u nobody did not start"
/usr/bin/python3 tests/shell/lib/kv_check.py memcached "127.0.0.1:$port" load 20000 4096
/usr/bin/python3 tests/shell/lib/kv_check.py memcached "127.0.0.1:$port" verify 20000 4096 ||
  fail "memcached -u nobody returned a wrong value"
kill -TERM "$pid"
wait "$pid" || fail "memcached -u nobody under hydramem run exited with $? after SIGTERM"
check_paged "memcached -u nobody (rep2)"
echo "PASS run_user"
