package hostdev

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil/rawcap"
)

// from_wireguard on a real TUN device, the kind of device the userspace
// WireGuard delivers decrypted packets from: a test writes into the TUN
// device what the WireGuard device would deliver (an IP packet, no
// link-layer header), the kernel runs the device's ingress, and a capture
// on the uplink's other end sees what leaves.

// gatewayMAC is the MAC of the test node's default gateway (a permanent
// neighbour): a reply to the outside client leaves with it.
var gatewayMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}

// openTUN creates the TUN device name (IFF_TUN, no packet information:
// the userspace WireGuard's kind) in the caller's network namespace, up.
// Closing the file, at the test's end, deletes it.
func openTUN(t *testing.T, name string) (*os.File, int) {
	t.Helper()
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open /dev/net/tun: %v", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		t.Fatal(err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		t.Fatalf("TUNSETIFF %s: %v", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	t.Cleanup(func() { f.Close() })
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	return f, l.Attrs().Index
}

// captureFrames collects the frames arriving at device dev (of the
// caller's network namespace) until the test ends; the returned function
// gives those seen so far.
func captureFrames(t *testing.T, dev string) func() [][]byte {
	t.Helper()
	c, err := rawcap.Start(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	return c.Frames
}

// checkWireGuardReply is TestPrivilegedNodePortReplyFromWireGuard of family
// f on node n (gateway: its default route's next hop).
func checkWireGuardReply(t *testing.T, n *masqNode, f ipFamily, gateway netip.Addr) {
	fam := netlink.FAMILY_V4
	if f.node.Is6() {
		fam = netlink.FAMILY_V6
	}
	if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: n.uplink, Family: fam, State: netlink.NUD_PERMANENT,
		IP: gateway.AsSlice(), HardwareAddr: gatewayMAC}); err != nil {
		t.Fatal(err)
	}
	tun, tunIf := openTUN(t, "tdrwg0")
	if attached, err := n.h.AttachWireGuard(tunIf); err != nil || !attached {
		t.Fatalf("AttachWireGuard(%d) = %v, %v; want attached", tunIf, attached, err)
	}
	if attached, err := n.h.AttachWireGuard(tunIf); err != nil || attached {
		t.Fatalf("AttachWireGuard(%d) again = %v, %v; want left as it is", tunIf, attached, err)
	}
	// A host socket on the node's address: what the device delivers
	// that no mapping names reaches it as it came.
	sock, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(f.node, 5555)))
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()

	written := 0
	for _, proto := range []uint8{protoTCP, protoUDP} {
		// The client's request, through from_netdev on the uplink: the
		// mapping to the backend on the other node.
		ret, out := n.ingress(f.frame(f.client, f.node, proto, 40000, npRemote, 0))
		if ret != 7 {
			t.Fatalf("proto %d request: verdict %d, want redirect", proto, ret)
		}
		src, _ := f.tuple(out)
		seen := captureFrames(t, "tdrupp0")
		// The backend's reply, as the WireGuard device delivers it
		// (node encryption on the backend's node).
		reply := f.frame(f.peerPod, f.node, proto, backendPort, src.Port(), 0)[14:]
		if _, err := tun.Write(reply); err != nil {
			t.Fatalf("write to the TUN device: %v", err)
		}
		var got []byte
		writes := 1
		for deadline, next := time.Now().Add(10*time.Second), time.Now().Add(time.Second); got == nil && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			if time.Now().After(next) {
				// As a retransmission would: the first packet a
				// device just created receives can be lost.
				if _, err := tun.Write(reply); err != nil {
					t.Fatalf("write to the TUN device: %v", err)
				}
				writes++
				next = time.Now().Add(time.Second)
			}
			for _, fr := range seen() {
				if len(fr) < 60 {
					continue
				}
				if et := binary.BigEndian.Uint16(fr[12:]); et == 0x0800 || et == 0x86dd {
					if s, d := f.tuple(fr); s == ap(f.node, npRemote) && d == ap(f.client, 40000) {
						got = fr
					}
				}
			}
		}
		if got == nil {
			t.Logf("frames seen: %x", seen())
			for r := range 32 { // REASON_MAX
				for d := range 2 {
					if c := n.metric(uint8(r), uint8(d)); c != 0 {
						t.Logf("metric reason %d dir %d: %d", r, d, c)
					}
				}
			}
			t.Fatalf("proto %d: the backend's reply from the WireGuard device never left the uplink as %s -> %s",
				proto, ap(f.node, npRemote), ap(f.client, 40000))
		}
		t.Logf("proto %d: the reply left the uplink translated after %d write(s)", proto, writes)
		written += writes
		if !bytes.Equal(got[0:6], gatewayMAC) {
			t.Errorf("proto %d: reply's destination MAC %x, want the gateway's %s", proto, got[0:6], gatewayMAC)
		}
		f.checkSums(t, "reply from the WireGuard device", got)
	}
	// A reply written again may have its first copy translated late.
	if got := n.metric(maps.ReasonNodeportReply, maps.DirEgress); got < 2 || got > uint64(written) {
		t.Fatalf("replies translated %d, want 2 to %d (the replies written)", got, written)
	}

	// A packet of no mapping (a pod's answer to this node's host, say)
	// passes unchanged to the host.
	plain := f.frame(f.peerPod, f.node, protoUDP, 40001, 5555, 0)[14:]
	if _, err := tun.Write(plain); err != nil {
		t.Fatal(err)
	}
	_ = sock.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 100)
	nr, from, err := sock.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("host socket: %v (the device's unmapped packet did not reach it)", err)
	}
	// The datagram's payload, after the IP and UDP headers.
	payload := plain[20+8 : 20+8+4]
	if f.node.Is6() {
		payload = plain[40+8 : 40+8+4]
	}
	if want := payload; from != ap(f.peerPod, 40001) || !bytes.Equal(buf[:nr], want) {
		t.Fatalf("host socket got %q from %s, want %q from %s", buf[:nr], from, want, ap(f.peerPod, 40001))
	}
}

// TestPrivilegedNodePortReplyFromWireGuard: with node encryption a remote
// backend's reply to a NodePort client this node masqueraded arrives
// decrypted on the WireGuard device, not on the uplink. from_wireguard at
// the device's ingress (a TUN device, as the userspace WireGuard's) gives
// it the client as destination and the node port as source and sends it
// out of the uplink to the gateway, TCP and UDP, checksums right; a
// packet no mapping names reaches a host socket unchanged. Attaching is
// idempotent.
func TestPrivilegedNodePortReplyFromWireGuard(t *testing.T) {
	checkWireGuardReply(t, newNodePortNode(t), famV4, netip.MustParseAddr("172.30.0.1"))
}

// TestPrivilegedNodePortIPv6ReplyFromWireGuard is the same over IPv6.
func TestPrivilegedNodePortIPv6ReplyFromWireGuard(t *testing.T) {
	checkWireGuardReply(t, newNodePort6Node(t), famV6, netip.MustParseAddr("fd00:ff::1"))
}
