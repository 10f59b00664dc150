package node

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilclient "github.com/tendril-net/tendril/pkg/k8s/client/clientset/versioned"
)

// Local is what this node publishes about itself.
type Local struct {
	Name       string
	Selection  Selection
	RouterIPv4 netip.Addr
	RouterIPv6 netip.Addr
	// Addresses are the node's own addresses (InternalIP ...), usually
	// from the Node object's status.
	Addresses []v1alpha1.NodeAddress
	// WireGuardPublicKey is the node's WireGuard public key ("" with
	// encryption off).
	WireGuardPublicKey string
	// HealthIPv4 and HealthIPv6 are the addresses of the node's health
	// endpoint (pkg/agent/nodehealth), published as TendrilHealthIP;
	// invalid while it has none.
	HealthIPv4, HealthIPv6 netip.Addr
}

// HealthAddresses is the node's health endpoint's addresses as the
// write-back publishes them, and a channel closed when they change.
type HealthAddresses interface {
	HealthEndpointAddresses() (v4, v6 netip.Addr, changed <-chan struct{})
}

// Writer publishes Local to the API server, retrying until it succeeds.
type Writer struct {
	core    kubernetes.Interface
	tendril tendrilclient.Interface
	log     *slog.Logger
	backoff wait.Backoff

	mu       sync.Mutex
	attempts int
	lastErr  error
	doneAt   time.Time
}

// NewWriter makes a Writer. maxDelay caps the pause between attempts.
func NewWriter(core kubernetes.Interface, td tendrilclient.Interface, maxDelay time.Duration, log *slog.Logger) *Writer {
	return &Writer{core: core, tendril: td, log: log,
		backoff: wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: maxDelay}}
}

// WriteStatus is the write-back's progress.
type WriteStatus struct {
	Attempts int
	Done     bool
	LastErr  error
}

// Status reports the progress.
func (w *Writer) Status() WriteStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	return WriteStatus{Attempts: w.attempts, Done: !w.doneAt.IsZero(), LastErr: w.lastErr}
}

// Run writes l back, retrying with backoff until it succeeds or ctx ends.
func (w *Writer) Run(ctx context.Context, l Local) error {
	b := w.backoff
	for {
		err := w.writeOnce(ctx, l)
		w.mu.Lock()
		w.attempts++
		w.lastErr = err
		if err == nil {
			w.doneAt = time.Now()
		}
		attempts := w.attempts
		w.mu.Unlock()
		if err == nil {
			w.log.Info("Wrote node pod CIDRs and addresses back", "node", l.Name, "attempts", attempts,
				"ipv4-cidr", l.Selection.IPv4, "ipv6-cidr", l.Selection.IPv6)
			return nil
		}
		d := b.Step()
		w.log.Warn("Writing node information back failed, will retry", "node", l.Name, "attempt", attempts, "retry-in", d, "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("write back node %s: %w (last error: %v)", l.Name, ctx.Err(), err)
		case <-time.After(d):
		}
	}
}

func (w *Writer) writeOnce(ctx context.Context, l Local) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.annotate(ctx, l); err != nil {
		return err
	}
	return w.upsertTendrilNode(ctx, l)
}

func (w *Writer) annotate(ctx context.Context, l Local) error {
	ann := map[string]any{}
	set := func(key string, ok bool, v string) {
		if ok {
			ann[key] = v
		} else {
			ann[key] = nil // merge patch: remove a stale value
		}
	}
	set(AnnotationIPv4PodCIDR, l.Selection.IPv4.IsValid(), l.Selection.IPv4.String())
	set(AnnotationIPv6PodCIDR, l.Selection.IPv6.IsValid(), l.Selection.IPv6.String())
	set(AnnotationIPv4Router, l.RouterIPv4.IsValid(), l.RouterIPv4.String())
	set(AnnotationIPv6Router, l.RouterIPv6.IsValid(), l.RouterIPv6.String())
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return fmt.Errorf("encode node patch: %w", err)
	}
	if _, err := w.core.CoreV1().Nodes().Patch(ctx, l.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("annotate node %s: %w", l.Name, err)
	}
	return nil
}

func (w *Writer) upsertTendrilNode(ctx context.Context, l Local) error {
	spec := v1alpha1.NodeSpec{Addresses: append([]v1alpha1.NodeAddress(nil), l.Addresses...),
		Encryption: v1alpha1.NodeEncryption{WireGuardPublicKey: l.WireGuardPublicKey}}
	if l.RouterIPv4.IsValid() {
		spec.Addresses = append(spec.Addresses, v1alpha1.NodeAddress{Type: "TendrilInternalIP", IP: l.RouterIPv4.String()})
	}
	if l.RouterIPv6.IsValid() {
		spec.Addresses = append(spec.Addresses, v1alpha1.NodeAddress{Type: "TendrilInternalIP", IP: l.RouterIPv6.String()})
	}
	for _, ip := range []netip.Addr{l.HealthIPv4, l.HealthIPv6} {
		if ip.IsValid() {
			spec.Addresses = append(spec.Addresses, v1alpha1.NodeAddress{Type: v1alpha1.NodeAddressHealthIP, IP: ip.String()})
		}
	}
	for _, p := range []netip.Prefix{l.Selection.IPv4, l.Selection.IPv6} {
		if p.IsValid() {
			spec.IPAM.PodCIDRs = append(spec.IPAM.PodCIDRs, p.String())
		}
	}
	nodes := w.tendril.TendrilV1alpha1().TendrilNodes()
	cur, err := nodes.Get(ctx, l.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		obj := &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: l.Name}, Spec: spec}
		if _, err := nodes.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create TendrilNode %s: %w", l.Name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get TendrilNode %s: %w", l.Name, err)
	}
	cur = cur.DeepCopy()
	cur.Spec = spec
	if _, err := nodes.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update TendrilNode %s: %w", l.Name, err)
	}
	return nil
}

// AddressesOf returns a Node's InternalIP and ExternalIP addresses.
func AddressesOf(n *corev1.Node) []v1alpha1.NodeAddress {
	var out []v1alpha1.NodeAddress
	if n == nil {
		return nil
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			out = append(out, v1alpha1.NodeAddress{Type: string(a.Type), IP: a.Address})
		}
	}
	return out
}
