package ui

import (
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/observer"
)

// The tests' cluster is the lab demo's (examples/lab/demo-app.yaml):
// frontend, backend and other on node1, far on node2, the Service
// demo/backend, and allow-frontend (the backend accepts only the frontend
// on 80/TCP) isolating the backend. Its flows are decoded by the
// observer's own decoder from datapath events, as the agent decodes them.
var (
	frontendIP = netip.MustParseAddr("10.200.1.10")
	backendIP  = netip.MustParseAddr("10.200.1.11")
	otherIP    = netip.MustParseAddr("10.200.1.12")
	farIP      = netip.MustParseAddr("10.200.2.10")
	worldIP    = netip.MustParseAddr("192.0.2.80")
	clusterIP  = netip.MustParseAddr("10.96.0.50")
)

const (
	allowFrontendCookie = 7
	lockdownCookie      = 8 // an audit-mode policy on the frontend
)

var demoEndpoints = []observer.Endpoint{
	{ID: 1, Identity: 1000, Namespace: "demo", PodName: "frontend", Labels: []string{"k8s:app=frontend", "k8s:io.kubernetes.pod.namespace=demo"}},
	{ID: 2, Identity: 1001, Namespace: "demo", PodName: "backend", Labels: []string{"k8s:app=backend", "k8s:io.kubernetes.pod.namespace=demo"}},
	{ID: 3, Identity: 1002, Namespace: "demo", PodName: "other", Labels: []string{"k8s:app=other", "k8s:io.kubernetes.pod.namespace=demo"}},
	{Identity: 1003, Namespace: "demo", PodName: "far", Labels: []string{"k8s:app=far", "k8s:io.kubernetes.pod.namespace=demo"}},
}

// demoNode is node1's knowledge.
type demoNode struct{}

func (demoNode) NodeName() string { return "node1" }

func (demoNode) IdentityLabels(id uint32) []string {
	switch id {
	case 1:
		return []string{"reserved:host"}
	case 2:
		return []string{"reserved:world"}
	}
	for _, e := range demoEndpoints {
		if e.Identity == id {
			return e.Labels
		}
	}
	return nil
}

func (demoNode) EndpointByID(id uint16) (observer.Endpoint, bool) {
	for _, e := range demoEndpoints {
		if e.ID != 0 && e.ID == uint32(id) {
			return e, true
		}
	}
	return observer.Endpoint{}, false
}

func (demoNode) EndpointByIP(ip netip.Addr) (observer.Endpoint, bool) {
	for i, a := range []netip.Addr{frontendIP, backendIP, otherIP, farIP} {
		if a == ip {
			return demoEndpoints[i], true
		}
	}
	return observer.Endpoint{}, false
}

func (demoNode) PolicyByCookie(c uint32) (observer.Policy, bool) {
	switch c {
	case allowFrontendCookie:
		return observer.Policy{Name: "allow-frontend", Namespace: "demo", Kind: "TendrilNetworkPolicy"}, true
	case lockdownCookie:
		return observer.Policy{Name: "lockdown", Namespace: "demo", Kind: "TendrilNetworkPolicy"}, true
	}
	return observer.Policy{}, false
}

// ServiceByAddr: the socket load balancer translates before the datapath
// sees a packet, so the backend's address names the Service too.
func (demoNode) ServiceByAddr(a netip.AddrPort, proto uint8) (observer.Service, bool) {
	if proto == 6 && a.Port() == 80 && (a.Addr() == clusterIP || a.Addr() == backendIP) {
		return observer.Service{Namespace: "demo", Name: "backend"}, true
	}
	return observer.Service{}, false
}

func (demoNode) DefaultDenyPolicies(ep uint16, ingress bool) []observer.Policy {
	if ep == 2 && ingress {
		return []observer.Policy{{Name: "allow-frontend", Namespace: "demo", Kind: "TendrilNetworkPolicy"}}
	}
	return nil
}

// demoClock puts monotonic time 0 at base.
func demoClock(base time.Time) observer.Clock {
	return func() (time.Time, time.Duration) { return base, 0 }
}

// demoEvents is one round of the demo's traffic, at offset d from the
// clock's base: frontend → backend:80 allowed by allow-frontend (with the
// reply), other → backend:80 dropped (default deny under allow-frontend),
// far → backend:80 dropped too, frontend → the world on 443, the host's
// health check of the frontend, and other → frontend:8080 that the
// audit-mode lockdown would deny.
func demoEvents(d time.Duration, sport uint16) []loader.Event {
	tcp := func(typ, reason, dir uint8, ep uint16, src, dst netip.Addr, sid, did uint32, sp, dp uint16, flags uint8) loader.Event {
		return loader.Event{Type: typ, Reason: reason, Direction: dir, EndpointID: ep, Proto: 6, Allowed: true,
			SrcIdentity: sid, DstIdentity: did, Src: src, Dst: dst, SrcPort: sp, DstPort: dp, TCPFlags: flags, Monotonic: d}
	}
	evs := []loader.Event{
		// frontend → backend:80, allowed by allow-frontend.
		tcp(maps.EventTrace, maps.ReasonForwarded, maps.DirEgress, 1, frontendIP, backendIP, 1000, 1001, sport, 80, 0x02),
		tcp(maps.EventPolicyVerdict, 0, maps.DirIngress, 2, frontendIP, backendIP, 1000, 1001, sport, 80, 0x02),
		tcp(maps.EventTrace, maps.ReasonForwarded, maps.DirIngress, 2, frontendIP, backendIP, 1000, 1001, sport, 80, 0x02),
		tcp(maps.EventTrace, maps.ReasonCTReply, maps.DirEgress, 2, backendIP, frontendIP, 1001, 1000, 80, sport, 0x12),
		// other → backend:80, default deny.
		tcp(maps.EventTrace, maps.ReasonForwarded, maps.DirEgress, 3, otherIP, backendIP, 1002, 1001, sport, 80, 0x02),
		tcp(maps.EventDrop, maps.ReasonPolicyDenied, maps.DirIngress, 2, otherIP, backendIP, 1002, 1001, sport, 80, 0x02),
		// far (node2) → backend:80, default deny.
		tcp(maps.EventDrop, maps.ReasonPolicyDenied, maps.DirIngress, 2, farIP, backendIP, 1003, 1001, sport, 80, 0x02),
		// frontend → the world on 443.
		tcp(maps.EventTrace, maps.ReasonForwarded, maps.DirEgress, 1, frontendIP, worldIP, 1000, 2, sport, 443, 0x02),
		// The host checks the frontend's health.
		tcp(maps.EventTrace, maps.ReasonForwarded, maps.DirIngress, 1, netip.MustParseAddr("10.200.1.1"), frontendIP, 1, 1000, sport, 8080, 0x02),
		// other → frontend:8080: the audit-mode lockdown would deny it.
		tcp(maps.EventPolicyVerdict, 0, maps.DirIngress, 1, otherIP, frontendIP, 1002, 1000, sport, 8080, 0x02),
	}
	evs[1].Cookie = allowFrontendCookie
	evs[9].Cookie, evs[9].Audit = lockdownCookie, true
	evs[8].SrcIdentity = 1
	return evs
}

// demoFlows decodes rounds of demo traffic a second apart.
func demoFlows(t testing.TB, base time.Time, rounds int) []*flowpb.Flow {
	t.Helper()
	d := &observer.Decoder{Node: demoNode{}, Clock: demoClock(base)}
	var out []*flowpb.Flow
	for i := range rounds {
		for _, ev := range demoEvents(time.Duration(i)*time.Second, uint16(40000+i)) {
			f, err := d.Decode(ev)
			if err != nil {
				t.Fatalf("decode %+v: %v", ev, err)
			}
			out = append(out, f)
		}
	}
	return out
}

// demoServer is a real Hubble server (the agent's, package hubble) over an
// observer fed the demo's events, on a unix socket.
type demoServer struct {
	obs    *observer.Observer
	srv    *hubble.Server
	socket string
	base   time.Time
}

// newDemoServer starts the server; opts add to its configuration (a TCP
// listener with TLS).
func newDemoServer(t testing.TB, opts ...func(*hubble.Config)) *demoServer {
	t.Helper()
	base := time.Now()
	s := &demoServer{base: base, socket: filepath.Join(t.TempDir(), "hubble.sock")}
	s.obs = observer.New(observer.Config{Capacity: 65536, Clock: demoClock(base)}, demoNode{}, nil)
	cfg := hubble.Config{SocketPath: s.socket, Version: "test"}
	for _, o := range opts {
		o(&cfg)
	}
	s.srv = hubble.New(cfg, s.obs, nil)
	if err := s.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.srv.Stop)
	return s
}

// round observes one round of the demo's traffic at offset d.
func (s *demoServer) round(t testing.TB, d time.Duration, sport uint16) {
	t.Helper()
	for _, ev := range demoEvents(d, sport) {
		if err := s.obs.Observe(ev); err != nil {
			t.Fatal(err)
		}
	}
}
