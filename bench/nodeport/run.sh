#!/usr/bin/env bash
# NodePort from outside benchmark (root), in one run on a lab of its own
# (2 nodes): the lab's world reaches a backend pod on node1
#  - through a node port of node2 (the remote-backend path: node2's host
#    program DNATs, source-NATs to node2 and redirects to node1; the reply
#    comes back through node2), against
#  - the same pod routed directly (node1's agent restarted with
#    --enable-masquerade=false --enable-node-port=false, so no host program runs there and the pod's
#    replies keep its address, and the world given a route to node1's pod
#    CIDR),
# alternated ROUNDS times: one iperf3 TCP stream for SECONDS_PER_RUN s and
# 500 new connections one after the other (bench/nat/connrate: connect,
# request, answer, close) to the pod's lab workload (TCP 80).
# Prints Markdown for docs/benchmarks.md. LAB names the lab (default
# npbench).
set -euo pipefail
cd "$(dirname "$0")/../.."
LAB=${LAB:-npbench}
SECS=${SECONDS_PER_RUN:-8}
ROUNDS=${ROUNDS:-2}
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
make build >/dev/null
go build -o bin/connrate ./bench/nat/connrate
KUBECTL=$(ls ~/.cache/tendril/bin/kubectl-* 2>/dev/null | head -1)
[ -x "$KUBECTL" ] || { echo "kubectl missing: hack/k8s-binaries.sh builds it" >&2; exit 1; }
T="bin/tendril lab --name $LAB"
$T up --nodes 2 --pods-per-node 1 >/tmp/$LAB-up.log
trap '$T down >/dev/null 2>&1 || true' EXIT
eval "$($T env | grep '^export KUBECONFIG=')"
DIR=/var/run/tendril-lab/$LAB
NODE=node1
POD=default/$(grep -l "\"node\":\"$NODE\"" $DIR/pods/default_pod-*.json | head -1 | sed 's#.*/default_\(.*\)\.json#\1#')
POD_IP=$(python3 -c "import json;print(json.load(open('$DIR/pods/default_${POD#default/}.json'))['ips'][0])")
CIDR=${POD_IP%.*}.0/24
addr() { python3 -c "import json;print([n['address'] for n in json.load(open('$DIR/lab.json'))['nodes'] if n['name']=='$1'][0])"; }
NODE_IP=$(addr node1)
NODE2_IP=$(addr node2)
SOCK=$DIR/nodes/$NODE/agent.sock
PIDF=$DIR/pids/agent-$NODE.pid
mapfile -d '' ARGV </proc/$(cut -d' ' -f1 $PIDF)/cmdline
WORLD=$LAB-world

"$KUBECTL" label pod -n default "${POD#default/}" npbench=backend >/dev/null
"$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: npbench, namespace: default}
spec:
  type: NodePort
  selector: {npbench: backend}
  ports:
  - {name: iperf, protocol: TCP, port: 5201, targetPort: 5201}
  - {name: http, protocol: TCP, port: 80, targetPort: 80}
YAML
NP_IPERF=$("$KUBECTL" get svc -n default npbench -o jsonpath='{.spec.ports[0].nodePort}')
NP_HTTP=$("$KUBECTL" get svc -n default npbench -o jsonpath='{.spec.ports[1].nodePort}')

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
iperf() { # HOST PORT
	$T exec world -- iperf3 -c "$1" -p "$2" -t "$SECS" -J |
		python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'
}
connrate() { $T exec world -- $PWD/bin/connrate "$@" 2>/dev/null; }
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }
wait_answer() { # HOST:PORT
	for _ in $(seq 100); do
		$T probe world "$1" --timeout 1s >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	echo "no answer at $1" >&2
	exit 1
}

$T exec $POD -- iperf3 -s -p 5201 -D
sleep 0.3
echo "backend $POD ($POD_IP) on node1; world -> node2 $NODE2_IP:$NP_IPERF/$NP_HTTP; ${SECS}s per iperf3 run, $ROUNDS rounds" >&2
declare -a NP DI CN CD
for r in $(seq "$ROUNDS"); do
	restart_agent
	ip -n $WORLD route del "$CIDR" 2>/dev/null || true
	wait_answer "$NODE2_IP:$NP_HTTP"
	NP+=("$(iperf "$NODE2_IP" "$NP_IPERF")")
	CN+=("$(connrate -addr "$NODE2_IP:$NP_HTTP" -n 500 | field conn_per_sec_before_failure)")
	restart_agent --enable-masquerade=false --enable-node-port=false
	ip -n $WORLD route replace "$CIDR" via "$NODE_IP"
	wait_answer "$POD_IP:80"
	DI+=("$(iperf "$POD_IP" 5201)")
	CD+=("$(connrate -addr "$POD_IP:80" -n 500 | field conn_per_sec_before_failure)")
	echo "round $r: nodeport ${NP[-1]} Gbit/s ${CN[-1]} conn/s; direct ${DI[-1]} Gbit/s ${CD[-1]} conn/s" >&2
done
ip -n $WORLD route del "$CIDR" 2>/dev/null || true

echo
echo "| round | world → NodePort of node2, backend on node1: TCP Gbit/s | conn/s | world → backend routed directly: TCP Gbit/s | conn/s | ratio Gbit/s | ratio conn/s |"
echo "|---|---|---|---|---|---|---|"
for i in "${!NP[@]}"; do
	rt=$(python3 -c "print('%.2f' % (${NP[$i]}/${DI[$i]}))")
	rc=$(python3 -c "print('%.2f' % (${CN[$i]:-0}/max(${CD[$i]:-1},1)))")
	echo "| $((i + 1)) | ${NP[$i]} | ${CN[$i]} | ${DI[$i]} | ${CD[$i]} | $rt | $rc |"
done
