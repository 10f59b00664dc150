package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedLabOperatorClusterPool brings up a lab of its own with two
// tendril-operator replicas and --ipam cluster-pool: the nodes get
// disjoint CIDRs from the pool and the pods addresses from them; the
// leading operator is killed with SIGKILL and the other takes the Lease
// over; an agent killed and started again selects the same CIDR from its
// TendrilNode.
func TestPrivilegedLabOperatorClusterPool(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, labErr == nil, "no binaries for the lab")
	name, st, c := operatorLab(t, "op", "tendril-operator: 2 replicas", "the operators",
		"--operators", "2", "--ipam", "cluster-pool")
	ctx := context.Background()

	// Disjoint CIDRs from the pool; each pod's address in its node's CIDR.
	pool := netip.MustParsePrefix(lab.ClusterPoolCIDR)
	cidrs := map[string]netip.Prefix{}
	for _, n := range st.Nodes {
		tn, err := c.Tendril.TendrilV1alpha1().TendrilNodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil || len(tn.Spec.IPAM.PodCIDRs) != 1 {
			t.Fatalf("TendrilNode %s: %v %v", n.Name, tn, err)
		}
		p := netip.MustParsePrefix(tn.Spec.IPAM.PodCIDRs[0])
		if !pool.Contains(p.Addr()) || p.Bits() != 24 {
			t.Fatalf("node %s CIDR %s is not a /24 of %s", n.Name, p, pool)
		}
		for other, q := range cidrs {
			if q.Overlaps(p) {
				t.Fatalf("nodes %s and %s overlap: %s %s", other, n.Name, q, p)
			}
		}
		cidrs[n.Name] = p
	}
	pods, err := c.Core.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 2 {
		t.Fatalf("pods %v %v", pods, err)
	}
	for _, p := range pods.Items {
		ip := netip.MustParseAddr(p.Status.PodIP)
		if !cidrs[p.Spec.NodeName].Contains(ip) {
			t.Fatalf("pod %s on %s has %s, outside the node's %s", p.Name, p.Spec.NodeName, ip, cidrs[p.Spec.NodeName])
		}
	}

	// Kill the leading operator; the other takes over.
	leaseHolder := func() string {
		l, err := c.Core.CoordinationV1().Leases("kube-system").Get(ctx, "tendril-operator-resource-lock", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	leader := leaseHolder()
	procs, err := lab.ReadProcesses(st.PidDir())
	if err != nil {
		t.Fatal(err)
	}
	killed := false
	for _, p := range procs {
		if name+"-"+p.Role == leader {
			if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	if !killed {
		t.Fatalf("no lab process is the leader %q (%v)", leader, procs)
	}
	eventually(t, "the other operator to take the lease over", func() (bool, error) {
		h := leaseHolder()
		return h != "" && h != leader, nil
	})

	// Restart node1's agent: it selects the same CIDR from its TendrilNode.
	var agent lab.Process
	for _, p := range procs {
		if p.Role == "agent-node1" {
			agent = p
		}
	}
	argv, err := os.ReadFile("/proc/" + strconv.Itoa(agent.PID) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(agent.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the agent to exit", func() (bool, error) {
		return syscall.Kill(agent.PID, 0) != nil, nil
	})
	// The lab started it through nsenter, which exec'd the agent: its
	// command line no longer names the node's namespace.
	args := append([]string{"nsenter", "--net=" + lab.NetnsPath(st.Nodes[0].Netns)}, strings.Split(strings.TrimRight(string(argv), "\x00"), "\x00")...)
	if !strings.HasSuffix(args[2], "tendril-agent") {
		t.Fatalf("agent-node1's command line: %q", args)
	}
	logPath := filepath.Join(st.LogDir(), "agent-node1.log")
	if _, _, err := lab.StartDetached(st.PidDir(), "agent-node1", logPath, args); err != nil {
		t.Fatal(err)
	}
	selected := regexp.MustCompile(`"Pod CIDRs selected".* ipv4=(\S+) ipv4-from=(\S+)`)
	eventually(t, "the restarted agent to select its CIDR", func() (bool, error) {
		b, err := os.ReadFile(logPath)
		if err != nil {
			return false, err
		}
		m := selected.FindAllStringSubmatch(string(b), -1)
		if len(m) < 2 {
			return false, nil
		}
		last := m[len(m)-1]
		if last[1] != cidrs["node1"].String() || last[2] != "cluster-pool" {
			t.Fatalf("restarted agent selected %s from %s, want %s from cluster-pool", last[1], last[2], cidrs["node1"])
		}
		return true, nil
	})

	// The lab's summary shows the CIDRs the agents use: the TendrilNodes'.
	status, err := exec.Command(tendrilBin, "lab", "--name", name, "status").CombinedOutput()
	if err != nil {
		t.Fatalf("lab status: %v\n%s", err, status)
	}
	for _, n := range st.Nodes {
		if !regexp.MustCompile(`(?m)^` + n.Name + `\s+\S+\s+` + regexp.QuoteMeta(cidrs[n.Name].String()) + `\s`).Match(status) {
			t.Errorf("lab status does not show %s's cluster-pool CIDR %s:\n%s", n.Name, cidrs[n.Name], status)
		}
	}
	if !strings.Contains(string(status), "POD CIDR (cluster-pool)") {
		t.Errorf("lab status does not say the CIDRs come from the cluster pool:\n%s", status)
	}

	churn(t, name, &env{st: st, cs: c.Core, k8: c}, churnConfig{pods: 1000, wave: 200})

	poolExhaustedInAgentStatus(t, name, st, c)
}

// TestPrivilegedLabOperatorClusterPoolDual: a dual-stack lab (--ip-family
// dual) with --ipam cluster-pool. The operator gives each node an IPv4
// /24 of lab.ClusterPoolCIDR and an IPv6 /64 of lab.ClusterPoolCIDR6,
// disjoint; each agent selects both from its TendrilNode (not the Node's
// podCIDRs, which kube-controller-manager cuts from other ranges); each
// pod has an address of each family inside its node's CIDRs; and pods on
// the two nodes reach each other over IPv6.
func TestPrivilegedLabOperatorClusterPoolDual(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, labErr == nil, "no binaries for the lab")
	name, st, c := operatorLab(t, "opd", "tendril-operator: 1 replicas", "the operator",
		"--operators", "1", "--ipam", "cluster-pool", "--ip-family", "dual")
	ctx := context.Background()

	pool4, pool6 := netip.MustParsePrefix(lab.ClusterPoolCIDR), netip.MustParsePrefix(lab.ClusterPoolCIDR6)
	cidrs4, cidrs6 := map[string]netip.Prefix{}, map[string]netip.Prefix{}
	for _, n := range st.Nodes {
		tn, err := c.Tendril.TendrilV1alpha1().TendrilNodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil || len(tn.Spec.IPAM.PodCIDRs) != 2 {
			t.Fatalf("TendrilNode %s: want an IPv4 and an IPv6 pod CIDR: %v %v", n.Name, tn, err)
		}
		for _, s := range tn.Spec.IPAM.PodCIDRs {
			p := netip.MustParsePrefix(s)
			pool, bits, cidrs := pool4, 24, cidrs4
			if p.Addr().Is6() {
				pool, bits, cidrs = pool6, lab.ClusterPoolMaskSize6, cidrs6
			}
			if !pool.Contains(p.Addr()) || p.Bits() != bits {
				t.Fatalf("node %s CIDR %s is not a /%d of %s", n.Name, p, bits, pool)
			}
			for other, q := range cidrs {
				if q.Overlaps(p) {
					t.Fatalf("nodes %s and %s overlap: %s %s", other, n.Name, q, p)
				}
			}
			if _, twice := cidrs[n.Name]; twice {
				t.Fatalf("node %s has two CIDRs of a family: %v", n.Name, tn.Spec.IPAM.PodCIDRs)
			}
			cidrs[n.Name] = p
		}
	}
	// Each agent selected both from the cluster pool.
	selected := regexp.MustCompile(`"Pod CIDRs selected".* ipv4=(\S+) ipv4-from=(\S+) ipv6=(\S+) ipv6-from=(\S+)`)
	for _, n := range st.Nodes {
		b, err := os.ReadFile(filepath.Join(st.LogDir(), "agent-"+n.Name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		m := selected.FindStringSubmatch(string(b))
		if m == nil || m[1] != cidrs4[n.Name].String() || m[2] != "cluster-pool" || m[3] != cidrs6[n.Name].String() || m[4] != "cluster-pool" {
			t.Fatalf("agent of %s selected %q, want %s and %s from cluster-pool", n.Name, m, cidrs4[n.Name], cidrs6[n.Name])
		}
	}
	pods, err := c.Core.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 2 {
		t.Fatalf("pods %v %v", pods, err)
	}
	ip6 := map[string]netip.Addr{}
	for i := range pods.Items {
		p := &pods.Items[i]
		ip, six := netip.MustParseAddr(p.Status.PodIP), podIPv6(t, p)
		if !cidrs4[p.Spec.NodeName].Contains(ip) || !cidrs6[p.Spec.NodeName].Contains(six) {
			t.Fatalf("pod %s on %s has %s and %s, outside the node's %s and %s", p.Name, p.Spec.NodeName, ip, six,
				cidrs4[p.Spec.NodeName], cidrs6[p.Spec.NodeName])
		}
		ip6[p.Spec.NodeName] = six
	}
	if len(ip6) != 2 {
		t.Fatalf("the lab's two pods are not on two nodes: %v", ip6)
	}
	// IPv6 pod to pod across the nodes, both ways.
	for _, p := range pods.Items {
		for node, target := range ip6 {
			if node == p.Spec.NodeName {
				continue
			}
			eventually(t, p.Name+" pings "+target.String()+" on "+node, func() (bool, error) {
				out, err := exec.Command(tendrilBin, "lab", "--name", name, "ping", "default/"+p.Name, target.String(), "--count", "3").CombinedOutput()
				return err == nil, fmt.Errorf("%v: %s", err, out)
			})
		}
	}
}

// poolExhaustedInAgentStatus restarts the surviving operator with an
// IPv6 pool that holds one node CIDR: one node gets it, the other's
// TendrilNode gets PodCIDRsAllocated=False, and that node's agent says so
// in `tendril status` (a line and a degraded health module) while the
// other's reports the condition True.
func poolExhaustedInAgentStatus(t *testing.T, name string, st *lab.State, c *k8s.Clients) {
	ctx := context.Background()
	procs, err := lab.ReadProcesses(st.PidDir())
	if err != nil {
		t.Fatal(err)
	}
	var op lab.Process
	for _, p := range procs {
		if strings.HasPrefix(p.Role, "operator-") && syscall.Kill(p.PID, 0) == nil {
			op = p
		}
	}
	if op.PID == 0 {
		t.Fatalf("no operator left running: %v", procs)
	}
	argv, err := os.ReadFile("/proc/" + strconv.Itoa(op.PID) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimRight(string(argv), "\x00"), "\x00")
	// SIGTERM: the operator releases the Lease, so its successor leads at once.
	if err := syscall.Kill(op.PID, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the operator to exit", func() (bool, error) { return syscall.Kill(op.PID, 0) != nil, nil })
	args = append(args, "--cluster-pool-ipv6-cidr=fd00:245::/120", "--cluster-pool-ipv6-mask-size=120")
	if _, _, err := lab.StartDetached(st.PidDir(), op.Role, filepath.Join(st.LogDir(), op.Role+".log"), args); err != nil {
		t.Fatal(err)
	}
	conditions := map[string]metav1.ConditionStatus{}
	eventually(t, "one node with the IPv6 CIDR, the other with PodCIDRsAllocated=False", func() (bool, error) {
		falses := 0
		for _, n := range st.Nodes {
			tn, err := c.Tendril.TendrilV1alpha1().TendrilNodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			cond := meta.FindStatusCondition(tn.Status.Conditions, v1alpha1.NodeConditionPodCIDRsAllocated)
			if cond == nil {
				return false, fmt.Errorf("%s has no condition", n.Name)
			}
			conditions[n.Name] = cond.Status
			if cond.Status == metav1.ConditionFalse {
				falses++
			}
		}
		return falses == 1, fmt.Errorf("conditions %v", conditions)
	})
	// The lab's summary notes the condition beside the node's agent.
	labStatus, err := exec.Command(tendrilBin, "lab", "--name", name, "status").CombinedOutput()
	if err != nil {
		t.Fatalf("lab status: %v\n%s", err, labStatus)
	}
	for _, n := range st.Nodes {
		noted := regexp.MustCompile(`(?m)^` + n.Name + `\s.*serving \(TendrilNode PodCIDRsAllocated=False, PodCIDRPoolExhausted\)`).Match(labStatus)
		if noted != (conditions[n.Name] == metav1.ConditionFalse) {
			t.Errorf("lab status notes the exhausted pool for %s: %v, want %v:\n%s", n.Name, noted, !noted, labStatus)
		}
	}
	for _, n := range st.Nodes {
		exhausted := conditions[n.Name] == metav1.ConditionFalse
		eventually(t, n.Name+"'s agent to report its TendrilNode's condition", func() (bool, error) {
			out, err := exec.Command(tendrilBin, "-H", "unix://"+n.Socket, "status").CombinedOutput()
			if err != nil && !exhausted {
				return false, fmt.Errorf("%v: %s", err, out)
			}
			s := string(out)
			if exhausted {
				return strings.Contains(s, "POOL EXHAUSTED: PodCIDRsAllocated=False (PodCIDRPoolExhausted)") &&
					regexp.MustCompile(`cluster-pool\s+Degraded`).MatchString(s), errors.New(s)
			}
			return strings.Contains(s, "PodCIDRsAllocated=True (Allocated)") && !strings.Contains(s, "POOL EXHAUSTED"), errors.New(s)
		})
	}
}

// TestPrivilegedLabOperatorKVStore runs the churn on a lab whose agents
// and operator allocate identities in the lab's kvstore (lab up
// --kvstore): the operator collects the master and index keys of the
// gone pods' identities, and the agents' endpoint address keys go with
// their endpoints.
func TestPrivilegedLabOperatorKVStore(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, labErr == nil, "no binaries for the lab")
	name, st, c := operatorLab(t, "kv", "KVSTORE  etcd http://127.0.0.1:", "the kvstore",
		"--operators", "1", "--kvstore")
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{st.KVStoreURL()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	// 300 pods keep CI time; TENDRIL_E2E_KV_CHURN_PODS runs more (1,000
	// was run by hand: docs/benchmarks.md).
	pods := 300
	if v := os.Getenv("TENDRIL_E2E_KV_CHURN_PODS"); v != "" {
		if pods, err = strconv.Atoi(v); err != nil || pods < 1 {
			t.Fatalf("TENDRIL_E2E_KV_CHURN_PODS=%q: want a positive number", v)
		}
	}
	churn(t, name, &env{st: st, cs: c.Core, k8: c}, churnConfig{pods: pods, wave: min(pods, 200), kv: kv})
	// Identities lived in the kvstore only.
	ids, err := c.Tendril.TendrilV1alpha1().TendrilIdentities().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids.Items) != 0 {
		t.Errorf("%d TendrilIdentity objects in kvstore mode", len(ids.Items))
	}
}

// operatorLab brings up a lab of its own, named labName+suffix (at most
// 12 characters), of two nodes with a pod each, the given lab up options
// and short GC timing for the churn phase, torn down when the test ends.
// lab up's output must contain want (the report of what, for the failure).
func operatorLab(t *testing.T, suffix, want, what string, args ...string) (string, *lab.State, *k8s.Clients) {
	t.Helper()
	name := labName + suffix
	if len(name) > 12 {
		name = name[:12]
	}
	t.Cleanup(func() { _ = exec.Command(tendrilBin, "lab", "--name", name, "down").Run() })
	up := append([]string{"lab", "--name", name, "up", "--nodes", "2", "--pods-per-node", "1"}, args...)
	up = append(up, "--bin-dir", filepath.Dir(tendrilBin),
		"--operator-arg=--identity-gc-interval=2s", "--operator-arg=--identity-heartbeat-timeout=4s",
		"--operator-arg=--endpoint-gc-interval=2s")
	out, err := exec.Command(tendrilBin, up...).CombinedOutput()
	if err != nil {
		t.Fatalf("lab up: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), want) {
		t.Fatalf("lab up did not report %s:\n%s", what, out)
	}
	st, err := lab.LoadState(name)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := controlplane.RESTConfig(st.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := k8s.NewClientsForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return name, st, c
}
