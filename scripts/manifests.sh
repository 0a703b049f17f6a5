#!/usr/bin/env bash
# Renders deploy/kubernetes/ from the Helm chart (one source): release
# "turnout" in namespace "llm" with the chart's pd profile. `make manifests`
# writes the files; deploy/chart_test.go renders into a temp dir and fails
# when they differ from the committed ones.
#
# Usage: scripts/manifests.sh [OUTDIR]   (default deploy/kubernetes)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$ROOT/deploy/kubernetes}
helm=$(bash "$ROOT/scripts/helm.sh")
chart=$ROOT/deploy/helm/turnout
mkdir -p "$out"
render() { # FILE TEMPLATES...
  local f=$1; shift
  local args=()
  for t in "$@"; do args+=(--show-only "templates/$t"); done
  {
    echo "# Rendered from deploy/helm/turnout (values ci/pd-values.yaml) by make manifests: edit the chart, not this file."
    if [ "$f" = turnout.yaml ]; then
      # The chart makes this Secret itself (templates/secret.yaml, a random token).
      echo "# First create the feedback token Secret the pod mounts:"
      echo "#   kubectl -n llm create secret generic turnout-feedback --from-literal=token=\$(head -c 24 /dev/urandom | base64 | tr -d '=+/')"
    fi
    "$helm" template turnout "$chart" --namespace llm -f "$chart/ci/pd-values.yaml" "${args[@]}"
  } >"$out/$f"
}
# rbac.yaml: what lab/testenv/kubetest applies for every Kubernetes test.
render rbac.yaml serviceaccount.yaml rbac.yaml
render turnout.yaml configmap.yaml deployment.yaml service.yaml admin-service.yaml pdb.yaml
