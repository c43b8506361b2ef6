#!/usr/bin/env bash
# Installs the envtest control-plane binaries (etcd, kube-apiserver and, on request,
# kube-controller-manager) into setup-envtest's store, so `setup-envtest use -i` and
# controller-runtime's envtest find them. --with-node adds what a one-node cluster needs beside
# them (kubelet, kube-scheduler, kube-proxy, kubectl, and kube-controller-manager), built the same
# way into the same store (hack/cluster uses them).
#
# setup-envtest's download source is not reachable on every machine, so when the normal
# download fails the binaries are built from Go modules. Built binaries are cached in the
# store and never rebuilt while they run.
#
# Usage: hack/setup-envtest.sh [--with-controller-manager] [--with-node]
#        (prints the store directory last)
set -euo pipefail

K8S_VERSION="${ENVTEST_K8S_VERSION:-1.37.2}"
ETCD_VERSION="${ENVTEST_ETCD_VERSION:-3.6.16}"
SETUP_ENVTEST_VERSION="${SETUP_ENVTEST_VERSION:-release-0.25}"
STORE_ROOT="${ENVTEST_STORE:-${XDG_DATA_HOME:-$HOME/.local/share}/kubebuilder-envtest}"
OS_ARCH="$(go env GOOS)-$(go env GOARCH)"
BIN_DIR="$STORE_ROOT/k8s/$K8S_VERSION-$OS_ARCH"
WANT_KCM=false
WANT_NODE=false
NODE_CMDS=(kubelet kube-scheduler kube-proxy kubectl)
for arg in "$@"; do
  case "$arg" in
    --with-controller-manager) WANT_KCM=true ;;
    --with-node) WANT_KCM=true; WANT_NODE=true ;;
    *) echo "usage: $0 [--with-controller-manager] [--with-node]" >&2; exit 2 ;;
  esac
done

log() { printf '[setup-envtest] %s\n' "$*" >&2; }

works() { [[ -x "$1" ]] && { "$1" --version >/dev/null 2>&1 || "$1" version --client >/dev/null 2>&1; }; }

have_all() {
  works "$BIN_DIR/etcd" && works "$BIN_DIR/kube-apiserver" || return 1
  if $WANT_KCM; then works "$BIN_DIR/kube-controller-manager" || return 1; fi
  if $WANT_NODE; then
    for c in "${NODE_CMDS[@]}"; do works "$BIN_DIR/$c" || return 1; done
  fi
  return 0
}

if have_all; then
  log "cached binaries in $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi
mkdir -p "$BIN_DIR"

# 1. The normal way: setup-envtest downloads release archives (short timeout: where the source
#    is unreachable it would otherwise hang).
if ! works "$BIN_DIR/kube-apiserver"; then
  log "trying setup-envtest download of $K8S_VERSION"
  if timeout 120 go run "sigs.k8s.io/controller-runtime/tools/setup-envtest@$SETUP_ENVTEST_VERSION" \
      use "$K8S_VERSION" --bin-dir "$STORE_ROOT" -p path >/dev/null 2>&1; then
    log "downloaded"
  else
    log "download unavailable; building from Go modules instead"
  fi
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# 2. etcd: a throwaway module requiring the etcd server at the pinned version.
if ! works "$BIN_DIR/etcd"; then
  log "building etcd v$ETCD_VERSION (about 2 minutes cold)"
  mkdir -p "$WORK/etcd"
  (
    cd "$WORK/etcd"
    go mod init redline.local/build-etcd >/dev/null 2>&1
    go mod edit -require="go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
    printf 'package main\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
    go mod tidy >/dev/null 2>&1 || true
    go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >/dev/null
    CGO_ENABLED=0 go build -trimpath -o "$BIN_DIR/etcd.tmp" go.etcd.io/etcd/server/v3
  )
  mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd"
  log "etcd ready: $("$BIN_DIR/etcd" --version | head -1)"
fi

# 3. Kubernetes binaries: k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces
#    them with local paths, so a consumer must replace each with the published v0.X.Y.
build_k8s() {
  local mod="$WORK/k8s"
  if [[ ! -f "$mod/go.mod" ]]; then
    mkdir -p "$mod"
    (
      cd "$mod"
      go mod init redline.local/build-k8s >/dev/null 2>&1
      local gomod
      gomod="$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
      local staging_version="v0.${K8S_VERSION#1.}"
      go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION"
      # Every module that k8s.io/kubernetes requires at v0.0.0 is a staging module.
      awk '$2 == "v0.0.0" {print $1}' "$gomod" | sort -u | while read -r m; do
        go mod edit -replace="$m=$m@$staging_version"
      done
      # Every command's packages, so that one tidy resolves them all (the node's only matter
      # with --with-node, but resolving them costs seconds and keeps one module for every build).
      {
        printf 'package main\nimport (\n'
        for p in kube-apiserver/app kube-controller-manager/app kubelet/app kube-scheduler/app kube-proxy/app; do
          printf '_ "k8s.io/kubernetes/cmd/%s"\n' "$p"
        done
        printf '_ "k8s.io/kubectl/pkg/cmd"\n)\n'
      } > tools.go
      go mod tidy >/dev/null
    )
  fi
  local minor="${K8S_VERSION#1.}"; minor="${minor%%.*}"
  local ldflags="-s -w"
  ldflags+=" -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION"
  # One go build for every command asked: their shared packages compile once. Each binary goes
  # to a temporary name first so that a cut build never leaves a half-written binary behind.
  local cmd pkgs=()
  for cmd in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  mkdir -p "$WORK/out"
  (cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$WORK/out/" "${pkgs[@]}")
  for cmd in "$@"; do
    mv "$WORK/out/$cmd" "$BIN_DIR/$cmd.tmp"
    mv "$BIN_DIR/$cmd.tmp" "$BIN_DIR/$cmd"
    log "$cmd ready: $("$BIN_DIR/$cmd" --version 2>&1 | head -1)"
  done
}

if ! works "$BIN_DIR/kube-apiserver"; then
  log "building kube-apiserver v$K8S_VERSION (12-15 minutes cold on 2 cores, ~6 GB of build cache)"
  build_k8s kube-apiserver
fi
if $WANT_KCM && ! works "$BIN_DIR/kube-controller-manager"; then
  log "building kube-controller-manager v$K8S_VERSION (shares most of kube-apiserver's build cache)"
  build_k8s kube-controller-manager
fi
if $WANT_NODE; then
  missing=()
  for c in "${NODE_CMDS[@]}"; do works "$BIN_DIR/$c" || missing+=("$c"); done
  if ((${#missing[@]})); then
    log "building ${missing[*]} v$K8S_VERSION (about 7 minutes more on kube-apiserver's build cache)"
    build_k8s "${missing[@]}"
  fi
fi

echo "$BIN_DIR"
