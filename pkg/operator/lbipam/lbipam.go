// Package lbipam is the operator's load-balancer IPAM: it gives every
// Service of type LoadBalancer (without a loadBalancerClass, or with
// LoadBalancerClass) an address per IP family from a
// TendrilLoadBalancerIPPool whose serviceSelector matches it, written
// into status.loadBalancer.ingress. A specific address can be asked for
// with the annotation AnnotationIPs or spec.loadBalancerIP. Addresses go
// back to their pool when the Service is deleted or stops being a
// LoadBalancer. Every Service carries the condition
// ConditionRequestSatisfied; an unsatisfied request is that condition
// False plus a Warning Event, and a pool with no address left has its
// Exhausted condition True.
//
// The state is rebuilt on every pass from the Services' status (plus
// this term's writes the cache has not shown yet), so a new leader (or a
// restarted operator) carries on from what the Services say, and one
// address is never handed out twice: an address two Services carry stays
// with the older one.
package lbipam

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrillisters "github.com/tendril-net/tendril/pkg/k8s/client/listers/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/operator/leader"
	"github.com/tendril-net/tendril/pkg/operator/periodic"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/operator/status"
)

const (
	// LoadBalancerClass is the spec.loadBalancerClass this IPAM serves
	// besides none.
	LoadBalancerClass = "tendril.io/lb-ipam"
	// AnnotationIPs asks for specific addresses (comma-separated, at most
	// one per family); it wins over spec.loadBalancerIP.
	AnnotationIPs = "lbipam.tendril.io/ips"
	// ConditionRequestSatisfied is the Service condition this IPAM writes.
	ConditionRequestSatisfied = "tendril.io/IPAMRequestSatisfied"
)

// Reasons of the Service condition (and of its Events).
const (
	ReasonSatisfied            = "Satisfied"
	ReasonNoPool               = "NoMatchingPool"
	ReasonPoolExhausted        = "PoolExhausted"
	ReasonRequestedUnavailable = "RequestedAddressUnavailable"
	ReasonInvalidRequest       = "InvalidRequest"
)

// Config of the LB IPAM.
type Config struct {
	EnableLBIPAM         bool
	LBIPAMResyncInterval time.Duration
}

// DefaultConfig: on (it does nothing without pools), a full pass a minute
// besides the events.
func DefaultConfig() Config {
	return Config{EnableLBIPAM: true, LBIPAMResyncInterval: time.Minute}
}

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-lb-ipam", c.EnableLBIPAM, "Assign LoadBalancer Services addresses from TendrilLoadBalancerIPPools")
	fs.Duration("lb-ipam-resync-interval", c.LBIPAMResyncInterval, "Interval of full LB IPAM passes besides the Service and pool events")
}

// Cell registers the IPAM as a leader job.
var Cell = cell.Module("lb-ipam", "Load-balancer addresses from TendrilLoadBalancerIPPools",
	cell.Config(DefaultConfig()),
	cell.Invoke(register),
)

type params struct {
	cell.In
	Config    Config
	Log       *slog.Logger
	Clients   *k8s.Clients
	Resources *resources.Resources
	Elector   *leader.Elector
	Reports   *status.Reports
}

func register(p params) error {
	if !p.Config.EnableLBIPAM {
		return nil
	}
	a, err := New(p.Config, p.Log, p.Clients, p.Resources)
	if err != nil {
		return err
	}
	a.Job(p.Reports).Register(p.Elector)
	return nil
}

// IPAM assigns load-balancer addresses.
type IPAM struct {
	cfg      Config
	log      *slog.Logger
	clients  *k8s.Clients
	services corelisters.ServiceLister
	pools    tendrillisters.TendrilLoadBalancerIPPoolLister
	events   record.EventRecorder
	trigger  chan struct{}
	// written holds this term's status writes until the cache shows them.
	written map[string]written
}

type written struct {
	uid     types.UID
	ingress []string
}

// New subscribes to Services and pools; call it before the caches start
// (while the hive is built).
func New(cfg Config, log *slog.Logger, clients *k8s.Clients, res *resources.Resources) (*IPAM, error) {
	if cfg.LBIPAMResyncInterval <= 0 {
		return nil, fmt.Errorf("lb-ipam-resync-interval %s: must be positive", cfg.LBIPAMResyncInterval)
	}
	sv := res.CoreFactory.Core().V1().Services()
	pl := res.TendrilFactory.Tendril().V1alpha1().TendrilLoadBalancerIPPools()
	// Events name Services and pools: the recorder's scheme knows both.
	sch := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(sch); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(sch); err != nil {
		return nil, err
	}
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: clients.Core.CoreV1().Events("")})
	a := &IPAM{cfg: cfg, log: log, clients: clients, services: sv.Lister(), pools: pl.Lister(),
		events:  b.NewRecorder(sch, corev1.EventSource{Component: "tendril-operator"}),
		trigger: make(chan struct{}, 1), written: map[string]written{}}
	// Only Services this IPAM serves, or served (its condition), change
	// a pass: the others' events (most of a cluster's) bring none.
	pokeSvc := func(objs ...any) {
		for _, o := range objs {
			svc, ok := o.(*corev1.Service)
			if !ok || Managed(svc) || meta.FindStatusCondition(svc.Status.Conditions, ConditionRequestSatisfied) != nil {
				a.Poke()
				return
			}
		}
	}
	if _, err := sv.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { pokeSvc(o) }, UpdateFunc: func(old, o any) { pokeSvc(old, o) }, DeleteFunc: func(o any) { pokeSvc(o) },
	}); err != nil {
		return nil, err
	}
	poke := func(any) { a.Poke() }
	if _, err := pl.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke,
	}); err != nil {
		return nil, err
	}
	return a, nil
}

// Poke asks for a pass.
func (a *IPAM) Poke() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// Job is the IPAM as a leader job: a pass at the start of each term, on
// every change and every resync interval, a failed one retried after a
// second. The term's passes read the Services from the API server rather
// than the cache until one succeeds, so the previous leader's last
// writes are seen even if the cache has not caught up with them.
func (a *IPAM) Job(reports periodic.Reporter) periodic.Job {
	var fromAPI bool
	return periodic.Job{
		Name: "lb-ipam", Interval: a.cfg.LBIPAMResyncInterval, Log: a.log, Reports: reports,
		Failed: "LB IPAM pass failed", Trigger: a.trigger, RetryAfter: time.Second,
		StartTerm: func() { a.written, fromAPI = map[string]written{}, true },
		Pass: func(ctx context.Context) (string, error) {
			summary, err := a.Pass(ctx, fromAPI)
			if err == nil {
				fromAPI = false
			}
			return summary, err
		},
	}
}

// pool is a parsed TendrilLoadBalancerIPPool.
type pool struct {
	obj      *v1alpha1.TendrilLoadBalancerIPPool
	ranges   []addrRange
	selector labels.Selector
	invalid  error
	waiting  int
}

func (p *pool) contains(a netip.Addr) bool {
	for _, r := range p.ranges {
		if r.contains(a) {
			return true
		}
	}
	return false
}

// matches says whether the pool may give svc an address.
func (p *pool) matches(svc *corev1.Service) bool {
	return p.invalid == nil && p.selector.Matches(labels.Set(svc.Labels))
}

// free is the pool's lowest address of the family that nobody holds.
func (p *pool) free(is4 bool, held map[netip.Addr]string) (netip.Addr, bool) {
	for _, r := range p.ranges {
		if r.from.Is4() != is4 {
			continue
		}
		for a := r.from; ; a = a.Next() {
			if _, taken := held[a]; !taken {
				return a, true
			}
			if a == r.to {
				break
			}
		}
	}
	return netip.Addr{}, false
}

// Managed says whether this IPAM serves the Service.
func Managed(svc *corev1.Service) bool {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	return svc.Spec.LoadBalancerClass == nil || *svc.Spec.LoadBalancerClass == LoadBalancerClass
}

// Pass assigns and releases addresses once; fromAPI lists the Services
// from the API server instead of the cache.
func (a *IPAM) Pass(ctx context.Context, fromAPI bool) (string, error) {
	pools, err := a.readPools()
	if err != nil {
		return "", err
	}
	svcs, err := a.readServices(ctx, fromAPI)
	if err != nil {
		return "", err
	}
	inPool := func(addr netip.Addr) *pool {
		for _, p := range pools {
			if p.invalid == nil && p.contains(addr) {
				return p
			}
		}
		return nil
	}
	// Who holds what: every managed Service's current addresses that lie
	// in a pool, the oldest Service first, so of two Services carrying
	// one address the younger loses it.
	held := map[netip.Addr]string{}
	current := map[string][]netip.Addr{}
	for _, svc := range svcs {
		key := svc.Namespace + "/" + svc.Name
		if !Managed(svc) {
			continue
		}
		for _, addr := range a.ingressOf(key, svc) {
			if inPool(addr) == nil {
				continue
			}
			if owner, taken := held[addr]; taken {
				a.log.Warn("Address carried by two Services: the older keeps it", "address", addr, "keeps", owner, "loses", key)
				continue
			}
			held[addr] = key
			current[key] = append(current[key], addr)
		}
	}

	assigned, waiting, changed := 0, 0, 0
	for _, svc := range svcs {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		key := svc.Namespace + "/" + svc.Name
		if !Managed(svc) {
			// No longer ours (type changed): give back what it carries of
			// the pools and drop the condition.
			// Only what carries this IPAM's condition: another class's
			// controller may hand out addresses of the same ranges.
			if meta.FindStatusCondition(svc.Status.Conditions, ConditionRequestSatisfied) != nil {
				if err := a.release(ctx, svc, inPool); err != nil {
					return "", err
				}
				changed++
			}
			continue
		}
		addrs, cond := a.assign(svc, pools, current[key], held)
		for _, addr := range addrs {
			held[addr] = key
		}
		if len(addrs) > 0 {
			assigned++
		}
		if cond.Status == metav1.ConditionFalse {
			waiting++
		}
		wrote, err := a.writeService(ctx, svc, addrs, cond)
		if err != nil {
			return "", err
		}
		if wrote {
			changed++
		}
	}
	for _, p := range pools {
		if err := a.writePool(ctx, p, held); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%d pools, %d LoadBalancer Services with addresses, %d waiting, %d updated this pass", len(pools), assigned, waiting, changed), nil
}

func (a *IPAM) readPools() ([]*pool, error) {
	objs, err := a.pools.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	sort.Slice(objs, func(i, j int) bool { return objs[i].Name < objs[j].Name })
	var out []*pool
	for _, o := range objs {
		p := &pool{obj: o, selector: labels.Everything()}
		p.ranges, p.invalid = parseBlocks(o.Spec.Blocks)
		if p.invalid == nil && o.Spec.ServiceSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(o.Spec.ServiceSelector)
			if err != nil {
				p.invalid = fmt.Errorf("serviceSelector: %w", err)
			} else {
				p.selector = sel
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// readServices lists every Service, oldest first.
func (a *IPAM) readServices(ctx context.Context, fromAPI bool) ([]*corev1.Service, error) {
	var svcs []*corev1.Service
	if fromAPI {
		list, err := a.clients.Core.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list Services: %w", err)
		}
		for i := range list.Items {
			svcs = append(svcs, &list.Items[i])
		}
	} else {
		var err error
		if svcs, err = a.services.List(labels.Everything()); err != nil {
			return nil, err
		}
	}
	sort.Slice(svcs, func(i, j int) bool {
		ti, tj := svcs[i].CreationTimestamp, svcs[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return svcs[i].Namespace+"/"+svcs[i].Name < svcs[j].Namespace+"/"+svcs[j].Name
	})
	// Forget writes the cache now shows, and those of Services gone or
	// replaced.
	seen := map[string]types.UID{}
	for _, s := range svcs {
		seen[s.Namespace+"/"+s.Name] = s.UID
	}
	for key, w := range a.written {
		if seen[key] != w.uid {
			delete(a.written, key)
		}
	}
	return svcs, nil
}

// ingressOf is the Service's addresses: its status, or this term's write
// when the cache has not shown it yet.
func (a *IPAM) ingressOf(key string, svc *corev1.Service) []netip.Addr {
	var ips []string
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			ips = append(ips, in.IP)
		}
	}
	if w, ok := a.written[key]; ok && w.uid == svc.UID {
		if slices.Equal(w.ingress, ips) {
			delete(a.written, key)
		} else {
			ips = w.ingress
		}
	}
	var out []netip.Addr
	for _, s := range ips {
		if addr, err := netip.ParseAddr(s); err == nil {
			out = append(out, addr.Unmap())
		}
	}
	return out
}

// requested is what the Service asks for: the annotation, else
// spec.loadBalancerIP; at most one address per family.
func requested(svc *corev1.Service) ([]netip.Addr, error) {
	raw := svc.Annotations[AnnotationIPs]
	what := "annotation " + AnnotationIPs
	if raw == "" {
		raw, what = svc.Spec.LoadBalancerIP, "spec.loadBalancerIP"
	}
	if strings.TrimSpace(raw) == "" {
		return nil, nil
	}
	var out []netip.Addr
	for _, s := range strings.Split(raw, ",") {
		addr, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not an address", what, s)
		}
		addr = addr.Unmap()
		for _, o := range out {
			if o.Is4() == addr.Is4() {
				return nil, fmt.Errorf("%s: two addresses of one family (%s, %s)", what, o, addr)
			}
		}
		out = append(out, addr)
	}
	return out, nil
}

// families are the IP families the Service wants an address of: those of
// its requested addresses, else spec.ipFamilies (IPv4 when empty).
func families(svc *corev1.Service, req []netip.Addr) []bool {
	if len(req) > 0 {
		var out []bool
		for _, r := range req {
			out = append(out, r.Is4())
		}
		return out
	}
	if len(svc.Spec.IPFamilies) == 0 {
		return []bool{true}
	}
	var out []bool
	for _, f := range svc.Spec.IPFamilies {
		out = append(out, f == corev1.IPv4Protocol)
	}
	return out
}

func familyName(is4 bool) string {
	if is4 {
		return "IPv4"
	}
	return "IPv6"
}

// assign decides the Service's addresses: per family, the one it has
// while it still fits (in a pool that matches it, and the requested one
// if it asks), else the requested or the lowest free address of the
// first matching enabled pool. held is every address taken by another
// Service (and by this one, which it may keep).
func (a *IPAM) assign(svc *corev1.Service, pools []*pool, have []netip.Addr, held map[netip.Addr]string) ([]netip.Addr, metav1.Condition) {
	key := svc.Namespace + "/" + svc.Name
	req, err := requested(svc)
	if err != nil {
		return nil, metav1.Condition{Type: ConditionRequestSatisfied, Status: metav1.ConditionFalse, Reason: ReasonInvalidRequest, Message: err.Error()}
	}
	var out []netip.Addr
	var problems []string
	reason := ReasonSatisfied
	fail := func(r, msg string) {
		if reason == ReasonSatisfied {
			reason = r
		}
		problems = append(problems, msg)
	}
	for _, is4 := range families(svc, req) {
		var want netip.Addr
		for _, r := range req {
			if r.Is4() == is4 {
				want = r
			}
		}
		// Keep what it has while it fits.
		kept := false
		for _, h := range have {
			if h.Is4() != is4 || (want.IsValid() && h != want) {
				continue
			}
			for _, p := range pools {
				if p.matches(svc) && p.contains(h) {
					out, kept = append(out, h), true
					break
				}
			}
			if kept {
				break
			}
		}
		if kept {
			continue
		}
		var matching []*pool
		for _, p := range pools {
			if p.matches(svc) && !p.obj.Spec.Disabled {
				matching = append(matching, p)
			}
		}
		if len(matching) == 0 {
			fail(ReasonNoPool, fmt.Sprintf("no enabled TendrilLoadBalancerIPPool matches the Service for %s", familyName(is4)))
			continue
		}
		if want.IsValid() {
			idx := slices.IndexFunc(matching, func(p *pool) bool { return p.contains(want) })
			switch owner, taken := held[want]; {
			case idx < 0:
				fail(ReasonRequestedUnavailable, fmt.Sprintf("requested %s is in no enabled pool that matches the Service", want))
			case taken && owner != key:
				fail(ReasonRequestedUnavailable, fmt.Sprintf("requested %s is in use by Service %s", want, owner))
			default:
				out = append(out, want)
			}
			continue
		}
		found := false
		for _, p := range matching {
			if addr, ok := p.free(is4, held); ok {
				out, found = append(out, addr), true
				break
			}
		}
		if !found {
			var names []string
			for _, p := range matching {
				if slices.ContainsFunc(p.ranges, func(r addrRange) bool { return r.from.Is4() == is4 }) {
					p.waiting++
					names = append(names, p.obj.Name)
				}
			}
			if len(names) == 0 {
				fail(ReasonNoPool, fmt.Sprintf("no matching pool has %s addresses", familyName(is4)))
			} else {
				fail(ReasonPoolExhausted, fmt.Sprintf("no free %s address in the matching pools %v", familyName(is4), names))
			}
		}
	}
	if len(problems) > 0 {
		return out, metav1.Condition{Type: ConditionRequestSatisfied, Status: metav1.ConditionFalse, Reason: reason, Message: strings.Join(problems, "; ")}
	}
	var s []string
	for _, o := range out {
		s = append(s, o.String())
	}
	return out, metav1.Condition{Type: ConditionRequestSatisfied, Status: metav1.ConditionTrue, Reason: ReasonSatisfied,
		Message: "assigned " + strings.Join(s, ", ")}
}

// sameCondition says whether old (nil: none) already reads as c.
func sameCondition(old *metav1.Condition, c metav1.Condition) bool {
	return old != nil && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message
}

func ingressStrings(addrs []netip.Addr) []string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}

// writeService writes the Service's addresses and condition when they
// changed; a condition turning False is also a Warning Event.
func (a *IPAM) writeService(ctx context.Context, svc *corev1.Service, addrs []netip.Addr, cond metav1.Condition) (bool, error) {
	key := svc.Namespace + "/" + svc.Name
	want := ingressStrings(addrs)
	var have []string
	for _, in := range svc.Status.LoadBalancer.Ingress {
		have = append(have, in.IP)
	}
	if w, ok := a.written[key]; ok && w.uid == svc.UID {
		have = w.ingress
	}
	old := meta.FindStatusCondition(svc.Status.Conditions, ConditionRequestSatisfied)
	sameCond := sameCondition(old, cond)
	if slices.Equal(want, have) && sameCond {
		return false, nil
	}
	cur := svc.DeepCopy()
	cur.Status.LoadBalancer.Ingress = nil
	vip := corev1.LoadBalancerIPModeVIP
	for _, ip := range want {
		cur.Status.LoadBalancer.Ingress = append(cur.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip, IPMode: &vip})
	}
	cond.ObservedGeneration = svc.Generation
	meta.SetStatusCondition(&cur.Status.Conditions, cond)
	_, err := a.clients.Core.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		// Changed or gone since read: the event brings another pass.
		a.Poke()
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("update Service %s status: %w", key, err)
	}
	a.written[key] = written{uid: svc.UID, ingress: want}
	if !slices.Equal(want, have) {
		a.log.Info("LoadBalancer addresses", "service", key, "addresses", want, "were", have)
	}
	if cond.Status == metav1.ConditionFalse && !sameCond {
		a.events.Eventf(svc, corev1.EventTypeWarning, cond.Reason, "No load-balancer address: %s", cond.Message)
		a.log.Warn("LoadBalancer Service without an address", "service", key, "reason", cond.Reason, "message", cond.Message)
	}
	return true, nil
}

// release drops the pools' addresses and the condition from a Service
// this IPAM no longer serves.
func (a *IPAM) release(ctx context.Context, svc *corev1.Service, inPool func(netip.Addr) *pool) error {
	key := svc.Namespace + "/" + svc.Name
	cur := svc.DeepCopy()
	cur.Status.LoadBalancer.Ingress = nil
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if addr, err := netip.ParseAddr(in.IP); err == nil && inPool(addr.Unmap()) != nil {
			continue
		}
		cur.Status.LoadBalancer.Ingress = append(cur.Status.LoadBalancer.Ingress, in)
	}
	meta.RemoveStatusCondition(&cur.Status.Conditions, ConditionRequestSatisfied)
	_, err := a.clients.Core.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		a.Poke()
		return nil
	}
	if err != nil {
		return fmt.Errorf("release the addresses of Service %s: %w", key, err)
	}
	delete(a.written, key)
	a.log.Info("LoadBalancer addresses released", "service", key, "type", svc.Spec.Type)
	return nil
}

// writePool sets the pool's Valid and Exhausted conditions; turning
// exhausted is also a Warning Event on the pool.
func (a *IPAM) writePool(ctx context.Context, p *pool, held map[netip.Addr]string) error {
	valid := metav1.Condition{Type: v1alpha1.PoolConditionValid, Status: metav1.ConditionTrue, Reason: "Valid", Message: "blocks and serviceSelector parse"}
	exhausted := metav1.Condition{Type: v1alpha1.PoolConditionExhausted, Status: metav1.ConditionUnknown, Reason: "Invalid", Message: "the pool is not valid"}
	if p.invalid != nil {
		valid = metav1.Condition{Type: v1alpha1.PoolConditionValid, Status: metav1.ConditionFalse, Reason: "Invalid", Message: p.invalid.Error()}
	} else {
		used := 0
		for addr := range held {
			if p.contains(addr) {
				used++
			}
		}
		total := p.ranges[0].size()
		for _, r := range p.ranges[1:] {
			total.Add(total, r.size())
		}
		msg := fmt.Sprintf("%d of %s addresses used", used, total)
		if p.waiting > 0 {
			msg += fmt.Sprintf("; %d Services waiting for an address", p.waiting)
		}
		exhausted = metav1.Condition{Type: v1alpha1.PoolConditionExhausted, Status: metav1.ConditionFalse, Reason: "AddressesFree", Message: msg}
		if total.IsInt64() && int64(used) >= total.Int64() {
			exhausted.Status, exhausted.Reason = metav1.ConditionTrue, "NoFreeAddresses"
		}
	}
	cur := p.obj.DeepCopy()
	changed := false
	for _, c := range []metav1.Condition{valid, exhausted} {
		old := meta.FindStatusCondition(cur.Status.Conditions, c.Type)
		if sameCondition(old, c) {
			continue
		}
		c.ObservedGeneration = cur.Generation
		meta.SetStatusCondition(&cur.Status.Conditions, c)
		changed = true
	}
	if !changed {
		return nil
	}
	wasExhausted := meta.IsStatusConditionTrue(p.obj.Status.Conditions, v1alpha1.PoolConditionExhausted)
	_, err := a.clients.Tendril.TendrilV1alpha1().TendrilLoadBalancerIPPools().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		a.Poke()
		return nil
	}
	if err != nil {
		return fmt.Errorf("update TendrilLoadBalancerIPPool %s status: %w", p.obj.Name, err)
	}
	if exhausted.Status == metav1.ConditionTrue && !wasExhausted {
		a.events.Eventf(cur, corev1.EventTypeWarning, "PoolExhausted", "TendrilLoadBalancerIPPool %s: %s", p.obj.Name, exhausted.Message)
		a.log.Warn("Load-balancer pool exhausted", "pool", p.obj.Name, "message", exhausted.Message)
	}
	if valid.Status == metav1.ConditionFalse {
		a.log.Warn("Load-balancer pool invalid", "pool", p.obj.Name, "error", cmp.Or(valid.Message, "?"))
	}
	return nil
}
