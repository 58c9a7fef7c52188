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

say "The two clusters"
run kubectl --kubeconfig "$ORIGIN" get nodes,namespaces
run kubectl --kubeconfig "$PROVIDER" get nodes,namespaces

cat >&2 <<MSG

Demo is up. Try:
  ${G[*]} refract.v1.Inspect/ListTenants
  grpcurl ${GFLAGS[*]} -d '{"clusterId":"origin"}' 127.0.0.1:$PORT refract.v1.Inspect/Tap
  kubectl --kubeconfig $ORIGIN get ns
  kubectl --kubeconfig $PROVIDER get ns
Logs: $DEMO/{remote-agent,local-agent,testkit}.log
MSG
if [ -t 0 ]; then
  echo "Press Ctrl-C to stop everything." >&2
  wait
fi
