// Package lbmap writes the load-balancer frontends table into the node's
// pinned LB maps (the reconciler's operations): it owns the service,
// reverse NAT and backend IDs, restores them from the maps at start so
// they survive a restart, writes each frontend in the order the datapath
// needs (docs/services.md) and prunes what no frontend uses once the
// table is initialized.
package lbmap

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/netip"
	"sort"
	"sync"

	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/maglev"
)

// written is what the maps hold for one frontend.
type written struct {
	svc      maps.Service
	backends []uint32 // every backend ID the frontend references
	maglev   bool
	// ranges are the source ranges written for the frontend
	// (loadBalancerSourceRanges).
	ranges []netip.Prefix
	// skips are the skipRedirectFromBackend entries written for the
	// frontend: client netns cookie -> LBSkip* mode.
	skips map[uint64]uint8
	// skipSrcs are the per-packet path's: client address -> mode.
	skipSrcs map[netip.Addr]uint8
}

// Ops are the reconciler's operations over the LB maps. Every method is
// safe for concurrent use (the reconciler calls the operations from one
// goroutine; the API reads the IDs).
type Ops struct {
	maps   *maps.LBMaps
	maglev maglev.Config
	log    *slog.Logger

	mu sync.Mutex
	// svcIDs and revNATIDs name each frontend's IDs; usedIDs holds every
	// service or reverse NAT ID in use (they share one space so that a
	// new frontend gets the same number for both).
	svcIDs    map[loadbalancer.FrontendKey]uint32
	revNATIDs map[loadbalancer.FrontendKey]uint32
	usedIDs   map[uint32]bool
	// orphanRevNAT are reverse NAT entries found at restore that no
	// frontend owns: reserved until the prune.
	orphanRevNAT map[uint32]bool
	nextID       uint32

	backendIDs  map[netip.AddrPort]uint32
	backendAddr map[uint32]netip.AddrPort
	backendRefs map[uint32]int
	nextBackend uint32
	// backendWritten is what the backend map holds for each ID, so that a
	// backend shared by many frontends (or unchanged in an update) is
	// written once, not once per frontend: at 10,000 services of the same
	// 10 backends that is 100,000 map writes fewer (docs/benchmarks.md).
	backendWritten map[uint32]maps.Backend

	state map[loadbalancer.FrontendKey]written

	// removed is told, after a frontend was written without them, which
	// backends left it (nil: nobody listens).
	removed func([]RemovedBackend)

	// flows, when set, says which reverse NAT IDs and backends translated
	// flows still use: a deleted frontend's reverse NAT entry and an
	// unreferenced backend's entry then drain (kept, IDs reserved) until
	// no flow uses them, instead of going at once.
	flows            FlowUse
	drainingRevNAT   map[uint32]bool
	drainingBackends map[uint32]bool
}

// FlowUse reports what the node's translated flows use.
type FlowUse interface {
	// InUse returns the reverse NAT IDs and the backends (address and
	// port) of every live translated flow.
	InUse() (revNAT map[uint32]bool, backends map[netip.AddrPort]bool, err error)
}

// CTFlows is the FlowUse of the per-packet service NAT: its flows are the
// conntrack entries with a reverse NAT ID (their destination is the
// backend), until they expire. Sockets the socket load-balancer translated
// need neither entry: their reverse translation is per socket
// (tdr_lb_sock_revnat_v1), and those of removed backends are destroyed.
type CTFlows struct{ CT maps.CTMap }

// InUse implements FlowUse.
func (c CTFlows) InUse() (map[uint32]bool, map[netip.AddrPort]bool, error) {
	now := maps.MonotonicNow()
	revNAT, backends := map[uint32]bool{}, map[netip.AddrPort]bool{}
	err := c.CT.Iterate(func(e maps.CTEntry) bool {
		if e.RevNAT != 0 && e.Expires > now {
			revNAT[uint32(e.RevNAT)] = true
			backends[netip.AddrPortFrom(e.Dst.Unmap(), e.DstPort)] = true
		}
		return true
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read conntrack for translated flows: %w", err)
	}
	return revNAT, backends, nil
}

// RemovedBackend is a backend that left a frontend still in the maps:
// sockets the socket load-balancer translated to it for this frontend are
// to be moved off it (pkg/datapath/sockterm).
type RemovedBackend struct {
	Frontend loadbalancer.FrontendKey
	Backend  netip.AddrPort
	RevNATID uint32
}

// KeepWhileFlows makes reverse NAT entries of deleted frontends and
// entries of unreferenced backends drain while f reports flows using them
// (ReleaseDrained deletes them after). Set it before the first Update.
func (o *Ops) KeepWhileFlows(f FlowUse) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.flows = f
}

// OnBackendsRemoved sets fn to be called (under the reconciler, so it
// must return at once) with the backends each Update took out of a
// frontend, once the frontend is written without them: a socket that
// reconnects then reaches a live backend. Set it before the reconciler
// starts.
func (o *Ops) OnBackendsRemoved(fn func([]RemovedBackend)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.removed = fn
}

// New returns the operations over m (the node's LB maps).
func New(m *maps.LBMaps, mcfg maglev.Config, log *slog.Logger) *Ops {
	return &Ops{
		maps: m, maglev: mcfg, log: log,
		svcIDs: map[loadbalancer.FrontendKey]uint32{}, revNATIDs: map[loadbalancer.FrontendKey]uint32{}, usedIDs: map[uint32]bool{},
		orphanRevNAT: map[uint32]bool{}, backendIDs: map[netip.AddrPort]uint32{}, backendAddr: map[uint32]netip.AddrPort{},
		backendRefs: map[uint32]int{}, backendWritten: map[uint32]maps.Backend{}, state: map[loadbalancer.FrontendKey]written{}, nextID: 1, nextBackend: 1,
		drainingRevNAT: map[uint32]bool{}, drainingBackends: map[uint32]bool{},
	}
}

func keyOf(f maps.Frontend) loadbalancer.FrontendKey {
	return loadbalancer.FrontendKey{Addr: netip.AddrPortFrom(f.Addr.Unmap(), f.Port), Proto: f.Proto}
}

func frontendOf(k loadbalancer.FrontendKey) maps.Frontend {
	return maps.Frontend{Addr: k.Addr.Addr(), Port: k.Addr.Port(), Proto: k.Proto}
}

// Restored counts what Restore found.
type Restored struct {
	Services, Backends, RevNAT int
}

// Restore reads the IDs back from the pinned maps and reserves them, so an
// existing frontend keeps its service and reverse NAT IDs, an existing
// backend its ID, and no ID in the maps is given to anything else. It must
// run before the first Update.
func (o *Ops) Restore() (Restored, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var r Restored
	var errs []error
	err := o.maps.BackendMap().Iterate(func(id uint32, b maps.Backend) bool {
		ap := netip.AddrPortFrom(b.Addr.Unmap(), b.Port)
		o.backendAddr[id] = ap
		o.backendWritten[id] = b
		if _, dup := o.backendIDs[ap]; !dup {
			o.backendIDs[ap] = id
		}
		r.Backends++
		return true
	})
	if err != nil {
		return r, fmt.Errorf("restore backend IDs: %w", err)
	}
	err = o.maps.ServiceMap().Iterate(func(f maps.Frontend, s maps.Service) bool {
		k := keyOf(f)
		o.svcIDs[k], o.revNATIDs[k] = s.ID, s.RevNATID
		o.usedIDs[s.ID], o.usedIDs[s.RevNATID] = true, true
		// The in-cluster slots and, after them, the local ones of
		// externalTrafficPolicy Local.
		slots, err := o.maps.SlotMap().Get(s.ID, int(s.Count)+int(s.LocalCount))
		if err != nil {
			errs = append(errs, err)
		}
		w := written{svc: s, maglev: s.Flags&maps.SvcFlagMaglev != 0}
		for _, b := range slots {
			if b != 0 && !contains(w.backends, b) {
				w.backends = append(w.backends, b)
				o.backendRefs[b]++
			}
		}
		o.state[k] = w
		r.Services++
		return true
	})
	if err != nil {
		return r, fmt.Errorf("restore service IDs: %w", err)
	}
	// Source ranges: a frontend's written ones are known again, so a
	// range removed while the agent was down goes at the next write.
	ranges, err := o.maps.SrcRangeMap().List()
	if err != nil {
		return r, fmt.Errorf("restore source ranges: %w", err)
	}
	for k, w := range o.state {
		if rs, ok := ranges[w.svc.RevNATID]; ok {
			w.ranges = rs
			o.state[k] = w
		}
	}
	// Skip entries: a frontend's written ones are known again, so one of
	// a pod gone while the agent was down goes at the next write (or at
	// the prune, with its frontend).
	err = o.maps.SkipMap().Iterate(func(k maps.SkipKey, mode uint8) bool {
		fk := keyOf(k.Frontend)
		if w, ok := o.state[fk]; ok {
			if w.skips == nil {
				w.skips = map[uint64]uint8{}
			}
			w.skips[k.NetnsCookie] = mode
			o.state[fk] = w
		}
		return true
	})
	if err != nil {
		return r, fmt.Errorf("restore skip entries: %w", err)
	}
	err = o.maps.SkipSrcMap().Iterate(func(k maps.SkipSrcKey, mode uint8) bool {
		fk := keyOf(k.Frontend)
		if w, ok := o.state[fk]; ok {
			if w.skipSrcs == nil {
				w.skipSrcs = map[netip.Addr]uint8{}
			}
			w.skipSrcs[k.Client] = mode
			o.state[fk] = w
		}
		return true
	})
	if err != nil {
		return r, fmt.Errorf("restore per-packet skip entries: %w", err)
	}
	err = o.maps.RevNATMap().Iterate(func(id uint32, _ netip.AddrPort) bool {
		if !o.usedIDs[id] {
			o.orphanRevNAT[id] = true
			o.usedIDs[id] = true
		}
		r.RevNAT++
		return true
	})
	if err != nil {
		return r, fmt.Errorf("restore reverse NAT IDs: %w", err)
	}
	return r, errors.Join(errs...)
}

func contains(s []uint32, v uint32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// allocID returns the next ID free in [1, LBMaxIds).
func allocID(next *uint32, used func(uint32) bool) (uint32, error) {
	for i := 0; i < maps.LBMaxIds; i++ {
		id := *next
		*next++
		if *next >= maps.LBMaxIds {
			*next = 1
		}
		if id != 0 && !used(id) {
			return id, nil
		}
	}
	return 0, errors.New("no free ID left")
}

func (o *Ops) serviceIDsLocked(k loadbalancer.FrontendKey) (svc, revNAT uint32, err error) {
	if id, ok := o.svcIDs[k]; ok {
		return id, o.revNATIDs[k], nil
	}
	id, err := allocID(&o.nextID, func(id uint32) bool { return o.usedIDs[id] })
	if err != nil {
		return 0, 0, fmt.Errorf("service ID for %s: %w", k, err)
	}
	o.usedIDs[id] = true
	o.svcIDs[k], o.revNATIDs[k] = id, id
	return id, id, nil
}

func (o *Ops) backendIDLocked(ap netip.AddrPort) (uint32, error) {
	if id, ok := o.backendIDs[ap]; ok {
		return id, nil
	}
	id, err := allocID(&o.nextBackend, func(id uint32) bool { _, ok := o.backendAddr[id]; return ok })
	if err != nil {
		return 0, fmt.Errorf("backend ID for %s: %w", ap, err)
	}
	o.backendIDs[ap], o.backendAddr[id] = id, ap
	return id, nil
}

// releaseBackendLocked drops one frontend's reference to backend id and
// deletes the backend once none is left.
func (o *Ops) releaseBackendLocked(id uint32) error {
	o.backendRefs[id]--
	if o.backendRefs[id] > 0 {
		return nil
	}
	delete(o.backendRefs, id)
	if o.flows != nil {
		return o.drainBackendLocked(id)
	}
	return o.deleteBackendLocked(id)
}

// drainBackendLocked keeps an unreferenced backend's entry, removed (no
// new flow, no affinity follows it; established per-packet TCP flows keep
// it, UDP ones pick a live backend), until ReleaseDrained finds no flow
// using it.
func (o *Ops) drainBackendLocked(id uint32) error {
	ap, ok := o.backendAddr[id]
	if !ok {
		return nil
	}
	if err := o.writeBackendLocked(id, maps.Backend{Addr: ap.Addr(), Port: ap.Port(), State: maps.BackendStateRemoved}); err != nil {
		return fmt.Errorf("drain backend %s: %w", ap, err)
	}
	o.drainingBackends[id] = true
	return nil
}

// writeBackendLocked writes backend id unless the map already holds b.
// Every write of the backend map goes through it, so backendWritten
// mirrors the map (a drained backend taken back is written active again,
// not skipped as unchanged).
func (o *Ops) writeBackendLocked(id uint32, b maps.Backend) error {
	if cur, ok := o.backendWritten[id]; ok && cur == b {
		return nil
	}
	if err := o.maps.BackendMap().Upsert(id, b); err != nil {
		return err
	}
	o.backendWritten[id] = b
	return nil
}

func (o *Ops) deleteBackendLocked(id uint32) error {
	if err := o.maps.BackendMap().Delete(id); err != nil {
		return err
	}
	delete(o.drainingBackends, id)
	delete(o.backendWritten, id)
	if ap, ok := o.backendAddr[id]; ok && o.backendIDs[ap] == id {
		delete(o.backendIDs, ap)
	}
	delete(o.backendAddr, id)
	return nil
}

// ReleaseDrained deletes the draining reverse NAT and backend entries that
// no translated flow uses any more, and frees their IDs. It returns how
// many it deleted.
func (o *Ops) ReleaseDrained() (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.releaseDrainedLocked()
}

func (o *Ops) releaseDrainedLocked() (int, error) {
	if o.flows == nil || (len(o.drainingRevNAT) == 0 && len(o.drainingBackends) == 0) {
		return 0, nil
	}
	revNAT, backends, err := o.flows.InUse()
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for id := range o.drainingRevNAT {
		if revNAT[id] {
			continue
		}
		if err := o.maps.RevNATMap().Delete(id); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(o.drainingRevNAT, id)
		delete(o.usedIDs, id)
		n++
	}
	for id := range o.drainingBackends {
		if o.backendRefs[id] > 0 {
			delete(o.drainingBackends, id)
			continue
		}
		if backends[o.backendAddr[id]] {
			continue
		}
		if err := o.deleteBackendLocked(id); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// Draining counts the reverse NAT and backend entries kept for flows.
func (o *Ops) Draining() (revNAT, backends int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.drainingRevNAT), len(o.drainingBackends)
}

// Update writes frontend f: its backends, its Maglev table, then the
// service (reverse NAT, slots, entry), then drops what it no longer uses.
func (o *Ops) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, f *loadbalancer.Frontend) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	svcID, revNAT, err := o.serviceIDsLocked(f.Key)
	if err != nil {
		return err
	}
	prev, hadPrev := o.state[f.Key]
	var ids, slots []uint32
	var mg []maglev.Backend
	for _, b := range f.Backends {
		id, err := o.backendIDLocked(b.Addr)
		if err != nil {
			return err
		}
		state := maps.BackendStateActive
		if b.Terminating {
			state = maps.BackendStateTerminating
		}
		want := maps.Backend{Addr: b.Addr.Addr(), Port: b.Addr.Port(), State: state}
		if err := o.writeBackendLocked(id, want); err != nil {
			return fmt.Errorf("frontend %s: %w", f.Key, err)
		}
		if !contains(ids, id) {
			ids = append(ids, id)
		}
		if b.Active {
			slots = append(slots, id)
			mg = append(mg, maglev.Backend{Key: b.Addr.String(), ID: id, Weight: 1})
		}
	}
	s := maps.Service{ID: svcID, RevNATID: revNAT}
	// skipRedirectFromBackend: the clients' entries, and for a
	// serviceMatcher the service's own active backends after the
	// redirect's slots (a redirect is internal: the local scope of
	// externalTrafficPolicy Local is free).
	skips, skipSrcs := map[uint64]uint8{}, map[netip.Addr]uint8{}
	if len(f.SkipClients) > 0 || len(f.SkipAddrs) > 0 {
		s.Flags |= maps.SvcFlagSkipBackend
		mode := maps.LBSkipPass
		if f.SkipMode == loadbalancer.SkipToOriginal {
			mode = maps.LBSkipOriginal
			var orig []uint32
			for _, b := range f.Original {
				if !b.Active {
					continue
				}
				id, err := o.backendIDLocked(b.Addr)
				if err != nil {
					return err
				}
				want := maps.Backend{Addr: b.Addr.Addr(), Port: b.Addr.Port(), State: maps.BackendStateActive}
				if b.Terminating {
					want.State = maps.BackendStateTerminating
				}
				if err := o.writeBackendLocked(id, want); err != nil {
					return fmt.Errorf("frontend %s: %w", f.Key, err)
				}
				if !contains(ids, id) {
					ids = append(ids, id)
				}
				orig = append(orig, id)
			}
			if len(orig) > 255 {
				orig = orig[:255]
			}
			s.LocalCount = uint8(len(orig))
			slots = append(slots, orig...)
		}
		for _, c := range f.SkipClients {
			skips[c] = mode
		}
		for _, a := range f.SkipAddrs {
			skipSrcs[a.Unmap()] = mode
		}
	}
	// The entries before the service entry whose flag makes the hooks
	// read them.
	for c, mode := range skips {
		if prev.skips[c] == mode {
			continue
		}
		if err := o.maps.SkipMap().Upsert(maps.SkipKey{NetnsCookie: c, Frontend: frontendOf(f.Key)}, mode); err != nil {
			return err
		}
	}
	for a, mode := range skipSrcs {
		if prev.skipSrcs[a] == mode {
			continue
		}
		if err := o.maps.SkipSrcMap().Upsert(maps.SkipSrcKey{Client: a, Frontend: frontendOf(f.Key)}, mode); err != nil {
			return err
		}
	}
	if f.External() {
		// Clients from outside reach it through the host programs.
		s.Flags |= maps.SvcFlagExternal
		if f.ExternalTrafficPolicy == loadbalancer.TrafficPolicyLocal {
			// Their scope: this node's ready backends, after the
			// in-cluster slots.
			s.Flags |= maps.SvcFlagExtLocal
			var local []uint32
			for _, b := range f.Backends {
				if b.Local && !b.Terminating {
					local = append(local, o.backendIDs[b.Addr])
				}
			}
			if len(local) > 255 {
				local = local[:255]
			}
			s.LocalCount = uint8(len(local))
			slots = append(slots, local...)
		}
		if len(f.SourceRanges) > 0 {
			s.Flags |= maps.SvcFlagSourceRanges
		}
	}
	if f.Affinity {
		s.Flags |= maps.SvcFlagAffinity
		s.AffinityTimeout = f.AffinityTimeout
	}
	if f.InternalTrafficPolicy == loadbalancer.TrafficPolicyLocal {
		s.Flags |= maps.SvcFlagInternalLocal
	}
	if f.Maglev {
		s.Flags |= maps.SvcFlagMaglev
		table, err := maglev.Table(mg, o.maglev)
		if err != nil {
			return fmt.Errorf("Maglev table of %s: %w", f.Key, err)
		}
		if err := o.maps.MaglevMap().Upsert(svcID, table); err != nil {
			return err
		}
	}
	// The ranges before the entry that makes the datapath check them.
	var ranges []netip.Prefix
	if s.Flags&maps.SvcFlagSourceRanges != 0 {
		ranges = f.SourceRanges
	}
	if len(ranges) > 0 || len(prev.ranges) > 0 {
		if err := o.maps.SrcRangeMap().Set(revNAT, ranges, prev.ranges); err != nil {
			return err
		}
	}
	if err := o.maps.ApplyService(frontendOf(f.Key), s, slots, int(prev.svc.Count)+int(prev.svc.LocalCount)); err != nil {
		return err
	}
	if hadPrev && prev.maglev && !f.Maglev {
		if err := o.maps.MaglevMap().Delete(svcID); err != nil {
			return err
		}
	}
	s.Count = uint16(len(slots) - int(s.LocalCount))
	// References are counted only once the frontend is written, so that
	// a failed attempt retried later does not count its backends twice.
	for _, id := range ids {
		if !contains(prev.backends, id) {
			o.backendRefs[id]++
			delete(o.drainingBackends, id)
		}
	}
	o.state[f.Key] = written{svc: s, backends: ids, maglev: f.Maglev, ranges: ranges, skips: skips, skipSrcs: skipSrcs}
	var errs []error
	for c := range prev.skips {
		if _, ok := skips[c]; ok {
			continue
		}
		if err := o.maps.SkipMap().Delete(maps.SkipKey{NetnsCookie: c, Frontend: frontendOf(f.Key)}); err != nil {
			errs = append(errs, err)
		}
	}
	for a := range prev.skipSrcs {
		if _, ok := skipSrcs[a]; ok {
			continue
		}
		if err := o.maps.SkipSrcMap().Delete(maps.SkipSrcKey{Client: a, Frontend: frontendOf(f.Key)}); err != nil {
			errs = append(errs, err)
		}
	}
	var removed []RemovedBackend
	for _, id := range prev.backends {
		if contains(ids, id) {
			continue
		}
		removed = append(removed, RemovedBackend{Frontend: f.Key, Backend: o.backendAddr[id], RevNATID: revNAT})
		if _, err := o.maps.AffinityMap().DeleteMatching(svcID, id); err != nil {
			errs = append(errs, err)
		}
		if err := o.releaseBackendLocked(id); err != nil {
			errs = append(errs, err)
		}
	}
	if len(removed) > 0 && o.removed != nil {
		o.removed(removed)
	}
	return errors.Join(errs...)
}

// Delete removes frontend f's entries and releases its IDs.
func (o *Ops) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, f *loadbalancer.Frontend) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.deleteLocked(f.Key)
}

// deleteLocked removes a frontend: the service entry, slots, Maglev table
// and affinity (RemoveService), then its reverse NAT entry — at once, or,
// with KeepWhileFlows, once no translated flow uses it (their replies are
// translated with it) — then the backends only it used.
func (o *Ops) deleteLocked(k loadbalancer.FrontendKey) error {
	w, ok := o.state[k]
	if !ok {
		return nil
	}
	if err := o.maps.RemoveService(frontendOf(k), w.svc); err != nil {
		return fmt.Errorf("remove frontend %s: %w", k, err)
	}
	if len(w.ranges) > 0 {
		if err := o.maps.SrcRangeMap().Set(w.svc.RevNATID, nil, w.ranges); err != nil {
			return fmt.Errorf("remove frontend %s: %w", k, err)
		}
	}
	for c := range w.skips {
		if err := o.maps.SkipMap().Delete(maps.SkipKey{NetnsCookie: c, Frontend: frontendOf(k)}); err != nil {
			return fmt.Errorf("remove frontend %s: %w", k, err)
		}
	}
	for a := range w.skipSrcs {
		if err := o.maps.SkipSrcMap().Delete(maps.SkipSrcKey{Client: a, Frontend: frontendOf(k)}); err != nil {
			return fmt.Errorf("remove frontend %s: %w", k, err)
		}
	}
	draining := o.flows != nil
	if draining {
		o.drainingRevNAT[w.svc.RevNATID] = true
	} else if err := o.maps.RevNATMap().Delete(w.svc.RevNATID); err != nil {
		return err
	}
	delete(o.state, k)
	delete(o.usedIDs, o.svcIDs[k])
	delete(o.usedIDs, o.revNATIDs[k])
	if draining {
		// The reverse NAT ID (the same number as the service ID for
		// frontends this agent created) stays reserved while it drains:
		// a new frontend must not take it over under open flows.
		o.usedIDs[w.svc.RevNATID] = true
	}
	delete(o.svcIDs, k)
	delete(o.revNATIDs, k)
	var errs []error
	for _, id := range w.backends {
		if err := o.releaseBackendLocked(id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Prune deletes what no frontend of the table uses: frontends restored or
// written earlier that are gone, their backends, reverse NAT entries of
// no frontend, and slots of no service. The reconciler calls it only once
// the table is initialized (every source synced).
func (o *Ops) Prune(_ context.Context, _ statedb.ReadTxn, objs iter.Seq2[*loadbalancer.Frontend, statedb.Revision]) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	live := map[loadbalancer.FrontendKey]bool{}
	for f := range objs {
		live[f.Key] = true
	}
	var errs []error
	var stale []loadbalancer.FrontendKey
	for k := range o.state {
		if !live[k] {
			stale = append(stale, k)
		}
	}
	for _, k := range stale {
		o.log.Info("Pruning stale frontend", "frontend", k.String())
		if err := o.deleteLocked(k); err != nil {
			errs = append(errs, err)
		}
	}
	for id := range o.orphanRevNAT {
		if o.flows != nil {
			// Flows of a previous run may still be replied to
			// through it.
			o.drainingRevNAT[id] = true
			delete(o.orphanRevNAT, id)
			continue
		}
		if err := o.maps.RevNATMap().Delete(id); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(o.orphanRevNAT, id)
		delete(o.usedIDs, id)
	}
	for id := range o.backendAddr {
		if o.backendRefs[id] > 0 || o.drainingBackends[id] {
			continue
		}
		var err error
		if o.flows != nil {
			err = o.drainBackendLocked(id)
		} else {
			err = o.deleteBackendLocked(id)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := o.releaseDrainedLocked(); err != nil {
		errs = append(errs, err)
	}
	// The live frontends' slot counts and reverse NAT IDs (which key
	// their source ranges).
	svcIDs, rangesOf := map[uint32]int{}, map[uint32]bool{}
	for _, w := range o.state {
		svcIDs[w.svc.ID] = int(w.svc.Count) + int(w.svc.LocalCount)
		rangesOf[w.svc.RevNATID] = true
	}
	// Slots of services no frontend has (a crash between a service
	// entry's deletion and its slots'): delete up to the highest seen.
	doomed := map[uint32]int{}
	err := o.maps.SlotMap().Iterate(func(svc, n, _ uint32) bool {
		if _, ok := svcIDs[svc]; !ok && int(n) > doomed[svc] {
			doomed[svc] = int(n)
		}
		return true
	})
	if err != nil {
		errs = append(errs, err)
	}
	for svc, n := range doomed {
		if err := o.maps.SlotMap().Delete(svc, n); err != nil {
			errs = append(errs, err)
		}
	}
	// Skip entries of no frontend (written before a crash, or of a
	// frontend deleted while the agent was down).
	var staleSkips []maps.SkipKey
	err = o.maps.SkipMap().Iterate(func(k maps.SkipKey, _ uint8) bool {
		if _, ok := o.state[keyOf(k.Frontend)].skips[k.NetnsCookie]; !ok {
			staleSkips = append(staleSkips, k)
		}
		return true
	})
	if err != nil {
		errs = append(errs, err)
	}
	for _, k := range staleSkips {
		if err := o.maps.SkipMap().Delete(k); err != nil {
			errs = append(errs, err)
		}
	}
	var staleSrcs []maps.SkipSrcKey
	err = o.maps.SkipSrcMap().Iterate(func(k maps.SkipSrcKey, _ uint8) bool {
		if _, ok := o.state[keyOf(k.Frontend)].skipSrcs[k.Client]; !ok {
			staleSrcs = append(staleSrcs, k)
		}
		return true
	})
	if err != nil {
		errs = append(errs, err)
	}
	for _, k := range staleSrcs {
		if err := o.maps.SkipSrcMap().Delete(k); err != nil {
			errs = append(errs, err)
		}
	}
	// Source ranges of no frontend (one deleted while the agent was
	// down, or a crash between its entry's deletion and its ranges').
	ranges, err := o.maps.SrcRangeMap().List()
	if err != nil {
		errs = append(errs, err)
	}
	for id, rs := range ranges {
		if rangesOf[id] {
			continue
		}
		if err := o.maps.SrcRangeMap().Set(id, nil, rs); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// IDs are a frontend's IDs in the maps.
type IDs struct {
	Service, RevNAT uint32
	// Backends maps each backend address to its ID.
	Backends map[netip.AddrPort]uint32
}

// FrontendIDs returns frontend k's IDs (ok false before it is written).
func (o *Ops) FrontendIDs(k loadbalancer.FrontendKey) (IDs, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	id, ok := o.svcIDs[k]
	if !ok {
		return IDs{}, false
	}
	out := IDs{Service: id, RevNAT: o.revNATIDs[k], Backends: map[netip.AddrPort]uint32{}}
	for _, b := range o.state[k].backends {
		out.Backends[o.backendAddr[b]] = b
	}
	return out, true
}

// ServiceIDs returns every frontend's service ID, sorted by ID.
func (o *Ops) ServiceIDs() []struct {
	Key loadbalancer.FrontendKey
	ID  uint32
} {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]struct {
		Key loadbalancer.FrontendKey
		ID  uint32
	}, 0, len(o.svcIDs))
	for k, id := range o.svcIDs {
		out = append(out, struct {
			Key loadbalancer.FrontendKey
			ID  uint32
		}{k, id})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
