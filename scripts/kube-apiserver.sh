#!/usr/bin/env bash
# Builds kube-apiserver from the k8s.io/kubernetes module (Go module proxy only, no git
# clone) for the Kubernetes discovery tests, and caches the binary by version so a
# fresh clone on a reused machine does not rebuild it (~5-15 min on 2 cores).
#
# Prints the binary's path on stdout. Env:
#   KUBE_VERSION           kubernetes version (default v1.31.4)
#   TURNOUT_KUBE_CACHE     cache dir (default ${XDG_CACHE_HOME:-$HOME/.cache}/turnout)
#   KUBE_APISERVER         an existing binary: printed as is, nothing is built
set -euo pipefail
if [ -n "${KUBE_APISERVER:-}" ]; then
  [ -x "$KUBE_APISERVER" ] || { echo "KUBE_APISERVER=$KUBE_APISERVER is not executable" >&2; exit 1; }
  echo "$KUBE_APISERVER"; exit 0
fi
ver=${KUBE_VERSION:-v1.31.4}
staging=v0.${ver#v1.}                      # v1.31.4 -> v0.31.4: the staging modules' tag
cache=${TURNOUT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/turnout}
out=$cache/kube-apiserver-$ver
if [ -x "$out" ]; then echo "$out"; exit 0; fi
mkdir -p "$cache"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off
dir=$(go mod download -json "k8s.io/kubernetes@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { echo "go mod download k8s.io/kubernetes@$ver failed" >&2; exit 1; }
work=$(mktemp -d "$cache/build-XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
echo "building kube-apiserver $ver in $work (first time only: several minutes)" >&2
cp -r "$dir/." "$work/src"
chmod -R u+w "$work/src"
cd "$work/src"
# The module's go.mod points every k8s.io/* staging module at ./staging (absent from the
# module zip); require the published v0.x tags instead.
mods=$(sed -n 's|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*|\1|p' go.mod)
sed -i '/=> \.\/staging\//d' go.mod
rm -f go.work go.work.sum                 # the repo's workspace lists ./staging too
for m in $mods; do go mod edit -require="$m@$staging"; done
go mod tidy >&2
go build -trimpath -o "$work/kube-apiserver" ./cmd/kube-apiserver >&2
mv "$work/kube-apiserver" "$out"
echo "$out"
