// Package hostips is the agent's host-ips cell: the node's own addresses
// in the ipcache (host identity; world for the default routes), kept
// current on address changes and a timer, and the conntrack GC (with the
// masquerade's NAT entries) at an adaptive interval. Its start step is
// "host-ips-ct-gc" (the seeds' step 8).
package hostips

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipam"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/lifecycle"
)

// Cell is start step 8: the node's own addresses into the ipcache (host
// and world identities), kept current, and conntrack GC.
var Cell = cell.Module("host-ips", "Host addresses in the ipcache and conntrack GC",
	// Invoke before Provide: one cycle check less (pkg/agent/cells.go).
	cell.Provide(lifecycle.Build[*Sync]),
	cell.Provide(New),
)

// Endpoints are the local endpoints: IPAM (the router addresses are the
// host's) and the manager (a live endpoint's conntrack entries stay).
type Endpoints interface {
	IPAM() *ipam.IPAM
	Manager() *endpointmanager.Manager
}

// Sync writes the host's addresses into the ipcache and runs the
// conntrack GC; nil without the datapath.
type Sync struct {
	log  *slog.Logger
	dp   *agentdatapath.Module
	eps  Endpoints
	masq *hostdev.Masquerade
	jobs job.Group

	// addrUpdates are the host's address changes (nil when the
	// subscription failed); closing addrDone ends the subscription.
	addrUpdates chan netlink.AddrUpdate
	addrDone    chan struct{}

	mu sync.Mutex
	// hostIPs are the node addresses last written as host.
	hostIPs map[netip.Prefix]bool
}

// Params are the cell's dependencies.
type Params struct {
	cell.In

	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Steps     *lifecycle.Steps
	Jobs      job.Registry
	Health    *health.Registry
	Datapath  *agentdatapath.Module
	Endpoints Endpoints
	// Masquerade's NAT entries are collected with conntrack (nil without
	// the datapath).
	Masquerade *hostdev.Masquerade
}

// New builds the host IPs' sync (nil without the datapath) and appends its
// step, its loop as a job after it.
func New(p Params) *Sync {
	if p.Datapath == nil {
		return nil
	}
	m := &Sync{log: p.Log, dp: p.Datapath, eps: p.Endpoints, masq: p.Masquerade,
		jobs: p.Jobs.NewGroup(p.Health.Scope("host-ips-ct-gc"), job.WithLogger(p.Log))}
	// The flows of other nodes' pods that left are ended
	// (sweepDepartedPeers): the ipcache records their withdrawn addresses
	// from now.
	if ipc := p.Datapath.IPCache(); ipc != nil {
		ipc.TrackWithdrawnRemote()
	}
	p.Steps.Append(p.Lifecycle, "host-ips-ct-gc", m.syncHostIPs, nil)
	m.jobs.Add(
		job.OneShot("host-ips-ct-gc", func(ctx context.Context, _ cell.Health) error {
			defer close(m.addrDone)
			m.runLoops(ctx, m.addrUpdates)
			return nil
		}),
	)
	return m
}

// syncHostIPs is step 8: the node's own addresses → host identity, the
// default routes → world, refreshed on a timer and on address changes.
func (m *Sync) syncHostIPs(ctx context.Context) error {
	if err := m.writeHostIPs(); err != nil {
		return err
	}
	updates := make(chan netlink.AddrUpdate, 16)
	done := make(chan struct{})
	if err := netlink.AddrSubscribe(updates, done); err != nil {
		m.log.Warn("Cannot subscribe to address changes; host IPs refresh on a timer only", "error", err)
		updates = nil
	}
	m.addrUpdates, m.addrDone = updates, done
	return nil
}

func (m *Sync) writeHostIPs() error {
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
	if alloc := m.eps.IPAM(); alloc != nil {
		for _, f := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
			if r := alloc.RouterIP(f); r.IsValid() {
				want[netip.PrefixFrom(r, r.BitLen())] = uint32(identity.Host)
			}
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
	// The node's addresses in one transaction.
	return m.dp.IPCache().Write(func(w *ipcache.Writer) error {
		for p, id := range want {
			src, owner := ipcache.SourceLocal, ipcache.OwnerHost
			if p.Bits() == 0 {
				src, owner = ipcache.SourceGenerated, ipcache.OwnerWorld // world: anything more specific wins
			}
			if err := w.Upsert(p, ipcache.Entry{Identity: identity.NumericIdentity(id), Source: src, Owner: owner}); err != nil {
				return err
			}
		}
		for p := range old {
			if _, still := want[p]; !still {
				if err := w.Delete(p, ipcache.SourceLocal, ipcache.OwnerHost); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// runLoops refreshes host IPs and runs conntrack GC with an interval that
// adapts to how much each run deleted (the seeds' EnableConntrackGC).
func (m *Sync) runLoops(ctx context.Context, addrUpdates chan netlink.AddrUpdate) {
	const minInterval, maxInterval = 10 * time.Second, 5 * time.Minute
	interval := time.Minute
	gc := time.NewTimer(interval)
	host := time.NewTicker(time.Minute)
	peers := time.NewTicker(peerSweepInterval)
	defer gc.Stop()
	defer host.Stop()
	defer peers.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-addrUpdates:
			if !ok {
				// The subscription ended (a netlink error): the timer
				// refresh below still runs.
				m.log.Warn("Address change subscription ended; host IPs refresh on a timer only")
				addrUpdates = nil
				continue
			}
			if !hostIPChange(u) {
				continue
			}
			drainAddrUpdates(addrUpdates)
			if err := m.writeHostIPs(); err != nil {
				m.log.Warn("Refresh host IPs", "error", err)
			}
		case <-host.C:
			if err := m.writeHostIPs(); err != nil {
				m.log.Warn("Refresh host IPs", "error", err)
			}
		case <-peers.C:
			m.sweepDepartedPeers()
		case <-gc.C:
			seen, deleted := m.runCTGC()
			interval = NextCTGCInterval(interval, seen, deleted, minInterval, maxInterval)
			m.dp.SetCTGCInterval(interval)
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

// peerSweepInterval is how often the flows of other nodes' pods that
// left are ended: a walk of the conntrack table, only when some left.
const peerSweepInterval = 10 * time.Second

// sweepDepartedPeers ends the flows of other nodes' pods that left (their
// addresses withdrawn from the ipcache since the last sweep). Without it
// such a flow lives until it expires (hours for an established TCP flow
// whose end this node never saw), and a pod later given the address, on
// the same ports, would meet a flow its peer's policy admitted for the
// one before.
func (m *Sync) sweepDepartedPeers() {
	ipc := m.dp.IPCache()
	if ipc == nil {
		return
	}
	addrs := ipc.TakeWithdrawnRemote()
	if len(addrs) == 0 {
		return
	}
	gone := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		gone[a.Unmap()] = true
	}
	res, err := m.dp.Loader().Maps().CTMap().DeletePeerFlows(gone)
	if err != nil {
		m.log.Warn("Conntrack: end the flows of departed peers", "addresses", len(addrs), "error", err)
	}
	if res.Deleted > 0 {
		m.log.Debug("Conntrack: ended the flows of departed peers", "addresses", len(addrs), "flows", res.Deleted)
	}
}

func (m *Sync) runCTGC() (seen, deleted int) {
	live := map[uint16]bool{}
	if m.eps.Manager() != nil {
		for _, ep := range m.eps.Manager().List() {
			live[ep.ID] = true
		}
	}
	res, err := m.dp.Loader().Maps().CTMap().DeleteExpired(maps.MonotonicNow(), func(id uint16) bool { return live[id] })
	seen, deleted = res.Seen, res.Deleted
	if err != nil {
		m.log.Warn("Conntrack GC", "error", err)
	}
	// A NAT mapping goes with its flow's conntrack entry.
	if nat, err := m.masq.CollectNAT(); err != nil {
		m.log.Warn("NAT GC", "error", err)
	} else if nat.Deleted > 0 {
		m.log.Debug("NAT GC", "mappings-deleted", nat.Deleted, "orphans", nat.Orphans)
	}
	m.dp.RecordCTGC(seen, deleted)
	return seen, deleted
}
