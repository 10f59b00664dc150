package agent

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// benchConfig is the standalone agent of bench/core's start without the
// datapath: no Kubernetes, no kvstore.
func benchConfig(b *testing.B) Config {
	b.Setenv("KUBERNETES_SERVICE_HOST", "")
	dir := b.TempDir()
	cfg := DefaultConfig()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.API.Socket = filepath.Join(dir, "tendril.sock")
	cfg.NodeName = "bench-node"
	cfg.Datapath.Enable = false
	cfg.Metrics.ServeAddr = ""
	return cfg
}

// BenchmarkNew is the agent's construction (the hive built and
// populated: every constructor run) before its start, as bench/core's
// start without the datapath runs it. Allocations and CPU profiles show
// where the construction goes; no wall-clock assertion.
func BenchmarkNew(b *testing.B) {
	cfg := benchConfig(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := New(cfg, Deps{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewStartStop builds, starts (serving the API socket) and stops
// the agent without the datapath.
func BenchmarkNewStartStop(b *testing.B) {
	cfg := benchConfig(b)
	b.ReportAllocs()
	for b.Loop() {
		a, err := New(cfg, Deps{})
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
