package leader

import (
	"context"
	"github.com/tendril-net/tendril/pkg/operator/operatortest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var env k8senv.Package

func TestMain(m *testing.M) { os.Exit(env.Main(m, k8senv.Options{}, nil)) }

// fastConfig is a short election so the tests take seconds.
func fastConfig(ns, id string) Config {
	return Config{
		LeaderElectionNamespace: ns, LeaderElectionLeaseName: "lock", OperatorID: id,
		LeaderElectionLeaseDuration: 3 * time.Second, LeaderElectionRenewDeadline: 2 * time.Second, LeaderElectionRetryPeriod: 300 * time.Millisecond,
	}
}

func newNamespace(t *testing.T, e *k8senv.Env, name string) {
	t.Helper()
	_, err := e.Clientset().CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// runs counts a job's runs and how many are active at once.
type runs struct {
	mu        sync.Mutex
	active    int
	maxActive int
	started   int
	ended     int
}

func (r *runs) job(ctx context.Context) error {
	r.mu.Lock()
	r.active++
	r.started++
	r.maxActive = max(r.maxActive, r.active)
	r.mu.Unlock()
	<-ctx.Done()
	r.mu.Lock()
	r.active--
	r.ended++
	r.mu.Unlock()
	return nil
}

func (r *runs) get() (active, started, ended int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active, r.started, r.ended
}

// TestLostLeaseStopsJobs: the lease is taken by another holder (as when
// this replica cannot renew it); the elector cancels and joins its jobs,
// and does not run them again while the other holder renews.
func TestLostLeaseStopsJobs(t *testing.T) {
	e := env.Need(t)
	newNamespace(t, e, "lost-lease")
	clients, err := k8s.NewClientsForConfig(e.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	el, err := New(fastConfig("lost-lease", "op-a"), clients, operatortest.Quiet())
	if err != nil {
		t.Fatal(err)
	}
	var r runs
	el.Add("probe", r.job)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); el.Campaign(ctx) }()
	defer func() { cancel(); <-done }()

	operatortest.WaitFor(t, "op-a to lead and start its job", 30*time.Second, func() bool { a, _, _ := r.get(); return el.IsLeader() && a == 1 })

	// An intruder takes the lease over and keeps renewing it.
	leases := clients.Core.CoordinationV1().Leases("lost-lease")
	var stolen atomic.Bool
	intruderCtx, stopIntruder := context.WithCancel(context.Background())
	defer stopIntruder()
	go func() {
		for intruderCtx.Err() == nil {
			l, err := leases.Get(intruderCtx, "lock", metav1.GetOptions{})
			if err == nil {
				now := metav1.NewMicroTime(time.Now())
				holder := "intruder"
				l.Spec.HolderIdentity = &holder
				l.Spec.RenewTime = &now
				l.Spec.AcquireTime = &now
				if _, err := leases.Update(intruderCtx, l, metav1.UpdateOptions{}); err == nil {
					stolen.Store(true)
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	operatortest.WaitFor(t, "op-a to stop its job", 30*time.Second, func() bool { a, _, _ := r.get(); return stolen.Load() && !el.IsLeader() && a == 0 })
	// While the intruder holds the lease, the job stays stopped: op-a only
	// campaigns. Several retry periods pass without a new run.
	_, startedBefore, _ := r.get()
	for i := 0; i < 10; i++ {
		time.Sleep(300 * time.Millisecond)
		if el.IsLeader() {
			t.Fatal("op-a leads again while the intruder renews the lease")
		}
	}
	if _, started, _ := r.get(); started != startedBefore {
		t.Fatalf("the job started again while another replica held the lease (%d runs, was %d)", started, startedBefore)
	}
	// The intruder stops renewing: op-a takes over after the lease expires.
	stopIntruder()
	operatortest.WaitFor(t, "op-a to lead again", 30*time.Second, func() bool { a, _, _ := r.get(); return el.IsLeader() && a == 1 })
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.maxActive != 1 {
		t.Fatalf("job ran %d times at once", r.maxActive)
	}
}

// TestTwoElectorsOneLeader: two electors on one Lease; only one runs the
// job at a time; stopping the leader joins its job before it releases the
// lease, and the other takes over.
func TestTwoElectorsOneLeader(t *testing.T) {
	e := env.Need(t)
	newNamespace(t, e, "two-electors")
	clients, err := k8s.NewClientsForConfig(e.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	var r runs // shared by both: max active must stay 1
	type replica struct {
		el     *Elector
		cancel context.CancelFunc
		done   chan struct{}
	}
	start := func(id string) *replica {
		el, err := New(fastConfig("two-electors", id), clients, operatortest.Quiet())
		if err != nil {
			t.Fatal(err)
		}
		el.Add("probe", r.job)
		ctx, cancel := context.WithCancel(context.Background())
		rep := &replica{el: el, cancel: cancel, done: make(chan struct{})}
		go func() { defer close(rep.done); el.Campaign(ctx) }()
		return rep
	}
	a, b := start("op-a"), start("op-b")
	defer func() { a.cancel(); b.cancel(); <-a.done; <-b.done }()
	operatortest.WaitFor(t, "one leader", 30*time.Second, func() bool { act, _, _ := r.get(); return act == 1 && (a.el.IsLeader() != b.el.IsLeader()) })
	leaderRep, other := a, b
	if b.el.IsLeader() {
		leaderRep, other = b, a
	}
	leaderRep.cancel()
	<-leaderRep.done
	if leaderRep.el.IsLeader() {
		t.Fatal("a stopped elector still reports leading")
	}
	operatortest.WaitFor(t, "the other replica to lead", 30*time.Second, func() bool { act, _, _ := r.get(); return other.el.IsLeader() && act == 1 })
	lease, err := clients.Core.CoordinationV1().Leases("two-electors").Get(context.Background(), "lock", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := holderOf(lease); got != other.el.ID() {
		t.Fatalf("lease holder %q, want %q", got, other.el.ID())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.maxActive != 1 {
		t.Fatalf("job ran %d times at once", r.maxActive)
	}
}

func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func TestConfigValidate(t *testing.T) {
	bad := DefaultConfig()
	bad.LeaderElectionRenewDeadline = bad.LeaderElectionLeaseDuration
	if err := bad.Validate(); err == nil {
		t.Fatal("renew deadline equal to the lease duration accepted")
	}
	bad = DefaultConfig()
	bad.LeaderElectionRetryPeriod = bad.LeaderElectionRenewDeadline
	if err := bad.Validate(); err == nil {
		t.Fatal("retry period equal to the renew deadline accepted")
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}
