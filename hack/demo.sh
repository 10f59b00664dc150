#!/usr/bin/env bash
# The demo: start an agent in a temporary directory, show its status, stop it.
# (The lab turns this into a multi-node cluster demo.)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d /tmp/tendril-demo.XXXXXX)
sock=$dir/tendril.sock
echo "==> Starting tendril-agent (state in $dir)"
bin/tendril-agent --state-dir "$dir/state" --socket "$sock" --bpf-root "/sys/fs/bpf/tendril-demo" \
	--prometheus-serve-addr "" --node-name demo-node --install-host-networking=false --enable-datapath=false >"$dir/agent.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
	bin/tendril -H "unix://$sock" status --brief >/dev/null 2>&1 && break
	sleep 0.1
done
echo "==> tendril status"
bin/tendril -H "unix://$sock" status
echo "==> Stopping the agent"
kill -TERM $pid
wait $pid
echo "==> Done. Agent log:"
cat "$dir/agent.log"
