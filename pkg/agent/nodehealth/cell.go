// Package nodehealth is the agent's cell for node health, after
// cilium-health: every agent answers HTTP probes on its health port
// (GET /hello) and probes every other node of the nodes table, ICMP echo
// and HTTP on each of the node's addresses, every interval. The outcome
// is the node-health table (provided by type, written only by the
// prober), a `tendril status` section, Prometheus metrics, GET
// /v1/health and, from the nodes table, GET /v1/cluster/nodes.
package nodehealth

import (
	"context"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/node"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell is node health: with --enable-health-checking (the default), the
// responder and the prober jobs and the node-health table; the API's
// /v1/cluster/nodes in every mode.
var Cell = cell.Module("node-health", "Probes the other nodes and answers their probes",
	cell.Provide(lifecycle.Check(Config.validate)),
	cell.Provide(lifecycle.Build[*Checker]),
	cell.Config(DefaultConfig()),
	cell.Provide(newChecker, tableOf, healthAddresses, statusContribution, apiHandlers),
)

// Checker is the running node health checks: the table and the prober
// that writes it.
type Checker struct {
	cfg    Config
	node   string
	db     *statedb.DB
	table  statedb.RWTable[*Status]
	peers  statedb.Table[*nodemanager.Peer]
	prober *Prober
	// endpoint is this node's health endpoint (nil without one).
	endpoint *HealthEndpoint
}

type params struct {
	cell.In

	Config Config
	Node   option.LocalNode
	// Agent's state directory names the health endpoint's namespace.
	Agent option.Agent `optional:"true"`
	// Peers is the nodes cell's table: the nodes to probe.
	Peers   statedb.Table[*nodemanager.Peer]
	DB      *statedb.DB
	Log     *slog.Logger
	Jobs    job.Registry
	Health  *health.Registry
	Metrics *metrics.Server `optional:"true"`
	// Endpoints wires the health endpoint like a pod (nil: no endpoint).
	Endpoints *agentendpoints.Module `optional:"true"`
}

// newChecker registers the table and adds the responder's and the
// prober's jobs (nil with health checking off).
func newChecker(p params) (*Checker, error) {
	endpointOn := p.Config.EnableHealthChecking && p.Config.EnableEndpointHealthChecking
	if !endpointOn && p.Endpoints != nil && p.Endpoints.InstallsHostNetworking() {
		// It waits for the endpoints' start step (the restore) without
		// failing meanwhile: it runs on every agent with the endpoint
		// turned off, whose health must not read degraded at start.
		jobs := p.Jobs.NewGroup(p.Health.Scope("health-endpoint-removal"), job.WithLogger(p.Log))
		jobs.Add(job.OneShot("remove-health-endpoint", func(ctx context.Context, _ cell.Health) error {
			return untilStarted(ctx, func() error {
				return RemoveHealthEndpoint(ctx, p.Endpoints, HealthNetnsName(p.Node.Name, p.Agent.StateDir), p.Log)
			})
		}, job.WithRetry(-1, &job.ExponentialBackoff{Min: time.Second, Max: 30 * time.Second})))
	}
	if !p.Config.EnableHealthChecking {
		return nil, nil
	}
	table, err := NewTable(p.DB)
	if err != nil {
		return nil, err
	}
	c := &Checker{cfg: p.Config, node: p.Node.Name, db: p.DB, table: table, peers: p.Peers}
	m := newConnectivityMetrics(p.Node.Name)
	if p.Metrics != nil {
		p.Metrics.Registry.MustRegister(m.status, m.latency)
	}
	c.prober = &Prober{DB: p.DB, Table: table, Peers: p.Peers, ICMP: Ping, HTTP: HTTPProbe(p.Config.HealthPort, nil),
		Timeout: p.Config.probeTimeout(), Now: time.Now, Log: p.Log, Written: m.update}
	resp := &Responder{Node: p.Node.Name, Port: p.Config.HealthPort}

	jobs := p.Jobs.NewGroup(p.Health.Scope("node-health"), job.WithLogger(p.Log))
	if p.Config.EnableEndpointHealthChecking && p.Endpoints != nil && p.Endpoints.InstallsHostNetworking() {
		c.endpoint = NewHealthEndpoint(p.Node.Name, HealthNetnsName(p.Node.Name, p.Agent.StateDir), p.Config.HealthPort, p.Endpoints, p.Log)
		// Retried: the endpoints' start step (IPAM, the CNI server) may
		// not have run when the job starts.
		jobs.Add(job.OneShot("health-endpoint", c.endpoint.Run,
			job.WithRetry(-1, &job.ExponentialBackoff{Min: time.Second, Max: 30 * time.Second})))
		c.prober.Self, c.prober.Local = p.Node.Name, c.endpoint.Addresses
	}
	jobs.Add(
		job.OneShot("health-responder", resp.Run, job.WithRetry(-1, &job.ExponentialBackoff{Min: time.Second, Max: 30 * time.Second})),
		job.OneShot("health-prober", func(ctx context.Context, h cell.Health) error {
			return c.prober.Run(ctx, p.Config.HealthCheckInterval, h)
		}),
	)
	return c, nil
}

// tableOf is the node-health table, the cell's typed output (nil with
// health checking off).
func tableOf(c *Checker) statedb.Table[*Status] {
	if c == nil {
		return nil
	}
	return c.table
}

// healthAddresses is the health endpoint's addresses for the TendrilNode
// write-back (nil without a health endpoint: a nil interface, not a nil
// pointer in one).
func healthAddresses(c *Checker) node.HealthAddresses {
	if c == nil || c.endpoint == nil {
		return nil
	}
	return c.endpoint
}

// connectivityMetrics are Cilium's node connectivity metrics, by the
// primary address of each other node (address_type="node") and by its
// health endpoint's (address_type="endpoint").
type connectivityMetrics struct {
	self            string
	status, latency *prometheus.GaugeVec
}

func newConnectivityMetrics(self string) *connectivityMetrics {
	labels := []string{"source_node", "target_node", "type", "address_type"}
	return &connectivityMetrics{
		self: self,
		status: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "tendril", Name: "node_connectivity_status",
			Help: "Whether another node's primary address (address_type=node) or health endpoint (address_type=endpoint) answered the last probe of its type (icmp, http): 1 reachable, 0 not.",
		}, labels),
		latency: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "tendril", Name: "node_connectivity_latency_seconds",
			Help: "Round trip of the last probe of its type (icmp, http) to another node's primary address or health endpoint that was answered (absent while it is not).",
		}, labels),
	}
}

// update follows the prober's writes.
func (m *connectivityMetrics) update(written []*Status, deleted []string) {
	for _, st := range written {
		for kind, get := range map[string]func() (Address, bool){"node": st.Primary, "endpoint": st.HealthEndpoint} {
			a, ok := get()
			if !ok {
				m.delete(st.Node, kind)
				continue
			}
			for typ, r := range map[string]Result{"icmp": a.ICMP, "http": a.HTTP} {
				if r.Reachable {
					m.status.WithLabelValues(m.self, st.Node, typ, kind).Set(1)
					m.latency.WithLabelValues(m.self, st.Node, typ, kind).Set(r.Latency.Seconds())
				} else {
					m.status.WithLabelValues(m.self, st.Node, typ, kind).Set(0)
					m.latency.DeleteLabelValues(m.self, st.Node, typ, kind)
				}
			}
		}
	}
	for _, node := range deleted {
		m.delete(node, "node")
		m.delete(node, "endpoint")
	}
}

func (m *connectivityMetrics) delete(node, kind string) {
	for _, typ := range []string{"icmp", "http"} {
		m.status.DeleteLabelValues(m.self, node, typ, kind)
		m.latency.DeleteLabelValues(m.self, node, typ, kind)
	}
}
