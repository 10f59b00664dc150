package ui

import (
	"slices"
	"testing"
	"time"
)

func edgeOf(m *Map, src, dst, verdict string) *Edge {
	for _, e := range m.Edges {
		if e.Source == src && e.Target == dst && e.Verdict == verdict {
			return e
		}
	}
	return nil
}

func TestBuildMapDemo(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	flows := demoFlows(t, base, 11) // 10 s of traffic
	m := BuildMap(flows, "demo")

	fb := edgeOf(m, "demo/frontend", "demo/backend", "FORWARDED")
	if fb == nil {
		t.Fatalf("no frontend → backend edge in %+v", m.Edges)
	}
	// Three flows a round (trace out, verdict, trace in); the reply is the
	// same connection's and is not counted.
	if fb.Protocol != "TCP" || fb.Port != 80 || fb.Flows != 33 || fb.Service != "demo/backend" {
		t.Errorf("frontend → backend: %+v", fb)
	}
	if fb.Rate != 3.3 || m.Window != 10 {
		t.Errorf("rate %v over %v s, want 3.3 over 10", fb.Rate, m.Window)
	}
	if !slices.Equal(fb.Policies, []string{"demo/allow-frontend"}) {
		t.Errorf("frontend → backend policies %v", fb.Policies)
	}
	if edgeOf(m, "demo/backend", "demo/frontend", "FORWARDED") != nil {
		t.Error("the reply made an edge backend → frontend")
	}
	for _, src := range []string{"demo/other", "demo/far"} {
		d := edgeOf(m, src, "demo/backend", "DROPPED")
		if d == nil {
			t.Fatalf("no dropped %s → backend edge in %+v", src, m.Edges)
		}
		if !slices.Equal(d.Policies, []string{"demo/allow-frontend"}) || !slices.Equal(d.DropReasons, []string{"POLICY_DENIED"}) || d.Flows != 11 {
			t.Errorf("%s → backend: %+v", src, d)
		}
	}
	// other's own trace out is forwarded from its side: an edge of its own.
	if e := edgeOf(m, "demo/other", "demo/backend", "FORWARDED"); e == nil || len(e.Policies) != 0 {
		t.Errorf("other → backend forwarded (its egress trace): %+v", e)
	}
	if e := edgeOf(m, "demo/other", "demo/frontend", "AUDIT"); e == nil || !slices.Equal(e.Policies, []string{"demo/lockdown"}) || e.Port != 8080 {
		t.Errorf("the audit verdict: %+v", e)
	}
	if e := edgeOf(m, "demo/frontend", "world", "FORWARDED"); e == nil || e.Port != 443 {
		t.Errorf("frontend → world: %+v", e)
	}
	if e := edgeOf(m, "host", "demo/frontend", "FORWARDED"); e == nil {
		t.Errorf("no host → frontend edge in %+v", m.Edges)
	}
	if e := edgeOf(m, "svc:demo/backend", "demo/backend", verdictService); e == nil {
		t.Errorf("the Service is not linked to its backend: %+v", m.Edges)
	}
	var kinds []string
	for _, n := range m.Nodes {
		kinds = append(kinds, n.ID+"="+n.Kind)
	}
	want := []string{"demo/backend=workload", "demo/far=workload", "demo/frontend=workload", "demo/other=workload", "host=host", "svc:demo/backend=service", "world=world"}
	if !slices.Equal(kinds, want) {
		t.Errorf("nodes %v, want %v", kinds, want)
	}

	if m := BuildMap(flows, "elsewhere"); len(m.Edges) != 0 || len(m.Nodes) != 0 || m.Flows != 0 {
		t.Errorf("another namespace's map: %+v", m)
	}
	if all := BuildMap(flows, ""); len(all.Edges) != len(m.Edges) {
		t.Errorf("every namespace: %d edges, demo's %d", len(all.Edges), len(m.Edges))
	}
}
