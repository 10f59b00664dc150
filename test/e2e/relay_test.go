package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/lab"
)

// TestPrivilegedLabRelay drives the stock hubble CLI against the lab's
// relay (which reaches both agents over mTLS): the cluster's status and
// nodes, flows of pods on both nodes with the filters, a policy drop, and
// node2's agent stopped and started again (status names it, node1's flows
// keep coming, node2's resume in the same follow).
func TestPrivilegedLabRelay(t *testing.T) {
	e := labUp(t)
	bin := hubbletest.HubbleCLI(t)
	relay := "unix://" + e.st.RelaySocket()
	hubble := func(args ...string) string { return hubbletest.RunCLI(t, bin, relay, args...) }

	if out := hubble("status"); !strings.Contains(out, "Connected Nodes: 2/2") {
		t.Fatalf("status:\n%s", out)
	}
	if out := hubble("list", "nodes"); !strings.Contains(out, "node1") || !strings.Contains(out, "node2") || strings.Count(out, "Connected") != 2 {
		t.Fatalf("list nodes:\n%s", out)
	}

	const ns = "e2e-relay"
	e.createNamespace(t, ns)
	for app, node := range map[string]string{"frontend": "node1", "backend": "node2", "other": "node1"} {
		e.createPod(t, ns, app, node, map[string]string{"app": app}, corev1.ContainerPort{ContainerPort: 80})
	}
	backend := e.waitReady(t, ns, "backend")
	e.waitReady(t, ns, "frontend")
	e.waitReady(t, ns, "other")
	addr80 := backend.Status.PodIP + ":80"
	pol := &v1alpha1.TendrilNetworkPolicy{}
	if err := yaml.UnmarshalStrict([]byte(policyYAML), pol); err != nil {
		t.Fatal(err)
	}
	if _, err := e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns).Create(context.Background(), pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A drop followed through the relay: other -> backend:80 on node2.
	drops := followCLI(t, bin, relay, "--namespace", ns, "--verdict", "DROPPED")
	eventually(t, "other -> backend:80 denied", func() (bool, error) {
		c := probe(t, ns+"/other", addr80, false)
		return c == 1, fmt.Errorf("exit %d", c)
	})
	drops.wait(t, "a policy drop at node2", func(r *observerpb.GetFlowsResponse) bool {
		f := r.GetFlow()
		return r.GetNodeName() == "node2" && f.GetVerdict() == flowpb.Verdict_DROPPED &&
			f.GetDestination().GetPodName() == "backend" && f.GetSource().GetPodName() == "other"
	})
	if c := probe(t, ns+"/frontend", addr80, false); c != 0 {
		t.Fatalf("frontend -> backend:80 exit %d, want 0", c)
	}

	all := hubbletest.JSONFlows(t, hubble("observe", "--last", "1000", "-o", "json", "--namespace", ns))
	nodes := map[string]bool{}
	for _, f := range all {
		nodes[f.GetNodeName()] = true
	}
	if !nodes["node1"] || !nodes["node2"] {
		t.Fatalf("flows of %s from nodes %v, want both", ns, nodes)
	}
	for _, c := range []struct {
		args  []string
		check func(*flowpb.Flow) bool
	}{
		{[]string{"--pod", ns + "/backend"}, func(f *flowpb.Flow) bool {
			return f.GetSource().GetPodName() == "backend" || f.GetDestination().GetPodName() == "backend"
		}},
		{[]string{"--namespace", ns}, func(f *flowpb.Flow) bool {
			return f.GetSource().GetNamespace() == ns || f.GetDestination().GetNamespace() == ns
		}},
		{[]string{"--verdict", "DROPPED"}, func(f *flowpb.Flow) bool { return f.GetVerdict() == flowpb.Verdict_DROPPED }},
		{[]string{"--label", "app=frontend"}, func(f *flowpb.Flow) bool {
			return slices.Contains(f.GetSource().GetLabels(), "k8s:app=frontend") || slices.Contains(f.GetDestination().GetLabels(), "k8s:app=frontend")
		}},
		{[]string{"--port", "80", "--protocol", "tcp"}, func(f *flowpb.Flow) bool {
			tcp := f.GetL4().GetTCP()
			return tcp != nil && (tcp.GetDestinationPort() == 80 || tcp.GetSourcePort() == 80)
		}},
	} {
		flows := hubbletest.JSONFlows(t, hubble(append([]string{"observe", "--last", "100", "-o", "json"}, c.args...)...))
		if len(flows) == 0 {
			t.Errorf("%v: no flow", c.args)
		}
		for _, f := range flows {
			if !c.check(f) {
				t.Errorf("%v: flow does not match: %v", c.args, f)
			}
		}
	}

	// node2's agent goes away; the datapath keeps forwarding.
	fromFrontend := followCLI(t, bin, relay, "--pod", ns+"/frontend", "--protocol", "tcp")
	argv := stopAgent(t, e.st, "node2")
	stopped := time.Now()
	eventually(t, "the relay to see node2 unavailable", func() (bool, error) {
		out := hubble("status")
		return strings.Contains(out, "Connected Nodes: 1/2") && strings.Contains(out, "Unavailable Nodes: 1\n  - node2"), fmt.Errorf("%s", out)
	})
	if out := hubble("list", "nodes"); !strings.Contains(out, "Unavailable") || strings.Count(out, "Connected") != 1 {
		t.Fatalf("list nodes with node2 away:\n%s", out)
	}
	if c := probe(t, ns+"/frontend", addr80, false); c != 0 {
		t.Fatalf("frontend -> backend:80 with node2's agent down: exit %d", c)
	}
	fromFrontend.wait(t, "node1's flow while node2 is away", func(r *observerpb.GetFlowsResponse) bool {
		return r.GetNodeName() == "node1" && r.GetFlow().GetTime().AsTime().After(stopped)
	})

	startAgent(t, e.st, "node2", argv)
	restarted := time.Now()
	eventually(t, "the relay to reach node2 again", func() (bool, error) {
		out := hubble("status")
		return strings.Contains(out, "Connected Nodes: 2/2"), fmt.Errorf("%s", out)
	})
	if c := probe(t, ns+"/frontend", addr80, false); c != 0 {
		t.Fatalf("frontend -> backend:80 after node2's restart: exit %d", c)
	}
	fromFrontend.wait(t, "node2's flow once it is back", func(r *observerpb.GetFlowsResponse) bool {
		return r.GetNodeName() == "node2" && r.GetFlow().GetTime().AsTime().After(restarted)
	})
}

// cliFollow is a running `hubble observe --follow -o json`.
type cliFollow struct {
	lines chan *observerpb.GetFlowsResponse
}

// It starts from a second ago (--since), so traffic that follows cannot
// pass before the query reaches every node.
func followCLI(t *testing.T, bin, server string, args ...string) *cliFollow {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	since := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	cmd := exec.CommandContext(ctx, bin, append([]string{"observe", "--follow", "--since", since, "-o", "json", "--server", server}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f := &cliFollow{lines: make(chan *observerpb.GetFlowsResponse, 1024)}
	go func() {
		defer close(f.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			for _, r := range hubbletest.JSONResponses(t, sc.Text()) {
				f.lines <- r
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("hubble observe %v stderr:\n%s", args, stderr.String())
		}
	})
	return f
}

// wait reads the followed flows until one matches.
func (f *cliFollow) wait(t *testing.T, what string, match func(*observerpb.GetFlowsResponse) bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case r, ok := <-f.lines:
			if !ok {
				t.Fatalf("%s: hubble observe --follow ended", what)
			}
			if match(r) {
				return
			}
		case <-deadline:
			t.Fatalf("%s: not followed", what)
		}
	}
}

// stopAgent stops a node's agent (SIGTERM) and returns its command line.
func stopAgent(t *testing.T, st *lab.State, node string) []string {
	t.Helper()
	return signalAgent(t, st, node, syscall.SIGTERM, "stop")
}

// signalAgent sends a node's agent sig, waits for it to be gone ("the
// agent of <node> to <what>") and returns its command line.
func signalAgent(t *testing.T, st *lab.State, node string, sig syscall.Signal, what string) []string {
	t.Helper()
	procs, err := lab.ReadProcesses(st.PidDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.Role != "agent-"+node {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID))
		if err != nil {
			t.Fatal(err)
		}
		argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if err := syscall.Kill(p.PID, sig); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the agent of "+node+" to "+what, func() (bool, error) { return !p.Alive(), nil })
		return argv
	}
	t.Fatalf("no agent process of %s in %v", node, procs)
	return nil
}

// startAgent starts a node's agent again with its command line, inside
// the node's namespace, recorded as the lab records it.
func startAgent(t *testing.T, st *lab.State, node string, argv []string) {
	t.Helper()
	n, err := st.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	full := append([]string{"nsenter", "--net=" + lab.NetnsPath(n.Netns)}, argv...)
	role := "agent-" + node
	if _, _, err := lab.StartDetached(st.PidDir(), role, filepath.Join(st.LogDir(), role+".log"), full); err != nil {
		t.Fatal(err)
	}
}
