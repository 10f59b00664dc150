package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipam"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/option"
)

// datapathModule owns the BPF datapath: it loads it (start step 3),
// realizes endpoints (identity, ipcache, enforcement, programs), writes the
// host's own addresses into the ipcache (step 8) and runs conntrack GC.
type datapathModule struct {
	a          *Agent
	loader     *loader.Loader
	identities identity.Allocator
	// dp is what an endpoint's regeneration writes in the kernel: the
	// loader's maps and programs (a recording fake in benchmarks).
	dp endpointDatapath
	// ipcache holds every source's prefix claims; the winners go to the
	// BPF ipcache map.
	ipcache *ipcache.IPCache

	mu   sync.Mutex
	held map[uint16]identity.NumericIdentity // identity reference held per endpoint
	// hostIPs are the node addresses last written as host.
	hostIPs map[netip.Prefix]bool

	gcCancel context.CancelFunc
	gcDone   chan struct{}
	gcStats  ctGCStats

	events     *prometheus.CounterVec
	eventsStop func()
	// promotionStop ends the job that moves new endpoints from tc filters
	// to TCX links, and waits for it.
	promotionStop func()
	ctDeleted     prometheus.Counter
	ctEntries     prometheus.Gauge
	ctInterval    prometheus.Gauge
}

type ctGCStats struct {
	mu       sync.Mutex
	Runs     int
	Deleted  int
	Last     time.Time
	Interval time.Duration
	Entries  int
}

func newDatapathModule(a *Agent) *datapathModule {
	m := &datapathModule{
		a:          a,
		loader:     loader.New(loaderConfig(a.cfg), a.log.With("module", "datapath")),
		identities: a.identities,
		held:       map[uint16]identity.NumericIdentity{},
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "tendril", Subsystem: "datapath", Name: "events_total",
			Help: "Events read from the datapath's ring buffer, by type and reason."}, []string{"type", "reason"}),
		ctDeleted:  prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tendril", Subsystem: "ct_gc", Name: "deleted_total", Help: "Conntrack entries deleted by the GC."}),
		ctEntries:  prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "tendril", Subsystem: "ct_gc", Name: "entries", Help: "Conntrack entries seen by the last GC run."}),
		ctInterval: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "tendril", Subsystem: "ct_gc", Name: "interval_seconds", Help: "Current conntrack GC interval."}),
	}
	m.dp = loaderDatapath{m.loader}
	m.ipcache = ipcache.New(ipcacheBackend{m}, a.log.With("module", "ipcache"))
	a.metrics.Registry.MustRegister(m.events, m.ctDeleted, m.ctEntries, m.ctInterval, newDatapathCollector(m))
	return m
}

// loaderConfig is the datapath's part of the agent's configuration.
func loaderConfig(c Config) loader.Config {
	return loader.Config{
		BPFRoot: c.BPFRoot, PolicyVerdictEvents: c.PolicyVerdictEvents, DirectDelivery: c.DirectDelivery,
		AttachMode: loader.AttachMode(c.DatapathAttachMode), DeferTCX: c.DatapathDeferTCX,
	}
}

// start is step 3: open or create the pinned maps and load the programs,
// before anything reads them.
func (m *datapathModule) start(context.Context) error {
	if err := m.loader.Start(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	m.promotionStop = func() { cancel(); <-done }
	go func() {
		defer close(done)
		m.loader.RunTCXPromotion(ctx)
	}()
	return m.readEvents()
}

// readEvents drains the events ring buffer: counted in metrics, drops
// logged at debug level. (The flow observer will consume them here.)
func (m *datapathModule) readEvents() error {
	er, err := m.loader.NewEventReader()
	if err != nil {
		return err
	}
	done := make(chan struct{})
	m.eventsStop = func() { er.Close(); <-done }
	go func() {
		defer close(done)
		for {
			ev, err := er.Read()
			if err != nil {
				if errors.Is(err, ringbuf.ErrClosed) {
					return
				}
				m.a.log.Warn("Read datapath event", "error", err)
				continue
			}
			typ := "drop"
			if ev.Type == loader.EventPolicyVerdict {
				typ = "policy-verdict"
			}
			m.events.WithLabelValues(typ, maps.ReasonName(ev.Reason)).Inc()
			if ev.Type == loader.EventDrop {
				m.a.log.Debug("Datapath drop", "event", ev.String())
			}
		}
	}()
	return nil
}

func (m *datapathModule) stop(context.Context) error {
	if m.gcCancel != nil {
		m.gcCancel()
		<-m.gcDone
	}
	if m.eventsStop != nil {
		m.eventsStop()
	}
	if m.promotionStop != nil {
		m.promotionStop()
	}
	// Close only this process's handles: pinned maps and links keep the
	// datapath forwarding and enforcing while the agent is away.
	return m.loader.Close()
}

// reserveRestored re-takes the identities of restored endpoints so they
// keep the numbers their pinned policy entries use.
func (m *datapathModule) reserveRestored(eps []*endpoint.Endpoint) {
	for _, ep := range eps {
		if ep.Identity == 0 || !identity.NumericIdentity(ep.Identity).IsCluster() {
			continue
		}
		labels := endpointLabels(ep)
		if err := m.identities.Reserve(identity.NumericIdentity(ep.Identity), labels); err != nil {
			m.a.log.Warn("Cannot keep a restored endpoint's identity; it gets a new one", "endpoint", ep.ID, "error", err)
			continue
		}
		m.mu.Lock()
		m.held[ep.ID] = identity.NumericIdentity(ep.Identity)
		m.mu.Unlock()
	}
}

// endpointLabels are the identity-relevant labels of an endpoint: its own,
// plus its namespace as Kubernetes would give it.
func endpointLabels(ep *endpoint.Endpoint) []string {
	labels := append([]string(nil), ep.Labels...)
	if ep.PodNamespace != "" {
		labels = append(labels, "k8s:io.kubernetes.pod.namespace="+ep.PodNamespace)
	}
	return endpoint.SortedLabels(labels)
}

// Regenerate realizes one endpoint in the datapath, in the order that keeps
// its first packet enforced: identity, ipcache, policy entries, endpoint
// map entry, then the programs.
func (m *datapathModule) Regenerate(ctx context.Context, ep *endpoint.Endpoint) error {
	labels := endpointLabels(ep)
	var id identity.NumericIdentity
	if len(labels) == 0 {
		id = identity.Init
	} else {
		m.mu.Lock()
		cur, held := m.held[ep.ID]
		m.mu.Unlock()
		if held {
			if ident, ok := m.identities.Lookup(cur); ok && identity.LabelsKey(ident.Labels) == identity.LabelsKey(labels) {
				id = cur
			}
		}
		if id == 0 {
			ident, _, err := m.identities.Allocate(labels)
			if err != nil {
				return fmt.Errorf("allocate identity: %w", err)
			}
			id = ident.ID
			m.mu.Lock()
			old, had := m.held[ep.ID]
			m.held[ep.ID] = id
			m.mu.Unlock()
			if had {
				_ = m.identities.Release(old)
			}
		}
	}
	ep.Identity = uint32(id)
	for _, ip := range ep.Addresses() {
		e := ipcache.Entry{Identity: id, Source: ipcache.SourceLocal, Owner: ipcache.OwnerEndpoint(ep.ID), Name: ep.PodName, Namespace: ep.PodNamespace}
		if err := m.ipcache.Upsert(netip.PrefixFrom(ip, ip.BitLen()), e); err != nil {
			return err
		}
	}
	// The map state goes in before the endpoint's flags and programs, so the
	// first packet under enforcement already finds its rules.
	if err := m.a.realizePolicy(ctx, ep); err != nil {
		return err
	}
	ingress, egress := m.a.enforcement(ep)
	ep.EnforceIngress, ep.EnforceEgress = ingress, egress
	if ep.HostIfIndex == 0 {
		return fmt.Errorf("endpoint %d has no host interface index", ep.ID)
	}
	return m.dp.AttachEndpoint(datapathEndpoint(ep))
}

// endpointDatapath is the kernel side of an endpoint's regeneration: its
// endpoint map entry and programs, and the policy map.
type endpointDatapath interface {
	AttachEndpoint(loader.EndpointInfo) error
	WriteEndpoint(loader.EndpointInfo) error
	DetachEndpoint(id uint16, addrs []netip.Addr) error
	PolicyMap() policyMap
}

// policyMap is the BPF policy map as the policy's realization uses it.
type policyMap interface {
	DumpEndpoint(id uint16) (map[maps.PolicyKey]maps.PolicyValue, error)
	Upsert(maps.PolicyKey, maps.PolicyValue) error
	Delete(maps.PolicyKey) error
	DeleteEndpoint(id uint16) error
}

// loaderDatapath is endpointDatapath over the loader (after its start).
type loaderDatapath struct{ l *loader.Loader }

func (d loaderDatapath) AttachEndpoint(ep loader.EndpointInfo) error { return d.l.AttachEndpoint(ep) }
func (d loaderDatapath) WriteEndpoint(ep loader.EndpointInfo) error  { return d.l.WriteEndpoint(ep) }
func (d loaderDatapath) DetachEndpoint(id uint16, addrs []netip.Addr) error {
	return d.l.DetachEndpoint(id, addrs)
}
func (d loaderDatapath) PolicyMap() policyMap { return d.l.Maps().PolicyMap() }

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
	}
}

// refreshPolicy is the light regeneration after a policy, identity or mode
// change: the policy map difference, then the enforcement flags in the
// endpoint entries (only when they changed).
func (m *datapathModule) refreshPolicy(ep *endpoint.Endpoint) error {
	if err := m.a.realizePolicy(context.Background(), ep); err != nil {
		return err
	}
	ingress, egress := m.a.enforcement(ep)
	if ingress == ep.EnforceIngress && egress == ep.EnforceEgress {
		return nil
	}
	ep.EnforceIngress, ep.EnforceEgress = ingress, egress
	return m.dp.WriteEndpoint(datapathEndpoint(ep))
}

// Remove tears an endpoint out of the datapath.
func (m *datapathModule) Remove(ctx context.Context, ep *endpoint.Endpoint) error {
	var errs []error
	if err := m.dp.DetachEndpoint(ep.ID, ep.Addresses()); err != nil {
		errs = append(errs, err)
	}
	for _, ip := range ep.Addresses() {
		if err := m.ipcache.Delete(netip.PrefixFrom(ip, ip.BitLen()), ipcache.SourceLocal, ipcache.OwnerEndpoint(ep.ID)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := m.a.removePolicy(ep); err != nil {
		errs = append(errs, err)
	}
	m.mu.Lock()
	id, held := m.held[ep.ID]
	delete(m.held, ep.ID)
	m.mu.Unlock()
	if held {
		_ = m.identities.Release(id)
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove endpoint %d from the datapath: %v", ep.ID, errs)
	}
	return nil
}

// syncHostIPs is step 8: the node's own addresses → host identity, the
// default routes → world, refreshed on a timer and on address changes.
func (m *datapathModule) syncHostIPs(ctx context.Context) error {
	if err := m.writeHostIPs(); err != nil {
		return err
	}
	updates := make(chan netlink.AddrUpdate, 16)
	done := make(chan struct{})
	if err := netlink.AddrSubscribe(updates, done); err != nil {
		m.a.log.Warn("Cannot subscribe to address changes; host IPs refresh on a timer only", "error", err)
		updates = nil
	}
	gcCtx, cancel := context.WithCancel(context.Background())
	m.gcCancel = cancel
	m.gcDone = make(chan struct{})
	go func() {
		defer close(m.gcDone)
		defer close(done)
		m.runLoops(gcCtx, updates)
	}()
	return nil
}

func (m *datapathModule) writeHostIPs() error {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list host addresses: %w", err)
	}
	want := map[netip.Prefix]uint32{
		netip.MustParsePrefix("0.0.0.0/0"): uint32(identity.World),
		netip.MustParsePrefix("::/0"):      uint32(identity.World),
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.IsLinkLocalUnicast() {
			continue
		}
		ip = ip.Unmap()
		want[netip.PrefixFrom(ip, ip.BitLen())] = uint32(identity.Host)
	}
	if alloc := m.a.endpoints.ipam; alloc != nil {
		for _, f := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
			if r := alloc.RouterIP(f); r.IsValid() {
				want[netip.PrefixFrom(r, r.BitLen())] = uint32(identity.Host)
			}
		}
	}
	for p, id := range want {
		src, owner := ipcache.SourceLocal, ipcache.OwnerHost
		if p.Bits() == 0 {
			src, owner = ipcache.SourceGenerated, ipcache.OwnerWorld // world: anything more specific wins
		}
		if err := m.ipcache.Upsert(p, ipcache.Entry{Identity: identity.NumericIdentity(id), Source: src, Owner: owner}); err != nil {
			return err
		}
	}
	// Addresses the node no longer has stop being "host": another node or
	// a pod may own them next.
	m.mu.Lock()
	old := m.hostIPs
	m.hostIPs = make(map[netip.Prefix]bool, len(want))
	for p := range want {
		if p.Bits() != 0 {
			m.hostIPs[p] = true
		}
	}
	m.mu.Unlock()
	for p := range old {
		if _, still := want[p]; !still {
			if err := m.ipcache.Delete(p, ipcache.SourceLocal, ipcache.OwnerHost); err != nil {
				return err
			}
		}
	}
	return nil
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

// runLoops refreshes host IPs and runs conntrack GC with an interval that
// adapts to how much each run deleted (the seeds' EnableConntrackGC).
func (m *datapathModule) runLoops(ctx context.Context, addrUpdates chan netlink.AddrUpdate) {
	const minInterval, maxInterval = 10 * time.Second, 5 * time.Minute
	// Failed ipcache writes are retried beside the loops.
	go m.ipcache.Run(ctx, 5*time.Second)
	interval := time.Minute
	gc := time.NewTimer(interval)
	host := time.NewTicker(time.Minute)
	defer gc.Stop()
	defer host.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-addrUpdates:
			if !ok {
				// The subscription ended (a netlink error): the timer
				// refresh below still runs.
				m.a.log.Warn("Address change subscription ended; host IPs refresh on a timer only")
				addrUpdates = nil
				continue
			}
			if !hostIPChange(u) {
				continue
			}
			drainAddrUpdates(addrUpdates)
			if err := m.writeHostIPs(); err != nil {
				m.a.log.Warn("Refresh host IPs", "error", err)
			}
		case <-host.C:
			if err := m.writeHostIPs(); err != nil {
				m.a.log.Warn("Refresh host IPs", "error", err)
			}
		case <-gc.C:
			seen, deleted := m.runCTGC()
			interval = NextCTGCInterval(interval, seen, deleted, minInterval, maxInterval)
			m.ctInterval.Set(interval.Seconds())
			m.gcStats.mu.Lock()
			m.gcStats.Interval = interval
			m.gcStats.mu.Unlock()
			gc.Reset(interval)
		}
	}
}

// hostIPChange reports whether an address change can change the host IPs:
// link-local addresses are never host IPs, and every new pod veth brings
// one (IPv6), so without this filter each CNI ADD would cost an address
// dump and an ipcache pass.
func hostIPChange(u netlink.AddrUpdate) bool {
	return !u.LinkAddress.IP.IsLinkLocalUnicast()
}

// drainAddrUpdates drops the updates already queued: the refresh that
// follows reads the addresses as they are now, so a burst of changes costs
// one refresh.
func drainAddrUpdates(ch chan netlink.AddrUpdate) {
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		default:
			return
		}
	}
}

// NextCTGCInterval halves the interval when a run deleted more than a
// quarter of the entries (the table churns) and doubles it when it deleted
// less than 5%, within [min, max].
func NextCTGCInterval(cur time.Duration, seen, deleted int, min, max time.Duration) time.Duration {
	next := cur
	switch {
	case seen > 0 && deleted*4 > seen:
		next = cur / 2
	case seen == 0 || deleted*20 < seen:
		next = cur * 2
	}
	if next < min {
		next = min
	}
	if next > max {
		next = max
	}
	return next
}

func (m *datapathModule) runCTGC() (seen, deleted int) {
	live := map[uint16]bool{}
	if m.a.endpoints.mgr != nil {
		for _, ep := range m.a.endpoints.mgr.List() {
			live[ep.ID] = true
		}
	}
	res, err := m.loader.Maps().CTMap().DeleteExpired(maps.MonotonicNow(), func(id uint16) bool { return live[id] })
	seen, deleted = res.Seen, res.Deleted
	if err != nil {
		m.a.log.Warn("Conntrack GC", "error", err)
	}
	m.ctDeleted.Add(float64(deleted))
	m.ctEntries.Set(float64(seen - deleted))
	m.gcStats.mu.Lock()
	m.gcStats.Runs++
	m.gcStats.Deleted += deleted
	m.gcStats.Last = time.Now()
	m.gcStats.Entries = seen - deleted
	m.gcStats.mu.Unlock()
	return seen, deleted
}

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
	m       *datapathModule
	packets *prometheus.Desc
	bytes   *prometheus.Desc
}

func newDatapathCollector(m *datapathModule) *datapathCollector {
	return &datapathCollector{
		m:       m,
		packets: prometheus.NewDesc("tendril_datapath_packets_total", "Packets seen by the datapath, by reason and direction.", []string{"reason", "direction"}, nil),
		bytes:   prometheus.NewDesc("tendril_datapath_bytes_total", "Bytes seen by the datapath, by reason and direction.", []string{"reason", "direction"}, nil),
	}
}

func (c *datapathCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.packets; ch <- c.bytes }

func (c *datapathCollector) Collect(ch chan<- prometheus.Metric) {
	dm := c.m.loader.Maps()
	if dm == nil {
		return
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

// enforcement decides, per direction, whether policy applies to ep: never,
// always, or (default) only where a rule selects the endpoint.
func (a *Agent) enforcement(ep *endpoint.Endpoint) (ingress, egress bool) {
	switch a.runtime.Values().PolicyEnforcement {
	case option.EnforcementNever:
		return false, false
	case option.EnforcementAlways:
		return true, true
	}
	if a.policy == nil {
		return false, false
	}
	a.policy.mu.Lock()
	res, ok := a.policy.results[ep.ID]
	a.policy.mu.Unlock()
	if !ok {
		return a.policy.selects(ep)
	}
	return res.EnforceIngress, res.EnforceEgress
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
// and node; e names its source (Kubernetes or the kvstore) and owner.
func (m *datapathModule) UpsertRemoteEndpoint(ip netip.Addr, e ipcache.Entry) error {
	return m.ipcache.Upsert(netip.PrefixFrom(ip, ip.BitLen()), e)
}

// DeleteRemoteEndpoint withdraws owner's claim on another node's pod
// address; other owners' claims on it stay.
func (m *datapathModule) DeleteRemoteEndpoint(ip netip.Addr, src ipcache.Source, owner ipcache.Owner) error {
	return m.ipcache.Delete(netip.PrefixFrom(ip, ip.BitLen()), src, owner)
}
