// Package lrpsource turns TendrilLocalRedirectPolicies and this node's pods
// into the services tables' local redirects (loadbalancer.LocalRedirect):
// it checks each policy whole (a policy with any bad part is refused and
// logged, and nothing of it reaches the tables), selects the policy's
// backends among the pods of its own namespace on this node, and writes
// the result through the services writer.
package lrpsource

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// maxPorts bounds the ports of a policy's frontend or backend.
const maxPorts = 32

// Policy is a checked policy: the redirect without its backends, and what
// selects them.
type Policy struct {
	Redirect *loadbalancer.LocalRedirect
	Selector labels.Selector
	// BackendPorts are the pods' ports.
	BackendPorts []loadbalancer.ServicePort
}

// Limits are what a node allows addressMatchers. An addressMatcher
// redirects the traffic of every pod on the node, whatever its namespace,
// so unlike a serviceMatcher (its own namespace's Service only) it is
// limited to the namespaces an administrator names.
type Limits struct {
	// AddressCIDRs are the ranges an addressMatcher's address must be in
	// (none: any unicast address).
	AddressCIDRs []netip.Prefix
	// AddressNamespaces are the namespaces whose policies may use an
	// addressMatcher ("*": any).
	AddressNamespaces []string
}

func (l Limits) namespaceAllowed(ns string) bool {
	return slices.Contains(l.AddressNamespaces, "*") || slices.Contains(l.AddressNamespaces, ns)
}

// Parse checks a policy whole and translates it, within lim.
func Parse(p *v1alpha1.TendrilLocalRedirectPolicy, lim Limits) (*Policy, error) {
	name := loadbalancer.ServiceName{Namespace: p.Namespace, Name: p.Name}
	r := &loadbalancer.LocalRedirect{Name: name, UID: string(p.UID), SkipFromBackend: p.Spec.SkipRedirectFromBackend}
	fe := p.Spec.RedirectFrontend
	switch {
	case fe.AddressMatcher != nil && fe.ServiceMatcher != nil:
		return nil, errors.New("redirectFrontend: addressMatcher and serviceMatcher both set, want exactly one")
	case fe.AddressMatcher != nil:
		am := fe.AddressMatcher
		a, err := netip.ParseAddr(am.IP)
		if err != nil {
			return nil, fmt.Errorf("redirectFrontend.addressMatcher.ip %q: not an IP address", am.IP)
		}
		a = a.Unmap()
		if a.Zone() != "" || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() ||
			(a.Is4() && a == netip.AddrFrom4([4]byte{255, 255, 255, 255})) {
			return nil, fmt.Errorf("redirectFrontend.addressMatcher.ip %s: must be a unicast address (not unspecified, loopback, multicast or broadcast)", a)
		}
		if !lim.namespaceAllowed(p.Namespace) {
			return nil, fmt.Errorf("redirectFrontend.addressMatcher: namespace %s may not redirect addresses (it would redirect every pod of the node; --lrp-address-matcher-namespaces %s)",
				p.Namespace, strings.Join(lim.AddressNamespaces, ","))
		}
		if len(lim.AddressCIDRs) > 0 && !slices.ContainsFunc(lim.AddressCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
			return nil, fmt.Errorf("redirectFrontend.addressMatcher.ip %s: outside the ranges this node allows (--lrp-address-matcher-cidrs %s)", a, prefixList(lim.AddressCIDRs))
		}
		if len(am.ToPorts) == 0 {
			return nil, errors.New("redirectFrontend.addressMatcher.toPorts: at least one port")
		}
		ports, err := parsePorts("redirectFrontend.addressMatcher.toPorts", am.ToPorts, true)
		if err != nil {
			return nil, err
		}
		r.Address, r.Ports = a, ports
	case fe.ServiceMatcher != nil:
		sm := fe.ServiceMatcher
		if errs := validation.IsDNS1035Label(sm.ServiceName); len(errs) > 0 {
			return nil, fmt.Errorf("redirectFrontend.serviceMatcher.serviceName %q: %s", sm.ServiceName, strings.Join(errs, "; "))
		}
		if sm.Namespace != "" && sm.Namespace != p.Namespace {
			return nil, fmt.Errorf("redirectFrontend.serviceMatcher.namespace %q: a policy redirects only Services of its own namespace (%s)", sm.Namespace, p.Namespace)
		}
		ports, err := parsePorts("redirectFrontend.serviceMatcher.toPorts", sm.ToPorts, false)
		if err != nil {
			return nil, err
		}
		r.Service = loadbalancer.ServiceName{Namespace: p.Namespace, Name: sm.ServiceName}
		r.Ports = ports
	default:
		return nil, errors.New("redirectFrontend: neither addressMatcher nor serviceMatcher set, want exactly one")
	}
	be := p.Spec.RedirectBackend
	sel, err := metav1.LabelSelectorAsSelector(&be.LocalEndpointSelector)
	if err != nil {
		return nil, fmt.Errorf("redirectBackend.localEndpointSelector: %w", err)
	}
	if sel.Empty() {
		return nil, errors.New("redirectBackend.localEndpointSelector: empty, it would select every pod of the namespace; name the backend pods' labels")
	}
	if len(be.ToPorts) == 0 {
		return nil, errors.New("redirectBackend.toPorts: at least one port")
	}
	bports, err := parsePorts("redirectBackend.toPorts", be.ToPorts, true)
	if err != nil {
		return nil, err
	}
	// Frontend and backend ports pair by name, unless each side has one.
	if !(len(bports) == 1 && len(r.Ports) <= 1) {
		for _, fp := range r.Ports {
			if fp.Name == "" || !slices.ContainsFunc(bports, func(b loadbalancer.ServicePort) bool { return b.Name == fp.Name && b.Proto == fp.Proto }) {
				return nil, fmt.Errorf("frontend port %s: no backend port of the same name and protocol (with more than one port, each frontend port names the backend port it goes to)", portString(fp))
			}
		}
	}
	return &Policy{Redirect: r, Selector: sel, BackendPorts: bports}, nil
}

// parsePorts checks ports: numbers 1-65535 (needed unless a serviceMatcher
// names the port), TCP or UDP, names unique, no port twice, and names on
// every port when there are several of them.
func parsePorts(field string, in []v1alpha1.LRPPort, needNumber bool) ([]loadbalancer.ServicePort, error) {
	if len(in) > maxPorts {
		return nil, fmt.Errorf("%s: %d ports, at most %d", field, len(in), maxPorts)
	}
	var out []loadbalancer.ServicePort
	names := map[string]bool{}
	for i, p := range in {
		var sp loadbalancer.ServicePort
		if p.Port != "" || needNumber {
			n, err := strconv.ParseUint(p.Port, 10, 16)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("%s[%d].port %q: want a port number 1-65535", field, i, p.Port)
			}
			sp.Port = uint16(n)
		} else if p.Name == "" {
			return nil, fmt.Errorf("%s[%d]: neither port nor name", field, i)
		}
		proto := p.Protocol
		if proto == "" {
			proto = "TCP"
		}
		switch strings.ToUpper(proto) {
		case "TCP":
			sp.Proto = loadbalancer.TCP
		case "UDP":
			sp.Proto = loadbalancer.UDP
		default:
			return nil, fmt.Errorf("%s[%d].protocol %q: want TCP or UDP", field, i, p.Protocol)
		}
		if p.Name != "" {
			if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
				return nil, fmt.Errorf("%s[%d].name %q: %s", field, i, p.Name, strings.Join(errs, "; "))
			}
			if names[p.Name] {
				return nil, fmt.Errorf("%s[%d].name %q: named twice", field, i, p.Name)
			}
			names[p.Name] = true
		} else if len(in) > 1 {
			return nil, fmt.Errorf("%s[%d]: unnamed, but there are %d ports (name each)", field, i, len(in))
		}
		sp.Name = p.Name
		if sp.Port != 0 && slices.ContainsFunc(out, func(o loadbalancer.ServicePort) bool { return o.Port == sp.Port && o.Proto == sp.Proto }) {
			return nil, fmt.Errorf("%s[%d]: port %d/%s listed twice", field, i, sp.Port, loadbalancer.ProtoName(sp.Proto))
		}
		out = append(out, sp)
	}
	return out, nil
}

func portString(p loadbalancer.ServicePort) string {
	return fmt.Sprintf("%q %d/%s", p.Name, p.Port, loadbalancer.ProtoName(p.Proto))
}

func prefixList(ps []netip.Prefix) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ",")
}

// Backends are the redirect's backends among pods (this node's): the
// running, ready, non-host-network pods of the policy's namespace its
// selector matches, each address on each backend port.
func (p *Policy) Backends(pods []*corev1.Pod) []loadbalancer.RedirectBackend {
	var out []loadbalancer.RedirectBackend
	for _, pod := range pods {
		if pod.Namespace != p.Redirect.Name.Namespace || !usable(pod) || !p.Selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		for _, a := range podAddrs(pod) {
			for _, bp := range p.BackendPorts {
				out = append(out, loadbalancer.RedirectBackend{Pod: pod.Namespace + "/" + pod.Name, Addr: netip.AddrPortFrom(a, bp.Port),
					Proto: bp.Proto, PortName: bp.Name})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if c := out[i].Addr.Compare(out[j].Addr); c != 0 {
			return c < 0
		}
		return out[i].Proto < out[j].Proto
	})
	return out
}

// usable: running, not being deleted, ready (when it says), and with
// addresses of its own.
func usable(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Spec.HostNetwork {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
			return false
		}
	}
	return true
}

func podAddrs(pod *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil && !slices.Contains(out, a.Unmap()) {
			out = append(out, a.Unmap())
		}
	}
	if len(out) == 0 {
		if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// Writer is what the source writes through (the services writer).
type Writer interface {
	UpsertLocalRedirect(*loadbalancer.LocalRedirect) error
	DeleteLocalRedirect(loadbalancer.ServiceName) error
	RegisterInitializer(name string) (done func())
}

// Source follows the policies and this node's pods.
type Source struct {
	w      Writer
	log    *slog.Logger
	limits Limits

	mu       sync.Mutex
	policies map[string]*Policy // by namespace/name, the valid ones
	rejected map[string]string  // by namespace/name, why
	pods     map[string]*corev1.Pod
	// applied are the backends last written per policy: a pod event
	// that changes none of them writes nothing.
	applied map[string][]loadbalancer.RedirectBackend
	// cookies are this node's pods' network namespace cookies, by
	// namespace/name (SetNetnsCookie): skipRedirectFromBackend names the
	// backend pods by them.
	cookies map[string]uint64
	synced  map[string]bool
	done    func()
}

// New returns a source writing through w; the frontends table is not
// initialized (no prune of the LB maps) until both kinds have synced.
func New(w Writer, lim Limits, log *slog.Logger) *Source {
	return &Source{w: w, log: log, limits: lim, policies: map[string]*Policy{}, rejected: map[string]string{},
		pods: map[string]*corev1.Pod{}, cookies: map[string]uint64{}, applied: map[string][]loadbalancer.RedirectBackend{}, synced: map[string]bool{}, done: w.RegisterInitializer("k8s-local-redirects")}
}

// Rejected are the refused policies and why, by namespace/name.
func (s *Source) Rejected() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.rejected))
	for k, v := range s.rejected {
		out[k] = v
	}
	return out
}

// Counts are the applied and refused policies.
func (s *Source) Counts() (applied, rejected int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.policies), len(s.rejected)
}

func (s *Source) markSynced(kind string) {
	s.synced[kind] = true
	if s.synced["policies"] && s.synced["pods"] && s.done != nil {
		s.done()
		s.done = nil
	}
}

// OnPolicy handles a TendrilLocalRedirectPolicy event.
func (s *Source) OnPolicy(ev watchers.Event[*v1alpha1.TendrilLocalRedirectPolicy]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ev.Kind == watchers.Synced {
		s.markSynced("policies")
		return
	}
	ns, n, _ := strings.Cut(ev.Key, "/")
	name := loadbalancer.ServiceName{Namespace: ns, Name: n}
	if ev.Kind == watchers.Delete {
		delete(s.policies, ev.Key)
		delete(s.rejected, ev.Key)
		delete(s.applied, ev.Key)
		s.logErr(ev.Key, s.w.DeleteLocalRedirect(name))
		return
	}
	p, err := Parse(ev.Object, s.limits)
	if err != nil {
		// Refused whole: nothing of it stays applied (an earlier valid
		// version included).
		s.log.Warn("Local redirect policy refused", "policy", ev.Key, "error", err)
		delete(s.policies, ev.Key)
		delete(s.applied, ev.Key)
		s.rejected[ev.Key] = err.Error()
		s.logErr(ev.Key, s.w.DeleteLocalRedirect(name))
		return
	}
	delete(s.rejected, ev.Key)
	s.policies[ev.Key] = p
	delete(s.applied, ev.Key) // the policy changed: write it whatever its backends
	s.apply(ev.Key, p)
}

// OnPod handles an event of this node's pods.
func (s *Source) OnPod(ev watchers.Event[*corev1.Pod]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ev.Kind == watchers.Synced {
		s.markSynced("pods")
		return
	}
	ns, _, _ := strings.Cut(ev.Key, "/")
	if ev.Kind == watchers.Delete {
		delete(s.pods, ev.Key)
	} else {
		s.pods[ev.Key] = ev.Object
	}
	for key, p := range s.policies {
		if p.Redirect.Name.Namespace == ns {
			s.apply(key, p)
		}
	}
}

// SetNetnsCookie records pod's (namespace/name) network namespace cookie
// (0: forget it, the pod's endpoint is gone) and rewrites the policies of
// its namespace whose backends change by it.
func (s *Source) SetNetnsCookie(pod string, cookie uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cookies[pod] == cookie {
		return
	}
	if cookie == 0 {
		delete(s.cookies, pod)
	} else {
		s.cookies[pod] = cookie
	}
	ns, _, _ := strings.Cut(pod, "/")
	for key, p := range s.policies {
		if p.Redirect.Name.Namespace == ns {
			s.apply(key, p)
		}
	}
}

// apply writes policy p with the backends it selects now.
func (s *Source) apply(key string, p *Policy) {
	pods := make([]*corev1.Pod, 0, len(s.pods))
	for _, pod := range s.pods {
		pods = append(pods, pod)
	}
	r := *p.Redirect
	r.Backends = p.Backends(pods)
	for i := range r.Backends {
		r.Backends[i].NetnsCookie = s.cookies[r.Backends[i].Pod]
	}
	if prev, ok := s.applied[key]; ok && slices.Equal(prev, r.Backends) {
		return
	}
	if err := s.w.UpsertLocalRedirect(&r); err != nil {
		s.logErr(key, err)
		return
	}
	s.applied[key] = r.Backends
}

func (s *Source) logErr(key string, err error) {
	if err != nil {
		s.log.Error("Write local redirect policy", "policy", key, "error", err)
	}
}
