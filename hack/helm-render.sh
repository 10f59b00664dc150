#!/usr/bin/env bash
# Lints the Helm chart and renders it into OUT_DIR: OUT_DIR/default.yaml
# from the chart's values, and OUT_DIR/<name>.yaml for each values file
# deploy/helm/values/<name>.yaml. `make helm-render` writes them into
# deploy/helm/rendered (committed); `make verify-helm` renders into a
# temporary directory and compares. The CRDs are not in the rendered files
# (they are deploy/crds, copied into the chart's crds/).
#
#   hack/helm-render.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: hack/helm-render.sh OUT_DIR}
helm=$(hack/helm.sh)
chart=deploy/helm/tendril
# The API server version the lab runs (hack/k8s-binaries.sh): helm's own
# default is older than the chart's kubeVersion.
kube_version=${K8S_VERSION:-v1.36.3}
mkdir -p "$out"
"$helm" lint --strict --quiet --kube-version "$kube_version" "$chart" >/dev/null
render() { "$helm" template tendril "$chart" --namespace kube-system --kube-version "$kube_version" "$@"; }
render >"$out/default.yaml"
for f in deploy/helm/values/*.yaml; do
	[[ -e $f ]] || continue
	"$helm" lint --strict --quiet --kube-version "$kube_version" "$chart" -f "$f" >/dev/null
	render -f "$f" >"$out/$(basename "$f")"
done
