#!/usr/bin/env bash
# Local agent failover, measured ten times: two replicas of the local agent on a real origin,
# the leader SIGKILLed while 1,000 ConfigMaps change and pods are created in the offloaded
# namespace; each round prints how long until the standby's stream was open, the provider's
# writes and duplicate writes, provider pod restarts, the virtual node's readiness and what the
# webhook did with the pods; then the median and worst. About eight minutes. Needs root (a
# real node). Builds what is missing first. `--rounds N` runs N rounds instead of ten.
#
# `--in-cluster` measures instead both agents deployed from deploy/ on real nodes with
# kube-proxy (two replicas each behind their Services): ten rounds each of the local agent's
# leading pod deleted, and its container SIGKILLed, during the churn, with pods created
# meanwhile; then the same for the remote agent replica serving the tenant, with a provider
# pod deleted meanwhile (tests/e2e/tests/in_cluster_failover.rs). About fifteen minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[bench-failover]\033[0m %s\n' "$*" >&2; }
rounds=10
test=failover
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --in-cluster) test=in_cluster_failover; shift ;;
    *) echo "unknown argument $1 (only --rounds N and --in-cluster)" >&2; exit 2 ;;
  esac
done

say "toolchain: etcd, Kubernetes 1.20.2 with kubelet and kube-proxy, containerd (cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN
say "building the agents and the end-to-end tests, and the node images"
cargo build --locked --workspace --bins
cargo test --locked -p refract-e2e --test "$test" --no-run
scripts/images.sh --profile debug
say "running $rounds failover rounds ($test)"
REFRACT_FAILOVER_ROUNDS="$rounds" exec cargo test --locked -p refract-e2e --test "$test" -- --nocapture
