#!/usr/bin/env bash
# The link-fault scenarios of the end-to-end tests, plus the long ones CI leaves out: a
# 10-minute cut during churn of 1,000 objects. Each scenario prints how long the provider took
# to converge, its writes and duplicate writes; about 17 minutes in all. Needs root (network
# namespaces, iptables, a real node). Builds what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[long-faults]\033[0m %s\n' "$*" >&2; }

say "toolchain: etcd, Kubernetes 1.20.2 with kubelet, containerd, iproute2, iptables (cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN
say "building the agents and the end-to-end tests, and the node images"
cargo build --locked --workspace --bins
cargo test --locked -p refract-e2e --test network_faults --no-run
scripts/images.sh --profile debug
say "running every fault scenario, the 10-minute cut included"
REFRACT_LONG_FAULTS=1 exec cargo test --locked -p refract-e2e --test network_faults -- --nocapture
