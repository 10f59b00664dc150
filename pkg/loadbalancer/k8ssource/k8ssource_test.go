package k8ssource

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cilium/statedb"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/k8scache"
)

func TestServiceFrom(t *testing.T) {
	local := corev1.ServiceInternalTrafficPolicyLocal
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Annotations: map[string]string{AnnotationLBAlgorithm: "Maglev"}},
		Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.10", "fd00::10"}, Type: corev1.ServiceTypeClusterIP,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}},
			SessionAffinity:       corev1.ServiceAffinityClientIP,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](30)}},
			InternalTrafficPolicy: &local}}
	got, ok, err := ServiceFrom(s, false)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if len(got.Addresses) != 2 || got.Addresses[1] != netip.MustParseAddr("fd00::10") || !got.Affinity || got.AffinityTimeout != 30 ||
		got.InternalTrafficPolicy != loadbalancer.TrafficPolicyLocal || !got.Maglev ||
		got.Ports[0] != (loadbalancer.ServicePort{Name: "http", Port: 80, Proto: loadbalancer.TCP}) || got.Ports[1].Proto != loadbalancer.UDP {
		t.Fatalf("converted %+v", got)
	}
	// Default affinity timeout; the node's default algorithm.
	s.Spec.SessionAffinityConfig = nil
	delete(s.Annotations, AnnotationLBAlgorithm)
	got, _, _ = ServiceFrom(s, true)
	if got.AffinityTimeout != 10800 || !got.Maglev {
		t.Fatalf("defaults %+v", got)
	}
	for name, spec := range map[string]corev1.ServiceSpec{
		"headless":     {ClusterIP: corev1.ClusterIPNone, ClusterIPs: []string{corev1.ClusterIPNone}},
		"externalname": {Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"},
	} {
		if _, ok, err := ServiceFrom(&corev1.Service{Spec: spec}, false); ok || err != nil {
			t.Errorf("%s: ok %v err %v, want skipped", name, ok, err)
		}
	}
}

// TestSourceTopologyHints: trafficDistribution and the EndpointSlice zone
// and node hints reach the tables; this node's zone label (not another
// node's) selects the hinted backends, for a Service without
// trafficDistribution too (kube-proxy follows the hints alone); the
// frontends table is initialized only once services, EndpointSlices and
// nodes have all synced.
func TestSourceTopologyHints(t *testing.T) {
	tables, err := loadbalancer.NewTables(statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	w := loadbalancer.NewWriter(tables, "node-a")
	src := NewSource(w, false, slog.New(slog.DiscardHandler))
	initialized := func() bool {
		ok, _ := tables.Frontends.Initialized(tables.DB.ReadTxn())
		return ok
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Name: "http", Port: 80}},
			TrafficDistribution: ptr.To(corev1.ServiceTrafficDistributionPreferClose)}}
	if s, _, _ := ServiceFrom(svc, false); s.TrafficDistribution != corev1.ServiceTrafficDistributionPreferClose {
		t.Fatalf("trafficDistribution: %+v", s)
	}
	svc.Spec.TrafficDistribution = nil
	hint := func(ip string, zones ...string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{ip}, Hints: &discoveryv1.EndpointHints{}}
		for _, z := range zones {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
		return e
	}
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{hint("10.0.0.1", "z1"), hint("10.0.0.2", "z2")},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}}
	onService(src, watchers.Event[*corev1.Service]{Kind: watchers.Upsert, Key: "ns/web", Object: svc})
	src.OnEndpointSlice(watchers.Event[*k8scache.Slice]{Kind: watchers.Upsert, Key: "ns/web-1", Object: k8scache.SliceFrom(es)})
	onService(src, watchers.Event[*corev1.Service]{Kind: watchers.Synced})
	src.OnEndpointSlice(watchers.Event[*k8scache.Slice]{Kind: watchers.Synced})
	if initialized() {
		t.Fatal("initialized before the nodes synced")
	}
	node := func(name, zone string) watchers.Event[*corev1.Node] {
		return watchers.Event[*corev1.Node]{Kind: watchers.Upsert, Key: name,
			Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: zone}}}}
	}
	activeOf := func() []string {
		var out []string
		for f := range tables.Frontends.All(tables.DB.ReadTxn()) {
			for _, b := range f.Backends {
				if b.Active {
					out = append(out, b.Addr.String())
				}
			}
		}
		return out
	}
	src.OnNode(node("node-b", "z2"))
	if got := activeOf(); len(got) != 2 {
		t.Fatalf("another node's zone changed the selection: %v", got)
	}
	src.OnNode(node("node-a", "z2"))
	src.OnNode(watchers.Event[*corev1.Node]{Kind: watchers.Synced})
	src.OnTendrilNode(watchers.Event[*v1alpha1.TendrilNode]{Kind: watchers.Synced})
	if initialized() {
		t.Fatal("initialized before this node's pods synced")
	}
	src.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Synced})
	if !initialized() {
		t.Fatal("not initialized after every source synced")
	}
	if got := activeOf(); len(got) != 1 || got[0] != "10.0.0.2:8080" {
		t.Fatalf("node-a in z2: active %v, want 10.0.0.2:8080", got)
	}
}

// syncedSource is a source over fresh tables whose kinds have all synced
// with services svc-0..n-1 (10.96.x.y:80, a slice of ten backends each).
func syncedSource(t testing.TB, n int) (*Source, *loadbalancer.Tables) {
	tables, err := loadbalancer.NewTables(statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	src := NewSource(loadbalancer.NewWriter(tables, "node-a"), false, slog.New(slog.DiscardHandler))
	for i := 0; i < n; i++ {
		onService(src, serviceEvent(i))
		src.OnEndpointSlice(sliceEvent(i, 1))
	}
	onService(src, watchers.Event[*corev1.Service]{Kind: watchers.Synced})
	src.OnEndpointSlice(watchers.Event[*k8scache.Slice]{Kind: watchers.Synced})
	src.OnNode(watchers.Event[*corev1.Node]{Kind: watchers.Synced})
	src.OnTendrilNode(watchers.Event[*v1alpha1.TendrilNode]{Kind: watchers.Synced})
	src.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Synced})
	return src, tables
}

func serviceEvent(i int) watchers.Event[*corev1.Service] {
	name := fmt.Sprintf("svc-%d", i)
	return watchers.Event[*corev1.Service]{Kind: watchers.Upsert, Key: "ns/" + name, Object: &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250),
			Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}}
}

// sliceEvent is service i's slice with ten backends 10.244.<gen>.1..10.
func sliceEvent(i, gen int) watchers.Event[*k8scache.Slice] {
	name := fmt.Sprintf("svc-%d", i)
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name + "-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}}
	for j := 1; j <= 10; j++ {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", gen, j)}})
	}
	return watchers.Event[*k8scache.Slice]{Kind: watchers.Upsert, Key: "ns/" + es.Name, Object: k8scache.SliceFrom(es)}
}

func frontendBackends(t testing.TB, tables *loadbalancer.Tables, ip string) []string {
	t.Helper()
	var out []string
	for f := range tables.Frontends.All(tables.DB.ReadTxn()) {
		if f.Key.Addr.Addr().String() == ip {
			for _, b := range f.Backends {
				out = append(out, b.Addr.String())
			}
		}
	}
	return out
}

// TestSourceChangesAfterSync: changes after the initial listing are
// written in order: the last event of a key wins, a delete after an
// upsert leaves nothing.
func TestSourceChangesAfterSync(t *testing.T) {
	src, tables := syncedSource(t, 20)
	if got := frontendBackends(t, tables, "10.96.0.1"); len(got) != 10 || got[0] != "10.244.1.1:8080" {
		t.Fatalf("initial listing: %v", got)
	}
	for gen := 2; gen <= 50; gen++ {
		for i := 0; i < 20; i++ {
			src.OnEndpointSlice(sliceEvent(i, gen))
		}
	}
	del := serviceEvent(5)
	del.Kind = watchers.Delete
	onService(src, serviceEvent(5))
	onService(src, del)
	for i := 0; i < 20; i++ {
		ip := fmt.Sprintf("10.96.0.%d", 1+i)
		got := frontendBackends(t, tables, ip)
		if i == 5 {
			if len(got) != 0 {
				t.Errorf("deleted service %s still has a frontend: %v", ip, got)
			}
			continue
		}
		if len(got) != 10 || got[0] != "10.244.50.1:8080" {
			t.Errorf("service %s: backends %v, want the last generation's", ip, got)
		}
	}
	if n := tables.Frontends.NumObjects(tables.DB.ReadTxn()); n != 19 {
		t.Errorf("%d frontends, want 19", n)
	}
}

// BenchmarkSourceBurstAfterSync: 1,000 EndpointSlice changes arriving back
// to back after the sync, with 10,000 services of 10 backends in the
// tables, each written in its own transaction (as the source does after
// the sync): the cost per change of the tables (docs/benchmarks.md: the
// transaction is a small part of it; batching them did not measurably
// help).
func BenchmarkSourceBurstAfterSync(b *testing.B) {
	src, tables := syncedSource(b, 10000)
	events := make([][]watchers.Event[*k8scache.Slice], 2)
	for g := range events {
		for i := 0; i < 1000; i++ {
			events[g] = append(events[g], sliceEvent(i*10, 2+g))
		}
	}
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		for _, ev := range events[n%2] {
			src.OnEndpointSlice(ev)
		}
	}
	b.StopTimer()
	if got := frontendBackends(b, tables, "10.96.0.1"); len(got) != 10 {
		b.Fatalf("backends %v", got)
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "µs/change")
}

// TestServiceFromLoadBalancer: node ports, external IPs, load-balancer
// ingress addresses (not hostnames, not proxy mode), source ranges and
// externalTrafficPolicy Local with its health check node port; a bad
// source range is an error naming it; node ports outside the source's
// range are left out; this node's addresses give the node port frontends.
func TestServiceFromLoadBalancer(t *testing.T) {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Type: corev1.ServiceTypeLoadBalancer,
			Ports:                    []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080}, {Name: "high", Port: 81, NodePort: 40000}},
			ExternalIPs:              []string{"198.51.100.7"},
			LoadBalancerSourceRanges: []string{"198.51.100.0/24 ", "203.0.113.9/32"},
			ExternalTrafficPolicy:    corev1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 31000},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
			{IP: "198.51.100.50"}, {Hostname: "lb.example"}, {IP: "198.51.100.51", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}}}}
	got, ok, err := ServiceFrom(s, false)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if got.Ports[0].NodePort != 30080 || len(got.ExternalIPs) != 1 || len(got.LoadBalancerIPs) != 1 ||
		got.LoadBalancerIPs[0] != netip.MustParseAddr("198.51.100.50") || len(got.SourceRanges) != 2 ||
		!got.ExternalLocal() || got.HealthCheckNodePort != 31000 {
		t.Fatalf("converted %+v", got)
	}
	bad := s.DeepCopy()
	bad.Spec.LoadBalancerSourceRanges = []string{"not-a-cidr"}
	if _, _, err := ServiceFrom(bad, false); err == nil {
		t.Fatal("a bad source range was accepted")
	}
	// A ClusterIP service with node ports left over keeps none.
	cip := s.DeepCopy()
	cip.Spec.Type = corev1.ServiceTypeClusterIP
	if got, _, _ := ServiceFrom(cip, false); got.Ports[0].NodePort != 0 || got.ExternalLocal() || len(got.LoadBalancerIPs) != 0 {
		t.Fatalf("ClusterIP service: %+v", got)
	}

	tables, err := loadbalancer.NewTables(statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	src := NewSource(loadbalancer.NewWriter(tables, "node-a"), false, slog.New(slog.DiscardHandler))
	src.SetNodePortRange(30000, 32767)
	onService(src, watchers.Event[*corev1.Service]{Kind: watchers.Synced})
	src.OnEndpointSlice(watchers.Event[*k8scache.Slice]{Kind: watchers.Synced})
	onService(src, watchers.Event[*corev1.Service]{Kind: watchers.Upsert, Key: "ns/web", Object: s})
	src.OnNode(watchers.Event[*corev1.Node]{Kind: watchers.Upsert, Key: "node-a", Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.30.0.11"}, {Type: corev1.NodeHostName, Address: "node-a"}}}}})
	var keys []string
	for f := range tables.Frontends.All(tables.DB.ReadTxn()) {
		if f.Type == loadbalancer.FrontendNodePort {
			keys = append(keys, f.Key.String())
		}
	}
	if len(keys) != 1 || keys[0] != "172.30.0.11:30080/TCP" {
		t.Fatalf("node port frontends %v, want only 172.30.0.11:30080/TCP (40000 is outside the range)", keys)
	}
}

// TestHostPorts: a pod of this node with host ports becomes a HostPort
// service on the node's addresses (or its hostIP) to the pod's container
// ports; a pod without an address, or ended, has none; deleting the pod
// removes them.
func TestHostPorts(t *testing.T) {
	tables, err := loadbalancer.NewTables(statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	src := NewSource(loadbalancer.NewWriter(tables, "node-a"), false, slog.New(slog.DiscardHandler))
	for _, k := range []func(){
		func() { onService(src, watchers.Event[*corev1.Service]{Kind: watchers.Synced}) },
		func() { src.OnEndpointSlice(watchers.Event[*k8scache.Slice]{Kind: watchers.Synced}) },
		func() { src.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Synced}) },
		func() { src.OnTendrilNode(watchers.Event[*v1alpha1.TendrilNode]{Kind: watchers.Synced}) },
	} {
		k()
	}
	src.OnNode(watchers.Event[*corev1.Node]{Kind: watchers.Upsert, Key: "node-a", Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.30.0.11"}}}}})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{ContainerPort: 80, HostPort: 8080}, {ContainerPort: 53, HostPort: 5353, Protocol: corev1.ProtocolUDP}, {ContainerPort: 9090}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.5", PodIPs: []corev1.PodIP{{IP: "10.244.0.5"}}}}
	frontends := func() map[string]string {
		out := map[string]string{}
		for f := range tables.Frontends.All(tables.DB.ReadTxn()) {
			var bs []string
			for _, b := range f.Backends {
				bs = append(bs, b.Addr.String())
			}
			out[f.Key.String()] = f.Type + " " + f.Service.String() + " " + strings.Join(bs, ",")
		}
		return out
	}
	noIP := pod.DeepCopy()
	noIP.Status.PodIP, noIP.Status.PodIPs = "", nil
	src.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Upsert, Key: "ns/web", Object: noIP})
	if got := frontends(); len(got) != 0 {
		t.Fatalf("a pod without an address has host ports: %v", got)
	}
	src.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Upsert, Key: "ns/web", Object: pod})
	got := frontends()
	if len(got) != 2 || got["172.30.0.11:8080/TCP"] != "HostPort ns/pod/web 10.244.0.5:80" || got["172.30.0.11:5353/UDP"] != "HostPort ns/pod/web 10.244.0.5:53" {
		t.Fatalf("host port frontends %v", got)
	}
	withHostIP := pod.DeepCopy()
	withHostIP.Spec.Containers[0].Ports = withHostIP.Spec.Containers[0].Ports[:1]
	withHostIP.Spec.Containers[0].Ports[0].HostIP = "172.30.0.99"
	src.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Upsert, Key: "ns/web", Object: withHostIP})
	if got := frontends(); len(got) != 1 || got["172.30.0.99:8080/TCP"] == "" {
		t.Fatalf("hostIP 172.30.0.99: %v", got)
	}
	done := pod.DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	src.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Upsert, Key: "ns/web", Object: done})
	if got := frontends(); len(got) != 0 {
		t.Fatalf("an ended pod keeps host ports: %v", got)
	}
	src.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Upsert, Key: "ns/web", Object: pod})
	src.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Delete, Key: "ns/web", Object: pod})
	if got := frontends(); len(got) != 0 {
		t.Fatalf("a deleted pod keeps host ports: %v", got)
	}
	if n := tables.Backends.NumObjects(tables.DB.ReadTxn()); n != 0 {
		t.Fatalf("%d backends left", n)
	}
}

// TestSourceExternalIPRanges: with --service-external-ip-cidrs, an
// external IP outside the ranges is no frontend (the one inside is); with
// none set, every one is; one inside the cluster's pod pools never is.
func TestSourceExternalIPRanges(t *testing.T) {
	ev := serviceEvent(0)
	ev.Object.Spec.ExternalIPs = []string{"198.51.100.7", "10.244.1.9"}
	ev.Object.Spec.ExternalIPs = append(ev.Object.Spec.ExternalIPs, "fd00:10:244::9", "::ffff:10.244.2.3")
	pools := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}
	for _, c := range []struct {
		ranges, pools []netip.Prefix
		want          string
	}{
		{nil, nil, "[10.244.1.9 10.244.2.3 10.96.0.1 198.51.100.7 fd00:10:244::9]"},
		{[]netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, nil, "[10.96.0.1 198.51.100.7]"},
		// A pod's address (a pool's) is never external, whatever the
		// external ranges say; IPv4-mapped spellings included.
		{nil, pools, "[10.96.0.1 198.51.100.7]"},
		{[]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, pools, "[10.96.0.1]"},
	} {
		tables, err := loadbalancer.NewTables(statedb.New())
		if err != nil {
			t.Fatal(err)
		}
		src := NewSource(loadbalancer.NewWriter(tables, "node-a"), false, slog.New(slog.DiscardHandler))
		src.SetExternalIPRanges(c.ranges)
		src.SetPodRanges(c.pools)
		onService(src, watchers.Event[*corev1.Service]{Kind: watchers.Synced})
		onService(src, ev)
		var got []string
		for f := range tables.Frontends.All(tables.DB.ReadTxn()) {
			got = append(got, f.Key.Addr.Addr().String())
		}
		slices.Sort(got)
		if fmt.Sprint(got) != c.want {
			t.Errorf("ranges %v, pools %v: frontends %v, want %s", c.ranges, c.pools, got, c.want)
		}
	}
}

// TestSourceExternalIPInNodePodCIDR: without the pools configured (the
// kube-controller-manager's node CIDRs), an external IP inside any Node's
// spec.podCIDRs is no frontend. It is judged again as the Nodes change:
// left out once a Node's pod CIDR holds it, whether the Node comes before
// or after the Service, and a frontend again once the Node is gone.
func TestSourceExternalIPInNodePodCIDR(t *testing.T) {
	tables, err := loadbalancer.NewTables(statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	src := NewSource(loadbalancer.NewWriter(tables, "node-a"), false, slog.New(slog.DiscardHandler))
	frontends := func() string {
		var got []string
		for f := range tables.Frontends.All(tables.DB.ReadTxn()) {
			got = append(got, f.Key.Addr.Addr().String())
		}
		slices.Sort(got)
		return fmt.Sprint(got)
	}
	node := func(kind watchers.EventKind, name string, cidrs ...string) watchers.Event[*corev1.Node] {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: cidrs}}
		if len(cidrs) > 0 {
			n.Spec.PodCIDR = cidrs[0]
		}
		return watchers.Event[*corev1.Node]{Kind: kind, Key: name, Object: n}
	}
	// Node b's pod CIDR is known before the Service.
	src.OnNode(node(watchers.Upsert, "node-b", "10.244.2.0/24", "fd00:10:244:2::/64"))
	src.OnNode(watchers.Event[*corev1.Node]{Kind: watchers.Synced})
	onService(src, watchers.Event[*corev1.Service]{Kind: watchers.Synced})
	ev := serviceEvent(0)
	ev.Object.Spec.ExternalIPs = []string{"198.51.100.7", "10.244.1.9", "::ffff:10.244.2.3", "fd00:10:244:2::9"}
	onService(src, ev)
	if got, want := frontends(), "[10.244.1.9 10.96.0.1 198.51.100.7]"; got != want {
		t.Errorf("node b's pod CIDR known: frontends %s, want %s", got, want)
	}
	// Node a's pod CIDR, allocated after the Service was written.
	src.OnNode(node(watchers.Upsert, "node-a", "10.244.1.0/24"))
	if got, want := frontends(), "[10.96.0.1 198.51.100.7]"; got != want {
		t.Errorf("node a's pod CIDR allocated: frontends %s, want %s", got, want)
	}
	// A status update changes nothing.
	src.OnNode(node(watchers.Upsert, "node-a", "10.244.1.0/24"))
	if got, want := frontends(), "[10.96.0.1 198.51.100.7]"; got != want {
		t.Errorf("node a updated: frontends %s, want %s", got, want)
	}
	// Node b leaves the cluster: its range holds no pod any more.
	src.OnNode(node(watchers.Delete, "node-b", "10.244.2.0/24", "fd00:10:244:2::/64"))
	if got, want := frontends(), "[10.244.2.3 10.96.0.1 198.51.100.7 fd00:10:244:2::9]"; got != want {
		t.Errorf("node b deleted: frontends %s, want %s", got, want)
	}
	// Cluster-pool IPAM: the operator's allocation in a TendrilNode (no
	// Node podCIDR), the pools not given to the agent.
	tnode := func(kind watchers.EventKind, name string, cidrs ...string) watchers.Event[*v1alpha1.TendrilNode] {
		return watchers.Event[*v1alpha1.TendrilNode]{Kind: kind, Key: name, Object: &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.NodeSpec{IPAM: v1alpha1.IPAMSpec{PodCIDRs: cidrs}}}}
	}
	src.OnTendrilNode(tnode(watchers.Upsert, "node-b", "10.244.2.0/24"))
	if got, want := frontends(), "[10.96.0.1 198.51.100.7 fd00:10:244:2::9]"; got != want {
		t.Errorf("node b's TendrilNode pod CIDR: frontends %s, want %s", got, want)
	}
	src.OnTendrilNode(tnode(watchers.Delete, "node-b", "10.244.2.0/24"))
	if got, want := frontends(), "[10.244.2.3 10.96.0.1 198.51.100.7 fd00:10:244:2::9]"; got != want {
		t.Errorf("node b's TendrilNode deleted: frontends %s, want %s", got, want)
	}
	// The Service deleted: nothing is judged for it again.
	onService(src, watchers.Event[*corev1.Service]{Kind: watchers.Delete, Key: ev.Key, Object: ev.Object})
	src.OnNode(node(watchers.Upsert, "node-c", "10.244.3.0/24"))
	if got := frontends(); got != "[]" {
		t.Errorf("service deleted, a node added: frontends %s, want none", got)
	}
}

// onService hands src a Service event as the informer does: the Service
// converted by the cache's transform (k8scache.CachedServiceFrom).
func onService(src *Source, ev watchers.Event[*corev1.Service]) {
	out := watchers.Event[*k8scache.Service]{Kind: ev.Kind, Key: ev.Key}
	if ev.Object != nil {
		out.Object = k8scache.CachedServiceFrom(ev.Object)
	}
	src.OnService(out)
}
