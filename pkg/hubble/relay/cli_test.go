package relay

import (
	"bufio"
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/encoding/protojson"

	observerpb "github.com/cilium/cilium/api/v1/observer"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	"github.com/tendril-net/tendril/pkg/hubble/relay/pool"
	"github.com/tendril-net/tendril/pkg/observer"
)

// TestPrivilegedRelayStockHubbleCLI drives the stock hubble CLI against
// the relay of two nodes whose flows are decoded from the real datapath's
// events (both nodes saw the scenario's packets): status and nodes of the
// cluster, the merged history in time order, the filters, follow, and a
// node that goes away (status names it, the other node's flows still come)
// and comes back (its flows resume in the running follow).
func TestPrivilegedRelayStockHubbleCLI(t *testing.T) {
	bin := hubbletest.HubbleCLI(t)
	evs := hubbletest.DatapathEvents(t, hubbletest.Scenario())
	if len(evs) < 6 {
		t.Fatalf("only %d events from the datapath", len(evs))
	}
	held := evs[len(evs)-1] // the UDP reply: web's, for --follow
	// again is held seen again now: a later packet of the flow, as the
	// datapath would report it (a repeat of the same event would carry
	// the same time, which a resumed follow rightly skips).
	again := func() loader.Event {
		_, mono := observer.SystemClock()
		ev := held
		ev.Monotonic = mono
		return ev
	}
	a, b, _ := twoNodes(t, nil)
	for _, n := range []*testNode{a, b} {
		for _, ev := range evs[:len(evs)-1] {
			if err := n.obs.Observe(ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	stored := 2 * (len(evs) - 1)
	_, p, sock := startRelayAt(t, "unix://"+a.sock, pool.Config{})
	waitConnected(t, p, "node-a", "node-b")
	relaySock := "unix://" + sock
	hubble := func(args ...string) string { return hubbletest.RunCLI(t, bin, relaySock, args...) }

	t.Run("status", func(t *testing.T) {
		out := hubble("status")
		if !strings.Contains(out, ": Ok") || !strings.Contains(out, "Connected Nodes: 2/2") || !strings.Contains(out, "/8,190") {
			t.Fatalf("status:\n%s", out)
		}
	})
	t.Run("list nodes", func(t *testing.T) {
		out := hubble("list", "nodes")
		for _, n := range []string{"node-a", "node-b"} {
			if !strings.Contains(out, n) {
				t.Fatalf("list nodes lacks %s:\n%s", n, out)
			}
		}
		if strings.Count(out, "Connected") != 2 {
			t.Fatalf("list nodes:\n%s", out)
		}
	})
	t.Run("observe last 100, merged in time order", func(t *testing.T) {
		rs := hubbletest.JSONResponses(t, hubble("observe", "--last", "100", "-o", "json"))
		if len(rs) != stored {
			t.Fatalf("%d flows, want %d", len(rs), stored)
		}
		from := map[string]int{}
		for i, r := range rs {
			from[r.GetFlow().GetNodeName()]++
			if i > 0 && r.GetFlow().GetTime().AsTime().Before(rs[i-1].GetFlow().GetTime().AsTime()) {
				t.Fatalf("flow %d is older than flow %d", i, i-1)
			}
		}
		if from["node-a"] != stored/2 || from["node-b"] != stored/2 {
			t.Fatalf("flows by node %v", from)
		}
		if got := hubbletest.JSONFlows(t, hubble("observe", "--last", "3", "-o", "json")); len(got) != 3 {
			t.Fatalf("--last 3: %d flows", len(got))
		}
	})
	cases := []struct {
		name  string
		args  []string
		check func(*flowpb.Flow) bool
	}{
		{"pod", []string{"--pod", "data/db-0"}, func(f *flowpb.Flow) bool {
			return f.GetSource().GetPodName() == "db-0" || f.GetDestination().GetPodName() == "db-0"
		}},
		{"namespace", []string{"--namespace", "shop"}, func(f *flowpb.Flow) bool {
			return f.GetSource().GetNamespace() == "shop" || f.GetDestination().GetNamespace() == "shop"
		}},
		{"verdict dropped", []string{"--verdict", "DROPPED"}, func(f *flowpb.Flow) bool { return f.GetVerdict() == flowpb.Verdict_DROPPED }},
		{"label", []string{"--label", "app=db"}, func(f *flowpb.Flow) bool {
			return slices.Contains(f.GetSource().GetLabels(), "k8s:app=db") || slices.Contains(f.GetDestination().GetLabels(), "k8s:app=db")
		}},
		{"port", []string{"--port", "22"}, func(f *flowpb.Flow) bool {
			return f.GetL4().GetTCP().GetDestinationPort() == 22 || f.GetL4().GetTCP().GetSourcePort() == 22
		}},
		{"protocol", []string{"--protocol", "udp"}, func(f *flowpb.Flow) bool { return f.GetL4().GetUDP() != nil }},
		{"node", []string{"--node-name", "node-b"}, func(f *flowpb.Flow) bool { return f.GetNodeName() == "node-b" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			flows := hubbletest.JSONFlows(t, hubble(append([]string{"observe", "--last", "100", "-o", "json"}, c.args...)...))
			nodes := map[string]bool{}
			for _, f := range flows {
				if !c.check(f) {
					t.Errorf("flow does not match %v: %v", c.args, f)
				}
				nodes[f.GetNodeName()] = true
			}
			if len(flows) == 0 || len(flows) == stored {
				t.Fatalf("filter %v selected %d of %d flows", c.args, len(flows), stored)
			}
			if c.name != "node" && len(nodes) != 2 {
				t.Errorf("filter %v: flows of %v only", c.args, nodes)
			}
		})
	}

	// A follow query of web's UDP flows runs across node-b going away and
	// coming back.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "observe", "--follow", "-o", "json", "--protocol", "udp", "--pod", "shop/web", "--server", relaySock)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	lines := make(chan *observerpb.GetFlowsResponse, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var r observerpb.GetFlowsResponse
			if protojson.Unmarshal(sc.Bytes(), &r) == nil && r.GetFlow() != nil {
				lines <- &r
			}
		}
		close(lines)
	}()
	followed := func(node string) {
		t.Helper()
		select {
		case r := <-lines:
			if r.GetNodeName() != node || r.GetFlow().GetL4().GetUDP() == nil || r.GetFlow().GetSource().GetPodName() == "" && r.GetFlow().GetDestination().GetPodName() == "" {
				t.Fatalf("followed %v, want a UDP flow of web from %s", r, node)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("no flow of %s followed", node)
		}
	}
	waitFollowers(t, a, b)
	if err := b.obs.Observe(again()); err != nil {
		t.Fatal(err)
	}
	followed("node-b")

	b.srv.Stop()
	waitConnected(t, p, "node-a")
	out := hubble("status")
	if !strings.Contains(out, "Connected Nodes: 1/2") || !strings.Contains(out, "Unavailable Nodes: 1\n  - node-b") {
		t.Fatalf("status with node-b away:\n%s", out)
	}
	if out := hubble("list", "nodes"); !strings.Contains(out, "Unavailable") || strings.Count(out, "Connected") != 1 {
		t.Fatalf("list nodes with node-b away:\n%s", out)
	}
	if err := a.obs.Observe(again()); err != nil {
		t.Fatal(err)
	}
	followed("node-a")
	if flows := hubbletest.JSONFlows(t, hubble("observe", "--last", "100", "-o", "json")); len(flows) != stored/2+1 {
		t.Fatalf("with node-b away: %d flows, want node-a's %d", len(flows), stored/2+1)
	}

	// node-b sees the packet again while away, then comes back.
	if err := b.obs.Observe(again()); err != nil {
		t.Fatal(err)
	}
	b.start(t)
	waitConnected(t, p, "node-a", "node-b")
	followed("node-b")
	if out := hubble("status"); !strings.Contains(out, "Connected Nodes: 2/2") {
		t.Fatalf("status with node-b back:\n%s", out)
	}
}
