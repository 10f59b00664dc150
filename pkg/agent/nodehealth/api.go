package nodehealth

import (
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/option"
)

// HealthResponse is GET /v1/health (Tendril's own shape): this node's
// view of every other node, per address.
type HealthResponse struct {
	// Self is this node's name.
	Self string `json:"self"`
	// Interval is the probe interval (a Go duration).
	Interval string `json:"interval"`
	// Nodes are the other nodes of the nodes table, by name, each with
	// the last round's results (none before its first probe).
	Nodes []NodeHealth `json:"nodes"`
	// Local is this node's own health endpoint, probed from the node
	// (absent without one, or before its first probe).
	Local *NodeHealth `json:"local,omitempty"`
}

// NodeHealth is one other node in GET /v1/health.
type NodeHealth struct {
	Name string `json:"name"`
	// Reachable: its primary address answered both probes.
	Reachable bool `json:"reachable"`
	// Probed: false until the node's first round is done.
	Probed    bool      `json:"probed"`
	Addresses []Address `json:"addresses"`
}

// HealthEndpoint is node's health endpoint result in r (false while the
// view has none: not published yet, or not accepted).
func (r HealthResponse) HealthEndpoint(node string) (Address, bool) {
	for _, n := range r.Nodes {
		if n.Name != node {
			continue
		}
		for _, a := range n.Addresses {
			if a.HealthEndpoint {
				return a, true
			}
		}
	}
	return Address{}, false
}

type apiParams struct {
	cell.In

	Node    option.LocalNode
	Peers   statedb.Table[*nodemanager.Peer]
	DB      *statedb.DB
	Checker *Checker
}

// apiHandlers serves GET /v1/health (not found with health checking off)
// and GET /v1/cluster/nodes (in every mode: it reads the nodes table).
func apiHandlers(p apiParams) server.HandlersOut {
	nodes := &clusterNodes{self: p.Node.Name, db: p.DB, peers: p.Peers, clients: map[int64]*nodesClient{}, now: time.Now}
	return server.Handlers(func(api *server.Server) {
		api.Handle(http.MethodGet, "/v1/health", func(w http.ResponseWriter, r *http.Request) error {
			if p.Checker == nil {
				return server.Errorf(http.StatusNotFound, "node health checking is off (--enable-health-checking=false)")
			}
			server.WriteJSON(w, http.StatusOK, p.Checker.Health())
			return nil
		})
		api.Handle(http.MethodGet, "/v1/cluster/nodes", nodes.handle)
	})
}

// Health is GET /v1/health's body.
func (c *Checker) Health() HealthResponse {
	txn := c.db.ReadTxn()
	out := HealthResponse{Self: c.node, Interval: c.cfg.HealthCheckInterval.String(), Nodes: []NodeHealth{}}
	for peer := range c.peers.All(txn) {
		nh := NodeHealth{Name: peer.Name, Addresses: []Address{}}
		if st, _, ok := c.table.Get(txn, StatusByNode.Query(peer.Name)); ok {
			nh.Probed, nh.Reachable, nh.Addresses = true, st.Reachable(), st.Addresses
		}
		out.Nodes = append(out.Nodes, nh)
	}
	if st, _, ok := c.table.Get(txn, StatusByNode.Query(c.node)); ok {
		a, _ := st.HealthEndpoint()
		out.Local = &NodeHealth{Name: c.node, Probed: true, Reachable: a.Reachable(), Addresses: st.Addresses}
	}
	return out
}

// Clients of /v1/cluster/nodes that ask for differences are remembered
// this long after their last request, and at most this many.
const (
	nodesClientTTL  = 10 * time.Minute
	maxNodesClients = 256
)

// clusterNodes serves GET /v1/cluster/nodes as the Cilium v1 API defines
// it (models.ClusterNodeStatus): without a client-id header, or with one
// the agent does not know (or has forgotten), every node as added and a
// new client-id; with a known client-id, the nodes added (or changed:
// removed, then added again, as Cilium reports them) and removed since
// that client's last request.
type clusterNodes struct {
	self  string
	db    *statedb.DB
	peers statedb.Table[*nodemanager.Peer]
	now   func() time.Time

	mu      sync.Mutex
	nextID  int64
	clients map[int64]*nodesClient
}

// nodesClient is what a client last saw.
type nodesClient struct {
	nodes map[string]*models.NodeElement
	seen  time.Time
}

func (c *clusterNodes) handle(w http.ResponseWriter, r *http.Request) error {
	var id int64
	if h := r.Header.Get("client-id"); h != "" {
		v, err := strconv.ParseInt(h, 10, 64)
		if err != nil {
			return server.Errorf(http.StatusBadRequest, "client-id %q: not an integer", h)
		}
		id = v
	}
	server.WriteJSON(w, http.StatusOK, c.status(id))
	return nil
}

// status answers client id (0: none).
func (c *clusterNodes) status(id int64) *models.ClusterNodeStatus {
	now := map[string]*models.NodeElement{}
	for peer := range c.peers.All(c.db.ReadTxn()) {
		now[peer.Name] = NodeElement(peer)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire()
	out := &models.ClusterNodeStatus{Self: c.self, NodesAdded: []*models.NodeElement{}, NodesRemoved: []*models.NodeElement{}}
	last, known := c.clients[id]
	if !known {
		c.nextID++
		id = c.nextID
		last = &nodesClient{}
		c.clients[id] = last
	}
	for name, n := range now {
		old, had := last.nodes[name]
		if had && reflect.DeepEqual(old, n) {
			continue
		}
		if had {
			out.NodesRemoved = append(out.NodesRemoved, old)
		}
		out.NodesAdded = append(out.NodesAdded, n)
	}
	for name, old := range last.nodes {
		if _, ok := now[name]; !ok {
			out.NodesRemoved = append(out.NodesRemoved, old)
		}
	}
	sortNodes(out.NodesAdded)
	sortNodes(out.NodesRemoved)
	last.nodes, last.seen = now, c.now()
	out.ClientID = id
	return out
}

// expire forgets clients not seen for nodesClientTTL, and the least
// recently seen beyond maxNodesClients (one is about to be added).
func (c *clusterNodes) expire() {
	t := c.now()
	for id, cl := range c.clients {
		if t.Sub(cl.seen) > nodesClientTTL {
			delete(c.clients, id)
		}
	}
	for len(c.clients) >= maxNodesClients {
		var oldest int64
		first := true
		for id, cl := range c.clients {
			if first || cl.seen.Before(c.clients[oldest].seen) {
				oldest, first = id, false
			}
		}
		delete(c.clients, oldest)
	}
}

func sortNodes(ns []*models.NodeElement) {
	sort.Slice(ns, func(i, j int) bool { return ns[i].Name < ns[j].Name })
}

// NodeElement is a peer as the Cilium v1 API shows a node: its first
// address of each family is its primary address (InternalIP first in
// the nodes table), the others are secondary addresses.
func NodeElement(p *nodemanager.Peer) *models.NodeElement {
	n := &models.NodeElement{Name: p.Name, PrimaryAddress: &models.NodeAddressing{
		IPV4: &models.NodeAddressingElement{}, IPV6: &models.NodeAddressingElement{},
	}, SecondaryAddresses: []*models.NodeAddressingElement{}}
	for _, ip := range p.IPs {
		fam := n.PrimaryAddress.IPV4
		if ip.Unmap().Is6() {
			fam = n.PrimaryAddress.IPV6
		}
		if !fam.Enabled {
			fam.Enabled, fam.IP = true, ip.Unmap().String()
			continue
		}
		n.SecondaryAddresses = append(n.SecondaryAddresses, &models.NodeAddressingElement{Enabled: true, IP: ip.Unmap().String()})
	}
	// The pod CIDRs that passed the checks, as Cilium's alloc ranges
	// (cilium-dbg node list's "Endpoint CIDR").
	for _, cidr := range p.PodCIDRs {
		fam := n.PrimaryAddress.IPV4
		if cidr.Addr().Is6() {
			fam = n.PrimaryAddress.IPV6
		}
		if fam.AllocRange == "" {
			fam.AllocRange = cidr.String()
		}
	}
	// The health endpoint's addresses that lie in those pod CIDRs (the
	// node published them; Cilium's health-endpoint-address).
	if health := p.HealthEndpointIPs(); len(health) > 0 {
		n.HealthEndpointAddress = &models.NodeAddressing{IPV4: &models.NodeAddressingElement{}, IPV6: &models.NodeAddressingElement{}}
		for _, ip := range health {
			fam := n.HealthEndpointAddress.IPV4
			if ip.Is6() {
				fam = n.HealthEndpointAddress.IPV6
			}
			fam.Enabled, fam.IP = true, ip.String()
		}
	}
	return n
}
