package nodehealth

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	tutil "github.com/tendril-net/tendril/pkg/testutil"
)

// testNetns is a named network namespace removed when the test ends.
func testNetns(t *testing.T, prefix string) netns.NsHandle {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := prefix + "-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		_ = exec.Command("ip", "netns", "del", name).Run()
	})
	return ns
}

// TestPrivilegedProbesAcrossNamespaces: a node's responder in one
// network namespace, the prober (the real ICMP and HTTP probes) in
// another, joined by a veth. Both probes succeed; with the responder's
// side of the link down the next rounds report the node unreachable by
// both probes; with it up again, reachable. Run with the unprivileged
// ICMP socket (ping_group_range open in the prober's namespace) and with
// the raw socket (a new namespace's default: closed).
func TestPrivilegedProbesAcrossNamespaces(t *testing.T) {
	tutil.Privileged(t)
	for _, pingSocket := range []bool{false, true} {
		t.Run(fmt.Sprintf("ping-socket=%v", pingSocket), func(t *testing.T) {
			probeAcrossNamespaces(t, pingSocket)
		})
	}
}

func probeAcrossNamespaces(t *testing.T, pingSocket bool) {
	nsA, nsB := testNetns(t, "nhA"), testNetns(t, "nhB")
	hA, err := netlink.NewHandleAt(nsA)
	if err != nil {
		t.Fatal(err)
	}
	defer hA.Close()
	hB, err := netlink.NewHandleAt(nsB)
	if err != nil {
		t.Fatal(err)
	}
	defer hB.Close()
	la := netlink.NewLinkAttrs()
	la.Name = "nh0"
	if err := hA.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "nh1", PeerNamespace: netlink.NsFd(nsB)}); err != nil {
		t.Fatal(err)
	}
	addrA, addrB := netip.MustParsePrefix("192.168.251.1/24"), netip.MustParsePrefix("192.168.251.2/24")
	setup := func(h *netlink.Handle, name string, p netip.Prefix) netlink.Link {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}}); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	setup(hA, "nh0", addrA)
	linkB := setup(hB, "nh1", addrB)

	if pingSocket {
		// Per namespace: written from a thread in the prober's.
		if err := linux.InNetNS(nsA, func() error {
			return os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 2147483647"), 0o644)
		}); err != nil {
			t.Fatal(err)
		}
	}

	// The kind of ICMP socket the probe gets in nsA is the one meant.
	if err := linux.InNetNS(nsA, func() error {
		c, raw, err := listenICMP(false)
		if err != nil {
			return err
		}
		c.Close()
		if raw == pingSocket {
			return fmt.Errorf("raw ICMP socket %v with ping_group_range open %v", raw, pingSocket)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const port = 4240
	respDone := make(chan error, 1)
	go func() {
		// The listener is made on a thread in nsB; the connections it
		// accepts are nsB's whatever thread serves them.
		respDone <- linux.InNetNS(nsB, func() error {
			return (&Responder{Node: "node-b", Port: port}).Run(ctx, health.NewRegistry().Scope("responder"))
		})
	}()
	defer func() {
		cancel()
		if err := <-respDone; err != nil {
			t.Errorf("responder: %v", err)
		}
	}()

	// The probes' sockets are made in nsA.
	icmp := func(ctx context.Context, ip netip.Addr) (d time.Duration, err error) {
		err = linux.InNetNS(nsA, func() error {
			d, err = Ping(ctx, ip)
			return err
		})
		return d, err
	}
	dial := func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = linux.InNetNS(nsA, func() error {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}

	db := statedb.New()
	tables, err := nodemanager.NewTables(db)
	if err != nil {
		t.Fatal(err)
	}
	table, err := NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	w := db.WriteTxn(tables.Nodes)
	if _, _, err := tables.Nodes.Insert(w, &nodemanager.Peer{Name: "node-b", IPs: []netip.Addr{addrB.Addr()}}); err != nil {
		t.Fatal(err)
	}
	w.Commit()
	p := &Prober{DB: db, Table: table, Peers: tables.Nodes, ICMP: icmp, HTTP: HTTPProbe(port, dial),
		Timeout: 500 * time.Millisecond, Now: time.Now, Log: hivetest.Logger(t)}
	proberDone := make(chan error, 1)
	go func() { proberDone <- p.Run(ctx, time.Second, health.NewRegistry().Scope("prober")) }()
	defer func() {
		cancel()
		<-proberDone
	}()

	last := func() Address {
		st, _, ok := table.Get(db.ReadTxn(), StatusByNode.Query("node-b"))
		if !ok || len(st.Addresses) != 1 {
			return Address{}
		}
		return st.Addresses[0]
	}
	waitFor := func(what string, cond func(Address) bool) {
		t.Helper()
		tutil.Eventually(t, 30*time.Second, what, func() bool { return cond(last()) })
		a := last()
		t.Logf("%s: icmp %s, http %s", what, a.ICMP, a.HTTP)
	}
	waitFor("node-b reachable by both probes", Address.Reachable)
	if a := last(); a.ICMP.Latency <= 0 || a.HTTP.Latency <= 0 {
		t.Fatalf("latencies %v, %v", a.ICMP.Latency, a.HTTP.Latency)
	}

	if err := hB.LinkSetDown(linkB); err != nil {
		t.Fatal(err)
	}
	waitFor("node-b unreachable by both probes", func(a Address) bool {
		return a.IP.IsValid() && !a.ICMP.Reachable && !a.HTTP.Reachable && a.ICMP.Error != "" && a.HTTP.Error != ""
	})

	if err := hB.LinkSetUp(linkB); err != nil {
		t.Fatal(err)
	}
	waitFor("node-b reachable again", Address.Reachable)
}
