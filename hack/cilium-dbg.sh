#!/usr/bin/env bash
# Builds the stock cilium-dbg CLI (github.com/cilium/cilium's ./cilium-dbg)
# into the cache: see hack/cilium-tool.sh.
#   hack/cilium-dbg.sh              build if missing, print the binary's path
#   hack/cilium-dbg.sh --print-path print the binary's path
exec "$(dirname "$0")/cilium-tool.sh" cilium-dbg "$@"
