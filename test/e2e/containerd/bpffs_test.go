package containerd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/realnode"
)

// bpffsMissingSaid is what the agent's status and health say of a bpffs
// it had to mount itself (agentdatapath's bpffsMissing).
const bpffsMissingSaid = "was not mounted at /sys/fs/bpf"

// bpffsTakenAway hides the node's bpffs from node2's agent pod: a tmpfs
// over /sys/fs/bpf in the node's mount namespace, which the chart's
// hostPath volume (HostToContainer) shows the pod, then the agent pod
// deleted. The DaemonSet's new agent finds no bpffs, mounts its own and
// must not be healthy: `tendril status` and its log name the missing
// bpffs, and the kubelet's probe fails on it. With the tmpfs gone and the
// agent pod deleted again, the next agent is Ready on the node's bpffs
// (the pinned state the tmpfs hid) and pods on both nodes reach each
// other again.
func bpffsTakenAway(t *testing.T, st *lab.State, tendril string) {
	ctx := context.Background()
	cs, err := st.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	n := st.Nodes[1]
	nd := realnode.Node{Name: n.Name, Dir: filepath.Join(st.Dir, "nodes", n.Name)}
	inNode := func(argv ...string) (string, error) {
		out, err := exec.Command("nsenter", append([]string{"--mount=" + nd.MountNamespace(), "--net=" + lab.NetnsPath(n.Netns), "--"}, argv...)...).CombinedOutput()
		return string(out), err
	}
	status := func(args ...string) (string, error) {
		return inNode(append([]string{tendril, "-H", "unix://" + client.DefaultSocket, "status"}, args...)...)
	}

	begin := time.Now()
	old := agentPodOn(t, cs, n.Name)
	if out, err := inNode("mount", "-t", "tmpfs", "tendril-e2e-no-bpffs", "/sys/fs/bpf"); err != nil {
		t.Fatalf("hide %s's bpffs: %v: %s", n.Name, err, out)
	}
	hidden := true
	restore := func() {
		if !hidden {
			return
		}
		if out, err := inNode("umount", "/sys/fs/bpf"); err != nil {
			t.Errorf("unmount the tmpfs over %s's bpffs: %v: %s", n.Name, err, out)
			return
		}
		hidden = false
	}
	defer restore()
	if out, err := inNode("stat", "-f", "-c", "%T", "/sys/fs/bpf"); err != nil || strings.TrimSpace(out) != "tmpfs" {
		t.Fatalf("%s's /sys/fs/bpf after the tmpfs: %q (%v)", n.Name, out, err)
	}
	deleteAgentPod(t, cs, old)
	var pod *corev1.Pod
	var said string
	poll(t, "the new agent on "+n.Name+" to name the missing bpffs in tendril status", func() (bool, error) {
		p, err := newAgentPodOn(ctx, cs, n.Name, old.UID)
		if err != nil {
			return false, err
		}
		pod = p
		out, err := status()
		said = out
		return strings.Contains(out, "bpffs") && strings.Contains(out, bpffsMissingSaid), fmt.Errorf("tendril status: %v:\n%s", err, out)
	})
	t.Logf("tendril status of the agent without the node's bpffs:\n%s", grepLines(said, "bpffs"))
	// Not healthy: what the chart's probes run fails and names it.
	brief, err := status("--brief")
	if err == nil || !strings.Contains(brief, "bpffs: "+bpffsMissingSaid) {
		t.Errorf("tendril status --brief without the node's bpffs: %v: %s", err, brief)
	}
	poll(t, "the kubelet's probe of "+pod.Name+" to fail on the missing bpffs", func() (bool, error) {
		evs, err := cs.CoreV1().Events(lab.ChartNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(pod.UID)})
		if err != nil {
			return false, err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Reason == "Unhealthy" && strings.Contains(e.Message, bpffsMissingSaid) {
				t.Logf("event of %s: %s %s", pod.Name, e.Reason, e.Message)
				return true, nil
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return false, fmt.Errorf("events: %s", strings.Join(seen, "; "))
	})
	if p, err := cs.CoreV1().Pods(lab.ChartNamespace).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil || lab.PodReady(p) {
		t.Errorf("agent pod %s without the node's bpffs: Ready %v (%v)", pod.Name, p != nil && lab.PodReady(p), err)
	}
	if log := agentLog(t, st, pod); !strings.Contains(log, "bpffs was not mounted") {
		t.Errorf("the log of %s does not name the missing bpffs:\n%s", pod.Name, log)
	}

	// Restored: the node's bpffs back, the agent restarted on it.
	restore()
	deleteAgentPod(t, cs, pod)
	poll(t, "a Ready agent on "+n.Name+" with the node's bpffs", func() (bool, error) {
		p, err := newAgentPodOn(ctx, cs, n.Name, pod.UID)
		if err != nil {
			return false, err
		}
		if !lab.PodReady(p) {
			return false, fmt.Errorf("agent pod %s not Ready", p.Name)
		}
		out, err := status()
		return err == nil && !strings.Contains(out, bpffsMissingSaid), fmt.Errorf("tendril status: %v:\n%s", err, grepLines(out, "bpffs"))
	})
	podsReachEachOther(t, st, tendril)
	healthEndpointsReachable(t, st, tendril)
	t.Logf("bpffs hidden, named, restored and the datapath back in %s", time.Since(begin).Round(time.Millisecond))
}

// agentPodOn is the agent pod on node.
func agentPodOn(t *testing.T, cs kubernetes.Interface, node string) *corev1.Pod {
	t.Helper()
	pods, err := cs.CoreV1().Pods(lab.ChartNamespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=tendril-agent", FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the agent pod on %s: %d pods (%v)", node, len(pods.Items), err)
	}
	return &pods.Items[0]
}

// newAgentPodOn is the agent pod on node other than the one of UID old,
// once its agent container runs.
func newAgentPodOn(ctx context.Context, cs kubernetes.Interface, node string, old types.UID) (*corev1.Pod, error) {
	pods, err := cs.CoreV1().Pods(lab.ChartNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=tendril-agent", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.UID == old || p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.Name == "agent" && c.State.Running != nil {
				return p, nil
			}
		}
		return nil, fmt.Errorf("new agent pod %s on %s: agent container not running yet (%s)", p.Name, node, p.Status.Phase)
	}
	return nil, fmt.Errorf("no new agent pod on %s yet", node)
}

// deleteAgentPod deletes p and waits until it is gone (its agent stopped).
func deleteAgentPod(t *testing.T, cs kubernetes.Interface, p *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	if err := cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}}); err != nil {
		t.Fatalf("delete agent pod %s: %v", p.Name, err)
	}
	poll(t, "agent pod "+p.Name+" to be gone", func() (bool, error) {
		cur, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err == nil && cur.UID == p.UID {
			return false, fmt.Errorf("still there (%s)", cur.Status.Phase)
		}
		return true, nil
	})
}

// agentLog is the agent container's newest log file of p, from its
// node's pod log directory (the kubelet's podLogsDir).
func agentLog(t *testing.T, st *lab.State, p *corev1.Pod) string {
	t.Helper()
	dir := filepath.Join(st.Dir, "nodes", p.Spec.NodeName, "pod-logs", p.Namespace+"_"+p.Name+"_"+string(p.UID), "agent")
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if len(logs) == 0 {
		t.Fatalf("no agent log in %s", dir)
	}
	sort.Strings(logs)
	b, err := os.ReadFile(logs[len(logs)-1])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// podsReachEachOther probes, from every lab pod, every other lab pod's
// port 80 (the scheduler places them, most often one per node; the health
// endpoints' probes cover both nodes in any case).
func podsReachEachOther(t *testing.T, st *lab.State, tendril string) {
	t.Helper()
	cs, err := st.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	pods, err := cs.CoreV1().Pods(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{LabelSelector: lab.LabelApp + "=" + lab.LabApp})
	if err != nil || len(pods.Items) < 2 {
		t.Fatalf("lab pods: %d (%v)", len(pods.Items), err)
	}
	for _, from := range pods.Items {
		for _, to := range pods.Items {
			if from.Name == to.Name {
				continue
			}
			poll(t, fmt.Sprintf("%s (%s) to reach %s (%s)", from.Name, from.Spec.NodeName, to.Name, to.Spec.NodeName), func() (bool, error) {
				out, err := exec.Command(tendril, "lab", "probe", "--name", st.Name, "default/"+from.Name, to.Status.PodIP+":80", "--timeout", "1s").CombinedOutput()
				return err == nil, fmt.Errorf("lab probe: %v: %s", err, out)
			})
		}
	}
}

// grepLines are the lines of s holding word.
func grepLines(s, word string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
