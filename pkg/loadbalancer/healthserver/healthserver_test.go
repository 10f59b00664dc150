package healthserver

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// TestHealthCheckNodePort: a service with externalTrafficPolicy Local gets
// a listener on its health check node port that answers 200 with the
// number of this node's ready backends, 503 without one, in kube-proxy's
// format; the listener closes when the policy goes back to Cluster.
func TestHealthCheckNodePort(t *testing.T) {
	tables, err := loadbalancer.NewTables(statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	w := loadbalancer.NewWriter(tables, "node-a")
	s := New(tables, "node-a", slog.New(slog.DiscardHandler))
	// Each health check port listens on a loopback port of its own.
	var mu sync.Mutex
	addrs := map[uint16]string{}
	s.listen = func(port uint16) (net.Listener, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			mu.Lock()
			addrs[port] = ln.Addr().String()
			mu.Unlock()
		}
		return ln, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	name := loadbalancer.ServiceName{Namespace: "ns", Name: "web"}
	svc := &loadbalancer.Service{Name: name, Type: "LoadBalancer", Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:                 []loadbalancer.ServicePort{{Name: "http", Port: 80, Proto: loadbalancer.TCP, NodePort: 30080}, {Name: "alt", Port: 81, Proto: loadbalancer.TCP, NodePort: 30081}},
		ExternalTrafficPolicy: loadbalancer.TrafficPolicyLocal, HealthCheckNodePort: 31000}
	if err := w.UpsertService(svc); err != nil {
		t.Fatal(err)
	}
	ask := func() (int, Response, error) {
		mu.Lock()
		addr, ok := addrs[31000]
		mu.Unlock()
		if !ok || len(s.Ports()) == 0 {
			return 0, Response{}, fmt.Errorf("not listening")
		}
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return 0, Response{}, err
		}
		defer resp.Body.Close()
		var r Response
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return 0, r, err
		}
		return resp.StatusCode, r, nil
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("the listener", func() bool { c, _, err := ask(); return err == nil && c != 0 })
	if code, r, _ := ask(); code != http.StatusServiceUnavailable || r.LocalEndpoints != 0 || r.Service.Name != "web" || !r.ServiceProxyHealthy {
		t.Fatalf("no backend: %d %+v, want 503 with 0", code, r)
	}
	// Two ready local addresses (each on two ports), one remote, one
	// terminating local: 2.
	var bes []*loadbalancer.Backend
	for _, b := range []struct {
		ip, node           string
		ready, terminating bool
	}{{"10.0.0.1", "node-a", true, false}, {"10.0.0.2", "node-a", true, false}, {"10.0.1.1", "node-b", true, false}, {"10.0.0.3", "node-a", false, true}} {
		for _, p := range []struct {
			name string
			port uint16
		}{{"http", 8080}, {"alt", 8081}} {
			bes = append(bes, &loadbalancer.Backend{Addr: netip.AddrPortFrom(netip.MustParseAddr(b.ip), p.port), Proto: loadbalancer.TCP, PortName: p.name,
				NodeName: b.node, Ready: b.ready, Serving: b.ready || b.terminating, Terminating: b.terminating})
		}
	}
	if err := w.SetBackends(name, "slice", bes); err != nil {
		t.Fatal(err)
	}
	if code, r, err := ask(); err != nil || code != http.StatusOK || r.LocalEndpoints != 2 {
		t.Fatalf("two local backends: %d %+v %v, want 200 with 2", code, r, err)
	}
	// externalTrafficPolicy Cluster: the port closes.
	cluster := *svc
	cluster.ExternalTrafficPolicy, cluster.HealthCheckNodePort = loadbalancer.TrafficPolicyCluster, 0
	if err := w.UpsertService(&cluster); err != nil {
		t.Fatal(err)
	}
	waitFor("the listener to close", func() bool { return len(s.Ports()) == 0 })
	mu.Lock()
	addr := addrs[31000]
	mu.Unlock()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("the health check port still answers after the policy went back to Cluster")
	}
}

// TestOtherServicesCostNothing: changes of services without a health
// check node port do not make the server read services (it used to read
// every service on every change of any).
func TestOtherServicesCostNothing(t *testing.T) {
	tables, err := loadbalancer.NewTables(statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	w := loadbalancer.NewWriter(tables, "node-a")
	s := New(tables, "node-a", slog.New(slog.DiscardHandler))
	s.listen = func(uint16) (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
	plain := func(i int) *loadbalancer.Service {
		return &loadbalancer.Service{Name: loadbalancer.ServiceName{Namespace: "ns", Name: fmt.Sprintf("plain-%d", i)}, Type: "ClusterIP",
			Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports:     []loadbalancer.ServicePort{{Name: "http", Port: 80, Proto: loadbalancer.TCP}}}
	}
	for i := 0; i < 500; i++ {
		if err := w.UpsertService(plain(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.UpsertService(&loadbalancer.Service{Name: loadbalancer.ServiceName{Namespace: "ns", Name: "web"}, Type: "LoadBalancer",
		Addresses:             []netip.Addr{netip.MustParseAddr("10.97.0.10")},
		Ports:                 []loadbalancer.ServicePort{{Name: "http", Port: 80, Proto: loadbalancer.TCP, NodePort: 30080}},
		ExternalTrafficPolicy: loadbalancer.TrafficPolicyLocal, HealthCheckNodePort: 31000}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(10 * time.Second); len(s.Ports()) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the health check port did not open")
		}
	}
	before := s.examined.Load()
	if before != 1 {
		t.Errorf("first pass read %d services, want the 1 health-checked one", before)
	}
	for i := 0; i < 500; i++ {
		svc := plain(i)
		svc.Ports[0].Port = 81
		if err := w.UpsertService(svc); err != nil {
			t.Fatal(err)
		}
		if err := w.DeleteService(svc.Name); err != nil {
			t.Fatal(err)
		}
	}
	// Give a woken loop the time to run: it must not have.
	time.Sleep(50 * time.Millisecond)
	if n := s.examined.Load() - before; n != 0 {
		t.Fatalf("1,000 changes of other services made the server read %d services, want 0", n)
	}
}
