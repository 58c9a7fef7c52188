#!/usr/bin/env bash
# Runs the benchmark: Refract against two direct copiers (bare, and guarded: the Liqo-shaped
# baseline) on two local control planes, in one run.
# Builds what is missing first (release profile), and prints one table; JSON goes to
# target/bench/results.json. Extra arguments go to refract-bench (see --help), for example
#   ./scripts/bench.sh --sizes 1000,10000 --concurrency 8
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[bench]\033[0m %s\n' "$*" >&2; }

say "toolchain: etcd, Kubernetes 1.20.2 control plane (cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN

say "building the agents, refract-certs, refract-bench and direct-copier (release)"
cargo build --release --locked --bin local-agent --bin remote-agent --bin refract-certs --bin refract-bench --bin direct-copier

say "running (about an hour with the defaults)"
exec target/release/refract-bench "$@"
