package l2announcer

import (
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

// Wants computes this node's wants for each service that has an
// announceable address on one of devs. backendsOf returns a service's
// backends (read only for externalTrafficPolicy Local).
func Wants(node string, services []*loadbalancer.Service, backendsOf func(loadbalancer.ServiceName) []*loadbalancer.Backend, devs []Device) map[loadbalancer.ServiceName]Want {
	out := map[loadbalancer.ServiceName]Want{}
	for _, s := range services {
		pl := Place(Addresses(s), devs)
		if len(pl) == 0 {
			continue
		}
		w := Want{Service: s.Name, Placements: pl, Candidate: true}
		if s.ExternalLocal() {
			w.Candidate = HasLocalBackend(node, backendsOf(s.Name))
		}
		out[s.Name] = w
	}
	return out
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
