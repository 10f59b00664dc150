package wireguard

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/nodemanager"
)

// fakeStrict is strict mode's maps in memory, with what was written.
type fakeStrict struct {
	ifindex    int
	strict     bool
	node       bool
	tunnelPort uint16
	cidrs      map[netip.Prefix]bool
	addrs      map[netip.Addr]bool
	writes     int
}

func (f *fakeStrict) SetDevice(ifindex int, strict, node bool, tunnelPort uint16) error {
	f.ifindex, f.strict, f.node, f.tunnelPort = ifindex, strict, node, tunnelPort
	return nil
}

func (f *fakeStrict) SyncNodeAddrs(want map[netip.Addr]bool, prune bool) error {
	if f.addrs == nil {
		f.addrs = map[netip.Addr]bool{}
	}
	for a, v := range want {
		if cur, ok := f.addrs[a]; !ok || cur != v {
			f.addrs[a] = v
			f.writes++
		}
	}
	if prune {
		for a := range f.addrs {
			if _, ok := want[a]; !ok {
				delete(f.addrs, a)
				f.writes++
			}
		}
	}
	return nil
}

func (f *fakeStrict) SyncCIDRs(want map[netip.Prefix]bool, prune bool) error {
	if f.cidrs == nil {
		f.cidrs = map[netip.Prefix]bool{}
	}
	for p, v := range want {
		if cur, ok := f.cidrs[p]; !ok || cur != v {
			f.cidrs[p] = v
			f.writes++
		}
	}
	if prune {
		for p := range f.cidrs {
			if _, ok := want[p]; !ok {
				delete(f.cidrs, p)
				f.writes++
			}
		}
	}
	return nil
}

func cidrs(kv ...any) map[netip.Prefix]bool {
	out := map[netip.Prefix]bool{}
	for i := 0; i < len(kv); i += 2 {
		out[netip.MustParsePrefix(kv[i].(string))] = kv[i+1].(bool)
	}
	return out
}

// TestStrictMapWrites: with strict mode the reconciler writes every
// node's pod CIDRs, a peer's as such and a node without a key (or with a
// malformed or duplicate one) as no peer, and the device's ifindex with
// the strict flag; until the nodes table is initialized it removes no
// CIDR (a restart keeps what the last agent wrote), afterwards a gone
// node's CIDRs go; a node losing its key is marked no peer; a device
// whose ifindex cannot be read is written as none (everything for other
// nodes' pods dropped), and so is one that cannot be ensured.
func TestStrictMapWrites(t *testing.T) {
	v := newEnv(t)
	v.e.cfg.WireguardStrict = true
	fs := &fakeStrict{cidrs: cidrs("10.244.9.0/24", true)} // left by the last agent
	index := 42
	var indexErr error
	v.e.strict = &Strict{Maps: fs, LinkIndex: func(name string) (int, error) {
		if name != DefaultConfig().WireguardDevice {
			t.Errorf("ifindex of %q asked", name)
		}
		return index, indexErr
	}}
	kb, dup := pub(t), pub(t)
	v.set(t,
		peer("b", "192.168.1.2", "10.244.2.0/24", kb),
		peer("nokey", "192.168.1.4", "10.244.4.0/24", ""),
		&nodemanager.Peer{Name: "bad", IPs: []netip.Addr{netip.MustParseAddr("192.168.1.5")}, KeyError: "not base64",
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.5.0/24")}},
		peer("d1", "192.168.1.6", "10.244.6.0/24", dup),
		peer("d2", "192.168.1.7", "fd00:7::/64", dup),
	)
	ctx := context.Background()
	if err := v.e.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	want := cidrs("10.244.2.0/24", true, "10.244.4.0/24", false, "10.244.5.0/24", false,
		"10.244.6.0/24", false, "fd00:7::/64", false, "10.244.9.0/24", true)
	if !maps.Equal(fs.cidrs, want) {
		t.Fatalf("before the table is initialized: %v, want %v", fs.cidrs, want)
	}
	if fs.ifindex != 42 || !fs.strict || fs.node {
		t.Fatalf("device entry %d strict %v node %v, want 42 true false", fs.ifindex, fs.strict, fs.node)
	}
	if len(fs.addrs) != 0 {
		t.Fatalf("node addresses written without node encryption: %v", fs.addrs)
	}

	v.synced()
	v.set(t, peer("b", "192.168.1.2", "10.244.2.0/24", ""), peer("nokey", "192.168.1.4", "10.244.4.0/24", ""))
	if err := v.e.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if want := cidrs("10.244.2.0/24", false, "10.244.4.0/24", false); !maps.Equal(fs.cidrs, want) {
		t.Fatalf("initialized, b's key gone: %v, want %v", fs.cidrs, want)
	}
	writes := fs.writes
	if err := v.e.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if fs.writes != writes {
		t.Errorf("an unchanged table wrote %d CIDR entries", fs.writes-writes)
	}

	indexErr = errors.New("no such link")
	if err := v.e.Reconcile(ctx); err == nil {
		t.Error("a device without an ifindex: no error")
	}
	if fs.ifindex != 0 || !fs.strict {
		t.Errorf("device without an ifindex: entry %d strict %v, want 0 true", fs.ifindex, fs.strict)
	}
	indexErr = nil
	if err := v.e.Reconcile(ctx); err != nil || fs.ifindex != 42 {
		t.Fatalf("device back: %v, ifindex %d", err, fs.ifindex)
	}
	v.dev.ensureErr = errors.New("device process would not start")
	if err := v.e.Reconcile(ctx); err == nil {
		t.Error("a device that cannot be ensured: no error")
	}
	if fs.ifindex != 0 || !fs.strict {
		t.Errorf("device not ensured: entry %d strict %v, want 0 true", fs.ifindex, fs.strict)
	}
	// In the tunnel routing mode the entry names the tunnel's port,
	// whatever the device's state.
	v.e.strict.TunnelPort = 8472
	if err := v.e.Reconcile(ctx); err == nil || fs.ifindex != 0 || fs.tunnelPort != 8472 {
		t.Errorf("tunnel mode, device not ensured: %v, entry %d port %d, want an error, 0 and 8472", err, fs.ifindex, fs.tunnelPort)
	}
	v.dev.ensureErr = nil
	if err := v.e.Reconcile(ctx); err != nil || fs.ifindex != 42 || !fs.strict || fs.tunnelPort != 8472 {
		t.Errorf("tunnel mode: %v, entry %d strict %v port %d, want 42 true 8472", err, fs.ifindex, fs.strict, fs.tunnelPort)
	}
}

func addrs(kv ...any) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for i := 0; i < len(kv); i += 2 {
		out[netip.MustParseAddr(kv[i].(string))] = kv[i+1].(bool)
	}
	return out
}

// TestNodeAddrMapWrites: with node encryption the reconciler writes the
// peers' own addresses as a peer's (from_pod sends a pod's packets to them
// to the device) and the node flag, and no pod CIDR without strict mode;
// an address two nodes claim is written for neither (OwnAddresses refuses
// it); a node without a key gets no entry (its address is reached in the
// clear) unless strict mode is on too, then it is written as no peer's
// (dropped); node encryption off again removes every address once the
// table is initialized.
func TestNodeAddrMapWrites(t *testing.T) {
	v := newEnv(t)
	v.e.cfg.WireguardEncryptNode = true
	fs := &fakeStrict{}
	v.e.strict = &Strict{Maps: fs, LinkIndex: func(string) (int, error) { return 42, nil }}
	kb, kc := pub(t), pub(t)
	shared := &nodemanager.Peer{Name: "c", WireGuardKey: kc,
		IPs:      []netip.Addr{netip.MustParseAddr("192.168.1.3"), netip.MustParseAddr("192.168.1.99")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24")}}
	other := &nodemanager.Peer{Name: "e", IPs: []netip.Addr{netip.MustParseAddr("192.168.1.99")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24")}}
	v.set(t,
		peer("b", "192.168.1.2", "10.244.2.0/24", kb),
		shared, other,
		peer("nokey", "192.168.1.4", "10.244.4.0/24", ""),
	)
	v.synced()
	ctx := context.Background()
	if err := v.e.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if want := addrs("192.168.1.2", true, "192.168.1.3", true); !maps.Equal(fs.addrs, want) {
		t.Fatalf("node encryption: %v, want %v", fs.addrs, want)
	}
	if len(fs.cidrs) != 0 {
		t.Fatalf("pod CIDRs written without strict mode: %v", fs.cidrs)
	}
	if fs.ifindex != 42 || fs.strict || !fs.node {
		t.Fatalf("device entry %d strict %v node %v, want 42 false true", fs.ifindex, fs.strict, fs.node)
	}

	v.e.cfg.WireguardStrict = true
	if err := v.e.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if want := addrs("192.168.1.2", true, "192.168.1.3", true, "192.168.1.4", false); !maps.Equal(fs.addrs, want) {
		t.Fatalf("strict mode too: %v, want %v", fs.addrs, want)
	}
	if !fs.strict || !fs.node || !fs.cidrs[netip.MustParsePrefix("10.244.2.0/24")] {
		t.Fatalf("strict mode too: strict %v node %v cidrs %v", fs.strict, fs.node, fs.cidrs)
	}

	v.e.cfg.WireguardStrict, v.e.cfg.WireguardEncryptNode = false, false
	if err := v.e.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if len(fs.addrs) != 0 || len(fs.cidrs) != 0 || fs.strict || fs.node {
		t.Fatalf("both off: addrs %v cidrs %v strict %v node %v", fs.addrs, fs.cidrs, fs.strict, fs.node)
	}
}
