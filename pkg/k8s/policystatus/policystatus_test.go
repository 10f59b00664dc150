package policystatus

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/testutil"
)

type patch struct {
	kind, ns, name string
	body           []byte
}

// fakePatcher records patches; it fails while fail is set.
type fakePatcher struct {
	mu      sync.Mutex
	patches []patch
	fail    bool
}

func (f *fakePatcher) PatchStatus(_ context.Context, kind, ns, name string, b []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("API server away")
	}
	f.patches = append(f.patches, patch{kind, ns, name, b})
	return nil
}

func (f *fakePatcher) last(t *testing.T) (patch, v1alpha1.NetworkPolicyStatus) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.patches) == 0 {
		return patch{}, v1alpha1.NetworkPolicyStatus{}
	}
	p := f.patches[len(f.patches)-1]
	var body struct {
		Status v1alpha1.NetworkPolicyStatus `json:"status"`
	}
	if err := json.Unmarshal(p.body, &body); err != nil {
		t.Fatal(err)
	}
	return p, body.Status
}

func start(t *testing.T, pt Patcher) *Publisher {
	t.Helper()
	var pub *Publisher
	h := hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(func() cell.Health { hl, _ := cell.NewSimpleHealth(); return hl }),
		cell.Module("policystatus-test", "policy status under test",
			cell.Invoke(func(db *statedb.DB, jobs job.Registry, hl cell.Health, id cell.FullModuleID, log *slog.Logger) error {
				var err error
				pub, err = New(Params{DB: db, Jobs: jobs.NewGroup(hl), Log: log, ModuleID: id, Node: "node1", Patcher: pt,
					Options: []reconciler.Option{reconciler.WithRetry(10*time.Millisecond, 50*time.Millisecond)}})
				return err
			})),
	)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := h.Start(quiet, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Stop(quiet, context.Background()) })
	return pub
}

func TestReportsImportEnforcementAndRejection(t *testing.T) {
	fp := &fakePatcher{}
	pub := start(t, fp)

	// Imported at revision 7: OK, not yet enforcing.
	pub.Imported(KindNetworkPolicy, "shop", "allow-web", 3, 7, nil, nil)
	testutil.Eventually(t, 30*time.Second, "the import report", func() bool {
		p, st := fp.last(t)
		n, ok := st.Nodes["node1"]
		return p.name == "allow-web" && p.ns == "shop" && p.kind == KindNetworkPolicy && ok && n.OK && !n.Enforcing && n.LocalPolicyRevision == 7 && n.ObservedGeneration == 3
	})
	_, st := fp.last(t)
	if len(st.Nodes) != 1 {
		t.Fatalf("a patch names another node's key: %v", st.Nodes)
	}
	if len(st.Conditions) != 1 || st.Conditions[0].Type != v1alpha1.ConditionValid || st.Conditions[0].Status != metav1.ConditionTrue {
		t.Fatalf("conditions = %+v, want Valid=True", st.Conditions)
	}
	// Endpoints behind revision 7: still not enforcing.
	if n := pub.Realized(6); n != 0 {
		t.Fatalf("Realized(6) changed %d reports", n)
	}
	// Every endpoint at 7: enforcing, published even after the API server
	// failed a while (retried).
	fp.mu.Lock()
	fp.fail = true
	fp.mu.Unlock()
	if n := pub.Realized(7); n != 1 {
		t.Fatalf("Realized(7) changed %d reports, want 1", n)
	}
	time.Sleep(50 * time.Millisecond)
	fp.mu.Lock()
	fp.fail = false
	fp.mu.Unlock()
	testutil.Eventually(t, 30*time.Second, "the enforcing report", func() bool {
		_, st := fp.last(t)
		return st.Nodes["node1"].Enforcing
	})
	if r, ok := pub.Report(KindNetworkPolicy, "shop", "allow-web"); !ok || !r.Enforcing {
		t.Fatalf("report = %+v", r)
	}
	// The same import again (a resync) writes nothing.
	fp.mu.Lock()
	before := len(fp.patches)
	fp.mu.Unlock()
	pub.Imported(KindNetworkPolicy, "shop", "allow-web", 3, 7, nil, nil)
	time.Sleep(50 * time.Millisecond)
	fp.mu.Lock()
	after := len(fp.patches)
	fp.mu.Unlock()
	if after != before {
		t.Fatalf("a resync wrote %d patches", after-before)
	}

	// A rejected cluster-wide policy: not OK, never enforcing, Valid=False
	// with the reason.
	pub.Imported(KindClusterwideNetworkPolicy, "", "bad", 1, 9, nil, errors.New(`egress[1].toCIDR[0]: "not-a-cidr"`))
	pub.Realized(100)
	testutil.Eventually(t, 30*time.Second, "the rejection report", func() bool {
		p, st := fp.last(t)
		n := st.Nodes["node1"]
		return p.name == "bad" && p.kind == KindClusterwideNetworkPolicy && !n.OK && !n.Enforcing && n.Error != "" &&
			len(st.Conditions) == 1 && st.Conditions[0].Status == metav1.ConditionFalse
	})
	pub.Removed(KindClusterwideNetworkPolicy, "", "bad")
	if _, ok := pub.Report(KindClusterwideNetworkPolicy, "", "bad"); ok {
		t.Fatal("a removed policy kept its report")
	}
}
