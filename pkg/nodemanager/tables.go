package nodemanager

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
)

// Table names, as `tendril statedb` shows them.
const (
	NodesTableName  = "nodes"
	RoutesTableName = "routes"
)

// Tables are the nodes and routes tables, writable: only the Manager
// writes them; everyone else reads them as statedb.Table.
type Tables struct {
	Nodes  statedb.RWTable[*Peer]
	Routes statedb.RWTable[*Route]
}

// NewTables registers the nodes and routes tables in db. They exist
// whether or not anything fills them (a standalone agent's stay empty),
// so their readers need no special case for their absence.
func NewTables(db *statedb.DB) (Tables, error) {
	nodes, err := statedb.NewTable(db, NodesTableName, PeerNameIndex)
	if err != nil {
		return Tables{}, fmt.Errorf("nodes table: %w", err)
	}
	routes, err := statedb.NewTable(db, RoutesTableName, RoutePrefixIndex)
	if err != nil {
		return Tables{}, fmt.Errorf("routes table: %w", err)
	}
	return Tables{Nodes: nodes, Routes: routes}, nil
}

// Peer is another node as this node needs it: the nodes table's object.
// Objects are immutable once in the table: a change is a new object.
type Peer struct {
	Name string
	// Created is when the node's Node was created: of two nodes asking
	// for overlapping pod CIDRs, the older gets them.
	Created time.Time
	// IPs are the node's addresses (InternalIP first), as it claims them.
	IPs []netip.Addr
	// NodeIPs are those of IPs judged a node's address (set by the
	// Manager, Rules.OwnAddresses over the whole table): not a pod's,
	// a service's, this node's or no node's at all. An address two nodes
	// claim is in both's NodeIPs: it is a node's, only which one is
	// unknown, which does not matter for its remote-node identity or a
	// route to the claimant's pod CIDR via it (it does for encryption,
	// which takes only the addresses refused for no reason). Only these
	// are claimed as remote-node in the ipcache, are a route's next hop
	// and may be the host IP of the node's endpoints. RefusedIPs are the
	// addresses refused as the node's own, with the reason (shared ones
	// included).
	NodeIPs    []netip.Addr
	RefusedIPs []AddressRejection
	// PodCIDRs are the node's pod CIDRs that passed the checks (Rules;
	// at most one per family): only these become routes and scope the
	// node's endpoints' claims. Given to UpsertPeer, the requested ones.
	PodCIDRs []netip.Prefix
	// Requested are the pod CIDRs the node's objects name.
	Requested []netip.Prefix
	// Rejected are the requested pod CIDRs refused, with the reason
	// (malformed ones included).
	Rejected []Rejection
	// HealthIPs are the addresses of the node's health endpoint as its
	// TendrilNode publishes them (TendrilHealthIP), unchecked: readers
	// take them through HealthEndpointIPs.
	HealthIPs []netip.Addr
	// WireGuardKey is the node's WireGuard public key as its TendrilNode
	// publishes it, checked (wgkey.ParsePublicKey): "" when it publishes
	// none or a malformed one (then KeyError says why).
	WireGuardKey string
	// KeyError is why the published key was refused ("" if it was not).
	KeyError string
	// Status is the reconciler's (the node's remote-node ipcache claims):
	// pending, done, or error with message.
	Status reconciler.Status
}

// HealthEndpointIPs are the published health endpoint addresses that lie
// inside one of the node's accepted pod CIDRs (another node wrote them:
// an address outside its own pods' range, the node's own, a service's or
// any other, is not probed), at most one per family.
func (p *Peer) HealthEndpointIPs() []netip.Addr {
	var out []netip.Addr
	var v4, v6 bool
	for _, ip := range p.HealthIPs {
		ip = ip.Unmap()
		if (ip.Is4() && v4) || (ip.Is6() && v6) {
			continue
		}
		for _, c := range p.PodCIDRs {
			if c.Contains(ip) && ip != c.Masked().Addr() {
				out = append(out, ip)
				v4, v6 = v4 || ip.Is4(), v6 || ip.Is6()
				break
			}
		}
	}
	return out
}

// primaryNodeIP is the node's first address judged its own (InternalIP
// first): the host IP its health endpoint's addresses name, of both
// families, as its pods' do (their TendrilEndpoints' status names the
// node's primary address). In the tunnel mode that is the outer address
// both ways: a pod's packet to the IPv6 health endpoint encapsulated to
// the node's IPv6 address (the family's next hop, as before) arrived from
// an outer source the receiver's ipcache did not give the pod, and was
// dropped as an invalid source, while the node's own probes passed.
func (p *Peer) primaryNodeIP() (netip.Addr, bool) {
	if len(p.NodeIPs) == 0 {
		return netip.Addr{}, false
	}
	return p.NodeIPs[0], true
}

// nextHop is the peer's node address of the CIDR's family.
func (p *Peer) nextHop(cidr netip.Prefix) (netip.Addr, bool) {
	for _, ip := range p.NodeIPs {
		if ip.Is4() == cidr.Addr().Is4() {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// sameSpec reports whether two versions of a peer want the same state.
func (p *Peer) sameSpec(o *Peer) bool {
	return p.Name == o.Name && slices.Equal(p.IPs, o.IPs) && slices.Equal(p.PodCIDRs, o.PodCIDRs) &&
		slices.Equal(p.NodeIPs, o.NodeIPs) && slices.Equal(p.RefusedIPs, o.RefusedIPs)
}

// TableHeader implements statedb.TableWritable (`tendril statedb dump`).
func (p *Peer) TableHeader() []string {
	return []string{"Name", "IPs", "PodCIDRs", "Rejected", "RefusedIPs", "Status"}
}

// TableRow implements statedb.TableWritable.
func (p *Peer) TableRow() []string {
	return []string{p.Name, joinStrings(p.IPs), joinStrings(p.PodCIDRs), joinStrings(p.Rejected), joinStrings(p.RefusedIPs), p.Status.String()}
}

func (p *Peer) clone() *Peer {
	c := *p
	return &c
}

func (p *Peer) setStatus(s reconciler.Status) *Peer {
	p.Status = s
	return p
}

func (p *Peer) getStatus() reconciler.Status { return p.Status }

// PeerNameIndex is the nodes table's primary index.
var PeerNameIndex = statedb.Index[*Peer, string]{
	Name: "name",
	FromObject: func(p *Peer) index.KeySet {
		return index.NewKeySet(index.String(p.Name))
	},
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// Route is a route to a peer's pod CIDR via the peer's address: the
// routes table's object, realized in the kernel's main table.
type Route struct {
	Prefix  netip.Prefix
	NextHop netip.Addr
	// Node is the peer whose pod CIDR this is.
	Node   string
	Status reconciler.Status
}

// TableHeader implements statedb.TableWritable.
func (r *Route) TableHeader() []string { return []string{"Prefix", "NextHop", "Node", "Status"} }

// TableRow implements statedb.TableWritable.
func (r *Route) TableRow() []string {
	return []string{r.Prefix.String(), r.NextHop.String(), r.Node, r.Status.String()}
}

func (r *Route) clone() *Route {
	c := *r
	return &c
}

func (r *Route) setStatus(s reconciler.Status) *Route {
	r.Status = s
	return r
}

func (r *Route) getStatus() reconciler.Status { return r.Status }

// RoutePrefixIndex is the routes table's primary index: one route per
// destination.
var RoutePrefixIndex = statedb.Index[*Route, netip.Prefix]{
	Name: "prefix",
	FromObject: func(r *Route) index.KeySet {
		return index.NewKeySet(index.NetIPPrefix(r.Prefix))
	},
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

func joinStrings[T interface{ String() string }](xs []T) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	return strings.Join(out, ",")
}
