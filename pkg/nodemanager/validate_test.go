package nodemanager

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/reconcile/reconciletest"
)

// startWithRules runs a Manager with the rules and a fake routing table,
// recording what OnRejected and OnAddressRefused are told.
func startWithRules(t *testing.T, rules Rules) (*Manager, *fakeRoutes, func() []string) {
	m, backend, _, told := startWithRulesCache(t, rules)
	return m, backend, told
}

// startWithRulesCache is startWithRules with a fake ipcache too.
func startWithRulesCache(t *testing.T, rules Rules) (*Manager, *fakeRoutes, *fakeCache, func() []string) {
	t.Helper()
	backend := &fakeRoutes{routes: map[netip.Prefix]netip.Addr{}}
	cache := newFakeCache()
	var mu sync.Mutex
	var told []string
	var m *Manager
	reconciletest.Start(t, "nodemanager-rules-test", func(d reconciletest.Deps) error {
		var err error
		m, err = New(Params{LocalNode: "a", DB: d.DB, Jobs: d.Jobs, Log: d.Log, ModuleID: d.ModuleID, Routes: backend,
			IPCache: cache, Rules: rules, OnRejected: func(node string, r Rejection) {
				mu.Lock()
				told = append(told, node+" "+r.CIDR+" "+r.Reason)
				mu.Unlock()
			},
			OnAddressRefused: func(node string, r AddressRejection) {
				mu.Lock()
				told = append(told, node+" address "+r.Addr.String()+" "+r.Reason)
				mu.Unlock()
			},
			Options: []reconciler.Option{reconciler.WithRetry(10*time.Millisecond, 50*time.Millisecond)}})
		return err
	})
	return m, backend, cache, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(told) }
}

func rejectedOf(m *Manager, name string) string {
	var out []string
	for _, r := range m.Rejected()[name] {
		out = append(out, r.CIDR+" "+r.Reason)
	}
	return strings.Join(out, "; ")
}

func TestPodCIDRRules(t *testing.T) {
	local := func() ([]netip.Prefix, []netip.Addr) {
		return []netip.Prefix{netip.MustParsePrefix("10.9.1.0/24")}, []netip.Addr{netip.MustParseAddr("172.31.9.1")}
	}
	m, backend, told := startWithRules(t, Rules{Local: local,
		Reserved: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		Pools:    []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")}})
	cases := []struct {
		node, ip, cidr, reason string
	}{
		{"default", "172.31.9.10", "0.0.0.0/0", ReasonDefaultRoute},
		{"default6", "fd00::10", "::/0", ReasonDefaultRoute},
		{"short", "172.31.9.11", "10.0.0.0/9", ReasonTooShort},
		{"short6", "fd00::11", "fd00:b::/40", ReasonTooShort},
		{"pool", "172.31.9.12", "10.10.0.0/24", ReasonOutsidePool},
		{"service", "172.31.9.13", "10.96.0.0/24", ReasonReserved},
		{"local", "172.31.9.14", "10.9.1.128/25", ReasonLocal},
		{"host", "172.31.9.15", "172.31.9.0/24", ReasonOutsidePool},
		{"ok", "172.31.9.16", "10.9.2.0/24", ""},
	}
	for _, c := range cases {
		mustUpsert(t, m, c.node, []string{c.ip}, c.cidr)
	}
	for _, c := range cases {
		want := ""
		if c.reason != "" {
			want = c.cidr + " " + c.reason
		}
		if got := rejectedOf(m, c.node); got != want {
			t.Errorf("%s: rejected %q, want %q", c.node, got, want)
		}
	}
	eventually(t, func() (bool, string) {
		got, want := backend.String(), "[10.9.2.0/24 via 172.31.9.16]"
		return got == want, fmt.Sprintf("routes %s, want %s", got, want)
	})
	if n := len(told()); n != len(cases)-1 {
		t.Errorf("OnRejected told %d times, want %d: %v", n, len(cases)-1, told())
	}
	// The same object again is no new rejection.
	mustUpsert(t, m, "default", []string{"172.31.9.10"}, "0.0.0.0/0")
	if n := len(told()); n != len(cases)-1 {
		t.Errorf("an unchanged rejection was reported again: %v", told())
	}
}

// TestPodCIDRContainingNodeAddress: a pod CIDR holding this node's
// address, or an address of an older node, would take that node's
// traffic: refused. A node claiming an address inside an older node's pod
// CIDR does not take the CIDR away (before, one address claimed was
// enough to cut any node's pods off): its address is refused instead,
// never a remote-node claim or a next hop; when the older node goes, the
// newer one's CIDR is accepted.
func TestPodCIDRContainingNodeAddress(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	local := func() ([]netip.Prefix, []netip.Addr) { return nil, []netip.Addr{netip.MustParseAddr("10.50.0.1")} }
	m, backend, cache, told := startWithRulesCache(t, Rules{Local: local})
	up := func(name string, age time.Duration, ip string, cidrs ...string) {
		t.Helper()
		p := Peer{Name: name, Created: t0.Add(age), IPs: []netip.Addr{netip.MustParseAddr(ip)}}
		for _, c := range cidrs {
			p.PodCIDRs = append(p.PodCIDRs, netip.MustParsePrefix(c))
		}
		if err := m.UpsertPeer(p); err != nil {
			t.Fatal(err)
		}
	}
	up("b", 0, "10.60.0.2", "10.50.0.0/24") // this node's address
	up("c", 0, "10.60.0.3", "10.60.0.0/24") // its own and b's (older by name)
	up("d", 0, "10.61.0.4", "10.61.8.0/24") // fine
	up("e", time.Hour, "10.61.0.5", "10.70.0.0/24")
	up("f", 2*time.Hour, "10.70.0.9") // newer than e: its address is the false claim
	up("g", 0, "10.71.0.9")           // older than h: h's CIDR is
	up("h", 3*time.Hour, "10.61.0.8", "10.71.0.0/24")
	for node, want := range map[string]string{"b": "10.50.0.0/24 " + ReasonNodeAddress, "c": "10.60.0.0/24 " + ReasonNodeAddress,
		"d": "", "e": "", "f": "", "g": "", "h": "10.71.0.0/24 " + ReasonNodeAddress} {
		if got := rejectedOf(m, node); got != want {
			t.Errorf("%s: rejected %q, want %q", node, got, want)
		}
	}
	if got := refusedAddrsOf(m, "f"); got != "10.70.0.9 "+AddrReasonPodCIDR {
		t.Errorf("f's address refused as %q, want %s", got, AddrReasonPodCIDR)
	}
	eventually(t, func() (bool, string) {
		got, want := backend.String(), "[10.61.8.0/24 via 10.61.0.4 10.70.0.0/24 via 10.61.0.5]"
		return got == want, fmt.Sprintf("routes %s, want %s", got, want)
	})
	eventually(t, func() (bool, string) {
		got, want := cache.claims(), "[b=10.60.0.2 c=10.60.0.3 d=10.61.0.4 e=10.61.0.5 g=10.71.0.9 h=10.61.0.8]"
		return got == want, fmt.Sprintf("remote-node claims %s, want %s (never f's)", got, want)
	})
	if !slices.Contains(told(), "f address 10.70.0.9 "+AddrReasonPodCIDR) {
		t.Errorf("f's refused address not reported: %v", told())
	}
	// The older node goes: the newer one's CIDR is accepted.
	if err := m.DeletePeer("g"); err != nil {
		t.Fatal(err)
	}
	if got := rejectedOf(m, "h"); got != "" {
		t.Errorf("h after g went: rejected %q", got)
	}
	eventually(t, func() (bool, string) {
		got, want := backend.String(), "[10.61.8.0/24 via 10.61.0.4 10.70.0.0/24 via 10.61.0.5 10.71.0.0/24 via 10.61.0.8]"
		return got == want, fmt.Sprintf("routes after g went %s, want %s", got, want)
	})
	// e goes: f's address is no pod's any more, and becomes a node's.
	if err := m.DeletePeer("e"); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() (bool, string) {
		got, want := cache.claims(), "[b=10.60.0.2 c=10.60.0.3 d=10.61.0.4 f=10.70.0.9 h=10.61.0.8]"
		return got == want, fmt.Sprintf("remote-node claims after e went %s, want %s", got, want)
	})
}

// TestPoolSaysWhoseAddressClaimIsFalse: with the cluster pools known, an
// address inside them is a pod's, never a node's: an older node claiming
// one does not take a newer node's pod CIDR away, and its address is no
// remote-node claim.
func TestPoolSaysWhoseAddressClaimIsFalse(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m, backend, cache, _ := startWithRulesCache(t, Rules{Pools: []netip.Prefix{netip.MustParsePrefix("10.70.0.0/16")}})
	for _, p := range []Peer{
		{Name: "old", Created: t0, IPs: []netip.Addr{netip.MustParseAddr("172.31.0.1"), netip.MustParseAddr("10.70.5.9")}},
		{Name: "new", Created: t0.Add(time.Hour), IPs: []netip.Addr{netip.MustParseAddr("172.31.0.2")},
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.70.5.0/24")}},
	} {
		if err := m.UpsertPeer(p); err != nil {
			t.Fatal(err)
		}
	}
	if got := rejectedOf(m, "new"); got != "" {
		t.Errorf("new: rejected %q", got)
	}
	if got := refusedAddrsOf(m, "old"); got != "10.70.5.9 "+AddrReasonPodCIDR {
		t.Errorf("old's refused addresses %q", got)
	}
	eventually(t, func() (bool, string) {
		got, want := backend.String()+" "+cache.claims(), "[10.70.5.0/24 via 172.31.0.2] [new=172.31.0.2 old=172.31.0.1]"
		return got == want, fmt.Sprintf("routes and claims %s, want %s", got, want)
	})
}

// TestSharedAddressStaysANodeAddress: an address two nodes claim is a
// node's either way (its remote-node identity and a route via it are
// right whichever holds it): both keep it as a node address, and report
// it refused as their own (encryption takes neither).
func TestSharedAddressStaysANodeAddress(t *testing.T) {
	m, _, cache, _ := startWithRulesCache(t, Rules{})
	mustUpsert(t, m, "b", []string{"172.31.0.9"}, "10.9.2.0/24")
	mustUpsert(t, m, "c", []string{"172.31.0.9"}, "10.9.3.0/24")
	eventually(t, func() (bool, string) {
		got, want := cache.claims(), "[b=172.31.0.9 c=172.31.0.9]"
		return got == want, fmt.Sprintf("claims %s, want %s", got, want)
	})
	for _, n := range []string{"b", "c"} {
		if got := refusedAddrsOf(m, n); got != "172.31.0.9 "+AddrReasonShared {
			t.Errorf("%s's refused addresses %q", n, got)
		}
	}
	if err := m.DeletePeer("c"); err != nil {
		t.Fatal(err)
	}
	if got := refusedAddrsOf(m, "b"); got != "" {
		t.Errorf("b's refused addresses after c went: %q", got)
	}
}

func refusedAddrsOf(m *Manager, name string) string {
	for _, p := range m.Peers() {
		if p.Name == name {
			var out []string
			for _, r := range p.RefusedIPs {
				out = append(out, r.Addr.String()+" "+r.Reason)
			}
			return strings.Join(out, "; ")
		}
	}
	return "no node " + name
}

// TestOverlappingPodCIDRsOlderNodeWins: of two nodes asking for
// overlapping CIDRs, the one created first gets its CIDR whatever order
// the events come in, the other none; when the first goes, the other's
// CIDR is accepted.
func TestOverlappingPodCIDRsOlderNodeWins(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	older := Peer{Name: "zz-older", Created: t0, IPs: []netip.Addr{netip.MustParseAddr("172.31.9.2")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.2.0/24")}}
	newer := Peer{Name: "aa-newer", Created: t0.Add(time.Hour), IPs: []netip.Addr{netip.MustParseAddr("172.31.9.3")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/22")}}
	for _, order := range [][]Peer{{older, newer}, {newer, older}} {
		m, backend, _ := startWithRules(t, Rules{})
		for _, p := range order {
			if err := m.UpsertPeer(p); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := rejectedOf(m, "aa-newer"), "10.9.0.0/22 "+ReasonOtherNode; got != want {
			t.Errorf("order %s first: newer rejected %q, want %q", order[0].Name, got, want)
		}
		if got := rejectedOf(m, "zz-older"); got != "" {
			t.Errorf("order %s first: older rejected %q", order[0].Name, got)
		}
		eventually(t, func() (bool, string) {
			got, want := backend.String(), "[10.9.2.0/24 via 172.31.9.2]"
			return got == want, fmt.Sprintf("order %s first: routes %s, want %s", order[0].Name, got, want)
		})
		if err := m.DeletePeer("zz-older"); err != nil {
			t.Fatal(err)
		}
		eventually(t, func() (bool, string) {
			got, want := backend.String(), "[10.9.0.0/22 via 172.31.9.3]"
			return got == want, fmt.Sprintf("after the older went: routes %s, want %s", got, want)
		})
	}
}

func TestMalformedAndSecondOfFamily(t *testing.T) {
	m, _, _ := startWithRules(t, Rules{})
	p := Peer{Name: "b", IPs: []netip.Addr{netip.MustParseAddr("172.31.9.2")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.2.0/24"), netip.MustParsePrefix("10.9.3.0/24")},
		Rejected: []Rejection{{CIDR: "10.9.4.0/33", Reason: ReasonMalformed, Detail: "bad bits"}}}
	if err := m.UpsertPeer(p); err != nil {
		t.Fatal(err)
	}
	want := "10.9.4.0/33 " + ReasonMalformed + "; 10.9.3.0/24 " + ReasonFamilyTwice
	if got := rejectedOf(m, "b"); got != want {
		t.Fatalf("rejected %q, want %q", got, want)
	}
}

func TestRulesValidate(t *testing.T) {
	for _, r := range []Rules{{MinPrefixIPv4: 33}, {MinPrefixIPv6: 129}, {MinPrefixIPv4: -1}} {
		if r.Validate() == nil {
			t.Errorf("%+v: no error", r)
		}
	}
	if err := (Rules{MinPrefixIPv4: 20, MinPrefixIPv6: 64}).Validate(); err != nil {
		t.Error(err)
	}
}

// TestCheckOwn: this node's own pod CIDRs pass when sane, inside the
// pools, clear of the service CIDRs and the node's addresses, one per
// family; each failure names the CIDR and its reason.
func TestCheckOwn(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	rules := Rules{Pools: pfx("10.245.0.0/16", "fd00:10:245::/56"), Reserved: pfx("10.96.0.0/12", "fd00:10:96::/112")}
	addrs := []netip.Addr{netip.MustParseAddr("172.30.0.11"), netip.MustParseAddr("fd00:172:30::11")}
	for _, tc := range []struct {
		name  string
		rules Rules
		cidrs []netip.Prefix
		want  string // "" passes, else a piece of the error
	}{
		{"dual", rules, pfx("10.245.1.0/24", "fd00:10:245:1::/64"), ""},
		{"ipv4 only", rules, pfx("10.245.1.0/24"), ""},
		{"ipv6 only", rules, pfx("fd00:10:245:2::/64"), ""},
		{"no pools known", Rules{}, pfx("10.1.0.0/24", "fd00:1::/64"), ""},
		{"default route", rules, pfx("0.0.0.0/0"), ReasonDefaultRoute},
		{"too short", rules, pfx("10.0.0.0/9"), "10.0.0.0/9 (" + ReasonTooShort},
		{"too short v6", rules, pfx("fd00::/40"), ReasonTooShort},
		{"too long", rules, pfx("10.245.1.0/31"), "10.245.1.0/31 (" + ReasonTooLong},
		{"too long v6", rules, pfx("fd00:10:245::/127"), ReasonTooLong},
		{"outside the v4 pool", rules, pfx("10.246.0.0/24", "fd00:10:245:1::/64"), "10.246.0.0/24 (" + ReasonOutsidePool},
		{"outside the v6 pool", rules, pfx("10.245.1.0/24", "fd00:10:246::/64"), "fd00:10:246::/64 (" + ReasonOutsidePool},
		{"v6 pool only known", Rules{Pools: pfx("fd00:10:245::/56")}, pfx("10.9.0.0/24", "fd00:10:245:1::/64"), ""},
		{"service CIDR", Rules{Reserved: rules.Reserved}, pfx("10.96.0.0/24"), ReasonReserved},
		{"service CIDR v6", Rules{Reserved: rules.Reserved}, pfx("fd00:10:96::/120"), ReasonReserved},
		{"node address", Rules{}, pfx("172.30.0.0/24"), "172.30.0.0/24 (" + ReasonNodeAddress},
		{"node address v6", Rules{}, pfx("fd00:172:30::/64"), ReasonNodeAddress},
		{"second of v4", rules, pfx("10.245.1.0/24", "fd00:10:245:1::/64", "10.245.2.0/24"),
			"10.245.2.0/24 (" + ReasonFamilyTwice + ": a second pod CIDR of its family beside 10.245.1.0/24"},
		{"second of v6", rules, pfx("fd00:10:245:1::/64", "fd00:10:245:2::/64"), "fd00:10:245:2::/64 (" + ReasonFamilyTwice},
		{"invalid", rules, []netip.Prefix{{}}, ReasonMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rules.CheckOwn(tc.cidrs, addrs)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("passed, want %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q lacks %q", err, tc.want)
			}
		})
	}
	// Every refusal is named, not only the first.
	err := rules.CheckOwn(pfx("10.246.0.0/24", "fd00:10:96::/120"), addrs)
	if err == nil || !strings.Contains(err.Error(), ReasonOutsidePool) || !strings.Contains(err.Error(), "fd00:10:96::/120") {
		t.Fatalf("two refusals: %v", err)
	}
}
