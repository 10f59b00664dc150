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

// ClusterPoolWant is what an agent waits for in its TendrilNode's pod
// CIDRs.
type ClusterPoolWant struct {
	// IPv4 and IPv6: wait until a CIDR of the family is there (the
	// operator has a pool of it). Neither: the first CIDRs written do.
	IPv4, IPv6 bool
	// Check, when set, judges the CIDRs once they are there (every one,
	// as written): an error ends the wait, since the operator never moves
	// a CIDR it wrote.
	Check func([]netip.Prefix) error
}

// WaitForClusterPoolCIDRs waits (retrying with backoff, a log line per
// attempt) until this node's TendrilNode has pod CIDRs from the
// operator's cluster pools, of each family want asks for, checks and
// selects them. The operator never moves a CIDR once written, so a
// restarted agent gets the same ones. A value that does not parse, or a
// second CIDR of one family, is an error, not a fallback.
func WaitForClusterPoolCIDRs(ctx context.Context, c tendrilclient.Interface, name string, want ClusterPoolWant, log *slog.Logger) (Selection, error) {
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 10 * time.Second}
	for attempt := 1; ; attempt++ {
		tn, err := c.TendrilV1alpha1().TendrilNodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(tn.Spec.IPAM.PodCIDRs) > 0 {
			cidrs, perr := parseClusterPool(name, tn.Spec.IPAM.PodCIDRs)
			if perr != nil {
				return Selection{}, perr
			}
			missing := missingFamilies(cidrs, want)
			if missing == "" {
				if want.Check != nil {
					if cerr := want.Check(cidrs); cerr != nil {
						return Selection{}, fmt.Errorf("TendrilNode %s spec.ipam.podCIDRs %v: %w", name, tn.Spec.IPAM.PodCIDRs, cerr)
					}
				}
				return selectClusterPool(name, cidrs)
			}
			err = fmt.Errorf("TendrilNode %s has pod CIDRs %v but no %s one yet", name, tn.Spec.IPAM.PodCIDRs, missing)
			if ok, msg := ClusterPoolState(tn); !ok && msg != "" {
				err = fmt.Errorf("%w: %s", err, msg)
			}
		} else if err == nil {
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

// missingFamilies names the families want asks for that cidrs lack ("IPv4",
// "IPv6", "IPv4 or IPv6"; "" when none is missing).
func missingFamilies(cidrs []netip.Prefix, want ClusterPoolWant) string {
	var has4, has6 bool
	for _, p := range cidrs {
		if p.Addr().Is4() {
			has4 = true
		} else {
			has6 = true
		}
	}
	switch {
	case want.IPv4 && !has4 && want.IPv6 && !has6:
		return "IPv4 or IPv6"
	case want.IPv4 && !has4:
		return "IPv4"
	case want.IPv6 && !has6:
		return "IPv6"
	}
	return ""
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

// parseClusterPool parses a TendrilNode's pod CIDRs.
func parseClusterPool(name string, cidrs []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("TendrilNode %s spec.ipam.podCIDRs %q: %w", name, s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// selectClusterPool makes the selection of one CIDR per family; a second
// of a family is an error (which one would the pods' addresses come from,
// and which would the other nodes route here?).
func selectClusterPool(name string, cidrs []netip.Prefix) (Selection, error) {
	var sel Selection
	for _, p := range cidrs {
		first := &sel.IPv6
		from := &sel.IPv6From
		if p.Addr().Is4() {
			first, from = &sel.IPv4, &sel.IPv4From
		}
		if first.IsValid() {
			return Selection{}, fmt.Errorf("TendrilNode %s spec.ipam.podCIDRs: %s is a second pod CIDR of its family beside %s (one per family)", name, p, *first)
		}
		*first, *from = p, SourceClusterPool
	}
	if !sel.IPv4.IsValid() {
		sel.IPv4From = SourceNone
	}
	if !sel.IPv6.IsValid() {
		sel.IPv6From = SourceNone
	}
	return sel, nil
}
