package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/endpoint"
)

// recordingDatapath is a Regenerator whose "policy map" is a per-endpoint
// record of the revision and labels last written, and whose writes fail
// while a fault is injected: for the next n writes, or until cleared.
type recordingDatapath struct {
	mu       sync.Mutex
	revision uint64
	failNext int
	failing  bool
	state    map[uint16]string
	attempts []time.Time
	builds   int
	// started, when set, receives each regeneration's endpoint, which
	// then waits for a value on release (or its close).
	started chan *endpoint.Endpoint
	release chan struct{}
}

func newRecordingDatapath(rev uint64) *recordingDatapath {
	return &recordingDatapath{revision: rev, state: map[uint16]string{}}
}

func (d *recordingDatapath) setRevision(rev uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.revision = rev
}

// inject makes the next n writes fail; failing makes all fail until
// cleared with inject(0, false).
func (d *recordingDatapath) inject(n int, failing bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failNext, d.failing = n, failing
}

// write is one policy map write of the endpoint's desired state.
func (d *recordingDatapath) write(ep *endpoint.Endpoint) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.attempts = append(d.attempts, time.Now())
	if d.failing || d.failNext > 0 {
		if d.failNext > 0 {
			d.failNext--
		}
		return fmt.Errorf("update policy map of endpoint %d: %w", ep.ID, syscall.ENOSPC)
	}
	d.state[ep.ID] = mapState(d.revision, ep.Labels)
	ep.PolicyRevision = d.revision
	return nil
}

func mapState(rev uint64, labels []string) string {
	return fmt.Sprintf("revision %d for %s", rev, strings.Join(labels, ","))
}

func (d *recordingDatapath) Regenerate(_ context.Context, ep *endpoint.Endpoint) error {
	d.mu.Lock()
	d.builds++
	started, release := d.started, d.release
	d.mu.Unlock()
	if started != nil {
		started <- ep.Clone() // the test sees the regeneration start...
		<-release             // ...and lets it go on
	}
	return d.write(ep)
}

func (d *recordingDatapath) Remove(_ context.Context, ep *endpoint.Endpoint) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.state, ep.ID)
	return nil
}

// refresh is the light policy path (Manager.Refresh's fn).
func (d *recordingDatapath) refresh(ep *endpoint.Endpoint) error { return d.write(ep) }

func (d *recordingDatapath) snapshot(id uint16) (state string, attempts []time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state[id], append([]time.Time(nil), d.attempts...)
}

// runManager runs the manager's workers with a short backoff until the
// test ends.
func runManager(t *testing.T, m *Manager, r Retry) {
	t.Helper()
	m.SetRetry(r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// waitConverged waits until the endpoint realizes rev and its last
// regeneration succeeded.
func waitConverged(t *testing.T, m *Manager, id uint16, rev uint64) *endpoint.Endpoint {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ep, err := m.Lookup(fmt.Sprint(id))
		if err != nil {
			t.Fatal(err)
		}
		if ep.Converged() && ep.PolicyRevision == rev {
			return ep
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %d did not converge to revision %d: state %s, realized %d, desired %d, error %q",
				id, rev, ep.State, ep.PolicyRevision, ep.DesiredPolicyRevision, ep.LastRegenerationError)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestFailedRegenerationIsRetriedUntilItSucceeds: a policy change whose map
// write fails four times converges once the fault is gone, with no other
// event (no policy change, no API call, and no periodic pass in the test's
// time), through retries whose delays double.
func TestFailedRegenerationIsRetriedUntilItSucceeds(t *testing.T) {
	f := newFixture(t, t.TempDir())
	dp := newRecordingDatapath(1)
	f.mgr.SetRegenerator(dp)
	f.mgr.SetPolicyRevision(1)
	ep := f.createPod(t, 1)
	if state, _ := dp.snapshot(ep.ID); state != mapState(1, nil) {
		t.Fatalf("after create the map holds %q", state)
	}
	runManager(t, f.mgr, Retry{Base: 10 * time.Millisecond, Max: time.Second, FullPass: time.Hour, Workers: 2})

	const faults = 4
	dp.setRevision(2)
	dp.inject(faults, false)
	_, before := dp.snapshot(ep.ID)
	f.mgr.SetPolicyRevision(2)
	if err := f.mgr.Refresh(context.Background(), ep.ID, dp.refresh); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("refresh with a failing map write = %v", err)
	}
	got := waitConverged(t, f.mgr, ep.ID, 2)

	state, attempts := dp.snapshot(ep.ID)
	if state != mapState(2, nil) {
		t.Fatalf("map holds %q, want revision 2", state)
	}
	attempts = attempts[len(before):]
	if len(attempts) != faults+1 {
		t.Fatalf("%d writes after the change, want %d failed and one that succeeded", len(attempts), faults)
	}
	// The retries back off: 10, 20, 40, 80 ms after the failures.
	for i := 1; i < len(attempts); i++ {
		want := 10 * time.Millisecond << (i - 1)
		if gap := attempts[i].Sub(attempts[i-1]); gap < want {
			t.Errorf("retry %d came %v after the failure before it, want at least %v", i, gap, want)
		}
	}
	if got.Regeneration.Failures != faults || got.Regeneration.ConsecutiveFailures != 0 || got.LastRegenerationError != "" {
		t.Fatalf("regeneration status %+v, error %q", got.Regeneration, got.LastRegenerationError)
	}
	if c := f.mgr.Convergence(); c.Converged != 1 || c.Failing != 0 || c.Pending != 0 {
		t.Fatalf("convergence %+v", c)
	}
}

// TestEndpointNotReadyDuringPolicyChangesConverges: an endpoint whose build
// keeps failing is not ready while the policy changes twice; the changes
// skip it, and once the fault is gone it realizes the latest revision on
// its own.
func TestEndpointNotReadyDuringPolicyChangesConverges(t *testing.T) {
	f := newFixture(t, t.TempDir())
	dp := newRecordingDatapath(1)
	f.mgr.SetRegenerator(dp)
	f.mgr.SetPolicyRevision(1)
	runManager(t, f.mgr, Retry{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond, FullPass: time.Hour, Workers: 2})
	dp.inject(0, true)
	ep, err := f.mgr.Create(context.Background(), &endpoint.Endpoint{
		ContainerID: "c1", IfName: "eth0", IPv4: netip.MustParseAddr("10.5.0.7"), PodNamespace: "ns", PodName: "web",
		Labels: []string{"k8s:app=web"},
	}, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		cur, _ := f.mgr.Lookup(fmt.Sprint(ep.ID))
		if cur.State == endpoint.StateNotReady && cur.Regeneration.Failures >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint did not fail its builds: %+v", cur)
		}
		time.Sleep(2 * time.Millisecond)
	}
	for _, rev := range []uint64{2, 3} {
		dp.setRevision(rev)
		f.mgr.SetPolicyRevision(rev)
		if err := f.mgr.Refresh(context.Background(), ep.ID, dp.refresh); err != nil {
			t.Fatalf("refresh of a not-ready endpoint = %v (it is left to its regeneration)", err)
		}
	}
	if c := f.mgr.Convergence(); c.Failing != 1 || c.PolicyRevision != 3 {
		t.Fatalf("while failing: convergence %+v", c)
	}
	dp.inject(0, false)
	waitConverged(t, f.mgr, ep.ID, 3)
	if state, _ := dp.snapshot(ep.ID); state != mapState(3, []string{"k8s:app=web"}) {
		t.Fatalf("map holds %q, want revision 3", state)
	}
}

// TestLabelsRecordedAndRegeneratedWithRetry: SetLabels returns at once;
// the worker's regeneration fails while the fault lasts and realizes the
// new labels once it is gone.
func TestLabelsRecordedAndRegeneratedWithRetry(t *testing.T) {
	f := newFixture(t, t.TempDir())
	dp := newRecordingDatapath(1)
	f.mgr.SetRegenerator(dp)
	f.mgr.SetPolicyRevision(1)
	ep := f.createPod(t, 1)
	runManager(t, f.mgr, Retry{Base: 5 * time.Millisecond, Max: 20 * time.Millisecond, FullPass: time.Hour, Workers: 1})
	dp.inject(3, false)
	changed, err := f.mgr.SetLabels(ep.ID, []string{"k8s:app=db", "k8s:tier=back"}, "pod labels changed")
	if err != nil || !changed {
		t.Fatalf("SetLabels = %v, %v", changed, err)
	}
	if again, _ := f.mgr.SetLabels(ep.ID, []string{"k8s:tier=back", "k8s:app=db"}, "pod labels changed"); again {
		t.Fatal("the same labels again reported a change")
	}
	waitConverged(t, f.mgr, ep.ID, 1)
	if state, _ := dp.snapshot(ep.ID); state != mapState(1, []string{"k8s:app=db", "k8s:tier=back"}) {
		t.Fatalf("map holds %q", state)
	}
	if _, err := f.mgr.SetLabels(999, nil, "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("SetLabels of an unknown endpoint = %v", err)
	}
}

// TestPeriodicPassRegeneratesLaggingEndpoints: an endpoint left behind the
// announced revision with nothing queued for it (a change nobody applied to
// it) is regenerated by the periodic pass.
func TestPeriodicPassRegeneratesLaggingEndpoints(t *testing.T) {
	f := newFixture(t, t.TempDir())
	dp := newRecordingDatapath(1)
	f.mgr.SetRegenerator(dp)
	f.mgr.SetPolicyRevision(1)
	ep := f.createPod(t, 1)
	dp.setRevision(2)
	f.mgr.SetPolicyRevision(2)
	if c := f.mgr.Convergence(); c.Pending != 1 {
		t.Fatalf("convergence %+v, want the endpoint pending", c)
	}
	runManager(t, f.mgr, Retry{Base: 5 * time.Millisecond, Max: 20 * time.Millisecond, FullPass: 20 * time.Millisecond, Workers: 1})
	waitConverged(t, f.mgr, ep.ID, 2)
	if n := f.mgr.FullPass(); n != 0 {
		t.Fatalf("a pass over converged endpoints queued %d", n)
	}
}

// TestDeletedEndpointIsNotRetried: deleting a failing endpoint drops its
// retry.
func TestDeletedEndpointIsNotRetried(t *testing.T) {
	f := newFixture(t, t.TempDir())
	dp := newRecordingDatapath(1)
	f.mgr.SetRegenerator(dp)
	ep := f.createPod(t, 1)
	runManager(t, f.mgr, Retry{Base: 20 * time.Millisecond, Max: 20 * time.Millisecond, FullPass: time.Hour, Workers: 1})
	dp.inject(0, true)
	if _, err := f.mgr.SetLabels(ep.ID, []string{"k8s:a=b"}, "x"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		cur, _ := f.mgr.Lookup(fmt.Sprint(ep.ID))
		if cur.Regeneration.Failures >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no failed regeneration")
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := f.mgr.Delete(context.Background(), ep.ID); err != nil {
		t.Fatal(err)
	}
	_, before := dp.snapshot(ep.ID)
	time.Sleep(100 * time.Millisecond)
	if _, after := dp.snapshot(ep.ID); len(after) != len(before) {
		t.Fatalf("%d regenerations after the delete", len(after)-len(before))
	}
}

func TestRetryDelay(t *testing.T) {
	r := DefaultRetry()
	for failures, want := range map[int]time.Duration{
		1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond,
		9: 25600 * time.Millisecond, 10: 30 * time.Second, 50: 30 * time.Second,
	} {
		if got := r.delay(failures); got != want {
			t.Errorf("delay after %d failures = %v, want %v", failures, got, want)
		}
	}
}

// TestLabelsChangedDuringRegenerationAreNotLost: new labels recorded while
// the endpoint regenerates for older ones survive that regeneration, and
// the next one realizes them.
func TestLabelsChangedDuringRegenerationAreNotLost(t *testing.T) {
	f := newFixture(t, t.TempDir())
	dp := newRecordingDatapath(1)
	f.mgr.SetRegenerator(dp)
	ep := f.createPod(t, 1)
	runManager(t, f.mgr, Retry{Base: 5 * time.Millisecond, Max: 20 * time.Millisecond, FullPass: time.Hour, Workers: 2})
	started, release := make(chan *endpoint.Endpoint, 8), make(chan struct{})
	dp.mu.Lock()
	dp.started, dp.release = started, release
	dp.mu.Unlock()
	t.Cleanup(func() { close(release) }) // before the workers stop: none waits forever
	if _, err := f.mgr.SetLabels(ep.ID, []string{"k8s:v=1"}, "first"); err != nil {
		t.Fatal(err)
	}
	inFlight := <-started
	if !slices.Equal(inFlight.Labels, []string{"k8s:v=1"}) {
		t.Fatalf("regenerating with %v", inFlight.Labels)
	}
	if _, err := f.mgr.SetLabels(ep.ID, []string{"k8s:v=2"}, "second"); err != nil {
		t.Fatal(err)
	}
	release <- struct{}{}
	second := <-started
	if !slices.Equal(second.Labels, []string{"k8s:v=2"}) {
		t.Fatalf("second regeneration with %v", second.Labels)
	}
	release <- struct{}{}
	waitConverged(t, f.mgr, ep.ID, 1)
	got, _ := f.mgr.Lookup(fmt.Sprint(ep.ID))
	if !slices.Equal(got.Labels, []string{"k8s:v=2"}) {
		t.Fatalf("labels %v after both regenerations", got.Labels)
	}
	if state, _ := dp.snapshot(ep.ID); state != mapState(1, []string{"k8s:v=2"}) {
		t.Fatalf("map holds %q", state)
	}
}
