package connectivity

import (
	"testing"

	"github.com/tendril-net/tendril/pkg/lab"
)

// TestLabConfigSharedL2 checks that only the routed topology leaves out
// the L2 announcement check: its world reaches each node through a subnet
// of the node's own.
func TestLabConfigSharedL2(t *testing.T) {
	for _, tc := range []struct {
		topology string
		want     bool
	}{{"", false}, {lab.TopologyFlat, false}, {lab.TopologyRouted, true}} {
		st := &lab.State{Name: "t", Topology: tc.topology, Nodes: []lab.Node{{Name: "node1", Address: "172.30.1.11"}, {Name: "node2", Address: "172.30.2.11"}}}
		cfg, err := LabConfig(st, DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		if cfg.NoSharedL2 != tc.want {
			t.Errorf("topology %q: NoSharedL2 %v, want %v", tc.topology, cfg.NoSharedL2, tc.want)
		}
	}
	if _, err := LabConfig(&lab.State{Name: "one", Nodes: []lab.Node{{Name: "node1"}}}, DefaultConfig()); err == nil {
		t.Error("a one-node lab gave a config, want an error")
	}
}
