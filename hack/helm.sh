#!/usr/bin/env bash
# Builds the helm CLI at a pinned version from the Go module proxy into the
# cache outside the repository, like hack/k8s-binaries.sh does for the
# control plane:
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/helm-<version>
# helm's go.mod has no replace directives, so `go install module@version`
# builds it as published (checked against the checksum database); helm is not
# a dependency of Tendril's own go.mod. The version string helm prints comes
# from its internal/version package, set here with -X like helm's Makefile.
# Idempotent: an existing binary is kept. Cold: a few minutes.
#
#   hack/helm.sh              build if missing, print the binary's path
#   hack/helm.sh --print-path print the binary's path
set -euo pipefail

VERSION=${HELM_VERSION:-v3.22.0}
CACHE=${TENDRIL_CACHE:-$HOME/.cache/tendril}
BIN=$CACHE/bin
OUT=$BIN/helm-$VERSION

if [[ ${1:-} == --print-path ]]; then
	echo "$OUT"
	exit 0
fi
log() { echo "helm: $*" >&2; }
if [[ -x $OUT ]]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$BIN" "$CACHE/scratch"
# One build at a time per cache (see hack/k8s-binaries.sh).
exec 9>"$CACHE/.build.lock"
flock 9
if [[ -x $OUT ]]; then
	echo "$OUT"
	exit 0
fi
log "building helm.sh/helm/v3/cmd/helm@$VERSION (a few minutes the first time)"
gobin=$CACHE/scratch/helm-$VERSION
rm -rf "$gobin"
mkdir -p "$gobin"
# Outside any module (the scratch directory), so Tendril's go.mod is neither
# read nor changed.
(cd "$CACHE/scratch" && GOFLAGS= GOWORK=off CGO_ENABLED=0 GOBIN=$gobin go install -trimpath \
	-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$VERSION" \
	"helm.sh/helm/v3/cmd/helm@$VERSION")
mv "$gobin/helm" "$OUT"
rmdir "$gobin"
log "built $OUT"
echo "$OUT"
