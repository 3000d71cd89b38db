#!/usr/bin/env bash
# sqlite3 on a database in a hydra-8+2-d1 mount: tables, 50,000 rows inserted in
# transactions, updates, an index, deletes and VACUUM (in WAL and in rollback-journal mode);
# then, read back from the cluster with the page cache dropped, PRAGMA integrity_check says ok
# and a checksum over every row equals the one of the same workload on the local disk.
set -euo pipefail
. "$(dirname "$0")/lib/mount.sh"
need_mount
need sqlite3 sqlite3

# The workload: deterministic (a recursive CTE and integer arithmetic, no random()).
workload() {
  sqlite3 "$1" <<SQL
PRAGMA journal_mode=$2;
PRAGMA cache_size=-131072;
CREATE TABLE account(id INTEGER PRIMARY KEY, owner TEXT NOT NULL, balance INTEGER NOT NULL, note BLOB);
CREATE TABLE transfer(id INTEGER PRIMARY KEY, src INTEGER, dst INTEGER, amount INTEGER);
$(for b in 0 1 2 3; do
  # 4 transactions of 6,250 rows into each table.
  echo "BEGIN;
WITH RECURSIVE n(i) AS (SELECT $((b * 6250 + 1)) UNION ALL SELECT i + 1 FROM n WHERE i < $(((b + 1) * 6250)))
INSERT INTO account SELECT i, 'owner-' || (i * 7919 % 1000), i * 31 % 100000, zeroblob(i % 300) FROM n;
WITH RECURSIVE n(i) AS (SELECT $((b * 6250 + 1)) UNION ALL SELECT i + 1 FROM n WHERE i < $(((b + 1) * 6250)))
INSERT INTO transfer SELECT i, i * 17 % 25000 + 1, i * 29 % 25000 + 1, i % 977 FROM n;
COMMIT;"
done)
CREATE INDEX account_owner ON account(owner, balance);
CREATE INDEX transfer_src ON transfer(src);
CREATE INDEX transfer_dst ON transfer(dst);
BEGIN;
UPDATE account SET balance = balance - (SELECT coalesce(sum(amount), 0) FROM transfer WHERE src = account.id)
  + (SELECT coalesce(sum(amount), 0) FROM transfer WHERE dst = account.id);
UPDATE account SET note = CAST(printf('%0500d', id) AS BLOB) WHERE id % 11 = 0;
COMMIT;
DELETE FROM transfer WHERE id % 3 = 0;
DELETE FROM account WHERE id % 5 = 0;
VACUUM;
PRAGMA wal_checkpoint(TRUNCATE);
SQL
}

# checksum DB: integrity_check, then the row counts and a SHA3 of every row of every table and
# of the index (sqlite3's sha3_query, in a fixed order).
checksum() {
  sqlite3 "$1" <<'SQL'
PRAGMA integrity_check;
SELECT (SELECT count(*) FROM account), (SELECT count(*) FROM transfer),
  hex(sha3_query('SELECT * FROM account ORDER BY id; SELECT * FROM transfer ORDER BY id;
    SELECT owner, balance FROM account INDEXED BY account_owner ORDER BY owner, balance'));
SQL
}

NODES=10 start_nodes
mount_fs --scheme hydra-8+2-d1 --size 1GiB
for mode in wal delete; do
  mkdir -p "$dir/local"
  workload "$dir/local/$mode.db" "$mode" >/dev/null
  expected=$(checksum "$dir/local/$mode.db")
  [ "$(head -n 1 <<<"$expected")" = ok ] || fail "the local database is not ok: $expected"
  workload "$MNT/$mode.db" "$mode" >/dev/null
  sync
  echo 3 >/proc/sys/vm/drop_caches
  got=$(checksum "$MNT/$mode.db")
  [ "$(head -n 1 <<<"$got")" = ok ] || fail "integrity_check in the mount ($mode): $got"
  [ "$got" = "$expected" ] || fail "the database in the mount ($mode) differs: $got, expected $expected"
  echo "journal_mode=$mode: integrity_check ok; checksum $(tail -n 1 <<<"$got") as on the local disk ($(stat -c %s "$MNT/$mode.db") bytes)"
done
stop_mount SIGTERM
echo "PASS mount_sqlite"
