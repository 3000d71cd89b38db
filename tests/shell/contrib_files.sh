#!/usr/bin/env bash
# The operator files in contrib/ and docs/operations.md stay true to the code: the alert rules
# parse as YAML and name only metrics the code exports, every metric docs/operations.md
# describes exists (and every metric the code exports is described), and the systemd unit
# passes systemd-analyze verify where systemd is there to ask.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() {
  echo "FAIL contrib_files: $1"
  exit 1
}
python3 - <<'PY' || fail "the alert rules or docs/operations.md disagree with the code"
import glob, re, sys, yaml
src = "".join(open(p).read() for p in glob.glob("crates/hydramem/src/**/*.rs", recursive=True))
exported = set(re.findall(r'"(hydramem_[a-z_]+)"', src))
rules = yaml.safe_load(open("contrib/prometheus/hydramem-alerts.yml"))["groups"][0]["rules"]
named = set()
for r in rules:
    assert {"alert", "expr", "annotations"} <= set(r), r
    named |= set(re.findall(r"hydramem_[a-z_]+", r["expr"]))
ops = open("docs/operations.md").read()
doc = set()
for m in re.finditer(r"`(hydramem_[a-z_]+?)(\*|\{[^`]*\})?`((?:, `_[a-z_]+`)*)", ops):
    base = m.group(1)
    if m.group(2) == "*":
        continue
    doc.add(base)
    for suffix in re.findall(r"`(_[a-z_]+)`", m.group(3) or ""):
        # `_x` after a name is the same component's: hydramem_node_read_runs_total,
        # `_bytes_read_total` is hydramem_node_bytes_read_total.
        doc.add("_".join(base.split("_")[:2]) + suffix)
unknown = sorted((named | doc) - exported)
if unknown:
    sys.exit(f"named but not exported by the code: {unknown}")
prefixes = ("hydramem_span_", "hydramem_backup_", "hydramem_nbd_")
undocumented = sorted(m for m in exported - doc if not m.startswith(prefixes))
if undocumented:
    sys.exit(f"exported but not described in docs/operations.md: {undocumented}")
print(f"  {len(rules)} alert rules over {len(named)} metrics; {len(doc)} metrics described")
PY
if command -v systemd-analyze >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemd-analyze verify contrib/systemd/hydramem-node.service 2>&1 | grep -v 'hydramem: No such file\|/usr/local/bin/hydramem' |
    grep . && fail "systemd-analyze verify found problems in the unit"
fi
echo "PASS contrib_files"
