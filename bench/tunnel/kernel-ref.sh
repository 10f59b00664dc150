#!/usr/bin/env bash
# The machine's floor for the tunnel's throughput, without Tendril: the
# lab's path rebuilt from plain kernel parts (no eBPF), pod -> node ->
# bridge -> node -> pod, each a network namespace joined by veth pairs as
# the lab joins them, and routed either natively (each node routes the
# other's pod range via the other node's bridge address) or through the
# kernel's own VXLAN devices (a fixed remote, the pods' MTU 50 bytes
# smaller, as the lab's tunnel mode). What the kernel's VXLAN costs on
# veths, against native routing on the same namespaces, is the ratio no
# eBPF datapath on this machine can beat: bench/tunnel/run.sh measures it
# beside the lab's, round by round.
#
#   bench/tunnel/kernel-ref.sh up
#   bench/tunnel/kernel-ref.sh gbps native|vxlan SECONDS   # one iperf3 stream, Gbit/s
#   bench/tunnel/kernel-ref.sh down
set -euo pipefail
P=tdrkref
ns() { ip netns exec "$P-$1" "${@:2}"; }

up() {
	down 2>/dev/null || true
	for n in poda nodea br nodeb podb; do ip netns add "$P-$n"; done
	# veth pairs: pod<->node, node<->bridge.
	ip link add eth0 netns "$P-poda" type veth peer name pod netns "$P-nodea"
	ip link add eth0 netns "$P-podb" type veth peer name pod netns "$P-nodeb"
	ip link add eth1 netns "$P-nodea" type veth peer name tonodea netns "$P-br"
	ip link add eth1 netns "$P-nodeb" type veth peer name tonodeb netns "$P-br"
	ns br ip link add br0 type bridge
	for l in tonodea tonodeb; do ns br ip link set dev "$l" master br0 up; done
	ns br ip link set br0 up
	for n in poda nodea br nodeb podb; do ns "$n" ip link set lo up; done
	ns poda ip addr add 10.231.1.2/24 dev eth0
	ns podb ip addr add 10.231.2.2/24 dev eth0
	ns nodea ip addr add 10.231.1.1/24 dev pod
	ns nodeb ip addr add 10.231.2.1/24 dev pod
	ns nodea ip addr add 172.31.231.1/24 dev eth1
	ns nodeb ip addr add 172.31.231.2/24 dev eth1
	for n in poda podb; do ns "$n" ip link set eth0 up; done
	for n in nodea nodeb; do
		ns "$n" ip link set pod up
		ns "$n" ip link set eth1 up
		ns "$n" sysctl -qw net.ipv4.ip_forward=1
	done
	ns poda ip route add default via 10.231.1.1
	ns podb ip route add default via 10.231.2.1
	# The kernel's VXLAN devices (the lab's port, 8472), unused until
	# `route vxlan`.
	ns nodea ip link add vxlan0 type vxlan id 2 remote 172.31.231.2 local 172.31.231.1 dstport 8472 dev eth1
	ns nodeb ip link add vxlan0 type vxlan id 2 remote 172.31.231.1 local 172.31.231.2 dstport 8472 dev eth1
	ns nodea ip addr add 10.231.0.1/24 dev vxlan0
	ns nodeb ip addr add 10.231.0.2/24 dev vxlan0
	for n in nodea nodeb; do ns "$n" ip link set vxlan0 up; done
}

# route native|vxlan: the pod ranges' routes (and the pods' MTU) of the
# mode.
route() {
	local mtu=1500
	if [ "$1" = vxlan ]; then
		mtu=1450
		ns nodea ip route replace 10.231.2.0/24 via 10.231.0.2 dev vxlan0
		ns nodeb ip route replace 10.231.1.0/24 via 10.231.0.1 dev vxlan0
	else
		ns nodea ip route replace 10.231.2.0/24 via 172.31.231.2 dev eth1
		ns nodeb ip route replace 10.231.1.0/24 via 172.31.231.1 dev eth1
	fi
	for n in poda podb; do ns "$n" ip link set eth0 mtu "$mtu"; done
}

gbps() {
	route "$1"
	ns podb iperf3 -s -1 >/dev/null 2>&1 &
	local srv=$!
	sleep 0.5
	ns poda iperf3 -c 10.231.2.2 -t "$2" -J | jq '.end.sum_received.bits_per_second / 1e9'
	wait $srv || true
}

down() {
	for n in poda nodea br nodeb podb; do ip netns del "$P-$n" 2>/dev/null || true; done
}

case "${1:-}" in
up) up ;;
gbps) gbps "$2" "$3" ;;
down) down ;;
*)
	echo "usage: $0 up | gbps native|vxlan SECONDS | down" >&2
	exit 2
	;;
esac
