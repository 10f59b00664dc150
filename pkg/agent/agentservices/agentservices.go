// Package agentservices is the agent's services cell: the services
// tables (pkg/loadbalancer) fed by the Kubernetes source, the LB maps'
// reconciler with the IDs restored from the pinned maps, the socket
// load-balancer and its termination of sockets on removed backends, the
// health check node ports, the status and the service API
// (GET /v1/service). Its start step is "lb-restore" (the seeds' step 4).
package agentservices

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/datapath/socklb"
	"github.com/tendril-net/tendril/pkg/datapath/sockterm"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/healthserver"
	"github.com/tendril-net/tendril/pkg/loadbalancer/k8ssource"
	"github.com/tendril-net/tendril/pkg/loadbalancer/lbmap"
	"github.com/tendril-net/tendril/pkg/loadbalancer/lrpsource"
	"github.com/tendril-net/tendril/pkg/loadbalancer/maglev"
	"github.com/tendril-net/tendril/pkg/mapevents"
	"github.com/tendril-net/tendril/pkg/option"
)

// Config are the services' options.
type Config struct {
	// CgroupRoot is the cgroup v2 directory the socket load-balancer is
	// attached to; empty: no socket LB (per-packet NAT in the pod
	// programs translates every service flow), and hooks pinned by an
	// earlier run are detached.
	CgroupRoot string
	// LBAlgorithm is the default backend selection: random or maglev (a
	// service's annotation service.tendril.io/lb-algorithm wins).
	LBAlgorithm string
	// MaglevHashSeed seeds the Maglev permutations; every node of a
	// cluster must use the same.
	MaglevHashSeed uint64
	// NodePortRange is the range of node ports answered, "min-max"
	// (the API server's --service-node-port-range).
	NodePortRange string
	// HealthCheckNodePorts answers the health check node ports of
	// services with externalTrafficPolicy Local.
	HealthCheckNodePorts bool `mapstructure:"enable-health-check-nodeport"`
	// LBMapMax and LBSlotsMapMax size the LB maps (0: the datapath's
	// defaults, 131,072 and 1,048,576: 100,000 services of 10 backends).
	LBMapMax      int `mapstructure:"bpf-lb-map-max"`
	LBSlotsMapMax int `mapstructure:"bpf-lb-slots-map-max"`
	// LRPAddressMatcherCIDRs are the ranges a local redirect policy's
	// addressMatcher may redirect (empty: any unicast address), as
	// Cilium's localRedirectPolicies.addressMatcherCIDRs.
	LRPAddressMatcherCIDRs []string `mapstructure:"lrp-address-matcher-cidrs"`
	// LRPAddressMatcherNamespaces are the namespaces whose policies may
	// use an addressMatcher, which redirects every pod of the node ("*":
	// any; default kube-system). serviceMatchers are allowed everywhere:
	// they redirect only their own namespace's Service.
	LRPAddressMatcherNamespaces []string `mapstructure:"lrp-address-matcher-namespaces"`
	// ExternalIPCIDRs are the ranges a Service's spec.externalIPs may
	// lie in (empty: any unicast address, as kube-proxy).
	ExternalIPCIDRs []string `mapstructure:"service-external-ip-cidrs"`
}

// DefaultConfig are the services' defaults.
func DefaultConfig() Config {
	return Config{LBAlgorithm: "random", NodePortRange: "30000-32767", HealthCheckNodePorts: true, LRPAddressMatcherNamespaces: []string{"kube-system"}}
}

// Flags registers the services' flags, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("cgroup-root", c.CgroupRoot, "cgroup v2 directory to attach the socket load-balancer to (e.g. /sys/fs/cgroup); empty: services are translated per packet only")
	fs.String("lb-algorithm", c.LBAlgorithm, "Default backend selection of services: random or maglev (annotation service.tendril.io/lb-algorithm overrides)")
	fs.Uint64("maglev-hash-seed", c.MaglevHashSeed, "Seed of the Maglev permutations (the same on every node)")
	fs.String("node-port-range", c.NodePortRange, "Node ports answered, min-max (as the API server's --service-node-port-range)")
	fs.Bool("enable-health-check-nodeport", c.HealthCheckNodePorts, "Answer the health check node ports of services with externalTrafficPolicy Local (local backend count: 200, none: 503)")
	fs.Int("bpf-lb-map-max", c.LBMapMax, "Capacity of the BPF service, backend, reverse NAT and Maglev maps (0: 131072); a changed size carries the entries over at start")
	fs.StringSlice("lrp-address-matcher-cidrs", c.LRPAddressMatcherCIDRs, "Ranges a local redirect policy's addressMatcher may redirect (empty: any unicast address); a policy naming another address is refused")
	fs.StringSlice("lrp-address-matcher-namespaces", c.LRPAddressMatcherNamespaces, "Namespaces whose local redirect policies may use an addressMatcher, which redirects every pod of the node (*: any)")
	fs.StringSlice("service-external-ip-cidrs", c.ExternalIPCIDRs, "Ranges a Service's externalIPs may lie in (empty: any unicast address, as kube-proxy); an external IP outside them is no frontend")
	fs.Int("bpf-lb-slots-map-max", c.LBSlotsMapMax, "Capacity of the BPF backend slots map, the backends of all services together (0: 1048576)")
}

// NodePorts parses NodePortRange.
func (c Config) NodePorts() (lo, hi uint16, err error) {
	a, b, ok := strings.Cut(c.NodePortRange, "-")
	x, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 16)
	y, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 16)
	if !ok || err1 != nil || err2 != nil || x == 0 || x > y {
		return 0, 0, fmt.Errorf("node-port-range %q: want min-max, two ports with min <= max (e.g. 30000-32767)", c.NodePortRange)
	}
	return uint16(x), uint16(y), nil
}

// LBSizes are the LB maps' capacities; the cell provides them to the
// datapath, which creates the maps.
func (c Config) LBSizes() maps.LBSizes {
	return maps.LBSizes{MapMax: c.LBMapMax, SlotsMapMax: c.LBSlotsMapMax}
}

// ExternalIPPrefixes parses ExternalIPCIDRs.
func (c Config) ExternalIPPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.ExternalIPCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("service-external-ip-cidrs %q: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// LRPAddressPrefixes parses LRPAddressMatcherCIDRs.
func (c Config) LRPAddressPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.LRPAddressMatcherCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("lrp-address-matcher-cidrs %q: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// validate is Validate, marked as a configuration error.
func (c Config) validate() error { return option.Invalid(c.Validate()) }

// Validate checks the services' options.
func (c Config) Validate() error {
	if c.LBAlgorithm != "random" && c.LBAlgorithm != "maglev" {
		return fmt.Errorf("lb-algorithm %q: must be random or maglev", c.LBAlgorithm)
	}
	if err := c.LBSizes().Validate(); err != nil {
		return err
	}
	if c.CgroupRoot != "" && !strings.HasPrefix(c.CgroupRoot, "/") {
		return fmt.Errorf("cgroup-root %q: must be an absolute path", c.CgroupRoot)
	}
	if _, _, err := c.NodePorts(); err != nil {
		return err
	}
	if _, err := c.LRPAddressPrefixes(); err != nil {
		return err
	}
	if _, err := c.ExternalIPPrefixes(); err != nil {
		return err
	}
	return nil
}

// maxRefusedShown bounds the refused local redirect policies the status
// names.
const maxRefusedShown = 5

// lbDrainInterval is how often entries kept for flows that outlived their
// service or backend are checked against conntrack.
const lbDrainInterval = 5 * time.Second

// Cell is start step 4 (service, reverse NAT and backend IDs
// restored from the LB maps before anything writes them, the socket
// load-balancer attached) and what follows from it: the services tables fed
// by the Service and EndpointSlice watchers, and the reconciler writing
// them into the LB maps.
var Cell = cell.Module("services", "Services load-balanced by the datapath",
	cell.Provide(lifecycle.Check(Config.validate)),
	cell.Provide(lifecycle.Build[*Module]),
	// After the module is built (its lb-restore step first, as before):
	// a separate registration, so that the module itself does not depend
	// on the endpoints, whose step would then come first.
	cell.Provide(registerPodCookies),
	cell.Config(DefaultConfig()),
	cell.ProvidePrivate(loadbalancer.NewTables),
	cell.ProvidePrivate(podPoolsOf),
	cell.Provide(New, readTables, statusContribution, apiHandlers, watchersOf, Config.LBSizes),
)

// Tables are the services tables as their readers take them, by type
// (the flows name services from them, the L2 announcements follow
// them); only this cell writes them.
type Tables struct {
	cell.Out

	Services  statedb.Table[*loadbalancer.Service]
	Backends  statedb.Table[*loadbalancer.Backend]
	Frontends statedb.Table[*loadbalancer.Frontend]
	// Redirects are the local redirect policies applied (docs/lrp.md).
	Redirects statedb.Table[*loadbalancer.LocalRedirect]
}

func readTables(t *loadbalancer.Tables) Tables {
	return Tables{Services: t.Services, Backends: t.Backends, Frontends: t.Frontends, Redirects: t.Redirects}
}

// settings are what the services take from the other cells' options.
type settings struct {
	NodeName string
	// BPFRoot is where the socket LB's and socket termination's programs
	// are pinned.
	BPFRoot string
	// TraceEvents: the socket LB reports its translations as trace events.
	TraceEvents bool
}

// Watchers are the Kubernetes watchers the services follow; nil in
// standalone mode, and before the Kubernetes client has connected.
type Watchers func() *watchers.Watchers

// Module owns the services tables, their Kubernetes source and
// the LB maps reconciler (without the datapath: the tables only).
type Module struct {
	cfg      Config
	settings settings
	log      *slog.Logger
	tables   *loadbalancer.Tables
	writer   *loadbalancer.Writer
	watchers Watchers
	dp       *agentdatapath.Module
	source   *k8ssource.Source
	// lrp follows the local redirect policies (nil standalone).
	lrp *lrpsource.Source
	// ops is set by the restore step, before the reconciler is
	// registered.
	ops      *lbmap.Ops
	restored lbmap.Restored
	sock     *socklb.SockLB
	// term destroys sockets the socket LB sent to removed backends (nil
	// without socket LB, or when the kernel cannot: termErr says why).
	term    *sockterm.Terminator
	termErr error
	// health answers the health check node ports (nil: off, or no
	// Kubernetes).
	health *healthserver.Server
	unsub  []func()
}

// Params are the services' dependencies.
type Params struct {
	cell.In

	Config    Config
	Agent     option.Agent
	Node      option.LocalNode
	Trace     loader.TraceMode
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Steps     *lifecycle.Steps
	Jobs      job.Registry
	Health    *health.Registry
	DB        *statedb.DB
	ModuleID  cell.FullModuleID
	// Tables are the services tables (the cell's own, writable).
	Tables *loadbalancer.Tables
	// PodPools are the cluster's pod pools: no external IP inside them.
	PodPools PodPools
	Watchers Watchers              // nil in standalone mode
	Datapath *agentdatapath.Module // nil without the datapath
	// MapEvents records the LB maps' writes (nil: none).
	MapEvents *mapevents.Registry `optional:"true"`
}

// Endpoints are the local endpoints' events (agentendpoints.Module).
type Endpoints interface {
	Subscribe(fn func(endpointmanager.Event))
}

// New builds the services module (the tables only, without Kubernetes
// and the datapath) and appends its step, its jobs after it.
func New(p Params) (*Module, error) {
	tables := p.Tables
	set := settings{NodeName: p.Node.Name, BPFRoot: p.Agent.BPFRoot, TraceEvents: p.Trace != loader.TraceOff}
	m := &Module{cfg: p.Config, settings: set, log: p.Log, tables: tables, writer: loadbalancer.NewWriter(tables, set.NodeName),
		watchers: p.Watchers, dp: p.Datapath}
	if p.Watchers == nil && p.Datapath == nil {
		return m, nil
	}
	if p.Watchers != nil {
		// Pruning waits for this source's initial lists.
		m.source = k8ssource.NewSource(m.writer, p.Config.LBAlgorithm == "maglev", p.Log)
		lo, hi, err := p.Config.NodePorts()
		if err != nil {
			return nil, err
		}
		m.source.SetNodePortRange(lo, hi)
		ext, err := p.Config.ExternalIPPrefixes()
		if err != nil {
			return nil, err
		}
		m.source.SetExternalIPRanges(ext)
		m.source.SetPodRanges(p.PodPools)
		cidrs, err := p.Config.LRPAddressPrefixes()
		if err != nil {
			return nil, err
		}
		lim := lrpsource.Limits{AddressCIDRs: cidrs, AddressNamespaces: p.Config.LRPAddressMatcherNamespaces}
		m.lrp = lrpsource.New(m.writer, lim, p.Log.With("part", "local-redirect"))
		if p.Config.HealthCheckNodePorts {
			m.health = healthserver.New(tables, set.NodeName, p.Log)
			hj := p.Jobs.NewGroup(p.Health.Scope("services-health-check"), job.WithLogger(p.Log))
			hj.Add(job.OneShot("health-check-node-ports", func(ctx context.Context, _ cell.Health) error {
				return m.health.Run(ctx)
			}))
		}
	}
	p.Steps.Append(p.Lifecycle, "lb-restore", m.start, m.stop)
	if p.Datapath == nil {
		return m, nil
	}
	// The job is added after the step: it starts once the IDs are
	// restored. It registers the reconciler only once every source has
	// delivered its initial state: reconciling a service seen before its
	// EndpointSlices (after a restart) would empty its slots for a moment
	// and free its backends' IDs.
	jobs := p.Jobs.NewGroup(p.Health.Scope("services"), job.WithLogger(p.Log))
	params := reconciler.Params{Log: p.Log, DB: p.DB, JobGroup: jobs, ModuleID: p.ModuleID}
	jobs.Add(job.OneShot("lb-reconciler-start", func(ctx context.Context, _ cell.Health) error {
		if init, watch := tables.Frontends.Initialized(p.DB.ReadTxn()); !init {
			m.log.Info("Waiting for the service sources to sync before writing the LB maps")
			select {
			case <-watch:
			case <-ctx.Done():
				return nil
			}
		}
		_, err := reconciler.Register(params,
			tables.Frontends, (*loadbalancer.Frontend).Clone, (*loadbalancer.Frontend).SetStatus, (*loadbalancer.Frontend).GetStatus,
			mapevents.Ops[*loadbalancer.Frontend](m.ops, p.MapEvents.Ring(LBServicesEvents), describeFrontend), nil,
			reconciler.WithRetry(100*time.Millisecond, 30*time.Second),
			reconciler.WithPruning(5*time.Minute),
		)
		if err != nil {
			return fmt.Errorf("register the LB maps reconciler: %w", err)
		}
		return nil
	}))
	// Reverse NAT and backend entries kept for flows that outlived their
	// service or backend are released once conntrack no longer has them.
	jobs.Add(job.Timer("lb-release-drained", func(context.Context) error {
		if m.ops == nil {
			return nil
		}
		n, err := m.ops.ReleaseDrained()
		if n > 0 {
			m.log.Info("Released load-balancer entries whose flows ended", "entries", n)
		}
		return err
	}, lbDrainInterval))
	// Sockets translated to a backend that left its service are swept
	// here, off the reconciler's goroutine (which only queues them).
	jobs.Add(job.OneShot("lb-socket-termination", func(ctx context.Context, _ cell.Health) error {
		if m.term == nil {
			return nil
		}
		return m.term.Run(ctx)
	}))
	return m, nil
}

// start is step 4: the IDs read back from the pinned LB maps (before the
// reconciler writes anything), the socket load-balancer attached, and the
// watchers subscribed (their events flow once step 6 starts them).
func (m *Module) start(context.Context) error {
	if m.dp != nil {
		m.ops = lbmap.New(m.dp.Loader().Maps().LB, maglev.Config{Size: maglev.DefaultSize, Seed: m.cfg.MaglevHashSeed}, m.log)
		// Per-packet translated flows keep their reverse NAT and backend
		// entries until their conntrack entries are gone.
		m.ops.KeepWhileFlows(lbmap.CTFlows{CT: m.dp.Loader().Maps().CTMap()})
		r, err := m.ops.Restore()
		if err != nil {
			return fmt.Errorf("restore load-balancer IDs: %w", err)
		}
		m.restored = r
		m.log.Info("Load-balancer IDs restored", "services", r.Services, "backends", r.Backends, "reverse-nat", r.RevNAT)
		sock := socklb.New(socklb.Config{BPFRoot: m.settings.BPFRoot, CgroupPath: m.cfg.CgroupRoot, TraceEvents: m.settings.TraceEvents}, m.log)
		if m.cfg.CgroupRoot == "" {
			// No socket LB this run: hooks an earlier run pinned go.
			if err := sock.Detach(); err != nil {
				return fmt.Errorf("detach the socket load-balancer: %w", err)
			}
		} else {
			if err := sock.Start(); err != nil {
				return fmt.Errorf("attach the socket load-balancer to %s: %w", m.cfg.CgroupRoot, err)
			}
			m.sock = sock
			m.startSocketTermination()
		}
	}
	if m.source != nil {
		w := m.watchers()
		unsub, err := w.Services.Subscribe(m.source.OnService)
		if err != nil {
			return err
		}
		m.unsub = append(m.unsub, unsub)
		if unsub, err = w.EndpointSlices.Subscribe(m.source.OnEndpointSlice); err != nil {
			return err
		}
		m.unsub = append(m.unsub, unsub)
		if unsub, err = w.Nodes.Subscribe(m.source.OnNode); err != nil {
			return err
		}
		m.unsub = append(m.unsub, unsub)
		// Their pod CIDRs: no external IP inside them.
		if unsub, err = w.TendrilNodes.Subscribe(m.source.OnTendrilNode); err != nil {
			return err
		}
		m.unsub = append(m.unsub, unsub)
		// This node's pods: their hostPorts (no portmap plugin needed).
		if unsub, err = w.Pods.Subscribe(m.source.OnPod); err != nil {
			return err
		}
		m.unsub = append(m.unsub, unsub)
		// Local redirect policies and the local pods they select.
		if unsub, err = w.TendrilLocalRedirectPolicies.Subscribe(m.lrp.OnPolicy); err != nil {
			return err
		}
		m.unsub = append(m.unsub, unsub)
		if unsub, err = w.Pods.Subscribe(m.lrp.OnPod); err != nil {
			return err
		}
		m.unsub = append(m.unsub, unsub)
	}
	return nil
}

// startSocketTermination loads the socket iterators that move sockets off
// removed backends and has the reconciler queue every removal for them.
// A kernel without bpf_sock_destroy (before 6.5) keeps socket LB working
// without it: the failure is logged and shown in the status.
func (m *Module) startSocketTermination() {
	term := sockterm.New(sockterm.Config{BPFRoot: m.settings.BPFRoot, CgroupPath: m.cfg.CgroupRoot}, m.log)
	if err := term.Start(); err != nil {
		m.termErr = err
		m.log.Warn("Sockets connected to removed backends will not be moved off them", "error", err)
		return
	}
	m.term = term
	m.ops.OnBackendsRemoved(func(removed []lbmap.RemovedBackend) {
		targets := make([]sockterm.Target, 0, len(removed))
		for _, r := range removed {
			targets = append(targets, sockterm.Target{Backend: r.Backend, Proto: r.Frontend.Proto, RevNATID: r.RevNATID})
		}
		term.Request(targets...)
	})
}

func (m *Module) stop(context.Context) error {
	for _, u := range m.unsub {
		u()
	}
	if m.term != nil {
		m.term.Close()
	}
	if m.sock != nil {
		return m.sock.Close()
	}
	return nil
}

// StatusSection is the services part of `tendril status`.
func (m *Module) StatusSection() ext.Section {
	txn := m.tables.DB.ReadTxn()
	s := ext.Section{Title: "Services"}
	var done, pending, failed int
	for f := range m.tables.Frontends.All(txn) {
		switch f.Status.Kind {
		case reconciler.StatusKindDone:
			done++
		case reconciler.StatusKindError:
			failed++
		default:
			pending++
		}
	}
	s.Lines = append(s.Lines,
		ext.Line{Key: "services", Value: fmt.Sprintf("%d", m.tables.Services.NumObjects(txn))},
		ext.Line{Key: "frontends", Value: fmt.Sprintf("%d (%d in the LB maps, %d pending, %d failed)", done+pending+failed, done, pending, failed)},
		ext.Line{Key: "backends", Value: fmt.Sprintf("%d", m.tables.Backends.NumObjects(txn))},
	)
	if m.dp == nil {
		s.Lines = append(s.Lines, ext.Line{Key: "datapath", Value: "disabled: services are not translated on this node"})
		return s
	}
	s.Lines = append(s.Lines, ext.Line{Key: "restored at start", Value: fmt.Sprintf("%d frontends, %d backends, %d reverse NAT entries",
		m.restored.Services, m.restored.Backends, m.restored.RevNAT)})
	init, _ := m.tables.Frontends.Initialized(txn)
	s.Lines = append(s.Lines, ext.Line{Key: "sources synced", Value: fmt.Sprintf("%t", init)})
	if m.ops != nil {
		rv, bk := m.ops.Draining()
		s.Lines = append(s.Lines, ext.Line{Key: "kept for open flows", Value: fmt.Sprintf("%d reverse NAT entries, %d backends", rv, bk)})
	}
	if m.health != nil {
		s.Lines = append(s.Lines, ext.Line{Key: "health check node ports", Value: m.health.String()})
	}
	if m.source != nil {
		s.Lines = append(s.Lines, ext.Line{Key: "node ports", Value: fmt.Sprintf("%s on %s", m.cfg.NodePortRange, addrList(m.writer.NodeAddresses()))})
	}
	if m.lrp != nil {
		applied, rejected := m.lrp.Counts()
		s.Lines = append(s.Lines, ext.Line{Key: "local redirect policies", Value: fmt.Sprintf("%d applied, %d refused", applied, rejected)})
		// The refused ones with their reasons, a few (the log has all).
		refused := m.lrp.Rejected()
		names := make([]string, 0, len(refused))
		for n := range refused {
			names = append(names, n)
		}
		sort.Strings(names)
		for i, n := range names {
			if i == maxRefusedShown {
				s.Lines = append(s.Lines, ext.Line{Key: "refused policies", Value: fmt.Sprintf("%d more in the agent's log", len(names)-i)})
				break
			}
			s.Lines = append(s.Lines, ext.Line{Key: "refused " + n, Value: refused[n]})
		}
	}
	algo := m.cfg.LBAlgorithm
	s.Lines = append(s.Lines, ext.Line{Key: "default selection", Value: algo})
	if m.sock != nil {
		st := m.sock.Status()
		s.Lines = append(s.Lines, ext.Line{Key: "socket LB", Value: fmt.Sprintf("%s (%d hooks, %d kept from the previous run)", st.Cgroup, st.Hooks, st.Kept)})
		if m.term != nil {
			tot, sweeps := m.term.Totals()
			s.Lines = append(s.Lines, ext.Line{Key: "sockets of removed backends", Value: fmt.Sprintf("%d destroyed (%d refused) in %d sweeps", tot.Destroyed, tot.Failed, sweeps)})
		} else {
			s.Lines = append(s.Lines, ext.Line{Key: "sockets of removed backends", Value: fmt.Sprintf("not moved off: %v", m.termErr)})
		}
	} else {
		s.Lines = append(s.Lines, ext.Line{Key: "socket LB", Value: "off (--cgroup-root unset): per-packet NAT only"})
	}
	return s
}

// addrList formats addresses for the status ("none yet" when empty).
func addrList(addrs []netip.Addr) string {
	if len(addrs) == 0 {
		return "no node address yet"
	}
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return strings.Join(out, ", ")
}

// LBServicesEvents names the ring of the LB maps' writes in GET
// /v1/map/{name}/events: one event per frontend written (its service
// entry, slots, reverse NAT and backends) or removed.
const LBServicesEvents = "lb-services"

func describeFrontend(f *loadbalancer.Frontend) (string, string) {
	var bs []string
	for _, b := range f.Backends {
		bs = append(bs, b.Addr.String())
	}
	return f.Key.String(), fmt.Sprintf("service=%s type=%s backends=[%s]", f.Service, f.Type, strings.Join(bs, ","))
}
