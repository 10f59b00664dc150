package loadbalancer

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// FrontendLocalRedirect is the type of a frontend a local redirect policy
// sends to this node's pods (models.ServiceSpecFlags Type LocalRedirect).
const FrontendLocalRedirect = "LocalRedirect"

// LocalRedirect is a local redirect policy as the writer applies it: a
// frontend (an address and ports, or a service's cluster IP ports) whose
// backends become the pods the policy selects on this node. The source
// checked it whole before it got here.
type LocalRedirect struct {
	// Name is the policy's namespace and name.
	Name ServiceName
	UID  string
	// Service is the service a serviceMatcher names (always in the
	// policy's namespace); zero for an addressMatcher.
	Service ServiceName
	// Address is an addressMatcher's address (invalid for a
	// serviceMatcher).
	Address netip.Addr
	// Ports are the frontend's ports. An addressMatcher lists each
	// port; a serviceMatcher names the service's ports it redirects
	// (by Name, else by Port and Proto; none: every port).
	Ports []ServicePort
	// Backends are the selected pods' addresses on this node, one per
	// pod address and backend port; PortName is the backend port's
	// name (see pairs).
	Backends []RedirectBackend
	// SkipFromBackend is spec.skipRedirectFromBackend: the selected pods'
	// own traffic to the frontend is not redirected back to a local
	// backend but goes where it would without the policy.
	SkipFromBackend bool
}

// Where a client a redirect skips goes (Frontend.SkipMode).
const (
	// SkipToOriginal: the service's own backends (serviceMatcher).
	SkipToOriginal = "original"
	// SkipPass: the address itself, untranslated (addressMatcher).
	SkipPass = "pass"
)

// skipAddrs are the addresses of r's backend pods of one family when r
// skips them (sorted, unique).
func (r *LocalRedirect) skipAddrs(v4 bool) []netip.Addr {
	if !r.SkipFromBackend {
		return nil
	}
	var out []netip.Addr
	for _, b := range r.Backends {
		if a := b.Addr.Addr().Unmap(); a.Is4() == v4 && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// skipClients are the network namespace cookies of r's backend pods when
// r skips them (sorted, unique; pods whose cookie is not known yet are
// left out, and are redirected as any other client until it is).
func (r *LocalRedirect) skipClients() []uint64 {
	if !r.SkipFromBackend {
		return nil
	}
	var out []uint64
	for _, b := range r.Backends {
		if b.NetnsCookie != 0 && !slices.Contains(out, b.NetnsCookie) {
			out = append(out, b.NetnsCookie)
		}
	}
	slices.Sort(out)
	return out
}

// RedirectBackend is one selected local pod on one backend port.
type RedirectBackend struct {
	Pod      string // namespace/name
	Addr     netip.AddrPort
	Proto    uint8
	PortName string
	// NetnsCookie is the pod's network namespace cookie (SO_NETNS_COOKIE;
	// 0: not known), which names it as a client of the socket hooks.
	NetnsCookie uint64
}

// AddressMatcher reports whether r redirects an address (not a service).
func (r *LocalRedirect) AddressMatcher() bool { return r.Address.IsValid() }

// redirectPrefix begins the services-table name of an addressMatcher's
// frontend ("lrp/<policy>"), which no Service can have (a Service name
// has no slash).
const redirectPrefix = "lrp/"

// ServiceName is the services-table name of an addressMatcher's frontend:
// the policy's namespace and "lrp/<name>".
func (r *LocalRedirect) ServiceName() ServiceName {
	return ServiceName{Namespace: r.Name.Namespace, Name: redirectPrefix + r.Name.Name}
}

// redirectsPort reports whether r redirects the service's port p.
func (r *LocalRedirect) redirectsPort(p ServicePort) bool {
	if len(r.Ports) == 0 {
		return true
	}
	for _, rp := range r.Ports {
		if rp.Name != "" && rp.Name == p.Name {
			return true
		}
		if rp.Name == "" && rp.Port == p.Port && rp.Proto == p.Proto {
			return true
		}
	}
	return false
}

// backendsFor are r's backends for frontend port p of the frontends'
// ports all, of one family: those whose backend port has p's name and
// protocol or, when the frontend has a single port and the backends a
// single port name, every backend of p's protocol (one port needs no
// names, as in Cilium's policies).
func (r *LocalRedirect) backendsFor(p ServicePort, all []ServicePort, v4 bool) []FrontendBackend {
	names := map[string]bool{}
	for _, b := range r.Backends {
		names[b.PortName] = true
	}
	single := len(all) == 1 && len(names) == 1
	var out []FrontendBackend
	for _, b := range r.Backends {
		if b.Proto != p.Proto || b.Addr.Addr().Unmap().Is4() != v4 {
			continue
		}
		if !single && b.PortName != p.Name {
			continue
		}
		out = append(out, FrontendBackend{Backend: &Backend{Addr: b.Addr}, Active: true, Local: true})
	}
	return out
}

// TableHeader implements statedb.TableWritable.
func (r *LocalRedirect) TableHeader() []string {
	return []string{"Name", "Frontend", "Ports", "Backends", "SkipFromBackend"}
}

// TableRow implements statedb.TableWritable.
func (r *LocalRedirect) TableRow() []string {
	fe := "service " + r.Service.String()
	if r.AddressMatcher() {
		fe = "address " + r.Address.String()
	}
	var ports, bs []string
	for _, p := range r.Ports {
		ports = append(ports, fmt.Sprintf("%s:%d/%s", p.Name, p.Port, ProtoName(p.Proto)))
	}
	for _, b := range r.Backends {
		bs = append(bs, fmt.Sprintf("%s(%s)", b.Addr, b.Pod))
	}
	return []string{r.Name.String(), fe, strings.Join(ports, ","), strings.Join(bs, ","), strconv.FormatBool(r.SkipFromBackend)}
}

// Indexes of the local-redirects table.
var (
	RedirectByName = statedb.Index[*LocalRedirect, ServiceName]{
		Name:       "name",
		FromObject: func(r *LocalRedirect) index.KeySet { return index.NewKeySet(nameKey(r.Name)) },
		FromKey:    nameKey,
		Unique:     true,
	}
	// RedirectByService holds the serviceMatchers, by their service.
	RedirectByService = statedb.Index[*LocalRedirect, ServiceName]{
		Name: "service",
		FromObject: func(r *LocalRedirect) index.KeySet {
			if r.AddressMatcher() {
				return index.EmptyKeySet
			}
			return index.NewKeySet(nameKey(r.Service))
		},
		FromKey: nameKey,
	}
)

// UpsertLocalRedirect inserts or replaces a local redirect policy.
func (w *Writer) UpsertLocalRedirect(r *LocalRedirect) error {
	return w.Batch(func(b *Batch) error { return b.UpsertLocalRedirect(r) })
}

// DeleteLocalRedirect removes a local redirect policy: its frontends go
// back to the service's own backends, or away (an address).
func (w *Writer) DeleteLocalRedirect(name ServiceName) error {
	return w.Batch(func(b *Batch) error { return b.DeleteLocalRedirect(name) })
}

// UpsertLocalRedirect inserts or replaces a local redirect policy in the
// batch. An addressMatcher is a service of type LocalRedirect with the
// policy's local backends while it has any: with none left it stops
// redirecting (its frontends go, and the address is reached as if no
// policy were there). A serviceMatcher changes the service's cluster IP
// frontends at their recomputation.
func (b *Batch) UpsertLocalRedirect(r *LocalRedirect) error {
	if err := b.DeleteLocalRedirect(r.Name); err != nil {
		return err
	}
	if _, _, err := b.w.t.Redirects.Insert(b.txn, r); err != nil {
		return fmt.Errorf("insert local redirect %s: %w", r.Name, err)
	}
	if !r.AddressMatcher() {
		b.touch(r.Service)
		return nil
	}
	name := r.ServiceName()
	if len(r.Backends) == 0 {
		return nil
	}
	svc := &Service{Name: name, Type: FrontendLocalRedirect, Addresses: []netip.Addr{r.Address.Unmap()},
		Ports: r.Ports, InternalTrafficPolicy: TrafficPolicyCluster, UID: r.UID}
	var backends []*Backend
	for _, p := range r.Ports {
		for _, fb := range r.backendsFor(p, r.Ports, r.Address.Unmap().Is4()) {
			backends = append(backends, &Backend{Service: name, Source: "lrp", Addr: fb.Addr, Proto: p.Proto, PortName: p.Name, NodeName: b.w.nodeName,
				Ready: true, Serving: true})
		}
	}
	if err := b.UpsertService(svc); err != nil {
		return err
	}
	return b.SetBackends(name, "lrp", backends)
}

// DeleteLocalRedirect removes a local redirect policy in the batch.
func (b *Batch) DeleteLocalRedirect(name ServiceName) error {
	old, _, ok := b.w.t.Redirects.Get(b.txn, RedirectByName.Query(name))
	if !ok {
		return nil
	}
	if _, _, err := b.w.t.Redirects.Delete(b.txn, old); err != nil {
		return fmt.Errorf("delete local redirect %s: %w", name, err)
	}
	if !old.AddressMatcher() {
		b.touch(old.Service)
		return nil
	}
	if err := b.DeleteService(old.ServiceName()); err != nil {
		return err
	}
	return b.SetBackends(old.ServiceName(), "lrp", nil)
}

// redirect is the serviceMatcher applied to service name's frontends, if
// any: the first by name when two policies name one service (the other
// waits, and takes over when the first goes).
func (w *Writer) redirect(txn statedb.ReadTxn, name ServiceName) *LocalRedirect {
	var first *LocalRedirect
	for r := range w.t.Redirects.List(txn, RedirectByService.Query(name)) {
		if r.Name.Namespace != name.Namespace {
			continue // never across namespaces (the source refuses them too)
		}
		if first == nil || r.Name.Name < first.Name.Name {
			first = r
		}
	}
	return first
}
