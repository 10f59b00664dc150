package loadbalancer

import "testing"

// TestTopologyMode: kube-proxy's rules for choosing which hints narrow
// the backends (pkg/proxy/topology.go, v1.36).
func TestTopologyMode(t *testing.T) {
	z := func(zones ...string) Hints { return Hints{ForZones: zones} }
	nz := func(node string, zones ...string) Hints { return Hints{ForNodes: []string{node}, ForZones: zones} }
	for _, c := range []struct {
		what       string
		ready      []Hints
		node, zone string
		want       string
	}{
		{"no backends", nil, "n1", "z1", TopologyNone},
		{"no hints", []Hints{{}, {}}, "n1", "z1", TopologyNone},
		{"zone hints, one for this zone", []Hints{z("z1"), z("z2")}, "n1", "z1", TopologyPreferSameZone},
		{"zone hints, one of several zones", []Hints{z("z2", "z1"), z("z2")}, "n1", "z1", TopologyPreferSameZone},
		{"zone hints, none for this zone", []Hints{z("z2"), z("z3")}, "n1", "z1", TopologyNone},
		{"zone hints, one backend without", []Hints{z("z1"), {}}, "n1", "z1", TopologyNone},
		{"zone hints, node without a zone", []Hints{z("z1"), z("z2")}, "n1", "", TopologyNone},
		{"node hints win over zone hints", []Hints{nz("n1", "z1"), nz("n2", "z1")}, "n1", "z1", TopologyPreferSameNode},
		{"node hints without a zone", []Hints{nz("n1"), nz("n2")}, "n1", "", TopologyPreferSameNode},
		{"node hints, none for this node: zone hints", []Hints{nz("n2", "z1"), nz("n3", "z2")}, "n1", "z1", TopologyPreferSameZone},
		{"node hints, none for this node, no zone hints", []Hints{nz("n2"), nz("n3")}, "n1", "z1", TopologyNone},
		{"node hints, one backend without: zone hints", []Hints{nz("n1", "z1"), z("z2")}, "n1", "z1", TopologyPreferSameZone},
		{"node hints, one backend without any", []Hints{nz("n1", "z1"), {}}, "n1", "z1", TopologyNone},
		{"node unnamed", []Hints{nz("n1"), nz("n2")}, "", "", TopologyNone},
	} {
		if got := TopologyMode(c.ready, c.node, c.zone); got != c.want {
			t.Errorf("%s: mode %q, want %q", c.what, got, c.want)
		}
	}
	h := nz("n1", "z1", "z2")
	for _, c := range []struct {
		mode, node, zone string
		want             bool
	}{
		{TopologyNone, "x", "y", true},
		{TopologyPreferSameNode, "n1", "", true},
		{TopologyPreferSameNode, "n2", "z1", false},
		{TopologyPreferSameZone, "n2", "z2", true},
		{TopologyPreferSameZone, "n1", "z3", false},
		{"Bogus", "n1", "z1", false},
	} {
		if got := h.For(c.mode, c.node, c.zone); got != c.want {
			t.Errorf("For(%q, %q, %q) = %v, want %v", c.mode, c.node, c.zone, got, c.want)
		}
	}
}
