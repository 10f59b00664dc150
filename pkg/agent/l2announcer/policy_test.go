package l2announcer

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// The lab's shape: eth0 on 172.30.0.0/24, default route via 172.30.0.1,
// node-2 at 172.30.0.12, the pool 172.30.0.240/28.
var (
	labDev = Device{Name: "eth0", IfIndex: 2, MAC: eth0.MAC,
		Prefixes: []netip.Prefix{netip.MustParsePrefix("172.30.0.11/24")}, Gateways: []netip.Addr{netip.MustParseAddr("172.30.0.1")}}
	gateway = netip.MustParseAddr("172.30.0.1")
	node2IP = netip.MustParseAddr("172.30.0.12")
	poolIP  = netip.MustParseAddr("172.30.0.241")
	nodes   = map[netip.Addr]string{netip.MustParseAddr("172.30.0.11"): "node-1", node2IP: "node-2"}
)

func pool(t *testing.T, name string, l2 *v1alpha1.L2AnnouncementPolicy, poolSel *metav1.LabelSelector, nodeLabels map[string]string, blocks ...v1alpha1.LoadBalancerIPBlock) *Policy {
	t.Helper()
	p, err := ParsePolicy(&v1alpha1.TendrilLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: blocks, ServiceSelector: poolSel, L2Announcements: l2}}, nodeLabels)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func svc(name string, created int, lb []netip.Addr, ext []netip.Addr, lbls map[string]string) *loadbalancer.Service {
	return &loadbalancer.Service{Name: loadbalancer.ServiceName{Namespace: "ns", Name: name}, Type: loadbalancer.FrontendLoadBalancer,
		LoadBalancerIPs: lb, ExternalIPs: ext, Labels: lbls, UID: "uid-" + name, Created: time.Unix(int64(created), 0)}
}

func placed(w map[loadbalancer.ServiceName]Want) string {
	var out []string
	for _, n := range []string{"a", "b", "c", "hijack", "web"} {
		for _, p := range w[loadbalancer.ServiceName{Namespace: "ns", Name: n}].Placements {
			out = append(out, n+"="+p.Addr.String()+"@"+p.Device.Name)
		}
	}
	return strings.Join(out, " ")
}

func reasons(rs []Refusal) string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%s %s: %s", r.Service.Name, r.Addr, r.Reason))
	}
	return strings.Join(out, "\n")
}

func mustRefuse(t *testing.T, rs []Refusal, name string, addr netip.Addr, why string) {
	t.Helper()
	for _, r := range rs {
		if r.Service.Name == name && r.Addr == addr && strings.Contains(r.Reason, why) {
			if r.UID != "uid-"+name {
				t.Errorf("refusal %v: UID %q", r, r.UID)
			}
			return
		}
	}
	t.Errorf("no refusal of %s for %s (%q) among:\n%s", addr, name, why, reasons(rs))
}

// TestWantsExternalIPTakeover: a Service's external IPs (anyone who may
// create a Service sets them) are not announced unless a pool's policy
// asks for external IPs; even then never a node's address or the
// gateway; a load-balancer address from the pool is.
func TestWantsExternalIPTakeover(t *testing.T) {
	lbOnly := pool(t, "lab", &v1alpha1.L2AnnouncementPolicy{}, nil, nil, v1alpha1.LoadBalancerIPBlock{CIDR: "172.30.0.240/28"})
	hijack := svc("hijack", 1, nil, []netip.Addr{gateway, node2IP}, nil)
	web := svc("web", 2, []netip.Addr{poolIP}, nil, nil)
	of := func(loadbalancer.ServiceName) []*loadbalancer.Backend { return nil }
	w, refused := Wants("node-1", []*loadbalancer.Service{hijack, web}, of, []Device{labDev}, Cluster{Policies: []*Policy{lbOnly}, NodeAddrs: nodes})
	if got := placed(w); got != "web=172.30.0.241@eth0" {
		t.Fatalf("placed %q, want only web's pool address", got)
	}
	mustRefuse(t, refused, "hijack", gateway, "external IP: no TendrilLoadBalancerIPPool")
	mustRefuse(t, refused, "hijack", node2IP, "external IP: no TendrilLoadBalancerIPPool")

	// A policy admitting external IPs on the whole subnet still refuses
	// the gateway and the node's address.
	withExt := pool(t, "ext", &v1alpha1.L2AnnouncementPolicy{ExternalIPs: true}, nil, nil, v1alpha1.LoadBalancerIPBlock{CIDR: "172.30.0.0/24"})
	other := netip.MustParseAddr("172.30.0.50")
	hijack.ExternalIPs = append(hijack.ExternalIPs, other)
	w, refused = Wants("node-1", []*loadbalancer.Service{hijack, web}, of, []Device{labDev}, Cluster{Policies: []*Policy{lbOnly, withExt}, NodeAddrs: nodes})
	if got := placed(w); got != "hijack=172.30.0.50@eth0 web=172.30.0.241@eth0" {
		t.Fatalf("placed %q", got)
	}
	mustRefuse(t, refused, "hijack", gateway, "gateway of eth0's subnet")
	mustRefuse(t, refused, "hijack", node2IP, "address of node node-2")
	if len(refused) != 2 {
		t.Fatalf("refusals:\n%s", reasons(refused))
	}

	// loadBalancerIPs false: the pool's addresses are not announced.
	off := pool(t, "lab", &v1alpha1.L2AnnouncementPolicy{LoadBalancerIPs: new(bool)}, nil, nil, v1alpha1.LoadBalancerIPBlock{CIDR: "172.30.0.240/28"})
	w, refused = Wants("node-1", []*loadbalancer.Service{web}, of, []Device{labDev}, Cluster{Policies: []*Policy{off}})
	if len(w) != 0 {
		t.Fatalf("loadBalancerIPs false: placed %q", placed(w))
	}
	mustRefuse(t, refused, "web", poolIP, "no TendrilLoadBalancerIPPool")
	// No pool at all: nothing announced.
	if w, _ := Wants("node-1", []*loadbalancer.Service{web}, of, []Device{labDev}, Cluster{}); len(w) != 0 {
		t.Fatalf("no pools: placed %q", placed(w))
	}
}

// TestWantsConflicts: two services claiming one address: a load-balancer
// address beats an external IP, then the older service; the other is
// refused, naming the holder.
func TestWantsConflicts(t *testing.T) {
	p := pool(t, "p", &v1alpha1.L2AnnouncementPolicy{ExternalIPs: true}, nil, nil, v1alpha1.LoadBalancerIPBlock{CIDR: "172.30.0.240/28"})
	second := netip.MustParseAddr("172.30.0.242")
	a := svc("a", 5, nil, []netip.Addr{poolIP}, nil) // older, but an external IP
	b := svc("b", 9, []netip.Addr{poolIP}, nil, nil) // the pool's assignment
	c := svc("c", 3, []netip.Addr{second}, nil, nil) // older
	web := svc("web", 4, []netip.Addr{second}, nil, nil)
	of := func(loadbalancer.ServiceName) []*loadbalancer.Backend { return nil }
	w, refused := Wants("node-1", []*loadbalancer.Service{a, b, c, web}, of, []Device{labDev}, Cluster{Policies: []*Policy{p}})
	if got := placed(w); got != "b=172.30.0.241@eth0 c=172.30.0.242@eth0" {
		t.Fatalf("placed %q", got)
	}
	mustRefuse(t, refused, "a", poolIP, "Service ns/b holds it")
	mustRefuse(t, refused, "web", second, "Service ns/c holds it")
}

// TestWantsSelectors: the pool's and the policy's service selectors
// both apply; a node the nodeSelector leaves out and a device the
// interfaces leave out announce nothing.
func TestWantsSelectors(t *testing.T) {
	sel := func(k, v string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	}
	block := v1alpha1.LoadBalancerIPBlock{Start: "172.30.0.240", Stop: "172.30.0.250"}
	of := func(loadbalancer.ServiceName) []*loadbalancer.Backend { return nil }
	web := svc("web", 1, []netip.Addr{poolIP}, nil, map[string]string{"app": "web", "tier": "front"})
	back := svc("b", 1, []netip.Addr{netip.MustParseAddr("172.30.0.243")}, nil, map[string]string{"app": "web"})
	for _, c := range []struct {
		what       string
		l2         *v1alpha1.L2AnnouncementPolicy
		nodeLabels map[string]string
		want       string
	}{
		{"both selectors", &v1alpha1.L2AnnouncementPolicy{ServiceSelector: sel("tier", "front")}, nil, "web=172.30.0.241@eth0"},
		{"no policy selector", &v1alpha1.L2AnnouncementPolicy{}, nil, "b=172.30.0.243@eth0 web=172.30.0.241@eth0"},
		{"node selected", &v1alpha1.L2AnnouncementPolicy{NodeSelector: sel("l2", "yes")}, map[string]string{"l2": "yes"}, "b=172.30.0.243@eth0 web=172.30.0.241@eth0"},
		{"node not selected", &v1alpha1.L2AnnouncementPolicy{NodeSelector: sel("l2", "yes")}, map[string]string{"l2": "no"}, ""},
		{"interface matched", &v1alpha1.L2AnnouncementPolicy{Interfaces: []string{"eth[0-9]+"}}, nil, "b=172.30.0.243@eth0 web=172.30.0.241@eth0"},
		{"interface not matched (whole name)", &v1alpha1.L2AnnouncementPolicy{Interfaces: []string{"eth", "bond0"}}, nil, ""},
	} {
		p := pool(t, "p", c.l2, sel("app", "web"), c.nodeLabels, block)
		w, _ := Wants("node-1", []*loadbalancer.Service{web, back}, of, []Device{labDev}, Cluster{Policies: []*Policy{p}})
		if got := placed(w); got != c.want {
			t.Errorf("%s: placed %q, want %q", c.what, got, c.want)
		}
	}
	other := svc("web", 1, []netip.Addr{poolIP}, nil, map[string]string{"app": "db"})
	p := pool(t, "p", &v1alpha1.L2AnnouncementPolicy{}, sel("app", "web"), nil, block)
	if w, _ := Wants("node-1", []*loadbalancer.Service{other}, of, []Device{labDev}, Cluster{Policies: []*Policy{p}}); len(w) != 0 {
		t.Fatalf("a service the pool does not select: placed %q", placed(w))
	}
}

// TestParsePolicy: no l2Announcements, no policy; a bad field refuses the
// pool whole, naming the field.
func TestParsePolicy(t *testing.T) {
	mk := func(l2 *v1alpha1.L2AnnouncementPolicy, blocks ...v1alpha1.LoadBalancerIPBlock) *v1alpha1.TendrilLoadBalancerIPPool {
		return &v1alpha1.TendrilLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: "p"},
			Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: blocks, L2Announcements: l2}}
	}
	good := v1alpha1.LoadBalancerIPBlock{CIDR: "10.0.0.0/30"}
	if p, err := ParsePolicy(mk(nil, good), nil); p != nil || err != nil {
		t.Fatalf("no l2Announcements: %v %v", p, err)
	}
	p, err := ParsePolicy(mk(&v1alpha1.L2AnnouncementPolicy{}, good), nil)
	if err != nil || !p.LoadBalancerIPs || p.ExternalIPs || !p.Node {
		t.Fatalf("defaults: %+v %v", p, err)
	}
	if !p.Admits(netip.MustParseAddr("10.0.0.0"), nil, true) || p.Admits(netip.MustParseAddr("10.0.0.4"), nil, true) {
		t.Fatal("a CIDR block covers its whole prefix")
	}
	for _, c := range []struct {
		pool *v1alpha1.TendrilLoadBalancerIPPool
		want string
	}{
		{mk(&v1alpha1.L2AnnouncementPolicy{Interfaces: []string{"eth("}}, good), "interfaces[0]"},
		{mk(&v1alpha1.L2AnnouncementPolicy{}, v1alpha1.LoadBalancerIPBlock{CIDR: "10.0.0.0/33"}), "blocks[0]"},
		{mk(&v1alpha1.L2AnnouncementPolicy{}, v1alpha1.LoadBalancerIPBlock{Start: "10.0.0.9", Stop: "10.0.0.1"}), "blocks[0]"},
		{mk(&v1alpha1.L2AnnouncementPolicy{NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}}, good), "nodeSelector"},
	} {
		if _, err := ParsePolicy(c.pool, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one naming %s", c.pool.Spec, err, c.want)
		}
	}
}

// TestReportNew: a refusal is reported once while it lasts, again when
// it comes back, and again when its reason changes.
func TestReportNew(t *testing.T) {
	r := &runner{log: slog.New(slog.DiscardHandler)}
	var got []string
	report := func(x Refusal) { got = append(got, x.Addr.String()+" "+x.Reason) }
	n := loadbalancer.ServiceName{Namespace: "ns", Name: "hijack"}
	gw := Refusal{Service: n, Addr: gateway, Reason: "gateway"}
	node := Refusal{Service: n, Addr: node2IP, Reason: "node"}
	last := r.reportNew([]Refusal{gw, node}, nil, report)
	last = r.reportNew([]Refusal{gw, node}, last, report)
	last = r.reportNew([]Refusal{gw}, last, report)
	last = r.reportNew([]Refusal{gw, node}, last, report)
	node.Reason = "node, renamed"
	r.reportNew([]Refusal{gw, node}, last, report)
	want := "[172.30.0.1 gateway 172.30.0.12 node 172.30.0.12 node 172.30.0.12 node, renamed]"
	if fmt.Sprint(got) != want {
		t.Fatalf("reported %v, want %s", got, want)
	}
}
