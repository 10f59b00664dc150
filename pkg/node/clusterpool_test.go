package node

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/crdinstall"
)

// TestWaitForClusterPoolCIDRs: the agent waits while its TendrilNode has
// no CIDRs, takes them once the operator writes them (both families), and
// a malformed value is an error.
func TestWaitForClusterPoolCIDRs(t *testing.T) {
	c := clients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := crdinstall.Install(ctx, c.Dynamic, quiet()); err != nil {
		t.Fatal(err)
	}
	tnodes := c.Tendril.TendrilV1alpha1().TendrilNodes()
	if _, err := tnodes.Create(ctx, &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: "pool-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := make(chan Selection, 1)
	errs := make(chan error, 1)
	go func() {
		sel, err := WaitForClusterPoolCIDRs(ctx, c.Tendril, "pool-node", ClusterPoolWant{}, quiet())
		errs <- err
		got <- sel
	}()
	select {
	case err := <-errs:
		t.Fatalf("returned before the CIDRs were written: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	tn, err := tnodes.Get(ctx, "pool-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tn.Spec.IPAM.PodCIDRs = []string{"10.30.1.0/24", "fd00:30::100/120"}
	if _, err := tnodes.Update(ctx, tn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	sel := <-got
	if sel.IPv4.String() != "10.30.1.0/24" || sel.IPv6.String() != "fd00:30::100/120" || sel.IPv4From != SourceClusterPool || sel.IPv6From != SourceClusterPool {
		t.Fatalf("selection %+v", sel)
	}
	// A restarted agent reads the same.
	again, err := WaitForClusterPoolCIDRs(ctx, c.Tendril, "pool-node", ClusterPoolWant{}, quiet())
	if err != nil || again != sel {
		t.Fatalf("second read %+v %v, want %+v", again, err, sel)
	}
	// Only IPv4 from the pool: IPv6 is none.
	if s, err := selectClusterPool("n", []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}); err != nil || s.IPv6From != SourceNone || s.IPv6.IsValid() {
		t.Fatalf("IPv4 only: %+v %v", s, err)
	}
	if _, err := parseClusterPool("n", []string{"10.1.0.0/33"}); err == nil || !strings.Contains(err.Error(), "spec.ipam.podCIDRs") {
		t.Fatalf("malformed CIDR: %v", err)
	}
	two := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24"), netip.MustParsePrefix("fd00:1::/64"), netip.MustParsePrefix("10.1.1.0/24")}
	if _, err := selectClusterPool("n", two); err == nil || !strings.Contains(err.Error(), "10.1.1.0/24 is a second pod CIDR of its family beside 10.1.0.0/24") {
		t.Fatalf("second IPv4 CIDR: %v", err)
	}
}

// TestClusterPoolState: no TendrilNode or no condition is not a problem
// yet; a False condition is, and its line names reason and message.
func TestClusterPoolState(t *testing.T) {
	if ok, msg := ClusterPoolState(nil); !ok || msg != "" {
		t.Fatalf("nil: %v %q", ok, msg)
	}
	tn := &v1alpha1.TendrilNode{}
	if ok, msg := ClusterPoolState(tn); !ok || msg != "" {
		t.Fatalf("no condition: %v %q", ok, msg)
	}
	since := metav1.NewTime(time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC))
	tn.Status.Conditions = []metav1.Condition{{Type: v1alpha1.NodeConditionPodCIDRsAllocated, Status: metav1.ConditionFalse,
		Reason: v1alpha1.NodeReasonPodCIDRPoolExhausted, Message: "[ipv6 pool exhausted]", LastTransitionTime: since}}
	ok, msg := ClusterPoolState(tn)
	if want := "PodCIDRsAllocated=False (PodCIDRPoolExhausted): [ipv6 pool exhausted], since 2026-11-24T08:00:00Z"; ok || msg != want {
		t.Fatalf("False: %v %q, want false %q", ok, msg, want)
	}
	tn.Status.Conditions[0].Status, tn.Status.Conditions[0].Reason = metav1.ConditionTrue, "Allocated"
	if ok, msg := ClusterPoolState(tn); !ok || !strings.HasPrefix(msg, "PodCIDRsAllocated=True (Allocated)") {
		t.Fatalf("True: %v %q", ok, msg)
	}
}

// TestWaitForClusterPoolBothFamilies: an agent told both pools waits
// while its TendrilNode has a CIDR of one family only, takes both once
// the other is written, and a CIDR its check refuses ends the wait with
// the check's error.
func TestWaitForClusterPoolBothFamilies(t *testing.T) {
	c := clients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := crdinstall.Install(ctx, c.Dynamic, quiet()); err != nil {
		t.Fatal(err)
	}
	tnodes := c.Tendril.TendrilV1alpha1().TendrilNodes()
	tn, err := tnodes.Create(ctx, &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: "dual-node"},
		Spec: v1alpha1.NodeSpec{IPAM: v1alpha1.IPAMSpec{PodCIDRs: []string{"10.31.1.0/24"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var checked []netip.Prefix
	want := ClusterPoolWant{IPv4: true, IPv6: true, Check: func(cidrs []netip.Prefix) error { checked = cidrs; return nil }}
	got := make(chan Selection, 1)
	errs := make(chan error, 1)
	go func() {
		sel, err := WaitForClusterPoolCIDRs(ctx, c.Tendril, "dual-node", want, quiet())
		errs <- err
		got <- sel
	}()
	select {
	case err := <-errs:
		t.Fatalf("returned with the IPv4 CIDR only: %v", err)
	case <-time.After(700 * time.Millisecond):
	}
	tn.Spec.IPAM.PodCIDRs = append(tn.Spec.IPAM.PodCIDRs, "fd00:31:0:1::/64")
	if _, err := tnodes.Update(ctx, tn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	sel := <-got
	if sel.IPv4.String() != "10.31.1.0/24" || sel.IPv6.String() != "fd00:31:0:1::/64" {
		t.Fatalf("selection %+v", sel)
	}
	if len(checked) != 2 {
		t.Fatalf("check saw %v, want both CIDRs", checked)
	}
	// IPv6 only asked: the IPv4-only state would not do, both do.
	if missing := missingFamilies([]netip.Prefix{netip.MustParsePrefix("10.31.1.0/24")}, ClusterPoolWant{IPv6: true}); missing != "IPv6" {
		t.Fatalf("missing %q, want IPv6", missing)
	}
	if missing := missingFamilies(nil, ClusterPoolWant{IPv4: true, IPv6: true}); missing != "IPv4 or IPv6" {
		t.Fatalf("missing %q", missing)
	}
	// A refused CIDR ends the wait at once, naming the TendrilNode.
	refuse := errors.New("outside the pool")
	want.Check = func([]netip.Prefix) error { return refuse }
	if _, err := WaitForClusterPoolCIDRs(ctx, c.Tendril, "dual-node", want, quiet()); !errors.Is(err, refuse) || !strings.Contains(err.Error(), "TendrilNode dual-node") {
		t.Fatalf("refused CIDR: %v", err)
	}
}
