#!/usr/bin/env bash
# Pod-to-pod TCP throughput across nodes, native routing against the tunnel
# routing mode (VXLAN), in the same run: two labs of two nodes side by side
# (one per mode, names of their own), one iperf3 stream from pod-1 (node1)
# to pod-2 (node2) in each, the modes alternating round by round so that a
# noisy neighbour hits both. Needs root and iperf3. Prints each round and
# the median per mode with the tunnel/native ratio, and new TCP
# connections per second in each (bench/nat/connrate). Each round also runs
# the machine's floor (kernel-ref.sh): the same path of namespaces and
# veths without Tendril, routed natively and through the kernel's own
# VXLAN devices, whose vxlan/native ratio no eBPF datapath on this machine
# can beat.
#
#   bench/tunnel/run.sh                 # 5 rounds of 5 s
#   ROUNDS=9 SECONDS_PER_ROUND=10 bench/tunnel/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
SECS=${SECONDS_PER_ROUND:-5}
BIN=${BIN:-bin}
CONNS=${CONNS:-400}
[ -n "${SKIP_BUILD:-}" ] || make -s build k8s-binaries >/dev/null
go build -o "$BIN/connrate" ./bench/nat/connrate
T=$BIN/tendril
NATIVE=tunbnat
TUNNEL=tunbtun
REF=bench/tunnel/kernel-ref.sh
trap '$T lab --name $NATIVE down >/dev/null 2>&1 || true; $T lab --name $TUNNEL down >/dev/null 2>&1 || true; $REF down' EXIT
$REF up
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"
$T lab --name $NATIVE up --nodes 2 --pods-per-node 1 --bin-dir "$BIN" >/tmp/tendril-tunbench-native.log 2>&1 ||
	{ cat /tmp/tendril-tunbench-native.log; exit 1; }
$T lab --name $TUNNEL up --nodes 2 --pods-per-node 1 --routing-mode tunnel --bin-dir "$BIN" >/tmp/tendril-tunbench-tunnel.log 2>&1 ||
	{ cat /tmp/tendril-tunbench-tunnel.log; exit 1; }

# pod_ip LAB POD: the pod's IPv4 address.
pod_ip() { $T lab --name "$1" exec "default/$2" -- ip -4 -o addr show dev eth0 | awk '{sub("/.*", "", $4); print $4}'; }

# gbps LAB: one iperf3 TCP stream pod-1 -> pod-2 for SECS seconds, in Gbit/s.
gbps() {
	local lab=$1 ip
	ip=$(pod_ip "$lab" pod-2)
	$T lab --name "$lab" exec default/pod-2 -- iperf3 -s -1 >/dev/null 2>&1 &
	local srv=$!
	sleep 0.5
	$T lab --name "$lab" exec default/pod-1 -- iperf3 -c "$ip" -t "$SECS" -J |
		jq '.end.sum_received.bits_per_second / 1e9'
	wait $srv || true
}

# cps LAB: new TCP connections per second pod-1 -> pod-2:80 (the lab
# workload's port; bench/nat/connrate: connect, send, read the answer,
# close), CONNS of them.
cps() {
	local lab=$1 ip
	ip=$(pod_ip "$lab" pod-2)
	$T lab --name "$lab" exec default/pod-1 -- "$PWD/$BIN/connrate" -addr "$ip:80" -n "$CONNS" -timeout 2s 2>/dev/null |
		sed -n 's/.*conn_per_sec_before_failure=\([0-9.]*\).*/\1/p'
}

for lab in $NATIVE $TUNNEL; do
	echo "# $lab: pod-1 $(pod_ip $lab pod-1), pod-2 $(pod_ip $lab pod-2)"
done
nat=()
tun=()
knat=()
kvx=()
cnat=()
ctun=()
for round in $(seq "$ROUNDS"); do
	n=$(gbps $NATIVE)
	u=$(gbps $TUNNEL)
	kn=$($REF gbps native "$SECS")
	kv=$($REF gbps vxlan "$SECS")
	cn=$(cps $NATIVE)
	cu=$(cps $TUNNEL)
	printf 'round %d: native %.2f Gbit/s %.0f conn/s, tunnel (vxlan) %.2f Gbit/s %.0f conn/s; kernel only: native %.2f, vxlan %.2f Gbit/s\n' \
		"$round" "$n" "$cn" "$u" "$cu" "$kn" "$kv"
	cnat+=("$cn")
	ctun+=("$cu")
	nat+=("$n")
	tun+=("$u")
	knat+=("$kn")
	kvx+=("$kv")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mn=$(median "${nat[@]}")
mu=$(median "${tun[@]}")
mkn=$(median "${knat[@]}")
mkv=$(median "${kvx[@]}")
printf 'pod-to-pod TCP across nodes, 1 stream, %d rounds of %d s: native median %.2f Gbit/s, tunnel median %.2f Gbit/s, tunnel/native %.2f\n' \
	"$ROUNDS" "$SECS" "$mn" "$mu" "$(echo "$mu / $mn" | bc -l)"
mcn=$(median "${cnat[@]}")
mcu=$(median "${ctun[@]}")
printf 'new TCP connections pod to pod across nodes, %d a round: native median %.0f conn/s, tunnel median %.0f conn/s, tunnel/native %.2f\n' \
	"$CONNS" "$mcn" "$mcu" "$(echo "$mcu / $mcn" | bc -l)"
printf 'the floor, kernel only (no eBPF, same namespaces and veths): native median %.2f Gbit/s, vxlan median %.2f Gbit/s, vxlan/native %.2f\n' \
	"$mkn" "$mkv" "$(echo "$mkv / $mkn" | bc -l)"
