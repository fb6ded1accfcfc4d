#!/usr/bin/env bash
# A node's TLS key and certificate for Ray (cluster/README.md, "TLS across hosts"), signed by the
# cluster's CA: writes DIR/node.key and DIR/node.crt from DIR/ca.crt and DIR/ca.key, valid for
# each ADDRESS (default: this host's own, from `hostname -I`) and for 127.0.0.1 and localhost.
#   bash cluster/make-node-cert.sh ~/raysim-tls 10.0.0.10 10.0.0.11 10.0.0.12
set -euo pipefail
dir=${1:?usage: make-node-cert.sh DIR [ADDRESS...] (DIR holds ca.crt and ca.key)}
shift
if (($# == 0)); then
  read -r -a addresses <<<"$(hostname -I)"
  set -- "${addresses[@]}"
fi
san="IP:127.0.0.1,DNS:localhost"
for address in "$@"; do
  if [[ ! $address =~ ^[0-9A-Fa-f:.]+$ ]]; then
    echo "$0: not an IP address: '$address'" >&2
    exit 2
  fi
  san+=",IP:$address"
done
umask 077
ext=$(mktemp "$dir/node.ext.XXXXXX")
trap 'rm -f "$ext" "$dir/node.csr"' EXIT
printf '%s\n' "subjectAltName=$san" "basicConstraints=critical,CA:FALSE" \
  "keyUsage=critical,digitalSignature" \
  "extendedKeyUsage=serverAuth,clientAuth" >"$ext"
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -sha256 -nodes \
  -subj "/CN=raysim Ray node" \
  -keyout "$dir/node.key" -out "$dir/node.csr"
openssl x509 -req -in "$dir/node.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
  -days 365 -sha256 -extfile "$ext" -out "$dir/node.crt"
openssl verify -CAfile "$dir/ca.crt" "$dir/node.crt" >/dev/null
echo "$dir/node.crt: valid for $san"
