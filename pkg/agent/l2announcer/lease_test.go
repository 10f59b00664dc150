package l2announcer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

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

func startCampaign(cfg Config, cs kubernetes.Interface, node string, svc loadbalancer.ServiceName) *campaignRun {
	ctx, cancel := context.WithCancelCause(context.Background())
	r := &campaignRun{cancel: cancel, done: make(chan struct{}), lead: make(chan bool, 16)}
	run := LeaseCampaign(cfg, func() kubernetes.Interface { return cs }, node, slog.New(slog.DiscardHandler))
	go func() {
		defer close(r.done)
		run(ctx, svc, func(l bool) { r.lead <- l }, func() {})
	}()
	return r
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
	// the test only if node-a released the lease.
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 10*time.Minute, 2*time.Second, 300*time.Millisecond
	svc := loadbalancer.ServiceName{Namespace: "ns", Name: "web"}
	// The lease outlives the campaigns (10 minutes): a later run in this
	// control plane (-count) starts without it.
	// A run that died before its cleanup (in a control plane that outlives
	// it) may have left it too: start without one.
	deleteLease := func() {
		_ = cs.CoordinationV1().Leases("default").Delete(context.Background(), LeaseName(svc), metav1.DeleteOptions{})
	}
	deleteLease()
	t.Cleanup(deleteLease)

	a := startCampaign(cfg, cs, "node-a", svc)
	a.waitLead(t, "node-a", true)
	b := startCampaign(cfg, cs, "node-b", svc)
	if h := holderOf(t, cs, svc); h != "node-a" {
		t.Fatalf("holder %q, want node-a", h)
	}

	a.cancel(ErrNotCandidate)
	<-a.done
	b.waitLead(t, "node-b", true)
	if h := holderOf(t, cs, svc); h != "node-b" {
		t.Fatalf("after node-a gave up: holder %q, want node-b", h)
	}

	b.cancel(fmt.Errorf("wrapped: %w", ErrStopping))
	<-b.done
	if h := holderOf(t, cs, svc); h != "node-b" {
		t.Fatalf("after node-b's agent stopped: holder %q, want node-b (the lease kept)", h)
	}
	b2 := startCampaign(cfg, cs, "node-b", svc)
	b2.waitLead(t, "node-b (restarted)", true)
	b2.cancel(errors.New("test over"))
	<-b2.done
}
