// Package agentdatapath is the agent's datapath cell: the eBPF loader
// and its pinned maps and programs, the events ring buffer's reader, the
// ipcache and policy CIDR tables with their reconcilers over the BPF maps,
// the datapath's metrics and status, and the map API (GET /v1/map). Its
// start step is "bpf-maps" (the seeds' step 3).
package agentdatapath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/agent/epattach"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/mapevents"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy/policycidr"
)

// Cell is start step 3: the BPF datapath loaded (pinned maps opened or
// created before anything reads them, programs loaded), its events read
// and the ipcache that writes the BPF ipcache map. Besides the module it
// provides the ipcache and the kernel side of an endpoint's regeneration
// as objects of their own, so that what writes endpoints takes only those
// (and tests can decorate them).
var Cell = cell.Module("datapath", "The eBPF datapath maps programs events and ipcache",
	cell.Provide(lifecycle.Check(Config.validate)),
	cell.Provide(lifecycle.Build[*Module]),
	cell.Config(DefaultConfig()),
	cell.Provide(New, ipcacheOf, policyCIDROf, kernelOf, loaderOf, statusContribution, apiHandlers, resolveAttachMode, attachmentsConfig),
)

// Config are the datapath's options.
type Config struct {
	// Enable loads the eBPF datapath and attaches it to endpoints. Only
	// tests of the control plane in the machine's own namespace turn it
	// off.
	Enable bool `mapstructure:"enable-datapath"`
	// PolicyVerdictEvents reports allowed new flows as events too.
	PolicyVerdictEvents bool
	// DirectDelivery delivers packets between local pods from the sending
	// pod's program straight into the receiving pod's namespace
	// (bpf_redirect_peer), enforcing the receiver's ingress policy there,
	// instead of through the host stack (whose firewall and NAT rules it
	// then bypasses).
	DirectDelivery bool
	// AttachMode is how the eBPF programs attach to each pod's host veth:
	// tcx (BPF links, pinned) or tc (a clsact qdisc and cls_bpf filters,
	// which spare each attach the RCU grace period TCX waits for under
	// rtnl). See loader.AttachMode.
	AttachMode string `mapstructure:"datapath-attach-mode"`
	// DeferTCX, in tcx mode, attaches a new pod with tc filters and moves
	// it to TCX links once no pod has been attached for 500 ms, so that pod
	// creation never waits for TCX's RCU grace period.
	DeferTCX bool `mapstructure:"datapath-defer-tcx"`
	// AttachmentCheckInterval is how often each endpoint's programs are
	// checked in the kernel and attached again when something else
	// removed them (0: never).
	AttachmentCheckInterval time.Duration `mapstructure:"datapath-attachment-check-interval"`
	// RequireNodeBPFFS reports the datapath Degraded when the agent found
	// no bpffs at /sys/fs/bpf and had to mount one: in a pod, that mount
	// is the container's and dies with it, and so would every pin. The
	// chart turns it on, so its probes keep such a pod unready; an agent
	// run on the node itself mounts the node's bpffs and is healthy.
	RequireNodeBPFFS bool `mapstructure:"require-node-bpffs"`
}

// DefaultConfig are the datapath's defaults.
func DefaultConfig() Config {
	return Config{Enable: true, PolicyVerdictEvents: true, DirectDelivery: true, AttachMode: string(loader.AttachTCX), DeferTCX: true,
		AttachmentCheckInterval: time.Minute}
}

// Flags registers the datapath's options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-datapath", c.Enable, "Load the eBPF datapath and attach it to endpoints")
	fs.Bool("policy-verdict-events", c.PolicyVerdictEvents, "Report allowed new flows as policy verdict events (drops are always reported)")
	fs.Bool("direct-delivery", c.DirectDelivery, "Deliver packets between local pods straight into the receiving pod (bpf_redirect_peer), bypassing the host stack")
	fs.String("datapath-attach-mode", c.AttachMode, "How the eBPF programs attach to pod veths: tcx (BPF links) or tc (clsact qdisc + cls_bpf filters: no RCU grace period per attach, faster pod creation; the filters are not owned). Switching across restarts keeps every endpoint attached")
	fs.Bool("require-node-bpffs", c.RequireNodeBPFFS, "Report the datapath Degraded (status --brief fails) when no bpffs was mounted at /sys/fs/bpf and the agent had to mount one: in a container that mount, and every pinned map and link, dies with it (the chart turns it on)")
	fs.Duration("datapath-attachment-check-interval", c.AttachmentCheckInterval, "How often each endpoint's programs are checked in the kernel and attached again when something else removed them (a deleted tc filter or clsact qdisc, a detached TCX link): until then the pod is not policed. 0 turns the check off")
	fs.Bool("datapath-defer-tcx", c.DeferTCX, "In tcx mode, attach a new pod with tc filters first and move it to TCX links once no pod has been attached for 500 ms: pod creation without TCX's RCU wait, policed from the first packet (the switch has no gap)")
}

// validate is Validate, marked as a configuration error.
func (c Config) validate() error { return option.Invalid(c.Validate()) }

// Validate checks the values; each error names its option.
func (c Config) Validate() error {
	if _, err := loader.ParseAttachMode(c.AttachMode); err != nil {
		return fmt.Errorf("datapath-attach-mode %q: must be %s or %s", c.AttachMode, loader.AttachTCX, loader.AttachTC)
	}
	if c.AttachmentCheckInterval < 0 {
		return fmt.Errorf("datapath-attachment-check-interval %s: must not be negative", c.AttachmentCheckInterval)
	}
	return nil
}

// AttachMode is the attach mode the datapath runs with: the requested
// one (--datapath-attach-mode), or tc filters on a kernel before 6.6,
// which has no TCX, rather than failing every endpoint's attach. The host
// device programs attach the same way.
type AttachMode struct {
	Mode loader.AttachMode
	// Note says why Mode is not the one asked for and what the node
	// cannot do then; "": it is.
	Note string
}

// resolveAttachMode probes the kernel for TCX when the datapath is on
// and tcx is asked for.
func resolveAttachMode(c Config, log *slog.Logger) AttachMode {
	requested := loader.AttachMode(c.AttachMode)
	if !c.Enable {
		return AttachMode{Mode: requested}
	}
	mode, note := loader.ResolveAttachMode(requested, loader.ProbeTCX)
	if note != "" {
		log.Warn("Datapath attach mode falls back to tc", "requested", c.AttachMode, "reason", note)
	}
	return AttachMode{Mode: mode, Note: note}
}

// attachmentsConfig is the endpoints table's configuration: its check
// interval is this cell's flag.
func attachmentsConfig(c Config) epattach.Config {
	return epattach.Config{CheckInterval: c.AttachmentCheckInterval}
}

// settings are what the datapath takes from the other cells' options: the
// bpffs directory (the agent's), the trace events the flows ask for, and
// the services' LB map sizes.
type settings struct {
	BPFRoot     string
	TraceEvents loader.TraceMode
	LBSizes     maps.LBSizes
}

// loaderConfig is the loader's configuration.
func loaderConfig(c Config, mode AttachMode, s settings) loader.Config {
	return loader.Config{
		BPFRoot: s.BPFRoot, PolicyVerdictEvents: c.PolicyVerdictEvents, DirectDelivery: c.DirectDelivery, TraceEvents: s.TraceEvents,
		AttachMode: mode.Mode, DeferTCX: c.DeferTCX, LBSizes: s.LBSizes,
	}
}

// Module owns the BPF datapath: the loader and its maps, the
// ipcache over the BPF ipcache map, and the datapath's metrics; nil when
// the datapath is disabled (--enable-datapath=false).
type Module struct {
	log    *slog.Logger
	health *health.Registry
	// requireNodeBPFFS: Config.RequireNodeBPFFS.
	requireNodeBPFFS bool
	loader           *loader.Loader
	jobs             job.Group
	// kernel is what an endpoint's regeneration writes in the kernel: the
	// loader's maps and programs.
	kernel   Kernel
	settings settings
	// ipcache holds every source's prefix claims in its statedb table;
	// its reconciler writes the winners to the BPF ipcache map.
	ipcache *ipcache.IPCache
	// policyCIDR holds the prefixes rules name with their in-cluster
	// identities; its reconciler writes the BPF policy CIDR map.
	policyCIDR *policycidr.Table

	// er reads the events ring buffer, from the start step on.
	er *loader.EventReader
	// sink receives every event read (the flows' observer); nil: the
	// events are only counted. Set before the hive starts.
	sink func(loader.Event)

	gcStats ctGCStats

	events     *prometheus.CounterVec
	ctDeleted  prometheus.Counter
	ctEntries  prometheus.Gauge
	ctInterval prometheus.Gauge
}

type ctGCStats struct {
	mu       sync.Mutex
	Runs     int
	Deleted  int
	Last     time.Time
	Interval time.Duration
	Entries  int
}

// Params are the datapath's dependencies.
type Params struct {
	cell.In

	Config    Config
	Attach    AttachMode
	Agent     option.Agent
	Trace     loader.TraceMode
	LBSizes   maps.LBSizes
	Log       *slog.Logger
	Root      cell.RootLogger
	Lifecycle cell.Lifecycle
	Steps     *lifecycle.Steps
	Jobs      job.Registry
	Health    *health.Registry
	Metrics   *metrics.Server
	DB        *statedb.DB
	Inspector *dbinspect.Inspector
	ModuleID  cell.FullModuleID
	// MapEvents records the reconcilers' map writes (nil: none).
	MapEvents *mapevents.Registry `optional:"true"`
}

// New builds the datapath module (nil when the datapath is off) and
// appends its "bpf-maps" step, with its jobs after it.
func New(p Params) (*Module, error) {
	if !p.Config.Enable {
		return nil, nil
	}
	set := settings{BPFRoot: p.Agent.BPFRoot, TraceEvents: p.Trace, LBSizes: p.LBSizes}
	m := &Module{
		log:              p.Log,
		health:           p.Health,
		requireNodeBPFFS: p.Config.RequireNodeBPFFS,
		settings:         set,
		loader:           loader.New(loaderConfig(p.Config, p.Attach, set), p.Log),
		jobs:             p.Jobs.NewGroup(p.Health.Scope("bpf-maps"), job.WithLogger(p.Log)),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "tendril", Subsystem: "datapath", Name: "events_total",
			Help: "Events read from the datapath's ring buffer, by type and reason."}, []string{"type", "reason"}),
		ctDeleted:  prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tendril", Subsystem: "ct_gc", Name: "deleted_total", Help: "Conntrack entries deleted by the GC."}),
		ctEntries:  prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "tendril", Subsystem: "ct_gc", Name: "entries", Help: "Conntrack entries seen by the last GC run."}),
		ctInterval: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "tendril", Subsystem: "ct_gc", Name: "interval_seconds", Help: "Current conntrack GC interval."}),
	}
	m.kernel = loaderKernel{m.loader}
	p.Metrics.Registry.MustRegister(m.events, m.ctDeleted, m.ctEntries, m.ctInterval, newDatapathCollector(m))
	p.Steps.Append(p.Lifecycle, "bpf-maps", m.start, m.stop)
	// The ipcache's reconciler is a job of this group, added after the
	// step: it writes the map once the maps are open.
	ic, err := ipcache.New(ipcache.Params{DB: p.DB, Jobs: m.jobs, Log: logging.For(p.Root, "ipcache"), ModuleID: p.ModuleID, Backend: ipcacheBackend{m},
		Events: p.MapEvents.Ring(maps.IPCacheMapName)})
	if err != nil {
		return nil, err
	}
	m.ipcache = ic
	pc, err := policycidr.New(policycidr.Params{DB: p.DB, Jobs: m.jobs, Log: logging.For(p.Root, "policy-cidr"), ModuleID: p.ModuleID, Backend: policyCIDRBackend{m}})
	if err != nil {
		return nil, err
	}
	m.policyCIDR = pc
	p.Inspector.AddReconciled(policycidr.TableName, func(txn statedb.ReadTxn) dbinspect.Realization {
		return dbinspect.CountStatus(pc.Table().All(txn), func(o *policycidr.Prefix) reconciler.Status { return o.Status })
	})
	p.Inspector.AddReconciled(ipcache.TableName, func(txn statedb.ReadTxn) dbinspect.Realization {
		return dbinspect.CountStatus(ic.Table().All(txn), func(o *ipcache.PrefixClaims) reconciler.Status { return o.Status })
	})
	// The jobs are added after the step: they start once the maps are
	// open and stop before they are closed.
	m.jobs.Add(
		job.OneShot("tcx-promotion", func(ctx context.Context, _ cell.Health) error {
			m.loader.RunTCXPromotion(ctx)
			return nil
		}),
		job.OneShot("events", func(ctx context.Context, _ cell.Health) error {
			// Closing the reader ends its Read: the job ends with the hive.
			defer context.AfterFunc(ctx, func() { m.er.Close() })()
			m.readEvents(m.er)
			return nil
		}),
	)
	return m, nil
}

// ipcacheOf is the datapath's ipcache; nil without the datapath.
func ipcacheOf(m *Module) *ipcache.IPCache {
	if m == nil {
		return nil
	}
	return m.ipcache
}

// policyCIDROf is the table of the prefixes rules name, written to the
// BPF policy CIDR map by its reconciler (the policy writes it); nil
// without the datapath.
func policyCIDROf(m *Module) *policycidr.Table {
	if m == nil {
		return nil
	}
	return m.policyCIDR
}

// loaderOf is the datapath's loader, whose maps the host device programs
// share and whose promotions to TCX links the endpoints' API holds; nil
// without the datapath.
func loaderOf(m *Module) *loader.Loader {
	if m == nil {
		return nil
	}
	return m.loader
}

// kernelOf is the kernel side of endpoints' regeneration; nil without the
// datapath.
func kernelOf(m *Module) Kernel {
	if m == nil {
		return nil
	}
	return m.kernel
}

// Loader is the eBPF loader: its maps are open from the start step on.
func (m *Module) Loader() *loader.Loader { return m.loader }

// IPCache holds every source's prefix claims; its reconciler writes the
// winners to the BPF ipcache map.
func (m *Module) IPCache() *ipcache.IPCache { return m.ipcache }

// Maps are the open BPF maps; nil before the start step.
func (m *Module) Maps() *maps.Maps { return m.loader.Maps() }

// EventsLost reads the datapath's lost-event counters.
func (m *Module) EventsLost() (loader.EventsLost, error) { return m.loader.EventsLost() }

// AddInitializer holds the ipcache's prune back until the returned
// function is called (a source's first listing).
func (m *Module) AddInitializer(name string) func() { return m.ipcache.AddInitializer(name) }

// BPFRoot is the bpffs directory of the pinned maps.
func (m *Module) BPFRoot() string { return m.settings.BPFRoot }

// RecordCTGC counts a conntrack GC run (the host IPs cell runs it) in the
// metrics and the status.
func (m *Module) RecordCTGC(seen, deleted int) {
	m.ctDeleted.Add(float64(deleted))
	m.ctEntries.Set(float64(seen - deleted))
	m.gcStats.mu.Lock()
	m.gcStats.Runs++
	m.gcStats.Deleted += deleted
	m.gcStats.Last = time.Now()
	m.gcStats.Entries = seen - deleted
	m.gcStats.mu.Unlock()
}

// SetCTGCInterval records the conntrack GC's current interval.
func (m *Module) SetCTGCInterval(interval time.Duration) {
	m.ctInterval.Set(interval.Seconds())
	m.gcStats.mu.Lock()
	m.gcStats.Interval = interval
	m.gcStats.mu.Unlock()
}

// start is step 3: open or create the pinned maps and load the programs,
// before anything reads them, and open the events ring buffer.
func (m *Module) start(context.Context) error {
	if err := m.loader.Start(); err != nil {
		return err
	}
	if m.loader.MountedBPFFS() && m.requireNodeBPFFS && m.health != nil {
		// The datapath runs, but on state that dies with this process's
		// mount (in a pod: the container's own): not healthy, so the
		// chart's probes keep the pod unready until the node's bpffs is
		// mounted and the agent restarted.
		m.health.Reporter(BPFFSHealthModule).Degraded(bpffsMissing)
	}
	er, err := m.loader.NewEventReader()
	if err != nil {
		_ = m.loader.Close()
		return err
	}
	m.er = er
	return nil
}

// SetEventSink hands every event read to fn (the flows' observer), from
// the reader's start on; called while the hive is built.
func (m *Module) SetEventSink(fn func(loader.Event)) { m.sink = fn }

// readEvents drains the events ring buffer until it is closed: counted in
// metrics, drops logged at debug level, each handed to the sink.
func (m *Module) readEvents(er *loader.EventReader) {
	for {
		ev, err := er.Read()
		if err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return
			}
			m.log.Warn("Read datapath event", "error", err)
			continue
		}
		typ := "drop"
		switch ev.Type {
		case loader.EventPolicyVerdict:
			typ = "policy-verdict"
		case loader.EventTrace:
			typ = "trace"
		}
		m.events.WithLabelValues(typ, maps.ReasonName(ev.Reason)).Inc()
		if ev.Type == loader.EventDrop {
			m.log.Debug("Datapath drop", "event", ev.String())
		}
		if m.sink != nil {
			m.sink(ev)
		}
	}
}

// stop closes only this process's handles (its jobs stopped before every
// step): pinned maps and links keep the datapath forwarding and enforcing
// while the agent is away.
func (m *Module) stop(context.Context) error {
	return m.loader.Close()
}

// Kernel is the kernel side of an endpoint's regeneration: its endpoint
// map entry and programs (written by the endpoints table's reconciler,
// pkg/agent/epattach, which also lists and purges what no endpoint
// backs), and the policy map.
type Kernel interface {
	epattach.Kernel
	PolicyMap() PolicyMap
}

// PolicyMap is the BPF policy map as an endpoint's policy realization
// writes it.
type PolicyMap interface {
	DumpEndpoint(id uint16) (map[maps.PolicyKey]maps.PolicyValue, error)
	Upsert(maps.PolicyKey, maps.PolicyValue) error
	Delete(maps.PolicyKey) error
	DeleteEndpoint(id uint16) error
}

// loaderKernel is Kernel over the loader (after its start).
type loaderKernel struct{ l *loader.Loader }

func (d loaderKernel) AttachEndpoint(ep loader.EndpointInfo) error { return d.l.AttachEndpoint(ep) }
func (d loaderKernel) CheckEndpoint(ep loader.EndpointInfo) (bool, error) {
	return d.l.CheckEndpoint(ep)
}
func (d loaderKernel) DetachEndpoint(id uint16, addrs []netip.Addr) error {
	return d.l.DetachEndpoint(id, addrs)
}
func (d loaderKernel) AttachedEndpoints() []uint16           { return d.l.AttachedEndpoints() }
func (d loaderKernel) EndpointIDs() ([]uint16, error)        { return d.l.EndpointIDs() }
func (d loaderKernel) PurgeEndpoint(id uint16) (bool, error) { return d.l.PurgeEndpoint(id) }
func (d loaderKernel) PolicyMap() PolicyMap                  { return d.l.Maps().PolicyMap() }

// EndpointInfo is what the loader needs to know of ep.
func EndpointInfo(ep *endpoint.Endpoint) loader.EndpointInfo {
	var mac, hostMAC net.HardwareAddr
	if hw, err := net.ParseMAC(ep.MAC); err == nil {
		mac = hw
	}
	if hw, err := net.ParseMAC(ep.HostMAC); err == nil {
		hostMAC = hw
	}
	return loader.EndpointInfo{
		ID: ep.ID, IfIndex: ep.HostIfIndex, IfName: ep.HostIfName, Addresses: ep.Addresses(),
		MAC: mac, HostMAC: hostMAC, Identity: ep.Identity, EnforceIngress: ep.EnforceIngress, EnforceEgress: ep.EnforceEgress,
		AuditIngress: ep.AuditIngress, AuditEgress: ep.AuditEgress, L7Ingress: ep.L7Ingress, L7Egress: ep.L7Egress,
	}
}

// ipcacheBackend writes the ipcache's winners to the BPF map.
type ipcacheBackend struct{ m *Module }

func (b ipcacheBackend) Upsert(p netip.Prefix, e ipcache.Entry) error {
	dm := b.m.loader.Maps()
	if dm == nil {
		return fmt.Errorf("datapath maps not open")
	}
	return dm.IPCacheMap().Upsert(p, ipcacheMapEntry(e))
}

// UpsertBatch writes a reconciler round's entries in one batch update.
func (b ipcacheBackend) UpsertBatch(prefixes []netip.Prefix, entries []ipcache.Entry) (int, error) {
	dm := b.m.loader.Maps()
	if dm == nil {
		return 0, fmt.Errorf("datapath maps not open")
	}
	vals := make([]maps.IPCacheEntry, len(entries))
	for i, e := range entries {
		vals[i] = ipcacheMapEntry(e)
	}
	return dm.IPCacheMap().UpsertBatch(prefixes, vals)
}

// ipcacheMapEntry is the map's value of an ipcache entry.
func ipcacheMapEntry(e ipcache.Entry) maps.IPCacheEntry {
	v := maps.IPCacheEntry{Identity: uint32(e.Identity), TunnelIP: e.HostIP}
	if e.Identity == identity.RemoteNode {
		v.Flags |= maps.IPCacheFlagRemoteNode
	}
	return v
}

func (b ipcacheBackend) Delete(p netip.Prefix) error {
	dm := b.m.loader.Maps()
	if dm == nil {
		return fmt.Errorf("datapath maps not open")
	}
	return dm.IPCacheMap().Delete(p)
}

// Prefixes lists the map's prefixes, for the reconciler's prune.
func (b ipcacheBackend) Prefixes() ([]netip.Prefix, error) {
	dm := b.m.loader.Maps()
	if dm == nil {
		return nil, fmt.Errorf("datapath maps not open")
	}
	var out []netip.Prefix
	err := dm.IPCacheMap().Iterate(func(p netip.Prefix, _ maps.IPCacheEntry) bool {
		out = append(out, p)
		return true
	})
	return out, err
}

// policyCIDRBackend writes the policy CIDR table to the BPF map.
type policyCIDRBackend struct{ m *Module }

func (b policyCIDRBackend) Upsert(p netip.Prefix, id identity.NumericIdentity) error {
	dm := b.m.loader.Maps()
	if dm == nil {
		return fmt.Errorf("datapath maps not open")
	}
	return dm.PolicyCIDRMap().Upsert(p, uint32(id))
}

func (b policyCIDRBackend) Delete(p netip.Prefix) error {
	dm := b.m.loader.Maps()
	if dm == nil {
		return fmt.Errorf("datapath maps not open")
	}
	return dm.PolicyCIDRMap().Delete(p)
}

func (b policyCIDRBackend) Prefixes() ([]netip.Prefix, error) {
	dm := b.m.loader.Maps()
	if dm == nil {
		return nil, fmt.Errorf("datapath maps not open")
	}
	entries, err := dm.PolicyCIDRMap().Dump()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Prefix, 0, len(entries))
	for p := range entries {
		out = append(out, p)
	}
	return out, nil
}

// RestoredCell lets the ipcache's reconciler prune the BPF map:
// its start hook runs after the restore and regeneration steps (it is
// listed after them in cells.go and depends on nothing they provide), so
// by then the endpoints, host addresses, policy prefixes and the sources
// synced in earlier steps have made their claims, and a map entry no
// claim backs is a leftover of a previous run.
var RestoredCell = cell.Module("ipcache-restored", "Lets the ipcache prune once the agent has restored its state",
	cell.Provide(func(lc cell.Lifecycle, dp *Module) lifecycle.Invoked {
		if dp != nil {
			lc.Append(cell.Hook{OnStart: func(cell.HookContext) error {
				dp.ipcache.MarkRestored()
				dp.policyCIDR.MarkRestored()
				return nil
			}})
		}
		return lifecycle.Invoked{}
	}),
)

// BPFFSHealthModule is the health module that is Degraded while the
// datapath runs on a bpffs the agent had to mount itself.
const BPFFSHealthModule = "bpffs"

// bpffsMissing says so in `tendril status` (its Datapath section, and the
// bpffs module's health, which the chart's probes read).
const bpffsMissing = "was not mounted at /sys/fs/bpf: the agent mounted one, and the pinned maps and links last only as long as that mount; in a container, mount the node's /sys/fs/bpf into the pod and restart it (docs/install.md)"

// StatusSection is the datapath part of `tendril status`.
func (m *Module) StatusSection() ext.Section {
	st := m.loader.Status()
	sec := ext.Section{Title: "Datapath"}
	sec.Lines = append(sec.Lines, ext.Line{Key: "bpf root", Value: st.BPFRoot})
	if st.MountedBPFFS {
		sec.Lines = append(sec.Lines, ext.Line{Key: "bpffs", Value: bpffsMissing})
	}
	mode := attachModeDescription(st.AttachMode)
	if st.DeferTCX {
		mode += ", new pods on tc filters until the node is quiet (--datapath-defer-tcx)"
	}
	sec.Lines = append(sec.Lines, ext.Line{Key: "attach mode", Value: mode})
	programs := fmt.Sprintf("%d %s attached (%d kept from the previous run)", st.Links, attachmentNoun(st.AttachMode), st.ReusedLinks)
	if st.PendingTCX > 0 {
		programs += fmt.Sprintf("; %d endpoints on tc filters until the node is quiet", st.PendingTCX)
	}
	sec.Lines = append(sec.Lines, ext.Line{Key: "programs", Value: programs})
	names := make([]string, 0, len(st.MapEntries))
	for n := range st.MapEntries {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		sec.Lines = append(sec.Lines, ext.Line{Key: "map " + n, Value: fmt.Sprintf("%d/%d entries", st.MapEntries[n], st.MapCapacity[n])})
	}
	m.gcStats.mu.Lock()
	gc := fmt.Sprintf("%d runs, %d deleted, interval %s", m.gcStats.Runs, m.gcStats.Deleted, m.gcStats.Interval)
	if m.gcStats.Runs == 0 {
		gc = "first run a minute after start" // the adaptive interval starts at 1m
	}
	sec.Lines = append(sec.Lines, ext.Line{Key: "conntrack GC", Value: gc})
	m.gcStats.mu.Unlock()
	return sec
}

func attachModeDescription(m loader.AttachMode) string {
	if m == loader.AttachTC {
		return "tc (clsact qdisc, cls_bpf filters)"
	}
	return "tcx (pinned BPF links)"
}

func attachmentNoun(m loader.AttachMode) string {
	if m == loader.AttachTC {
		return "tc filters"
	}
	return "TCX links"
}

// datapathCollector exports the datapath's per-reason counters.
type datapathCollector struct {
	m          *Module
	packets    *prometheus.Desc
	bytes      *prometheus.Desc
	eventsLost *prometheus.Desc
}

func newDatapathCollector(m *Module) *datapathCollector {
	return &datapathCollector{
		m:       m,
		packets: prometheus.NewDesc("tendril_datapath_packets_total", "Packets seen by the datapath, by reason and direction.", []string{"reason", "direction"}, nil),
		bytes:   prometheus.NewDesc("tendril_datapath_bytes_total", "Bytes seen by the datapath, by reason and direction.", []string{"reason", "direction"}, nil),
		eventsLost: prometheus.NewDesc("tendril_datapath_events_lost_total",
			"Events the datapath could not send: the ring buffer full or over the rate limit.", []string{"reason"}, nil),
	}
}

func (c *datapathCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.packets
	ch <- c.bytes
	ch <- c.eventsLost
}

func (c *datapathCollector) Collect(ch chan<- prometheus.Metric) {
	dm := c.m.loader.Maps()
	if dm == nil {
		return
	}
	if lost, err := c.m.loader.EventsLost(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.eventsLost, prometheus.CounterValue, float64(lost.RingFull), "ring-full")
		ch <- prometheus.MustNewConstMetric(c.eventsLost, prometheus.CounterValue, float64(lost.RateLimited), "rate-limited")
	}
	rows, err := dm.MetricsMap().Dump()
	if err != nil {
		return
	}
	for _, r := range rows {
		reason, dir := maps.ReasonName(r.Reason), maps.DirectionName(r.Direction)
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(r.Packets), reason, dir)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(r.Bytes), reason, dir)
	}
}

// UpsertRemoteNode maps a peer node's address to the remote-node identity
// (the node manager's ipcache), as that node's claim.
func (m *Module) UpsertRemoteNode(node string, ip netip.Addr) error {
	return m.ipcache.Upsert(netip.PrefixFrom(ip, ip.BitLen()),
		ipcache.Entry{Identity: identity.RemoteNode, Source: ipcache.SourceKubernetes, Owner: ipcache.OwnerNode(node)})
}

// UpsertRemoteHealth maps a peer node's health endpoint address to the
// health identity on that node (hostIP, the tunnel's remote), as that
// node's claim.
func (m *Module) UpsertRemoteHealth(node string, ip, hostIP netip.Addr) error {
	return m.ipcache.Upsert(netip.PrefixFrom(ip, ip.BitLen()),
		ipcache.Entry{Identity: identity.Health, HostIP: hostIP, Source: ipcache.SourceKubernetes, Owner: ipcache.OwnerNode(node)})
}

// DeleteRemoteNode withdraws a peer node's claim on an address.
func (m *Module) DeleteRemoteNode(node string, ip netip.Addr) error {
	return m.ipcache.Delete(netip.PrefixFrom(ip, ip.BitLen()), ipcache.SourceKubernetes, ipcache.OwnerNode(node))
}

// UpsertRemoteEndpoint maps another node's pod address to its identity
// and node; e names its source (Kubernetes or the kvstore) and owner. The
// claim is queued: the ipcache makes the claims of many events in one
// transaction, and the watcher's callback does not wait.
func (m *Module) UpsertRemoteEndpoint(ip netip.Addr, e ipcache.Entry) error {
	return m.ipcache.UpsertQueued(netip.PrefixFrom(ip, ip.BitLen()), e)
}

// DeleteRemoteEndpoint withdraws owner's claim on another node's pod
// address (queued, in order with the claims); other owners' claims on it
// stay.
func (m *Module) DeleteRemoteEndpoint(ip netip.Addr, src ipcache.Source, owner ipcache.Owner) error {
	m.ipcache.DeleteQueued(netip.PrefixFrom(ip, ip.BitLen()), src, owner)
	return nil
}
