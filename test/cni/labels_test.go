package cni_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	clientv3 "go.etcd.io/etcd/client/v3"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

// TestPrivilegedLabelChangeWhileAPIServerDown: in CRD identity mode a
// pod's labels change (app=cache to app=db) and its new identity cannot be
// created: first the API server refuses it (a ValidatingAdmissionPolicy
// on TendrilIdentity creation, so that the agent has seen the labels
// before the server goes), then the API server is stopped. The endpoint
// keeps failing and keeps its old identity and policy meanwhile (real
// traffic still reaches the port the new policy closes). The refusal is
// removed from etcd while the server is down; once the server is back the
// endpoint converges to the identity of its new labels and the policy
// that selects them, with no other event: the port the policy opens
// answers the web pod and the other no longer does.
func TestPrivilegedLabelChangeWhileAPIServerDown(t *testing.T) {
	testutil.Privileged(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env, err := startControlPlane(t, ctx)
	testutil.Require(t, err == nil, fmt.Sprintf("no control plane: %v", err))
	cs := env.Clientset()
	clients, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	td := clients.Tendril.TendrilV1alpha1()
	apiAddr := strings.TrimPrefix(env.RESTConfig().Host, "https://")

	n := newNode(t)
	forwardAPIServer(t, n.netns, apiAddr)
	var nodeErr error
	eventually(t, "the Node created", func() bool {
		_, nodeErr = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name},
			Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.41.0/24"}}}, metav1.CreateOptions{})
		return nodeErr == nil
	})
	for name, app := range map[string]string{"web": "web", "store": "cache"} {
		if _, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": app}},
			Spec:       corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: "c", Image: "none"}}}},
			metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n.start(t, "--kubeconfig", env.Kubeconfig(), "--identity-allocation-mode", "crd")

	list := n.confList("tendril-cni", "1.1.0", nil)
	web, store := n.newPod("web"), n.newPod("store")
	n.mustAdd(list, web)
	storeIP := ipv4Of(t, n.mustAdd(list, store))
	for _, port := range []string{"5432", "8080"} {
		ln := listenIn(t, store.netns, "0.0.0.0:"+port)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(c, "hello")
				c.Close()
			}
		}()
	}
	connects := func(port string) bool {
		c, err := dialFrom(web.netns, storeIP+":"+port)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
	n.importPolicy(t, `[{"endpointSelector":{"matchLabels":{"app":"db"}},"labels":["test=label-change"],
		"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"web"}}],"toPorts":[{"ports":[{"port":"5432","protocol":"TCP"}]}]}]}]`)

	storeEP := func() *models.Endpoint {
		ep, err := n.agent.EndpointGet(ctx, "pod-name:default/store")
		if err != nil {
			t.Fatalf("get the store endpoint: %v", err)
		}
		return ep
	}
	hasLabel := func(ep *models.Endpoint, l string) bool {
		for _, have := range ep.Status.Identity.Labels {
			if have == l {
				return true
			}
		}
		return false
	}
	var oldID int64
	eventually(t, "the store endpoint ready as app=cache", func() bool {
		ep := storeEP()
		oldID = ep.Status.Identity.ID
		return *ep.Status.State == models.EndpointStateReady && hasLabel(ep, "k8s:app=cache")
	})
	if !connects("8080") || !connects("5432") {
		t.Fatal("no policy selects app=cache yet, but web cannot connect to it")
	}

	// The API server refuses every new TendrilIdentity from now on.
	vap := &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "freeze-identities"},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule: admissionv1.Rule{APIGroups: []string{v1alpha1.GroupName}, APIVersions: []string{"*"}, Resources: []string{v1alpha1.ResourceIdentities}}}}}},
			Validations: []admissionv1.Validation{{Expression: "false", Message: "identities frozen by the test"}},
		}}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, vap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "freeze-identities"},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: vap.Name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny}}}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the API server refusing new identities", func() bool {
		probe := &v1alpha1.TendrilIdentity{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, SecurityLabels: map[string]string{"k8s:app": "probe"}}
		_, err := td.TendrilIdentities().Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "identities frozen")
	})

	if _, err := cs.CoreV1().Pods("default").Patch(ctx, "store", types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"app":"db"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// regen is the endpoint's regeneration status (nil from an agent that
	// does not report one: the test then judges by identity and traffic).
	regen := func(ep *models.Endpoint) *models.ControllerStatusStatus {
		if len(ep.Status.Controllers) == 0 {
			return nil
		}
		return ep.Status.Controllers[0].Status
	}
	recorded := func(ep *models.Endpoint) bool {
		for _, l := range ep.Status.Labels.SecurityRelevant {
			if l == "k8s:app=db" {
				return true
			}
		}
		return false
	}
	waitFailing := func(what, msg string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			ep := storeEP()
			if st := regen(ep); recorded(ep) && (st == nil || st.ConsecutiveFailureCount > 0 && strings.Contains(st.LastFailureMsg, msg)) {
				if ep.Status.Identity.ID != oldID {
					t.Fatalf("%s: the identity changed to %d while allocation fails", what, ep.Status.Identity.ID)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the endpoint never failed with %q: %+v", what, msg, regen(ep))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitFailing("refused", "identities frozen")

	// Stop the API server; while it is down the endpoint fails on, keeps
	// its old policy, and the refusal goes from etcd.
	restartAPIServerPinned(t, ctx, env, func() {
		if st := regen(storeEP()); st != nil {
			failures := st.FailureCount
			deadline := time.Now().Add(60 * time.Second)
			for regen(storeEP()).FailureCount <= failures {
				if time.Now().After(deadline) {
					t.Errorf("no regeneration attempt while the API server was down")
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		} else {
			time.Sleep(3 * time.Second)
		}
		if ep := storeEP(); ep.Status.Identity.ID != oldID {
			t.Errorf("identity changed to %d with the API server down", ep.Status.Identity.ID)
		}
		if !connects("8080") {
			t.Errorf("the old policy (none) no longer holds while the API server is down")
		}
		deleteAdmissionPolicies(t, env)
	})

	// No other event: the endpoint converges by itself.
	deadline := time.Now().Add(90 * time.Second)
	for {
		ep := storeEP()
		if st := regen(ep); hasLabel(ep, "k8s:app=db") && ep.Status.Identity.ID != oldID && *ep.Status.State == models.EndpointStateReady &&
			(st == nil || st.ConsecutiveFailureCount == 0) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the endpoint did not converge after the API server returned: %+v %+v", ep.Status.Identity, regen(ep))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := td.TendrilIdentities().Get(ctx, fmt.Sprint(storeEP().Status.Identity.ID), metav1.GetOptions{}); err != nil {
		t.Fatalf("the new identity is not a TendrilIdentity: %v", err)
	}
	eventually(t, "the db policy enforced: 5432 open to web", func() bool { return connects("5432") })
	eventually(t, "the db policy enforced: 8080 closed", func() bool { return !connects("8080") })
}

// restartAPIServerPinned restarts the API server from an OS thread that
// lives until the test ends: the server dies with the thread that started
// it (Pdeathsig), and the CNI harness ends the threads it runs plugins
// from.
func restartAPIServerPinned(t *testing.T, ctx context.Context, env *k8senv.Env, down func()) {
	t.Helper()
	res, stop := make(chan error, 1), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		res <- env.RestartAPIServer(ctx, down)
		<-stop
	}()
	t.Cleanup(func() { close(stop) })
	if err := <-res; err != nil {
		t.Fatalf("restart the API server: %v", err)
	}
}

// deleteAdmissionPolicies removes every ValidatingAdmissionPolicy and its
// bindings from etcd (the API server being down).
func deleteAdmissionPolicies(t *testing.T, env *k8senv.Env) {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{env.EtcdURL()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Delete(ctx, "/registry/validatingadmissionpolic", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("delete the admission policies from etcd: %v", err)
	}
	if resp.Deleted != 2 {
		t.Fatalf("deleted %d keys of admission policies from etcd, want the policy and its binding", resp.Deleted)
	}
}
