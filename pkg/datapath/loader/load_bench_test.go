package loader

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// BenchmarkPrivilegedLoadPrograms: loading the pod object, its programs
// one after the other in one thread (one LoadAndAssign, as before) against
// loadObjects (each program in a goroutine of its own), in the same run.
// The time is the kernel's verifier; the instructions it verified per
// program are reported too.
func BenchmarkPrivilegedLoadPrograms(b *testing.B) {
	testutil.Privileged(b)
	for _, c := range []struct {
		name string
		load func(*ebpf.CollectionSpec, *ebpf.CollectionOptions, *bpf.LxcObjects) error
	}{
		{"sequential", func(s *ebpf.CollectionSpec, o *ebpf.CollectionOptions, objs *bpf.LxcObjects) error {
			return s.LoadAndAssign(objs, o)
		}},
		{"parallel", loadObjects},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				root, err := os.MkdirTemp("/sys/fs/bpf", "tendril-loadbench")
				if err != nil {
					b.Fatal(err)
				}
				spec, err := bpf.LoadLxc()
				if err != nil {
					b.Fatal(err)
				}
				var objs bpf.LxcObjects
				if err := c.load(spec, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: root}}, &objs); err != nil {
					b.Fatal(err)
				}
				// What the verifier walked: it grows with the programs
				// and is most of their load time.
				for name, p := range map[string]*ebpf.Program{"from_pod": objs.FromPod, "to_pod": objs.ToPod} {
					if info, err := p.Info(); err == nil {
						if n, ok := info.VerifiedInstructions(); ok {
							b.ReportMetric(float64(n), name+"-verified-insns")
						}
					}
				}
				objs.Close()
				os.RemoveAll(root)
			}
		})
	}
}

// TestPrivilegedVerifierBudget loads the pod programs as the agent does by
// default (trace events per connection, policy verdict events) and holds
// the instructions the kernel's verifier walks in each to what it walked
// at e3050e0, the agent before issue 13 (69,966 for from_pod, 14,394 for
// to_pod, the same kernel): the verifier is most of the agent's start, and
// the programs' growth had made that start 2-3.8x slower. The count is
// the kernel's, deterministic for a given program and kernel; an inlined
// step that multiplies the verifier's states (see docs/benchmarks.md,
// Core, and hack/verifierstats -profile) fails this.
func TestPrivilegedVerifierBudget(t *testing.T) {
	n := newNodeWith(t, Config{DirectDelivery: true, PolicyVerdictEvents: true, TraceEvents: TracePerConnection})
	from, to := n.l.Programs()
	for _, c := range []struct {
		name   string
		p      *ebpf.Program
		budget uint32
	}{
		{"from_pod", from, 69966},
		{"to_pod", to, 14394},
	} {
		info, err := c.p.Info()
		if err != nil {
			t.Fatal(err)
		}
		got, ok := info.VerifiedInstructions()
		if !ok {
			t.Fatalf("%s: the kernel does not report verified instructions", c.name)
		}
		t.Logf("%s: %d verified instructions (budget %d)", c.name, got, c.budget)
		if got > c.budget {
			t.Errorf("%s: the verifier walked %d instructions, over the %d of e3050e0: find the states that do not prune with go run ./hack/verifierstats -profile 40", c.name, got, c.budget)
		}
	}
}
