// Package loadbalancer holds the node's services as statedb tables: the
// services (their options), their backends (one row per service, source
// and address) and the frontends the datapath translates (address, port,
// protocol → service, with the backends selected for it). Sources (the
// Kubernetes watchers) write them through a Writer in short transactions;
// the lbmap reconciler writes the frontends into the BPF maps. Nothing here
// knows about Kubernetes or BPF.
package loadbalancer

import (
	"fmt"
	"iter"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
)

// Protocol numbers of a frontend or backend (IANA, as the datapath keys
// them).
const (
	TCP  uint8 = 6
	UDP  uint8 = 17
	SCTP uint8 = 132
)

// ProtoName is the protocol's name (TCP, UDP, SCTP).
func ProtoName(p uint8) string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return strconv.Itoa(int(p))
}

// ParseProto is ProtoName's inverse (case-insensitive).
func ParseProto(s string) (uint8, error) {
	switch strings.ToUpper(s) {
	case "TCP":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "SCTP":
		return SCTP, nil
	}
	return 0, fmt.Errorf("protocol %q: must be TCP, UDP or SCTP", s)
}

// ServiceName is a service's namespace and name.
type ServiceName struct {
	Namespace, Name string
}

func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// ServicePort is one port of a service.
type ServicePort struct {
	Name  string
	Port  uint16
	Proto uint8
	// NodePort is the port on every node address (NodePort and
	// LoadBalancer services; 0: none).
	NodePort uint16
}

// Traffic policies (internalTrafficPolicy).
const (
	TrafficPolicyCluster = "Cluster"
	TrafficPolicyLocal   = "Local"
)

// Frontend types, as Cilium's API names them (models.ServiceSpecFlags
// Type): what kind of address of the service a frontend is.
const (
	FrontendClusterIP    = "ClusterIP"
	FrontendNodePort     = "NodePort"
	FrontendExternalIP   = "ExternalIPs"
	FrontendLoadBalancer = "LoadBalancer"
	// FrontendHostPort is a pod's hostPort: this node's addresses (or
	// the pod's hostIP) on the host port, to the pod's container port.
	FrontendHostPort = "HostPort"
)

// Service is a service's options, as its source gives them.
type Service struct {
	Name ServiceName
	// Type is the source's kind of service (ClusterIP, NodePort,
	// LoadBalancer).
	Type string
	// Addresses are the cluster IPs (one per family at most).
	Addresses []netip.Addr
	Ports     []ServicePort
	// Affinity is ClientIP session affinity, for AffinityTimeout seconds.
	Affinity        bool
	AffinityTimeout uint32
	// InternalTrafficPolicy Local keeps only this node's backends.
	InternalTrafficPolicy string
	// Maglev selects backends by Maglev hashing instead of at random.
	Maglev bool
	// TrafficDistribution is spec.trafficDistribution, as written (shown,
	// not acted on: the EndpointSlice hints it makes the controller
	// write are, in every case; see TopologyMode).
	TrafficDistribution string

	// ExternalIPs are spec.externalIPs, LoadBalancerIPs the addresses of
	// status.loadBalancer.ingress: frontends on the service's ports.
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	// ExternalTrafficPolicy Local serves the node ports, external and
	// load-balancer addresses from this node's backends only (the
	// client's address is kept); Cluster (the default) from all.
	ExternalTrafficPolicy string
	// HealthCheckNodePort answers, with ExternalTrafficPolicy Local,
	// how many local backends the service has (0: none).
	HealthCheckNodePort uint16
	// SourceRanges are spec.loadBalancerSourceRanges: the clients the
	// load-balancer addresses admit (empty: every client).
	SourceRanges []netip.Prefix

	// Labels, UID and Created are the source object's: which policies
	// select the service, what its events name, and which of two
	// services claiming one address came first (L2 announcements).
	Labels  map[string]string
	UID     string
	Created time.Time
}

// ExternalLocal reports whether external traffic is served by this node's
// backends only.
func (s *Service) ExternalLocal() bool { return s.ExternalTrafficPolicy == TrafficPolicyLocal }

// TableHeader implements statedb.TableWritable.
func (s *Service) TableHeader() []string {
	return []string{"Name", "Type", "Addresses", "Ports", "Affinity", "InternalTrafficPolicy", "Maglev"}
}

// TableRow implements statedb.TableWritable.
func (s *Service) TableRow() []string {
	var addrs, ports []string
	for _, a := range s.Addresses {
		addrs = append(addrs, a.String())
	}
	for _, p := range s.Ports {
		port := fmt.Sprintf("%s:%d/%s", p.Name, p.Port, ProtoName(p.Proto))
		if p.NodePort != 0 {
			port += fmt.Sprintf("(node %d)", p.NodePort)
		}
		ports = append(ports, port)
	}
	aff := "None"
	if s.Affinity {
		aff = fmt.Sprintf("ClientIP(%ds)", s.AffinityTimeout)
	}
	return []string{s.Name.String(), s.Type, strings.Join(addrs, ","), strings.Join(ports, ","), aff, s.InternalTrafficPolicy, strconv.FormatBool(s.Maglev)}
}

// Backend is one address of a service, as one source (an EndpointSlice)
// lists it, with its conditions.
type Backend struct {
	Service ServiceName
	// Source names what listed it (the EndpointSlice's name): a service's
	// backends are replaced per source.
	Source   string
	Addr     netip.AddrPort
	PortName string
	NodeName string
	Zone     string
	// Hints are the zones and nodes the source hints this backend for
	// (EndpointSlice hints.forZones, hints.forNodes; see TopologyMode),
	// nil without hints. Behind a pointer, since most backends have
	// none: 144 bytes a row instead of 192 with the two slices inline
	// (a million rows at 100,000 services of 10 backends).
	Hints *Hints
	// Proto beside the flags, which pack into one word.
	Proto uint8
	// Ready, Serving and Terminating are the EndpointSlice conditions.
	Ready, Serving, Terminating bool
}

// key is the backend's primary key: its service, source, address, port
// and protocol, the address in binary (4 or 16 bytes). Every index of the
// table holds a copy of it (a non-unique index's key ends in the
// primary key), so it is kept short: 35 bytes for a typical
// EndpointSlice backend instead of 47 as text. The delimiter after each
// name is keyDelim, a byte no name or source holds, and the address's
// length tells its family.
func (b *Backend) key() index.Key {
	a := b.Addr.Addr()
	alen := 16
	if a.Is4() {
		alen = 4
	}
	k := make([]byte, 0, len(b.Service.Namespace)+len(b.Service.Name)+len(b.Source)+3+alen+3)
	k = append(append(k, b.Service.Namespace...), keyDelim)
	k = append(append(k, b.Service.Name...), keyDelim)
	k = append(append(k, b.Source...), keyDelim)
	return appendAddrPort(k, a, b.Addr.Port(), b.Proto)
}

// appendAddrPort appends a in binary (4 bytes for IPv4, 16 for IPv6, an
// IPv4-mapped address as 16: callers unmap it where the two are one),
// the port (big endian) and the protocol.
func appendAddrPort(k []byte, a netip.Addr, port uint16, proto uint8) []byte {
	if a.Is4() {
		v4 := a.As4()
		k = append(k, v4[:]...)
	} else {
		v6 := a.As16()
		k = append(k, v6[:]...)
	}
	return append(k, byte(port>>8), byte(port), proto)
}

// TableHeader implements statedb.TableWritable.
func (b *Backend) TableHeader() []string {
	return []string{"Service", "Source", "Address", "Protocol", "PortName", "Node", "Ready", "Serving", "Terminating"}
}

// TableRow implements statedb.TableWritable.
func (b *Backend) TableRow() []string {
	return []string{b.Service.String(), b.Source, b.Addr.String(), ProtoName(b.Proto), b.PortName, b.NodeName,
		strconv.FormatBool(b.Ready), strconv.FormatBool(b.Serving), strconv.FormatBool(b.Terminating)}
}

// FrontendKey is what the datapath looks a frontend up by.
type FrontendKey struct {
	Addr  netip.AddrPort
	Proto uint8
}

func (k FrontendKey) String() string { return k.Addr.String() + "/" + ProtoName(k.Proto) }

// FrontendBackend is a backend as a frontend uses it: the backends
// table's row (its Addr, NodeName and Zone are what a frontend reads) and
// what the frontend makes of it. One is kept per backend per frontend, so
// it points at the row the table and the EndpointSlice cache hold
// already: 16 bytes instead of 72 with the address and names copied
// (a million at 100,000 services of 10 backends). The row is never
// changed once in the table; a backend the writer makes for a frontend
// alone (a local redirect's pod) has a row of its own.
type FrontendBackend struct {
	*Backend

	// Terminating backends are kept (their flows drain) but get no new
	// flow unless no ready backend exists.
	Terminating bool
	// Active backends fill the service's slots (and Maglev table).
	Active bool
	// Local: the backend is on this node (NodeName is the writer's):
	// with externalTrafficPolicy Local, the ready local backends serve
	// clients from outside.
	Local bool
}

// Frontend is one address, port and protocol the datapath translates,
// with everything its BPF entries need: derived from the service and its
// backends by the Writer.
type Frontend struct {
	Key      FrontendKey
	Service  ServiceName
	PortName string
	// Type is the kind of address: FrontendClusterIP, FrontendNodePort,
	// FrontendExternalIP or FrontendLoadBalancer.
	Type string
	// Backends, active ones first, each group sorted by address.
	Backends              []FrontendBackend
	Affinity              bool
	AffinityTimeout       uint32
	InternalTrafficPolicy string
	Maglev                bool
	// ExternalTrafficPolicy is the service's for node port, external and
	// load-balancer frontends (Local: this node's backends only), empty
	// for cluster IPs.
	ExternalTrafficPolicy string
	// SourceRanges are the clients a load-balancer frontend admits
	// (empty: all).
	SourceRanges []netip.Prefix
	// Redirect is the local redirect policy whose local backends the
	// frontend has (Type FrontendLocalRedirect); zero otherwise.
	Redirect ServiceName
	// SkipClients are, for a redirect with skipRedirectFromBackend, the
	// network namespace cookies of the policy's own backend pods: the
	// socket hooks do not redirect them (SkipMode says where they go
	// instead). Sorted, no zero.
	SkipClients []uint64
	// SkipAddrs are the same pods' addresses (of the frontend's family):
	// the per-packet translation names them by the packet's source.
	SkipAddrs []netip.Addr
	// SkipMode is SkipToOriginal (a serviceMatcher: the service's own
	// backends, Original) or SkipPass (an addressMatcher: the address
	// itself, untranslated); empty without SkipClients and SkipAddrs.
	SkipMode string
	// Original are the service's own backends, as the frontend would
	// have them without the redirect (SkipToOriginal).
	Original []FrontendBackend

	// Status is the BPF maps reconciler's.
	Status reconciler.Status
}

// External reports whether clients from outside the node reach the
// frontend (through the host programs): every type but cluster IPs and
// local redirects, which only this node's pods and host use.
func (f *Frontend) External() bool {
	return f.Type != "" && f.Type != FrontendClusterIP && f.Type != FrontendLocalRedirect
}

// ActiveCount is the number of backends in the slots.
func (f *Frontend) ActiveCount() int {
	n := 0
	for _, b := range f.Backends {
		if b.Active {
			n++
		}
	}
	return n
}

// Clone is a shallow copy (the reconciler sets the status on it).
func (f *Frontend) Clone() *Frontend { c := *f; return &c }

// GetStatus returns the reconciliation status.
func (f *Frontend) GetStatus() reconciler.Status { return f.Status }

// SetStatus sets the reconciliation status.
func (f *Frontend) SetStatus(s reconciler.Status) *Frontend { f.Status = s; return f }

// TableHeader implements statedb.TableWritable.
func (f *Frontend) TableHeader() []string {
	return []string{"Address", "Type", "Service", "Port", "Backends", "Status"}
}

// TableRow implements statedb.TableWritable.
func (f *Frontend) TableRow() []string {
	var bs []string
	for _, b := range f.Backends {
		s := b.Addr.String()
		if b.Terminating {
			s += "(terminating)"
		}
		if !b.Active {
			s += "(inactive)"
		}
		bs = append(bs, s)
	}
	return []string{f.Key.String(), f.Type, f.Service.String(), f.PortName, strings.Join(bs, ","), f.Status.String()}
}

func nameKey(n ServiceName) index.Key { return index.String(n.String()) }

// keyDelim ends each name in a backend's key: 0xff is in no UTF-8 text
// (the API server's names are DNS labels, and JSON decodes to valid
// UTF-8), so no name runs into the next. Not NUL: statedb escapes each
// NUL (and 0x01) of a key into two bytes when it copies the primary key
// into a non-unique index's key, so any such index over the table would
// hold longer keys (the address index that was one went from the 48-byte
// size class to 80 with NULs).
const keyDelim = 0xff

// servicePrefix is how every backend key of service n starts (see
// Backend.key): its namespace and name, each ended by keyDelim, which
// neither holds.
func servicePrefix(n ServiceName) index.Key {
	k := make([]byte, 0, len(n.Namespace)+len(n.Name)+2)
	k = append(append(k, n.Namespace...), keyDelim)
	return append(append(k, n.Name...), keyDelim)
}

// ServiceBackends are service name's backends in the backends table (of
// every source), by the prefix of their primary keys.
func ServiceBackends(txn statedb.ReadTxn, backends statedb.Table[*Backend], name ServiceName) iter.Seq2[*Backend, statedb.Revision] {
	return backends.Prefix(txn, BackendByKey.Query(name))
}

// Indexes of the tables.
var (
	ServiceByName = statedb.Index[*Service, ServiceName]{
		Name:       "name",
		FromObject: func(s *Service) index.KeySet { return index.NewKeySet(nameKey(s.Name)) },
		FromKey:    nameKey,
		Unique:     true,
	}
	// ServiceByHealthCheck holds only the services that need a health
	// check node port (externalTrafficPolicy Local with a port; the key is
	// always true): the health server lists and watches them alone, so
	// the other services' changes do not wake it.
	ServiceByHealthCheck = statedb.Index[*Service, bool]{
		Name: "health-check",
		FromObject: func(s *Service) index.KeySet {
			if s.ExternalLocal() && s.HealthCheckNodePort != 0 {
				return index.NewKeySet(index.Bool(true))
			}
			return index.EmptyKeySet
		},
		FromKey: index.Bool,
	}
	// BackendByKey is the primary index (Backend.key: service, source,
	// address, port, protocol). Its query is a service: the prefix every
	// key of the service's backends starts with, for Prefix (see
	// ServiceBackends), so the table needs no index by service of its own:
	// a non-unique index holds a copy of every primary key (≈ 12 MiB of
	// the agent's heap at 10,000 services of 10 backends).
	BackendByKey = statedb.Index[*Backend, ServiceName]{
		Name:       "key",
		FromObject: func(b *Backend) index.KeySet { return index.NewKeySet(b.key()) },
		FromKey:    servicePrefix,
		Unique:     true,
	}
	FrontendByKey = statedb.Index[*Frontend, FrontendKey]{
		Name:       "address",
		FromObject: func(f *Frontend) index.KeySet { return index.NewKeySet(index.String(f.Key.String())) },
		FromKey:    func(k FrontendKey) index.Key { return index.String(k.String()) },
		Unique:     true,
	}
	FrontendByService = statedb.Index[*Frontend, ServiceName]{
		Name:       "service",
		FromObject: func(f *Frontend) index.KeySet { return index.NewKeySet(nameKey(f.Service)) },
		FromKey:    nameKey,
	}
)

// Tables are the services, backends and frontends tables, and the local
// redirect policies that change frontends.
type Tables struct {
	DB        *statedb.DB
	Services  statedb.RWTable[*Service]
	Backends  statedb.RWTable[*Backend]
	Frontends statedb.RWTable[*Frontend]
	Redirects statedb.RWTable[*LocalRedirect]
}

// NewTables creates and registers the tables in db.
func NewTables(db *statedb.DB) (*Tables, error) {
	t := &Tables{DB: db}
	var err error
	if t.Services, err = statedb.NewTable(db, "services", ServiceByName, ServiceByHealthCheck); err != nil {
		return nil, fmt.Errorf("services table: %w", err)
	}
	if t.Backends, err = statedb.NewTable(db, "backends", BackendByKey); err != nil {
		return nil, fmt.Errorf("backends table: %w", err)
	}
	if t.Frontends, err = statedb.NewTable(db, "frontends", FrontendByKey, FrontendByService); err != nil {
		return nil, fmt.Errorf("frontends table: %w", err)
	}
	if t.Redirects, err = statedb.NewTable(db, "local-redirects", RedirectByName, RedirectByService); err != nil {
		return nil, fmt.Errorf("local-redirects table: %w", err)
	}
	return t, nil
}
