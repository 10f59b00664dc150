package l2announcer

import (
	"net"
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

var (
	eth0 = Device{Name: "eth0", IfIndex: 2, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 0x11},
		Prefixes: []netip.Prefix{netip.MustParsePrefix("172.30.0.11/24")}}
	eth1 = Device{Name: "eth1", IfIndex: 3, MAC: net.HardwareAddr{2, 0, 0, 0, 1, 0x11},
		Prefixes: []netip.Prefix{netip.MustParsePrefix("192.168.7.2/24")}}
	lbIP  = netip.MustParseAddr("172.30.0.241")
	extIP = netip.MustParseAddr("192.168.7.50")
	far   = netip.MustParseAddr("203.0.113.9")
	web   = loadbalancer.ServiceName{Namespace: "default", Name: "web"}
	// everything admits every address of every service, of both kinds.
	everything = Cluster{Policies: []*Policy{{Pool: "all", Node: true, LoadBalancerIPs: true, ExternalIPs: true,
		Blocks: []AddrRange{{From: netip.MustParseAddr("0.0.0.0"), To: netip.MustParseAddr("255.255.255.255")}}, Services: labels.Everything()}}}
)

func TestAddresses(t *testing.T) {
	s := &loadbalancer.Service{Name: web, Type: loadbalancer.FrontendLoadBalancer,
		LoadBalancerIPs: []netip.Addr{lbIP, netip.MustParseAddr("fd00::1")},
		ExternalIPs:     []netip.Addr{extIP, lbIP, netip.MustParseAddr("::ffff:10.0.0.1")}}
	got := Addresses(s)
	want := []netip.Addr{lbIP, extIP, netip.MustParseAddr("10.0.0.1")}
	if len(got) != len(want) {
		t.Fatalf("Addresses = %v, want %v (IPv4 only, each once)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Addresses = %v, want %v", got, want)
		}
	}
	hp := &loadbalancer.Service{Name: web, Type: loadbalancer.FrontendHostPort, ExternalIPs: []netip.Addr{extIP}}
	if got := Addresses(hp); len(got) != 0 {
		t.Fatalf("host ports: %v, want none", got)
	}
}

func TestPlace(t *testing.T) {
	devs := []Device{eth0, eth1}
	for _, c := range []struct {
		addr netip.Addr
		want string // device name, "" for none
	}{
		{lbIP, "eth0"},
		{extIP, "eth1"},
		{far, ""},                                 // no device on its subnet
		{netip.MustParseAddr("172.30.0.11"), ""},  // the device's own address
		{netip.MustParseAddr("172.30.0.0"), ""},   // network address
		{netip.MustParseAddr("172.30.0.255"), ""}, // broadcast
		{netip.MustParseAddr("192.168.7.254"), "eth1"},
	} {
		pl := Place([]netip.Addr{c.addr}, devs)
		got := ""
		if len(pl) == 1 {
			got = pl[0].Device.Name
		} else if len(pl) > 1 {
			t.Fatalf("%s: placed %d times", c.addr, len(pl))
		}
		if got != c.want {
			t.Errorf("%s: on %q, want %q", c.addr, got, c.want)
		}
	}
}

func TestWantsCandidates(t *testing.T) {
	local := &loadbalancer.Service{Name: loadbalancer.ServiceName{Namespace: "default", Name: "local"}, Type: loadbalancer.FrontendLoadBalancer,
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("172.30.0.242")}, ExternalTrafficPolicy: loadbalancer.TrafficPolicyLocal}
	cluster := &loadbalancer.Service{Name: web, Type: loadbalancer.FrontendLoadBalancer,
		LoadBalancerIPs: []netip.Addr{lbIP}, ExternalTrafficPolicy: loadbalancer.TrafficPolicyCluster}
	farSvc := &loadbalancer.Service{Name: loadbalancer.ServiceName{Namespace: "default", Name: "far"}, Type: loadbalancer.FrontendLoadBalancer,
		LoadBalancerIPs: []netip.Addr{far}}
	backends := map[loadbalancer.ServiceName][]*loadbalancer.Backend{}
	of := func(n loadbalancer.ServiceName) []*loadbalancer.Backend { return backends[n] }
	svcs := []*loadbalancer.Service{local, cluster, farSvc}

	w, _ := Wants("node-1", svcs, of, []Device{eth0}, everything)
	if _, ok := w[farSvc.Name]; ok {
		t.Fatalf("a service with no address on a device's subnet is wanted: %+v", w)
	}
	if !w[web].Candidate {
		t.Fatalf("externalTrafficPolicy Cluster: not a candidate")
	}
	if w[local.Name].Candidate {
		t.Fatalf("externalTrafficPolicy Local without a backend: a candidate")
	}
	for _, c := range []struct {
		b    *loadbalancer.Backend
		want bool
	}{
		{&loadbalancer.Backend{NodeName: "node-2", Ready: true}, false},
		{&loadbalancer.Backend{NodeName: "node-1", Ready: false}, false},
		{&loadbalancer.Backend{NodeName: "node-1", Ready: true, Terminating: true}, false},
		{&loadbalancer.Backend{NodeName: "node-1", Ready: true}, true},
	} {
		backends[local.Name] = []*loadbalancer.Backend{c.b}
		if w, _ := Wants("node-1", svcs, of, []Device{eth0}, everything); w[local.Name].Candidate != c.want {
			got := w[local.Name].Candidate
			t.Errorf("backend %+v: candidate %v, want %v", *c.b, got, c.want)
		}
	}
}

func TestDesired(t *testing.T) {
	a := loadbalancer.ServiceName{Namespace: "x", Name: "a"}
	b := loadbalancer.ServiceName{Namespace: "x", Name: "b"}
	wants := map[loadbalancer.ServiceName]Want{
		a: {Service: a, Candidate: true, Placements: []Placement{{Addr: lbIP, Device: eth0}}},
		b: {Service: b, Candidate: true, Placements: []Placement{{Addr: lbIP, Device: eth0}, {Addr: extIP, Device: eth1}}},
	}
	if d := Desired(wants, nil); len(d) != 0 {
		t.Fatalf("leading nothing: %v", d)
	}
	d := Desired(wants, map[loadbalancer.ServiceName]bool{a: true, b: true})
	if len(d) != 2 || d[AnnouncementKey{lbIP, 2}].Service != a || d[AnnouncementKey{extIP, 3}].Service != b {
		t.Fatalf("desired %v: want lbIP by a (first by name), extIP by b", d)
	}
	if got := d[AnnouncementKey{lbIP, 2}]; got.MAC.String() != eth0.MAC.String() || got.Device != "eth0" {
		t.Fatalf("announcement %+v: want eth0's MAC", got)
	}
	if LeaseName(b) != "tendril-l2announce-x-b" {
		t.Fatalf("lease name %s", LeaseName(b))
	}
}

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	c.Enabled = true
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := c
	bad.LeaseDuration = bad.RenewDeadline
	if bad.Validate() == nil {
		t.Fatal("lease duration = renew deadline: no error")
	}
	bad = c
	bad.RenewDeadline = bad.RetryPeriod
	if bad.Validate() == nil {
		t.Fatal("renew deadline = retry period: no error")
	}
	bad = c
	bad.LeaseNamespace = ""
	if bad.Validate() == nil {
		t.Fatal("empty namespace: no error")
	}
}
