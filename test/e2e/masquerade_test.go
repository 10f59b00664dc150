package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/lab"
)

// labPodOn returns a default/pod-N running on node.
func (e *env) labPodOn(t *testing.T, node string) *corev1.Pod {
	t.Helper()
	pods, err := e.cs.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=lab"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Spec.NodeName == node && lab.PodReady(p) {
			return p
		}
	}
	t.Fatalf("no ready lab pod on %s", node)
	return nil
}

// TestPrivilegedLabMasquerade: from a pod on each node, TCP, UDP and ICMP
// echo reach the world (which has no route to the pod CIDRs) and the world
// server sees the node's address and a port of the masquerade range; the
// world's ICMP error for a closed UDP port reaches the pod; the world
// cannot reach a pod address; the node's NAT table (read from its
// pins) and `tendril status` show the masquerade.
func TestPrivilegedLabMasquerade(t *testing.T) {
	e := labUp(t)
	w := e.st.World
	if w == nil {
		t.Fatal("the lab has no world")
	}
	for _, n := range e.st.Nodes {
		pod := e.labPodOn(t, n.Name)
		ref := "default/" + pod.Name
		for _, udp := range []bool{false, true} {
			port := 80
			if udp {
				port = 81
			}
			code, out := tendril(t, "probe", ref, fmt.Sprintf("%s:%d", w.ServerIP, port), "--timeout", "2s", fmt.Sprintf("--udp=%v", udp))
			t.Logf("%s -> world udp=%v: exit %d: %s", ref, udp, code, strings.TrimSpace(out))
			m := peerAnswer.FindStringSubmatch(out)
			if code != 0 || m == nil || m[1] != "world" {
				t.Fatalf("%s to the world (udp=%v): exit %d: %s", ref, udp, code, out)
			}
			p, _ := strconv.Atoi(m[3])
			if m[2] != n.Address || p < 61000 || p > 65535 {
				t.Fatalf("%s reached the world as %s:%s, want %s with a port in 61000-65535", ref, m[2], m[3], n.Address)
			}
		}
		if code, out := tendril(t, "exec", ref, "--", "ping", "-c", "2", "-W", "2", w.ServerIP); code != 0 {
			t.Fatalf("%s pings the world: exit %d: %s", ref, code, out)
		}
		// UDP to a closed port: the world's "port unreachable", sent to
		// the node, reaches the pod's socket translated back.
		if code, out := tendril(t, "probe", ref, w.ServerIP+":9999", "--udp", "--timeout", "2s"); code != 1 || !strings.Contains(out, "connection refused") {
			t.Fatalf("%s to a closed UDP port of the world: exit %d, want the ICMP error as connection refused: %s", ref, code, out)
		}
		// No route back to a pod: the world is outside.
		if code := probe(t, lab.WorldRef, pod.Status.PodIP+":80", false); code != 1 {
			t.Fatalf("the world reached pod %s directly: exit %d", pod.Status.PodIP, code)
		}
		out, err := exec.Command(tendrilBin, "bpf", "--bpf-root", n.BPFRoot, "nat", "list").CombinedOutput()
		if err != nil || !strings.Contains(string(out), pod.Status.PodIP+":") || !strings.Contains(string(out), n.Address+":") {
			t.Fatalf("bpf nat list on %s (%v): want %s via %s:\n%s", n.Name, err, pod.Status.PodIP, n.Address, out)
		}
		st, err := exec.Command(tendrilBin, "-H", n.Socket, "status").CombinedOutput()
		if err != nil || !strings.Contains(string(st), "Masquerade") || !strings.Contains(string(st), "eth0 ("+n.Address+")") {
			t.Fatalf("status of %s (%v) shows no masquerade on eth0 (%s):\n%s", n.Name, err, n.Address, st)
		}
	}
}

// TestPrivilegedLabMasqueradeStreamAcrossAgentKill: a pod streams TCP to
// the world (iperf3, 8 s) while its node's agent is killed with SIGKILL
// and started again: the stream completes without an error (the host
// programs and the NAT table stay pinned; the restarted agent takes the
// attachments over), and the restarted agent reports them kept.
func TestPrivilegedLabMasqueradeStreamAcrossAgentKill(t *testing.T) {
	e := labUp(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatal("iperf3 is missing (hack/install-deps.sh installs it)")
	}
	w := e.st.World
	node := e.st.Nodes[0]
	pod := e.labPodOn(t, node.Name)
	server := exec.Command("nsenter", "--net="+lab.NetnsPath(w.Netns), "iperf3", "-s", "-1", "-B", w.ServerIP, "-p", "5201")
	var serverOut bytes.Buffer
	server.Stdout, server.Stderr = &serverOut, &serverOut
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Process.Kill(); _ = server.Wait() })
	time.Sleep(300 * time.Millisecond) // the server's listen
	client := exec.Command(tendrilBin, "lab", "--name", labName, "exec", "default/"+pod.Name, "--",
		"iperf3", "-c", w.ServerIP, "-p", "5201", "-t", "8", "-b", "50M", "-i", "1")
	var clientOut bytes.Buffer
	client.Stdout, client.Stderr = &clientOut, &clientOut
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- client.Wait() }()
	time.Sleep(2 * time.Second)

	argv := killAgent(t, e.st, node.Name)
	time.Sleep(time.Second) // the stream flows without an agent
	startAgent(t, e.st, node.Name, argv)
	logPath := filepath.Join(e.st.LogDir(), "agent-"+node.Name+".log")
	eventually(t, "the restarted agent to take the host programs over", func() (bool, error) {
		b, err := os.ReadFile(logPath)
		if err != nil {
			return false, err
		}
		i := strings.LastIndex(string(b), "Host device programs attached")
		return i >= 0 && strings.Contains(string(b[i:]), "kept-from-previous-run=2"), nil
	})
	select {
	case err := <-done:
		if err != nil || strings.Contains(clientOut.String(), "error") {
			t.Fatalf("the stream broke across the agent's kill -9 (%v):\n%s\nserver:\n%s", err, clientOut.String(), serverOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the stream did not finish:\n%s", clientOut.String())
	}
	t.Logf("iperf3 across the agent's kill -9 and restart:\n%s", lastLines(clientOut.String(), 4))
	// Every interval moved data: no stall while the agent was away.
	for _, l := range strings.Split(clientOut.String(), "\n") {
		if strings.Contains(l, "sec") && strings.Contains(l, " 0.00 Bytes") {
			t.Fatalf("an interval moved nothing:\n%s", clientOut.String())
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
