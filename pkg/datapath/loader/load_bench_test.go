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
