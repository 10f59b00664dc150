package socklb

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/lbmap"
	"github.com/tendril-net/tendril/pkg/loadbalancer/maglev"
	"github.com/tendril-net/tendril/pkg/namedns"
)

// skipChain is the agent's path for local redirects, without the
// Kubernetes source: the services writer's tables, whose frontends the LB
// maps operations write into the maps the hooks read (as the reconciler
// does, one frontend at a time).
type skipChain struct {
	db  *statedb.DB
	t   *loadbalancer.Tables
	w   *loadbalancer.Writer
	ops *lbmap.Ops
}

func newSkipChain(t *testing.T, e *env) *skipChain {
	t.Helper()
	db := statedb.New()
	tables, err := loadbalancer.NewTables(db)
	if err != nil {
		t.Fatal(err)
	}
	return &skipChain{db: db, t: tables, w: loadbalancer.NewWriter(tables, "node-a"),
		ops: lbmap.New(e.maps, maglev.Config{Size: maglev.DefaultSize}, slog.New(slog.DiscardHandler))}
}

// sync writes every frontend of the table into the maps and prunes the
// rest.
func (c *skipChain) sync(t *testing.T) {
	t.Helper()
	txn := c.db.ReadTxn()
	for f := range c.t.Frontends.All(txn) {
		if err := c.ops.Update(context.Background(), txn, 0, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ops.Prune(context.Background(), txn, c.t.Frontends.All(txn)); err != nil {
		t.Fatal(err)
	}
}

// cacheNetns is the cache pod's network namespace (named after the
// test's cgroup, unique per run; deleted when the test ends) and its
// cookie, which the skip entries name.
func cacheNetns(t *testing.T, e *env) (string, uint64) {
	t.Helper()
	name := filepath.Base(e.cgroup)
	if err := namedns.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := namedns.Delete(name); err != nil {
			t.Error(err)
		}
	})
	cookie, err := namedns.NetnsCookie(namedns.Path(name))
	if err != nil {
		t.Fatal(err)
	}
	return namedns.Path(name), cookie
}

func skipEntries(t *testing.T, e *env) map[string]uint8 {
	t.Helper()
	out := map[string]uint8{}
	if err := e.maps.SkipMap().Iterate(func(k maps.SkipKey, mode uint8) bool {
		out[fmt.Sprintf("%d %s", k.NetnsCookie, k.Frontend)] = mode
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPrivilegedSocketLBSkipRedirectFromBackend: a node-local DNS cache
// behind a serviceMatcher (kube-dns, UDP and TCP) and an addressMatcher
// (169.254.20.10, UDP) with skipRedirectFromBackend. Sockets in the cache
// pod's network namespace reach the Service's own backend ("upstream")
// and the address itself ("addr"); sockets of another pod's namespace
// still reach the cache. With the flag off, the cache reaches itself
// again, and the skip entries are gone; the policy deleted, none is left.
func TestPrivilegedSocketLBSkipRedirectFromBackend(t *testing.T) {
	e := setup(t)
	cacheNS, cookie := cacheNetns(t, e)
	c := newSkipChain(t, e)
	kubeDNS := loadbalancer.ServiceName{Namespace: "kube-system", Name: "kube-dns"}
	if err := c.w.UpsertService(&loadbalancer.Service{Name: kubeDNS, Type: "ClusterIP", Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports: []loadbalancer.ServicePort{{Name: "dns", Port: 53, Proto: loadbalancer.UDP}, {Name: "dns-tcp", Port: 53, Proto: loadbalancer.TCP}}}); err != nil {
		t.Fatal(err)
	}
	// The Service's own backend (another node's in a cluster; here on the
	// helper's loopback).
	up := netip.MustParseAddrPort("127.0.0.1:5302")
	if err := c.w.SetBackends(kubeDNS, "slice", []*loadbalancer.Backend{
		{Addr: up, Proto: loadbalancer.UDP, PortName: "dns", NodeName: "node-b", Ready: true, Serving: true},
		{Addr: up, Proto: loadbalancer.TCP, PortName: "dns-tcp", NodeName: "node-b", Ready: true, Serving: true},
	}); err != nil {
		t.Fatal(err)
	}
	cache := netip.MustParseAddrPort("127.0.0.1:5301")
	policies := func(skip bool) []*loadbalancer.LocalRedirect {
		svc := &loadbalancer.LocalRedirect{Name: loadbalancer.ServiceName{Namespace: "kube-system", Name: "nodelocaldns"}, Service: kubeDNS,
			SkipFromBackend: skip, Backends: []loadbalancer.RedirectBackend{
				{Pod: "kube-system/cache", Addr: cache, Proto: loadbalancer.UDP, PortName: "dns", NetnsCookie: cookie},
				{Pod: "kube-system/cache", Addr: cache, Proto: loadbalancer.TCP, PortName: "dns-tcp", NetnsCookie: cookie}}}
		addr := &loadbalancer.LocalRedirect{Name: loadbalancer.ServiceName{Namespace: "kube-system", Name: "link-local"},
			Address: netip.MustParseAddr("169.254.20.10"), Ports: []loadbalancer.ServicePort{{Name: "dns", Port: 53, Proto: loadbalancer.UDP}},
			SkipFromBackend: skip, Backends: []loadbalancer.RedirectBackend{
				{Pod: "kube-system/cache", Addr: cache, Proto: loadbalancer.UDP, PortName: "dns", NetnsCookie: cookie}}}
		return []*loadbalancer.LocalRedirect{svc, addr}
	}
	apply := func(skip bool) {
		t.Helper()
		for _, r := range policies(skip) {
			if err := c.w.UpsertLocalRedirect(r); err != nil {
				t.Fatal(err)
			}
		}
		c.sync(t)
	}
	req := helperRequest{
		LoAddrs:    []string{"169.254.20.10/32"},
		TCPServers: []helperServer{{cache.String(), "cache"}, {up.String(), "upstream"}},
		UDPServers: []helperServer{{cache.String(), "cache"}, {up.String(), "upstream"}, {"169.254.20.10:53", "addr"}},
		Probes: []helperProbe{{Kind: "udp-unconnected", Dst: "10.96.0.10:53", Count: 3}, {Kind: "udp", Dst: "10.96.0.10:53", Count: 3},
			{Kind: "tcp", Dst: "10.96.0.10:53", Count: 3}, {Kind: "udp", Dst: "169.254.20.10:53", Count: 3}},
	}
	// expect checks each probe's replies: want[i] for probe i; the
	// frontend is named back either way.
	expect := func(who string, res [][]helperResult, want ...string) {
		t.Helper()
		froms := []string{"10.96.0.10:53", "10.96.0.10:53", "", "169.254.20.10:53"}
		for i, rs := range res {
			for n, r := range rs {
				checkOK(t, fmt.Sprintf("%s probe %d/%d", who, i, n), r)
				if r.Reply != want[i] {
					t.Errorf("%s: probe %s %s #%d answered by %q, want %q", who, req.Probes[i].Kind, req.Probes[i].Dst, n, r.Reply, want[i])
				}
				if froms[i] != "" && r.From != froms[i] {
					t.Errorf("%s: probe %s %s #%d reply from %s, want %s", who, req.Probes[i].Kind, req.Probes[i].Dst, n, r.From, froms[i])
				}
			}
		}
	}

	apply(true)
	want := map[string]uint8{
		fmt.Sprintf("%d 10.96.0.10:53/17", cookie):    maps.LBSkipOriginal,
		fmt.Sprintf("%d 10.96.0.10:53/6", cookie):     maps.LBSkipOriginal,
		fmt.Sprintf("%d 169.254.20.10:53/17", cookie): maps.LBSkipPass,
	}
	if got := skipEntries(t, e); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("skip entries %v, want %v", got, want)
	}
	expect("cache pod", runHelperIn(t, e.cgroup, cacheNS, req), "upstream", "upstream", "upstream", "addr")
	expect("other pod", runHelper(t, e.cgroup, req), "cache", "cache", "cache", "cache")

	apply(false)
	if got := skipEntries(t, e); len(got) != 0 {
		t.Fatalf("flag off: skip entries left %v", got)
	}
	expect("cache pod, flag off", runHelperIn(t, e.cgroup, cacheNS, req), "cache", "cache", "cache", "cache")

	apply(true)
	for _, r := range policies(true) {
		if err := c.w.DeleteLocalRedirect(r.Name); err != nil {
			t.Fatal(err)
		}
	}
	c.sync(t)
	if got := skipEntries(t, e); len(got) != 0 {
		t.Fatalf("policies deleted: skip entries left %v", got)
	}
}

// TestPrivilegedSocketLBSkipFollowsAffinity: with ClientIP session
// affinity on the Service, a pod the local redirect skips keeps to one of
// the Service's own backends (twenty connections, two backends: random
// picks all agree once in 2^19), recorded apart from the redirected
// clients' affinity (AFFINITY_ORIGINAL), while another pod is still
// redirected to the cache.
func TestPrivilegedSocketLBSkipFollowsAffinity(t *testing.T) {
	e := setup(t)
	cacheNS, cookie := cacheNetns(t, e)
	c := newSkipChain(t, e)
	svc := loadbalancer.ServiceName{Namespace: "kube-system", Name: "kube-dns"}
	if err := c.w.UpsertService(&loadbalancer.Service{Name: svc, Type: "ClusterIP", Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:    []loadbalancer.ServicePort{{Name: "dns-tcp", Port: 53, Proto: loadbalancer.TCP}},
		Affinity: true, AffinityTimeout: 600}); err != nil {
		t.Fatal(err)
	}
	up1, up2 := netip.MustParseAddrPort("127.0.0.1:5302"), netip.MustParseAddrPort("127.0.0.1:5303")
	if err := c.w.SetBackends(svc, "slice", []*loadbalancer.Backend{
		{Addr: up1, Proto: loadbalancer.TCP, PortName: "dns-tcp", NodeName: "node-b", Ready: true, Serving: true},
		{Addr: up2, Proto: loadbalancer.TCP, PortName: "dns-tcp", NodeName: "node-c", Ready: true, Serving: true},
	}); err != nil {
		t.Fatal(err)
	}
	cache := netip.MustParseAddrPort("127.0.0.1:5301")
	if err := c.w.UpsertLocalRedirect(&loadbalancer.LocalRedirect{Name: loadbalancer.ServiceName{Namespace: "kube-system", Name: "nodelocaldns"},
		Service: svc, SkipFromBackend: true, Backends: []loadbalancer.RedirectBackend{
			{Pod: "kube-system/cache", Addr: cache, Proto: loadbalancer.TCP, PortName: "dns-tcp", NetnsCookie: cookie}}}); err != nil {
		t.Fatal(err)
	}
	c.sync(t)
	req := helperRequest{
		TCPServers: []helperServer{{cache.String(), "cache"}, {up1.String(), "up1"}, {up2.String(), "up2"}},
		Probes:     []helperProbe{{Kind: "tcp", Dst: "10.96.0.10:53", Count: 20}},
	}
	answered := map[string]int{}
	for n, r := range runHelperIn(t, e.cgroup, cacheNS, req)[0] {
		checkOK(t, fmt.Sprintf("cache pod connection %d", n), r)
		answered[r.Reply]++
	}
	if len(answered) != 1 || answered["cache"] > 0 {
		t.Errorf("the skipped pod's 20 connections were answered by %v, want one of up1 and up2 for all", answered)
	}
	for n, r := range runHelper(t, e.cgroup, req)[0] {
		checkOK(t, fmt.Sprintf("other pod connection %d", n), r)
		if r.Reply != "cache" {
			t.Errorf("other pod connection %d answered by %q, want the cache", n, r.Reply)
		}
	}
	var original, redirected int
	if err := e.maps.AffinityMap().Iterate(func(k maps.AffinityKey, _ maps.Affinity) bool {
		if k.Original {
			original++
			if k.NetnsCookie != cookie {
				t.Errorf("an affinity to the original backends of netns %d, want only the cache pod's (%d)", k.NetnsCookie, cookie)
			}
		} else {
			redirected++
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if original != 1 || redirected != 1 {
		t.Errorf("affinity entries: %d to the original backends, %d redirected; want 1 and 1", original, redirected)
	}
}
