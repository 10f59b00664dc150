package nodegc

import (
	"context"
	"github.com/tendril-net/tendril/pkg/operator/operatortest"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var env k8senv.Package

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, k8senv.Options{}, operatortest.InstallCRDs))
}

// TestOrphanedTendrilNodes: a TendrilNode whose Node is gone is a
// candidate in one pass and deleted in the next; one whose Node exists
// stays; one whose Node comes back between the passes stays.
func TestOrphanedTendrilNodes(t *testing.T) {
	e := env.Need(t)
	c, err := k8s.NewClientsForConfig(e.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mkNode := func(name string) {
		if _, err := c.Core.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tnodes := c.Tendril.TendrilV1alpha1().TendrilNodes()
	for _, n := range []string{"alive", "orphan", "returning"} {
		if _, err := tnodes.Create(ctx, &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkNode("alive")
	res, stop, err := resources.Start(ctx, c, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for {
		tn, _ := res.TNodes.List(labels.Everything())
		ns, _ := res.Nodes.List(labels.Everything())
		if len(tn) == 3 && len(ns) == 1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	gc := New(operatortest.Quiet(), c, res)
	r, err := gc.Pass(ctx)
	if err != nil || r.Candidates != 2 || r.Deleted != 0 {
		t.Fatalf("first pass: %s %v", r, err)
	}
	mkNode("returning")
	r, err = gc.Pass(ctx)
	if err != nil || r.Deleted != 1 {
		t.Fatalf("second pass: %s %v", r, err)
	}
	for name, want := range map[string]bool{"alive": true, "returning": true, "orphan": false} {
		_, err := tnodes.Get(ctx, name, metav1.GetOptions{})
		if want && err != nil {
			t.Errorf("TendrilNode %s deleted: %v", name, err)
		}
		if !want && !apierrors.IsNotFound(err) {
			t.Errorf("TendrilNode %s kept (%v)", name, err)
		}
	}
}
