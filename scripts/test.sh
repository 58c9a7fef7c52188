#!/usr/bin/env bash
# Runs every test: unit and golden-file tests, in-process mTLS stream tests, and end-to-end
# tests of the real binaries against real control planes. Installs or builds what is missing
# first (cached), and says what it is doing.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[test]\033[0m %s\n' "$*" >&2; }
start=$(date +%s)

say "1/4 toolchain: etcd, Kubernetes 1.20.2 control plane, kubelet and kube-proxy, containerd, CNI plugins, grpcurl, promtool (cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep -E '^REFRACT_(K8S_BIN|PROMTOOL)=')"
export REFRACT_K8S_BIN REFRACT_PROMTOOL

# A fresh build of the workspace and its tests takes about 4.5 GB under target/ (measured on a
# clean clone); say so before it starts rather than leave a linker's "No space left on device".
free_gb=$(df -Pk . | awk 'NR==2 { printf "%d", $4 / 1048576 }')
if [ "$free_gb" -lt 8 ]; then
  say "warning: only ${free_gb} GB free on this disk; a fresh build needs about 4.5 GB and the tests' clusters more"
fi

say "2/4 building the workspace and its tests, then the images (pause and busybox archives; the agents and refractctl from their Containerfiles, with buildah)"
cargo build --workspace --bins --tests --locked
scripts/images.sh --profile debug

say "3/4 format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

say "4/4 running tests (unit, in-process, end-to-end)"
cargo test --workspace --locked -- --test-threads="${REFRACT_TEST_THREADS:-2}"

say "all tests passed in $(( $(date +%s) - start ))s"
