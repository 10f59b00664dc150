package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/lab"
)

// churnConfig is one churn run: how many pods, in waves of how many.
type churnConfig struct {
	pods, wave int
	// kv is the lab's kvstore (kvstore identity allocation): identities
	// and endpoint addresses are checked there instead of as
	// TendrilIdentity objects.
	kv *clientv3.Client
}

// ipKeyPrefix is where the agents publish their endpoints' addresses in
// the kvstore (pkg/agent: tendril/state/ip/v1/<cluster>/<ip>).
const ipKeyPrefix = kvstore.StatePrefix + "ip/v1/default/"

// churn creates and deletes cfg.pods pods, each with a label of its own
// (an identity each), in waves of cfg.wave created concurrently, while a
// frontend keeps connecting to a backend under a policy that allows only
// it and another pod keeps being denied. Each wave is checked while it
// runs (every pod Ready with a TendrilEndpoint whose identity exists)
// before it is deleted. Once the GC ran, nothing of the gone pods is left
// (no TendrilEndpoint, no identity, no kvstore key), the identities of
// the running pods were never deleted, and the policy held both ways the
// whole time.
func churn(t *testing.T, labName string, e *env, cfg churnConfig) {
	const ns = "churn"
	ctx := context.Background()
	e.createNamespace(t, ns)
	for app, node := range map[string]string{"frontend": "node1", "backend": "node2", "other": "node1"} {
		e.createPod(t, ns, app, node, map[string]string{"app": app})
	}
	backend := e.waitReady(t, ns, "backend")
	e.waitReady(t, ns, "frontend")
	e.waitReady(t, ns, "other")
	pol := &v1alpha1.TendrilNetworkPolicy{}
	if err := yaml.UnmarshalStrict([]byte(policyYAML), pol); err != nil {
		t.Fatal(err)
	}
	if _, err := e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := backend.Status.PodIP + ":80"
	probeIn := func(from string, timeout string) (int, string) {
		out, err := exec.Command(tendrilBin, "lab", "--name", labName, "probe", ns+"/"+from, addr, "--timeout", timeout).CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), string(out)
		}
		if err != nil {
			return -1, err.Error()
		}
		return 0, string(out)
	}
	eventually(t, "the policy denying other", func() (bool, error) { c, _ := probeIn("other", "1s"); return c == 1, nil })
	if c, out := probeIn("frontend", "1s"); c != 0 {
		t.Fatalf("frontend -> backend exit %d before the churn: %s", c, out)
	}
	keep := map[int64]bool{}
	for _, p := range []string{"frontend", "backend", "other"} {
		tep, err := e.k8.Tendril.TendrilV1alpha1().TendrilEndpoints(ns).Get(ctx, p, metav1.GetOptions{})
		if err != nil || tep.Status.Identity == nil {
			t.Fatalf("TendrilEndpoint of %s: %v %v", p, tep, err)
		}
		keep[tep.Status.Identity.ID] = true
	}

	// Traffic for the whole churn: the frontend connects again and again
	// (each connection a new policy lookup of its identity at the
	// backend), the other pod is denied again and again. The frontend's
	// timeout is generous: a probe that fails under policy never answers
	// at all, while a slow machine only makes answers late.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var allowedOK, allowedFail, deniedOK, deniedFail atomic.Int64
	var firstFailure atomic.Value
	loop := func(from string, want int, ok, bad *atomic.Int64, timeout string) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			c, out := probeIn(from, timeout)
			if c == want {
				ok.Add(1)
				continue
			}
			bad.Add(1)
			firstFailure.CompareAndSwap(nil, fmt.Sprintf("%s -> backend exit %d (want %d) at %s: %s", from, c, want, time.Now().Format(time.RFC3339Nano), strings.TrimSpace(out)))
			time.Sleep(100 * time.Millisecond)
		}
	}
	wg.Add(2)
	go loop("frontend", 0, &allowedOK, &allowedFail, "5s")
	go loop("other", 1, &deniedOK, &deniedFail, "1s")
	stopTraffic := func() {
		if stop != nil {
			close(stop)
			wg.Wait()
			stop = nil
		}
	}
	defer stopTraffic()

	gone := map[int64]bool{}
	churnStart := time.Now()
	var readyTime time.Duration
	for w := 0; w*cfg.wave < cfg.pods; w++ {
		first, last := w*cfg.wave, min((w+1)*cfg.wave, cfg.pods)
		waveLabel := "churn-wave=" + strconv.Itoa(w)
		start := time.Now()
		createPods(t, e, ns, first, last, w)
		ids := waitWave(t, e, ns, waveLabel, last-first)
		readyTime += time.Since(start)
		// Every identity of the running wave exists: the GC, passing every
		// 2 s with a 4 s grace period, left alone what is in use.
		checkIdentitiesExist(t, e, cfg, ids, "wave "+strconv.Itoa(w))
		keepIDs := map[int64]int64{}
		for id := range keep {
			keepIDs[id] = id
		}
		checkIdentitiesExist(t, e, cfg, keepIDs, "the frontend, backend and other")
		for _, id := range ids {
			gone[id] = true
		}
		zero := int64(0)
		if err := e.cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero},
			metav1.ListOptions{LabelSelector: waveLabel}); err != nil {
			t.Fatalf("delete wave %d: %v", w, err)
		}
		t.Logf("churn: wave %d: %d pods created, running with their identities in %.1fs; deleted (allowed probes %d ok / %d failed, denied %d / %d)",
			w, last-first, time.Since(start).Seconds(), allowedOK.Load(), allowedFail.Load(), deniedOK.Load(), deniedFail.Load())
	}
	for id := range keep {
		delete(gone, id)
	}
	deleted := time.Now()

	// After the grace period: nothing of a gone pod is left.
	var firstGC time.Time
	leftStart := -1
	waitFor(t, "no TendrilEndpoint, identity or kvstore key of a gone pod", 4*time.Minute, func() (bool, error) {
		teps, err := e.k8.Tendril.TendrilV1alpha1().TendrilEndpoints(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		if len(teps.Items) != 3 {
			return false, fmt.Errorf("%d TendrilEndpoints in %s, want the 3 running pods'", len(teps.Items), ns)
		}
		have, err := existingIdentities(ctx, e, cfg)
		if err != nil {
			return false, err
		}
		for id := range keep {
			if !have[id] {
				t.Fatalf("identity %d of a running pod was deleted", id)
			}
		}
		left := 0
		for id := range gone {
			if have[id] {
				left++
			}
		}
		if leftStart < 0 {
			leftStart = left
		}
		if left < leftStart && firstGC.IsZero() {
			firstGC = time.Now()
		}
		if left > 0 {
			return false, fmt.Errorf("%d identities of gone pods left", left)
		}
		if cfg.kv != nil {
			return checkKVStoreClean(ctx, e, cfg.kv)
		}
		return true, nil
	})
	gcDone := time.Now()
	stopTraffic()
	total := time.Since(churnStart)
	t.Logf("churn: %d pods (%d identities) in waves of %d: %.1fs from the first create to the last wave deleted, %.1f pods/s created to running with identities; all collected %.1fs after the last delete",
		cfg.pods, len(gone), cfg.wave, deleted.Sub(churnStart).Seconds(), float64(cfg.pods)/readyTime.Seconds(), gcDone.Sub(deleted).Seconds())
	if leftStart > 0 && !firstGC.IsZero() {
		t.Logf("churn: GC after the last wave: %d identities left at its delete, collected in %.1fs after the first went (%.0f/min)",
			leftStart, gcDone.Sub(firstGC).Seconds(), float64(leftStart-1)/gcDone.Sub(firstGC).Minutes())
	}
	t.Logf("churn: traffic during %.1fs: frontend -> backend %d allowed, %d failed; other -> backend %d denied, %d answered or broken",
		total.Seconds(), allowedOK.Load(), allowedFail.Load(), deniedOK.Load(), deniedFail.Load())
	if f := firstFailure.Load(); f != nil {
		t.Errorf("the policy did not hold during the churn: %d allowed probes failed, %d denied ones did not fail; first: %s",
			allowedFail.Load(), deniedFail.Load(), f)
	}
	if allowedOK.Load() == 0 || deniedOK.Load() == 0 {
		t.Errorf("no traffic during the churn: %d allowed, %d denied", allowedOK.Load(), deniedOK.Load())
	}
	if c, out := probeIn("frontend", "1s"); c != 0 {
		t.Errorf("frontend -> backend exit %d after the GC: %s", c, out)
	}
	if c, out := probeIn("other", "1s"); c != 1 {
		t.Errorf("other -> backend exit %d after the GC, want 1 (denied): %s", c, out)
	}
}

// createPods creates pods churn-first .. churn-(last-1) concurrently, each
// with a label of its own and the wave's label.
func createPods(t *testing.T, e *env, ns string, first, last, wave int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, last-first)
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				name := "churn-" + strconv.Itoa(i)
				pod := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
						Labels: map[string]string{"app": name, "churn-wave": strconv.Itoa(wave)}},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "lab"}}},
				}
				if _, err := e.cs.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("create %s: %w", name, err)
				}
			}
		}()
	}
	for i := first; i < last; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// waitWave waits until the wave's n pods run Ready and each has a
// TendrilEndpoint with an identity, and returns the identities by pod.
func waitWave(t *testing.T, e *env, ns, selector string, n int) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	ids := map[string]int64{}
	waitFor(t, "the wave's pods ("+selector+") running with identities", 3*time.Minute, func() (bool, error) {
		pods, err := e.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		ready := 0
		for i := range pods.Items {
			if lab.PodReady(&pods.Items[i]) {
				ready++
			}
		}
		if ready != n {
			return false, fmt.Errorf("%d/%d pods ready", ready, n)
		}
		teps, err := e.k8.Tendril.TendrilV1alpha1().TendrilEndpoints(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		byName := map[string]*v1alpha1.TendrilEndpoint{}
		for i := range teps.Items {
			byName[teps.Items[i].Name] = &teps.Items[i]
		}
		for _, p := range pods.Items {
			tep := byName[p.Name]
			if tep == nil || tep.Status.Identity == nil {
				return false, fmt.Errorf("pod %s has no TendrilEndpoint with an identity yet", p.Name)
			}
			ids[p.Name] = tep.Status.Identity.ID
		}
		return true, nil
	})
	return ids
}

// existingIdentities are the identities that exist: TendrilIdentity
// objects, or the kvstore's master keys.
func existingIdentities(ctx context.Context, e *env, cfg churnConfig) (map[int64]bool, error) {
	have := map[int64]bool{}
	if cfg.kv != nil {
		resp, err := cfg.kv.Get(ctx, kvalloc.IDPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, err
		}
		for _, kv := range resp.Kvs {
			n, err := strconv.ParseInt(strings.TrimPrefix(string(kv.Key), kvalloc.IDPrefix), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("identity key %s: %w", kv.Key, err)
			}
			have[n] = true
		}
		return have, nil
	}
	ids, err := e.k8.Tendril.TendrilV1alpha1().TendrilIdentities().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, id := range ids.Items {
		n, err := strconv.ParseInt(id.Name, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("TendrilIdentity %s: %w", id.Name, err)
		}
		have[n] = true
	}
	return have, nil
}

// checkIdentitiesExist fails the test when an identity in use is gone.
func checkIdentitiesExist[K comparable](t *testing.T, e *env, cfg churnConfig, ids map[K]int64, what string) {
	t.Helper()
	have, err := existingIdentities(context.Background(), e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for k, id := range ids {
		if !have[id] {
			missing = append(missing, fmt.Sprintf("%v: %d", k, id))
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("identities in use by %s were deleted: %v", what, missing)
	}
}

// checkKVStoreClean says whether the kvstore holds nothing of a gone pod:
// every identity master key has its labels index key and the other way
// round, and every endpoint address key is a running pod's address.
func checkKVStoreClean(ctx context.Context, e *env, kv *clientv3.Client) (bool, error) {
	count := func(prefix string) (int64, error) {
		resp, err := kv.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return resp.Count, nil
	}
	ids, err := count(kvalloc.IDPrefix)
	if err != nil {
		return false, err
	}
	index, err := count(kvalloc.LabelsPrefix)
	if err != nil {
		return false, err
	}
	if ids != index {
		return false, fmt.Errorf("%d identity master keys but %d label index keys", ids, index)
	}
	pods, err := e.cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	running := map[string]bool{}
	for _, p := range pods.Items {
		for _, ip := range p.Status.PodIPs {
			running[ip.IP] = true
		}
	}
	// The nodes' health endpoints are endpoints too (lab up turns them
	// on), published in their TendrilNodes.
	nodes, err := e.k8.Tendril.TendrilV1alpha1().TendrilNodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	for _, n := range nodes.Items {
		for _, a := range n.Spec.Addresses {
			if a.Type == v1alpha1.NodeAddressHealthIP {
				running[a.IP] = true
			}
		}
	}
	resp, err := kv.Get(ctx, ipKeyPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return false, err
	}
	var stale []string
	for _, k := range resp.Kvs {
		if ip := strings.TrimPrefix(string(k.Key), ipKeyPrefix); !running[ip] {
			stale = append(stale, ip)
		}
	}
	if len(stale) > 0 {
		return false, fmt.Errorf("%d endpoint address keys of no running pod: %v", len(stale), stale[:min(len(stale), 5)])
	}
	if len(resp.Kvs) == 0 {
		return false, errors.New("no endpoint address key at all: the agents do not publish them")
	}
	return true, nil
}

// waitFor is eventually with a deadline of its own, for waits that scale
// with the churn.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last: %v)", timeout, what, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
