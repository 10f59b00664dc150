package containerd_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/realnode"
)

// uninstallLeavesWhatTheDocsSay runs `helm uninstall` of the lab's release
// and checks docs/install.md's "Uninstall and leftovers" against the real
// nodes: the agents, operators and relay go; the datapath keeps
// forwarding between the pods already there; on each node the CNI plugin,
// its network configuration, the state dir and the pins stay, and the
// commands the section gives remove them; the CRDs stay until the
// section's `kubectl delete crd` removes them. The CRD names are read
// from the section itself, so the test fails when a CRD is missing there.
func uninstallLeavesWhatTheDocsSay(t *testing.T, st *lab.State, tendril, server, client string) {
	ctx := context.Background()
	cs, err := st.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	helm, err := exec.Command(filepath.Join(moduleRoot(t), "hack", "helm.sh")).Output()
	if err != nil {
		t.Fatalf("hack/helm.sh: %v", err)
	}
	out, err := exec.Command(strings.TrimSpace(string(helm)), "uninstall", "tendril", "--namespace", lab.ChartNamespace,
		"--kubeconfig", st.Kubeconfig, "--wait").CombinedOutput()
	if err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	poll(t, "no Tendril pod left", func() (bool, error) {
		pods, err := cs.CoreV1().Pods(lab.ChartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=tendril"})
		if err != nil {
			return false, err
		}
		return len(pods.Items) == 0, nil
	})

	// The datapath keeps forwarding without the agents.
	srv, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, server, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tendril, "lab", "probe", "--name", st.Name, "default/"+client, srv.Status.PodIP+":80",
		"--timeout", "2s").CombinedOutput(); err != nil {
		t.Errorf("pod to pod after helm uninstall: %v\n%s", err, out)
	}

	// On each node: what the section says stays, then its commands.
	inNode := func(n lab.Node, args ...string) ([]byte, error) {
		nd := realnode.Node{Name: n.Name, Dir: filepath.Join(st.Dir, "nodes", n.Name)}
		return exec.Command("nsenter", append([]string{"--mount=" + nd.MountNamespace(), "--net=" + lab.NetnsPath(n.Netns), "--"}, args...)...).CombinedOutput()
	}
	// The health endpoint's namespace was named in the agent container's
	// own /run/netns: it went with the container, nothing of it on the
	// node (docs/health.md).
	for _, n := range st.Nodes {
		if out, err := inNode(n, "sh", "-c", "ls /run/netns /var/run/netns | grep tendril-health"); err == nil {
			t.Errorf("%s: a health endpoint namespace left on the node after helm uninstall: %s", n.Name, out)
		}
	}
	left := []string{"/opt/cni/bin/tendril-cni", "/etc/cni/net.d/05-tendril.conflist", "/var/run/tendril", "/sys/fs/bpf/tendril"}
	for _, n := range st.Nodes {
		for _, p := range left {
			if out, err := inNode(n, "test", "-e", p); err != nil {
				t.Errorf("%s: %s is gone after helm uninstall, the docs say it stays (%v %s)", n.Name, p, err, out)
			}
		}
		if out, err := inNode(n, tendril, "cni", "uninstall"); err != nil {
			t.Errorf("%s: tendril cni uninstall: %v\n%s", n.Name, err, out)
		}
		// In the lab /var/run/tendril is the node's own directory bound
		// over the machine's: rm empties it and cannot remove the mount
		// point itself ("busy"); on a node it is a plain directory.
		if out, err := inNode(n, "rm", "-rf", "/sys/fs/bpf/tendril", "/var/run/tendril"); err != nil &&
			strings.TrimSpace(string(out)) != "rm: cannot remove '/var/run/tendril': Device or resource busy" {
			t.Errorf("%s: rm: %v\n%s", n.Name, err, out)
		}
		for _, p := range left {
			if p == "/var/run/tendril" {
				if out, err := inNode(n, "find", p, "-mindepth", "1"); err != nil || len(out) != 0 {
					t.Errorf("%s: %s is not empty after the documented commands (%v):\n%s", n.Name, p, err, out)
				}
				continue
			}
			if out, err := inNode(n, "test", "-e", p); err == nil {
				t.Errorf("%s: %s is still there after the documented commands (%s)", n.Name, p, out)
			}
		}
	}

	// The CRDs stay; the section's command removes every one.
	crds := documentedCRDs(t)
	kubectl := filepath.Join(controlplane.BinaryDir(), controlplane.KubectlBinary)
	for _, crd := range crds {
		if out, err := exec.Command(kubectl, "--kubeconfig", st.Kubeconfig, "get", "crd", crd).CombinedOutput(); err != nil {
			t.Errorf("CRD %s is gone after helm uninstall, the docs say it stays: %v\n%s", crd, err, out)
		}
	}
	if out, err := exec.Command(kubectl, append([]string{"--kubeconfig", st.Kubeconfig, "delete", "crd"}, crds...)...).CombinedOutput(); err != nil {
		t.Errorf("kubectl delete crd (the documented list): %v\n%s", err, out)
	}
	out, err = exec.Command(kubectl, "--kubeconfig", st.Kubeconfig, "get", "crd", "-o", "name").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get crd: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "tendril.io") {
		t.Errorf("Tendril CRDs the documented command left:\n%s", out)
	}
}

// documentedCRDs are the CRD names docs/install.md's uninstall section
// gives to `kubectl delete crd`.
func documentedCRDs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Uninstall and leftovers\n")
	if !ok {
		t.Fatal("docs/install.md has no section \"Uninstall and leftovers\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	names := regexp.MustCompile(`tendril[a-z]+\.tendril\.io`).FindAllString(section, -1)
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		t.Fatal("no CRD names in docs/install.md's uninstall section")
	}
	return out
}
