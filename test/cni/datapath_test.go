package cni_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// restartAgent kills the node's agent with SIGKILL (when kill) and starts a
// new one on the same state dir, socket and BPF root.
func (n *node) killAgent(t *testing.T) {
	t.Helper()
	if err := n.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The harness's waiter reaps it.
	for i := 0; i < 100; i++ {
		if err := n.cmd.Process.Signal(syscall.Signal(0)); err != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (n *node) setLabels(t *testing.T, id string, labels ...string) {
	t.Helper()
	if err := n.agent.Do(context.Background(), "PATCH", "/endpoint/"+strings.ReplaceAll(id, "/", "%2F")+"/labels", nil, nil,
		&models.LabelConfigurationSpec{User: labels}, nil); err != nil {
		t.Fatal(err)
	}
}

func (n *node) importPolicy(t *testing.T, doc string) {
	t.Helper()
	if err := n.agent.Do(context.Background(), "PUT", "/policy", nil, nil, doc, nil); err != nil {
		t.Fatal(err)
	}
}

// reachable sends one echo request with a one-second timeout.
func reachable(from *pod, ip string) bool {
	_, err := inNetns(from.netns, "ping", "-c", "1", "-W", "1", ip)
	return err == nil
}

// eventually polls cond (policy changes are applied asynchronously); the
// deadline only bounds a broken agent.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (n *node) status(t *testing.T) *ext.StatusResponse {
	t.Helper()
	var st ext.StatusResponse
	if err := n.agent.Do(context.Background(), "GET", "/healthz", nil, nil, nil, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func sectionValue(st *ext.StatusResponse, title, key string) string {
	for _, s := range st.Tendril.Sections {
		if s.Title != title {
			continue
		}
		for _, l := range s.Lines {
			if l.Key == key {
				return l.Value
			}
		}
	}
	return ""
}

var lossRe = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// pingCounts reads how many echo requests ping sent and how many answers
// it got from its summary.
func pingCounts(t *testing.T, out string) (sent, got int) {
	t.Helper()
	m := lossRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("ping output: %s", out)
	}
	sent, _ = strconv.Atoi(m[1])
	got, _ = strconv.Atoi(m[2])
	return sent, got
}

// TestPrivilegedPolicyEnforcedAcrossAgentRestart runs real traffic through
// the eBPF datapath: a policy lets a reach b and keeps c out; then, during a
// 10-second ping at 100/s from a to b, the agent is killed with SIGKILL and
// started again: no packet may be lost, c must stay locked out while the
// agent is away, and the new agent must keep the pinned links.
func TestPrivilegedPolicyEnforcedAcrossAgentRestart(t *testing.T) {
	testutil.Privileged(t)
	n := startNode(t, "--ipv6-range", "none")
	list := n.confList("tendril-cni", "1.1.0", nil)
	a, b, c := n.newPod("a"), n.newPod("b"), n.newPod("c")
	n.mustAdd(list, a)
	rb := n.mustAdd(list, b)
	n.mustAdd(list, c)
	ipB := rb.IPs[0].Address.IP.String()
	if err := ping(a, ipB); err != nil {
		t.Fatalf("before any policy: %v", err)
	}
	if !reachable(c, ipB) {
		t.Fatal("c cannot reach b before any policy")
	}
	n.setLabels(t, "pod-name:default/a", "k8s:app=a")
	n.setLabels(t, "pod-name:default/b", "k8s:app=b")
	n.setLabels(t, "pod-name:default/c", "k8s:app=c")

	// b accepts only a.
	n.importPolicy(t, `[{"endpointSelector":{"matchLabels":{"app":"b"}},"labels":["test=restart"],
		"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"a"}}]}]}]`)
	eventually(t, "c is denied", func() bool { return !reachable(c, ipB) })
	if !reachable(a, ipB) {
		t.Fatal("a denied although the policy allows it")
	}
	ep, err := n.agent.EndpointGet(context.Background(), "pod-name:default/b")
	if err != nil {
		t.Fatal(err)
	}
	if ep.Status.Policy == nil || ep.Status.Policy.Realized.PolicyEnabled != models.EndpointPolicyEnabledIngress ||
		len(ep.Status.Policy.Realized.AllowedIngressIdentities) != 1 {
		t.Fatalf("b's realized policy: %+v", ep.Status.Policy)
	}

	// The CLI shows it: the rules, the selectors, a trace, the pinned maps.
	cliChecks := []struct {
		args []string
		want []string
		code int
	}{
		{[]string{"policy", "get"}, []string{`"app": "b"`, "Revision:"}, 0},
		{[]string{"policy", "selectors"}, []string{`endpoints:{"matchLabels":{"app":"a"}}`}, 0},
		{[]string{"policy", "trace", "--src", "k8s:app=a,k8s:io.kubernetes.pod.namespace=default", "--dst", "k8s:app=b,k8s:io.kubernetes.pod.namespace=default", "--dport", "80/TCP"}, []string{"Final verdict: ALLOWED"}, 0},
		{[]string{"policy", "trace", "--src", "k8s:app=c,k8s:io.kubernetes.pod.namespace=default", "--dst", "k8s:app=b,k8s:io.kubernetes.pod.namespace=default", "--dport", "80/TCP"}, []string{"Final verdict: DENIED"}, 1},
		{[]string{"bpf", "policy", "list", "--bpf-root", n.bpfRoot}, []string{"ingress identity=", "allow"}, 0},
		{[]string{"bpf", "endpoint", "list", "--bpf-root", n.bpfRoot}, []string{ipB, "ingress", "DIRECT"}, 0},
		{[]string{"bpf", "ipcache", "list", "--bpf-root", n.bpfRoot}, []string{ipB + "/32", "0.0.0.0/0"}, 0},
		{[]string{"bpf", "ct", "list", "--bpf-root", n.bpfRoot}, []string{"ENDPOINT", ipB}, 0},
		// Pod to pod goes from the sender's program straight into the
		// receiver (bpf_redirect_peer), b's ingress policy checked there.
		{[]string{"bpf", "metrics", "list", "--bpf-root", n.bpfRoot}, []string{"Policy denied", "Forwarded", "Delivered directly to a local endpoint"}, 0},
		{[]string{"endpoint", "get", "pod-name:default/b"}, []string{"Policy enforcement:", "ingress"}, 0},
		{[]string{"status"}, []string{"Datapath:", "6 " + n.attachmentNoun(t) + " attached", "map policy"}, 0},
		{[]string{"ip", "list"}, []string{ipB + "/32", "local", "default/b", "0.0.0.0/0", "generated"}, 0},
		{[]string{"ip", "list", "--cidr", ipB + "/32"}, []string{ipB + "/32", "default/b"}, 0},
		{[]string{"ip", "list", "--cidr", "nope"}, []string{"cidr"}, 1},
		{[]string{"identity", "list"}, []string{"reserved:world", "k8s:app=b"}, 0},
		{[]string{"identity", "list", "--endpoints"}, []string{"REFS", "k8s:app=a"}, 0},
		{[]string{"identity", "get", "2"}, []string{"reserved:world"}, 0},
		{[]string{"identity", "get", "65000"}, []string{"not found"}, 1},
	}
	cli, err := builder.Build("tendril")
	if err != nil {
		t.Fatal(err)
	}
	for _, cc := range cliChecks {
		cmd := exec.Command(cli, append([]string{"-H", "unix://" + n.socket}, cc.args...)...)
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != cc.code {
			t.Errorf("tendril %v: exit %d, want %d:\n%s", cc.args, cmd.ProcessState.ExitCode(), cc.code, out)
		}
		for _, w := range cc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("tendril %v lacks %q:\n%s", cc.args, w, out)
			}
		}
	}

	// The verdict flips with the policy: allow c too, then take it back.
	n.importPolicy(t, `[{"endpointSelector":{"matchLabels":{"app":"b"}},"labels":["test=restart-c"],
		"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"c"}}],"icmps":[{"fields":[{"type":8}]}]}]}]`)
	eventually(t, "c is allowed by the second rule", func() bool { return reachable(c, ipB) })
	if err := n.agent.Do(context.Background(), "DELETE", "/policy", nil, nil, []string{"test=restart-c"}, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c is denied again", func() bool { return !reachable(c, ipB) })

	before := n.status(t)
	linksBefore := sectionValue(before, "Datapath", "programs")

	// 10 s of 100/s pings from a to b; the agent dies at 2 s, returns at 5 s.
	pingOut := make(chan string, 1)
	go func() {
		out, _ := inNetns(a.netns, "ping", "-i", "0.01", "-c", "1000", "-W", "1", ipB)
		pingOut <- string(out)
	}()
	time.Sleep(2 * time.Second)
	n.killAgent(t)
	// While no agent runs, the pinned datapath keeps enforcing.
	if reachable(c, ipB) {
		t.Error("c reached b while the agent was down")
	}
	time.Sleep(2 * time.Second)
	n.runAgent(t, "--ipv6-range", "none")
	out := <-pingOut
	sent, got := pingCounts(t, out)
	t.Logf("ping across the restart: %d sent, %d received", sent, got)
	if sent != 1000 || got != sent {
		t.Errorf("lost %d of %d packets across the agent restart:\n%s", sent-got, sent, out)
	}
	// After the restart: same enforcement, same links reused.
	if reachable(c, ipB) {
		t.Error("c reaches b after the restart")
	}
	if !reachable(a, ipB) {
		t.Error("a cannot reach b after the restart")
	}
	after := n.status(t)
	programs := sectionValue(after, "Datapath", "programs")
	if !strings.Contains(programs, "6 "+n.attachmentNoun(t)+" attached (6 kept from the previous run)") {
		t.Errorf("datapath after restart: %q (before: %q)", programs, linksBefore)
	}
	for _, e := range n.endpoints() {
		if *e.Status.State != models.EndpointStateReady {
			t.Errorf("endpoint %d is %s after the restart", e.ID, *e.Status.State)
		}
	}
	n.checkAttachments(t, n.attachMode(t), 6)
}

// attachMode is the agent's datapath attach mode, from its status.
func (n *node) attachMode(t *testing.T) string {
	t.Helper()
	mode, _, _ := strings.Cut(sectionValue(n.status(t), "Datapath", "attach mode"), " ")
	if mode != "tcx" && mode != "tc" {
		t.Fatalf("agent status names no attach mode: %q", mode)
	}
	return mode
}

// attachmentNoun is what the agent's status calls its attachments.
func (n *node) attachmentNoun(t *testing.T) string {
	if n.attachMode(t) == "tc" {
		return "tc filters"
	}
	return "TCX links"
}

// checkAttachments checks that the node has want attachments of mode and
// none of the other: pinned TCX links under the BPF root, or Tendril's tc
// filters on the pods' veths.
func (n *node) checkAttachments(t *testing.T, mode string, want int) {
	t.Helper()
	// In tcx mode new endpoints start on tc filters and move to TCX links
	// once the node is quiet (--datapath-defer-tcx): wait for that.
	deadline := time.Now().Add(15 * time.Second)
	for {
		pins, err := os.ReadDir(filepath.Join(n.bpfRoot, "links"))
		if err != nil {
			t.Fatal(err)
		}
		filters := n.tendrilFilters(t)
		mine, other := len(pins), filters
		if mode == "tc" {
			mine, other = filters, len(pins)
		}
		if mine == want && other == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s mode: %d pinned links and %d tc filters, want %d of the mode's and none of the other's", mode, len(pins), filters, want)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tendrilFilters counts the agent's tc filters (named tendril:...) on the
// node's interfaces.
func (n *node) tendrilFilters(t *testing.T) int {
	t.Helper()
	links, err := n.nl.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, l := range links {
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := n.nl.FilterList(l, parent)
			if err != nil {
				continue // no clsact qdisc
			}
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "tendril:") {
					count++
				}
			}
		}
	}
	return count
}

// TestPrivilegedAttachModeSwitchAcrossAgentRestart: the agent is killed
// with SIGKILL and started in the other attach mode, TCX to tc and back,
// during a 100/s ping between two pods: nothing is lost, every endpoint
// ends in the new mode with nothing of the old one left, a denied pod
// stays denied, and the status says so.
func TestPrivilegedAttachModeSwitchAcrossAgentRestart(t *testing.T) {
	testutil.Privileged(t)
	args := []string{"--ipv6-range", "none"}
	n := startNode(t, append(args, "--datapath-attach-mode=tcx")...)
	list := n.confList("tendril-cni", "1.1.0", nil)
	a, b, c := n.newPod("a"), n.newPod("b"), n.newPod("c")
	n.mustAdd(list, a)
	ipB := n.mustAdd(list, b).IPs[0].Address.IP.String()
	n.mustAdd(list, c)
	n.setLabels(t, "pod-name:default/a", "k8s:app=a")
	n.setLabels(t, "pod-name:default/b", "k8s:app=b")
	n.importPolicy(t, `[{"endpointSelector":{"matchLabels":{"app":"b"}},"labels":["test=switch"],
		"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"a"}}]}]}]`)
	eventually(t, "c is denied", func() bool { return !reachable(c, ipB) })
	if err := ping(a, ipB); err != nil {
		t.Fatal(err)
	}
	n.checkAttachments(t, "tcx", 6)

	// 12 s of 100/s pings; the agent switches twice within them (about 2 and 6 s in).
	pingOut := make(chan string, 1)
	go func() {
		out, _ := inNetns(a.netns, "ping", "-i", "0.01", "-c", "1200", "-W", "1", ipB)
		pingOut <- string(out)
	}()
	start := time.Now()
	for _, mode := range []string{"tc", "tcx"} {
		time.Sleep(2 * time.Second)
		n.killAgent(t)
		n.runAgent(t, append(args, "--datapath-attach-mode="+mode)...)
		t.Logf("agent serving in mode %s %.1f s into the ping", mode, time.Since(start).Seconds())
		if got := n.attachMode(t); got != mode {
			t.Fatalf("agent started in mode %s, want %s", got, mode)
		}
		programs := sectionValue(n.status(t), "Datapath", "programs")
		if want := "6 " + n.attachmentNoun(t) + " attached (6 kept from the previous run)"; !strings.Contains(programs, want) {
			t.Errorf("after the switch to %s: %q, want %q", mode, programs, want)
		}
		n.checkAttachments(t, mode, 6)
		if reachable(c, ipB) {
			t.Errorf("c reached b after the switch to %s", mode)
		}
		// A pod added and deleted in this mode leaves nothing behind.
		d := n.newPod("d-" + mode)
		n.mustAdd(list, d)
		n.checkAttachments(t, mode, 8)
		if err := n.del(list, d); err != nil {
			t.Fatal(err)
		}
		n.checkAttachments(t, mode, 6)
	}
	out := <-pingOut
	sent, got := pingCounts(t, out)
	t.Logf("ping across two mode switches: %d sent, %d received", sent, got)
	if sent != 1200 || got != sent {
		t.Errorf("lost %d of %d packets across the switches:\n%s", sent-got, sent, out)
	}
}
