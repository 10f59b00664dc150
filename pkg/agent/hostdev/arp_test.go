package hostdev

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// The ARP responder of L2 announcements (bpf/lib/arp.h) in from_netdev,
// with BPF_PROG_TEST_RUN on the masquerade tests' throw-away node.

var (
	announced = netip.MustParseAddr("172.30.0.241")
	asker     = netip.MustParseAddr("172.30.0.1")
	askerMAC  = net.HardwareAddr{0x02, 0xaa, 0, 0, 0, 0x01}
	devMAC    = net.HardwareAddr{0x02, 0xbb, 0, 0, 0, 0x11}
)

// arpFrame is an Ethernet/IPv4 ARP packet (op 1 request, 2 reply), padded
// to the Ethernet minimum as on a wire.
func arpFrame(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	f := make([]byte, 60)
	dst := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if op == 2 {
		dst = tha
	}
	copy(f[0:6], dst)
	copy(f[6:12], sha)
	binary.BigEndian.PutUint16(f[12:], 0x0806)
	binary.BigEndian.PutUint16(f[14:], 1)
	binary.BigEndian.PutUint16(f[16:], 0x0800)
	f[18], f[19] = 6, 4
	binary.BigEndian.PutUint16(f[20:], op)
	copy(f[22:28], sha)
	a := spa.As4()
	copy(f[28:32], a[:])
	copy(f[32:38], tha)
	b := tpa.As4()
	copy(f[38:42], b[:])
	return f
}

func monotonicNow(t *testing.T) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// TestPrivilegedARPResponder: a request for an announced address on its
// device is answered with the device's MAC out of the same device; the
// same request on another device, for another address, after the entry
// expired, a gratuitous request, an ARP reply and an IPv4 packet all pass
// to the host untouched.
func TestPrivilegedARPResponder(t *testing.T) {
	n := newMasqNode(t, 61000, 61009)
	resp := n.l.Maps().L2Responder()
	if err := resp.Set(maps.L2ResponderKey{Addr: announced, IfIndex: n.uplink},
		maps.L2ResponderEntry{MAC: devMAC, Expires: monotonicNow(t) + 3600e9}); err != nil {
		t.Fatal(err)
	}
	zero := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	req := arpFrame(1, askerMAC, asker, zero, announced)

	ret, out := n.run(n.h.fromNet, n.uplink, append([]byte(nil), req...))
	if ret != 7 { // TC_ACT_REDIRECT
		t.Fatalf("request for an announced address: verdict %d, want redirect (7)", ret)
	}
	want := arpFrame(2, devMAC, announced, askerMAC, asker)
	copy(want[6:12], devMAC) // from the device
	if !bytes.Equal(out[:42], want[:42]) {
		t.Fatalf("reply\n got %x\nwant %x", out[:42], want[:42])
	}

	pass := func(name string, ifindex int, f []byte) {
		t.Helper()
		ret, out := n.run(n.h.fromNet, ifindex, append([]byte(nil), f...))
		if ret != 0 {
			t.Fatalf("%s: verdict %d, want pass (0)", name, ret)
		}
		if !bytes.Equal(out[:len(f)], f) {
			t.Fatalf("%s: frame changed:\n got %x\nwant %x", name, out[:len(f)], f)
		}
	}
	pass("request on another device", n.podIf, req)
	pass("request for an address not announced", n.uplink, arpFrame(1, askerMAC, asker, zero, netip.MustParseAddr("172.30.0.242")))
	pass("gratuitous request", n.uplink, arpFrame(1, askerMAC, announced, zero, announced))
	pass("reply", n.uplink, arpFrame(2, askerMAC, asker, devMAC, announced))
	pass("IPv4 packet to the address", n.uplink, frame(client, announced, protoTCP, 40000, 80, 0))
	short := append([]byte(nil), req[:30]...)
	pass("truncated request", n.uplink, short)

	if err := resp.Set(maps.L2ResponderKey{Addr: announced, IfIndex: n.uplink},
		maps.L2ResponderEntry{MAC: devMAC, Expires: monotonicNow(t) - 1}); err != nil {
		t.Fatal(err)
	}
	pass("request after the entry expired", n.uplink, req)

	if err := resp.Delete(maps.L2ResponderKey{Addr: announced, IfIndex: n.uplink}); err != nil {
		t.Fatal(err)
	}
	pass("request after the entry was deleted", n.uplink, req)
}

// TestPrivilegedL2ResponderBadInput: an IPv6 address, a missing ifindex or a MAC
// of the wrong length is an error naming the entry.
func TestPrivilegedL2ResponderBadInput(t *testing.T) {
	n := newMasqNode(t, 61000, 61009)
	resp := n.l.Maps().L2Responder()
	for name, c := range map[string]struct {
		k maps.L2ResponderKey
		e maps.L2ResponderEntry
	}{
		"ipv6":    {maps.L2ResponderKey{Addr: netip.MustParseAddr("fd00::1"), IfIndex: 1}, maps.L2ResponderEntry{MAC: devMAC}},
		"ifindex": {maps.L2ResponderKey{Addr: announced}, maps.L2ResponderEntry{MAC: devMAC}},
		"mac":     {maps.L2ResponderKey{Addr: announced, IfIndex: 1}, maps.L2ResponderEntry{MAC: devMAC[:4]}},
	} {
		if err := resp.Set(c.k, c.e); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
