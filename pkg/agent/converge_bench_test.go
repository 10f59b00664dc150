package agent

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/endpointmanager"
	policyapi "github.com/tendril-net/tendril/pkg/policy/api"
)

// BenchmarkPolicyChangeConvergence measures the time from one policy
// change to every local endpoint realizing it, at 250, 500 and 1,000
// endpoints: the agent's policy pass, endpoint manager, identity
// allocator, selector cache, resolution and diff are real; the kernel is
// the recording fake (no BPF map syscalls). Five endpoints share an
// identity (N/5 local identities), 100 identities are other nodes' clients
// in ten roles, and ten rules give every endpoint 20 entries (ingress from
// one role on a port, egress to another). Each iteration adds, then
// removes, a rule opening one more port to a tenth of the endpoints.
// Linear growth shows as a flat ns/endpoint.
func BenchmarkPolicyChangeConvergence(b *testing.B) {
	for _, n := range []int{250, 500, 1000} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			r := newRegenAgent(b, endpointmanager.DefaultRetry())
			for j := 0; j < 100; j++ {
				if _, _, err := r.alloc.Allocate([]string{fmt.Sprintf("k8s:client=c%d", j), "k8s:io.kubernetes.pod.namespace=default", fmt.Sprintf("k8s:role=r%d", j%10)}); err != nil {
					b.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			sem := make(chan struct{}, 16)
			for i := 0; i < n; i++ {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					r.addPod(b, i, fmt.Sprintf("k8s:app=svc%d", i/5), fmt.Sprintf("k8s:tier=t%d", (i/5)%10))
				}()
			}
			wg.Wait()
			doc := "["
			for k := 0; k < 10; k++ {
				if k > 0 {
					doc += ","
				}
				doc += fmt.Sprintf(`{"endpointSelector":{"matchLabels":{"tier":"t%d"}},
					"ingress":[{"fromEndpoints":[{"matchLabels":{"role":"r%d"}}],"toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}]}]}],
					"egress":[{"toEndpoints":[{"matchLabels":{"role":"r%d"}}],"toPorts":[{"ports":[{"port":"53","protocol":"UDP"}]}]}]}`, k, k, (k+1)%10)
			}
			rev := r.importRules(b, doc+"]")
			r.waitAll(b, n, rev)
			if got := r.kernel.policyEntries(); got != 20*n {
				b.Fatalf("%d policy entries, want %d", got, 20*n)
			}
			toggle := `[{"endpointSelector":{"matchLabels":{"tier":"t0"}},"labels":["bench=toggle"],
				"ingress":[{"fromEndpoints":[{"matchLabels":{"role":"r5"}}],"toPorts":[{"ports":[{"port":"9090","protocol":"TCP"}]}]}]}]`
			toggleLabels, err := policyapi.ParseSelectLabels([]string{"bench=toggle"})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			begin := time.Now()
			for i := 0; i < b.N; i++ {
				if i%2 == 0 {
					rev = r.importRules(b, toggle)
				} else {
					rev, _ = r.a.policy.Repository().DeleteByLabels(toggleLabels)
				}
				r.waitAll(b, n, rev)
			}
			elapsed := time.Since(begin)
			b.StopTimer()
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N)/float64(n), "ns/endpoint")
			b.ReportMetric(float64(elapsed.Microseconds())/1000/float64(b.N), "ms/change")
		})
	}
}

// waitAll waits until all n endpoints realize revision rev.
func (r *regenAgent) waitAll(b testing.TB, n int, rev uint64) {
	deadline := time.Now().Add(time.Minute)
	for {
		c := r.mgr.Convergence()
		if c.PolicyRevision >= rev && c.Converged == n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("not converged to revision %d: %+v", rev, c)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func (k *recordingKernel) policyEntries() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.policy)
}

// BenchmarkEndpointCreate measures the agent's side of one CNI ADD without
// the kernel: the endpoint manager's create with a synchronous build,
// identity, ipcache, policy resolution and the endpoint's attachment
// written to the recording kernel (through the endpoints table and its
// reconciler where the tree has them), one new endpoint per iteration,
// ten label sets in turn (so the identities, and the policy's universe,
// stop growing after the first ten).
func BenchmarkEndpointCreate(b *testing.B) {
	r := newRegenAgent(b, endpointmanager.DefaultRetry())
	r.importRules(b, `[{"endpointSelector":{"matchLabels":{"tier":"t0"}},
		"ingress":[{"fromEndpoints":[{"matchLabels":{"tier":"t1"}}],"toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}]}]}]}]`)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.addPod(b, i, fmt.Sprintf("k8s:app=svc%d", i%10), fmt.Sprintf("k8s:tier=t%d", i%2))
	}
}
