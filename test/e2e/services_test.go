package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/lab"
)

// TestPrivilegedLabNodeCgroupsAndSocketLB checks the lab's per-node
// cgroups end to end: each node's agent attaches socket load-balancing to
// its node's cgroup (never the machine's root), the node's pod workloads
// run below it, each in its pod's cgroup, `lab exec` runs in the pod's
// cgroup too, and a ClusterIP probed with
// `lab probe` is translated by the socket hooks of the pod's node (its
// socket reverse NAT records the connect) and by no other node's.
func TestPrivilegedLabNodeCgroupsAndSocketLB(t *testing.T) {
	e := labUp(t)
	mount, err := lab.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range e.st.Nodes {
		if n.Cgroup != lab.NodeCgroupDir(mount, labName, n.Name) {
			t.Fatalf("node %s: cgroup %q, want %q", n.Name, n.Cgroup, lab.NodeCgroupDir(mount, labName, n.Name))
		}
		if _, err := os.Stat(filepath.Join(n.Cgroup, "cgroup.procs")); err != nil {
			t.Fatalf("node %s: no cgroup: %v", n.Name, err)
		}
		out, err := runCLI(tendrilBin, "-H", n.Socket, "status")
		if err != nil || !strings.Contains(out, n.Cgroup+" (") {
			t.Fatalf("node %s: status does not show socket LB at %s (%v):\n%s", n.Name, n.Cgroup, err, out)
		}
		// The workloads of the node's pods (the lab workload, or CoreDNS
		// for the cluster DNS pods), and nothing else, run there, each in
		// its pod's own cgroup below the node's, named as the kubelet
		// names it (kubepods/<qos>/pod<uid>/<container>).
		running := map[string]string{} // pod name: its workload's cgroup
		for f, dir := range pidsUnder(t, n.Cgroup) {
			cmdline, err := os.ReadFile(filepath.Join("/proc", f, "cmdline"))
			if err != nil {
				continue // exited meanwhile
			}
			args := strings.Split(string(cmdline), "\x00")
			if args[0] == e.st.CoreDNSBin {
				running["coredns-"+n.Name] = dir
				continue
			}
			i := slices.Index(args, "--pod-name")
			if filepath.Base(args[0]) != lab.WorkloadBinary || i < 0 || i+1 >= len(args) {
				t.Errorf("node %s: process %s in the node's cgroup %s is no workload: %q", n.Name, f, dir, args)
				continue
			}
			running[args[i+1]] = dir
		}
		var want []*lab.PodRecord
		for i := 1; i <= 2*podsPerNode; i++ {
			if rec, err := e.st.Pod("default", "pod-"+strconv.Itoa(i)); err == nil && rec.Node == n.Name {
				want = append(want, rec)
			}
		}
		if rec, err := e.st.Pod(lab.DNSNamespace, "coredns-"+n.Name); err == nil && rec.Node == n.Name {
			want = append(want, rec)
		}
		for _, w := range want {
			if !strings.HasPrefix(w.Cgroup, n.Cgroup+"/kubepods/") || filepath.Base(filepath.Dir(w.Cgroup)) != "pod"+w.UID {
				t.Errorf("node %s: pod %s's cgroup %q is not kubelet-shaped below the node's", n.Name, w.Name, w.Cgroup)
			}
			if got, ok := running[w.Name]; !ok || got != w.Cgroup {
				t.Errorf("node %s: workload of %s not in its cgroup %s (there: %v)", n.Name, w.Name, w.Cgroup, running)
			}
		}
	}

	rec, err := e.st.Pod("default", "pod-1")
	if err != nil {
		t.Fatal(err)
	}
	rel := strings.TrimPrefix(rec.Cgroup, mount)
	if code, out := tendril(t, "exec", "default/pod-1", "--", "cat", "/proc/self/cgroup"); code != 0 || !strings.Contains(out, "0::"+rel+"\n") {
		t.Fatalf("lab exec: exit %d, not in %s:\n%s", code, rel, out)
	}

	ctx := context.Background()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "cgroup-socklb", Namespace: "default"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{lab.LabelApp: lab.LabApp},
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 8080, TargetPort: intstr.FromInt32(80)}}},
	}
	created, err := e.cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cs.CoreV1().Services("default").Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	eventually(t, "the Service's endpoints", func() (bool, error) {
		sl, err := e.cs.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
		if err != nil {
			return false, err
		}
		n := 0
		for _, s := range sl.Items {
			n += len(s.Endpoints)
		}
		return n == 2*podsPerNode, fmt.Errorf("%d endpoints", n)
	})
	frontend := netip.AddrPortFrom(netip.MustParseAddr(created.Spec.ClusterIP), 8080)
	var answer string
	eventually(t, "an answer at the ClusterIP", func() (bool, error) {
		code, out := tendril(t, "probe", "default/pod-1", frontend.String(), "--timeout", "1s")
		answer = out
		return code == 0, fmt.Errorf("exit %d: %s", code, out)
	})
	if !strings.Contains(answer, `answered "pod-`) {
		t.Fatalf("ClusterIP answered by no lab pod: %s", answer)
	}
	for _, n := range e.st.Nodes {
		recorded := socketRevNATFor(t, n.BPFRoot, frontend)
		if n.Name == rec.Node && recorded == 0 {
			t.Errorf("node %s: the probe's connect to %s was not translated by the node's socket hooks", n.Name, frontend)
		}
		if n.Name != rec.Node && recorded != 0 {
			t.Errorf("node %s: socket hooks translated %d connects to %s of another node's pod", n.Name, recorded, frontend)
		}
	}
}

// pidsUnder lists the processes in the cgroup dir and the cgroups below
// it, each with its cgroup.
func pidsUnder(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // a pod's cgroup removed meanwhile
		}
		if err != nil || !d.IsDir() {
			return err
		}
		procs, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, pid := range strings.Fields(string(procs)) {
			out[pid] = path
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list the processes of cgroup %s: %v", dir, err)
	}
	return out
}

// socketRevNATFor counts the node's socket reverse NAT entries for
// frontend: one per connect its socket hooks translated.
func socketRevNATFor(t *testing.T, bpfRoot string, frontend netip.AddrPort) int {
	t.Helper()
	m, err := maps.OpenPinnedLB(bpfRoot, true)
	if err != nil {
		t.Fatalf("open LB maps of %s: %v", bpfRoot, err)
	}
	defer m.Close()
	n := 0
	if err := m.SockRevNATMap().Iterate(func(e maps.SockRevNAT) bool {
		if e.Frontend == frontend {
			n++
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// runCLI runs a command and returns its combined output.
func runCLI(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}
