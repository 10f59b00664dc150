package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/epattach"
	"github.com/tendril-net/tendril/pkg/agent/epattach/epattachtest"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/ipcache/ipcachetest"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// recordingKernel stands in for the BPF maps and programs an endpoint's
// regeneration writes (agentdatapath.Kernel): it records the policy map and
// the endpoint entries, and fails policy map writes while a fault is
// injected. Everything above it is the agent's own: identity allocation,
// ipcache, policy resolution and diff, the endpoint manager, the policy
// pass.
type recordingKernel struct {
	mu        sync.Mutex
	policy    map[maps.PolicyKey]maps.PolicyValue
	endpoints map[uint16]loader.EndpointInfo
	failing   bool
	writes    int
}

func newRecordingKernel() *recordingKernel {
	return &recordingKernel{policy: map[maps.PolicyKey]maps.PolicyValue{}, endpoints: map[uint16]loader.EndpointInfo{}}
}

func (k *recordingKernel) setFailing(f bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.failing = f
}

func (k *recordingKernel) AttachEndpoint(ep loader.EndpointInfo) error { return k.WriteEndpoint(ep) }
func (k *recordingKernel) CheckEndpoint(ep loader.EndpointInfo) (bool, error) {
	return false, k.WriteEndpoint(ep)
}
func (k *recordingKernel) WriteEndpoint(ep loader.EndpointInfo) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.endpoints[ep.ID] = ep
	return nil
}
func (k *recordingKernel) DetachEndpoint(id uint16, _ []netip.Addr) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.endpoints, id)
	return nil
}
func (k *recordingKernel) AttachedEndpoints() []uint16 {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []uint16
	for id := range k.endpoints {
		out = append(out, id)
	}
	return out
}
func (k *recordingKernel) EndpointIDs() ([]uint16, error) { return k.AttachedEndpoints(), nil }
func (k *recordingKernel) PurgeEndpoint(id uint16) (bool, error) {
	return false, k.DetachEndpoint(id, nil)
}
func (k *recordingKernel) PolicyMap() agentdatapath.PolicyMap { return recordingPolicyMap{k} }

type recordingPolicyMap struct{ k *recordingKernel }

func (m recordingPolicyMap) DumpEndpoint(id uint16) (map[maps.PolicyKey]maps.PolicyValue, error) {
	m.k.mu.Lock()
	defer m.k.mu.Unlock()
	out := map[maps.PolicyKey]maps.PolicyValue{}
	for key, v := range m.k.policy {
		if key.EndpointID == id {
			out[key] = v
		}
	}
	return out, nil
}

func (m recordingPolicyMap) Upsert(key maps.PolicyKey, v maps.PolicyValue) error {
	m.k.mu.Lock()
	defer m.k.mu.Unlock()
	m.k.writes++
	if m.k.failing {
		return fmt.Errorf("update policy map entry of endpoint %d: map full", key.EndpointID)
	}
	m.k.policy[key] = v
	return nil
}

func (m recordingPolicyMap) Delete(key maps.PolicyKey) error {
	m.k.mu.Lock()
	defer m.k.mu.Unlock()
	delete(m.k.policy, key)
	return nil
}

func (m recordingPolicyMap) DeleteEndpoint(id uint16) error {
	m.k.mu.Lock()
	defer m.k.mu.Unlock()
	for key := range m.k.policy {
		if key.EndpointID == id {
			delete(m.k.policy, key)
		}
	}
	return nil
}

// allows reports whether the recorded map allows peer into (ingress) or
// out of (egress) the endpoint on proto/port by an exact entry.
func (k *recordingKernel) allows(ep uint16, dir uint8, peer identity.NumericIdentity, proto uint8, port uint16) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.policy[maps.PolicyKey{EndpointID: ep, Direction: dir, Identity: uint32(peer), Proto: proto, Port: port, PortPrefixLen: 16}]
	return ok && !v.Deny
}

type nopIPCacheBackend struct{}

func (nopIPCacheBackend) Upsert(netip.Prefix, ipcache.Entry) error { return nil }
func (nopIPCacheBackend) Delete(netip.Prefix) error                { return nil }
func (nopIPCacheBackend) Prefixes() ([]netip.Prefix, error)        { return nil, nil }

// flakyAllocator is the identity allocator failing while told to, as the
// CRD allocator does while the API server is unreachable, or blocking
// while held (an API server that does not answer).
type flakyAllocator struct {
	identity.Allocator
	mu       sync.Mutex
	failing  bool
	failures int
	held     chan struct{}
}

// hold makes Allocate block until the returned release is called.
func (f *flakyAllocator) hold() (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	held := make(chan struct{})
	f.held = held
	return func() {
		f.mu.Lock()
		f.held = nil
		f.mu.Unlock()
		close(held)
	}
}

func (f *flakyAllocator) setFailing(v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing = v
}

func (f *flakyAllocator) Allocate(labels []string) (identity.Identity, bool, error) {
	f.mu.Lock()
	if held := f.held; held != nil {
		f.mu.Unlock()
		<-held
		f.mu.Lock()
	}
	if f.failing {
		f.failures++
		f.mu.Unlock()
		return identity.Identity{}, false, errors.New("create TendrilIdentity: dial tcp 10.0.0.1:6443: connect: connection refused")
	}
	f.mu.Unlock()
	return f.Allocator.Allocate(labels)
}

// regenAgent is an agent with its datapath module, endpoint manager and
// policy pass running over a recording kernel (nothing is loaded or
// attached, so it runs without root).
type regenAgent struct {
	a      *testAgent
	kernel *recordingKernel
	alloc  *flakyAllocator
	mgr    *endpointmanager.Manager
}

func newRegenAgent(t testing.TB, retry endpointmanager.Retry) *regenAgent {
	t.Helper()
	dir := t.TempDir()
	flags := testFlags(dir, map[string]string{"bpf-root": filepath.Join(dir, "bpf-never-used"), "enable-datapath": "true"})
	kernel := newRecordingKernel()
	var alloc *flakyAllocator
	a, err := newTestAgent(Deps{}, flags,
		// Identities are allocated through an allocator that fails while
		// told to.
		cell.DecorateAll(func(a identity.Allocator) identity.Allocator {
			alloc = &flakyAllocator{Allocator: a}
			return alloc
		}),
		// Endpoints are regenerated into the recording kernel.
		cell.DecorateAll(func(agentdatapath.Kernel) agentdatapath.Kernel { return kernel }),
		// The hive is not started: the ipcache runs with its reconciler
		// in a hive of its own, over a backend that accepts every write.
		cell.DecorateAll(func(*ipcache.IPCache) *ipcache.IPCache { return ipcachetest.Start(t, nopIPCacheBackend{}) }),
		// Likewise the endpoints table, over the recording kernel.
		cell.DecorateAll(func(*epattach.Table) *epattach.Table { return epattachtest.Start(t, kernel) }),
	)
	if err != nil {
		t.Fatal(err)
	}
	r := &regenAgent{a: a, kernel: kernel, alloc: alloc}
	store, err := endpoint.NewStore(filepath.Join(flags["state-dir"], "endpoints"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.mgr = a.endpoints.NewManager(store, nil)
	r.mgr.SetRetry(retry)
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.endpoints.RegenerateRestored(ctx); err != nil {
		t.Fatal(err)
	}
	// The hive is not started: the test runs the regeneration jobs.
	workersDone, policyDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(workersDone)
		_ = a.endpoints.RunWorkers(ctx, nil)
	}()
	go func() {
		defer close(policyDone)
		a.policy.Run(ctx, a.realizer.RefreshPolicy)
	}()
	t.Cleanup(func() {
		cancel()
		<-policyDone
		<-workersDone
	})
	return r
}

// addPod creates an endpoint for a pod, synchronously built.
func (r *regenAgent) addPod(t testing.TB, i int, labels ...string) *endpoint.Endpoint {
	t.Helper()
	ep, err := r.mgr.Create(context.Background(), &endpoint.Endpoint{
		ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0", HostIfName: fmt.Sprintf("tdr%d", i), HostIfIndex: 1000 + i,
		IPv4: netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}), PodNamespace: "default", PodName: fmt.Sprintf("pod-%d", i),
		Labels: endpoint.SortedLabels(labels),
	}, endpointmanager.CreateOptions{SyncBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

func (r *regenAgent) importRules(t testing.TB, doc string) uint64 {
	t.Helper()
	rules, err := api.ParseRules([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	rev, err := r.a.policy.Repository().Add(rules, "", "api", false)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func (r *regenAgent) identityOf(t testing.TB, labels ...string) identity.NumericIdentity {
	t.Helper()
	want := identity.LabelsKey(endpoint.SortedLabels(append(labels, "k8s:io.kubernetes.pod.namespace=default")))
	for _, id := range r.alloc.List() {
		if identity.LabelsKey(id.Labels) == want {
			return id.ID
		}
	}
	t.Fatalf("no identity for %v", labels)
	return 0
}

func (r *regenAgent) waitConverged(t testing.TB, id uint16, rev uint64) *endpoint.Endpoint {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ep, err := r.mgr.Lookup(fmt.Sprint(id))
		if err != nil {
			t.Fatal(err)
		}
		if ep.Converged() && ep.PolicyRevision >= rev {
			return ep
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %d did not converge to revision %d: state %s, realized %d, desired %d, error %q",
				id, rev, ep.State, ep.PolicyRevision, ep.DesiredPolicyRevision, ep.LastRegenerationError)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (r *regenAgent) waitFailures(t testing.TB, id uint16, n int) *endpoint.Endpoint {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ep, _ := r.mgr.Lookup(fmt.Sprint(id))
		if ep.Regeneration.Failures >= n {
			return ep
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %d failed %d times, want %d: %+v", id, ep.Regeneration.Failures, n, ep)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var fastRetry = endpointmanager.Retry{Base: 5 * time.Millisecond, Max: 40 * time.Millisecond, FullPass: time.Hour, Workers: 4}

const (
	tcp = 6
)

// TestLabelChangeConvergesOnceIdentityAllocationWorks: a pod's labels
// change while the identity allocator fails (the API server unreachable in
// CRD mode). The watcher's handler returns at once; the endpoint keeps
// failing, and once allocation works it gets the identity of its new
// labels and the policy that selects them, with no further event.
func TestLabelChangeConvergesOnceIdentityAllocationWorks(t *testing.T) {
	r := newRegenAgent(t, fastRetry)
	rev := r.importRules(t, `[{"endpointSelector":{"matchLabels":{"app":"db"}},
		"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"web"}}],"toPorts":[{"ports":[{"port":"5432","protocol":"TCP"}]}]}]}]`)
	web := r.addPod(t, 1, "k8s:app=web")
	pod := r.addPod(t, 2, "k8s:app=cache")
	webID := r.identityOf(t, "k8s:app=web")
	if r.kernel.allows(pod.ID, policy.Ingress, webID, tcp, 5432) {
		t.Fatal("the cache pod allows the db port before it is a db")
	}

	r.alloc.setFailing(true)
	// The handler must return while allocation hangs: it only records the
	// labels. (The deadline only ends a handler that never returns.)
	release := r.alloc.hold()
	relabeled := make(chan struct{})
	go func() {
		r.a.endpoints.Relabel("default", "pod-2", []string{"k8s:app=db", "k8s:io.kubernetes.pod.namespace=default"})
		close(relabeled)
	}()
	select {
	case <-relabeled:
	case <-time.After(30 * time.Second):
		t.Fatal("the pod handler waits for identity allocation: it must only record the labels")
	}
	release()
	failed := r.waitFailures(t, pod.ID, 3)
	if !strings.Contains(failed.LastRegenerationError, "allocate identity") || failed.State == endpoint.StateReady {
		t.Fatalf("while allocation fails: state %s, error %q", failed.State, failed.LastRegenerationError)
	}
	if c := r.mgr.Convergence(); c.Failing != 1 {
		t.Fatalf("convergence while failing: %+v", c)
	}

	r.alloc.setFailing(false)
	got := r.waitConverged(t, pod.ID, rev)
	if want := r.identityOf(t, "k8s:app=db"); identity.NumericIdentity(got.Identity) != want {
		t.Fatalf("identity %d, want %d (app=db)", got.Identity, want)
	}
	if !r.kernel.allows(pod.ID, policy.Ingress, webID, tcp, 5432) {
		t.Fatal("the new db does not allow web on 5432")
	}
	if r.kernel.allows(web.ID, policy.Ingress, webID, tcp, 5432) {
		t.Fatal("web allows itself on the db port")
	}
}

// TestPolicyChangeReachesEndpointThatWasNotReady: policy map writes fail
// while a first rule is imported (the endpoint's refresh fails, it is
// not ready) and a second rule comes while it is not ready. Once writes
// work the endpoint realizes the latest revision, both rules in its map,
// with no further event.
func TestPolicyChangeReachesEndpointThatWasNotReady(t *testing.T) {
	r := newRegenAgent(t, fastRetry)
	web := r.addPod(t, 1, "k8s:app=web")
	db := r.addPod(t, 2, "k8s:app=db")
	webID := r.identityOf(t, "k8s:app=web")

	r.kernel.setFailing(true)
	r.importRules(t, `[{"endpointSelector":{"matchLabels":{"app":"db"}},
		"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"web"}}],"toPorts":[{"ports":[{"port":"5432","protocol":"TCP"}]}]}]}]`)
	notReady := r.waitFailures(t, db.ID, 2)
	if notReady.State == endpoint.StateReady {
		t.Fatalf("db is ready although its policy write failed: %+v", notReady)
	}
	rev := r.importRules(t, `[{"endpointSelector":{"matchLabels":{"app":"db"}},
		"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"web"}}],"toPorts":[{"ports":[{"port":"9187","protocol":"TCP"}]}]}]}]`)
	// The pass announcing rev runs asynchronously: wait for the desired
	// revision to reach the endpoint while it still fails.
	deadline := time.Now().Add(5 * time.Second)
	for {
		cur, _ := r.mgr.Lookup(fmt.Sprint(db.ID))
		if cur.DesiredPolicyRevision == rev {
			if cur.PolicyRevision >= rev {
				t.Fatalf("db realized revision %d while its writes fail", cur.PolicyRevision)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("desired revision %d never announced: %+v", rev, cur)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if line := agentendpoints.ConvergenceLine(r.mgr.Convergence()); !strings.Contains(line, "not yet realized") {
		t.Fatalf("status line %q does not count the endpoint not realized", line)
	}

	r.kernel.setFailing(false)
	got := r.waitConverged(t, db.ID, rev)
	if got.PolicyRevision != rev {
		t.Fatalf("realized %d, want %d", got.PolicyRevision, rev)
	}
	for _, port := range []uint16{5432, 9187} {
		if !r.kernel.allows(db.ID, policy.Ingress, webID, tcp, port) {
			t.Errorf("db does not allow web on %d", port)
		}
	}
	if !got.EnforceIngress {
		t.Fatal("db's ingress is not enforced")
	}
	r.waitConverged(t, web.ID, rev)
	if line := agentendpoints.ConvergenceLine(r.mgr.Convergence()); line != fmt.Sprintf("revision %d: 2/2 realized", rev) {
		t.Fatalf("status line %q", line)
	}
}
