package loadbalancer

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/statedb"
)

func newTestWriter(t *testing.T) *Writer {
	t.Helper()
	db := statedb.New()
	tables, err := NewTables(db)
	if err != nil {
		t.Fatal(err)
	}
	return NewWriter(tables, "node-a")
}

func frontends(w *Writer) map[string]*Frontend {
	out := map[string]*Frontend{}
	for f := range w.t.Frontends.All(w.t.DB.ReadTxn()) {
		out[f.Key.String()] = f
	}
	return out
}

func be(addr string, ready, serving, terminating bool, node string) *Backend {
	return &Backend{Addr: netip.MustParseAddrPort(addr), Proto: TCP, PortName: "http", Ready: ready, Serving: serving, Terminating: terminating, NodeName: node}
}

func active(f *Frontend) []string {
	var out []string
	for _, b := range f.Backends {
		if b.Active {
			out = append(out, b.Addr.String())
		}
	}
	return out
}

// TestWriterFrontends: frontends follow the service and its backends;
// terminating backends fill the slots only when none is ready; Local
// keeps only this node's; families do not mix; deleting the service
// removes its frontends.
func TestWriterFrontends(t *testing.T) {
	w := newTestWriter(t)
	name := ServiceName{Namespace: "ns", Name: "web"}
	svc := &Service{Name: name, Type: "ClusterIP",
		Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")},
		Ports:     []ServicePort{{Name: "http", Port: 80, Proto: TCP}, {Name: "dns", Port: 53, Proto: UDP}}}
	if err := w.UpsertService(svc); err != nil {
		t.Fatal(err)
	}
	fs := frontends(w)
	if len(fs) != 4 {
		t.Fatalf("want 4 frontends (2 addresses x 2 ports), got %v", fs)
	}
	if err := w.SetBackends(name, "s1", []*Backend{
		be("10.0.0.2:8080", true, true, false, "node-a"), be("10.0.0.1:8080", true, true, false, "node-b"),
		be("10.0.0.3:8080", false, true, true, "node-a"), be("[fd00::1]:8080", true, true, false, "node-a"),
		be("10.0.0.4:8080", false, false, false, "node-a"),
	}); err != nil {
		t.Fatal(err)
	}
	f := frontends(w)["10.96.0.10:80/TCP"]
	if got := active(f); len(got) != 2 || got[0] != "10.0.0.1:8080" || got[1] != "10.0.0.2:8080" {
		t.Fatalf("active backends %v, want the two ready IPv4 ones sorted", got)
	}
	if len(f.Backends) != 3 || !f.Backends[2].Terminating || f.Backends[2].Active {
		t.Fatalf("the terminating backend should be listed, inactive: %+v", f.Backends)
	}
	if got := active(frontends(w)["[fd00:96::10]:80/TCP"]); len(got) != 1 || got[0] != "[fd00::1]:8080" {
		t.Fatalf("IPv6 frontend's backends %v", got)
	}
	if n := len(frontends(w)["10.96.0.10:53/UDP"].Backends); n != 0 {
		t.Fatalf("UDP port has %d backends, none listed for it", n)
	}
	// No ready backend left: the terminating one that still serves takes
	// the slots.
	if err := w.SetBackends(name, "s1", []*Backend{be("10.0.0.3:8080", false, true, true, "node-a"), be("10.0.0.5:8080", false, false, true, "node-a")}); err != nil {
		t.Fatal(err)
	}
	if got := active(frontends(w)["10.96.0.10:80/TCP"]); len(got) != 1 || got[0] != "10.0.0.3:8080" {
		t.Fatalf("fallback backends %v, want the serving terminating one", got)
	}
	// internalTrafficPolicy Local.
	local := *svc
	local.InternalTrafficPolicy = TrafficPolicyLocal
	if err := w.UpsertService(&local); err != nil {
		t.Fatal(err)
	}
	if err := w.SetBackends(name, "s1", []*Backend{be("10.0.0.2:8080", true, true, false, "node-a"), be("10.0.0.1:8080", true, true, false, "node-b")}); err != nil {
		t.Fatal(err)
	}
	if got := active(frontends(w)["10.96.0.10:80/TCP"]); len(got) != 1 || got[0] != "10.0.0.2:8080" {
		t.Fatalf("Local backends %v, want only node-a's", got)
	}
	// An unchanged recompute does not rewrite the frontend.
	rtxn := w.t.DB.ReadTxn()
	_, rev1, _ := w.t.Frontends.Get(rtxn, FrontendByKey.Query(f.Key))
	again := local
	if err := w.UpsertService(&again); err != nil {
		t.Fatal(err)
	}
	_, rev2, _ := w.t.Frontends.Get(w.t.DB.ReadTxn(), FrontendByKey.Query(f.Key))
	if rev1 != rev2 {
		t.Fatalf("unchanged frontend rewritten (revision %d -> %d)", rev1, rev2)
	}
	if err := w.DeleteService(name); err != nil {
		t.Fatal(err)
	}
	if fs := frontends(w); len(fs) != 0 {
		t.Fatalf("frontends left after the service's deletion: %v", fs)
	}
}

func listed(f *Frontend) []string {
	var out []string
	for _, b := range f.Backends {
		out = append(out, b.Addr.String())
	}
	return out
}

// TestWriterTopologyHints: the ready backends hinted for this node's zone
// fill the slots and the others stay listed out of them; every ready
// backend is used when the node has no zone, when one ready backend has
// no hint, or when none is hinted for this zone; a zone label arriving
// later recomputes the frontends. As kube-proxy, the hints are followed
// whether or not the Service sets trafficDistribution (topology-mode
// Auto has hints and no trafficDistribution), node hints before zone
// hints, and not for internalTrafficPolicy Local.
func TestWriterTopologyHints(t *testing.T) {
	w := newTestWriter(t)
	name := ServiceName{Namespace: "ns", Name: "web"}
	svc := &Service{Name: name, Type: "ClusterIP", Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports: []ServicePort{{Name: "http", Port: 80, Proto: TCP}}, TrafficDistribution: "PreferClose"}
	if err := w.UpsertService(svc); err != nil {
		t.Fatal(err)
	}
	hinted := func(addr string, zones ...string) *Backend {
		b := be(addr, true, true, false, "n")
		b.Hints = &Hints{ForZones: zones}
		return b
	}
	set := func(bs ...*Backend) {
		t.Helper()
		if err := w.SetBackends(name, "s1", bs); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, wantActive, wantListed string) {
		t.Helper()
		f := frontends(w)["10.96.0.10:80/TCP"]
		if got := fmt.Sprint(active(f)); got != wantActive {
			t.Errorf("%s: active %s, want %s", what, got, wantActive)
		}
		if got := fmt.Sprint(listed(f)); got != wantListed {
			t.Errorf("%s: listed %s, want %s", what, got, wantListed)
		}
	}
	set(hinted("10.0.0.1:8080", "z1"), hinted("10.0.0.2:8080", "z2"), hinted("10.0.0.3:8080", "z1", "z3"))
	all := "[10.0.0.1:8080 10.0.0.2:8080 10.0.0.3:8080]"
	check("node without zone", all, all)
	if err := w.SetNodeZone("z1"); err != nil {
		t.Fatal(err)
	}
	check("zone z1", "[10.0.0.1:8080 10.0.0.3:8080]", "[10.0.0.1:8080 10.0.0.3:8080 10.0.0.2:8080]")
	if err := w.SetNodeZone("z3"); err != nil {
		t.Fatal(err)
	}
	check("zone z3", "[10.0.0.3:8080]", "[10.0.0.3:8080 10.0.0.1:8080 10.0.0.2:8080]")
	if err := w.SetNodeZone("z9"); err != nil {
		t.Fatal(err)
	}
	check("no backend hinted for z9", all, all)
	if err := w.SetNodeZone("z1"); err != nil {
		t.Fatal(err)
	}
	set(hinted("10.0.0.1:8080", "z1"), hinted("10.0.0.2:8080"), hinted("10.0.0.3:8080", "z1", "z3"))
	check("a ready backend without hints", all, all)
	// Not ready backends' hints do not matter; terminating ones drain.
	term := hinted("10.0.0.4:8080")
	term.Ready, term.Terminating = false, true
	set(hinted("10.0.0.1:8080", "z1"), hinted("10.0.0.2:8080", "z2"), term)
	check("zone z1 with a terminating backend", "[10.0.0.1:8080]", "[10.0.0.1:8080 10.0.0.2:8080 10.0.0.4:8080]")
	svc2 := *svc
	svc2.TrafficDistribution = ""
	if err := w.UpsertService(&svc2); err != nil {
		t.Fatal(err)
	}
	check("service without trafficDistribution", "[10.0.0.1:8080]", "[10.0.0.1:8080 10.0.0.2:8080 10.0.0.4:8080]")
	// Node hints (PreferSameNode): this node's backend, wherever the
	// zone hints point.
	onNode := func(addr, node string, zones ...string) *Backend {
		b := hinted(addr, zones...)
		b.Hints.ForNodes = []string{node}
		return b
	}
	set(onNode("10.0.0.1:8080", "node-b", "z1"), onNode("10.0.0.2:8080", "node-a", "z2"))
	check("node hints", "[10.0.0.2:8080]", "[10.0.0.2:8080 10.0.0.1:8080]")
	set(onNode("10.0.0.1:8080", "node-b", "z1"), onNode("10.0.0.2:8080", "node-c", "z2"))
	check("node hints for other nodes: zone hints", "[10.0.0.1:8080]", "[10.0.0.1:8080 10.0.0.2:8080]")
	set(onNode("10.0.0.1:8080", "node-b", "z1"), hinted("10.0.0.2:8080", "z2"), onNode("10.0.0.3:8080", "node-a", "z2"))
	check("a backend without node hints: zone hints", "[10.0.0.1:8080]", "[10.0.0.1:8080 10.0.0.2:8080 10.0.0.3:8080]")
	// internalTrafficPolicy Local: this node's ready backends, no
	// topology (kube-proxy's local endpoints).
	local := func(addr string, zones ...string) *Backend {
		b := hinted(addr, zones...)
		b.NodeName = "node-a"
		return b
	}
	svc3 := svc2
	svc3.InternalTrafficPolicy = TrafficPolicyLocal
	if err := w.UpsertService(&svc3); err != nil {
		t.Fatal(err)
	}
	set(local("10.0.0.1:8080", "z1"), local("10.0.0.2:8080", "z2"), hinted("10.0.0.3:8080", "z1"))
	check("internalTrafficPolicy Local", "[10.0.0.1:8080 10.0.0.2:8080]", "[10.0.0.1:8080 10.0.0.2:8080]")
}

// BenchmarkWriterInitialSync: what the Kubernetes source does at the
// initial sync for 10,000 services of 10 backends: a Service and an
// EndpointSlice per service, one write transaction each (as every change
// after the sync) or in batches of 1,000 events (the initial listing).
func BenchmarkWriterInitialSync(b *testing.B) {
	const services = 10000
	for _, batch := range []int{1, 1000} {
		b.Run(fmt.Sprintf("events-per-txn-%d", batch), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				db := statedb.New()
				tables, err := NewTables(db)
				if err != nil {
					b.Fatal(err)
				}
				w := NewWriter(tables, "node")
				var ops []func(*Batch) error
				ip := netip.MustParseAddr("10.96.0.1")
				for s := 0; s < services; s++ {
					name := ServiceName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", s)}
					svc := &Service{Name: name, Type: "ClusterIP", Addresses: []netip.Addr{ip}, Ports: []ServicePort{{Name: "http", Port: 80, Proto: TCP}}}
					var backends []*Backend
					for j := 0; j < 10; j++ {
						backends = append(backends, &Backend{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(1 + j)}), 8080),
							Proto: TCP, PortName: "http", NodeName: "node", Ready: true, Serving: true})
					}
					ops = append(ops, func(b *Batch) error { return b.UpsertService(svc) },
						func(b *Batch) error { return b.SetBackends(name, "slice-1", backends) })
					ip = ip.Next()
				}
				for len(ops) > 0 {
					n := min(batch, len(ops))
					if err := w.Batch(func(bt *Batch) error {
						for _, o := range ops[:n] {
							if err := o(bt); err != nil {
								return err
							}
						}
						return nil
					}); err != nil {
						b.Fatal(err)
					}
					ops = ops[n:]
				}
				if n := tables.Frontends.NumObjects(db.ReadTxn()); n != services {
					b.Fatalf("%d frontends, want %d", n, services)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/10k-services")
		})
	}
}

// TestWriterNodePortsExternalAndLBAddresses: a LoadBalancer service gets a
// frontend per port on its cluster IP, on each of this node's addresses
// (its node port; only once the node's addresses are known, and following
// them), on its external IPs and on its load-balancer addresses (with the
// source ranges); in-cluster backends follow internalTrafficPolicy on all
// of them, externalTrafficPolicy is recorded for outside clients.
func TestWriterNodePortsExternalAndLBAddresses(t *testing.T) {
	w := newTestWriter(t)
	name := ServiceName{Namespace: "ns", Name: "web"}
	svc := &Service{Name: name, Type: "LoadBalancer", Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:                 []ServicePort{{Name: "http", Port: 80, Proto: TCP, NodePort: 30080}},
		ExternalIPs:           []netip.Addr{netip.MustParseAddr("198.51.100.7")},
		LoadBalancerIPs:       []netip.Addr{netip.MustParseAddr("198.51.100.50")},
		SourceRanges:          []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		ExternalTrafficPolicy: TrafficPolicyLocal, InternalTrafficPolicy: TrafficPolicyCluster}
	if err := w.UpsertService(svc); err != nil {
		t.Fatal(err)
	}
	if err := w.SetBackends(name, "s1", []*Backend{be("10.0.0.1:8080", true, true, false, "node-a"), be("10.0.1.1:8080", true, true, false, "node-b")}); err != nil {
		t.Fatal(err)
	}
	types := func() map[string]string {
		out := map[string]string{}
		for k, f := range frontends(w) {
			out[k] = f.Type
		}
		return out
	}
	if got := types(); len(got) != 3 || got["10.96.0.10:80/TCP"] != FrontendClusterIP || got["198.51.100.7:80/TCP"] != FrontendExternalIP ||
		got["198.51.100.50:80/TCP"] != FrontendLoadBalancer {
		t.Fatalf("before the node's addresses are known: %v", got)
	}
	if err := w.SetNodeAddresses([]netip.Addr{netip.MustParseAddr("172.30.0.11"), netip.MustParseAddr("fd30::11")}); err != nil {
		t.Fatal(err)
	}
	fs := frontends(w)
	np, ok := fs["172.30.0.11:30080/TCP"]
	if !ok || np.Type != FrontendNodePort || np.ExternalTrafficPolicy != TrafficPolicyLocal {
		t.Fatalf("node port frontend: %+v in %v", np, types())
	}
	if got := active(np); len(got) != 2 {
		t.Fatalf("in-cluster clients of the node port reach every backend (internalTrafficPolicy Cluster), got %v", got)
	}
	if n := len(fs["[fd30::11]:30080/TCP"].Backends); n != 0 {
		t.Fatalf("the IPv6 node address has %d IPv4 backends", n)
	}
	if lb := fs["198.51.100.50:80/TCP"]; len(lb.SourceRanges) != 1 || lb.ExternalTrafficPolicy != TrafficPolicyLocal {
		t.Fatalf("load-balancer frontend %+v", lb)
	}
	if fs["10.96.0.10:80/TCP"].ExternalTrafficPolicy != "" || fs["198.51.100.7:80/TCP"].SourceRanges != nil {
		t.Fatalf("cluster IP / external IP frontends carry external options: %+v %+v", fs["10.96.0.10:80/TCP"], fs["198.51.100.7:80/TCP"])
	}
	// The node's address changes: the node port follows.
	if err := w.SetNodeAddresses([]netip.Addr{netip.MustParseAddr("172.30.0.21")}); err != nil {
		t.Fatal(err)
	}
	fs = frontends(w)
	if _, ok := fs["172.30.0.11:30080/TCP"]; ok {
		t.Fatal("the old node address keeps its node port")
	}
	if _, ok := fs["172.30.0.21:30080/TCP"]; !ok {
		t.Fatalf("the new node address has no node port: %v", types())
	}
	// Type ClusterIP again: only the cluster IP stays.
	svc2 := *svc
	svc2.Type, svc2.Ports, svc2.ExternalIPs, svc2.LoadBalancerIPs = "ClusterIP", []ServicePort{{Name: "http", Port: 80, Proto: TCP}}, nil, nil
	if err := w.UpsertService(&svc2); err != nil {
		t.Fatal(err)
	}
	if got := types(); len(got) != 1 {
		t.Fatalf("after the change to ClusterIP: %v", got)
	}
}

// TestWriterDualStackExternal: a dual-stack LoadBalancer service gets a
// node port on each of the node's IPv4 and IPv6 addresses, each with the
// backends of its family, and each load-balancer address the source
// ranges of its own family (none: open to that family's clients).
func TestWriterDualStackExternal(t *testing.T) {
	w := newTestWriter(t)
	name := ServiceName{Namespace: "ns", Name: "web"}
	svc := &Service{Name: name, Type: "LoadBalancer", Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd96::10")},
		Ports:                 []ServicePort{{Name: "http", Port: 80, Proto: TCP, NodePort: 30080}},
		LoadBalancerIPs:       []netip.Addr{netip.MustParseAddr("198.51.100.50"), netip.MustParseAddr("2001:db8:5::50"), netip.MustParseAddr("2001:db8:5::51")},
		SourceRanges:          []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:1::/48")},
		ExternalTrafficPolicy: TrafficPolicyCluster, InternalTrafficPolicy: TrafficPolicyCluster}
	if err := w.UpsertService(svc); err != nil {
		t.Fatal(err)
	}
	if err := w.SetBackends(name, "s1", []*Backend{be("10.0.0.1:8080", true, true, false, "node-a"), be("[fd00:10::1]:8080", true, true, false, "node-a")}); err != nil {
		t.Fatal(err)
	}
	if err := w.SetNodeAddresses([]netip.Addr{netip.MustParseAddr("172.30.0.11"), netip.MustParseAddr("fd30::11")}); err != nil {
		t.Fatal(err)
	}
	fs := frontends(w)
	for key, want := range map[string]string{"172.30.0.11:30080/TCP": "10.0.0.1:8080", "[fd30::11]:30080/TCP": "[fd00:10::1]:8080"} {
		f, ok := fs[key]
		if !ok || f.Type != FrontendNodePort {
			t.Fatalf("node port %s: %+v", key, f)
		}
		if got := active(f); len(got) != 1 || got[0] != want {
			t.Fatalf("node port %s backends %v, want %s", key, got, want)
		}
	}
	for key, want := range map[string]string{"198.51.100.50:80/TCP": "198.51.100.0/24", "[2001:db8:5::50]:80/TCP": "2001:db8:1::/48"} {
		if rs := fs[key].SourceRanges; len(rs) != 1 || rs[0].String() != want {
			t.Fatalf("load-balancer address %s ranges %v, want only %s", key, rs, want)
		}
	}
	// Only IPv4 ranges: the IPv6 address admits every IPv6 client.
	svc2 := *svc
	svc2.SourceRanges = svc.SourceRanges[:1]
	if err := w.UpsertService(&svc2); err != nil {
		t.Fatal(err)
	}
	if rs := frontends(w)["[2001:db8:5::51]:80/TCP"].SourceRanges; len(rs) != 0 {
		t.Fatalf("IPv6 address with IPv4 ranges only: %v, want none", rs)
	}
}

// TestWriterExternalIPHandOver: two services name the same external IP and
// port: the first keeps it, and the second gets it when the first lets go.
func TestWriterExternalIPHandOver(t *testing.T) {
	w := newTestWriter(t)
	ext := []netip.Addr{netip.MustParseAddr("198.51.100.7")}
	a := &Service{Name: ServiceName{"ns", "a"}, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		Ports: []ServicePort{{Name: "http", Port: 80, Proto: TCP}}, ExternalIPs: ext}
	b := &Service{Name: ServiceName{"ns", "b"}, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.2")},
		Ports: []ServicePort{{Name: "http", Port: 80, Proto: TCP}}, ExternalIPs: ext}
	for _, s := range []*Service{a, b} {
		if err := w.UpsertService(s); err != nil {
			t.Fatal(err)
		}
	}
	if got := frontends(w)["198.51.100.7:80/TCP"]; got == nil || got.Service != a.Name {
		t.Fatalf("the external IP should stay with the first service: %+v", got)
	}
	if err := w.DeleteService(a.Name); err != nil {
		t.Fatal(err)
	}
	if got := frontends(w)["198.51.100.7:80/TCP"]; got == nil || got.Service != b.Name {
		t.Fatalf("the external IP should pass to the second service: %+v", got)
	}
	if n := len(frontends(w)); n != 2 {
		t.Fatalf("want b's cluster IP and the external IP, got %d frontends", n)
	}
}

// TestWriterExternalIPHandOverThree: three services name one external IP
// and port: it passes down the line as each holder lets go.
func TestWriterExternalIPHandOverThree(t *testing.T) {
	w := newTestWriter(t)
	ext := []netip.Addr{netip.MustParseAddr("198.51.100.7")}
	var names []ServiceName
	for i, n := range []string{"a", "b", "c"} {
		s := &Service{Name: ServiceName{"ns", n}, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)})},
			Ports: []ServicePort{{Name: "http", Port: 80, Proto: TCP}}, ExternalIPs: ext}
		if err := w.UpsertService(s); err != nil {
			t.Fatal(err)
		}
		names = append(names, s.Name)
	}
	for i, n := range names {
		if got := frontends(w)["198.51.100.7:80/TCP"]; got == nil || got.Service != n {
			t.Fatalf("the external IP should be %s's: %+v", n, got)
		}
		if err := w.DeleteService(n); err != nil {
			t.Fatal(err)
		}
		// The others' cluster IPs and, while one is left, the external IP.
		want := len(names) - i - 1
		if want > 0 {
			want++
		}
		if got := len(frontends(w)); got != want {
			t.Fatalf("after deleting %s: %d frontends, want %d", n, got, want)
		}
	}
}

// TestWriterClusterIPBeatsExternalIP: a Service whose externalIPs name
// another Service's cluster IP and port (kube-dns's) never takes it,
// whatever order the two come in and however old it is. Before, the one
// seen first kept the address: after a restart, a listing sorted by
// namespace gave "default/evil" every pod's DNS on the node.
func TestWriterClusterIPBeatsExternalIP(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	dnsIP := netip.MustParseAddr("10.96.0.10")
	dns := &Service{Name: ServiceName{"kube-system", "kube-dns"}, Addresses: []netip.Addr{dnsIP}, Created: t0.Add(time.Hour),
		Ports: []ServicePort{{Name: "dns", Port: 53, Proto: UDP}}}
	evil := &Service{Name: ServiceName{"default", "evil"}, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.99")}, Created: t0,
		Ports: []ServicePort{{Name: "dns", Port: 53, Proto: UDP}}, ExternalIPs: []netip.Addr{dnsIP}}
	for _, order := range [][]*Service{{evil, dns}, {dns, evil}} {
		w := newTestWriter(t)
		for _, s := range order {
			if err := w.UpsertService(s); err != nil {
				t.Fatal(err)
			}
		}
		if got := frontends(w)["10.96.0.10:53/UDP"]; got == nil || got.Service != dns.Name || got.Type != FrontendClusterIP {
			t.Fatalf("%s first: the cluster IP is %+v, want kube-dns's", order[0].Name, got)
		}
		// evil again (a resync, an update) does not take it either.
		again := *evil
		if err := w.UpsertService(&again); err != nil {
			t.Fatal(err)
		}
		if got := frontends(w)["10.96.0.10:53/UDP"]; got.Service != dns.Name {
			t.Fatalf("%s first, evil updated: the cluster IP is %s's", order[0].Name, got.Service)
		}
	}
}

// TestWriterOlderServiceKeepsExternalIP: of two services naming one
// external IP and port, the older holds it whatever order they come in;
// a load-balancer address beats an external IP; the holder letting go
// hands it to the strongest of the rest.
func TestWriterOlderServiceKeepsExternalIP(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	addr := netip.MustParseAddr("198.51.100.7")
	mk := func(name string, age time.Duration, i byte) *Service {
		return &Service{Name: ServiceName{"ns", name}, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, i})}, Created: t0.Add(age),
			Ports: []ServicePort{{Name: "http", Port: 80, Proto: TCP}}, ExternalIPs: []netip.Addr{addr}}
	}
	older, newer := mk("zz-older", 0, 1), mk("aa-newer", time.Hour, 2)
	lb := mk("lb", 2*time.Hour, 3)
	lb.ExternalIPs, lb.LoadBalancerIPs = nil, []netip.Addr{addr}
	for _, order := range [][]*Service{{newer, older, lb}, {lb, older, newer}, {older, lb, newer}} {
		w := newTestWriter(t)
		for _, s := range order[:2] {
			if err := w.UpsertService(s); err != nil {
				t.Fatal(err)
			}
		}
		holder := func() ServiceName { return frontends(w)["198.51.100.7:80/TCP"].Service }
		if order[0] != lb && order[1] != lb {
			if got := holder(); got != older.Name {
				t.Fatalf("order %s, %s: the external IP is %s's, want the older's", order[0].Name, order[1].Name, got)
			}
		}
		if err := w.UpsertService(order[2]); err != nil {
			t.Fatal(err)
		}
		if got := holder(); got != lb.Name {
			t.Fatalf("order %s, %s, %s: the address is %s's, want the load-balancer's", order[0].Name, order[1].Name, order[2].Name, got)
		}
		if err := w.DeleteService(lb.Name); err != nil {
			t.Fatal(err)
		}
		if got := holder(); got != older.Name {
			t.Fatalf("after the load balancer went: %s's, want the older's", got)
		}
		if err := w.DeleteService(older.Name); err != nil {
			t.Fatal(err)
		}
		if got := holder(); got != newer.Name {
			t.Fatalf("after the older went: %s's, want the newer's", got)
		}
	}
}

// TestWriterUnservableExternalAddresses: loopback, unspecified, multicast
// and link-local external or load-balancer addresses are no frontend (a
// loopback one would send every connect() to 127.0.0.1 on the port, by
// any process of the node, to the service).
func TestWriterUnservableExternalAddresses(t *testing.T) {
	w := newTestWriter(t)
	bad := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"), netip.MustParseAddr("0.0.0.0"),
		netip.MustParseAddr("224.0.0.5"), netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("fe80::1")}
	svc := &Service{Name: ServiceName{"ns", "s"}, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.5")},
		Ports:       []ServicePort{{Name: "http", Port: 80, Proto: TCP}},
		ExternalIPs: append(slices.Clone(bad), netip.MustParseAddr("198.51.100.9")), LoadBalancerIPs: bad}
	if err := w.UpsertService(svc); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range frontends(w) {
		got = append(got, k)
	}
	slices.Sort(got)
	if want := "[10.96.0.5:80/TCP 198.51.100.9:80/TCP]"; fmt.Sprint(got) != want {
		t.Fatalf("frontends %v, want %s", got, want)
	}
}
