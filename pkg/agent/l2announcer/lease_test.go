package l2announcer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

// The Lease campaigns against a real kube-apiserver.
var env k8senv.Package

func TestMain(m *testing.M) { os.Exit(env.Main(m, k8senv.Options{}, nil)) }

// campaignRun is one node's campaign of one service, its leadership
// reported on a channel.
type campaignRun struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
	lead   chan bool
}

func startCampaign(t *testing.T, cfg Config, cs kubernetes.Interface, node string, svc loadbalancer.ServiceName) *campaignRun {
	ctx, cancel := context.WithCancelCause(context.Background())
	r := &campaignRun{cancel: cancel, done: make(chan struct{}), lead: make(chan bool, 16)}
	// The campaign's log goes to the test's output: a failed election
	// says why (a release that could not be written, an API error).
	log := slog.New(slog.NewTextHandler(t.Output(), nil)).With("node", node)
	run := LeaseCampaign(cfg, func() kubernetes.Interface { return cs }, node, log)
	go func() {
		defer close(r.done)
		run(ctx, svc, func(l bool) { r.lead <- l }, func() {})
	}()
	// A test that failed half-way still ends its campaigns before it
	// returns (they log to its output).
	t.Cleanup(func() { cancel(errors.New("test over")); <-r.done })
	return r
}

// stop ends the campaign with cause and waits for it (a release included)
// to return; the bound only keeps a broken release from hanging the test.
func (r *campaignRun) stop(t *testing.T, node string, cause error) {
	t.Helper()
	r.cancel(cause)
	select {
	case <-r.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s's campaign did not return after %v", node, cause)
	}
}

// waitLead waits for the campaign to report want (the bound only keeps a
// broken election from hanging the test).
func (r *campaignRun) waitLead(t *testing.T, node string, want bool) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l := <-r.lead:
			if l == want {
				return
			}
		case <-timeout:
			t.Fatalf("%s never reported leading=%v", node, want)
		}
	}
}

// withoutLease deletes the service's Lease now and when the test ends:
// it outlives the campaigns (their duration is 10 minutes), so a later
// run in this control plane (-count), or one that died before its
// cleanup, would otherwise start with it.
func withoutLease(t *testing.T, cs kubernetes.Interface, svc loadbalancer.ServiceName) {
	deleteLease := func() {
		_ = cs.CoordinationV1().Leases("default").Delete(context.Background(), LeaseName(svc), metav1.DeleteOptions{})
	}
	deleteLease()
	t.Cleanup(deleteLease)
}

func holderOf(t *testing.T, cs kubernetes.Interface, svc loadbalancer.ServiceName) string {
	t.Helper()
	l, err := cs.CoordinationV1().Leases("default").Get(context.Background(), LeaseName(svc), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// TestLeaseCampaign: one of two candidates holds the service's Lease; a
// candidate that stops being one releases it and the other takes it;
// the agent's stop keeps it, and the same node campaigning again (a
// restarted agent) leads again.
func TestLeaseCampaign(t *testing.T) {
	cs := env.Need(t).Clientset()
	cfg := DefaultConfig()
	cfg.Enabled, cfg.LeaseNamespace = true, "default"
	// A lease far longer than waitLead's bound: node-b can take over in
	// the test only if node-a released the lease. A renew deadline long
	// enough for a loaded API server (the release tries for two of them).
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 10*time.Minute, 5*time.Second, 300*time.Millisecond
	svc := loadbalancer.ServiceName{Namespace: "ns", Name: "web"}
	withoutLease(t, cs, svc)

	a := startCampaign(t, cfg, cs, "node-a", svc)
	a.waitLead(t, "node-a", true)
	b := startCampaign(t, cfg, cs, "node-b", svc)
	if h := holderOf(t, cs, svc); h != "node-a" {
		t.Fatalf("holder %q, want node-a", h)
	}

	a.stop(t, "node-a", ErrNotCandidate)
	b.waitLead(t, "node-b", true)
	if h := holderOf(t, cs, svc); h != "node-b" {
		t.Fatalf("after node-a gave up: holder %q, want node-b", h)
	}

	b.stop(t, "node-b", fmt.Errorf("wrapped: %w", ErrStopping))
	if h := holderOf(t, cs, svc); h != "node-b" {
		t.Fatalf("after node-b's agent stopped: holder %q, want node-b (the lease kept)", h)
	}
	b2 := startCampaign(t, cfg, cs, "node-b", svc)
	b2.waitLead(t, "node-b (restarted)", true)
	b2.stop(t, "node-b (restarted)", errors.New("test over"))
}

// TestReleaseLeaseRetries: a release the API server fails once (a
// timeout on a loaded control plane) is tried again, and the lease ends
// up released rather than held for its whole duration.
func TestReleaseLeaseRetries(t *testing.T) {
	cs := env.Need(t).Clientset()
	cfg := DefaultConfig()
	cfg.Enabled, cfg.LeaseNamespace = true, "default"
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 10*time.Minute, 2*time.Second, 100*time.Millisecond
	svc := loadbalancer.ServiceName{Namespace: "ns", Name: "release-retry"}
	withoutLease(t, cs, svc)

	a := startCampaign(t, cfg, cs, "node-a", svc)
	a.waitLead(t, "node-a", true)
	// The first release try fails: its lock's client answers the update
	// with an error once, as a timed-out request would.
	failing := &failFirstUpdate{LeasesGetter: cs.CoordinationV1()}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: "default", Name: LeaseName(svc)},
		Client:     failing,
		LockConfig: resourcelock.ResourceLockConfig{Identity: "node-a"},
	}
	a.stop(t, "node-a", errors.New("test: campaign over, lease kept"))
	if h := holderOf(t, cs, svc); h != "node-a" {
		t.Fatalf("holder %q before the release, want node-a", h)
	}
	if err := releaseLease(lock, "node-a", cfg); err != nil {
		t.Fatalf("release: %v", err)
	}
	if failing.failed.Load() != 1 {
		t.Fatalf("the update failed %d times, want 1 (the test did not exercise a retry)", failing.failed.Load())
	}
	if h := holderOf(t, cs, svc); h != "" {
		t.Fatalf("holder %q after the release, want none", h)
	}
}

// failFirstUpdate fails the first Lease update it sees.
type failFirstUpdate struct {
	coordinationv1client.LeasesGetter
	failed atomic.Int32
}

func (f *failFirstUpdate) Leases(ns string) coordinationv1client.LeaseInterface {
	return failingLeases{LeaseInterface: f.LeasesGetter.Leases(ns), f: f}
}

type failingLeases struct {
	coordinationv1client.LeaseInterface
	f *failFirstUpdate
}

func (l failingLeases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if l.f.failed.CompareAndSwap(0, 1) {
		return nil, errors.New("test: the update timed out")
	}
	return l.LeaseInterface.Update(ctx, lease, opts)
}
