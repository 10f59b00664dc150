package loadbalancer

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// Writer is how sources change the tables: each call is one short write
// transaction that also recomputes the affected service's frontends, so the
// frontends table is always consistent with the other two.
type Writer struct {
	t *Tables
	// nodeName is this node's name (internalTrafficPolicy Local, node hints).
	nodeName string
	// nodeZone is this node's zone (the EndpointSlices' zone hints);
	// written only inside a write transaction of the tables, which
	// serializes it with the recomputations that read it.
	nodeZone string
	// nodeAddrs are the addresses of this node its node ports are
	// answered on; written like nodeZone.
	nodeAddrs []netip.Addr
	// contested are the frontend keys a service was refused because
	// another service's frontend held them: only their release needs a
	// look for the refused service (handOver). Written like nodeZone; an
	// entry that outlives its reason (an aborted transaction) costs only
	// a scan.
	contested map[FrontendKey]struct{}
}

// NewWriter returns a writer for the tables of node nodeName.
func NewWriter(t *Tables, nodeName string) *Writer {
	return &Writer{t: t, nodeName: nodeName, contested: map[FrontendKey]struct{}{}}
}

// Tables are the writer's tables.
func (w *Writer) Tables() *Tables { return w.t }

func (w *Writer) txn() statedb.WriteTxn {
	return w.t.DB.WriteTxn(w.t.Services, w.t.Backends, w.t.Frontends, w.t.Redirects)
}

// RegisterInitializer marks the frontends table as not initialized until
// the returned function is called: the reconciler prunes stale BPF entries
// only once every source has delivered its initial state.
func (w *Writer) RegisterInitializer(name string) (done func()) {
	txn := w.txn()
	mark := w.t.Frontends.RegisterInitializer(txn, name)
	txn.Commit()
	return func() {
		txn := w.txn()
		mark(txn)
		txn.Commit()
	}
}

// NodeName is the name of the node the writer selects backends for.
func (w *Writer) NodeName() string { return w.nodeName }

// SetNodeZone sets this node's zone (its topology.kubernetes.io/zone
// label; empty: none) and, when it changed, recomputes every service's
// frontends in the same transaction.
func (w *Writer) SetNodeZone(zone string) error {
	txn := w.txn()
	defer txn.Abort()
	if zone == w.nodeZone {
		return nil
	}
	prev := w.nodeZone
	w.nodeZone = zone
	for svc := range w.t.Services.All(txn) {
		if err := w.recompute(txn, svc.Name); err != nil {
			w.nodeZone = prev
			return err
		}
	}
	txn.Commit()
	return nil
}

// SetNodeAddresses sets the addresses of this node that node ports are
// answered on and, when they changed, recomputes the frontends of every
// service with node ports in the same transaction.
func (w *Writer) SetNodeAddresses(addrs []netip.Addr) error {
	addrs = slices.Clone(addrs)
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	txn := w.txn()
	defer txn.Abort()
	if slices.Equal(addrs, w.nodeAddrs) {
		return nil
	}
	prev := w.nodeAddrs
	w.nodeAddrs = addrs
	for svc := range w.t.Services.All(txn) {
		if !svc.hasNodePorts() {
			continue
		}
		if err := w.recompute(txn, svc.Name); err != nil {
			w.nodeAddrs = prev
			return err
		}
	}
	txn.Commit()
	return nil
}

// NodeAddresses are the addresses node ports are answered on (read under
// the tables' write lock, which serializes it with SetNodeAddresses).
func (w *Writer) NodeAddresses() []netip.Addr {
	txn := w.txn()
	defer txn.Abort()
	return slices.Clone(w.nodeAddrs)
}

// Batch is a group of changes written in one transaction: each service a
// change touched has its frontends recomputed once, at the end. Sources
// use it for bursts (the initial listing): one transaction per change
// path-copies the tables' trees every time, and that dominated the time
// from the caches syncing to the maps being written (docs/benchmarks.md).
type Batch struct {
	w       *Writer
	txn     statedb.WriteTxn
	touched map[ServiceName]bool
	order   []ServiceName
}

func (b *Batch) touch(name ServiceName) {
	if !b.touched[name] {
		b.touched[name] = true
		b.order = append(b.order, name)
	}
}

// Batch runs fn with a batch and commits what it wrote in one transaction
// (nothing when fn or a recomputation fails).
func (w *Writer) Batch(fn func(*Batch) error) error {
	txn := w.txn()
	defer txn.Abort()
	b := &Batch{w: w, txn: txn, touched: map[ServiceName]bool{}}
	if err := fn(b); err != nil {
		return err
	}
	for _, name := range b.order {
		if err := w.recompute(txn, name); err != nil {
			return err
		}
	}
	txn.Commit()
	return nil
}

// UpsertService inserts or replaces a service.
func (w *Writer) UpsertService(s *Service) error {
	return w.Batch(func(b *Batch) error { return b.UpsertService(s) })
}

// DeleteService removes a service and its frontends (its backends stay
// until their source removes them).
func (w *Writer) DeleteService(name ServiceName) error {
	return w.Batch(func(b *Batch) error { return b.DeleteService(name) })
}

// SetBackends replaces what source lists for service name with backends
// (none: the source is gone).
func (w *Writer) SetBackends(name ServiceName, source string, backends []*Backend) error {
	return w.Batch(func(b *Batch) error { return b.SetBackends(name, source, backends) })
}

// UpsertService inserts or replaces a service in the batch.
func (b *Batch) UpsertService(s *Service) error {
	if _, _, err := b.w.t.Services.Insert(b.txn, s); err != nil {
		return fmt.Errorf("insert service %s: %w", s.Name, err)
	}
	b.touch(s.Name)
	return nil
}

// DeleteService removes a service in the batch.
func (b *Batch) DeleteService(name ServiceName) error {
	if _, _, err := b.w.t.Services.Delete(b.txn, &Service{Name: name}); err != nil {
		return fmt.Errorf("delete service %s: %w", name, err)
	}
	b.touch(name)
	return nil
}

// SetBackends replaces what source lists for service name in the batch.
// The table holds the given Backends themselves (the informer's cache of
// EndpointSlices shares them: k8scache), so they are not changed: one
// whose service or source differs is copied.
func (b *Batch) SetBackends(name ServiceName, source string, backends []*Backend) error {
	t := b.w.t
	for old := range ServiceBackends(b.txn, t.Backends, name) {
		if old.Source == source {
			if _, _, err := t.Backends.Delete(b.txn, old); err != nil {
				return fmt.Errorf("delete backend %s of %s: %w", old.Addr, name, err)
			}
		}
	}
	for _, be := range backends {
		if be.Service != name || be.Source != source {
			c := *be
			c.Service, c.Source = name, source
			be = &c
		}
		if _, _, err := t.Backends.Insert(b.txn, be); err != nil {
			return fmt.Errorf("insert backend %s of %s: %w", be.Addr, name, err)
		}
	}
	b.touch(name)
	return nil
}

// recompute derives service name's frontends from the service and its
// backends, writing only those that changed (an unchanged frontend is not
// reconciled again).
func (w *Writer) recompute(txn statedb.WriteTxn, name ServiceName) error {
	want := map[FrontendKey]*Frontend{}
	// kinds are the addresses' kinds (frontendAddr.typ): a cluster IP a
	// local redirect serves keeps its cluster IP's claim (holds).
	kinds := map[FrontendKey]string{}
	if svc, _, ok := w.t.Services.Get(txn, ServiceByName.Query(name)); ok {
		var backends []*Backend
		for b := range ServiceBackends(txn, w.t.Backends, name) {
			backends = append(backends, b)
		}
		lrp := w.redirect(txn, name)
		for _, fa := range w.frontendAddrs(svc) {
			p := fa.port
			f := &Frontend{
				Key: FrontendKey{Addr: fa.addr, Proto: p.Proto}, Service: name, PortName: p.Name, Type: fa.typ,
				Affinity: svc.Affinity, AffinityTimeout: svc.AffinityTimeout, InternalTrafficPolicy: svc.InternalTrafficPolicy, Maglev: svc.Maglev,
			}
			if fa.typ != FrontendClusterIP {
				f.ExternalTrafficPolicy = TrafficPolicyCluster
				if svc.ExternalLocal() {
					f.ExternalTrafficPolicy = TrafficPolicyLocal
				}
			}
			if fa.typ == FrontendLoadBalancer {
				f.SourceRanges = rangesOfFamily(svc.SourceRanges, fa.addr.Addr().Is4())
			}
			// The backends are those of clients in the cluster (pods
			// and nodes: the socket and pod programs), which follow
			// internalTrafficPolicy whatever the address, as
			// kube-proxy sends in-cluster clients of a node port or
			// load-balancer address to every backend even with
			// externalTrafficPolicy Local. Clients outside narrow them
			// to this node's by ExternalTrafficPolicy (each backend
			// names its node).
			f.Backends = w.selectBackends(svc, p, fa.addr.Addr().Is4(), backends)
			if lrp != nil && fa.typ == FrontendClusterIP && lrp.redirectsPort(p) {
				// A serviceMatcher: this node's selected pods while
				// it has any, else the service's own backends.
				if local := lrp.backendsFor(p, svc.Ports, fa.addr.Addr().Is4()); len(local) > 0 {
					skip, addrs := lrp.skipClients(), lrp.skipAddrs(fa.addr.Addr().Is4())
					if len(skip) > 0 || len(addrs) > 0 {
						// The selected pods themselves reach the
						// service's own backends.
						f.SkipClients, f.SkipAddrs, f.SkipMode, f.Original = skip, addrs, SkipToOriginal, f.Backends
					}
					f.Backends, f.Type, f.Redirect = local, FrontendLocalRedirect, lrp.Name
				}
			}
			if fa.typ == FrontendLocalRedirect {
				f.Redirect = ServiceName{Namespace: name.Namespace, Name: strings.TrimPrefix(name.Name, redirectPrefix)}
				if r, _, ok := w.t.Redirects.Get(txn, RedirectByName.Query(f.Redirect)); ok {
					skip, addrs := r.skipClients(), r.skipAddrs(fa.addr.Addr().Is4())
					if len(skip) > 0 || len(addrs) > 0 {
						// The selected pods themselves reach the
						// address, untranslated.
						f.SkipClients, f.SkipAddrs, f.SkipMode = skip, addrs, SkipPass
					}
				}
			}
			// The same address and port twice in one service (an
			// external IP equal to a cluster IP): the first, by the
			// order above, is the frontend.
			if _, ok := want[f.Key]; !ok {
				want[f.Key], kinds[f.Key] = f, fa.typ
			}
		}
	}
	var released []FrontendKey
	for f := range w.t.Frontends.List(txn, FrontendByService.Query(name)) {
		if _, ok := want[f.Key]; !ok {
			if _, _, err := w.t.Frontends.Delete(txn, f); err != nil {
				return fmt.Errorf("delete frontend %s: %w", f.Key, err)
			}
			released = append(released, f.Key)
		}
	}
	for _, f := range want {
		old, _, ok := w.t.Frontends.Get(txn, FrontendByKey.Query(f.Key))
		if ok && old.Service != name {
			// The address and port belong to another service's frontend
			// (an address two services name): the stronger claim holds
			// it (holds), the same on every node and after every
			// restart, whatever order the services came in.
			w.contested[f.Key] = struct{}{}
			if !w.holds(txn, kinds[f.Key], f.Service, old) {
				continue
			}
		}
		if ok && sameFrontend(old, f) {
			continue
		}
		f.Status = reconciler.StatusPending()
		if _, _, err := w.t.Frontends.Insert(txn, f); err != nil {
			return fmt.Errorf("insert frontend %s: %w", f.Key, err)
		}
	}
	return w.handOver(txn, name, released)
}

// claimRank orders the kinds of address two services may both name, the
// strongest first. A cluster IP and a node port are allocated by the API
// server, unique: no other claim on them stands. A load-balancer address
// (the status, written by a controller) or a pod's host port comes next;
// spec.externalIPs, which anyone who may create a Service writes, after;
// a local redirect policy's address yields to every service.
func claimRank(kind string) int {
	switch kind {
	case FrontendClusterIP, FrontendNodePort:
		return 0
	case FrontendLoadBalancer, FrontendHostPort:
		return 1
	case FrontendExternalIP:
		return 2
	default: // FrontendLocalRedirect: an addressMatcher's address
		return 3
	}
}

// kindOf is the kind of address a frontend in the table serves: its type,
// but a service's cluster IP served by a local redirect (serviceMatcher)
// is still a cluster IP.
func kindOf(f *Frontend) string {
	if f.Type == FrontendLocalRedirect && !strings.HasPrefix(f.Service.Name, redirectPrefix) {
		return FrontendClusterIP
	}
	return f.Type
}

// holds reports whether service name's claim on an address of kind beats
// the frontend old of another service: the stronger kind (claimRank),
// then the older service, then the smaller name. Before, the service seen
// first kept the address, so after a restart a Service whose externalIPs
// named another's cluster IP and port (kube-dns's) took it on every node
// where it came first in the listing (namespace order). Rare: only an
// address two services name.
func (w *Writer) holds(txn statedb.ReadTxn, kind string, name ServiceName, old *Frontend) bool {
	if a, b := claimRank(kind), claimRank(kindOf(old)); a != b {
		return a < b
	}
	mine, _, ok1 := w.t.Services.Get(txn, ServiceByName.Query(name))
	theirs, _, ok2 := w.t.Services.Get(txn, ServiceByName.Query(old.Service))
	if ok1 && ok2 && !mine.Created.Equal(theirs.Created) {
		return mine.Created.Before(theirs.Created)
	}
	if !ok2 {
		return true // the holder is gone (its frontends go in the same transaction)
	}
	return name.String() < old.Service.String()
}

// handOver gives the frontends service name
// released to another service that names the same address and port (and
// was refused it while name held it). Rare (only a contested key), so a
// scan of the services.
func (w *Writer) handOver(txn statedb.WriteTxn, name ServiceName, released []FrontendKey) error {
	released = slices.DeleteFunc(released, func(k FrontendKey) bool {
		_, ok := w.contested[k]
		return !ok
	})
	if len(released) == 0 {
		return nil
	}
	// Every service naming a released key is computed again: each takes
	// it if its claim beats the one holding it then (holds), so the
	// strongest ends with it whatever the scan order. Keys still named by
	// two services or more stay contested.
	namers := map[FrontendKey]int{}
	for svc := range w.t.Services.All(txn) {
		if svc.Name == name {
			continue
		}
		names := false
		for _, fa := range w.frontendAddrs(svc) {
			key := FrontendKey{Addr: fa.addr, Proto: fa.port.Proto}
			if slices.Contains(released, key) {
				namers[key]++
				names = true
			}
		}
		if names {
			if err := w.recompute(txn, svc.Name); err != nil {
				return err
			}
		}
	}
	for _, k := range released {
		if namers[k] < 2 {
			delete(w.contested, k)
		}
	}
	return nil
}

// frontendAddr is one address and port of a service and its kind.
type frontendAddr struct {
	addr netip.AddrPort
	port ServicePort
	typ  string
}

// frontendAddrs lists the service's frontends: its cluster IPs, this
// node's addresses on its node ports, its external IPs and its
// load-balancer addresses, each on every port (of the address's family
// for node ports).
func (w *Writer) frontendAddrs(svc *Service) []frontendAddr {
	var out []frontendAddr
	if svc.Type == FrontendHostPort {
		// A pod's host ports: on its hostIP when it names one
		// (ExternalIPs), else on every address of this node.
		addrs := svc.ExternalIPs
		if len(addrs) == 0 {
			addrs = w.nodeAddrs
		}
		for _, p := range svc.Ports {
			for _, a := range addrs {
				out = append(out, frontendAddr{netip.AddrPortFrom(a, p.Port), p, FrontendHostPort})
			}
		}
		return out
	}
	typ := FrontendClusterIP
	if svc.Type == FrontendLocalRedirect {
		typ = FrontendLocalRedirect
	}
	for _, p := range svc.Ports {
		for _, a := range svc.Addresses {
			out = append(out, frontendAddr{netip.AddrPortFrom(a, p.Port), p, typ})
		}
		if p.NodePort != 0 {
			for _, a := range w.nodeAddrs {
				out = append(out, frontendAddr{netip.AddrPortFrom(a, p.NodePort), p, FrontendNodePort})
			}
		}
		for _, a := range svc.ExternalIPs {
			if Servable(a) {
				out = append(out, frontendAddr{netip.AddrPortFrom(a, p.Port), p, FrontendExternalIP})
			}
		}
		for _, a := range svc.LoadBalancerIPs {
			if Servable(a) {
				out = append(out, frontendAddr{netip.AddrPortFrom(a, p.Port), p, FrontendLoadBalancer})
			}
		}
	}
	return out
}

// Servable reports whether an external or load-balancer address may be a
// frontend, or an EndpointSlice's address a backend: a unicast address a
// client could route to. Loopback would
// make every connect() to 127.0.0.1 on the port, by any process of the
// node (the socket LB), go to the service's backends; the unspecified,
// multicast and link-local addresses are no one's to serve. The API
// server refuses most of these in spec.externalIPs, not in the status,
// and older API servers did not: checked here whatever wrote them.
func Servable(a netip.Addr) bool {
	return a.IsValid() && !a.IsUnspecified() && !a.IsLoopback() && !a.IsMulticast() &&
		!a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast() && !a.IsInterfaceLocalMulticast()
}

// rangesOfFamily are the source ranges of one family: a load-balancer
// address admits the clients of its own family in its ranges, and, as
// kube-proxy has it, every client of a family the ranges do not name (a
// dual-stack service listing only IPv4 ranges leaves its IPv6 address
// open, rather than closed to all).
func rangesOfFamily(ranges []netip.Prefix, v4 bool) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range ranges {
		if r.Addr().Unmap().Is4() == v4 {
			out = append(out, r)
		}
	}
	return out
}

func (s *Service) hasNodePorts() bool {
	if s.Type == FrontendHostPort {
		return true
	}
	for _, p := range s.Ports {
		if p.NodePort != 0 {
			return true
		}
	}
	return false
}

// sameFrontend compares everything but the status. Of a backend, what a
// frontend reads of it counts (address, node, zone and the frontend's
// flags): a new row of the same backend (its slice replaced, a condition
// changed that the flags already tell) leaves the frontend as it is.
func sameFrontend(a, b *Frontend) bool {
	if !sameBackends(a.Backends, b.Backends) || !sameBackends(a.Original, b.Original) {
		return false
	}
	x, y := *a, *b
	x.Status, y.Status = reconciler.Status{}, reconciler.Status{}
	x.Backends, y.Backends, x.Original, y.Original = nil, nil, nil, nil
	return reflect.DeepEqual(x, y)
}

func sameBackends(a, b []FrontendBackend) bool {
	return slices.EqualFunc(a, b, func(x, y FrontendBackend) bool {
		return x.Addr == y.Addr && x.NodeName == y.NodeName && x.Zone == y.Zone &&
			x.Terminating == y.Terminating && x.Active == y.Active && x.Local == y.Local
	})
}

// selectBackends picks the backends of port p of the given family: ready
// ones fill the slots; terminating ones stay listed (their flows drain)
// and fill the slots only when no backend is ready, as long as they still
// serve; with internalTrafficPolicy Local only this node's count. When
// the EndpointSlice hints say so, the ready backends hinted for this node
// (or its zone) fill the slots and the other ready ones stay listed out
// of them (their connections go on; see topology).
func (w *Writer) selectBackends(svc *Service, p ServicePort, v4 bool, all []*Backend) []FrontendBackend {
	byAddr := map[netip.AddrPort]*Backend{}
	for _, b := range all {
		if b.PortName != p.Name || b.Proto != p.Proto || b.Addr.Addr().Unmap().Is4() != v4 {
			continue
		}
		if svc.InternalTrafficPolicy == TrafficPolicyLocal && b.NodeName != w.nodeName {
			continue
		}
		// The same address in two sources (a slice being replaced): the
		// readier listing wins.
		if prev, ok := byAddr[b.Addr]; ok && prev.Ready && !b.Ready {
			continue
		}
		byAddr[b.Addr] = b
	}
	// Sized for the usual case, every backend ready: the slice is kept
	// in the frontend, and append's doubling would leave up to half of
	// it unused (1,152 bytes for 10 backends instead of 720, per
	// frontend, 100,000 frontends).
	ready := make([]FrontendBackend, 0, len(byAddr))
	var draining []FrontendBackend
	for _, b := range byAddr {
		fb := FrontendBackend{Backend: b, Local: b.NodeName != "" && b.NodeName == w.nodeName}
		switch {
		case b.Ready && !b.Terminating:
			fb.Active = true
			ready = append(ready, fb)
		case b.Terminating && b.Serving:
			fb.Terminating = true
			draining = append(draining, fb)
		}
	}
	ready, elsewhere := w.topology(svc, ready, byAddr)
	if len(ready) == 0 {
		for i := range draining {
			draining[i].Active = true
		}
	}
	slices.SortFunc(ready, func(a, b FrontendBackend) int { return a.Addr.Compare(b.Addr) })
	slices.SortFunc(elsewhere, func(a, b FrontendBackend) int { return a.Addr.Compare(b.Addr) })
	slices.SortFunc(draining, func(a, b FrontendBackend) int { return a.Addr.Compare(b.Addr) })
	if len(elsewhere) == 0 && len(draining) == 0 && len(ready) == cap(ready) {
		return ready
	}
	out := make([]FrontendBackend, 0, len(ready)+len(elsewhere)+len(draining))
	return append(append(append(out, ready...), elsewhere...), draining...)
}

// topology narrows the ready backends of a service to those its
// EndpointSlice hints name for this node, as kube-proxy does (whatever the
// Service's trafficDistribution says: the EndpointSlice controller writes
// hints for topology-mode Auto and for each trafficDistribution, and the
// hints are what kube-proxy follows). near keep the slots; elsewhere are
// listed, not active (their connections go on). The mode is chosen from
// the ready backends (TopologyMode): node hints when every ready backend
// has one and one names this node, else zone hints when every ready
// backend has one and one names this node's zone, else none (every ready
// backend: the hints are being written or were withdrawn, and a partial
// view would overload the hinted ones). internalTrafficPolicy Local has
// no topology: its backends are this node's already.
func (w *Writer) topology(svc *Service, ready []FrontendBackend, byAddr map[netip.AddrPort]*Backend) (near, elsewhere []FrontendBackend) {
	if svc.InternalTrafficPolicy == TrafficPolicyLocal || len(ready) == 0 {
		return ready, nil
	}
	hints := make([]Hints, len(ready))
	for i, fb := range ready {
		b := byAddr[fb.Addr]
		if b.Hints != nil {
			hints[i] = *b.Hints
		}
	}
	mode := TopologyMode(hints, w.nodeName, w.nodeZone)
	if mode == TopologyNone {
		return ready, nil
	}
	for i, fb := range ready {
		if hints[i].For(mode, w.nodeName, w.nodeZone) {
			near = append(near, fb)
		} else {
			fb.Active = false
			elsewhere = append(elsewhere, fb)
		}
	}
	return near, elsewhere
}
