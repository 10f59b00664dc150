package cni_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/pkg/namedns"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

// startControlPlane starts the API server and etcd from an OS thread that
// lives until the test ends: they die with the thread that started them
// (Pdeathsig), and the CNI harness ends the threads it runs plugins from.
func startControlPlane(t *testing.T, ctx context.Context) (*k8senv.Env, error) {
	type result struct {
		env *k8senv.Env
		err error
	}
	started, stop, stopped := make(chan result, 1), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		env, err := k8senv.Start(ctx, k8senv.Options{})
		started <- result{env, err}
		if err != nil {
			return
		}
		<-stop
		env.Stop()
	}()
	r := <-started
	t.Cleanup(func() {
		close(stop)
		<-stopped
	})
	return r.env, r.err
}

// inNetnsDo runs fn on an OS thread switched into the network namespace at
// path, then switches the thread back. The thread must not exit: the
// control plane's processes die with the thread that started them
// (Pdeathsig), which may be any of the process's threads.
func inNetnsDo(path string, fn func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter %s: %w", path, err)
			return
		}
		fn()
		if err := netns.Set(orig); err != nil {
			// Stuck in the other namespace: let the thread go with the
			// goroutine rather than reuse it.
			errc <- fmt.Errorf("leave %s: %w", path, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	return <-errc
}

// listenIn opens a TCP listener inside the network namespace at path: the
// socket belongs to the namespace it was created in, whichever thread
// accepts on it later.
func listenIn(t *testing.T, path, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	var err error
	if nerr := inNetnsDo(path, func() { ln, err = net.Listen("tcp", addr) }); nerr != nil {
		t.Fatal(nerr)
	}
	if err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, path, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dialFrom connects to addr from inside the network namespace at path.
func dialFrom(path, addr string) (net.Conn, error) {
	var c net.Conn
	var err error
	if nerr := inNetnsDo(path, func() { c, err = net.DialTimeout("tcp", addr, 2*time.Second) }); nerr != nil {
		return nil, nerr
	}
	return c, err
}

// forwardAPIServer makes the API server, which listens on the host's
// loopback only, reachable at the same address inside the node's
// namespace (namedns.ForwardInto), for the test's lifetime.
func forwardAPIServer(t *testing.T, netnsPath, addr string) {
	t.Helper()
	ln, err := namedns.ForwardInto(netnsPath, addr)
	if err != nil {
		t.Fatalf("forward %s into %s: %v", addr, netnsPath, err)
	}
	t.Cleanup(func() { ln.Close() })
}

// TestPrivilegedServiceTrafficPerPacket: a ClusterIP service written by
// the agent from a real API server's Service and EndpointSlice carries a
// client pod's TCP connection to the backend pod through the pod
// programs' per-packet NAT (socket LB off), with the reply from the
// frontend's address.
func TestPrivilegedServiceTrafficPerPacket(t *testing.T) {
	testutil.Privileged(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := startControlPlane(t, ctx)
	testutil.Require(t, err == nil, fmt.Sprintf("no control plane: %v", err))
	cs := env.Clientset()
	apiAddr := strings.TrimPrefix(env.RESTConfig().Host, "https://")

	// The node, as startNode builds it, with the API server forwarded in.
	n := newNode(t)
	forwardAPIServer(t, n.netns, apiAddr)

	// The API server may still be settling right after /readyz: retry.
	var nodeErr error
	eventually(t, "the Node created", func() bool {
		_, nodeErr = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name},
			Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.40.0/24"}}}, metav1.CreateOptions{})
		if nodeErr != nil {
			t.Logf("create the Node: %v", nodeErr)
		}
		return nodeErr == nil
	})
	n.start(t, "--kubeconfig", env.Kubeconfig())

	list := n.confList("tendril-cni", "1.1.0", nil)
	clientPod, backendPod := n.newPod("client"), n.newPod("backend")
	clientIP := ipv4Of(t, n.mustAdd(list, clientPod))
	backendIP := ipv4Of(t, n.mustAdd(list, backendPod))
	ln := listenIn(t, backendPod.netns, "0.0.0.0:8080")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "backend saw %s\n", c.RemoteAddr())
			c.Close()
		}
	}()

	svc, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "echo-1", Labels: map[string]string{discoveryv1.LabelServiceName: "echo"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{backendIP}, NodeName: ptr.To(n.name), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	frontend := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80).String()
	eventually(t, "the frontend realized by the agent", func() bool {
		var out []*models.Service
		if err := n.agent.Do(ctx, http.MethodGet, "/service", nil, nil, nil, &out); err != nil {
			return false
		}
		for _, s := range out {
			if s.Spec.FrontendAddress.IP == svc.Spec.ClusterIP && s.Status.Realized != nil && len(s.Spec.BackendAddresses) == 1 {
				return true
			}
		}
		return false
	})

	for i := range 5 {
		c, err := dialFrom(clientPod.netns, frontend)
		if err != nil {
			t.Fatalf("connection %d to %s from the client pod: %v\nagent log:\n%s", i, frontend, err, n.logs)
		}
		if got := c.RemoteAddr().String(); got != frontend {
			t.Errorf("connection's peer %s, want the frontend %s", got, frontend)
		}
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			t.Fatalf("read from %s: %v", frontend, err)
		}
		// The backend sees the client pod's own address: no SNAT.
		if !strings.HasPrefix(string(b), "backend saw "+clientIP+":") {
			t.Fatalf("answer %q, want the backend naming the client %s", b, clientIP)
		}
	}
}

func ipv4Of(t *testing.T, res *current.Result) string {
	t.Helper()
	for _, ip := range res.IPs {
		if ip.Address.IP.To4() != nil {
			return ip.Address.IP.String()
		}
	}
	t.Fatalf("pod has no IPv4 address: %+v", res)
	return ""
}
