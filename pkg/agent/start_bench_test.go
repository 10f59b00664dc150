package agent

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// benchFlags are the standalone agent of bench/core's start without the
// datapath: no Kubernetes, no kvstore.
func benchFlags(b *testing.B) map[string]string {
	b.Setenv("KUBERNETES_SERVICE_HOST", "")
	dir := b.TempDir()
	return map[string]string{"state-dir": filepath.Join(dir, "state"), "socket": filepath.Join(dir, "tendril.sock"),
		"node-name": "bench-node", "enable-datapath": "false", "prometheus-serve-addr": ""}
}

// BenchmarkNew is the agent's construction (the hive built and
// populated: every constructor run) before its start, as bench/core's
// start without the datapath runs it. Allocations and CPU profiles show
// where the construction goes; no wall-clock assertion.
func BenchmarkNew(b *testing.B) {
	flags := benchFlags(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := newTestAgent(Deps{}, flags); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewStartStop builds, starts (serving the API socket) and stops
// the agent without the datapath.
func BenchmarkNewStartStop(b *testing.B) {
	flags := benchFlags(b)
	b.ReportAllocs()
	for b.Loop() {
		a, err := newTestAgent(Deps{}, flags)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := a.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
}
