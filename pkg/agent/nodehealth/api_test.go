package nodehealth

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/nodemanager"
)

func names(ns []*models.NodeElement) string {
	var out []string
	for _, n := range ns {
		out = append(out, n.Name)
	}
	return strings.Join(out, ",")
}

// TestClusterNodesClientID: GET /v1/cluster/nodes as the v1 API defines
// it: a first request (no client-id) gets every node as added and a
// client-id; a request with it gets what changed since that client's
// last one (a changed node removed and added again); an unknown
// client-id gets everything and a new id; a client-id that is not an
// integer is a 400.
func TestClusterNodesClientID(t *testing.T) {
	db := statedb.New()
	tables, err := nodemanager.NewTables(db)
	if err != nil {
		t.Fatal(err)
	}
	upsert := func(name string, ips ...string) {
		p := &nodemanager.Peer{Name: name}
		for _, ip := range ips {
			p.IPs = append(p.IPs, netip.MustParseAddr(ip))
		}
		w := db.WriteTxn(tables.Nodes)
		_, _, _ = tables.Nodes.Insert(w, p)
		w.Commit()
	}
	remove := func(name string) {
		w := db.WriteTxn(tables.Nodes)
		_, _, _ = tables.Nodes.Delete(w, &nodemanager.Peer{Name: name})
		w.Commit()
	}
	upsert("node-b", "172.31.0.2", "fd00::2", "10.1.0.2")
	upsert("node-c", "172.31.0.3")

	clock := time.Unix(0, 0)
	c := &clusterNodes{self: "node-a", db: db, peers: tables.Nodes, clients: map[int64]*nodesClient{}, now: func() time.Time { return clock }}
	handler := apiServer(t, []server.Registrar{func(s *server.Server) { s.Handle(http.MethodGet, "/v1/cluster/nodes", c.handle) }})
	call := func(id string) *models.ClusterNodeStatus {
		t.Helper()
		hdr := http.Header{}
		if id != "" {
			hdr.Set("client-id", id)
		}
		code, body := get(t, handler, "/v1/cluster/nodes", hdr)
		if code != http.StatusOK {
			t.Fatalf("client-id %q: %d %s", id, code, body)
		}
		var st models.ClusterNodeStatus
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatal(err)
		}
		return &st
	}

	first := call("")
	if first.Self != "node-a" || names(first.NodesAdded) != "node-b,node-c" || len(first.NodesRemoved) != 0 || first.ClientID == 0 {
		t.Fatalf("first call: %+v", first)
	}
	b := first.NodesAdded[0]
	if b.PrimaryAddress.IPV4.IP != "172.31.0.2" || !b.PrimaryAddress.IPV4.Enabled || b.PrimaryAddress.IPV6.IP != "fd00::2" ||
		len(b.SecondaryAddresses) != 1 || b.SecondaryAddresses[0].IP != "10.1.0.2" {
		t.Fatalf("node-b as a NodeElement: %+v %+v %+v", b.PrimaryAddress.IPV4, b.PrimaryAddress.IPV6, b.SecondaryAddresses)
	}
	if c := first.NodesAdded[1]; c.PrimaryAddress.IPV6.Enabled {
		t.Fatalf("node-c without IPv6: %+v", c.PrimaryAddress.IPV6)
	}
	id := strconv.FormatInt(first.ClientID, 10)

	if again := call(id); len(again.NodesAdded)+len(again.NodesRemoved) != 0 || again.ClientID != first.ClientID {
		t.Fatalf("nothing changed: %+v", again)
	}

	upsert("node-d", "172.31.0.4")
	upsert("node-b", "172.31.0.22")
	remove("node-c")
	diff := call(id)
	if names(diff.NodesAdded) != "node-b,node-d" || names(diff.NodesRemoved) != "node-b,node-c" {
		t.Fatalf("diff: added %s, removed %s", names(diff.NodesAdded), names(diff.NodesRemoved))
	}
	if diff.NodesRemoved[0].PrimaryAddress.IPV4.IP != "172.31.0.2" || diff.NodesAdded[0].PrimaryAddress.IPV4.IP != "172.31.0.22" {
		t.Fatal("a changed node is removed as it was and added as it is")
	}

	// A second client starts from everything; the first is unaffected.
	if other := call(""); other.ClientID == first.ClientID || names(other.NodesAdded) != "node-b,node-d" {
		t.Fatalf("second client: %+v", other)
	}
	// Forgotten after the TTL: everything again, with a new id.
	clock = clock.Add(nodesClientTTL + time.Second)
	if late := call(id); late.ClientID == first.ClientID || names(late.NodesAdded) != "node-b,node-d" {
		t.Fatalf("expired client: id %d, added %s", late.ClientID, names(late.NodesAdded))
	}
	if code, body := get(t, handler, "/v1/cluster/nodes", http.Header{"Client-Id": {"x"}}); code != http.StatusBadRequest || !strings.Contains(body, "client-id") {
		t.Fatalf("client-id x: %d %s", code, body)
	}
	// The clients remembered stay bounded.
	for range maxNodesClients + 10 {
		call("")
	}
	if n := len(c.clients); n > maxNodesClients {
		t.Fatalf("%d clients remembered, at most %d", n, maxNodesClients)
	}
}

// TestNodeElementAllocRanges: a node's accepted pod CIDRs are its alloc
// ranges, one per family (cilium-dbg node list's "Endpoint CIDR"); its
// requested but refused ones are not.
func TestNodeElementAllocRanges(t *testing.T) {
	p := &nodemanager.Peer{Name: "node-b",
		IPs:       []netip.Addr{netip.MustParseAddr("172.31.0.2"), netip.MustParseAddr("fd00::2")},
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
		Requested: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("0.0.0.0/0")},
	}
	n := NodeElement(p)
	if n.PrimaryAddress.IPV4.AllocRange != "10.244.1.0/24" || n.PrimaryAddress.IPV6.AllocRange != "fd00:10:244:1::/64" {
		t.Fatalf("alloc ranges %q %q", n.PrimaryAddress.IPV4.AllocRange, n.PrimaryAddress.IPV6.AllocRange)
	}
	p.PodCIDRs = nil
	if n := NodeElement(p); n.PrimaryAddress.IPV4.AllocRange != "" {
		t.Fatalf("alloc range %q from refused or absent pod CIDRs", n.PrimaryAddress.IPV4.AllocRange)
	}
}

// TestNodeElementHealthEndpointAddress: a node's health endpoint address
// inside its accepted pod CIDR is its health-endpoint-address (Cilium's
// field); one outside it, or none, gives no field.
func TestNodeElementHealthEndpointAddress(t *testing.T) {
	p := &nodemanager.Peer{Name: "node-b", IPs: []netip.Addr{netip.MustParseAddr("172.31.0.2")},
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
		HealthIPs: []netip.Addr{netip.MustParseAddr("10.244.1.7")}}
	n := NodeElement(p)
	if n.HealthEndpointAddress == nil || !n.HealthEndpointAddress.IPV4.Enabled || n.HealthEndpointAddress.IPV4.IP != "10.244.1.7" ||
		n.HealthEndpointAddress.IPV6.Enabled {
		t.Fatalf("health-endpoint-address %+v", n.HealthEndpointAddress)
	}
	p.HealthIPs = []netip.Addr{netip.MustParseAddr("172.31.0.3")}
	if n := NodeElement(p); n.HealthEndpointAddress != nil {
		t.Fatalf("health-endpoint-address %+v from an address outside the pod CIDR", n.HealthEndpointAddress)
	}
}
