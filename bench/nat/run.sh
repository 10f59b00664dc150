#!/usr/bin/env bash
# Masquerade benchmark (root), in one run on a lab of its own (2 nodes):
#  1. pod-to-world TCP throughput (iperf3, one stream) through masquerade
#     against plain routing without it (the agent restarted with
#     --enable-masquerade=false --enable-node-port=false and the world given a route back to the
#     pod CIDR), alternated ROUNDS times;
#  2. new connections per second from a pod to the world server (TCP 80), each
#     connect + request + answer + close (bench/nat/connrate), with and
#     without masquerade;
#  3. the same (to TCP 81) through masquerade with a small port range
#     (--masquerade-port-range, RANGE ports) until it is exhausted: where
#     the first connection fails, the drop counter of "Masquerade port range
#     exhausted", and that the range is usable again once the flows'
#     conntrack entries expire (10 s after close).
# Prints Markdown for docs/benchmarks.md. LAB names the lab (default
# natbench); SECONDS_PER_RUN, ROUNDS, RANGE tune it.
set -euo pipefail
cd "$(dirname "$0")/../.."
LAB=${LAB:-natbench}
SECS=${SECONDS_PER_RUN:-8}
ROUNDS=${ROUNDS:-2}
RANGE=${RANGE:-256}
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
make build >/dev/null
go build -o bin/connrate ./bench/nat/connrate
T="bin/tendril lab --name $LAB"
$T up --nodes 2 --pods-per-node 1 >/tmp/natbench-up.log
trap '$T down >/dev/null 2>&1 || true; pkill -F /tmp/natbench-iperf.pid 2>/dev/null || true' EXIT
DIR=/var/run/tendril-lab/$LAB
NODE=node1
POD=default/$(grep -l "\"node\":\"$NODE\"" $DIR/pods/default_pod-*.json | head -1 | sed 's#.*/default_\(.*\)\.json#\1#')
NODE_IP=$(python3 -c "import json;print([n['address'] for n in json.load(open('$DIR/lab.json'))['nodes'] if n['name']=='$NODE'][0])")
# The node's pod CIDR (a /24 in the lab): the pod's address with its last octet 0.
CIDR=$(python3 -c "import json;ip=json.load(open('$DIR/pods/default_${POD#default/}.json'))['ips'][0];print(ip.rsplit('.',1)[0]+'.0/24')")
SOCK=$DIR/nodes/$NODE/agent.sock
BPF=/sys/fs/bpf/tendril-lab/$LAB/$NODE
PIDF=$DIR/pids/agent-$NODE.pid
# The agent's command line, empty arguments kept (--prometheus-serve-addr "").
mapfile -d '' ARGV </proc/$(cut -d' ' -f1 $PIDF)/cmdline
WORLD=$LAB-world

restart_agent() { # extra agent flags
	local pid
	pid=$(cut -d' ' -f1 $PIDF)
	kill -9 "$pid" 2>/dev/null || true
	while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	setsid nsenter --net=/run/netns/$LAB-$NODE "${ARGV[@]}" "$@" >>$DIR/logs/agent-$NODE.log 2>&1 </dev/null &
	echo "$! $(awk '{print $22}' /proc/$!/stat)" >$PIDF
	for _ in $(seq 200); do
		bin/tendril -H $SOCK status >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "agent did not come back" >&2
	exit 1
}
iperf() {
	$T exec $POD -- iperf3 -c 198.51.100.1 -p 5201 -t "$SECS" -J |
		python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'
}
connrate() { $T exec $POD -- $PWD/bin/connrate "$@" 2>/dev/null; }
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }
drops() { bin/tendril bpf --bpf-root $BPF metrics list | awk -F'  +' '/Masquerade port range exhausted/ {print $3}' | head -1; }

nsenter --net=/run/netns/$WORLD iperf3 -s -B 198.51.100.1 -p 5201 -D -I /tmp/natbench-iperf.pid
sleep 0.3
echo "pod $POD on $NODE ($NODE_IP, pod CIDR $CIDR); ${SECS}s per iperf3 run, $ROUNDS rounds" >&2
declare -a MASQ OFF CM CO
for r in $(seq "$ROUNDS"); do
	restart_agent
	ip -n $WORLD route del "$CIDR" 2>/dev/null || true
	MASQ+=("$(iperf)")
	CM+=("$(connrate -addr 198.51.100.1:80 -n 500 | field conn_per_sec_before_failure)")
	restart_agent --enable-masquerade=false --enable-node-port=false
	ip -n $WORLD route replace "$CIDR" via "$NODE_IP"
	OFF+=("$(iperf)")
	CO+=("$(connrate -addr 198.51.100.1:80 -n 500 | field conn_per_sec_before_failure)")
	echo "round $r: masquerade ${MASQ[-1]} Gbit/s ${CM[-1]} conn/s; routed ${OFF[-1]} Gbit/s ${CO[-1]} conn/s" >&2
done
ip -n $WORLD route del "$CIDR" 2>/dev/null || true
restart_agent --masquerade-port-range=61000-$((61000 + RANGE - 1))
d0=$(drops)
# Another destination port than the rounds': its own ports, no mapping
# of theirs in the way.
ex=$(connrate -addr 198.51.100.1:81 -n $((RANGE * 2)) -timeout 300ms -stop-after-failures 5)
d1=$(drops)
status=$(bin/tendril -H $SOCK status | grep -A8 '^Masquerade' | grep -E 'NAT table|drops')
sleep 12
again=$(connrate -addr 198.51.100.1:81 -n 50)

echo
echo "| run | pod → world TCP (Gbit/s) | new connections/s |"
echo "|---|---|---|"
for i in "${!MASQ[@]}"; do
	echo "| $((i + 1)) masquerade (eBPF) | ${MASQ[$i]} | ${CM[$i]} |"
	echo "| $((i + 1)) routed, no masquerade | ${OFF[$i]} | ${CO[$i]} |"
done
echo
echo "Exhaustion, range of $RANGE ports: $ex"
echo "drops counted (Masquerade port range exhausted): $((${d1:-0} - ${d0:-0}))"
echo "status: $(echo "$status" | tr -s ' ' | tr '\n' ';')"
echo "12 s later (the flows' conntrack entries expired): $again"
