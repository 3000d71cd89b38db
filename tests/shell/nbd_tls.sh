#!/usr/bin/env bash
# `hydramem nbd --nbd-tls` requires STARTTLS of its clients: nbdinfo (libnbd, GnuTLS) with a
# member certificate of the cluster's CA sees the export over TLS and nbdcopy writes and reads
# it back; without TLS, or with a certificate of another CA, the export is refused.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need nbdinfo libnbd-bin
need nbdcopy libnbd-bin
"$BIN" tls ca "$dir/ca" >/dev/null
"$BIN" tls issue "$dir/ca" server "$dir/server"
"$BIN" tls issue "$dir/ca" client "$dir/client" >/dev/null
"$BIN" tls ca "$dir/other-ca" >/dev/null
"$BIN" tls issue "$dir/other-ca" stranger "$dir/stranger" >/dev/null
# libnbd reads its certificates under these names (nbd_set_tls_certificates).
for m in client stranger; do
  mkdir "$dir/$m-libnbd"
  cp "$dir/$m/ca.pem" "$dir/$m-libnbd/ca-cert.pem"
  cp "$dir/$m/cert.pem" "$dir/$m-libnbd/client-cert.pem"
  cp "$dir/$m/key.pem" "$dir/$m-libnbd/client-key.pem"
done
start_export 16MiB --nbd-tls "$dir/server"
# The certificate names the cluster's members, not this socket: libnbd checks the chain only.
tls_uri() { echo "nbds+unix:///hydramem?socket=$SOCK&tls-certificates=$dir/$1-libnbd&tls-verify-peer=false"; }
nbdinfo --json "$(tls_uri client)" >"$dir/info.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["TLS"] is True, d; print("nbdinfo: TLS", d["TLS"], "size", d["exports"][0]["export-size"])' "$dir/info.json"
head -c 4M /dev/urandom >"$dir/data"
nbdcopy "$dir/data" "$(tls_uri client)"
nbdcopy "$(tls_uri client)" "$dir/back"
head -c 4M "$dir/back" | cmp - "$dir/data" || { echo "FAIL: the export read back other bytes over TLS"; exit 1; }
echo "nbdcopy: 4 MiB written and read back over TLS"
if nbdinfo "$URI" >"$dir/plain.out" 2>&1; then
  echo "FAIL: a client without TLS was served"; exit 1
fi
grep -qi "tls" "$dir/plain.out" || { echo "FAIL: the refusal does not say TLS is required:"; cat "$dir/plain.out"; exit 1; }
if nbdinfo "$(tls_uri stranger)" >"$dir/stranger.out" 2>&1; then
  echo "FAIL: a certificate of another CA was accepted"; exit 1
fi
echo "refused: a plain client ($(head -n 1 "$dir/plain.out")) and another CA's certificate"
stop_export
echo "PASS nbd_tls"
