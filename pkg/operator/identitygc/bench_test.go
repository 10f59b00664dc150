package identitygc

import (
	"context"
	"fmt"
	"github.com/tendril-net/tendril/pkg/operator/operatortest"
	"strconv"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/operator/resources"
)

// BenchmarkIdentityGC measures identities collected per minute in CRD
// mode: with the default rate limit (2,500/min) and, as the baseline in
// the same run, unlimited (what the API server sustains here). Each
// iteration collects n identities marked unused an hour ago.
func BenchmarkIdentityGC(b *testing.B) {
	e := env.Need(b)
	rc := e.RESTConfig()
	rc.QPS, rc.Burst = 2000, 2000
	c, err := k8s.NewClientsForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	const n = 300
	for _, bc := range []struct {
		name  string
		limit int
	}{{"unlimited", 1_000_000_000}, {"limit=2500/min", 2500}} {
		b.Run(bc.name, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				createMarked(b, c, n, 100000+i*n)
				res, stop, err := resources.Start(context.Background(), c, time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				cfg := testConfig("crd", time.Minute)
				cfg.IdentityGCRateLimit = bc.limit
				gc := New(cfg, operatortest.Quiet(), c, res, nil)
				b.StartTimer()
				start := time.Now()
				r, err := gc.Pass(context.Background())
				total += time.Since(start)
				b.StopTimer()
				stop()
				if err != nil || r.Deleted != n {
					b.Fatalf("pass: %s %v", r, err)
				}
			}
			b.ReportMetric(float64(n*b.N)/total.Minutes(), "identities/min")
		})
	}
}

// createMarked creates n identities (numbers from first) marked unused
// two hours ago.
func createMarked(b *testing.B, c *k8s.Clients, n, first int) {
	mark := time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				id := &v1alpha1.TendrilIdentity{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(first + i),
					Annotations: map[string]string{crdalloc.AnnotationUnusedSince: mark}},
					SecurityLabels: map[string]string{"k8s:app": fmt.Sprintf("bench-%d", first+i)}}
				if _, err := c.Tendril.TendrilV1alpha1().TendrilIdentities().Create(context.Background(), id, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
