package kvsync

import (
	"context"
	"encoding/json"
	"github.com/tendril-net/tendril/pkg/kvstore/kvembed"
	"github.com/tendril-net/tendril/pkg/operator/operatortest"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/operator/kvstoreclient"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/operator/status"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var env k8senv.Package

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, k8senv.Options{}, operatortest.InstallCRDs))
}

// TestSyncServicesAndNodes: a Service with an EndpointSlice and a Node
// with its TendrilNode appear as keys; an endpoint turning unready, a
// deleted Service and a stale key left by a previous leader are followed.
func TestSyncServicesAndNodes(t *testing.T) {
	e := env.Need(t)
	c, err := k8s.NewClientsForConfig(e.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := kvembed.Start(ctx, kvembed.Config{Dir: t.TempDir(), UnsafeNoFsync: true}, operatortest.Quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Stop(context.Background()) }()
	cfg := kvstore.DefaultConfig()
	cfg.Endpoints = srv.Endpoints()
	kv, err := kvstore.Connect(ctx, cfg, operatortest.Quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = kv.Close(context.Background()) }()
	// A previous leader's key for a service gone meanwhile.
	if err := kv.Update(ctx, ServicesPrefix+"default/default/gone", []byte("{}"), kvstore.NoLease); err != nil {
		t.Fatal(err)
	}
	// Objects.
	svc, err := c.Core.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Annotations: map[string]string{AnnotationGlobal: "true"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.1.0.6"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}}}
	es, err = c.Core.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Core.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.11"}}
	if _, err := c.Core.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Tendril.TendrilV1alpha1().TendrilNodes().Create(ctx, &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Spec: v1alpha1.NodeSpec{Addresses: []v1alpha1.NodeAddress{{Type: "TendrilInternalIP", IP: "10.1.0.1"}}, IPAM: v1alpha1.IPAMSpec{PodCIDRs: []string{"10.1.0.0/24"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	res, build := resourcesForTest(t, c)
	s, err := New(DefaultConfig(), operatortest.Quiet(), kvstoreclient.ForClient(kv), res)
	if err != nil {
		t.Fatal(err)
	}
	build()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, &status.Reports{}) }()

	readService := func() (ClusterService, bool) {
		kvp, found, err := kv.Get(ctx, ServicesPrefix+"default/default/web")
		var cs ClusterService
		if err != nil || !found || json.Unmarshal(kvp.Value, &cs) != nil {
			return cs, false
		}
		return cs, true
	}
	operatortest.WaitFor(t, "the service key with both backends", 30*time.Second, func() bool {
		cs, ok := readService()
		return ok && len(cs.Backends) == 2 && cs.Shared && cs.Frontends[svc.Spec.ClusterIP]["http"].Port == 80 && cs.Backends["10.1.0.5"]["http"].Port == 8080
	})
	operatortest.WaitFor(t, "the node key", 30*time.Second, func() bool {
		kvp, found, err := kv.Get(ctx, NodesPrefix+"default/node-1")
		var cn ClusterNode
		return err == nil && found && json.Unmarshal(kvp.Value, &cn) == nil && len(cn.PodCIDRs) == 1 && cn.PodCIDRs[0] == "10.1.0.0/24" && len(cn.Addresses) == 2
	})
	operatortest.WaitFor(t, "the stale key removed", 30*time.Second, func() bool {
		_, found, err := kv.Get(ctx, ServicesPrefix+"default/default/gone")
		return err == nil && !found
	})
	// A backend turns unready.
	es.Endpoints[1].Conditions.Ready = ptr.To(false)
	if _, err := c.Core.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	operatortest.WaitFor(t, "the unready backend dropped", 30*time.Second, func() bool { cs, ok := readService(); return ok && len(cs.Backends) == 1 })
	// The Service goes, its key with it.
	if err := c.Core.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	operatortest.WaitFor(t, "the service key removed", 30*time.Second, func() bool { _, ok := readService(); return !ok })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func resourcesForTest(t *testing.T, c *k8s.Clients) (*resources.Resources, func()) {
	res, start, stop, err := resources.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return res, func() {
		if err := start(context.Background(), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
}
