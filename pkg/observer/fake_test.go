package observer

import (
	"net/netip"
	"time"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// fakeNode is a node that knows two pods and a policy.
type fakeNode struct{}

var (
	webIP  = netip.MustParseAddr("10.1.0.2")
	dbIP   = netip.MustParseAddr("10.1.0.3")
	worldA = netip.MustParseAddr("192.0.2.9")
	web    = Endpoint{ID: 1, Identity: 1000, Namespace: "shop", PodName: "web-7d9f", Labels: []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"}, WorkloadName: "web", WorkloadKind: "Deployment"}
	db     = Endpoint{ID: 2, Identity: 1001, Namespace: "data", PodName: "db-0", Labels: []string{"k8s:app=db", "k8s:tier=backend", "k8s:io.kubernetes.pod.namespace=data"}}
)

func (fakeNode) NodeName() string { return "node-a" }
func (fakeNode) IdentityLabels(id uint32) []string {
	switch id {
	case 2:
		return []string{"reserved:world"}
	case 1000:
		return web.Labels
	}
	return nil
}
func (fakeNode) EndpointByID(id uint16) (Endpoint, bool) {
	switch id {
	case 1:
		return web, true
	case 2:
		return db, true
	}
	return Endpoint{}, false
}
func (fakeNode) EndpointByIP(ip netip.Addr) (Endpoint, bool) {
	switch ip {
	case webIP:
		return web, true
	case dbIP:
		return db, true
	}
	return Endpoint{}, false
}
func (fakeNode) PolicyByCookie(c uint32) (Policy, bool) {
	if c == 7 {
		return Policy{Name: "db-ingress", Namespace: "data", Kind: "CiliumNetworkPolicy"}, true
	}
	return Policy{}, false
}

// fixedClock: monotonic 100 s is 2030-01-01T00:00:00Z.
var base = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func fixedClock() (time.Time, time.Duration) { return base, 100 * time.Second }

// at is an event's monotonic time for wall time base+d.
func at(d time.Duration) time.Duration { return 100*time.Second + d }

func dropEvent(src, dst netip.Addr, dport uint16, reason uint8, d time.Duration) loader.Event {
	return loader.Event{Type: maps.EventDrop, Reason: reason, Direction: maps.DirIngress, EndpointID: 2, Proto: 6,
		SrcIdentity: 1000, DstIdentity: 1001, Src: src, Dst: dst, SrcPort: 40000, DstPort: dport, TCPFlags: 0x02, Monotonic: at(d)}
}

func traceEvent(src, dst netip.Addr, proto uint8, sport, dport uint16, flags uint8, dir, reason uint8, d time.Duration) loader.Event {
	ep, obs := uint16(1), maps.ObsFromEndpoint
	if dir == maps.DirIngress {
		obs = maps.ObsToEndpoint
	}
	return loader.Event{Type: maps.EventTrace, Reason: reason, Direction: dir, EndpointID: ep, Proto: proto, Allowed: true,
		Src: src, Dst: dst, SrcPort: sport, DstPort: dport, TCPFlags: flags, ObsPoint: obs, Monotonic: at(d)}
}
