package node

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilclient "github.com/tendril-net/tendril/pkg/k8s/client/clientset/versioned"
)

// SourceClusterPool: the operator's cluster-pool IPAM gave the CIDR
// (TendrilNode.spec.ipam.podCIDRs). It comes before every other source.
const SourceClusterPool CIDRSource = "cluster-pool"

// WaitForClusterPoolCIDRs waits (retrying with backoff, a log line per
// attempt) until this node's TendrilNode has pod CIDRs from the
// operator's cluster pools, and selects them. The operator never moves a
// CIDR once written, so a restarted agent gets the same ones. A value
// that does not parse is an error, not a fallback.
func WaitForClusterPoolCIDRs(ctx context.Context, c tendrilclient.Interface, name string, log *slog.Logger) (Selection, error) {
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 10 * time.Second}
	for attempt := 1; ; attempt++ {
		tn, err := c.TendrilV1alpha1().TendrilNodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(tn.Spec.IPAM.PodCIDRs) > 0 {
			return selectClusterPool(name, tn.Spec.IPAM.PodCIDRs)
		}
		if err == nil {
			if ok, msg := ClusterPoolState(tn); !ok && msg != "" {
				err = fmt.Errorf("TendrilNode %s has no pod CIDRs: %s", name, msg)
			} else {
				err = fmt.Errorf("TendrilNode %s has no pod CIDRs yet (is tendril-operator running with --ipam cluster-pool? see its %s condition)", name, v1alpha1.NodeConditionPodCIDRsAllocated)
			}
		}
		if ctx.Err() != nil {
			return Selection{}, fmt.Errorf("wait for cluster-pool CIDRs of %s: %w (last error: %v)", name, ctx.Err(), err)
		}
		d := backoff.Step()
		log.Info("Waiting for this node's cluster-pool CIDRs", "node", name, "attempt", attempt, "retry-in", d, "error", err)
		select {
		case <-ctx.Done():
			return Selection{}, fmt.Errorf("wait for cluster-pool CIDRs of %s: %w (last error: %v)", name, ctx.Err(), err)
		case <-time.After(d):
		}
	}
}

// ClusterPoolState reads the operator's PodCIDRsAllocated condition on a
// TendrilNode: ok unless it is False (a pool was exhausted for a family
// the node lacks), and a line saying so; "" when there is no condition
// yet (or no TendrilNode).
func ClusterPoolState(tn *v1alpha1.TendrilNode) (ok bool, msg string) {
	if tn == nil {
		return true, ""
	}
	c := meta.FindStatusCondition(tn.Status.Conditions, v1alpha1.NodeConditionPodCIDRsAllocated)
	if c == nil {
		return true, ""
	}
	msg = fmt.Sprintf("%s=%s (%s)", c.Type, c.Status, c.Reason)
	if c.Message != "" {
		msg += ": " + c.Message
	}
	return c.Status != metav1.ConditionFalse, msg + ", since " + c.LastTransitionTime.UTC().Format(time.RFC3339)
}

func selectClusterPool(name string, cidrs []string) (Selection, error) {
	var sel Selection
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Selection{}, fmt.Errorf("TendrilNode %s spec.ipam.podCIDRs %q: %w", name, s, err)
		}
		if p.Addr().Is4() && !sel.IPv4.IsValid() {
			sel.IPv4, sel.IPv4From = p.Masked(), SourceClusterPool
		} else if p.Addr().Is6() && !sel.IPv6.IsValid() {
			sel.IPv6, sel.IPv6From = p.Masked(), SourceClusterPool
		}
	}
	if !sel.IPv4.IsValid() {
		sel.IPv4From = SourceNone
	}
	if !sel.IPv6.IsValid() {
		sel.IPv6From = SourceNone
	}
	return sel, nil
}
