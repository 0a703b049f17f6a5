#!/usr/bin/env bash
# Builds the Helm CLI from the helm.sh/helm/v3 module (Go module proxy only, no
# git clone) for the chart tests (helm lint, helm template), and caches the
# binary by version, like scripts/kube-apiserver.sh. The build runs in its own
# temporary module, so turnout's go.mod does not grow by Helm's dependencies.
#
# Prints the binary's path on stdout. Env:
#   HELM_VERSION           helm version (default v3.22.0)
#   TURNOUT_KUBE_CACHE     cache dir (default ${XDG_CACHE_HOME:-$HOME/.cache}/turnout)
#   HELM                   an existing binary: printed as is, nothing is built
set -euo pipefail
if [ -n "${HELM:-}" ]; then
  [ -x "$HELM" ] || { echo "HELM=$HELM is not executable" >&2; exit 1; }
  echo "$HELM"; exit 0
fi
ver=${HELM_VERSION:-v3.22.0}
cache=${TURNOUT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/turnout}
out=$cache/helm-$ver
if [ -x "$out" ]; then echo "$out"; exit 0; fi
mkdir -p "$cache"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off
work=$(mktemp -d "$cache/helm-build-XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
echo "building helm $ver in $work (first time only: a few minutes)" >&2
cd "$work"
go mod init turnout.local/helmbuild >&2 2>&1
go get "helm.sh/helm/v3@$ver" >&2
# -ldflags -s -w: no symbol table, a smaller binary; the version helm prints.
go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$ver" -o "$work/helm" helm.sh/helm/v3/cmd/helm >&2
mv "$work/helm" "$out"
echo "$out"
