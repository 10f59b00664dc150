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
// The time is the kernel's verifier.
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
				objs.Close()
				os.RemoveAll(root)
			}
		})
	}
}
