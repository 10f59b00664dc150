package lab

import "testing"

// TestNodeAddressing: flat puts every node in 172.30.0.0/24 behind the
// world's one gateway; routed puts node N alone in 172.30.N.0/24, its
// gateway the world's address there; an unknown topology is refused.
func TestNodeAddressing(t *testing.T) {
	for _, tc := range []struct {
		topology string
		i        int
		addr, gw string
	}{
		{"", 1, "172.30.0.11", WorldGateway},
		{TopologyFlat, 2, "172.30.0.12", WorldGateway},
		{TopologyRouted, 1, "172.30.1.11", "172.30.1.1"},
		{TopologyRouted, 200, "172.30.200.11", "172.30.200.1"},
	} {
		addr, gw := nodeAddressing(tc.topology, tc.i)
		if addr != tc.addr || gw != tc.gw {
			t.Errorf("%q node %d: %s via %s, want %s via %s", tc.topology, tc.i, addr, gw, tc.addr, tc.gw)
		}
		if err := ValidateTopology(tc.topology); err != nil {
			t.Errorf("%q refused: %v", tc.topology, err)
		}
	}
	if err := ValidateTopology("mesh"); err == nil {
		t.Error("topology mesh accepted")
	}
	if gw := (Node{}).gateway(); gw != WorldGateway {
		t.Errorf("a node of an older lab.json: gateway %s, want %s", gw, WorldGateway)
	}
}
