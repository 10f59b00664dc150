// Package clusterpool is the operator's cluster-pool IPAM (--ipam
// cluster-pool): it gives every Node a pod CIDR per configured family
// from the cluster pools (--cluster-pool-ipv4-cidr with
// --cluster-pool-ipv4-mask-size, the same for IPv6), written into its
// TendrilNode's spec.ipam.podCIDRs, where an agent in --ipam cluster-pool
// mode takes them from. A CIDR once written is never reassigned while the
// TendrilNode exists, so an agent keeps it across restarts; it returns to
// the pool when the TendrilNode goes (node GC). An exhausted pool is a
// PodCIDRsAllocated=False condition on the TendrilNode and a Warning
// Event on the Node.
//
// The allocation state is rebuilt on every pass from the TendrilNodes in
// the cache plus this term's own writes the cache has not shown yet, so
// a new leader needs no handover.
package clusterpool

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/operator/leader"
	"github.com/tendril-net/tendril/pkg/operator/periodic"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/operator/status"
)

// ConditionAllocated is the TendrilNode condition this package writes.
const ConditionAllocated = v1alpha1.NodeConditionPodCIDRsAllocated

// Reasons of the condition (and of the Event).
const (
	ReasonAllocated = "Allocated"
	ReasonExhausted = v1alpha1.NodeReasonPodCIDRPoolExhausted
)

// Config of the cluster pools.
type Config struct {
	IPAM                      string
	ClusterPoolIPv4CIDR       []string
	ClusterPoolIPv4MaskSize   int
	ClusterPoolIPv6CIDR       []string
	ClusterPoolIPv6MaskSize   int
	ClusterPoolResyncInterval time.Duration
}

// DefaultConfig: off (Node IPAM of kube-controller-manager); Cilium's
// mask sizes.
func DefaultConfig() Config {
	return Config{ClusterPoolIPv4MaskSize: 24, ClusterPoolIPv6MaskSize: 120, ClusterPoolResyncInterval: time.Minute}
}

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("ipam", c.IPAM, `"cluster-pool" to allocate node pod CIDRs from the cluster pools; empty leaves it to kube-controller-manager`)
	fs.StringSlice("cluster-pool-ipv4-cidr", c.ClusterPoolIPv4CIDR, "IPv4 CIDRs node pod CIDRs are cut from")
	fs.Int("cluster-pool-ipv4-mask-size", c.ClusterPoolIPv4MaskSize, "Prefix length of each node's IPv4 pod CIDR")
	fs.StringSlice("cluster-pool-ipv6-cidr", c.ClusterPoolIPv6CIDR, "IPv6 CIDRs node pod CIDRs are cut from")
	fs.Int("cluster-pool-ipv6-mask-size", c.ClusterPoolIPv6MaskSize, "Prefix length of each node's IPv6 pod CIDR")
	fs.Duration("cluster-pool-resync-interval", c.ClusterPoolResyncInterval, "Interval of full allocation passes besides the node events")
}

// Allocator assigns node CIDRs.
type Allocator struct {
	cfg     Config
	log     *slog.Logger
	clients *k8s.Clients
	res     *resources.Resources
	events  record.EventRecorder
	trigger chan struct{}
	// assigned holds this term's writes until the cache shows them.
	assigned map[string][]string
}

// Cell registers the allocator as a leader job when --ipam cluster-pool.
var Cell = cell.Module("cluster-pool", "Cluster-pool node CIDR allocation",
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
	Lifecycle cell.Lifecycle
}

func register(p params) error {
	switch p.Config.IPAM {
	case "", "kubernetes":
		return nil
	case "cluster-pool":
	default:
		return fmt.Errorf("ipam: unknown mode %q (want cluster-pool or kubernetes)", p.Config.IPAM)
	}
	a, err := New(p.Config, p.Log, p.Clients, p.Resources)
	if err != nil {
		return err
	}
	a.Job(p.Reports).Register(p.Elector)
	return nil
}

// New validates the pools and returns an allocator; it subscribes to
// Node and TendrilNode changes.
func New(cfg Config, log *slog.Logger, clients *k8s.Clients, res *resources.Resources) (*Allocator, error) {
	if _, _, err := cfg.pools(); err != nil {
		return nil, err
	}
	if cfg.ClusterPoolResyncInterval <= 0 {
		return nil, fmt.Errorf("cluster-pool-resync-interval %s: must be positive", cfg.ClusterPoolResyncInterval)
	}
	if len(cfg.ClusterPoolIPv4CIDR) == 0 && len(cfg.ClusterPoolIPv6CIDR) == 0 {
		return nil, fmt.Errorf("ipam cluster-pool: neither --cluster-pool-ipv4-cidr nor --cluster-pool-ipv6-cidr is set")
	}
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: clients.Core.CoreV1().Events("")})
	a := &Allocator{cfg: cfg, log: log, clients: clients, res: res, trigger: make(chan struct{}, 1), assigned: map[string][]string{},
		events: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "tendril-operator"})}
	poke := func(any) {
		select {
		case a.trigger <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke}
	if _, err := res.NodeInformer.AddEventHandler(h); err != nil {
		return nil, err
	}
	if _, err := res.TNodeInformer.AddEventHandler(h); err != nil {
		return nil, err
	}
	return a, nil
}

func (c Config) pools() (*Pool, *Pool, error) {
	v4, err := NewPool(c.ClusterPoolIPv4CIDR, c.ClusterPoolIPv4MaskSize, true)
	if err != nil {
		return nil, nil, err
	}
	v6, err := NewPool(c.ClusterPoolIPv6CIDR, c.ClusterPoolIPv6MaskSize, false)
	if err != nil {
		return nil, nil, err
	}
	return v4, v6, nil
}

// Job is the allocator as a leader job: a pass at the start of each
// term, on every Node or TendrilNode change and every resync interval.
func (a *Allocator) Job(reports periodic.Reporter) periodic.Job {
	return periodic.Job{
		Name: "cluster-pool", Interval: a.cfg.ClusterPoolResyncInterval, Log: a.log, Reports: reports,
		Pass: a.Pass, Failed: "Cluster-pool allocation pass failed", Trigger: a.trigger,
		StartTerm: func() { a.assigned = map[string][]string{} },
	}
}

// Pass gives every Node lacking a CIDR of a configured family one.
func (a *Allocator) Pass(ctx context.Context) (string, error) {
	v4, v6, _ := a.cfg.pools()
	nodes, err := a.res.Nodes.List(labels.Everything())
	if err != nil {
		return "", err
	}
	tns, err := a.res.TNodes.List(labels.Everything())
	if err != nil {
		return "", err
	}
	current := map[string][]string{}
	for _, tn := range tns {
		current[tn.Name] = tn.Spec.IPAM.PodCIDRs
	}
	alive := map[string]bool{}
	for _, n := range nodes {
		alive[n.Name] = true
	}
	for name, cidrs := range a.assigned {
		if !alive[name] || slices.Equal(current[name], cidrs) {
			delete(a.assigned, name)
			continue
		}
		current[name] = cidrs
	}
	for _, cidrs := range current {
		for _, s := range cidrs {
			if p, err := netip.ParsePrefix(s); err == nil {
				_ = v4.Occupy(p) || v6.Occupy(p)
			}
		}
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	allocated, exhausted := 0, 0
	for _, n := range nodes {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		cidrs := slices.Clone(current[n.Name])
		var failures []string
		for _, pool := range []*Pool{v4, v6} {
			if !pool.Enabled() || hasFamily(cidrs, pool) {
				continue
			}
			c, err := pool.Allocate()
			if err != nil {
				failures = append(failures, err.Error())
				continue
			}
			cidrs = append(cidrs, c.String())
		}
		changed := !slices.Equal(cidrs, current[n.Name])
		if changed {
			if err := a.writeSpec(ctx, n.Name, cidrs); err != nil {
				return "", err
			}
			a.assigned[n.Name] = cidrs
			allocated++
			a.log.Info("Allocated pod CIDRs", "node", n.Name, "cidrs", cidrs)
		}
		if len(failures) > 0 {
			exhausted++
		}
		if err := a.setCondition(ctx, n, failures); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%d nodes: %d given CIDRs this pass, %d waiting on an exhausted pool", len(nodes), allocated, exhausted), nil
}

func hasFamily(cidrs []string, pool *Pool) bool {
	for _, s := range cidrs {
		if p, err := netip.ParsePrefix(s); err == nil && (p.Addr().Is4() == (pool.Family() == "IPv4")) {
			return true
		}
	}
	return false
}

// writeSpec sets the TendrilNode's pod CIDRs, creating it if missing; the
// agent fills in the addresses later.
func (a *Allocator) writeSpec(ctx context.Context, name string, cidrs []string) error {
	tnodes := a.clients.Tendril.TendrilV1alpha1().TendrilNodes()
	cur, err := tnodes.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		tn := &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NodeSpec{IPAM: v1alpha1.IPAMSpec{PodCIDRs: cidrs}}}
		if _, err := tnodes.Create(ctx, tn, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create TendrilNode %s: %w", name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read TendrilNode %s: %w", name, err)
	}
	// Never replace a CIDR the node already has (the cache may lag a
	// write by its agent): only add the families it lacks.
	merged := slices.Clone(cur.Spec.IPAM.PodCIDRs)
	for _, c := range cidrs {
		p, perr := netip.ParsePrefix(c)
		if perr != nil {
			continue
		}
		pool := &Pool{family: map[bool]string{true: "IPv4", false: "IPv6"}[p.Addr().Is4()]}
		if !hasFamily(merged, pool) {
			merged = append(merged, c)
		}
	}
	if slices.Equal(merged, cur.Spec.IPAM.PodCIDRs) {
		return nil
	}
	cur = cur.DeepCopy()
	cur.Spec.IPAM.PodCIDRs = merged
	if _, err := tnodes.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update TendrilNode %s: %w", name, err)
	}
	return nil
}

// setCondition records the allocation state on the TendrilNode (status
// subresource) and, when it turns to exhausted, an Event on the Node.
func (a *Allocator) setCondition(ctx context.Context, n *corev1.Node, failures []string) error {
	tnodes := a.clients.Tendril.TendrilV1alpha1().TendrilNodes()
	cond := metav1.Condition{Type: ConditionAllocated, Status: metav1.ConditionTrue, Reason: ReasonAllocated, Message: "pod CIDRs allocated from the cluster pools"}
	if len(failures) > 0 {
		cond = metav1.Condition{Type: ConditionAllocated, Status: metav1.ConditionFalse, Reason: ReasonExhausted, Message: fmt.Sprint(failures)}
	}
	cur, err := tnodes.Get(ctx, n.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if len(failures) == 0 {
			return nil
		}
		// No CIDR at all yet: the object exists only to carry the condition.
		tn := &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
		if cur, err = tnodes.Create(ctx, tn, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create TendrilNode %s: %w", n.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("read TendrilNode %s: %w", n.Name, err)
	}
	old := meta.FindStatusCondition(cur.Status.Conditions, ConditionAllocated)
	if old != nil && old.Status == cond.Status && old.Reason == cond.Reason && old.Message == cond.Message {
		return nil
	}
	cur = cur.DeepCopy()
	cond.ObservedGeneration = cur.Generation
	meta.SetStatusCondition(&cur.Status.Conditions, cond)
	if _, err := tnodes.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update TendrilNode %s status: %w", n.Name, err)
	}
	if len(failures) > 0 {
		a.events.Eventf(n, corev1.EventTypeWarning, ReasonExhausted, "No pod CIDR for node %s: %v", n.Name, failures)
		a.log.Warn("Cluster pool exhausted", "node", n.Name, "failures", failures)
	}
	return nil
}
