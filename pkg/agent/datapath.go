package agent

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

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/policy/agentpolicy"
	"github.com/tendril-net/tendril/pkg/policy/policycidr"
)

// datapathCell is start step 3: the BPF datapath loaded (pinned maps opened
// or created before anything reads them, programs loaded), its events read
// and the ipcache that writes the BPF ipcache map.
var datapathCell = cell.Module("datapath", "The eBPF datapath maps programs events and ipcache",
	cell.Provide(newDatapathModule),
	cell.Invoke(func(*datapathModule) {}),
)

// datapathModule owns the BPF datapath: the loader and its maps, the
// ipcache over the BPF ipcache map, and the datapath's metrics; nil when
// the datapath is disabled (--enable-datapath=false).
type datapathModule struct {
	log    *slog.Logger
	loader *loader.Loader
	jobs   job.Group
	// dp is what an endpoint's regeneration writes in the kernel: the
	// loader's maps and programs (a recording fake in benchmarks).
	dp endpointDatapath
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

type datapathParams struct {
	cell.In

	Config    Config
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
}

func newDatapathModule(p datapathParams) (*datapathModule, error) {
	if !p.Config.EnableDatapath {
		return nil, nil
	}
	m := &datapathModule{
		log:    p.Log,
		loader: loader.New(loaderConfig(p.Config), p.Log),
		jobs:   newJobGroup(p.Jobs, p.Health, "bpf-maps", p.Log),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "tendril", Subsystem: "datapath", Name: "events_total",
			Help: "Events read from the datapath's ring buffer, by type and reason."}, []string{"type", "reason"}),
		ctDeleted:  prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tendril", Subsystem: "ct_gc", Name: "deleted_total", Help: "Conntrack entries deleted by the GC."}),
		ctEntries:  prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "tendril", Subsystem: "ct_gc", Name: "entries", Help: "Conntrack entries seen by the last GC run."}),
		ctInterval: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "tendril", Subsystem: "ct_gc", Name: "interval_seconds", Help: "Current conntrack GC interval."}),
	}
	m.dp = loaderDatapath{m.loader}
	p.Metrics.Registry.MustRegister(m.events, m.ctDeleted, m.ctEntries, m.ctInterval, newDatapathCollector(m))
	p.Steps.Append(p.Lifecycle, "bpf-maps", m.start, m.stop)
	// The ipcache's reconciler is a job of this group, added after the
	// step: it writes the map once the maps are open.
	ic, err := ipcache.New(ipcache.Params{DB: p.DB, Jobs: m.jobs, Log: logFor(p.Root, "ipcache"), ModuleID: p.ModuleID, Backend: ipcacheBackend{m}})
	if err != nil {
		return nil, err
	}
	m.ipcache = ic
	pc, err := policycidr.New(policycidr.Params{DB: p.DB, Jobs: m.jobs, Log: logFor(p.Root, "policy-cidr"), ModuleID: p.ModuleID, Backend: policyCIDRBackend{m}})
	if err != nil {
		return nil, err
	}
	m.policyCIDR = pc
	p.Inspector.AddReconciled(policycidr.TableName, func(txn statedb.ReadTxn) dbinspect.Realization {
		return dbinspect.CountStatus(pc.Table().All(txn), func(o *policycidr.Prefix) reconciler.Status { return o.Status })
	})
	p.Inspector.AddReconciled(ipcache.TableName, func(txn statedb.ReadTxn) dbinspect.Realization {
		r := ipcache.CountStatus(ic.Table().All(txn))
		return dbinspect.Realization{Objects: r.Objects, Pending: r.Pending, Errors: r.Errors, LastError: r.LastError}
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

// loaderConfig is the datapath's part of the agent's configuration.
func loaderConfig(c Config) loader.Config {
	trace, _ := c.Hubble.TraceMode() // validated with the config
	return loader.Config{
		BPFRoot: c.BPFRoot, PolicyVerdictEvents: c.PolicyVerdictEvents, DirectDelivery: c.DirectDelivery, TraceEvents: trace,
		AttachMode: loader.AttachMode(c.DatapathAttachMode), DeferTCX: c.DatapathDeferTCX, LBSizes: c.Services.lbSizes(),
	}
}

// start is step 3: open or create the pinned maps and load the programs,
// before anything reads them, and open the events ring buffer.
func (m *datapathModule) start(context.Context) error {
	if err := m.loader.Start(); err != nil {
		return err
	}
	er, err := m.loader.NewEventReader()
	if err != nil {
		_ = m.loader.Close()
		return err
	}
	m.er = er
	return nil
}

// setEventSink hands every event read to fn (the flows' observer), from
// the reader's start on; called while the hive is built.
func (m *datapathModule) setEventSink(fn func(loader.Event)) { m.sink = fn }

// readEvents drains the events ring buffer until it is closed: counted in
// metrics, drops logged at debug level, each handed to the sink.
func (m *datapathModule) readEvents(er *loader.EventReader) {
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
func (m *datapathModule) stop(context.Context) error {
	return m.loader.Close()
}

// endpointDatapath is the kernel side of an endpoint's regeneration: its
// endpoint map entry and programs, and the policy map.
type endpointDatapath interface {
	AttachEndpoint(loader.EndpointInfo) error
	WriteEndpoint(loader.EndpointInfo) error
	DetachEndpoint(id uint16, addrs []netip.Addr) error
	PolicyMap() agentpolicy.PolicyMap
}

// loaderDatapath is endpointDatapath over the loader (after its start).
type loaderDatapath struct{ l *loader.Loader }

func (d loaderDatapath) AttachEndpoint(ep loader.EndpointInfo) error { return d.l.AttachEndpoint(ep) }
func (d loaderDatapath) WriteEndpoint(ep loader.EndpointInfo) error  { return d.l.WriteEndpoint(ep) }
func (d loaderDatapath) DetachEndpoint(id uint16, addrs []netip.Addr) error {
	return d.l.DetachEndpoint(id, addrs)
}
func (d loaderDatapath) PolicyMap() agentpolicy.PolicyMap { return d.l.Maps().PolicyMap() }

// datapathEndpoint is what the loader needs to know of ep.
func datapathEndpoint(ep *endpoint.Endpoint) loader.EndpointInfo {
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
		AuditIngress: ep.AuditIngress, AuditEgress: ep.AuditEgress,
	}
}

// ipcacheBackend writes the ipcache's winners to the BPF map.
type ipcacheBackend struct{ m *datapathModule }

func (b ipcacheBackend) Upsert(p netip.Prefix, e ipcache.Entry) error {
	dm := b.m.loader.Maps()
	if dm == nil {
		return fmt.Errorf("datapath maps not open")
	}
	v := maps.IPCacheEntry{Identity: uint32(e.Identity), TunnelIP: e.HostIP}
	if e.Identity == identity.RemoteNode {
		v.Flags |= maps.IPCacheFlagRemoteNode
	}
	return dm.IPCacheMap().Upsert(p, v)
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
type policyCIDRBackend struct{ m *datapathModule }

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

// ipcacheRestoredCell lets the ipcache's reconciler prune the BPF map:
// its start hook runs after the restore and regeneration steps (it is
// listed after them in cells.go and depends on nothing they provide), so
// by then the endpoints, host addresses, policy prefixes and the sources
// synced in earlier steps have made their claims, and a map entry no
// claim backs is a leftover of a previous run.
var ipcacheRestoredCell = cell.Module("ipcache-restored", "Lets the ipcache prune once the agent has restored its state",
	cell.Invoke(func(lc cell.Lifecycle, dp *datapathModule) {
		if dp == nil {
			return
		}
		lc.Append(cell.Hook{OnStart: func(cell.HookContext) error {
			dp.ipcache.MarkRestored()
			dp.policyCIDR.MarkRestored()
			return nil
		}})
	}),
)

// statusSection is the datapath part of `tendril status`.
func (m *datapathModule) statusSection() ext.Section {
	st := m.loader.Status()
	sec := ext.Section{Title: "Datapath"}
	sec.Lines = append(sec.Lines, ext.Line{Key: "bpf root", Value: st.BPFRoot})
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
	m          *datapathModule
	packets    *prometheus.Desc
	bytes      *prometheus.Desc
	eventsLost *prometheus.Desc
}

func newDatapathCollector(m *datapathModule) *datapathCollector {
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
func (m *datapathModule) UpsertRemoteNode(node string, ip netip.Addr) error {
	return m.ipcache.Upsert(netip.PrefixFrom(ip, ip.BitLen()),
		ipcache.Entry{Identity: identity.RemoteNode, Source: ipcache.SourceKubernetes, Owner: ipcache.OwnerNode(node)})
}

// DeleteRemoteNode withdraws a peer node's claim on an address.
func (m *datapathModule) DeleteRemoteNode(node string, ip netip.Addr) error {
	return m.ipcache.Delete(netip.PrefixFrom(ip, ip.BitLen()), ipcache.SourceKubernetes, ipcache.OwnerNode(node))
}

// UpsertRemoteEndpoint maps another node's pod address to its identity
// and node; e names its source (Kubernetes or the kvstore) and owner. The
// claim is queued: the ipcache makes the claims of many events in one
// transaction, and the watcher's callback does not wait.
func (m *datapathModule) UpsertRemoteEndpoint(ip netip.Addr, e ipcache.Entry) error {
	return m.ipcache.UpsertQueued(netip.PrefixFrom(ip, ip.BitLen()), e)
}

// DeleteRemoteEndpoint withdraws owner's claim on another node's pod
// address (queued, in order with the claims); other owners' claims on it
// stay.
func (m *datapathModule) DeleteRemoteEndpoint(ip netip.Addr, src ipcache.Source, owner ipcache.Owner) error {
	m.ipcache.DeleteQueued(netip.PrefixFrom(ip, ip.BitLen()), src, owner)
	return nil
}
