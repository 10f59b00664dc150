#!/usr/bin/env bash
# The demo (until the multi-node lab lands): one node as a network namespace
# with a tendril-agent in it, three pods wired by tendril-cni, real traffic
# through the eBPF datapath, a policy that lets only the frontend reach the
# backend, and what Tendril shows about it. Needs root. Cleans up after
# itself; hack/demo-down.sh removes leftovers of an interrupted run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -ne 0 ]]; then
	echo "demo: needs root (network namespaces, eBPF)" >&2
	exit 1
fi
hack/demo-down.sh >/dev/null 2>&1 || true

P=tdrdemo
dir=$(mktemp -d /tmp/tendril-demo.XXXXXX)
sock=$dir/tendril.sock
bpf=/sys/fs/bpf/tendril-demo
T="bin/tendril -H unix://$sock"
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
innode() { nsenter --net=/run/netns/$P-node "$@"; }
inpod() { local pod=$1; shift; nsenter --net=/run/netns/$P-$pod "$@"; }

cleanup() {
	for pod in frontend backend other; do
		[[ -e /run/netns/$P-$pod ]] && cni DEL "$pod" >/dev/null 2>&1 || true
	done
	[[ -n ${agent_pid:-} ]] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null || true
	[[ -n ${web_pid:-} ]] && kill "$web_pid" 2>/dev/null || true
	hack/demo-down.sh >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap cleanup EXIT

cni() { # cni ADD|DEL POD
	local cmd=$1 pod=$2
	echo '{"cniVersion":"1.1.0","name":"tendril","type":"tendril-cni","agent-socket":"'"$sock"'"}' |
		CNI_COMMAND=$cmd CNI_CONTAINERID=demo-$pod CNI_NETNS=/run/netns/$P-$pod CNI_IFNAME=eth0 \
			CNI_PATH=$PWD/bin CNI_ARGS="K8S_POD_NAMESPACE=demo;K8S_POD_NAME=$pod" innode bin/tendril-cni
}

step "A node (network namespace $P-node) running tendril-agent"
ip netns add $P-node
innode ip link set lo up
start_agent() {
	# nsenter execs the agent, so $! is the agent itself (no subshell).
	nsenter --net=/run/netns/$P-node bin/tendril-agent --state-dir "$dir/state" --socket "$sock" --bpf-root "$bpf" \
		--prometheus-serve-addr "" --node-name demo-node --ipv4-range 10.123.0.0/24 --ipv6-range none >>"$dir/agent.log" 2>&1 &
	agent_pid=$!
}
start_agent
for _ in $(seq 100); do $T status --brief >/dev/null 2>&1 && break; sleep 0.1; done
$T status --brief

step "Three pods, wired by tendril-cni (veth, address, routes, endpoint, eBPF programs)"
declare -A ip
for pod in frontend backend other; do
	ip netns add $P-$pod
	inpod "$pod" ip link set lo up
	ip[$pod]=$(cni ADD "$pod" | sed -n 's/.*"address": *"\([0-9.]*\)\/32".*/\1/p' | head -1)
	echo "  $pod: ${ip[$pod]}"
done
for pod in frontend backend other; do
	curl -s --unix-socket "$sock" -X PATCH "http://x/v1/endpoint/pod-name:demo%2F$pod/labels" \
		-d '{"user":["k8s:app='"$pod"'"]}' >/dev/null
done
$T endpoint list

step "A web server in the backend pod on port 80"
nsenter --net=/run/netns/$P-backend python3 -m http.server 80 --bind "${ip[backend]}" >/dev/null 2>&1 &
web_pid=$!
sleep 1
probe() { # probe FROM: HTTP GET of the backend from a pod
	if inpod "$1" curl -s -m 2 -o /dev/null "http://${ip[backend]}/"; then echo "  $1 -> backend:80  connected"; else echo "  $1 -> backend:80  BLOCKED"; fi
}
probe frontend
probe other

step "Policy: the backend accepts only the frontend, on 80/TCP (examples/policies/allow-frontend.json)"
$T policy import examples/policies/allow-frontend.json
sleep 1
probe frontend
probe other
$T policy trace --src k8s:app=other,k8s:io.kubernetes.pod.namespace=demo \
	--dst k8s:app=backend,k8s:io.kubernetes.pod.namespace=demo --dport 80/TCP || true

step "The datapath's view: policy entries and counters in the pinned BPF maps"
bin/tendril bpf policy list --bpf-root "$bpf"
bin/tendril bpf metrics list --bpf-root "$bpf"

step "Kill the agent with SIGKILL: the pinned datapath keeps forwarding and enforcing"
kill -9 "$agent_pid"; wait "$agent_pid" 2>/dev/null || true; agent_pid=
if $T status --brief >/dev/null 2>&1; then echo "  an agent still answers?" >&2; exit 1; fi
echo "  (no agent running)"
probe frontend
probe other

step "Start it again: same endpoints, same links, same policy"
start_agent
for _ in $(seq 100); do $T status --brief >/dev/null 2>&1 && break; sleep 0.1; done
$T status

step "Done. Try next: the same commands against your own agent (README), docs/ for each subsystem"
