package nodehealth

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	tutil "github.com/tendril-net/tendril/pkg/testutil"
)

// fakeNet answers the probes of the addresses marked up; a probe of any
// other address fails as a timeout would.
type fakeNet struct {
	mu sync.Mutex
	up map[netip.Addr]bool
	// hold, if set for an address, is waited on before it answers; each
	// probe that starts waiting on it is reported on holding.
	hold    map[netip.Addr]chan struct{}
	holding chan netip.Addr
}

func newFakeNet(up ...netip.Addr) *fakeNet {
	n := &fakeNet{up: map[netip.Addr]bool{}, hold: map[netip.Addr]chan struct{}{}, holding: make(chan netip.Addr, 16)}
	for _, ip := range up {
		n.up[ip] = true
	}
	return n
}

func (n *fakeNet) set(ip netip.Addr, up bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.up[ip] = up
}

func (n *fakeNet) probe(latency time.Duration) ProbeFunc {
	return func(ctx context.Context, ip netip.Addr) (time.Duration, error) {
		n.mu.Lock()
		hold := n.hold[ip]
		n.mu.Unlock()
		if hold != nil {
			n.holding <- ip
			<-hold
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		if !n.up[ip] {
			return 0, errors.New("no echo reply within 1s")
		}
		return latency, nil
	}
}

// rig is a database with the nodes table (written by the test, as the
// node manager would) and the node health table with its prober.
type rig struct {
	db     *statedb.DB
	nodes  statedb.RWTable[*nodemanager.Peer]
	prober *Prober
	net    *fakeNet
	// written and deleted are what the prober reported, in order.
	mu      sync.Mutex
	written []string
	deleted []string
}

func newRig(t *testing.T, net *fakeNet) *rig {
	t.Helper()
	db := statedb.New()
	tables, err := nodemanager.NewTables(db)
	if err != nil {
		t.Fatal(err)
	}
	table, err := NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{db: db, nodes: tables.Nodes, net: net}
	r.prober = &Prober{DB: db, Table: table, Peers: tables.Nodes, ICMP: net.probe(time.Millisecond), HTTP: net.probe(2 * time.Millisecond),
		Timeout: time.Second, Now: time.Now, Log: hivetest.Logger(t),
		Written: func(written []*Status, deleted []string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, st := range written {
				r.written = append(r.written, st.Node)
			}
			r.deleted = append(r.deleted, deleted...)
		}}
	return r
}

func (r *rig) upsert(t *testing.T, name string, ips ...netip.Addr) {
	t.Helper()
	w := r.db.WriteTxn(r.nodes)
	if _, _, err := r.nodes.Insert(w, &nodemanager.Peer{Name: name, IPs: ips}); err != nil {
		t.Fatal(err)
	}
	w.Commit()
}

func (r *rig) remove(t *testing.T, name string) {
	t.Helper()
	w := r.db.WriteTxn(r.nodes)
	if _, _, err := r.nodes.Delete(w, &nodemanager.Peer{Name: name}); err != nil {
		t.Fatal(err)
	}
	w.Commit()
}

func (r *rig) status(name string) (*Status, bool) {
	st, _, ok := r.prober.Table.Get(r.db.ReadTxn(), StatusByNode.Query(name))
	return st, ok
}

func (r *rig) round(t *testing.T) {
	t.Helper()
	if err := r.prober.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
}

var (
	b1 = netip.MustParseAddr("192.0.2.11")
	b2 = netip.MustParseAddr("192.0.2.12")
	c1 = netip.MustParseAddr("192.0.2.21")
	d1 = netip.MustParseAddr("192.0.2.31")
)

// TestProbeRoundsFollowTheNodes: a node that stops answering is
// unreachable after the next round, with the probe's error, and
// reachable again after the round once it answers; each address is
// probed and recorded on its own; a node that leaves the nodes table
// loses its row.
func TestProbeRoundsFollowTheNodes(t *testing.T) {
	net := newFakeNet(b1, b2, c1)
	r := newRig(t, net)
	r.upsert(t, "node-b", b1, b2)
	r.upsert(t, "node-c", c1)
	r.round(t)

	st, ok := r.status("node-b")
	if !ok || !st.Reachable() || len(st.Addresses) != 2 {
		t.Fatalf("node-b after the first round: %+v (found %v), want reachable on 2 addresses", st, ok)
	}
	a := st.Addresses[0]
	if a.IP != b1 || !a.ICMP.Reachable || a.ICMP.Latency != time.Millisecond || a.HTTP.Latency != 2*time.Millisecond || a.ICMP.Probed.IsZero() {
		t.Fatalf("node-b primary: %+v", a)
	}

	// A secondary address down: recorded, the node still reachable.
	net.set(b2, false)
	r.round(t)
	st, _ = r.status("node-b")
	if !st.Reachable() || st.Addresses[1].ICMP.Reachable || st.Addresses[1].HTTP.Error == "" {
		t.Fatalf("node-b with its secondary address down: %+v", st)
	}

	// The primary down: unreachable, with the error.
	net.set(b1, false)
	r.round(t)
	st, _ = r.status("node-b")
	if st.Reachable() || st.Addresses[0].ICMP.Reachable || st.Addresses[0].HTTP.Reachable ||
		!strings.Contains(st.Addresses[0].ICMP.Error, "no echo reply") {
		t.Fatalf("node-b with its primary address down: %+v", st)
	}
	if c, _ := r.status("node-c"); !c.Reachable() {
		t.Fatalf("node-c follows node-b: %+v", c)
	}

	// Back: reachable at the next round, the error gone.
	net.set(b1, true)
	net.set(b2, true)
	r.round(t)
	st, _ = r.status("node-b")
	if !st.Reachable() || !st.Addresses[1].Reachable() || st.Addresses[0].ICMP.Error != "" {
		t.Fatalf("node-b answering again: %+v", st)
	}

	// node-c leaves: its row goes (Prune, at once) and stays gone.
	r.remove(t, "node-c")
	r.prober.Prune()
	if _, ok := r.status("node-c"); ok {
		t.Fatal("node-c's row outlived the node")
	}
	r.round(t)
	if _, ok := r.status("node-c"); ok {
		t.Fatal("a round wrote a row for a node that left")
	}
	if !slices.Equal(r.deleted, []string{"node-c"}) {
		t.Fatalf("deleted %v, want [node-c] once", r.deleted)
	}
}

// TestNodeLeavingDuringARound: a node deleted while its probes run gets
// no row from that round, and is not reported written (its metrics would
// be set for a node that is gone).
func TestNodeLeavingDuringARound(t *testing.T) {
	net := newFakeNet(b1, d1)
	hold := make(chan struct{})
	net.hold[d1] = hold
	r := newRig(t, net)
	r.upsert(t, "node-b", b1)
	r.upsert(t, "node-d", d1)
	done := make(chan error)
	go func() { done <- r.prober.Round(context.Background()) }()
	// node-d leaves only once the round has read it and its probe runs.
	<-net.holding
	r.remove(t, "node-d")
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, ok := r.status("node-d"); ok {
		t.Fatal("node-d got a row after it left")
	}
	r.mu.Lock()
	written := slices.Clone(r.written)
	r.mu.Unlock()
	if slices.Contains(written, "node-d") {
		t.Fatalf("reported written %v: node-d had left", written)
	}
	if st, ok := r.status("node-b"); !ok || !st.Reachable() {
		t.Fatalf("node-b: %+v (found %v)", st, ok)
	}
}

// TestRunProbesEveryIntervalAndPrunesAtOnce: the prober's loop probes at
// once and again every interval (a node that stops answering shows so),
// and a node leaving the nodes table loses its row without waiting for
// a round (the interval here is an hour).
func TestRunProbesEveryIntervalAndPrunesAtOnce(t *testing.T) {
	t.Run("interval", func(t *testing.T) {
		net := newFakeNet(b1)
		r := newRig(t, net)
		r.upsert(t, "node-b", b1)
		run(t, r, 20*time.Millisecond)
		reachable := func(want bool) func() bool {
			return func() bool { st, ok := r.status("node-b"); return ok && st.Reachable() == want }
		}
		tutil.Eventually(t, 10*time.Second, "node-b reachable", reachable(true))
		net.set(b1, false)
		tutil.Eventually(t, 10*time.Second, "node-b unreachable", reachable(false))
		net.set(b1, true)
		tutil.Eventually(t, 10*time.Second, "node-b reachable again", reachable(true))
	})
	t.Run("prune", func(t *testing.T) {
		net := newFakeNet(b1, c1)
		r := newRig(t, net)
		r.upsert(t, "node-b", b1)
		r.upsert(t, "node-c", c1)
		run(t, r, time.Hour)
		tutil.Eventually(t, 10*time.Second, "first round", func() bool { _, ok := r.status("node-c"); return ok })
		r.remove(t, "node-c")
		tutil.Eventually(t, 10*time.Second, "node-c's row deleted", func() bool { _, ok := r.status("node-c"); return !ok })
		if _, ok := r.status("node-b"); !ok {
			t.Fatal("node-b's row went with node-c's")
		}
	})
}

func run(t *testing.T, r *rig, interval time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.prober.Run(ctx, interval, health.NewRegistry().Scope("node-health")) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// TestMetricsFollowTheRounds: the connectivity gauges say 1 or 0 per
// node and probe type (the primary address), the latency only while it
// answers, and a node that left has no series.
func TestMetricsFollowTheRounds(t *testing.T) {
	net := newFakeNet(b1, c1)
	r := newRig(t, net)
	m := newConnectivityMetrics("node-a")
	r.prober.Written = m.update
	r.upsert(t, "node-b", b1)
	r.upsert(t, "node-c", c1)
	r.round(t)
	if got := testutil.ToFloat64(m.status.WithLabelValues("node-a", "node-b", "icmp", "node")); got != 1 {
		t.Fatalf("node-b icmp status %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.latency.WithLabelValues("node-a", "node-b", "http", "node")); got != 0.002 {
		t.Fatalf("node-b http latency %v, want 0.002", got)
	}
	net.set(b1, false)
	r.round(t)
	if got := testutil.ToFloat64(m.status.WithLabelValues("node-a", "node-b", "http", "node")); got != 0 {
		t.Fatalf("node-b http status %v while down, want 0", got)
	}
	if n := testutil.CollectAndCount(m.latency); n != 2 {
		t.Fatalf("%d latency series with node-b down, want node-c's 2", n)
	}
	r.remove(t, "node-c")
	r.round(t)
	if n := testutil.CollectAndCount(m.status); n != 2 {
		t.Fatalf("%d status series after node-c left, want node-b's 2", n)
	}
}

// TestNoProbeToNonUnicast: a node's address that is unspecified,
// multicast or the IPv4 broadcast is not probed (the probe functions
// never see it) and is recorded unreachable with the reason; the
// node's other addresses are probed.
func TestNoProbeToNonUnicast(t *testing.T) {
	bad := []netip.Addr{netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("224.0.0.1"),
		netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("ff02::1"), netip.MustParseAddr("::")}
	net := newFakeNet(b1)
	r := newRig(t, net)
	seen := map[netip.Addr]bool{}
	var mu sync.Mutex
	count := func(f ProbeFunc) ProbeFunc {
		return func(ctx context.Context, ip netip.Addr) (time.Duration, error) {
			mu.Lock()
			seen[ip] = true
			mu.Unlock()
			return f(ctx, ip)
		}
	}
	r.prober.ICMP, r.prober.HTTP = count(r.prober.ICMP), count(r.prober.HTTP)
	r.upsert(t, "node-x", append(bad, b1)...)
	r.round(t)
	st, _ := r.status("node-x")
	for i, ip := range bad {
		if seen[ip] {
			t.Errorf("%s probed", ip)
		}
		if a := st.Addresses[i]; a.ICMP.Reachable || !strings.Contains(a.ICMP.Error, "not probed") || a.HTTP.Error != a.ICMP.Error {
			t.Errorf("%s recorded as %+v", ip, a)
		}
	}
	if !seen[b1] || !st.Addresses[len(bad)].Reachable() {
		t.Fatalf("the node's unicast address: probed %v, %+v", seen[b1], st.Addresses[len(bad)])
	}
}

// TestHealthEndpointProbedInsideThePodCIDR: a node's published health
// endpoint address is probed beside its own when it lies in the node's
// accepted pod CIDR, shown as the endpoint's, and has its own series
// (address_type="endpoint"); it does not decide the node's reachability.
// One outside the pod CIDR (here: another node's address, which a node
// could publish to make every agent probe it) is never probed.
func TestHealthEndpointProbedInsideThePodCIDR(t *testing.T) {
	ep := netip.MustParseAddr("10.0.1.7")
	outside := c1
	net := newFakeNet(b1, ep, outside)
	r := newRig(t, net)
	m := newConnectivityMetrics("node-a")
	r.prober.Written = m.update
	seen := map[netip.Addr]bool{}
	var mu sync.Mutex
	count := func(f ProbeFunc) ProbeFunc {
		return func(ctx context.Context, ip netip.Addr) (time.Duration, error) {
			mu.Lock()
			seen[ip] = true
			mu.Unlock()
			return f(ctx, ip)
		}
	}
	r.prober.ICMP, r.prober.HTTP = count(r.prober.ICMP), count(r.prober.HTTP)
	w := r.db.WriteTxn(r.nodes)
	if _, _, err := r.nodes.Insert(w, &nodemanager.Peer{Name: "node-b", IPs: []netip.Addr{b1},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24")}, HealthIPs: []netip.Addr{outside, ep}}); err != nil {
		t.Fatal(err)
	}
	w.Commit()
	r.round(t)
	st, _ := r.status("node-b")
	if len(st.Addresses) != 2 || st.Addresses[0].IP != b1 || st.Addresses[0].HealthEndpoint ||
		st.Addresses[1].IP != ep || !st.Addresses[1].HealthEndpoint || !st.Addresses[1].Reachable() {
		t.Fatalf("addresses %+v, want the node's then its health endpoint's, reachable", st.Addresses)
	}
	if seen[outside] {
		t.Fatalf("%s (outside the pod CIDR) was probed", outside)
	}
	if got := testutil.ToFloat64(m.status.WithLabelValues("node-a", "node-b", "http", "endpoint")); got != 1 {
		t.Fatalf("endpoint http status %v, want 1", got)
	}
	net.set(ep, false)
	r.round(t)
	st, _ = r.status("node-b")
	if !st.Reachable() {
		t.Fatal("the node is unreachable with only its health endpoint down")
	}
	if got := testutil.ToFloat64(m.status.WithLabelValues("node-a", "node-b", "icmp", "endpoint")); got != 0 {
		t.Fatalf("endpoint icmp status %v while down, want 0", got)
	}
	if got := testutil.ToFloat64(m.status.WithLabelValues("node-a", "node-b", "icmp", "node")); got != 1 {
		t.Fatalf("node icmp status %v, want 1", got)
	}
}

// TestLocalHealthEndpointProbed: this node's own health endpoint gets a
// row of its own (named after this node, the endpoint's addresses only),
// probed each round, kept while the endpoint has an address whatever the
// nodes table holds, left out of the other nodes' count, and deleted once
// the endpoint has none.
func TestLocalHealthEndpointProbed(t *testing.T) {
	ep := netip.MustParseAddr("10.0.0.9")
	net := newFakeNet(b1, ep)
	r := newRig(t, net)
	var mu sync.Mutex
	local := []netip.Addr{ep}
	r.prober.Self = "node-a"
	r.prober.Local = func() []netip.Addr {
		mu.Lock()
		defer mu.Unlock()
		return local
	}
	r.upsert(t, "node-b", b1)
	r.round(t)
	st, ok := r.status("node-a")
	if !ok || len(st.Addresses) != 1 || st.Addresses[0].IP != ep || !st.Addresses[0].HealthEndpoint || !st.Addresses[0].Reachable() {
		t.Fatalf("this node's row %+v (%v), want its health endpoint %s, reachable", st, ok, ep)
	}
	if got := r.prober.summary(); got != "1/1 nodes reachable" {
		t.Fatalf("summary %q, want this node left out of the count", got)
	}
	// Pruning after a change of the nodes table keeps it.
	r.remove(t, "node-b")
	r.prober.Prune()
	if _, ok := r.status("node-a"); !ok {
		t.Fatal("pruning the nodes that left deleted this node's row")
	}
	net.set(ep, false)
	r.round(t)
	if st, _ := r.status("node-a"); st.Addresses[0].Reachable() {
		t.Fatal("the endpoint is down, its row says reachable")
	}
	if got := r.prober.summary(); !strings.Contains(got, "this node's health endpoint unreachable") {
		t.Fatalf("summary %q does not say the local endpoint is unreachable", got)
	}
	mu.Lock()
	local = nil
	mu.Unlock()
	r.round(t)
	if _, ok := r.status("node-a"); ok {
		t.Fatal("this node's row stays after its health endpoint went")
	}
	if !slices.Contains(r.deleted, "node-a") {
		t.Fatalf("deleted %v, want node-a reported (its metrics go)", r.deleted)
	}
}

// TestLocalEndpointInHealthAndStatus: GET /v1/health's body names this
// node's own endpoint as local (not among the other nodes), and the
// status section has a line for it, reachable or what failed.
func TestLocalEndpointInHealthAndStatus(t *testing.T) {
	ep := netip.MustParseAddr("10.0.0.9")
	net := newFakeNet(b1, ep)
	r := newRig(t, net)
	r.prober.Self, r.prober.Local = "node-a", func() []netip.Addr { return []netip.Addr{ep} }
	r.upsert(t, "node-b", b1)
	r.round(t)
	c := &Checker{cfg: DefaultConfig(), node: "node-a", db: r.db, table: r.prober.Table, peers: r.nodes, prober: r.prober}
	h := c.Health()
	if len(h.Nodes) != 1 || h.Nodes[0].Name != "node-b" {
		t.Fatalf("nodes %+v, want node-b alone", h.Nodes)
	}
	if h.Local == nil || !h.Local.Reachable || len(h.Local.Addresses) != 1 || h.Local.Addresses[0].IP != ep {
		t.Fatalf("local %+v, want the endpoint %s reachable", h.Local, ep)
	}
	line := func() string {
		for _, l := range c.StatusSection().Lines {
			if l.Key == "Local endpoint" {
				return l.Value
			}
		}
		return ""
	}
	if got := line(); got != ep.String()+" reachable" {
		t.Fatalf("status line %q", got)
	}
	net.set(ep, false)
	r.round(t)
	if got := line(); !strings.HasPrefix(got, "unreachable: 10.0.0.9 icmp: ") {
		t.Fatalf("status line %q, want what failed", got)
	}
	if h := c.Health(); h.Local == nil || h.Local.Reachable {
		t.Fatalf("local %+v, want unreachable", h.Local)
	}
}
