package l2announcer

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// Device is an uplink the host programs are attached to, as the
// announcer needs it: where requests arrive and which subnets it is on.
type Device struct {
	Name    string
	IfIndex int
	MAC     net.HardwareAddr
	// Prefixes are the device's IPv4 addresses with their prefix length:
	// an address is announced on a device whose subnet holds it.
	Prefixes []netip.Prefix
	// Gateways are the next hops of the routes through the device (the
	// default route's first): never announced.
	Gateways []netip.Addr
}

// Placement is one address of a service on one device.
type Placement struct {
	Addr   netip.Addr
	Device Device
}

// Want is what this node wants for one service: the placements of its
// announceable addresses and whether it may hold the service's lease.
type Want struct {
	Service    loadbalancer.ServiceName
	Placements []Placement
	// Candidate: the node has a device on the addresses' subnet, and, for
	// externalTrafficPolicy Local, a ready backend of the service.
	Candidate bool
}

// Addresses are the service's addresses L2 announcements cover: its
// load-balancer ingress addresses and external IPs, IPv4 (ARP), each
// once. A pod's host ports are not a service of the cluster's: none.
func Addresses(s *loadbalancer.Service) []netip.Addr {
	if s.Type == loadbalancer.FrontendHostPort {
		return nil
	}
	var out []netip.Addr
	for _, a := range slices.Concat(s.LoadBalancerIPs, s.ExternalIPs) {
		a = a.Unmap()
		if a.Is4() && !a.IsUnspecified() && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// Place returns the placements of addrs on devs: an address goes on each
// device whose subnet holds it, except its network and broadcast address
// and the device's own addresses (the host answers for those itself).
func Place(addrs []netip.Addr, devs []Device) []Placement {
	var out []Placement
	for _, a := range addrs {
		for _, d := range devs {
			if onSubnet(a, d) {
				out = append(out, Placement{Addr: a, Device: d})
			}
		}
	}
	return out
}

func onSubnet(a netip.Addr, d Device) bool {
	hit := false
	for _, p := range d.Prefixes {
		if p.Addr() == a {
			return false
		}
		if !p.Addr().Is4() || !p.Contains(a) {
			continue
		}
		if p.Bits() <= 30 && (a == p.Masked().Addr() || a == broadcast(p)) {
			continue
		}
		hit = true
	}
	return hit
}

func broadcast(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// HasLocalBackend reports whether node has a ready backend of the service
// among backends.
func HasLocalBackend(node string, backends []*loadbalancer.Backend) bool {
	for _, b := range backends {
		if b.NodeName == node && b.Ready && !b.Terminating {
			return true
		}
	}
	return false
}

// Cluster is what the announcer reads of the cluster besides services:
// the pools' L2 announcement policies and every node's addresses.
type Cluster struct {
	Policies []*Policy
	// NodeAddrs are the addresses of the cluster's nodes (Node
	// status.addresses), by address.
	NodeAddrs map[netip.Addr]string
}

// Refusal is an address of a service that is not announced, and why.
type Refusal struct {
	Service loadbalancer.ServiceName
	// UID is the service's (its Event names it).
	UID    string
	Addr   netip.Addr
	Reason string
}

func (r Refusal) String() string {
	return fmt.Sprintf("%s: %s not announced: %s", r.Service, r.Addr, r.Reason)
}

// claim is an address a service asks to have announced that a policy
// admits.
type claim struct {
	svc      *loadbalancer.Service
	addr     netip.Addr
	lb       bool
	policies []*Policy
}

// before orders the claims of one address: a load-balancer ingress
// address (assigned from a pool) before an external IP (anyone's to
// write), then the older service, then by name; every node orders them
// the same, so only the first one's lease is campaigned for.
func (c claim) before(o claim) int {
	if c.lb != o.lb {
		if c.lb {
			return -1
		}
		return 1
	}
	if !c.svc.Created.Equal(o.svc.Created) {
		return c.svc.Created.Compare(o.svc.Created)
	}
	return cmp.Compare(c.svc.Name.String(), o.svc.Name.String())
}

// Wants computes this node's wants for each service that has an
// announceable address on one of devs, and the addresses refused. An
// address is announceable when a pool's policy admits it (its kind, its
// service, this node, the device), it is no node's address, no gateway
// of the device, and no earlier claim of another service holds it.
// backendsOf returns a service's backends (read only for
// externalTrafficPolicy Local). A refusal is reported only for an address
// on the subnet of one of devs: the others this node would never answer
// for anyway.
func Wants(node string, services []*loadbalancer.Service, backendsOf func(loadbalancer.ServiceName) []*loadbalancer.Backend, devs []Device, cl Cluster) (map[loadbalancer.ServiceName]Want, []Refusal) {
	var refused []Refusal
	refuse := func(s *loadbalancer.Service, a netip.Addr, why string) {
		if len(Place([]netip.Addr{a}, devs)) > 0 {
			refused = append(refused, Refusal{Service: s.Name, UID: s.UID, Addr: a, Reason: why})
		}
	}
	byAddr := map[netip.Addr][]claim{}
	for _, s := range services {
		for _, a := range Addresses(s) {
			lb := slices.ContainsFunc(s.LoadBalancerIPs, func(x netip.Addr) bool { return x.Unmap() == a })
			var ps []*Policy
			for _, p := range cl.Policies {
				if p.Admits(a, s.Labels, lb) {
					ps = append(ps, p)
				}
			}
			switch {
			case len(ps) == 0 && lb:
				refuse(s, a, "no TendrilLoadBalancerIPPool with l2Announcements admits this load-balancer address for the service")
			case len(ps) == 0:
				refuse(s, a, "external IP: no TendrilLoadBalancerIPPool with l2Announcements.externalIPs admits it for the service")
			case cl.NodeAddrs[a] != "":
				refuse(s, a, "it is the address of node "+cl.NodeAddrs[a])
			default:
				byAddr[a] = append(byAddr[a], claim{svc: s, addr: a, lb: lb, policies: ps})
			}
		}
	}
	held := map[loadbalancer.ServiceName][]claim{}
	for _, cs := range byAddr {
		slices.SortFunc(cs, claim.before)
		held[cs[0].svc.Name] = append(held[cs[0].svc.Name], cs[0])
		for _, c := range cs[1:] {
			refuse(c.svc, c.addr, "Service "+cs[0].svc.Name.String()+" holds it")
		}
	}
	out := map[loadbalancer.ServiceName]Want{}
	for _, s := range services {
		cs := held[s.Name]
		slices.SortFunc(cs, func(a, b claim) int { return a.addr.Compare(b.addr) })
		var pl []Placement
		for _, c := range cs {
			for _, p := range Place([]netip.Addr{c.addr}, devs) {
				if slices.Contains(p.Device.Gateways, c.addr) {
					refuse(s, c.addr, "it is a gateway of "+p.Device.Name+"'s subnet")
					continue
				}
				if slices.ContainsFunc(c.policies, func(pol *Policy) bool { return pol.OnDevice(p.Device.Name) }) {
					pl = append(pl, p)
				}
			}
		}
		if len(pl) == 0 {
			continue
		}
		w := Want{Service: s.Name, Placements: pl, Candidate: true}
		if s.ExternalLocal() {
			w.Candidate = HasLocalBackend(node, backendsOf(s.Name))
		}
		out[s.Name] = w
	}
	slices.SortFunc(refused, func(a, b Refusal) int {
		return cmp.Or(cmp.Compare(a.Service.String(), b.Service.String()), a.Addr.Compare(b.Addr))
	})
	return out, refused
}

// Desired are the announcements of the services this node leads.
func Desired(wants map[loadbalancer.ServiceName]Want, leading map[loadbalancer.ServiceName]bool) map[AnnouncementKey]*Announcement {
	out := map[AnnouncementKey]*Announcement{}
	for name, w := range wants {
		if !leading[name] || !w.Candidate {
			continue
		}
		for _, p := range w.Placements {
			a := &Announcement{Addr: p.Addr, Device: p.Device.Name, IfIndex: p.Device.IfIndex, MAC: p.Device.MAC, Service: name}
			if prev, ok := out[a.Key()]; ok && prev.Service.String() < name.String() {
				continue // two services, one address: the first by name
			}
			out[a.Key()] = a
		}
	}
	return out
}

// LeaseName is the Lease of a service's announcement (Cilium's
// cilium-l2announce-<namespace>-<name>).
func LeaseName(s loadbalancer.ServiceName) string {
	return "tendril-l2announce-" + s.Namespace + "-" + s.Name
}
