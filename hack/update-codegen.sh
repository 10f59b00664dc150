#!/usr/bin/env bash
# Regenerates the Kubernetes code of Tendril's custom resources: deepcopy
# (pkg/k8s/apis, pkg/policy/api), the CRD manifests (deploy/crds), and the
# typed clientset, listers and informers (pkg/k8s/client). The generators are
# built once from the Go module proxy into a cache outside the repository,
# at pinned versions, so every run produces the same bytes.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
MODULE=github.com/tendril-net/tendril
CACHE=${TENDRIL_CACHE:-$HOME/.cache/tendril}/tools
CONTROLLER_TOOLS_VERSION=v0.23.0
CODE_GENERATOR_VERSION=v0.36.3
CG_DIR=$CACHE/controller-gen-$CONTROLLER_TOOLS_VERSION
KCG_DIR=$CACHE/code-generator-$CODE_GENERATOR_VERSION

install_tool() { # dir package version binary
	if [ ! -x "$1/$4" ]; then
		echo "codegen: building $4 $3 into $1" >&2
		mkdir -p "$1"
		(cd /tmp && GOBIN="$1" GOFLAGS=-mod=mod go install "$2@$3")
	fi
}
install_tool "$CG_DIR" sigs.k8s.io/controller-tools/cmd/controller-gen "$CONTROLLER_TOOLS_VERSION" controller-gen
for t in client-gen lister-gen informer-gen; do
	install_tool "$KCG_DIR" "k8s.io/code-generator/cmd/$t" "$CODE_GENERATOR_VERSION" "$t"
done

APIS=$MODULE/pkg/k8s/apis/tendril.io/v1alpha1
OUT=pkg/k8s/client
HEADER=hack/boilerplate.go.txt

# Deepcopy and CRDs (with OpenAPI v3 validation from the types' markers).
rm -f deploy/crds/*.yaml
"$CG_DIR/controller-gen" \
	object:headerFile="$HEADER" \
	crd:crdVersions=v1,maxDescLen=400 \
	paths=./pkg/k8s/apis/... paths=./pkg/policy/api/... \
	output:crd:artifacts:config=deploy/crds

# Typed client, listers and informers.
rm -rf "$OUT"
"$KCG_DIR/client-gen" --go-header-file "$HEADER" \
	--clientset-name versioned --input-base "" --input "$APIS" \
	--output-dir "$OUT/clientset" --output-pkg "$MODULE/$OUT/clientset"
"$KCG_DIR/lister-gen" --go-header-file "$HEADER" \
	--output-dir "$OUT/listers" --output-pkg "$MODULE/$OUT/listers" "$APIS"
"$KCG_DIR/informer-gen" --go-header-file "$HEADER" \
	--versioned-clientset-package "$MODULE/$OUT/clientset/versioned" \
	--listers-package "$MODULE/$OUT/listers" \
	--output-dir "$OUT/informers" --output-pkg "$MODULE/$OUT/informers" "$APIS"

gofmt -w pkg/k8s pkg/policy/api
echo "codegen: done" >&2
