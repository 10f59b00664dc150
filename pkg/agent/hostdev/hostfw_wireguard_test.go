package hostdev

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// The host firewall on the WireGuard device (from_wireguard at its
// ingress, to_wireguard at its egress): what the device delivers is an IP
// packet without link-layer header, so the frames here are the node port
// tests' frames without their Ethernet header (l3), run with
// BPF_PROG_TEST_RUN, and written into a real TUN device in the last test.

// l3 strips the Ethernet header off a test frame: what a TUN device
// carries.
func l3(frame []byte) []byte { return frame[14:] }

func (n *masqNode) fromWireGuard(packet []byte) uint32 {
	n.t.Helper()
	ret, _ := n.run(n.h.fromWG, n.uplink, packet)
	return ret
}

func (n *masqNode) toWireGuard(packet []byte) uint32 {
	n.t.Helper()
	ret, _ := n.run(n.h.toWG, n.uplink, packet)
	return ret
}

// TestPrivilegedHostFirewallFromWireGuard: a host policy that enforces
// ingress and admits the peer pods on TCP 8443 (and UDP 5353) only: a
// peer pod's packet to the node through the device on another port is
// dropped with the policy drop reason (counted), on the allowed port it
// passes and its flow is tracked with the host's conntrack marker; the
// flow's next packet passes; the node's own connection through the
// device (to_wireguard) gets its reply in, the same packet unsolicited
// does not. A packet to a local pod is not the host's. IPv4 and IPv6. With
// the host firewall off everything passes.
func TestPrivilegedHostFirewallFromWireGuard(t *testing.T) {
	n := newNodePortNode(t)
	setHostFirewall(t, n, maps.FlagEnforceIngress)
	hostPolicy(t, n, maps.DirIngress, idPeerPod, protoTCP, 8443, maps.PolicyValue{Cookie: hostRuleAllow})
	hostPolicy(t, n, maps.DirIngress, idPeerPod, protoUDP, 5353, maps.PolicyValue{Cookie: hostRuleAllow})

	// A loop, not subtests: the test node is this goroutine's locked
	// thread's network namespace.
	for _, f := range []ipFamily{famV4, famV6} {
		name := "IPv4"
		if f.node.Is6() {
			name = "IPv6"
		}
		denied := n.metric(maps.ReasonPolicyDenied, maps.DirIngress)
		if ret := n.fromWireGuard(l3(f.frame(f.peerPod, f.node, protoTCP, 40000, 22, 0))); ret != tcActShot {
			t.Fatalf("%s: peer pod to the node's TCP 22 through the device (not allowed): verdict %d, want drop", name, ret)
		}
		if got := n.metric(maps.ReasonPolicyDenied, maps.DirIngress); got != denied+1 {
			t.Fatalf("%s: policy drops %d, want %d", name, got, denied+1)
		}
		if ret := n.fromWireGuard(l3(f.frame(f.peerPod, f.node, protoUDP, 40000, 5354, 0))); ret != tcActShot {
			t.Fatalf("%s: peer pod to the node's UDP 5354 (not allowed): verdict %d, want drop", name, ret)
		}
		if ret := n.fromWireGuard(l3(f.frame(f.peerPod, f.node, protoTCP, 40001, 8443, 0))); ret != 0 {
			t.Fatalf("%s: peer pod to the node's allowed TCP 8443: verdict %d, want pass", name, ret)
		}
		ct := maps.CTEntry{Proto: protoTCP, Src: f.peerPod, SrcPort: 40001, Dst: f.node, DstPort: 8443}
		if _, ok, err := n.l.Maps().CTMap().Lookup(ct); err != nil || !ok {
			t.Fatalf("%s: no conntrack entry for the admitted flow %s -> %s (%v)", name, ap(f.peerPod, 40001), ap(f.node, 8443), err)
		}
		if ret := n.fromWireGuard(l3(f.frame(f.peerPod, f.node, protoTCP, 40001, 8443, 0))); ret != 0 {
			t.Fatalf("%s: the admitted flow's next packet: verdict %d, want pass", name, ret)
		}
		if ret := n.fromWireGuard(l3(f.frame(f.peerPod, f.node, protoUDP, 40002, 5353, 0))); ret != 0 {
			t.Fatalf("%s: peer pod to the node's allowed UDP 5353: verdict %d, want pass", name, ret)
		}

		// The node's own connection through the device: its reply
		// passes, the same packet without the connection does not.
		if ret := n.fromWireGuard(l3(f.frame(f.peerPod, f.node, protoTCP, 443, 50000, 0))); ret != tcActShot {
			t.Fatalf("%s: unsolicited packet from a peer pod's port 443: verdict %d, want drop", name, ret)
		}
		if ret := n.toWireGuard(l3(f.frame(f.node, f.peerPod, protoTCP, 50001, 443, 0))); ret != 0 {
			t.Fatalf("%s: the node's own packet into the device (egress not enforced): verdict %d", name, ret)
		}
		if ret := n.fromWireGuard(l3(f.frame(f.peerPod, f.node, protoTCP, 443, 50001, 0))); ret != 0 {
			t.Fatalf("%s: reply to the node's own connection through the device: verdict %d, want pass", name, ret)
		}

		// A packet for a local pod: the pod's policy decides it.
		if ret := n.fromWireGuard(l3(f.frame(f.peerPod, f.pod, protoTCP, 40003, 22, 0))); ret != 0 {
			t.Fatalf("%s: peer pod to a local pod through the device: verdict %d, want pass", name, ret)
		}
		if got := n.metric(maps.ReasonPolicyDenied, maps.DirIngress); got != denied+3 {
			t.Fatalf("%s: policy drops %d, want %d", name, got, denied+3)
		}
	}

	// Other protocols: by their peer alone (no L3 allow here), ICMP
	// errors and later fragments unchecked, a packet of no IP version
	// left to the stack.
	for _, tc := range []struct {
		what string
		ret  uint32
		p    []byte
	}{
		{"GRE from a peer pod (no L3 allow)", tcActShot, l3(frame(peerPod, node, protoGRE, 0, 0, 0))},
		{"ICMP echo request from a peer pod (no ICMP allow)", tcActShot, l3(frame(peerPod, node, protoICMP, 7, 0, 8))},
		{"a later fragment from a peer pod", 0, l3(laterFragment(frame(peerPod, node, protoUDP, 40000, 9999, 0)))},
		{"no IP version", 0, append([]byte{0x00}, l3(frame(peerPod, node, protoTCP, 40000, 22, 0))[1:]...)},
	} {
		if ret := n.fromWireGuard(tc.p); ret != tc.ret {
			t.Errorf("%s: verdict %d, want %d", tc.what, ret, tc.ret)
		}
	}

	// Off: nothing is checked.
	setHostFirewall(t, n, 0)
	if ret := n.fromWireGuard(l3(frame(peerPod, node, protoTCP, 40010, 22, 0))); ret != 0 {
		t.Fatalf("host firewall off: verdict %d", ret)
	}
}

// TestPrivilegedHostFirewallToWireGuard: egress enforced, allowing TCP 53
// only: the node's packet into the device to another port is dropped
// (counted as an egress policy drop), to TCP 53 it passes; the node's
// reply to a connection its ingress admitted through the device passes;
// a pod's packet into the device is not the host's.
func TestPrivilegedHostFirewallToWireGuard(t *testing.T) {
	n := newNodePortNode(t)
	setHostFirewall(t, n, maps.FlagEnforceEgress)
	hostPolicy(t, n, maps.DirEgress, 0, protoTCP, 53, maps.PolicyValue{Cookie: hostRuleAllow})

	if ret := n.toWireGuard(l3(frame(node, peerPod, protoTCP, 50000, 443, 0))); ret != tcActShot {
		t.Fatalf("node to a port its egress policy does not allow, through the device: verdict %d, want drop", ret)
	}
	if got := n.metric(maps.ReasonPolicyDenied, maps.DirEgress); got != 1 {
		t.Fatalf("egress policy drops %d, want 1", got)
	}
	if ret := n.toWireGuard(l3(frame(node, peerPod, protoTCP, 50001, 53, 0))); ret != 0 {
		t.Fatalf("node to an allowed port through the device: verdict %d", ret)
	}
	if ret := n.toWireGuard(l3(frame6(node6, peerPod6, protoTCP, 50002, 443, 0))); ret != tcActShot {
		t.Fatalf("IPv6: node to a port its egress policy does not allow: verdict %d, want drop", ret)
	}
	// Ingress not enforced, but tracked: the reply leaves.
	if ret := n.fromWireGuard(l3(frame(peerPod, node, protoTCP, 40000, 22, 0))); ret != 0 {
		t.Fatalf("peer pod to the node (ingress not enforced): verdict %d", ret)
	}
	if ret := n.toWireGuard(l3(frame(node, peerPod, protoTCP, 22, 40000, 0))); ret != 0 {
		t.Fatalf("the node's reply to an admitted connection: verdict %d, want pass", ret)
	}
	if ret := n.toWireGuard(l3(frame(pod, peerPod, protoTCP, 41000, 443, 0))); ret != 0 {
		t.Fatalf("a pod's packet into the device under host egress policy: verdict %d, want pass", ret)
	}
	if got := n.metric(maps.ReasonPolicyDenied, maps.DirEgress); got != 2 {
		t.Fatalf("egress policy drops %d, want 2", got)
	}
}

// TestPrivilegedHostFirewallOnWireGuardDevice: the same on a real TUN
// device (the userspace WireGuard's kind), its programs attached by
// AttachWireGuard, in both attach modes (TCX links, tc filters): a peer
// pod's UDP datagram written into the device, as the device delivers it
// decrypted, to a node port the host policy does not allow is dropped
// (the policy drop counter moves, the host socket on that port gets
// nothing of it); to the allowed port it reaches the host socket. Both
// attachments (ingress and egress) are in place and attaching again
// changes nothing.
func TestPrivilegedHostFirewallOnWireGuardDevice(t *testing.T) {
	n := newNodePortNode(t)
	setHostFirewall(t, n, maps.FlagEnforceIngress)
	hostPolicy(t, n, maps.DirIngress, idPeerPod, protoUDP, 5555, maps.PolicyValue{Cookie: hostRuleAllow})
	listen := func(port uint16) *net.UDPConn {
		s, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(node, port)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	allowed, denied := listen(5555), listen(5556)

	// A loop, not subtests: the test node is this goroutine's locked
	// thread's network namespace.
	for i, mode := range []loader.AttachMode{loader.AttachTCX, loader.AttachTC} {
		h := n.h
		if mode == loader.AttachTC {
			var err error
			h, err = Load(Options{BPFRoot: n.root, AttachMode: mode, PortMin: 61000, PortMax: 61009, Maps: n.l.MapReplacements()}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(h.Close)
		}
		tun, tunIf := openTUN(t, fmt.Sprintf("tdrwg%d", i))
		if attached, err := h.AttachWireGuard(tunIf); err != nil || !attached {
			t.Fatalf("%s: AttachWireGuard(%d) = %v, %v; want attached", mode, tunIf, attached, err)
		}
		if attached, err := h.AttachWireGuard(tunIf); err != nil || attached {
			t.Fatalf("%s: AttachWireGuard(%d) again = %v, %v; want left as it is", mode, tunIf, attached, err)
		}
		for _, dir := range wireGuardDirections {
			_, link := h.links[attachmentName(tunIf, dir)]
			if mode == loader.AttachTC {
				link = h.holdsFilter(tunIf, dir)
			}
			if !link {
				t.Fatalf("%s: no %s attachment on the device", mode, dir)
			}
		}

		// Denied: written until the drop is counted (a device just
		// created can lose its first packet, see checkWireGuardReply).
		drops := n.metric(maps.ReasonPolicyDenied, maps.DirIngress)
		for deadline := time.Now().Add(10 * time.Second); n.metric(maps.ReasonPolicyDenied, maps.DirIngress) == drops; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: a datagram to a port the host policy does not allow, written into the device, was never counted as a policy drop", mode)
			}
			if _, err := tun.Write(l3(frame(peerPod, node, protoUDP, 40000, 5556, 0))); err != nil {
				t.Fatalf("write to the TUN device: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}

		// Allowed: reaches the host socket.
		buf := make([]byte, 100)
		var got bool
		for deadline := time.Now().Add(10 * time.Second); !got && time.Now().Before(deadline); {
			if _, err := tun.Write(l3(frame(peerPod, node, protoUDP, 40001, 5555, 0))); err != nil {
				t.Fatalf("write to the TUN device: %v", err)
			}
			_ = allowed.SetReadDeadline(time.Now().Add(time.Second))
			if _, from, err := allowed.ReadFromUDPAddrPort(buf); err == nil {
				if from != ap(peerPod, 40001) {
					t.Fatalf("%s: allowed port's socket got a datagram from %s, want %s", mode, from, ap(peerPod, 40001))
				}
				got = true
			}
		}
		if !got {
			t.Fatalf("%s: a datagram to the allowed port, written into the device, never reached the host socket", mode)
		}
		// By now the denied datagrams, written before, would have been
		// delivered had they passed.
		_ = denied.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, from, err := denied.ReadFromUDPAddrPort(buf); err == nil {
			t.Fatalf("%s: the denied port's socket got a datagram from %s", mode, from)
		}
	}
}

// TestPrivilegedNodePortICMPErrorFromWireGuard: with node encryption the
// remote backend's node sends its ICMP error about a NodePort flow node1
// sent on (from node1's address and a masquerade port) to node1's address
// through the WireGuard device. from_wireguard sends it back to the
// client as from_netdev does on the underlay: from the frontend, quoting
// the client's packet to the frontend, every checksum right, counted;
// IPv4 and IPv6. An error about no mapping passes unchanged to the host.
func TestPrivilegedNodePortICMPErrorFromWireGuard(t *testing.T) {
	n := newNodePort6Node(t)

	ret, fwd := n.ingress(frame(client, node, protoUDP, 40000, npRemote, 0))
	if ret != 7 {
		t.Fatalf("IPv4 to the remote backend: verdict %d", ret)
	}
	ret, got := n.run(n.h.fromWG, n.uplink, l3(icmpError(peerPod, node, fwd)))
	if ret != 7 {
		t.Fatalf("IPv4 error about the remote backend's flow through the device: verdict %d, want redirect to the client", ret)
	}
	checkICMPError(t, "IPv4 error to the client", got, node, client, ap(client, 40000), ap(node, npRemote))

	ret, fwd = n.ingress(frame6(client6, node6, protoUDP, 40000, npRemote, 0))
	if ret != 7 {
		t.Fatalf("IPv6 to the remote backend: verdict %d", ret)
	}
	ret, got = n.run(n.h.fromWG, n.uplink, l3(icmpError6(peerPod6, node6, 1, fwd)))
	if ret != 7 {
		t.Fatalf("IPv6 error about the remote backend's flow through the device: verdict %d, want redirect to the client", ret)
	}
	checkICMPError(t, "IPv6 error to the client", got, node6, client6, ap(client6, 40000), ap(node6, npRemote))
	if got := n.metric(maps.ReasonNodeportICMPError, maps.DirIngress); got != 2 {
		t.Fatalf("service ICMP errors counted %d, want 2", got)
	}

	// An error about a flow of no service: untouched, to the host.
	e := l3(icmpError(peerPod, node, frame(node, peerPod, protoUDP, 30999, 40000, 0)))
	if ret, g := n.run(n.h.fromWG, n.uplink, e); ret != 0 || !bytes.Equal(g, e) {
		t.Fatalf("error about no service flow: verdict %d, changed %v", ret, !bytes.Equal(g, e))
	}
}
