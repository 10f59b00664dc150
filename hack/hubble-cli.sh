#!/usr/bin/env bash
# Builds the stock hubble CLI (github.com/cilium/cilium's ./hubble) into the
# cache: see hack/cilium-tool.sh.
#   hack/hubble-cli.sh              build if missing, print the binary's path
#   hack/hubble-cli.sh --print-path print the binary's path
exec "$(dirname "$0")/cilium-tool.sh" hubble "$@"
