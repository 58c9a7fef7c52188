#!/usr/bin/env bash
# The Refract demo: two real Kubernetes control planes on this machine (origin and provider),
# certificates for the peering, the agent pair connected over mutual TLS, and what an operator
# sees with grpcurl. Installs or builds what is missing first (cached).
#
# Everything listens on 127.0.0.1. Files live in .demo/. Ctrl-C stops it all (when run
# without a terminal, it stops by itself after showing the results).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEMO=$ROOT/.demo
B=$ROOT/target/debug
say() { printf '\n\033[1;34m==> %s\033[0m\n' "$*" >&2; }
run() { printf '\033[2m$ %s\033[0m\n' "$*" >&2; "$@"; }

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

say "Preparing: toolchain (etcd, Kubernetes 1.20.2, grpcurl) and the Refract binaries"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN
cargo build --workspace --bins --locked -q

rm -rf "$DEMO" && mkdir -p "$DEMO"

say "Starting two control planes: origin and provider (etcd + kube-apiserver + scheduler + controller-manager)"
"$B/testkit" up --dir "$DEMO/clusters" --cluster origin --cluster provider --controllers \
  >"$DEMO/testkit.out" 2>"$DEMO/testkit.log" &
pids+=($!)
for _ in $(seq 120); do grep -q ready "$DEMO/testkit.out" 2>/dev/null && break; sleep 1; done
grep -q ready "$DEMO/testkit.out" || { cat "$DEMO/testkit.log"; echo "control planes did not start" >&2; exit 1; }
ORIGIN=$DEMO/clusters/origin/kubeconfig
PROVIDER=$DEMO/clusters/provider/kubeconfig
grep -E '^(origin|provider):' "$DEMO/testkit.log" >&2 || true

say "Minting the peering's certificates with refract-certs"
run "$B/refract-certs" ca --out "$DEMO/certs/ca"
run "$B/refract-certs" issue --ca-dir "$DEMO/certs/ca" --cluster-id provider --role server --ip 127.0.0.1 --dns localhost --out "$DEMO/certs/remote-agent" >/dev/null
run "$B/refract-certs" issue --ca-dir "$DEMO/certs/ca" --cluster-id origin --role client --out "$DEMO/certs/local-agent"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

say "Starting remote-agent in the provider cluster (gRPC on 127.0.0.1:$PORT)"
"$B/remote-agent" --listen "127.0.0.1:$PORT" \
  --tls-cert "$DEMO/certs/remote-agent/tls.crt" --tls-key "$DEMO/certs/remote-agent/tls.key" \
  --client-ca "$DEMO/certs/remote-agent/ca.crt" --cluster-id provider \
  --kubeconfig "$PROVIDER" --admin-listen 127.0.0.1:0 >"$DEMO/remote-agent.log" 2>&1 &
pids+=($!)

say "Starting local-agent in the origin cluster"
"$B/local-agent" --remote "127.0.0.1:$PORT" \
  --tls-cert "$DEMO/certs/local-agent/tls.crt" --tls-key "$DEMO/certs/local-agent/tls.key" \
  --server-ca "$DEMO/certs/local-agent/ca.crt" --cluster-id origin --remote-cluster-id provider \
  --kubeconfig "$ORIGIN" --admin-listen 127.0.0.1:0 >"$DEMO/local-agent.log" 2>&1 &
pids+=($!)

GFLAGS=(-cacert "$DEMO/certs/ca/ca.crt" -cert "$DEMO/certs/local-agent/tls.crt" -key "$DEMO/certs/local-agent/tls.key")
G=(grpcurl "${GFLAGS[@]}" "127.0.0.1:$PORT")
for _ in $(seq 30); do "${G[@]}" refract.v1.Inspect/ListTenants 2>/dev/null | grep -q '"connected": true' && break; sleep 1; done

say "What the remote agent serves (grpcurl with the origin's client certificate)"
run "${G[@]}" list
say "The connected tenant, as the remote agent sees it"
run "${G[@]}" refract.v1.Inspect/ListTenants
say "Health"
run "${G[@]}" grpc.health.v1.Health/Check
say "A client certificate from another CA is refused"
"$B/refract-certs" ca --out "$DEMO/certs/other-ca" 2>/dev/null
"$B/refract-certs" issue --ca-dir "$DEMO/certs/other-ca" --cluster-id origin --role client --out "$DEMO/certs/intruder" >/dev/null 2>&1
run grpcurl -cacert "$DEMO/certs/ca/ca.crt" -cert "$DEMO/certs/intruder/tls.crt" -key "$DEMO/certs/intruder/tls.key" "127.0.0.1:$PORT" list || true
grep 'refused connection' "$DEMO/remote-agent.log" | tail -1 | sed 's/\x1b\[[0-9;]*m//g' >&2

say "Offloading namespace 'shop': a ConfigMap, a Secret, a Service with its EndpointSlice, an Ingress"
run kubectl --kubeconfig "$ORIGIN" apply -f deploy/local-agent/namespaceoffloading-crd.yaml
kubectl --kubeconfig "$ORIGIN" apply -f - <<'YAML'
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config, namespace: shop, labels: {app: web}}
data: {mode: production}
---
apiVersion: v1
kind: Secret
metadata: {name: db-credentials, namespace: shop}
stringData: {password: s3cr3t}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-origin-pods, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.0.3.7], conditions: {ready: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: shop}
spec:
  ingressClassName: nginx
  rules: [{host: shop.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: local-only, namespace: shop, annotations: {liqo.io/skip-reflection: "true"}}
data: {note: "stays in the origin"}
---
apiVersion: offloading.refract.io/v1alpha1
kind: NamespaceOffloading
metadata: {name: offloading, namespace: shop}
spec: {namespaceMappingStrategy: DefaultName}
YAML
for _ in $(seq 30); do
  kubectl --kubeconfig "$PROVIDER" -n shop-origin get ingress web >/dev/null 2>&1 && break; sleep 1
done
sleep 1
say "The NamespaceOffloading's status in the origin"
run kubectl --kubeconfig "$ORIGIN" -n shop get namespaceoffloading
say "ORIGIN cluster, namespace shop"
run kubectl --kubeconfig "$ORIGIN" -n shop get configmaps,secrets,services,endpointslices,ingresses
say "PROVIDER cluster, twin namespace shop-origin (ClusterIP and node port chosen by the provider; 'local-only' skipped)"
run kubectl --kubeconfig "$PROVIDER" get namespace shop-origin --show-labels
run kubectl --kubeconfig "$PROVIDER" -n shop-origin get configmaps,secrets,services,endpointslices,ingresses -L offloading.refract.io/origin
say "What the remote agent recorded for the tenant (grpcurl, Inspect/ListObjects)"
LIST_OBJECTS='import json, sys
for o in json.load(sys.stdin).get("objects", []):
    r = o["object"]
    where = r.get("namespace", "") + "/" + r["name"] if r.get("namespace") else r["name"]
    print("  %-14s %-36s %s" % (r["kind"], where, o["outcome"]))'
grpcurl "${GFLAGS[@]}" -d '{"clusterId":"origin"}' "127.0.0.1:$PORT" refract.v1.Inspect/ListObjects | python3 -c "$LIST_OBJECTS"
say "Preview: what the local agent would send for a Service, offline (local-agent preview)"
kubectl --kubeconfig "$ORIGIN" -n shop get service web -o yaml \
  | run "$B/local-agent" preview -f - --cluster-id origin --remote-cluster-id provider | head -30

cat >&2 <<MSG

Demo is up. Try:
  ${G[*]} refract.v1.Inspect/ListTenants
  grpcurl ${GFLAGS[*]} -d '{"clusterId":"origin"}' 127.0.0.1:$PORT refract.v1.Inspect/Tap
  kubectl --kubeconfig $ORIGIN -n shop get all,cm,secrets
  kubectl --kubeconfig $PROVIDER -n shop-origin get all,cm,secrets
Logs: $DEMO/{remote-agent,local-agent,testkit}.log
MSG
if [ -t 0 ]; then
  echo "Press Ctrl-C to stop everything." >&2
  wait
fi
