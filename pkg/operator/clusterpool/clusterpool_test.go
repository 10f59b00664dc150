package clusterpool

import (
	"context"
	"github.com/tendril-net/tendril/pkg/operator/operatortest"
	"os"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var env k8senv.Package

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, k8senv.Options{}, operatortest.InstallCRDs))
}

// TestClusterPool: two nodes get disjoint CIDRs of both families; a third
// finds the pools exhausted (condition False and a Warning Event); a new
// allocator (a new leader) keeps the existing allocations; when the first
// node and its TendrilNode go, the third gets the freed CIDRs.
func TestClusterPool(t *testing.T) {
	e := env.Need(t)
	c, err := k8s.NewClientsForConfig(e.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, stop, err := resources.Start(ctx, c, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cfg := DefaultConfig()
	cfg.IPAM = "cluster-pool"
	cfg.ClusterPoolIPv4CIDR = []string{"10.20.0.0/23"}
	cfg.ClusterPoolIPv6CIDR = []string{"fd00:20::/119"}
	mkNode := func(name string) {
		if _, err := c.Core.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cidrsOf := func(name string) []string {
		tn, err := c.Tendril.TendrilV1alpha1().TendrilNodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return tn.Spec.IPAM.PodCIDRs
	}
	mkNode("n1")
	mkNode("n2")
	operatortest.WaitFor(t, "nodes in the cache", 30*time.Second, func() bool { n, _ := res.Nodes.List(labels.Everything()); return len(n) == 2 })
	a, err := New(cfg, operatortest.Quiet(), c, res)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	n1, n2 := cidrsOf("n1"), cidrsOf("n2")
	if len(n1) != 2 || len(n2) != 2 {
		t.Fatalf("CIDRs n1 %v n2 %v", n1, n2)
	}
	for _, x := range n1 {
		if slices.Contains(n2, x) {
			t.Fatalf("n1 %v and n2 %v share %s", n1, n2, x)
		}
	}
	// A third node: both pools (two subnets each) are exhausted.
	mkNode("n3")
	operatortest.WaitFor(t, "n3 in the cache", 30*time.Second, func() bool { _, err := res.Nodes.Get("n3"); return err == nil })
	operatortest.WaitFor(t, "TendrilNodes in the cache", 30*time.Second, func() bool { tn, _ := res.TNodes.List(labels.Everything()); return len(tn) == 2 })
	if _, err := a.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	tn3, err := c.Tendril.TendrilV1alpha1().TendrilNodes().Get(ctx, "n3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(tn3.Status.Conditions, ConditionAllocated)
	if len(tn3.Spec.IPAM.PodCIDRs) != 0 || cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != ReasonExhausted {
		t.Fatalf("n3: CIDRs %v condition %+v", tn3.Spec.IPAM.PodCIDRs, cond)
	}
	operatortest.WaitFor(t, "the exhaustion Event on n3", 30*time.Second, func() bool {
		evs, err := c.Core.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=n3,reason=" + ReasonExhausted})
		return err == nil && len(evs.Items) > 0 && evs.Items[0].Type == corev1.EventTypeWarning
	})
	// A new leader's allocator: nothing moves.
	b, err := New(cfg, operatortest.Quiet(), c, res)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cidrsOf("n1"), n1) || !slices.Equal(cidrsOf("n2"), n2) {
		t.Fatalf("a new allocator moved CIDRs: n1 %v→%v n2 %v→%v", n1, cidrsOf("n1"), n2, cidrsOf("n2"))
	}
	// n1 goes (its TendrilNode with it, as the node GC does): n3 gets its CIDRs.
	if err := c.Core.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Tendril.TendrilV1alpha1().TendrilNodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	operatortest.WaitFor(t, "n1 gone from the cache", 30*time.Second, func() bool { _, err := res.TNodes.Get("n1"); return err != nil })
	if _, err := b.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	got := cidrsOf("n3")
	slices.Sort(got)
	want := slices.Clone(n1)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("n3 got %v, want n1's freed %v", got, want)
	}
	tn3, _ = c.Tendril.TendrilV1alpha1().TendrilNodes().Get(ctx, "n3", metav1.GetOptions{})
	if cond := meta.FindStatusCondition(tn3.Status.Conditions, ConditionAllocated); cond == nil || cond.Status != metav1.ConditionTrue {
		t.Fatalf("n3 condition after allocation: %+v", cond)
	}
}

func TestConfigErrors(t *testing.T) {
	e := env.Need(t)
	c, err := k8s.NewClientsForConfig(e.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.IPAM = "cluster-pool"
	if _, err := New(cfg, operatortest.Quiet(), c, nil); err == nil {
		t.Fatal("cluster-pool without pools accepted")
	}
	cfg.ClusterPoolIPv4CIDR = []string{"10.0.0.0/25"}
	if _, err := New(cfg, operatortest.Quiet(), c, nil); err == nil {
		t.Fatal("a pool smaller than the mask accepted")
	}
}
