package l7redirect

import (
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// redirectNode is the redirect tests' node: a node namespace named after
// prefix that the test's thread enters, pods named names at the node's
// addresses 0, 1, ..., and a started loader with direct delivery pinning
// under a bpffs directory of its own (returned as root), all undone when
// the test ends.
func redirectNode(t testing.TB, prefix string, names ...string) (*netlab.Node, *loader.Loader, string, []*netlab.Pod) {
	t.Helper()
	node, root := netlab.EnterNode(t, prefix, prefix+"-test")
	var pods []*netlab.Pod
	for i, name := range names {
		p, err := node.AddPod(name, i)
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	l := loader.New(loader.Config{BPFRoot: root, DirectDelivery: true}, nil)
	t.Cleanup(func() { _ = l.Close() })
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	return node, l, root, pods
}

// startRedirect starts the proxies of cfg; closeProxies closes them (the
// agent going down), else they close when the test ends.
func startRedirect(t *testing.T, cfg Config) (r *Redirect, closeProxies func() error) {
	t.Helper()
	r, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = r.Close()
		}
	})
	return r, func() error {
		closed = true
		return r.Close()
	}
}
