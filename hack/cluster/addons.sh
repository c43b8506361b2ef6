#!/usr/bin/env bash
# Builds the cluster add-ons the real-cluster suite installs, from Go modules, as images without
# a daemon (hack/images), with the Helm charts their modules carry:
#
# - metrics-server (sigs.k8s.io/metrics-server): the resource metrics an HPA scales on;
# - cert-manager (github.com/cert-manager/cert-manager): controller, cainjector and webhook, for
#   the chart's webhook.certificates=certManager mode.
#
# cert-manager is pinned to v1.11.5, the last release whose module holds its commands: from
# v1.12 on they are modules of their own (cmd/controller is
# github.com/cert-manager/cert-manager/controller-binary, and so on) that replace the main module
# with a relative path and are not published, so the Go module proxy cannot build them. What the
# chart uses of cert-manager (cert-manager.io/v1 Issuer and Certificate, the cainjector's
# inject-ca-from annotation) has not changed since v1.0.
#
# Each add-on is built once into a store (binaries, image archive and chart) and reused while
# its files are there, as hack/setup-envtest.sh caches the cluster's binaries.
#
# Usage: hack/cluster/addons.sh [metrics-server] [cert-manager]   (default: both; prints the
#        store directory last)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
METRICS_SERVER_VERSION="${METRICS_SERVER_VERSION:-v0.9.0}"
CERT_MANAGER_VERSION="${CERT_MANAGER_VERSION:-v1.11.5}"
STORE="${ADDONS_STORE:-${XDG_DATA_HOME:-$HOME/.local/share}/redline-cluster-addons}"
WANT=("$@")
((${#WANT[@]})) || WANT=(metrics-server cert-manager)

log() { printf '[addons] %s\n' "$*" >&2; }

# One build at a time per store: a second caller (make test-cluster while .ci/run's background
# build runs) waits for the first and then finds its results.
mkdir -p "$STORE"
exec 9>"$STORE/.lock"
flock 9

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# module_dir MODULE@VERSION: where the module's files are (downloaded first).
module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }

# build_cmds DIR VERSION MODULE LDFLAGS PKG...: one go build of the packages, in a throwaway
# module requiring MODULE@VERSION, into DIR (a temporary name first: a cut build leaves nothing).
build_cmds() {
  local out="$1" version="$2" module="$3" ldflags="$4"; shift 4
  local mod="$WORK/$(basename "$out")"
  mkdir -p "$mod" "$out.tmp"
  (
    cd "$mod"
    go mod init "redline.local/build-$(basename "$out")" >/dev/null 2>&1
    {
      printf 'package main\nimport (\n'
      for p in "$@"; do printf '_ "%s"\n' "$p"; done
      printf ')\n'
    } >tools.go
    go get "$module@$version" >"$mod.log" 2>&1 && go mod tidy >>"$mod.log" 2>&1 || { cat "$mod.log" >&2; exit 1; }
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp/" "$@"
  )
}

# pack DIR REF=BIN...: image archives DIR/<basename BIN>.tar (hack/images).
pack() {
  local dir="$1"; shift
  (cd "$HERE/../images" && go run . -out "$dir" "$@" 2>/dev/null)
}

metrics_server() {
  local dir="$STORE/metrics-server-$METRICS_SERVER_VERSION"
  if [[ -f "$dir/metrics-server.tar" && -f "$dir/chart/Chart.yaml" ]]; then
    log "metrics-server $METRICS_SERVER_VERSION cached in $dir"
    return
  fi
  local t0=$SECONDS
  log "building metrics-server $METRICS_SERVER_VERSION (about 5 minutes cold on 2 cores)"
  rm -rf "$dir" "$dir.tmp"
  build_cmds "$dir" "$METRICS_SERVER_VERSION" sigs.k8s.io/metrics-server \
    "-X k8s.io/client-go/pkg/version.gitVersion=$METRICS_SERVER_VERSION" \
    sigs.k8s.io/metrics-server/cmd/metrics-server
  local src
  src="$(module_dir "sigs.k8s.io/metrics-server@$METRICS_SERVER_VERSION")"
  cp -r "$src/charts/metrics-server" "$dir.tmp/chart"
  chmod -R u+w "$dir.tmp/chart"
  pack "$dir.tmp" "redline.local/metrics-server:$METRICS_SERVER_VERSION=$dir.tmp/metrics-server"
  rm -f "$dir.tmp/metrics-server"
  mv "$dir.tmp" "$dir"
  log "metrics-server ready in $dir after $((SECONDS - t0))s"
}

cert_manager() {
  local dir="$STORE/cert-manager-$CERT_MANAGER_VERSION"
  if [[ -f "$dir/controller.tar" && -f "$dir/cainjector.tar" && -f "$dir/webhook.tar" && -f "$dir/chart/Chart.yaml" ]]; then
    log "cert-manager $CERT_MANAGER_VERSION cached in $dir"
    return
  fi
  local t0=$SECONDS m=github.com/cert-manager/cert-manager
  log "building cert-manager $CERT_MANAGER_VERSION controller, cainjector and webhook (about 10 minutes cold on 2 cores)"
  rm -rf "$dir" "$dir.tmp"
  build_cmds "$dir" "$CERT_MANAGER_VERSION" "$m" "-X $m/pkg/util.AppVersion=$CERT_MANAGER_VERSION" \
    "$m/cmd/controller" "$m/cmd/cainjector" "$m/cmd/webhook"
  # The chart as cert-manager's release makes it: Chart.yaml from its template with the
  # version, and the CRDs as a template of their own behind installCRDs.
  local src
  src="$(module_dir "$m@$CERT_MANAGER_VERSION")"
  cp -r "$src/deploy/charts/cert-manager" "$dir.tmp/chart"
  chmod -R u+w "$dir.tmp/chart"
  sed -e "s/^version: .*/version: $CERT_MANAGER_VERSION/" -e "s/^appVersion: .*/appVersion: $CERT_MANAGER_VERSION/" \
    -e '/artifacthub.io\/prerelease/d' -e '/^annotations:/d' \
    "$dir.tmp/chart/Chart.template.yaml" >"$dir.tmp/chart/Chart.yaml"
  rm -f "$dir.tmp/chart/Chart.template.yaml" "$dir.tmp/chart/README.template.md"
  {
    echo '{{- if .Values.installCRDs }}'
    for f in "$src"/deploy/crds/crd-*.yaml; do
      echo '---'
      cat "$f"
    done
    echo '{{- end }}'
  } >"$dir.tmp/chart/templates/crds.yaml"
  local refs=()
  for c in controller cainjector webhook; do
    refs+=("redline.local/cert-manager-$c:$CERT_MANAGER_VERSION=$dir.tmp/$c")
  done
  pack "$dir.tmp" "${refs[@]}"
  rm -f "$dir.tmp/controller" "$dir.tmp/cainjector" "$dir.tmp/webhook"
  mv "$dir.tmp" "$dir"
  log "cert-manager ready in $dir after $((SECONDS - t0))s"
}

for a in "${WANT[@]}"; do
  case "$a" in
    metrics-server) metrics_server ;;
    cert-manager) cert_manager ;;
    *) echo "usage: $0 [metrics-server] [cert-manager]" >&2; exit 2 ;;
  esac
done
echo "$STORE"
