package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/connectivity"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// TestPrivilegedConnectivityTest runs `tendril connectivity test` against
// the package's lab: every check passes and the table says so.
func TestPrivilegedConnectivityTest(t *testing.T) {
	labUp(t)
	out, err := exec.Command(tendrilBin, "connectivity", "test", "--lab", labName).CombinedOutput()
	t.Logf("tendril connectivity test:\n%s", out)
	if err != nil {
		t.Fatalf("connectivity test failed: %v", err)
	}
	m := regexp.MustCompile(`(\d+) checks: (\d+) passed, 0 failed`).FindStringSubmatch(string(out))
	if m == nil || m[1] != m[2] || m[1] != "59" {
		t.Fatalf("no all-passed summary in the output")
	}
	for _, want := range []string{"pod to pod, other node, TCP", "pod to host, other node", "other client denied, other node", "egress to TCP 80 denied", "connectivity restored",
		"ClusterIP, other node, UDP", "ClusterIP balances over both backends", "sessionAffinity ClientIP: one backend",
		"internalTrafficPolicy Local, node 2, UDP", "other client denied via the ClusterIP",
		"Service by DNS name, other node, UDP", "Service by FQDN, DNS over TCP", "kubernetes Service by name (TLS), other node",
		"ClusterIP by per-packet NAT, other node, TCP", "NodePort on the node's address, UDP, node 2", "NodePort by per-packet NAT, TCP", "Service by DNS name by per-packet NAT, UDP", "egress policy without DNS: the name fails",
		"pod to world leaves with node 1's address, TCP", "pod to world leaves with node 2's address, UDP", "pod to world, node 2, ICMP",
		"world to NodePort, externalTrafficPolicy Local, node 2, UDP: its own server", "world to NodePort, externalTrafficPolicy Cluster, node 1, TCP: local and remote servers", "world to a hostPort of the server on node 2, UDP",
		"world to a LoadBalancer address on-link (L2 announcement), TCP: both servers"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks check %q", want)
		}
	}
}

// TestPrivilegedConnectivityDenyPolicyRemoved runs the connectivity test
// with the lab's prober, but deletes the TendrilNetworkPolicy in the
// middle of the first denied check's window: after that check's first
// dropped probe, until the other client connects again. The check must
// fail (one dropped probe is no denial); the policy is then put back, and
// every other check passes.
func TestPrivilegedConnectivityDenyPolicyRemoved(t *testing.T) {
	e := labUp(t)
	cfg, err := connectivity.LabConfig(e.st, connectivity.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	p := &policyRemover{t: t, inner: connectivity.LabProber{State: e.st}, k8: e.k8,
		ns: cfg.Namespace, policy: "servers-admit-client", from: cfg.Namespace + "/other-client"}
	var out bytes.Buffer
	results, err := connectivity.Test(context.Background(), e.k8, p, cfg, &out)
	connectivity.PrintTable(&out, results)
	t.Logf("connectivity test with the policy removed mid-check:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if p.state != removerDone {
		t.Fatalf("the policy was never removed in a denied check's window (state %d)", p.state)
	}
	const victim = "other client denied, same node"
	for _, r := range results {
		switch {
		case r.Name == victim && r.Passed:
			t.Errorf("%s passed although its policy was deleted in its window", victim)
		case r.Name == victim && !strings.Contains(r.Last, "connected after 1 dropped probe"):
			t.Errorf("%s failed for another reason: %s", victim, r.Last)
		case r.Name != victim && !r.Passed:
			t.Errorf("%s failed: %s", r.Name, r.Last)
		}
	}
}

const (
	removerArmed = iota
	removerRemoved
	removerDone
)

// policyRemover is a connectivity.Prober that, at the first probe from
// `from` over TCP dropped while `policy` exists, deletes the policy and
// waits until that probe connects; at the next probe, it puts the policy
// back and waits until it holds again.
type policyRemover struct {
	t          *testing.T
	inner      connectivity.Prober
	k8         *k8s.Clients
	ns, policy string
	from       string

	state int
	saved *v1alpha1.TendrilNetworkPolicy
	addr  string
	opts  connectivity.ProbeOptions
}

func (p *policyRemover) Probe(ctx context.Context, pod, addr string, opts connectivity.ProbeOptions, timeout time.Duration) (string, error) {
	answer, err := p.inner.Probe(ctx, pod, addr, opts, timeout)
	tnps := p.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(p.ns)
	switch p.state {
	case removerArmed:
		if pod != p.from || opts.UDP || !errors.Is(err, connectivity.ErrDropped) {
			return answer, err
		}
		pol, getErr := tnps.Get(ctx, p.policy, metav1.GetOptions{})
		if apierrors.IsNotFound(getErr) {
			return answer, err
		}
		if getErr != nil {
			p.t.Errorf("get policy: %v", getErr)
			return answer, err
		}
		if delErr := tnps.Delete(ctx, p.policy, metav1.DeleteOptions{}); delErr != nil {
			p.t.Errorf("delete policy: %v", delErr)
			return answer, err
		}
		p.t.Logf("policy %s deleted after a dropped probe %s -> %s", p.policy, pod, addr)
		p.saved, p.addr, p.opts, p.state = pol, addr, opts, removerRemoved
		eventually(p.t, "the policy's removal to let "+pod+" reach "+addr, func() (bool, error) {
			_, err := p.inner.Probe(ctx, pod, addr, opts, timeout)
			return err == nil, err
		})
	case removerRemoved:
		restore := p.saved.DeepCopy()
		restore.ResourceVersion, restore.UID = "", ""
		if _, cErr := tnps.Create(ctx, restore, metav1.CreateOptions{}); cErr != nil {
			p.t.Errorf("put the policy back: %v", cErr)
			return answer, err
		}
		p.state = removerDone
		eventually(p.t, "the policy to hold again", func() (bool, error) {
			_, err := p.inner.Probe(ctx, p.from, p.addr, p.opts, timeout)
			return errors.Is(err, connectivity.ErrDropped), err
		})
	}
	return answer, err
}

func (p *policyRemover) Ping(ctx context.Context, pod, ip string, timeout time.Duration) error {
	return p.inner.Ping(ctx, pod, ip, timeout)
}

func (p *policyRemover) Dial(ctx context.Context, pod, addr string, timeout time.Duration) error {
	return p.inner.Dial(ctx, pod, addr, timeout)
}
