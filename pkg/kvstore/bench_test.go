package kvstore

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// benchValue is the size of a typical small state value (an identity's
// labels, an ipcache entry).
func benchValue() []byte {
	v := make([]byte, 128)
	for i := range v {
		v[i] = 'a' + byte(i%26)
	}
	return v
}

// populate writes n keys under prefix in transactions of 100 puts (etcd
// allows 128 operations a transaction).
func populate(b *testing.B, c *Client, prefix string, n int) {
	b.Helper()
	ctx := testContext(b, 5*time.Minute)
	value := string(benchValue())
	for start := 0; start < n; start += 100 {
		var ops []clientv3.Op
		for i := start; i < min(start+100, n); i++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%08d", prefix, i), value))
		}
		if _, err := c.etcd.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkListAndWatchList: the initial list of 10,000 keys through
// ListAndWatch, up to the list marker, at several page sizes.
func BenchmarkListAndWatchList10000(b *testing.B) {
	const keys = 10000
	srv := newEmbeddedServerFsync(b, true)
	loader := connect(b, srv.Endpoints())
	populate(b, loader, testPrefix, keys)
	for _, limit := range []int{100, 1000, 5000} {
		b.Run("page="+strconv.Itoa(limit), func(b *testing.B) {
			c := connect(b, srv.Endpoints(), withOption(OptListLimit, strconv.Itoa(limit)))
			for b.Loop() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				n := 0
				for ev := range c.ListAndWatch(ctx, testPrefix) {
					if ev.Type == EventListDone {
						break
					}
					n++
				}
				cancel()
				if n != keys {
					b.Fatalf("listed %d keys, want %d", n, keys)
				}
			}
			b.ReportMetric(float64(keys*b.N)/b.Elapsed().Seconds(), "keys/s")
		})
	}
}

// BenchmarkListAndWatchEvents: 1,000 changes per iteration delivered to a
// running ListAndWatch, written either in transactions of 100 puts (the
// watch path is the bottleneck) or as single puts from 16 writers (the
// write path, with an fsync per raft batch, is).
func BenchmarkListAndWatchEvents(b *testing.B) {
	const perRound = 1000
	srv := newEmbeddedServerFsync(b, true)
	for _, mode := range []string{"txn100", "puts16"} {
		b.Run("writes="+mode, func(b *testing.B) {
			c := connect(b, srv.Endpoints())
			prefix := testPrefix + mode + "/"
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			events := c.ListAndWatch(ctx, prefix)
			for ev := range events {
				if ev.Type == EventListDone {
					break
				}
			}
			round := 0
			value := string(benchValue())
			for b.Loop() {
				round++
				writeErr := make(chan error, 1)
				go func() {
					writeErr <- writeRound(ctx, c, mode, fmt.Sprintf("%sr%d-", prefix, round), perRound, value)
				}()
				for range perRound {
					select {
					case <-events:
					case <-time.After(time.Minute):
						b.Fatal("events stalled")
					}
				}
				if err := <-writeErr; err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(perRound*b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

func writeRound(ctx context.Context, c *Client, mode, prefix string, n int, value string) error {
	if mode == "txn100" {
		for start := 0; start < n; start += 100 {
			var ops []clientv3.Op
			for i := start; i < min(start+100, n); i++ {
				ops = append(ops, clientv3.OpPut(prefix+strconv.Itoa(i), value))
			}
			if _, err := c.etcd.Txn(ctx).Then(ops...).Commit(); err != nil {
				return err
			}
		}
		return nil
	}
	const writers = 16
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := w; i < n; i += writers {
				if _, err := c.etcd.Put(ctx, prefix+strconv.Itoa(i), value); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// BenchmarkCreateOnly: latency of one CreateOnly (a transaction with a
// create-revision comparison) of a new key, one at a time, against the
// embedded etcd with and without fsync, and the etcd binary when built.
func BenchmarkCreateOnly(b *testing.B) {
	servers := []struct {
		name  string
		start func(testing.TB) testServer
	}{
		{"embedded", func(t testing.TB) testServer { return newEmbeddedServerFsync(t, true) }},
		{"embedded-nofsync", func(t testing.TB) testServer { return newEmbeddedServerFsync(t, false) }},
		{"binary", func(t testing.TB) testServer {
			// Its numbers are published: under CI a missing binary
			// fails, like a privileged test that cannot run.
			_, err := os.Stat(etcdBinary())
			testutil.Require(t, err == nil, "no etcd binary (hack/k8s-binaries.sh builds it)")
			return newProcessServer(t)
		}},
	}
	for _, s := range servers {
		b.Run(s.name, func(b *testing.B) {
			srv := s.start(b)
			c := connect(b, srv.Endpoints())
			ctx := testContext(b, 10*time.Minute)
			value := benchValue()
			var latencies []time.Duration
			i := 0
			for b.Loop() {
				i++
				start := time.Now()
				created, err := c.CreateOnly(ctx, fmt.Sprintf("%sid/%d", testPrefix, i), value, NoLease)
				latencies = append(latencies, time.Since(start))
				if err != nil || !created {
					b.Fatalf("CreateOnly = %v, %v", created, err)
				}
			}
			slices.Sort(latencies)
			b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds()), "p99-µs")
		})
	}
}
