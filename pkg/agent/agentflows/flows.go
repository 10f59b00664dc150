// Package agentflows is the agent's flows cell: the observer that decodes
// the datapath's events into flows (with the node's knowledge of
// endpoints, identities, services and policies), its flow metrics and
// export, and the Hubble API server, with the configuration and flags of
// all of it (--enable-hubble, --hubble-*).
package agentflows

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/cgroupmeta"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/hubble/flowmetrics"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletls"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/backendaddrs"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy"
	policyk8s "github.com/tendril-net/tendril/pkg/policy/k8s"
	"github.com/tendril-net/tendril/pkg/version"
)

// Config is the flows' part of the agent's configuration: the
// observer's ring, the Hubble API's listeners and how many forwarded
// packets the datapath reports.
type Config struct {
	// Enable decodes the datapath's events into flows and serves them.
	Enable bool `mapstructure:"enable-hubble"`
	// Socket is the Hubble API's unix socket; empty: hubble.sock in the
	// directory of the agent's API socket (--socket).
	Socket string `mapstructure:"hubble-socket"`
	// ListenAddress is an optional TCP address (host:port) of the Hubble
	// API, for the relay; empty: none.
	ListenAddress string `mapstructure:"hubble-listen-address"`
	// TLS of the TCP listener (Cilium's flags): a certificate and key,
	// client CAs for mTLS, or DisableTLS to serve plain text explicitly.
	TLSCertFile      string   `mapstructure:"hubble-tls-cert-file"`
	TLSKeyFile       string   `mapstructure:"hubble-tls-key-file"`
	TLSClientCAFiles []string `mapstructure:"hubble-tls-client-ca-files"`
	DisableTLS       bool     `mapstructure:"hubble-disable-tls"`
	// DisableClientAuth serves TLS clients without a certificate: an
	// explicit choice, since without client CAs anyone who reaches the
	// port reads every flow of the node.
	DisableClientAuth bool `mapstructure:"hubble-disable-client-auth"`
	// MaxConcurrentStreams bounds the streams of one connection, and
	// MaxConnections the TCP listener's connections.
	MaxConcurrentStreams uint32 `mapstructure:"hubble-max-concurrent-streams"`
	MaxConnections       int    `mapstructure:"hubble-max-connections"`
	// ClusterName goes into this node's TLS server name
	// (<node>.<cluster>.hubble-grpc.tendril.io).
	ClusterName string `mapstructure:"hubble-cluster-name"`
	// FlowBufferSize is the number of flows the ring keeps.
	FlowBufferSize int `mapstructure:"hubble-flow-buffer-size"`
	// TraceEvents is which forwarded packets the datapath reports:
	// per-connection, all or off (drops and verdicts are always reported).
	TraceEvents string `mapstructure:"hubble-trace-events"`
	// MetricsExport are the flow metrics and the export to a file.
	MetricsExport MetricsConfig `mapstructure:",squash"`
}

// Values of --hubble-trace-events.
const (
	TraceEventsPerConnection = "per-connection"
	TraceEventsAll           = "all"
	TraceEventsOff           = "off"
)

// Defaults of the Hubble API's limits: a relay holds one connection per
// node with a handful of streams, a CLI one connection with one stream;
// the bounds leave room for many of both and stop a client that opens
// without end.
const (
	DefaultMaxConcurrentStreams = 64
	DefaultMaxConnections       = 128
)

// DefaultConfig returns the flows' defaults.
func DefaultConfig() Config {
	return Config{Enable: true, FlowBufferSize: observer.DefaultRingCapacity, TraceEvents: TraceEventsPerConnection, ClusterName: "default",
		MaxConcurrentStreams: DefaultMaxConcurrentStreams, MaxConnections: DefaultMaxConnections,
		MetricsExport: DefaultMetricsConfig()}
}

// Flags registers the flows' flags, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-hubble", c.Enable, "Decode the datapath's events into flows and serve them with the Hubble API (tendril observe, hubble observe)")
	fs.String("hubble-socket", c.Socket, "Unix socket of the Hubble API (default: hubble.sock beside --socket)")
	fs.String("hubble-listen-address", c.ListenAddress, "TCP address (host:port) of the Hubble API, for the relay (TLS unless --hubble-disable-tls); empty: none")
	fs.String("hubble-tls-cert-file", c.TLSCertFile, "PEM certificate of the Hubble API's TCP listener (its name: <node>.<cluster>.hubble-grpc.tendril.io)")
	fs.String("hubble-tls-key-file", c.TLSKeyFile, "PEM private key of --hubble-tls-cert-file")
	fs.StringSlice("hubble-tls-client-ca-files", c.TLSClientCAFiles, "PEM CAs of the clients' certificates: when given, clients of the TCP listener must present one (mTLS)")
	fs.Bool("hubble-disable-tls", c.DisableTLS, "Serve the Hubble API's TCP listener in plain text")
	fs.Bool("hubble-disable-client-auth", c.DisableClientAuth, "Serve TLS clients of the TCP listener without a client certificate (anyone who reaches the port reads every flow of the node); without it, --hubble-tls-client-ca-files is required")
	fs.Uint32("hubble-max-concurrent-streams", c.MaxConcurrentStreams, "Streams (RPCs) one connection to the Hubble API may have open at once")
	fs.Int("hubble-max-connections", c.MaxConnections, "Connections the Hubble API's TCP listener keeps open at once; one more is closed at once")
	fs.String("hubble-cluster-name", c.ClusterName, "Cluster name in the nodes' TLS server names")
	fs.Int("hubble-flow-buffer-size", c.FlowBufferSize, "Flows kept in the node's ring")
	fs.String("hubble-trace-events", c.TraceEvents, "Forwarded packets reported as flows: per-connection (a connection's first packets and TCP flag changes), all (every packet) or off (drops and policy verdicts only)")
	c.MetricsExport.Flags(fs)
}

// validate is Validate, marked as a configuration error.
func (c Config) validate() error { return option.Invalid(c.Validate()) }

// Validate checks the flows' options.
func (c Config) Validate() error {
	if _, err := c.TraceMode(); err != nil {
		return err
	}
	if c.FlowBufferSize < 1 {
		return fmt.Errorf("hubble-flow-buffer-size %d: must be positive", c.FlowBufferSize)
	}
	if c.Socket != "" && !filepath.IsAbs(c.Socket) {
		return fmt.Errorf("hubble-socket %q: must be an absolute path", c.Socket)
	}
	if c.ListenAddress != "" {
		if _, _, err := net.SplitHostPort(c.ListenAddress); err != nil {
			return fmt.Errorf("hubble-listen-address %q: %w", c.ListenAddress, err)
		}
		if !c.DisableTLS && (c.TLSCertFile == "" || c.TLSKeyFile == "") {
			return fmt.Errorf("hubble-listen-address %q: TLS needs --hubble-tls-cert-file and --hubble-tls-key-file (or --hubble-disable-tls for plain text)", c.ListenAddress)
		}
		if !c.DisableTLS && len(c.TLSClientCAFiles) == 0 && !c.DisableClientAuth {
			return fmt.Errorf("hubble-listen-address %q: TLS clients must present a certificate: give --hubble-tls-client-ca-files (or --hubble-disable-client-auth to serve every flow of the node to any client that reaches the port)", c.ListenAddress)
		}
	}
	if c.DisableTLS && (c.TLSCertFile != "" || len(c.TLSClientCAFiles) > 0) {
		return errors.New("hubble-disable-tls with TLS files: choose one")
	}
	if c.DisableClientAuth && len(c.TLSClientCAFiles) > 0 {
		return errors.New("hubble-disable-client-auth with --hubble-tls-client-ca-files: choose one")
	}
	if c.MaxConcurrentStreams < 1 {
		return fmt.Errorf("hubble-max-concurrent-streams %d: must be positive", c.MaxConcurrentStreams)
	}
	if c.MaxConnections < 1 {
		return fmt.Errorf("hubble-max-connections %d: must be positive", c.MaxConnections)
	}
	return c.MetricsExport.Validate()
}

// tlsConfig is the TCP listener's TLS, or nil for plain text (or no TCP).
func (c Config) tlsConfig() (*tls.Config, error) {
	if c.ListenAddress == "" || c.DisableTLS {
		return nil, nil
	}
	cfg, err := hubbletls.Server{CertFile: c.TLSCertFile, KeyFile: c.TLSKeyFile, ClientCAFiles: c.TLSClientCAFiles,
		AllowAnyClient: c.DisableClientAuth}.Config()
	if err != nil {
		return nil, fmt.Errorf("hubble TLS: %w", err)
	}
	return cfg, nil
}

// TraceMode is the loader's trace mode of the flag; off when flows are
// disabled (nobody would read the events).
func (c Config) TraceMode() (loader.TraceMode, error) {
	switch c.TraceEvents {
	case TraceEventsPerConnection:
		if !c.Enable {
			return loader.TraceOff, nil
		}
		return loader.TracePerConnection, nil
	case TraceEventsAll:
		if !c.Enable {
			return loader.TraceOff, nil
		}
		return loader.TraceEveryPacket, nil
	case TraceEventsOff:
		return loader.TraceOff, nil
	}
	return loader.TraceOff, fmt.Errorf("hubble-trace-events %q: must be %s, %s or %s", c.TraceEvents, TraceEventsPerConnection, TraceEventsAll, TraceEventsOff)
}

// SocketPath is the Hubble socket: the flag, or beside the agent's API
// socket.
func (c Config) SocketPath(apiSocket string) string {
	if c.Socket != "" {
		return c.Socket
	}
	return filepath.Join(filepath.Dir(apiSocket), "hubble.sock")
}

// Cell turns the datapath's events into flows (the observer, fed by the
// datapath's event reader) and serves them with the Hubble API from start
// step 10 (registered by the agent's serve cell, before the API socket).
var Cell = cell.Module("flows", "Flows observed from the datapath events and the Hubble API",
	cell.Provide(lifecycle.Build[*Module]),
	cell.Config(DefaultConfig()),
	cell.Provide(New, statusContribution, nodeEventsOf, traceMode, l7SinkOf),
	cell.ProvidePrivate(nodeOf),
)

// l7SinkOf is where the node's proxies (DNS, HTTP) publish their L7
// flows: the observer, so they are served, counted and exported as the
// datapath's are; with flows off, a sink that drops them (the proxies
// still enforce).
func l7SinkOf(m *Module) observer.L7Sink {
	if m == nil {
		return discardL7{}
	}
	return m.observer
}

// discardL7 is the sink without an observer.
type discardL7 struct{}

func (discardL7) PublishL7(*flowpb.Flow) {}

// traceMode is the trace events the datapath reports (its loader's
// configuration, and the socket load-balancer's): this cell's
// --hubble-trace-events, off with flows disabled.
func traceMode(c Config) loader.TraceMode {
	mode, _ := c.TraceMode() // validated with the config
	return mode
}

// nodeOf is what the cell reads of the agent's options.
func nodeOf(n option.LocalNode, api server.Config) Node {
	return Node{Name: n.Name, APISocket: api.Socket}
}

// Node is what the cell needs to know of the agent: the node's name and
// the agent's API socket (the Hubble socket defaults to beside it).
type Node struct {
	Name      string
	APISocket string
}

// Datapath is the datapath as the flows read it; nil without one.
type Datapath interface {
	// SetEventSink makes every event read go to sink; called before the
	// hive starts, so before the event reader's job runs.
	SetEventSink(sink func(loader.Event))
	// EventsLost reads the datapath's lost-event counters.
	EventsLost() (loader.EventsLost, error)
}

// Endpoints finds a local endpoint by ID (false before the endpoint
// manager exists), as flows name it.
type Endpoints interface {
	LookupNames(id uint16) (endpointmanager.Names, bool)
}

// Policy is the policy as the flows name it.
type Policy interface {
	Repository() *policy.Repository
	// CIDRIdentityLabels is the label of the prefix the policy gave a
	// node-local identity, or nil.
	CIDRIdentityLabels(id identity.NumericIdentity) []string
	// SelectingRules are the IDs of the rules that select a local
	// endpoint, as its last resolution found them; false before its first.
	SelectingRules(epID uint16) ([]uint32, bool)
}

// NodeEvents subscribes to the Node objects (for the Peer service); nil
// in standalone mode. It returns a nil unsubscribe when the watchers are
// not running.
type NodeEvents func(fn func(watchers.Event[*corev1.Node])) (unsubscribe func(), err error)

// Module owns the observer and its Hubble server; nil when flows are
// disabled or there is no datapath (no events).
type Module struct {
	observer *observer.Observer
	server   *hubble.Server

	log                *slog.Logger
	socket, tcpAddress string
	// lost reads the datapath's lost-event counters.
	lost        func() (loader.EventsLost, error)
	metricNames []string
	// export is nil without --hubble-export-file-path.
	export *flowExport
	// peers are the cluster's nodes for the Peer service, filled from the
	// Node objects from start on; nil without Kubernetes or without a TCP
	// listener (the node announces only itself).
	peers       *hubble.PeerSet
	nodeEvents  NodeEvents
	port        string
	clusterName string
	tls         bool
	unsubscribe func()

	// backends names the service of a backend address for the flows,
	// kept by a follower of the backends table from Start to Stop.
	db             *statedb.DB
	backendsTbl    statedb.Table[*loadbalancer.Backend]
	backends       *backendaddrs.Index
	stopFollowing  context.CancelFunc
	followingEnded chan struct{}
}

// Params are the cell's dependencies.
type Params struct {
	cell.In

	Config   Config
	Node     Node
	Root     cell.RootLogger
	Datapath Datapath `optional:"true"`
	// IPCache is the datapath cell's ipcache (local and remote pods'
	// addresses); nil without the datapath.
	IPCache    *ipcache.IPCache
	Endpoints  Endpoints
	Policy     Policy
	Identities *identitytable.Table
	Metrics    *metrics.Server
	// DB, Frontends and Backends are the services tables (the services
	// cell's) flows name their services from.
	DB         *statedb.DB
	Frontends  statedb.Table[*loadbalancer.Frontend]
	Backends   statedb.Table[*loadbalancer.Backend]
	NodeEvents NodeEvents `optional:"true"`
	// Cgroups names the pod of a socket-LB event's cgroup (nil without
	// the socket load-balancer).
	Cgroups *cgroupmeta.Resolver `optional:"true"`
}

// New builds the observer and the Hubble server; nil with flows off or
// without the datapath.
func New(p Params) (*Module, error) {
	// Validated here, not by a lifecycle.Check of the module: another
	// module may need the flows (the proxies' L7 sink) before the root
	// Invoke reaches this module's part, and an option's own error says
	// more than the TLS files' below.
	if err := p.Config.validate(); err != nil {
		return nil, err
	}
	if !p.Config.Enable || p.Datapath == nil {
		return nil, nil
	}
	hc := p.Config
	tlsCfg, err := hc.tlsConfig()
	if err != nil {
		// Files the options name that do not load: the configuration's
		// error, reported as the other invalid options.
		return nil, option.Invalid(err)
	}
	serverName := ""
	if tlsCfg != nil {
		serverName = hubbletls.ServerName(p.Node.Name, hc.ClusterName)
	}
	var peers *hubble.PeerSet
	port := ""
	if hc.ListenAddress != "" && p.NodeEvents != nil {
		peers = hubble.NewPeerSet()
		_, port, _ = net.SplitHostPort(hc.ListenAddress) // validated
	}
	repo := p.Policy.Repository()
	know := &nodeKnowledge{node: p.Node.Name, identities: p.Identities, eps: p.Endpoints, ipcache: p.IPCache, repo: repo, cidrLabels: p.Policy.CIDRIdentityLabels}
	know.services = &serviceKnowledge{db: p.DB, frontends: p.Frontends, backends: backendaddrs.New()}
	know.selecting, know.defaultDeny = p.Policy.SelectingRules, &defaultDenying{repo: repo}
	know.cgroups = p.Cgroups
	mx := p.Config.MetricsExport
	// The flow metrics and the export see every flow as it is decoded.
	var consumers []func(*flowpb.Flow)
	if len(mx.Metrics) > 0 {
		fm, err := flowmetrics.New(mx.metricsConfig(), p.Metrics.Registry)
		if err != nil {
			return nil, err
		}
		consumers = append(consumers, fm.Observe)
	}
	var export *flowExport
	if mx.ExportFilePath != "" {
		cfg, err := mx.exporterConfig()
		if err != nil {
			return nil, err
		}
		export = &flowExport{cfg: cfg}
		consumers = append(consumers, export.consume)
	}
	obs := observer.New(observer.Config{Capacity: p.Config.FlowBufferSize, Consumers: consumers}, know, logging.For(p.Root, "observer"))
	socket := hc.SocketPath(p.Node.APISocket)
	m := &Module{
		observer: obs,
		server: hubble.New(hubble.Config{SocketPath: socket, TCPAddress: hc.ListenAddress, Version: version.Version,
			TLS: tlsCfg, TLSServerName: serverName, Peers: peers,
			MaxConcurrentStreams: hc.MaxConcurrentStreams, MaxConnections: hc.MaxConnections}, obs, logging.For(p.Root, "hubble")),
		peers: peers, nodeEvents: p.NodeEvents, port: port, clusterName: hc.ClusterName, tls: tlsCfg != nil,
		log:         logging.For(p.Root, "hubble"),
		socket:      socket,
		tcpAddress:  hc.ListenAddress,
		lost:        p.Datapath.EventsLost,
		metricNames: mx.Metrics,
		export:      export,
		db:          p.DB,
		backendsTbl: p.Backends,
		backends:    know.services.backends,
	}
	p.Metrics.Registry.MustRegister(newFlowsCollector(obs))
	// The datapath's event reader feeds the observer; it is set before the
	// hive starts, so before the reader's job runs.
	p.Datapath.SetEventSink(func(ev loader.Event) {
		// A decode error is counted by the observer (DecodeErrors).
		_ = obs.Observe(ev)
	})
	return m, nil
}

// Start serves the Hubble API (step 10, beside metrics and pprof),
// follows the Node objects into the Peer service's set, and opens the
// export file first, so the flows served are exported too.
func (m *Module) Start(context.Context) error {
	if err := m.followBackends(); err != nil {
		return err
	}
	if m.export != nil {
		if err := m.export.start(m); err != nil {
			m.stopFollowingBackends()
			return err
		}
	}
	if err := m.startServing(); err != nil {
		if m.export != nil {
			_ = m.export.stop()
		}
		m.stopFollowingBackends()
		return err
	}
	return nil
}

// followBackends keeps the backend address index in step with the
// backends table until Stop.
func (m *Module) followBackends() error {
	f, err := backendaddrs.NewFollower(m.backends, m.db, m.backendsTbl)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.stopFollowing, m.followingEnded = cancel, make(chan struct{})
	go func() {
		defer close(m.followingEnded)
		f.Run(ctx)
	}()
	return nil
}

func (m *Module) stopFollowingBackends() {
	if m.stopFollowing != nil {
		m.stopFollowing()
		<-m.followingEnded
		m.stopFollowing = nil
	}
}

// startServing follows the nodes (for the Peer service) and serves.
func (m *Module) startServing() error {
	if m.peers != nil && m.nodeEvents != nil {
		unsub, err := m.nodeEvents(func(ev watchers.Event[*corev1.Node]) {
			switch ev.Kind {
			case watchers.Upsert:
				m.peers.Upsert(m.peerOf(ev.Object))
			case watchers.Delete:
				m.peers.Delete(ev.Key)
			}
		})
		if err != nil {
			return fmt.Errorf("follow nodes for the Peer service: %w", err)
		}
		m.unsubscribe = unsub
	}
	return m.server.Start()
}

// peerOf is how the Peer service announces a node: its first address
// (InternalIP first) with this node's Hubble port (every node of a
// cluster serves the same flags), and its TLS server name.
func (m *Module) peerOf(n *corev1.Node) hubble.Peer {
	p := hubble.Peer{Name: n.Name}
	if ips := nodemanager.PeerFromNode(n).IPs; len(ips) > 0 {
		p.Address = net.JoinHostPort(ips[0].String(), m.port)
	}
	if m.tls {
		p.TLSServerName = hubbletls.ServerName(n.Name, m.clusterName)
	}
	return p
}

// Stop ends every stream and joins the server's goroutines, then closes
// the export file.
func (m *Module) Stop(context.Context) error {
	if m.unsubscribe != nil {
		m.unsubscribe()
	}
	m.stopFollowingBackends()
	m.server.Stop()
	if m.export != nil {
		return m.export.stop()
	}
	return nil
}

// flowsCollector exports the observer's counters.
type flowsCollector struct {
	obs                     *observer.Observer
	seen, errors, followers *prometheus.Desc
}

func newFlowsCollector(obs *observer.Observer) *flowsCollector {
	return &flowsCollector{
		obs:       obs,
		seen:      prometheus.NewDesc("tendril_hubble_flows_seen_total", "Flows written to the ring: decoded from the datapath's events, and the proxies' L7 flows.", nil, nil),
		errors:    prometheus.NewDesc("tendril_hubble_decode_errors_total", "Datapath events that could not be decoded into flows.", nil, nil),
		followers: prometheus.NewDesc("tendril_hubble_followers", "GetFlows streams following the ring.", nil, nil),
	}
}

func (c *flowsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.seen
	ch <- c.errors
	ch <- c.followers
}

func (c *flowsCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.seen, prometheus.CounterValue, float64(c.obs.Ring().Seen()))
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(c.obs.DecodeErrors()))
	ch <- prometheus.MustNewConstMetric(c.followers, prometheus.GaugeValue, float64(c.obs.Followers()))
}

// nodeKnowledge is observer.NodeKnowledge over the agent's subsystems:
// the identities table, the endpoint manager, the ipcache table (local
// and remote pods' addresses) and the policy repository.
type nodeKnowledge struct {
	node       string
	identities *identitytable.Table
	eps        Endpoints
	ipcache    *ipcache.IPCache
	repo       *policy.Repository
	// cidrLabels names the policy's node-local CIDR identities.
	cidrLabels func(identity.NumericIdentity) []string
	// services names services by address (nil without the services).
	services *serviceKnowledge
	// selecting and defaultDeny name the policies behind a default deny.
	selecting   func(epID uint16) ([]uint32, bool)
	defaultDeny *defaultDenying
	// cgroups names a socket-LB flow's client pod (nil: none).
	cgroups *cgroupmeta.Resolver

	// policies is the repository's rules by cookie at revision rev,
	// rebuilt when the repository moves on (rules change rarely, events
	// are many).
	mu       sync.Mutex
	rev      uint64
	policies map[uint32]observer.Policy
}

var (
	_ observer.NodeKnowledge    = (*nodeKnowledge)(nil)
	_ observer.ServiceKnowledge = (*nodeKnowledge)(nil)

	_ observer.DefaultDenyKnowledge = (*nodeKnowledge)(nil)
)

// ServiceByAddr names the service of a frontend or backend address.
func (k *nodeKnowledge) ServiceByAddr(a netip.AddrPort, proto uint8) (observer.Service, bool) {
	return k.services.ServiceByAddr(a, proto)
}

func (k *nodeKnowledge) NodeName() string { return k.node }

// IdentityLabels: a reserved identity is its own label (reserved:world),
// a node-local one the CIDR the policy gave it (cidr:10.0.0.0/8); the
// others are the identities table's.
func (k *nodeKnowledge) IdentityLabels(id uint32) []string {
	nid := identity.NumericIdentity(id)
	if nid.IsReserved() {
		return []string{nid.String()}
	}
	if nid.IsLocal() {
		if k.cidrLabels == nil {
			return nil
		}
		return k.cidrLabels(nid)
	}
	if ident, ok := k.identities.Lookup(nid); ok {
		return ident.Labels
	}
	return nil
}

// EndpointByID is a local endpoint from the endpoint manager.
func (k *nodeKnowledge) EndpointByID(id uint16) (observer.Endpoint, bool) {
	ep, ok := k.eps.LookupNames(id)
	if !ok { // unknown, or the manager is not started yet
		return observer.Endpoint{}, false
	}
	return observer.Endpoint{ID: uint32(ep.ID), Identity: ep.Identity, Namespace: ep.PodNamespace, PodName: ep.PodName, Labels: ep.Labels}, true
}

// EndpointByIP is the ipcache's effective claim on the address: local
// endpoints, other nodes' pods (Kubernetes or kvstore) and the node's
// addresses, each with the pod it names.
func (k *nodeKnowledge) EndpointByIP(ip netip.Addr) (observer.Endpoint, bool) {
	ip = ip.Unmap()
	e, ok := k.ipcache.Lookup(netip.PrefixFrom(ip, ip.BitLen()))
	if !ok {
		return observer.Endpoint{}, false
	}
	ep := observer.Endpoint{Identity: uint32(e.Identity), Namespace: e.Namespace, PodName: e.Name}
	if id, ok := strings.CutPrefix(string(e.Owner), "endpoint/"); ok {
		if n, err := strconv.ParseUint(id, 10, 16); err == nil {
			ep.ID = uint32(n)
		}
	}
	return ep, true
}

// PolicyByCookie names the repository's rule whose ID is the cookie.
func (k *nodeKnowledge) PolicyByCookie(cookie uint32) (observer.Policy, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if rev := k.repo.Revision(); k.policies == nil || rev != k.rev {
		rules, rev := k.repo.Rules(nil)
		k.policies = make(map[uint32]observer.Policy, len(rules))
		for _, r := range rules {
			k.policies[r.ID] = policyOf(r, rev)
		}
		k.rev = rev
	}
	p, ok := k.policies[cookie]
	return p, ok
}

// policyOf names a stored rule as flows do: a Kubernetes object by its
// name, namespace and kind (the labels the agent puts on its rules); a
// rule imported through the API by its source and labels.
func policyOf(r policy.StoredRule, rev uint64) observer.Policy {
	p := observer.Policy{Namespace: r.Namespace, Revision: rev}
	if r.Rule != nil {
		for _, l := range r.Rule.Labels {
			switch l.Key {
			case policyk8s.KeyPolicyName:
				p.Name = l.Value
			case policyk8s.KeyPolicyNamespace:
				p.Namespace = l.Value
			case policyk8s.KeyPolicyDerivedFrom:
				p.Kind = l.Value
			}
		}
		p.Labels = r.Rule.Labels.Strings()
	}
	if p.Name == "" {
		// Not a Kubernetes object: the API's import names no policy.
		p.Name = r.Source
		if p.Name == "" {
			p.Name = "rule-" + strconv.FormatUint(uint64(r.ID), 10)
		}
	}
	return p
}

// EndpointByCgroup is the local pod whose cgroup a socket-LB event names.
func (k *nodeKnowledge) EndpointByCgroup(id uint64) (observer.Endpoint, bool) {
	return k.cgroups.EndpointByCgroup(id)
}
