package ui

import (
	"slices"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tendril-net/tendril/pkg/hubble"
)

// TestReadRelayResumesWithoutLoss: the relay merges its nodes' flows in
// arrival order, so after the UI's connection breaks, the flows it has not
// read yet include some with the time of the last one it read (another
// node's) and some older (a node whose flows came later). Reconnecting, the
// UI gets each of them once; it used to ask only for flows after the last
// time read, losing both.
func TestReadRelayResumesWithoutLoss(t *testing.T) {
	demo := newDemoServer(t)
	s := readRelay(t, "unix://"+demo.socket, nil)
	t0 := time.Now().Add(-time.Minute)
	write := func(uuid, node string, at time.Time) {
		demo.obs.Ring().Write(&flowpb.Flow{Uuid: uuid, NodeName: node, Time: timestamppb.New(at), Verdict: flowpb.Verdict_FORWARDED,
			Source: &flowpb.Endpoint{Namespace: "demo", PodName: "frontend"}, Destination: &flowpb.Endpoint{Namespace: "demo", PodName: "backend"}})
	}
	write("a", "node1", t0)
	eventually(t, "the first flow in the UI", func() bool { return s.Store().Len() == 1 })

	// The connection breaks; meanwhile the relay gets a flow of node2 at
	// the same time as a, an older one of node3, and a newer one.
	demo.srv.Stop()
	eventually(t, "the UI to notice", func() bool { c, _ := s.state(); return !c })
	write("b", "node2", t0)
	write("c", "node3", t0.Add(-time.Second))
	write("d", "node1", t0.Add(time.Second))
	demo.srv = hubble.New(hubble.Config{SocketPath: demo.socket, Version: "test"}, demo.obs, nil)
	if err := demo.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(demo.srv.Stop)
	eventually(t, "the UI reconnected with the newer flow", func() bool {
		fs := s.Store().Flows(nil)
		return len(fs) > 0 && fs[len(fs)-1].GetUuid() == "d"
	})
	var got []string
	for _, f := range s.Store().Flows(nil) {
		got = append(got, f.GetUuid())
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Fatalf("flows read across the reconnection: %v, want a, b, c and d once each", got)
	}
}

// TestReadSetWindow: a flow is recognised again within the window of the
// newest read, and forgotten (memory stays bounded) once out of it.
func TestReadSetWindow(t *testing.T) {
	r := newReadSet(5 * time.Second)
	t0 := time.Unix(1_000_000, 0)
	at := func(uuid string, d time.Duration) *flowpb.Flow {
		return &flowpb.Flow{Uuid: uuid, Time: timestamppb.New(t0.Add(d))}
	}
	for _, step := range []struct {
		f     *flowpb.Flow
		first bool
	}{
		{at("a", 0), true},
		{at("a", 0), false},
		{at("b", 4*time.Second), true},
		{at("a", 0), false}, // within 5 s of b
		{at("c", 11*time.Second), true},
		{at("d", 12*time.Second), true},
	} {
		if got := r.first(step.f); got != step.first {
			t.Fatalf("flow %s at %s: first %v, want %v", step.f.GetUuid(), step.f.GetTime().AsTime().Sub(t0), got, step.first)
		}
	}
	if _, kept := r.recent["a"]; kept || len(r.recent) != 2 {
		t.Fatalf("remembered %v, want c and d only", r.recent)
	}
}
