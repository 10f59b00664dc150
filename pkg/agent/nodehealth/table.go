package nodehealth

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// TableName is the node health table.
const TableName = "node-health"

// Result is one probe's outcome.
type Result struct {
	Reachable bool `json:"reachable"`
	// Latency is the round trip of a probe that succeeded (ns in JSON).
	Latency time.Duration `json:"latency"`
	// Error is why the last probe failed ("" when it succeeded).
	Error string `json:"error,omitempty"`
	// Probed is when the probe was sent.
	Probed time.Time `json:"probed"`
}

func (r Result) String() string {
	if r.Reachable {
		return "ok " + r.Latency.Round(time.Microsecond).String()
	}
	return "unreachable: " + r.Error
}

// Address is the outcome of the probes of one of a node's addresses.
type Address struct {
	IP netip.Addr `json:"ip"`
	// HealthEndpoint: the address is the node's health endpoint's (a
	// pod-like namespace of its pod CIDR), not one of the node's own.
	HealthEndpoint bool   `json:"health-endpoint,omitempty"`
	ICMP           Result `json:"icmp"`
	HTTP           Result `json:"http"`
}

// Kind is "node" or "endpoint" (the health endpoint's address): the
// metrics' address_type label.
func (a Address) Kind() string {
	if a.HealthEndpoint {
		return "endpoint"
	}
	return "node"
}

// Reachable: both probes of the address succeeded.
func (a Address) Reachable() bool { return a.ICMP.Reachable && a.HTTP.Reachable }

// Status is the last probe round's outcome for one other node, by
// address (the order of the node's addresses: the primary, its
// InternalIP, first). Immutable once in the table; only the prober
// writes it.
type Status struct {
	Node      string    `json:"node"`
	Addresses []Address `json:"addresses"`
}

// Primary is the result of the node's primary address (its first), the
// one that says whether the node is reachable.
func (s *Status) Primary() (Address, bool) {
	if len(s.Addresses) == 0 || s.Addresses[0].HealthEndpoint {
		return Address{}, false
	}
	return s.Addresses[0], true
}

// HealthEndpoint is the result of the node's health endpoint's first
// address; false when the node publishes none that was accepted.
func (s *Status) HealthEndpoint() (Address, bool) {
	for _, a := range s.Addresses {
		if a.HealthEndpoint {
			return a, true
		}
	}
	return Address{}, false
}

// Reachable: the node's primary address answers both probes.
func (s *Status) Reachable() bool {
	p, ok := s.Primary()
	return ok && p.Reachable()
}

// TableHeader and TableRow print the table (`tendril statedb dump`).
func (s *Status) TableHeader() []string {
	return []string{"Node", "Address", "ICMP", "HTTP", "Probed"}
}

func (s *Status) TableRow() []string {
	var ips, icmp, http, probed []string
	for _, a := range s.Addresses {
		ip := a.IP.String()
		if a.HealthEndpoint {
			ip += " (health endpoint)"
		}
		ips = append(ips, ip)
		icmp = append(icmp, a.ICMP.String())
		http = append(http, a.HTTP.String())
		probed = append(probed, a.ICMP.Probed.UTC().Format(time.RFC3339))
	}
	return []string{s.Node, strings.Join(ips, ", "), strings.Join(icmp, ", "), strings.Join(http, ", "), strings.Join(probed, ", ")}
}

// StatusByNode is the table's primary index: the node's name.
var StatusByNode = statedb.Index[*Status, string]{
	Name:       "node",
	FromObject: func(s *Status) index.KeySet { return index.NewKeySet(index.String(s.Node)) },
	FromKey:    index.String,
	Unique:     true,
}

// NewTable registers the node health table in db.
func NewTable(db *statedb.DB) (statedb.RWTable[*Status], error) {
	t, err := statedb.NewTable(db, TableName, StatusByNode)
	if err != nil {
		return nil, fmt.Errorf("%s table: %w", TableName, err)
	}
	return t, nil
}
