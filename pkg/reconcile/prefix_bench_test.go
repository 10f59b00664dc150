package reconcile

import (
	"context"
	"iter"
	"net/netip"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// benchEntry is a kernel value of the ipcache's size class (an identity,
// an address, two strings).
type benchEntry struct {
	ID     uint32
	HostIP netip.Addr
	Source string
	Owner  string
}

type benchObj struct {
	Prefix   netip.Prefix
	Resolved benchEntry
}

// benchKernel counts puts; the interface call stands for the packages'
// Backend interfaces.
type benchKernel interface {
	Upsert(netip.Prefix, benchEntry) error
}

type countKernel struct{ n int }

func (k *countKernel) Upsert(netip.Prefix, benchEntry) error { k.n++; return nil }

// handOps are operations written by hand for one kernel, as each package
// had before PrefixOps: the baseline.
type handOps struct{ k benchKernel }

func (o handOps) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, obj *benchObj) error {
	return o.k.Upsert(obj.Prefix, obj.Resolved)
}

func (o handOps) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *benchObj) error {
	return nil
}

func (o handOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*benchObj, statedb.Revision]) error {
	return nil
}

// BenchmarkPrefixOpsUpdate is PrefixOps.Update's own cost, called as the
// reconciler calls it (through reconciler.Operations) over a kernel that
// does nothing, against the baseline of operations written by hand for
// that kernel. A real put (a BPF map update, a netlink route) is a
// system call of a microsecond or more.
func BenchmarkPrefixOpsUpdate(b *testing.B) {
	var k benchKernel = &countKernel{}
	obj := &benchObj{Prefix: netip.MustParsePrefix("10.0.0.1/32"), Resolved: benchEntry{ID: 300, Source: "kubernetes", Owner: "ns/pod"}}
	run := func(b *testing.B, ops reconciler.Operations[*benchObj]) {
		ctx := context.Background()
		for i := 0; i < b.N; i++ {
			if err := ops.Update(ctx, nil, 0, obj); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("by-hand", func(b *testing.B) { run(b, handOps{k}) })
	b.Run("prefixops", func(b *testing.B) {
		run(b, PrefixOps[*benchObj]{
			Prefix: func(o *benchObj) netip.Prefix { return o.Prefix },
			Kernel: PrefixKernel[*benchObj]{Put: func(p netip.Prefix, o *benchObj) error { return k.Upsert(p, o.Resolved) }},
		})
	})
}
