package cni_test

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedAgentFlows: the agent turns its datapath's events into
// flows and serves them on its Hubble socket. b admits a and denies c by a
// deny rule; `tendril observe` against the agent shows c's pings DROPPED
// (policy deny, naming the rule) and a's FORWARDED (a policy verdict
// naming the allowing rule, and traces), with pod names filled in; the
// stock hubble CLI reads the same socket.
func TestPrivilegedAgentFlows(t *testing.T) {
	testutil.Privileged(t)
	// The node's netns is the test's own: fixed ports on its loopback.
	n := startNode(t, "--ipv6-range", "none", "--hubble-listen-address", "127.0.0.1:4244", "--hubble-disable-tls", "--prometheus-serve-addr", "127.0.0.1:9962")
	list := n.confList("tendril-cni", "1.1.0", nil)
	a, b, c := n.newPod("a"), n.newPod("b"), n.newPod("c")
	ra := n.mustAdd(list, a)
	rb := n.mustAdd(list, b)
	rc := n.mustAdd(list, c)
	ipA, ipB, ipC := ra.IPs[0].Address.IP.String(), rb.IPs[0].Address.IP.String(), rc.IPs[0].Address.IP.String()
	n.setLabels(t, "pod-name:default/a", "k8s:app=a")
	n.setLabels(t, "pod-name:default/b", "k8s:app=b")
	n.setLabels(t, "pod-name:default/c", "k8s:app=c")
	n.importPolicy(t, `[{"endpointSelector":{"matchLabels":{"app":"b"}},"labels":["test=flows"],
		"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"a"}}]}],
		"ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"c"}}]}]}]`)
	eventually(t, "c is denied", func() bool { return !reachable(c, ipB) })
	if err := ping(a, ipB); err != nil {
		t.Fatalf("a is denied although the policy allows it: %v", err)
	}

	sock := filepath.Join(n.dir, "hubble.sock") // beside --socket, by default
	cli, err := builder.Build("tendril")
	if err != nil {
		t.Fatal(err)
	}
	observe := func(args ...string) []*flowpb.Flow {
		t.Helper()
		cmd := exec.Command(cli, append([]string{"observe", "--server", "unix://" + sock, "-o", "json"}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("tendril observe %v: %v: %s", args, err, stderr.String())
		}
		var flows []*flowpb.Flow
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var resp observerpb.GetFlowsResponse
			if err := protojson.Unmarshal(sc.Bytes(), &resp); err != nil {
				t.Fatalf("tendril observe line %q: %v", sc.Text(), err)
			}
			if f := resp.GetFlow(); f != nil {
				flows = append(flows, f)
			}
		}
		return flows
	}
	between := func(f *flowpb.Flow, src, dst string) bool {
		return f.GetSource().GetPodName() == src && f.GetDestination().GetPodName() == dst &&
			f.GetSource().GetNamespace() == "default" && f.GetDestination().GetNamespace() == "default"
	}

	var flows []*flowpb.Flow
	eventually(t, "the agent's flows show c's drop and a's verdict", func() bool {
		flows = observe("--last", "1000")
		return slices.ContainsFunc(flows, func(f *flowpb.Flow) bool {
			return between(f, "c", "b") && f.GetVerdict() == flowpb.Verdict_DROPPED
		}) && slices.ContainsFunc(flows, func(f *flowpb.Flow) bool {
			return between(f, "a", "b") && f.GetVerdict() == flowpb.Verdict_FORWARDED && len(f.GetIngressAllowedBy()) > 0
		})
	})

	var dropped, verdict, traced bool
	for _, f := range flows {
		switch {
		case between(f, "c", "b") && f.GetVerdict() == flowpb.Verdict_DROPPED:
			dropped = true
			if f.GetIP().GetSource() != ipC || f.GetIP().GetDestination() != ipB {
				t.Errorf("drop's addresses %s -> %s, want %s -> %s", f.GetIP().GetSource(), f.GetIP().GetDestination(), ipC, ipB)
			}
			if f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENY {
				t.Errorf("drop reason %s, want POLICY_DENY: %v", f.GetDropReasonDesc(), f)
			}
			if len(f.GetIngressDeniedBy()) != 1 || !slices.Contains(f.GetIngressDeniedBy()[0].GetLabels(), "unspec:test=flows") {
				t.Errorf("drop names no deny rule of the policy: %v", f.GetIngressDeniedBy())
			}
			if !slices.Contains(f.GetSource().GetLabels(), "k8s:app=c") || f.GetNodeName() != n.name {
				t.Errorf("drop's source labels %v, node %q", f.GetSource().GetLabels(), f.GetNodeName())
			}
		case between(f, "a", "b") && f.GetVerdict() == flowpb.Verdict_DROPPED:
			t.Errorf("a's traffic dropped: %v", f)
		case between(f, "a", "b") && f.GetEventType().GetType() == 5: // policy verdict
			verdict = true
			if f.GetIP().GetSource() != ipA {
				t.Errorf("verdict's source %s, want %s", f.GetIP().GetSource(), ipA)
			}
			if len(f.GetIngressAllowedBy()) != 1 || !slices.Contains(f.GetIngressAllowedBy()[0].GetLabels(), "unspec:test=flows") {
				t.Errorf("verdict names no allowing rule of the policy: %v", f.GetIngressAllowedBy())
			}
		case (between(f, "a", "b") || between(f, "b", "a")) && f.GetEventType().GetType() == 4: // trace
			traced = true
			if f.GetVerdict() != flowpb.Verdict_FORWARDED {
				t.Errorf("trace verdict %s", f.GetVerdict())
			}
		}
	}
	if !dropped || !verdict || !traced {
		t.Errorf("flows: dropped %v, policy verdict %v, trace %v, of %d flows", dropped, verdict, traced, len(flows))
	}

	// The agent filters: only c's drops.
	for _, f := range observe("--last", "1000", "--verdict", "DROPPED", "--from-pod", "default/c") {
		if f.GetVerdict() != flowpb.Verdict_DROPPED || f.GetSource().GetPodName() != "c" {
			t.Errorf("filtered flow: %v", f)
		}
	}

	defer func() {
		// A clean stop: SIGTERM with a follower streaming ends the
		// follower, the agent, and removes the socket.
		follow := exec.Command(cli, "observe", "--server", "unix://"+sock, "--follow")
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		followDone := make(chan error, 1)
		go func() { followDone <- follow.Wait() }()
		time.Sleep(300 * time.Millisecond) // the stream is open
		if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the agent exits on SIGTERM", func() bool { return n.cmd.Process.Signal(syscall.Signal(0)) != nil })
		select {
		case <-followDone:
		case <-time.After(10 * time.Second):
			_ = follow.Process.Kill()
			t.Error("the follower outlived the agent")
		}
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("hubble socket after stop: %v", err)
		}
	}()

	// The counters: events read by type, flows seen, lost events.
	metricsOut, err := inNetns(n.netns, "curl", "-sf", "http://127.0.0.1:9962/metrics")
	if err != nil {
		t.Fatalf("metrics: %v: %s", err, metricsOut)
	}
	for _, want := range []string{`tendril_datapath_events_total{reason="Policy denied by deny rule",type="drop"}`, `type="trace"`,
		"tendril_hubble_flows_seen_total", `tendril_datapath_events_lost_total{reason="ring-full"} 0`} {
		if !strings.Contains(string(metricsOut), want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	t.Run("stock hubble CLI", func(t *testing.T) {
		hubbleCLI := hubbletest.HubbleCLI(t)
		out, err := exec.Command(hubbleCLI, "observe", "--server", "unix://"+sock, "--last", "1000").CombinedOutput()
		if err != nil {
			t.Fatalf("hubble observe: %v: %s", err, out)
		}
		t.Logf("hubble observe:\n%s", out)
		// The TCP listener, from inside the node.
		if out, err := inNetns(n.netns, hubbleCLI, "status", "--server", "127.0.0.1:4244"); err != nil || !strings.Contains(string(out), "Healthcheck (via 127.0.0.1:4244): Ok") {
			t.Errorf("hubble status over TCP: %v: %s", err, out)
		}
		for _, want := range []string{"default/c", "default/b", "DROPPED", "FORWARDED", "default/a"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("hubble observe lacks %q:\n%s", want, out)
			}
		}
	})
}
