#!/usr/bin/env bash
# nbdinfo (libnbd) sees the export of `hydramem nbd` with its size, name, description, block
# sizes and exactly the capabilities the server implements.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need nbdinfo libnbd-bin
need python3 python3
start_export 96MiB
nbdinfo "$URI"
nbdinfo --json "$URI" >"$dir/info.json"
nbdinfo --list "$URI" | grep -q 'export="hydramem"' || { echo "FAIL: LIST does not name the export"; exit 1; }
python3 - "$dir/info.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["protocol"] == "newstyle-fixed", d["protocol"]
assert d["TLS"] is False
e = d["exports"][0]
assert e["export-name"] == "hydramem", e
assert e["export-size"] == 96 << 20, e["export-size"]
assert e["description"].startswith("hydramem hydra 8+2"), e["description"]
want = {"is_read_only": False, "is_rotational": False, "can_flush": True, "can_fua": True,
        "can_trim": True, "can_zero": True, "can_multi_conn": True, "can_df": True,
        "can_fast_zero": False, "can_cache": False}
for k, v in want.items():
    assert e[k] is v, (k, e[k])
assert (e["block_size_minimum"], e["block_size_preferred"], e["block_size_maximum"]) == (1, 4096, 32 << 20), e
print("nbdinfo checks passed")
PY
stop_export
echo "PASS nbd_nbdinfo"
