#!/usr/bin/env bash
# The webhook's serving certificate without cert-manager: openssl makes a private CA and a
# certificate for the Service, kubectl stores them in the Secret the Deployment mounts and
# writes the CA into both webhook configurations' caBundle.
#
# usage: manifests/tls/make-serving-cert.sh [NAMESPACE] [SERVICE] [DAYS]
#   defaults: gpuslice gpuslice 365
#   OUT_DIR=dir  only write ca.crt, tls.crt, tls.key into dir; no kubectl (for GitOps or a look)
# Re-run it before DAYS pass, then restart the Deployment (kubectl -n NAMESPACE rollout restart
# deployment/gpuslice) so gpuslice serves the new certificate.
set -euo pipefail

namespace=${1:-gpuslice}
service=${2:-gpuslice}
days=${3:-365}
if [[ ! "$days" =~ ^[1-9][0-9]*$ ]]; then
    echo "$0: DAYS must be a whole number of days, such as 365; got '$days'" >&2
    exit 2
fi
command -v openssl >/dev/null || { echo "$0: openssl is needed" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dns="$service.$namespace.svc"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
    -keyout "$work/ca.key" -out "$work/ca.crt" -days "$days" -subj "/CN=gpuslice-webhook-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
    -keyout "$work/tls.key" -out "$work/tls.csr" -subj "/CN=$dns" 2>/dev/null
cat > "$work/ext.cnf" <<EXT
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:$dns, DNS:$dns.cluster.local
EXT
openssl x509 -req -sha256 -in "$work/tls.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
    -out "$work/tls.crt" -days "$days" -extfile "$work/ext.cnf" 2>/dev/null
openssl verify -CAfile "$work/ca.crt" "$work/tls.crt" >/dev/null

if [[ -n "${OUT_DIR:-}" ]]; then
    mkdir -p "$OUT_DIR"
    cp "$work/ca.crt" "$work/tls.crt" "$work/tls.key" "$OUT_DIR/"
    echo "wrote $OUT_DIR/ca.crt, tls.crt, tls.key for $dns"
    exit 0
fi

kubectl -n "$namespace" create secret generic gpuslice-webhook-tls \
    --from-file=tls.crt="$work/tls.crt" --from-file=tls.key="$work/tls.key" --from-file=ca.crt="$work/ca.crt" \
    --dry-run=client -o yaml | kubectl apply -f -
ca_bundle=$(base64 < "$work/ca.crt" | tr -d '\n')
for kind in mutatingwebhookconfiguration validatingwebhookconfiguration; do
    count=$(kubectl get "$kind" gpuslice -o jsonpath='{range .webhooks[*]}x{end}' | wc -c)
    patch="["
    for ((i = 0; i < count; i++)); do
        [[ $i -gt 0 ]] && patch+=","
        patch+="{\"op\":\"add\",\"path\":\"/webhooks/$i/clientConfig/caBundle\",\"value\":\"$ca_bundle\"}"
    done
    patch+="]"
    kubectl patch "$kind" gpuslice --type=json -p "$patch"
done
echo "Secret $namespace/gpuslice-webhook-tls and the caBundle of both webhook configurations are set for $dns"
