// Package node knows this node as Kubernetes sees it: it waits for the
// node's Node object, picks the node's pod CIDRs by precedence
// (Node.spec.podCIDRs > tendril.io/ipv4-pod-cidr and ipv6 annotations >
// --ipv4-range/--ipv6-range > auto), or with --ipam cluster-pool takes
// them from its TendrilNode (clusterpool.go), and writes the choice and the node's
// addresses back (Node annotations and a TendrilNode object), retrying in
// the background until the API server takes them.
package node

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Annotations on the Node object.
const (
	AnnotationIPv4PodCIDR = "tendril.io/ipv4-pod-cidr"
	AnnotationIPv6PodCIDR = "tendril.io/ipv6-pod-cidr"
	// Router IPs: the address of the node's host device in each pod CIDR.
	AnnotationIPv4Router = "tendril.io/ipv4-router"
	AnnotationIPv6Router = "tendril.io/ipv6-router"
)

// CIDRSource says where a pod CIDR came from.
type CIDRSource string

// Sources, in precedence order.
const (
	SourceNodeSpec   CIDRSource = "node-spec"
	SourceAnnotation CIDRSource = "annotation"
	SourceFlag       CIDRSource = "flag"
	SourceAuto       CIDRSource = "auto"
	SourceNone       CIDRSource = "none"
)

// Selection is the node's pod CIDRs and where each came from.
type Selection struct {
	IPv4, IPv6         netip.Prefix
	IPv4From, IPv6From CIDRSource
}

// Ranges are the --ipv4-range / --ipv6-range values ("auto", "none", "" or
// a prefix) and the CIDRs "auto" stands for.
type Ranges struct {
	IPv4, IPv6         string
	AutoIPv4, AutoIPv6 netip.Prefix
}

// SelectPodCIDRs applies the precedence to each family. An invalid value in
// the Node object is an error (the operator or a person wrote it wrong and
// silently falling back would hand out addresses of another range).
func SelectPodCIDRs(n *corev1.Node, r Ranges) (Selection, error) {
	var sel Selection
	var err error
	sel.IPv4, sel.IPv4From, err = selectFamily(n, r.IPv4, r.AutoIPv4, true)
	if err != nil {
		return sel, err
	}
	sel.IPv6, sel.IPv6From, err = selectFamily(n, r.IPv6, r.AutoIPv6, false)
	if err != nil {
		return sel, err
	}
	if !sel.IPv4.IsValid() && !sel.IPv6.IsValid() {
		return sel, fmt.Errorf("no pod CIDR: the Node has none and ipv4-range and ipv6-range are both disabled")
	}
	return sel, nil
}

func selectFamily(n *corev1.Node, flag string, auto netip.Prefix, v4 bool) (netip.Prefix, CIDRSource, error) {
	if n != nil {
		specCIDRs := n.Spec.PodCIDRs
		if len(specCIDRs) == 0 && n.Spec.PodCIDR != "" {
			specCIDRs = []string{n.Spec.PodCIDR}
		}
		for _, s := range specCIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return netip.Prefix{}, "", fmt.Errorf("node %s spec.podCIDRs %q: %w", n.Name, s, err)
			}
			if p.Addr().Is4() == v4 {
				return p.Masked(), SourceNodeSpec, nil
			}
		}
		key := AnnotationIPv6PodCIDR
		if v4 {
			key = AnnotationIPv4PodCIDR
		}
		if s, ok := n.Annotations[key]; ok && s != "" {
			p, err := parseFamily(s, v4)
			if err != nil {
				return netip.Prefix{}, "", fmt.Errorf("node %s annotation %s: %w", n.Name, key, err)
			}
			return p, SourceAnnotation, nil
		}
	}
	flagName := "ipv6-range"
	if v4 {
		flagName = "ipv4-range"
	}
	switch flag {
	case "", "none":
		return netip.Prefix{}, SourceNone, nil
	case "auto":
		return auto, SourceAuto, nil
	}
	p, err := parseFamily(flag, v4)
	if err != nil {
		return netip.Prefix{}, "", fmt.Errorf("%s: %w", flagName, err)
	}
	return p, SourceFlag, nil
}

func parseFamily(s string, v4 bool) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q: %w", s, err)
	}
	if p.Addr().Is4() != v4 {
		return netip.Prefix{}, fmt.Errorf("%q: wrong address family", s)
	}
	return p.Masked(), nil
}

// WaitForNode gets the Node object named name, retrying with backoff (and a
// log line per failure) until it exists or ctx ends: on a fresh cluster the
// agent may start before the kubelet registered the node.
func WaitForNode(ctx context.Context, c kubernetes.Interface, name string, log *slog.Logger) (*corev1.Node, error) {
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 10 * time.Second}
	for attempt := 1; ; attempt++ {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return n, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("wait for node %s: %w (last error: %v)", name, ctx.Err(), err)
		}
		d := backoff.Step()
		log.Info("Waiting for this node's Node object", "node", name, "attempt", attempt, "retry-in", d, "error", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for node %s: %w (last error: %v)", name, ctx.Err(), err)
		case <-time.After(d):
		}
	}
}
