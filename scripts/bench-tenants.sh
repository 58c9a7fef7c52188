#!/usr/bin/env bash
# One remote agent serving many origin tenants: 20 origin control planes, each with a local
# agent of its own identity, 1,000 ConfigMaps each. Prints aggregate throughput, each tenant's p99, fairness, and
# the remote agent's memory and CPU per tenant, then both agents' memory under churn. Builds
# what is missing first (release profile); about six minutes. Extra arguments go to
# tenants-bench (see --help), e.g. --tenants 5 --churn-seconds 300.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[bench-tenants]\033[0m %s\n' "$*" >&2; }

say "toolchain: etcd and Kubernetes 1.20.2 (cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN
say "building the agents, refract-certs and tenants-bench (release)"
cargo build --release --locked --bin local-agent --bin remote-agent --bin refract-certs --bin tenants-bench
say "running"
# The agents and refract-certs the run starts are the release builds beside it.
export REFRACT_BIN_DIR="$PWD/target/release"
exec target/release/tenants-bench "$@"
