package wireguard

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedNodeRoutes: two namespaces as nodes on one link, each with
// a device process, configured with the node mark and the other node as
// peer (its address in the allowed IPs), and NodeRoutes synced with the
// other's address. A TCP connection between the node addresses echoes a
// marked payload: a capture on the link sees only UDP between the nodes
// on the WireGuard port (the device's own datagrams to the very address
// the routes send through the device do not loop), never the payload or
// the TCP port. A second Sync changes nothing. The API server's address
// and port excluded (a rule of its own): the same connection is seen in
// the clear, the rule kept by a Sync without prune, removed by one with
// it (encrypted again; seen failing with the rule not added). Remove
// takes the rules and the routes away, and the same connection is then
// seen in the clear: the capture's check can fail.
func TestPrivilegedNodeRoutes(t *testing.T) {
	testutil.Privileged(t)
	nsA, hA := newNS(t)
	nsB, hB := newNS(t)
	nodeA, nodeB := netip.MustParseAddr("192.168.78.1"), netip.MustParseAddr("192.168.78.2")
	veth(t, hA, "link", netip.PrefixFrom(nodeA, 24), hB, nsB, "link", netip.PrefixFrom(nodeB, 24))

	client, err := wgctrl.New()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	devA, devB := "tdwgnodeA", "tdwgnodeB"
	keyA, _ := wgtypes.GeneratePrivateKey()
	keyB, _ := wgtypes.GeneratePrivateKey()
	logPath := filepath.Join(t.TempDir(), "device.log")
	routes := map[string]NodeRoutes{}
	for _, n := range []struct {
		ns   netns.NsHandle
		h    *netlink.Handle
		dev  string
		key  wgtypes.Key
		peer Peer
	}{
		{nsA, hA, devA, keyA, Peer{Node: "b", PublicKey: keyB.PublicKey(), Endpoint: netip.AddrPortFrom(nodeB, DefaultPort),
			AllowedIPs: []netip.Prefix{netip.PrefixFrom(nodeB, 32)}, Addresses: []netip.Addr{nodeB}}},
		{nsB, hB, devB, keyB, Peer{Node: "a", PublicKey: keyA.PublicKey(), Endpoint: netip.AddrPortFrom(nodeA, DefaultPort),
			AllowedIPs: []netip.Prefix{netip.PrefixFrom(nodeA, 32)}, Addresses: []netip.Addr{nodeA}}},
	} {
		inNS(t, n.ns, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := Spawn(ctx, client, n.dev, []string{"/usr/bin/env", serveEnv + "=" + n.dev, os.Args[0]}, logPath)
			return err
		})
		t.Cleanup(func() { inNS(t, n.ns, func() error { return Stop(n.dev) }) })
		if _, err := Configure(client, n.dev, n.key, DefaultPort, NodeMark, []Peer{n.peer}); err != nil {
			t.Fatal(err)
		}
		if d, err := client.Device(n.dev); err != nil || d.FirewallMark != NodeMark {
			t.Fatalf("device %s: fwmark %v (%v), want %#x", n.dev, d, err, NodeMark)
		}
		r := NodeRoutes{Handle: n.h, Device: n.dev}
		routes[n.dev] = r
		if changed, err := r.Sync(NodeAddresses([]Peer{n.peer}), nil, true); err != nil || !changed {
			t.Fatalf("sync %s: changed %v, %v", n.dev, changed, err)
		}
		if changed, err := r.Sync(NodeAddresses([]Peer{n.peer}), nil, true); err != nil || changed {
			t.Fatalf("second sync %s: changed %v, %v; want nothing to do", n.dev, changed, err)
		}
	}
	rs, err := hA.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: NodeTable}, netlink.RT_FILTER_TABLE)
	if err != nil || len(rs) != 1 || rs[0].Dst.String() != "192.168.78.2/32" || !rs[0].Src.Equal(nodeA.AsSlice()) {
		t.Fatalf("node A's table %d: %v (%v), want one route to 192.168.78.2/32 from 192.168.78.1", NodeTable, rs, err)
	}

	marker := []byte("tendril-node-encryption-cleartext-marker")
	const port = 5011
	var ln net.Listener
	inNS(t, nsB, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(nodeB, port).String())
		return err
	})
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	// echo connects from node A to node B's address and echoes the
	// payload, with a capture on node A's end of the link.
	echo := func(t *testing.T) [][]byte {
		t.Helper()
		frames := capture(t, nsA, "link")
		var c net.Conn
		inNS(t, nsA, func() error {
			var err error
			c, err = net.DialTimeout("tcp", netip.AddrPortFrom(nodeB, port).String(), 30*time.Second)
			if err != nil {
				return fmt.Errorf("tcp node to node: %w", err)
			}
			return nil
		})
		defer c.Close()
		payload := bytes.Repeat(marker, 500)
		go func() { _, _ = c.Write(payload) }()
		got := make([]byte, len(payload))
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("tcp echo between the nodes: %v", err)
		}
		return frames()
	}
	// clear counts the frames with the payload or the TCP port.
	clear := func(frames [][]byte) (inClear, wg int) {
		for _, f := range frames {
			if bytes.Contains(f, marker) {
				inClear++
				continue
			}
			if len(f) < 34 || binary.BigEndian.Uint16(f[12:14]) != unix.ETH_P_IP {
				continue
			}
			ip := f[14:]
			ihl := int(ip[0]&0xf) * 4
			if len(ip) < ihl+4 {
				continue
			}
			sport, dport := binary.BigEndian.Uint16(ip[ihl:]), binary.BigEndian.Uint16(ip[ihl+2:])
			switch {
			case ip[9] == unix.IPPROTO_TCP && (sport == port || dport == port):
				inClear++
			case ip[9] == unix.IPPROTO_UDP && sport == DefaultPort && dport == DefaultPort:
				wg++
			}
		}
		return inClear, wg
	}

	inClear, wg := clear(echo(t))
	if inClear != 0 || wg == 0 {
		t.Fatalf("node to node with the node routes: %d frames in the clear, %d WireGuard datagrams; want 0 and some", inClear, wg)
	}
	t.Logf("node to node: %d WireGuard datagrams, nothing in the clear", wg)

	// The API server's address and port on node B: node A's connections
	// to it stay off the device (its requests in the clear: it can reach
	// the API server to learn keys whatever the device's state), the
	// route to node B stays for the rest.
	apiServer := netip.AddrPortFrom(nodeB, port)
	rA := routes[devA]
	if changed, err := rA.Sync([]netip.Addr{nodeB}, []netip.AddrPort{apiServer}, true); err != nil || !changed {
		t.Fatalf("sync with the exclusion: changed %v, %v", changed, err)
	}
	if changed, err := rA.Sync([]netip.Addr{nodeB}, []netip.AddrPort{apiServer}, true); err != nil || changed {
		t.Fatalf("second sync with the exclusion: changed %v, %v; want nothing to do", changed, err)
	}
	if inClear, _ := clear(echo(t)); inClear == 0 {
		t.Fatalf("the excluded address and port: not seen in the clear, still through the device")
	}
	// Not pruned before the nodes are known; pruned after.
	if changed, err := rA.Sync([]netip.Addr{nodeB}, nil, false); err != nil || changed {
		t.Fatalf("sync without prune: changed %v, %v; want the exclusion kept", changed, err)
	}
	if changed, err := rA.Sync([]netip.Addr{nodeB}, nil, true); err != nil || !changed {
		t.Fatalf("sync with prune: changed %v, %v; want the exclusion removed", changed, err)
	}
	if inClear, wg := clear(echo(t)); inClear != 0 || wg == 0 {
		t.Fatalf("the exclusion removed: %d frames in the clear, %d WireGuard datagrams; want 0 and some", inClear, wg)
	}
	// Remove takes the exclusions too.
	if _, err := rA.Sync([]netip.Addr{nodeB}, []netip.AddrPort{apiServer}, true); err != nil {
		t.Fatal(err)
	}

	for _, r := range routes {
		if err := r.Remove(); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range []*netlink.Handle{hA, hB} {
		rules, err := h.RuleList(unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		for _, ru := range rules {
			if ru.Priority == NodeMarkRulePriority || ru.Priority == NodeRulePriority || ru.Priority == NodeExcludeRulePriority {
				t.Fatalf("rule after Remove: %v", ru)
			}
		}
	}
	if inClear, wg := clear(echo(t)); inClear == 0 {
		t.Fatalf("without the node routes the same connection is not seen in the clear (%d WireGuard datagrams): the capture's check proves nothing", wg)
	}
}

// TestPrivilegedTunnelAndNodeRules: the tunnel's routes and node
// encryption's in one namespace (a veth stands in for the device:
// only the rules and tables are checked here, the traffic in the lab).
// Each has its rule and table; the mark rule is one, shared; removing
// the tunnel's keeps node encryption's rule and the mark rule, removing
// both leaves none.
func TestPrivilegedTunnelAndNodeRules(t *testing.T) {
	testutil.Privileged(t)
	_, h := newNS(t)
	for _, name := range []string{"under", "wgdummy"} {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{name, name + "p"} {
			l, _ := h.LinkByName(n)
			if err := h.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
	}
	under, _ := h.LinkByName("under")
	if err := h.AddrAdd(under, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("192.168.79.1"), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	peer := []netip.Addr{netip.MustParseAddr("192.168.79.2")}
	node := NodeRoutes{Handle: h, Device: "wgdummy"}
	tun := TunnelRoutes(h, "wgdummy", 8472)
	for _, r := range []NodeRoutes{node, tun} {
		if _, err := r.Sync(peer, nil, true); err != nil {
			t.Fatal(err)
		}
	}
	ours := func() map[int]netlink.Rule {
		rules, err := h.RuleList(unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		out := map[int]netlink.Rule{}
		for _, ru := range rules {
			if isOurs(ru) {
				out[ru.Priority] = ru
			}
		}
		return out
	}
	got := ours()
	if len(got) != 3 {
		t.Fatalf("rules %v, want the tunnel's, the mark's and node encryption's", got)
	}
	if ru := got[TunnelRulePriority]; ru.Table != TunnelTable || ru.IPProto != unix.IPPROTO_UDP || ru.Dport == nil || ru.Dport.Start != 8472 {
		t.Errorf("the tunnel's rule: %+v", ru)
	}
	for _, table := range []int{NodeTable, TunnelTable} {
		rs, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
		if err != nil || len(rs) != 1 || rs[0].Dst.String() != "192.168.79.2/32" {
			t.Errorf("table %d: %v (%v)", table, rs, err)
		}
	}
	if err := tun.Remove(); err != nil {
		t.Fatal(err)
	}
	if got := ours(); len(got) != 2 || got[NodeRulePriority].Table != NodeTable || got[NodeMarkRulePriority].Mark != NodeMark {
		t.Fatalf("after the tunnel's Remove: %v, want node encryption's rule and the mark's", got)
	}
	if err := node.Remove(); err != nil {
		t.Fatal(err)
	}
	if got := ours(); len(got) != 0 {
		t.Fatalf("after both Removes: %v", got)
	}
}
