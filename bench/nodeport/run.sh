#!/usr/bin/env bash
# NodePort from outside benchmark (root), in one run on a lab of its own
# (2 nodes): the lab's world reaches a backend pod on node1
#  - through a node port of node2 in snat mode (the remote-backend path:
#    node2's host program DNATs, source-NATs to node2 and redirects to
#    node1; the reply comes back through node2),
#  - the same in dsr mode (both agents restarted with --bpf-lb-mode=dsr:
#    node2 DNATs and redirects keeping the client's source, the frontend
#    in an IPv4 option on the SYN; node1 gives the replies the frontend as
#    source and sends them straight to the world), against
#  - the same pod routed directly (node1's agent restarted with
#    --enable-masquerade=false --enable-node-port=false, so no host
#    program runs there and the pod's replies keep its address, and the
#    world given a route to node1's pod CIDR),
# alternated ROUNDS times: one iperf3 TCP stream for SECONDS_PER_RUN s to
# the backend, one from it (iperf3 -R: the backend's data is the reply,
# which DSR sends straight from node1), and CONNS (500) new connections
# one after the other (bench/nat/connrate: connect, request, answer,
# close) to the pod's lab workload (TCP 80).
# Prints Markdown for docs/benchmarks.md. LAB names the lab (default
# npbench).
set -euo pipefail
cd "$(dirname "$0")/../.."
LAB=${LAB:-npbench}
SECS=${SECONDS_PER_RUN:-8}
ROUNDS=${ROUNDS:-2}
CONNS=${CONNS:-500}
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
WORLD=$LAB-world
# Each node's agent command line as the lab started it.
for n in node1 node2; do
	cp /proc/$(cut -d' ' -f1 $DIR/pids/agent-$n.pid)/cmdline /tmp/$LAB-argv-$n
done

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

restart_agent() { # NODE [extra agent flags]
	local pid n=$1 pidf=$DIR/pids/agent-$1.pid argv
	shift
	mapfile -d '' argv </tmp/$LAB-argv-$n
	pid=$(cut -d' ' -f1 $pidf)
	kill -9 "$pid" 2>/dev/null || true
	while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	setsid nsenter --net=/run/netns/$LAB-$n "${argv[@]}" "$@" >>$DIR/logs/agent-$n.log 2>&1 </dev/null &
	echo "$! $(awk '{print $22}' /proc/$!/stat)" >$pidf
	for _ in $(seq 200); do
		# Then SETTLE s more: a starting agent's work (syncing, attaching)
		# must not share the CPUs with the measurement.
		bin/tendril -H $DIR/nodes/$n/agent.sock status >/dev/null 2>&1 && sleep "${SETTLE:-3}" && return 0
		sleep 0.1
	done
	echo "agent of $n did not come back" >&2
	exit 1
}
iperf() { # HOST PORT [iperf3 flags: -R for the backend sending]
	$T exec world -- iperf3 -c "$1" -p "$2" -t "$SECS" -J "${@:3}" |
		python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'
}
connrate() { $T exec world -- $PWD/bin/connrate "$@" 2>/dev/null; }
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }
conns() { # connrate flags: its whole line to stderr (failures show), the rate out
	local l
	l=$(connrate "$@")
	echo "  connrate $*: $l" >&2
	echo "$l" | field conn_per_sec_before_failure
}
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
declare -a NP DS DI CN CS CD RN RS RD
for r in $(seq "$ROUNDS"); do
	restart_agent node1
	restart_agent node2
	ip -n $WORLD route del "$CIDR" 2>/dev/null || true
	wait_answer "$NODE2_IP:$NP_HTTP"
	NP+=("$(iperf "$NODE2_IP" "$NP_IPERF")")
	RN+=("$(iperf "$NODE2_IP" "$NP_IPERF" -R)")
	CN+=("$(conns -addr "$NODE2_IP:$NP_HTTP" -n "$CONNS")")
	restart_agent node1 --bpf-lb-mode=dsr
	restart_agent node2 --bpf-lb-mode=dsr
	wait_answer "$NODE2_IP:$NP_HTTP"
	DS+=("$(iperf "$NODE2_IP" "$NP_IPERF")")
	RS+=("$(iperf "$NODE2_IP" "$NP_IPERF" -R)")
	CS+=("$(conns -addr "$NODE2_IP:$NP_HTTP" -n "$CONNS")")
	restart_agent node1 --enable-masquerade=false --enable-node-port=false
	ip -n $WORLD route replace "$CIDR" via "$NODE_IP"
	wait_answer "$POD_IP:80"
	DI+=("$(iperf "$POD_IP" 5201)")
	RD+=("$(iperf "$POD_IP" 5201 -R)")
	CD+=("$(conns -addr "$POD_IP:80" -n "$CONNS")")
	echo "round $r: snat ${NP[-1]}/${RN[-1]} Gbit/s ${CN[-1]} conn/s; dsr ${DS[-1]}/${RS[-1]} Gbit/s ${CS[-1]} conn/s; direct ${DI[-1]}/${RD[-1]} Gbit/s ${CD[-1]} conn/s (to/from the backend)" >&2
done
ip -n $WORLD route del "$CIDR" 2>/dev/null || true

ratio() { python3 -c "print('%.2f' % (${1:-0}/max(${2:-1},1e-9)))"; }
echo
echo "World → NodePort of node2 (backend on node1) in snat and dsr mode, and the backend routed directly: one TCP stream to the backend (world sends), one from it (iperf3 -R, the backend sends: its data is the reply DSR sends straight from node1), new connections per second."
echo
echo "| round | to backend, Gbit/s: snat | dsr | direct | from backend (-R), Gbit/s: snat | dsr | direct | conn/s: snat | dsr | direct | ratios to direct, snat / dsr: to | from | conn/s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for i in "${!NP[@]}"; do
	echo "| $((i + 1)) | ${NP[$i]} | ${DS[$i]} | ${DI[$i]} | ${RN[$i]} | ${RS[$i]} | ${RD[$i]} | ${CN[$i]} | ${CS[$i]} | ${CD[$i]} | $(ratio "${NP[$i]}" "${DI[$i]}") / $(ratio "${DS[$i]}" "${DI[$i]}") | $(ratio "${RN[$i]}" "${RD[$i]}") / $(ratio "${RS[$i]}" "${RD[$i]}") | $(ratio "${CN[$i]}" "${CD[$i]}") / $(ratio "${CS[$i]}" "${CD[$i]}") |"
done
