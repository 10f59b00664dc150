#!/usr/bin/env bash
# Pod-to-pod TCP throughput across nodes, native routing in the clear
# against native routing encrypted with WireGuard (--encryption wireguard;
# on a kernel without the WireGuard module, the USERSPACE implementation in
# its own process per node), in the same run: two labs of two nodes side by
# side, one iperf3 stream from pod-1 (node1) to pod-2 (node2) in each, the
# two alternating round by round so that a noisy neighbour hits both. Also
# the CPU seconds the two WireGuard device processes used per round, and new
# connections per second pod-1 -> pod-2 (bench/nat/connrate: connect, send a
# line, read the answer, close; one after the other). Needs root, iperf3,
# jq, bc. Prints each round and the medians with the ratios.
#
#   bench/wireguard/run.sh                 # 5 rounds of 5 s
#   ROUNDS=9 SECONDS_PER_ROUND=10 bench/wireguard/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
SECS=${SECONDS_PER_ROUND:-5}
BIN=${BIN:-bin}
CONNS=${CONNS:-400}
[ -n "${SKIP_BUILD:-}" ] || make -s build k8s-binaries >/dev/null
go build -o "$BIN/connrate" ./bench/nat/connrate
T=$BIN/tendril
CLEAR=wgbclr
WG=wgbenc
trap '$T lab --name $CLEAR down >/dev/null 2>&1 || true; $T lab --name $WG down >/dev/null 2>&1 || true' EXIT
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"
$T lab --name $CLEAR up --nodes 2 --pods-per-node 1 --bin-dir "$BIN" >/tmp/tendril-wgbench-clear.log 2>&1 ||
	{ cat /tmp/tendril-wgbench-clear.log; exit 1; }
$T lab --name $WG up --nodes 2 --pods-per-node 1 --encryption wireguard --bin-dir "$BIN" >/tmp/tendril-wgbench-wg.log 2>&1 ||
	{ cat /tmp/tendril-wgbench-wg.log; exit 1; }

pod_ip() { $T lab --name "$1" exec "default/$2" -- ip -4 -o addr show dev eth0 | awk '{sub("/.*", "", $4); print $4}'; }

# device_cpu: CPU seconds (user+system) of the WG lab's device processes.
device_cpu() {
	local ticks=0 pid
	for pid in $(pgrep -f "wireguard-device --name wg[0-9]-$WG" || true); do
		ticks=$((ticks + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
	done
	echo "$ticks / $(getconf CLK_TCK)" | bc -l
}

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

# cps LAB: new TCP connections per second pod-1 -> pod-2:80, CONNS of them.
cps() {
	local lab=$1 ip
	ip=$(pod_ip "$lab" pod-2)
	$T lab --name "$lab" exec default/pod-1 -- "$PWD/$BIN/connrate" -addr "$ip:80" -n "$CONNS" -timeout 2s 2>/dev/null |
		sed -n 's/.*conn_per_sec_before_failure=\([0-9.]*\).*/\1/p'
}

clr=()
enc=()
cclr=()
cenc=()
for round in $(seq "$ROUNDS"); do
	c=$(gbps $CLEAR)
	before=$(device_cpu)
	e=$(gbps $WG)
	cpu=$(echo "$(device_cpu) - $before" | bc -l)
	printf 'round %d: clear %.2f Gbit/s, wireguard (userspace) %.2f Gbit/s, device processes %.1f CPU s in %d s\n' \
		"$round" "$c" "$e" "$cpu" "$SECS"
	clr+=("$c")
	enc+=("$e")
	cc=$(cps $CLEAR)
	ce=$(cps $WG)
	printf 'round %d: clear %s conn/s, wireguard (userspace) %s conn/s\n' "$round" "$cc" "$ce"
	cclr+=("$cc")
	cenc+=("$ce")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mc=$(median "${clr[@]}")
me=$(median "${enc[@]}")
printf 'pod-to-pod TCP across nodes, 1 stream, %d rounds of %d s: clear median %.2f Gbit/s, wireguard (userspace) median %.2f Gbit/s, ratio %.2f\n' \
	"$ROUNDS" "$SECS" "$mc" "$me" "$(echo "$me / $mc" | bc -l)"
mcc=$(median "${cclr[@]}")
mce=$(median "${cenc[@]}")
printf 'pod-to-pod new TCP connections across nodes, %d per round, %d rounds: clear median %.0f conn/s, wireguard (userspace) median %.0f conn/s, ratio %.2f\n' \
	"$CONNS" "$ROUNDS" "$mcc" "$mce" "$(echo "$mce / $mcc" | bc -l)"
