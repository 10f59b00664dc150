// Package k8s_test runs the tendril-agent binary against a real
// kube-apiserver and etcd (pkg/testutil/k8senv): start-up in Kubernetes
// mode, the cache-sync timeout, CRD installation, pod CIDR selection and
// write-back, endpoint labels from pods and namespaces, and Tendril
// policies from CRDs. The agent runs without its datapath here (no root
// needed); the datapath is covered by test/cni and the lab.
package k8s_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/node"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/binaries"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var (
	builder  *binaries.Builder
	env      *k8senv.Env
	startErr error
)

func TestMain(m *testing.M) {
	// The sockets' child process of sockterm_test.go: no control plane.
	if os.Getenv(socketsHelperEnv) != "" {
		os.Exit(socketsHelperMain())
	}
	if os.Getenv(lrpHelperEnv) != "" {
		os.Exit(lrpHelperMain())
	}
	env, startErr = k8senv.Start(context.Background(), k8senv.Options{})
	code := binaries.Run(m, &builder)
	if env != nil {
		env.Stop()
	}
	os.Exit(code)
}

type agent struct {
	cmd    *exec.Cmd
	logs   *testutil.SyncBuffer
	api    *client.Client
	exited chan error
}

func startAgent(t *testing.T, nodeName string, extra ...string) *agent {
	t.Helper()
	bin, err := builder.Build("tendril-agent")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	args := append([]string{
		"--kubeconfig", env.Kubeconfig(), "--node-name", nodeName,
		"--state-dir", filepath.Join(dir, "state"), "--socket", sock, "--bpf-root", "/sys/fs/bpf/tendril-k8s-test-unused",
		"--enable-datapath=false", "--install-host-networking=false", "--prometheus-serve-addr=",
		// The agent runs in the machine's own network namespace: with the
		// datapath on (extra), the host programs (masquerade, services
		// from outside) would attach to the machine's uplink and reserve
		// its ports.
		"--enable-masquerade=false", "--enable-node-port=false",
		// Node health would probe the test's Nodes' made-up addresses
		// from the machine's own namespace, and take port 4240 there.
		"--enable-health-checking=false",
	}, extra...)
	a := &agent{cmd: exec.Command(bin, args...), logs: &testutil.SyncBuffer{}, exited: make(chan error, 1)}
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.exited <- a.cmd.Wait() }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Kill()
		<-a.exited
		if t.Failed() {
			t.Logf("agent log:\n%s", a.logs.String())
		}
	})
	if a.api, err = client.New(sock); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *agent) waitServing(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var st ext.StatusResponse
		if err := a.api.Do(context.Background(), http.MethodGet, "/healthz", nil, nil, nil, &st); err == nil {
			return
		}
		select {
		case err := <-a.exited:
			t.Fatalf("agent exited: %v\n%s", err, a.logs.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("agent not serving after 2m:\n%s", a.logs.String())
}

func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last error: %v)", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func section(st *ext.StatusResponse, title, key string) string {
	if st.Tendril == nil {
		return ""
	}
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

// TestAgentInKubernetes runs in order, on one API server: first without
// the CRDs (the cache-sync timeout), then a full agent.
func TestAgentInKubernetes(t *testing.T) {
	testutil.Require(t, startErr == nil, fmt.Sprintf("no control plane: %v", startErr))
	clients, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	cs, td := clients.Core, clients.Tendril.TendrilV1alpha1()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nodeObj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a",
		Annotations: map[string]string{node.AnnotationIPv6PodCIDR: "fd00:a::/112"}},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.7.0/24"}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, nodeObj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("cache sync timeout exits naming the resources", func(t *testing.T) {
		a := startAgent(t, "node-a", "--k8s-install-crds=false", "--k8s-cache-sync-timeout=3s")
		select {
		case err := <-a.exited:
			a.exited <- err // for the cleanup
			if err == nil {
				t.Fatalf("agent exited 0; log:\n%s", a.logs.String())
			}
			want := "kubernetes caches not synced after 3s: tendrilclusterwidenetworkpolicies, tendrilendpoints, tendrilidentities, tendrilloadbalancerippools, tendrillocalredirectpolicies, tendrilnetworkpolicies, tendrilnodes"
			if !strings.Contains(a.logs.String(), want) {
				t.Fatalf("agent log lacks %q:\n%s", want, a.logs.String())
			}
		case <-time.After(time.Minute):
			t.Fatal("agent still running a minute after a 3s cache-sync timeout")
		}
	})

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"team": "blue"}}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop",
		Labels: map[string]string{"app": "web", "pod-template-hash": "abc123"}},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "web-sa", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	if _, err := cs.CoreV1().Pods("shop").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	a := startAgent(t, "node-a", "--ipv4-range", "10.99.0.0/24")
	a.waitServing(t)

	t.Run("status shows Kubernetes", func(t *testing.T) {
		var st ext.StatusResponse
		if err := a.api.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
			t.Fatal(err)
		}
		if v := section(&st, "Kubernetes", "API server"); !strings.HasPrefix(v, "Ok ") {
			t.Errorf("API server line %q", v)
		}
		if v := section(&st, "Kubernetes", "Resources"); v != "13/13 synced" {
			t.Errorf("resources line %q", v)
		}
		if v := section(&st, "Identities", "Allocation"); v != "crd (TendrilIdentity objects)" {
			t.Errorf("identity allocation line %q", v)
		}
		// Spec beats the flag for IPv4; the annotation gives IPv6.
		if v := section(&st, "Kubernetes", "Pod CIDRs"); v != "10.244.7.0/24 (from node-spec), fd00:a::/112 (from annotation)" {
			t.Errorf("pod CIDRs line %q", v)
		}
	})

	t.Run("IPAM uses the selected CIDRs and they are written back", func(t *testing.T) {
		res, err := a.api.IPAMAllocate(ctx, "ipv4", "shop/x", false)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(res.Address.IPV4, "10.244.7.") {
			t.Fatalf("allocated %s outside the node's spec CIDR", res.Address.IPV4)
		}
		eventually(t, "the TendrilNode", func() (bool, error) {
			tn, err := td.TendrilNodes().Get(ctx, "node-a", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return fmt.Sprint(tn.Spec.IPAM.PodCIDRs) == "[10.244.7.0/24 fd00:a::/112]", fmt.Errorf("spec %+v", tn.Spec)
		})
		n, err := cs.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Annotations[node.AnnotationIPv4PodCIDR] != "10.244.7.0/24" || n.Annotations[node.AnnotationIPv4Router] == "" {
			t.Fatalf("node annotations %v", n.Annotations)
		}
	})

	t.Run("peer nodes reach the node manager", func(t *testing.T) {
		peer := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.8.0/24"}}}
		created, err := cs.CoreV1().Nodes().Create(ctx, peer, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.30.0.12"}}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "one peer in status", func() (bool, error) {
			var st ext.StatusResponse
			if err := a.api.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
				return false, err
			}
			v := section(&st, "Kubernetes", "Nodes")
			return v == "1 peers", fmt.Errorf("nodes line %q", v)
		})
		if err := cs.CoreV1().Nodes().Delete(ctx, "node-b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "no peer in status", func() (bool, error) {
			var st ext.StatusResponse
			if err := a.api.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
				return false, err
			}
			v := section(&st, "Kubernetes", "Nodes")
			return v == "0 peers", fmt.Errorf("nodes line %q", v)
		})
	})

	t.Run("endpoint labels follow the pod and its namespace", func(t *testing.T) {
		ep, err := a.api.EndpointPut(ctx, "0", &models.EndpointChangeRequest{
			ContainerID: "c0ffee", K8sNamespace: "shop", K8sPodName: "web", InterfaceName: "tdr0",
			Addressing: &models.AddressPair{IPV4: "10.244.7.20"}, Labels: models.Labels{"k8s:ignored=yes"},
		})
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprint(ep.ID)
		labelsOf := func() (string, error) {
			got, err := a.api.EndpointGet(ctx, id)
			if err != nil {
				return "", err
			}
			if got.Status == nil || got.Status.Labels == nil {
				return "", fmt.Errorf("no labels")
			}
			return strings.Join(got.Status.Labels.SecurityRelevant, ","), nil
		}
		want := "k8s:app=web,k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=shop,k8s:io.cilium.k8s.namespace.labels.team=blue,k8s:io.cilium.k8s.policy.serviceaccount=web-sa,k8s:io.kubernetes.pod.namespace=shop"
		eventually(t, "labels from the pod", func() (bool, error) { l, err := labelsOf(); return l == want, fmt.Errorf("%s %v", l, err) })

		patch := []byte(`{"metadata":{"labels":{"app":"web2"}}}`)
		if _, err := cs.CoreV1().Pods("shop").Patch(ctx, "web", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		want = strings.Replace(want, "app=web,", "app=web2,", 1)
		eventually(t, "the pod's new label", func() (bool, error) { l, err := labelsOf(); return l == want, fmt.Errorf("%s %v", l, err) })

		patch = []byte(`{"metadata":{"labels":{"team":"red"}}}`)
		if _, err := cs.CoreV1().Namespaces().Patch(ctx, "shop", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		want = strings.Replace(want, "team=blue", "team=red", 1)
		eventually(t, "the namespace's new label", func() (bool, error) { l, err := labelsOf(); return l == want, fmt.Errorf("%s %v", l, err) })
	})

	t.Run("local endpoints are published as TendrilEndpoints", func(t *testing.T) {
		eventually(t, "the TendrilEndpoint of shop/web", func() (bool, error) {
			tep, err := td.TendrilEndpoints("shop").Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			n := tep.Status.Networking
			return n != nil && len(n.Addressing) == 1 && n.Addressing[0].IPv4 == "10.244.7.20" && n.NodeIP == "10.244.7.1",
				fmt.Errorf("status %+v", tep.Status)
		})
		eps, err := a.api.EndpointList(ctx)
		if err != nil || len(eps) != 1 {
			t.Fatalf("endpoints %v %v", eps, err)
		}
		if err := a.api.EndpointDelete(ctx, fmt.Sprint(eps[0].ID)); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the TendrilEndpoint deleted with the endpoint", func() (bool, error) {
			_, err := td.TendrilEndpoints("shop").Get(ctx, "web", metav1.GetOptions{})
			return err != nil, err
		})
	})

	t.Run("Tendril policies from CRDs", func(t *testing.T) {
		policyCount := func() (int, string) {
			var pol models.Policy
			if err := a.api.Do(ctx, http.MethodGet, "/policy", nil, nil, nil, &pol); err != nil {
				return -1, err.Error()
			}
			// Rule labels are {key, value, source} objects: count the rules
			// carrying a policy name, and put the labels' string forms in
			// front of the document for the checks below.
			var rules api.Rules
			if err := json.Unmarshal([]byte(pol.Policy), &rules); err != nil {
				return -1, err.Error()
			}
			n, forms := 0, []string{}
			for _, r := range rules {
				for _, l := range r.Labels {
					if l.Key == "io.cilium.k8s.policy.name" {
						n++
					}
				}
				forms = append(forms, r.Labels.Strings()...)
			}
			return n, strings.Join(forms, " ") + "\n" + pol.Policy
		}
		// Its own label, in the CiliumNetworkPolicy form the CRD schema
		// takes, is kept beside the agent's origin labels.
		good := &v1alpha1.TendrilNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow-web", Namespace: "shop"},
			Spec: &api.Rule{EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "web2"}},
				Labels:  api.LabelArray{{Source: "unspec", Key: "team", Value: "shop-owners"}},
				Ingress: []api.IngressRule{{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "client"}}}}}}}
		if _, err := td.TendrilNetworkPolicies("shop").Create(ctx, good, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the policy in the agent", func() (bool, error) {
			n, doc := policyCount()
			return n == 1 && strings.Contains(doc, "io.cilium.k8s.policy.namespace=shop") && strings.Contains(doc, "unspec:team=shop-owners"), fmt.Errorf("%s", doc)
		})
		eventually(t, "Valid=True on the policy", func() (bool, error) {
			p, err := td.TendrilNetworkPolicies("shop").Get(ctx, "allow-web", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return apimeta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionValid), fmt.Errorf("%+v", p.Status)
		})
		// The node's own report: imported, enforced on every local
		// endpoint, at the revision that imported it.
		eventually(t, "the node's report on the policy", func() (bool, error) {
			p, err := td.TendrilNetworkPolicies("shop").Get(ctx, "allow-web", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			n, ok := p.Status.Nodes["node-a"]
			return ok && n.OK && n.Enforcing && n.LocalPolicyRevision > 0 && n.ObservedGeneration == p.Generation && len(p.Status.Nodes) == 1,
				fmt.Errorf("%+v", p.Status)
		})

		// Passes the server's schema, fails the agent's validation: the
		// policy is rejected whole and its status says why.
		bad := &v1alpha1.TendrilClusterwideNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bad-cidr"},
			Spec: &api.Rule{EndpointSelector: &api.EndpointSelector{},
				Egress: []api.EgressRule{{ToCIDR: []string{"10.0.0.0/8"}}, {ToCIDR: []string{"not-a-cidr"}}}}}
		if _, err := td.TendrilClusterwideNetworkPolicies().Create(ctx, bad, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "Valid=False on the bad policy", func() (bool, error) {
			p, err := td.TendrilClusterwideNetworkPolicies().Get(ctx, "bad-cidr", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			c := apimeta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionValid)
			n := p.Status.Nodes["node-a"]
			return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "not-a-cidr") &&
				!n.OK && !n.Enforcing && strings.Contains(n.Error, "not-a-cidr"), fmt.Errorf("%+v", p.Status)
		})
		if n, doc := policyCount(); n != 1 {
			t.Fatalf("a rejected policy left rules behind: %s", doc)
		}

		if err := td.TendrilNetworkPolicies("shop").Delete(ctx, "allow-web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the policy gone from the agent", func() (bool, error) { n, doc := policyCount(); return n == 0, fmt.Errorf("%s", doc) })

		// A Kubernetes NetworkPolicy goes the same way, translated.
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default-deny", Namespace: "shop"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
		if _, err := cs.NetworkingV1().NetworkPolicies("shop").Create(ctx, np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the NetworkPolicy in the agent", func() (bool, error) {
			n, doc := policyCount()
			return n == 1 && strings.Contains(doc, "derived-from=NetworkPolicy"), fmt.Errorf("%s", doc)
		})
		if err := cs.NetworkingV1().NetworkPolicies("shop").Delete(ctx, "default-deny", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the NetworkPolicy gone", func() (bool, error) { n, doc := policyCount(); return n == 0, fmt.Errorf("%s", doc) })
	})
}
