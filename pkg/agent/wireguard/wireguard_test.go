package wireguard

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/tendril-net/tendril/pkg/agent/tunnel"
	dpwg "github.com/tendril-net/tendril/pkg/datapath/wireguard"
	"github.com/tendril-net/tendril/pkg/nodemanager"
)

// fakeDevice is a device in memory.
type fakeDevice struct {
	ensured   atomic.Int64
	ensureErr error
	dev       wgtypes.Device
}

func (f *fakeDevice) Ensure(context.Context) error { f.ensured.Add(1); return f.ensureErr }

func (f *fakeDevice) Device(string) (*wgtypes.Device, error) { d := f.dev; return &d, nil }

func (f *fakeDevice) ConfigureDevice(_ string, cfg wgtypes.Config) error {
	if cfg.PrivateKey != nil {
		f.dev.PrivateKey = *cfg.PrivateKey
	}
	if cfg.ListenPort != nil {
		f.dev.ListenPort = *cfg.ListenPort
	}
	if cfg.FirewallMark != nil {
		f.dev.FirewallMark = *cfg.FirewallMark
	}
	for _, pc := range cfg.Peers {
		i := -1
		for j, p := range f.dev.Peers {
			if p.PublicKey == pc.PublicKey {
				i = j
			}
		}
		switch {
		case pc.Remove && i >= 0:
			f.dev.Peers = append(f.dev.Peers[:i], f.dev.Peers[i+1:]...)
		case pc.Remove:
		case i >= 0:
			f.dev.Peers[i] = wgtypes.Peer{PublicKey: pc.PublicKey, Endpoint: pc.Endpoint, AllowedIPs: pc.AllowedIPs}
		default:
			f.dev.Peers = append(f.dev.Peers, wgtypes.Peer{PublicKey: pc.PublicKey, Endpoint: pc.Endpoint, AllowedIPs: pc.AllowedIPs})
		}
	}
	return nil
}

func (f *fakeDevice) peers() map[string]string {
	out := map[string]string{}
	for _, p := range f.dev.Peers {
		var ips []string
		for _, a := range p.AllowedIPs {
			ips = append(ips, a.String())
		}
		out[p.PublicKey.String()] = p.Endpoint.String() + " " + strings.Join(ips, ",")
	}
	return out
}

func pub(t *testing.T) string {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k.PublicKey().String()
}

func peer(name, ip, cidr, key string) *nodemanager.Peer {
	return &nodemanager.Peer{Name: name, IPs: []netip.Addr{netip.MustParseAddr(ip)},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)}, WireGuardKey: key}
}

type env struct {
	db    *statedb.DB
	nodes statedb.RWTable[*nodemanager.Peer]
	done  func(statedb.WriteTxn)
	dev   *fakeDevice
	e     *Encryption
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := statedb.New()
	tables, err := nodemanager.NewTables(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(tables.Nodes)
	done := tables.Nodes.RegisterInitializer(wtxn, "test")
	wtxn.Commit()
	dev := &fakeDevice{}
	e, err := New(DefaultConfig(), filepath.Join(t.TempDir(), "wireguard.key"), dev, db, tables.Nodes, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return &env{db: db, nodes: tables.Nodes, done: done, dev: dev, e: e}
}

// synced marks the nodes table initialized (its sources listed).
func (v *env) synced() {
	wtxn := v.db.WriteTxn(v.nodes)
	v.done(wtxn)
	wtxn.Commit()
}

func (v *env) set(t *testing.T, ps ...*nodemanager.Peer) {
	t.Helper()
	wtxn := v.db.WriteTxn(v.nodes)
	_ = v.nodes.DeleteAll(wtxn)
	for _, p := range ps {
		if _, _, err := v.nodes.Insert(wtxn, p); err != nil {
			t.Fatal(err)
		}
	}
	wtxn.Commit()
}

// TestPeersFromNodesTable: each node with a valid key becomes a peer, its
// endpoint its own address on the configured port, its allowed IPs its
// accepted pod CIDRs; a node without a key, with a malformed one, with
// this node's key or one another node also publishes, is left out.
func TestPeersFromNodesTable(t *testing.T) {
	v := newEnv(t)
	kb, kc, dup := pub(t), pub(t), pub(t)
	own, _ := v.e.WireGuardPublicKey()
	v.set(t,
		peer("b", "192.168.1.2", "10.244.2.0/24", kb),
		peer("c", "192.168.1.3", "10.244.3.0/24", kc),
		peer("nokey", "192.168.1.4", "10.244.4.0/24", ""),
		&nodemanager.Peer{Name: "bad", IPs: []netip.Addr{netip.MustParseAddr("192.168.1.5")}, KeyError: "not base64"},
		peer("d1", "192.168.1.6", "10.244.6.0/24", dup),
		peer("d2", "192.168.1.7", "10.244.7.0/24", dup),
		peer("mine", "192.168.1.8", "10.244.8.0/24", own),
	)
	v.synced()
	if err := v.e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := v.dev.peers()
	want := map[string]string{kb: "192.168.1.2:51871 10.244.2.0/24,192.168.1.2/32", kc: "192.168.1.3:51871 10.244.3.0/24,192.168.1.3/32"}
	if len(got) != len(want) || got[kb] != want[kb] || got[kc] != want[kc] {
		t.Fatalf("peers %v, want %v", got, want)
	}
	st := v.e.State()
	for _, n := range []string{"nokey", "bad", "d1", "d2", "mine"} {
		if st.Skipped[n] == "" {
			t.Errorf("node %s not reported as left out: %v", n, st.Skipped)
		}
	}
	if v.dev.dev.ListenPort != 51871 || v.dev.dev.PrivateKey.PublicKey().String() != own {
		t.Fatalf("device %+v", v.dev.dev)
	}
	// A node goes: its peer goes.
	v.set(t, peer("b", "192.168.1.2", "10.244.2.0/24", kb))
	if err := v.e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := v.dev.peers(); len(got) != 1 || got[kb] == "" {
		t.Fatalf("after c went, peers %v", got)
	}
	sec := v.e.StatusSection()
	found := false
	for _, l := range sec.Lines {
		found = found || (l.Key == "b" && strings.Contains(l.Value, "192.168.1.2:51871"))
	}
	if !found {
		t.Fatalf("status %+v has no line for b", sec)
	}
}

// TestRestartKeepsPeersUntilSynced: an agent restarting finds the device
// with its peers; until the nodes table is initialized, a peer the table
// does not (yet) list is kept, so pod traffic keeps flowing encrypted;
// once it is, the peer of a node that is gone is removed.
func TestRestartKeepsPeersUntilSynced(t *testing.T) {
	v := newEnv(t)
	kb, kc := pub(t), pub(t)
	v.set(t, peer("b", "192.168.1.2", "10.244.2.0/24", kb), peer("c", "192.168.1.3", "10.244.3.0/24", kc))
	v.synced()
	if err := v.e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The restarted agent: same key file, same device, an empty table
	// not yet initialized.
	w := newEnv(t)
	w.dev = v.dev
	w.e.dev = v.dev
	w.e.keyPath = v.e.keyPath
	w.e.key = v.e.key
	w.set(t, peer("b", "192.168.1.2", "10.244.2.0/24", kb))
	if err := w.e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := v.dev.peers(); len(got) != 2 {
		t.Fatalf("before the table is initialized, peers %v (c's was removed)", got)
	}
	w.synced()
	if err := w.e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := v.dev.peers(); len(got) != 1 || got[kb] == "" {
		t.Fatalf("after the table is initialized, peers %v", got)
	}
}

// TestKeyKeptAndRotated: the key is the same after a restart (same state
// dir); a rotation changes it, tells the publisher, and sets it on the
// device, the peers untouched.
func TestKeyKeptAndRotated(t *testing.T) {
	v := newEnv(t)
	kb := pub(t)
	v.set(t, peer("b", "192.168.1.2", "10.244.2.0/24", kb))
	v.synced()
	if err := v.e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	before, changed := v.e.WireGuardPublicKey()
	again, err := New(DefaultConfig(), v.e.keyPath, v.dev, v.db, v.nodes, v.e.log)
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := again.WireGuardPublicKey(); k != before {
		t.Fatal("the key changed across a restart")
	}
	if err := v.e.RotateKey(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Fatal("the publisher was not told of the new key")
	}
	after, _ := v.e.WireGuardPublicKey()
	if after == before || v.dev.dev.PrivateKey.PublicKey().String() != after {
		t.Fatalf("rotation: published %s, device %s, before %s", after, v.dev.dev.PrivateKey.PublicKey(), before)
	}
	if got := v.dev.peers(); len(got) != 1 || got[kb] == "" {
		t.Fatalf("rotation changed the peers: %v", got)
	}
}

func TestConfigValidate(t *testing.T) {
	native := tunnel.DefaultConfig()
	tun := native
	tun.RoutingMode = tunnel.ModeTunnel
	on := DefaultConfig()
	on.EnableWireguard = true
	if err := on.Validate(native); err != nil {
		t.Fatal(err)
	}
	if err := DefaultConfig().Validate(native); err != nil {
		t.Fatal(err)
	}
	if err := on.Validate(tun); err != nil {
		t.Errorf("encryption in tunnel mode: %v", err)
	}
	strict := on
	strict.WireguardStrict = true
	if err := strict.Validate(tun); err != nil {
		t.Errorf("strict mode in tunnel mode: %v", err)
	}
	node := on
	node.WireguardEncryptNode = true
	if err := node.Validate(native); err != nil {
		t.Errorf("encrypt-node with encryption: %v", err)
	}
	external := on
	external.WireguardDeviceExternal = true
	if err := external.Validate(native); err != nil {
		t.Errorf("an external device with encryption: %v", err)
	}
	for name, c := range map[string]struct {
		c Config
		t tunnel.Config
	}{
		"strict without":       {Config{WireguardStrict: true, WireguardPort: 1, WireguardDevice: "x"}, native},
		"port 0":               {Config{EnableWireguard: true, WireguardDevice: "x"}, native},
		"long device name":     {Config{EnableWireguard: true, WireguardPort: 1, WireguardDevice: "a-name-too-long-for-linux"}, native},
		"encrypt-node without": {Config{WireguardEncryptNode: true, WireguardPort: 1, WireguardDevice: "x"}, native},
		"external without":     {Config{WireguardDeviceExternal: true, WireguardPort: 1, WireguardDevice: "x"}, native},
	} {
		if err := c.c.Validate(c.t); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// fakeRouter records what the node routes were synced with.
type fakeRouter struct {
	addrs   []netip.Addr
	exclude []netip.AddrPort
}

func (f *fakeRouter) Sync(addrs []netip.Addr, exclude []netip.AddrPort, _ bool) (bool, error) {
	f.addrs = slices.Clone(addrs)
	f.exclude = slices.Clone(exclude)
	return true, nil
}

// TestSharedAddressGivenToNoPeer: node addresses come from objects other
// nodes' agents and kubelets write. An address two nodes claim is given
// to neither: not in either's allowed IPs (WireGuard would move it to
// whichever was set last) and not routed to the device with node
// encryption (this node's traffic to it would go to whichever node won).
func TestSharedAddressGivenToNoPeer(t *testing.T) {
	v := newEnv(t)
	v.e.cfg.WireguardEncryptNode = true
	r := &fakeRouter{}
	v.e.nodeRoutes = r
	kb, kc := pub(t), pub(t)
	b := peer("b", "192.168.1.2", "10.244.2.0/24", kb)
	b.IPs = append(b.IPs, netip.MustParseAddr("192.168.1.9"))
	c := peer("c", "192.168.1.3", "10.244.3.0/24", kc)
	c.IPs = append(c.IPs, netip.MustParseAddr("192.168.1.9"))
	v.set(t, b, c)
	v.synced()
	if err := v.e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := v.dev.peers()
	want := map[string]string{kb: "192.168.1.2:51871 10.244.2.0/24,192.168.1.2/32", kc: "192.168.1.3:51871 10.244.3.0/24,192.168.1.3/32"}
	if len(got) != 2 || got[kb] != want[kb] || got[kc] != want[kc] {
		t.Errorf("peers %v, want %v", got, want)
	}
	if fmt.Sprint(r.addrs) != "[192.168.1.2 192.168.1.3]" {
		t.Errorf("node routes to %v, want [192.168.1.2 192.168.1.3]", r.addrs)
	}
	if v.dev.dev.FirewallMark != dpwg.NodeMark {
		t.Errorf("device's fwmark %#x, want %#x", v.dev.dev.FirewallMark, dpwg.NodeMark)
	}
}

// TestAddressNoNodeOwns: a node's addresses come from objects it writes
// itself; one that is not its own (this node's address, an address
// inside this node's or another node's pod CIDR, in the cluster pool
// outside every pod CIDR, in the service CIDR, loopback) is neither an
// allowed IP of its peer (the node could send as it) nor, with node
// encryption, routed to the device (this node's traffic to it would go
// to that node); it is reported. The node's endpoint is an address of its
// own: a node whose only address is not gets no peer.
func TestAddressNoNodeOwns(t *testing.T) {
	v := newEnv(t)
	v.e.cfg.WireguardEncryptNode = true
	r := &fakeRouter{}
	v.e.nodeRoutes = r
	v.e.rules = nodemanager.Rules{
		Pools:    []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		Reserved: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
		Local: func() ([]netip.Prefix, []netip.Addr) {
			return []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, []netip.Addr{netip.MustParseAddr("192.168.1.1")}
		},
	}
	kb, kc, kd := pub(t), pub(t), pub(t)
	b := peer("b", "192.168.1.2", "10.244.2.0/24", kb)
	for _, a := range []string{"192.168.1.1", "10.244.1.5", "10.244.3.7", "10.244.9.9", "10.96.0.10", "127.0.0.1", "10.244.2.1"} {
		b.IPs = append(b.IPs, netip.MustParseAddr(a))
	}
	c := peer("c", "192.168.1.3", "10.244.3.0/24", kc)
	// d's only address is this node's: no endpoint of its own.
	d := peer("d", "192.168.1.1", "10.244.4.0/24", kd)
	v.set(t, b, c, d)
	v.synced()
	if err := v.e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := v.dev.peers()
	want := map[string]string{
		// b's router IP (inside its own pod CIDR) is allowed: its pod
		// CIDR is anyway.
		kb: "192.168.1.2:51871 10.244.2.0/24,192.168.1.2/32,10.244.2.1/32",
		kc: "192.168.1.3:51871 10.244.3.0/24,192.168.1.3/32",
	}
	if len(got) != 2 || got[kb] != want[kb] || got[kc] != want[kc] {
		t.Errorf("peers %v, want %v", got, want)
	}
	if fmt.Sprint(r.addrs) != "[10.244.2.1 192.168.1.2 192.168.1.3]" {
		t.Errorf("node routes to %v, want [10.244.2.1 192.168.1.2 192.168.1.3]", r.addrs)
	}
	st := v.e.State()
	for _, reason := range []string{nodemanager.AddrReasonLocal, nodemanager.AddrReasonPodCIDR, nodemanager.AddrReasonPool,
		nodemanager.AddrReasonService, nodemanager.AddrReasonNotUnicast} {
		if !strings.Contains(st.RefusedAddrs["b"], reason) {
			t.Errorf("b's refused addresses %q: no %s", st.RefusedAddrs["b"], reason)
		}
	}
	if !strings.Contains(st.Skipped["d"], "no node address of its own") {
		t.Errorf("d skipped as %q, want no node address of its own", st.Skipped["d"])
	}
}

// TestAPIServerLeftOutOfNodeEncryption: with node encryption, the API
// server's address and port are excluded from the routes to the device
// when the address is another node's (routed to the device): this node
// reaches the API server to learn keys whatever the device's state. An
// API server on no peer's address needs no exclusion.
func TestAPIServerLeftOutOfNodeEncryption(t *testing.T) {
	v := newEnv(t)
	v.e.cfg.WireguardEncryptNode = true
	r := &fakeRouter{}
	v.e.nodeRoutes = r
	v.e.apiServers = func() []netip.AddrPort {
		return []netip.AddrPort{netip.MustParseAddrPort("192.168.1.3:6443"), netip.MustParseAddrPort("172.16.0.1:443"),
			netip.MustParseAddrPort("[::ffff:192.168.1.3]:6443")}
	}
	kb, kc := pub(t), pub(t)
	v.set(t, peer("b", "192.168.1.2", "10.244.2.0/24", kb), peer("c", "192.168.1.3", "10.244.3.0/24", kc))
	v.synced()
	if err := v.e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(r.addrs) != "[192.168.1.2 192.168.1.3]" {
		t.Errorf("node routes to %v, want [192.168.1.2 192.168.1.3]", r.addrs)
	}
	if fmt.Sprint(r.exclude) != "[192.168.1.3:6443]" {
		t.Errorf("excluded %v, want [192.168.1.3:6443]", r.exclude)
	}
}

// quietHealth is a cell.Health that records nothing.
type quietHealth struct{}

func (quietHealth) OK(string)                     {}
func (quietHealth) Stopped(string)                {}
func (quietHealth) Degraded(string, error)        {}
func (h quietHealth) NewScope(string) cell.Health { return h }
func (quietHealth) Close()                        {}

// TestRunWaitsOnceTheTableIsInitialized: with the nodes table
// initialized and unchanged, the loop waits for a change or its recheck.
// It waited on the table's initialization channel, which stays closed
// once the table is, so it reconciled the device in a loop. Counted in
// reconciliations (each ensures the device), not time.
func TestRunWaitsOnceTheTableIsInitialized(t *testing.T) {
	v := newEnv(t)
	v.set(t, peer("b", "192.168.1.2", "10.244.2.0/24", pub(t)))
	v.synced()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = v.e.run(ctx, quietHealth{}); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	for deadline := time.Now().Add(10 * time.Second); v.dev.ensured.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("never reconciled")
		}
	}
	time.Sleep(50 * time.Millisecond)
	before := v.dev.ensured.Load()
	time.Sleep(200 * time.Millisecond)
	if n := v.dev.ensured.Load() - before; n > 2 {
		t.Fatalf("%d reconciliations over an unchanged, initialized nodes table in 200 ms, want at most 2", n)
	}
}
