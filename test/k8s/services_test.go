package k8s_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// lbState is what the pinned LB maps hold for one frontend.
type lbState struct {
	found    bool
	svc      maps.Service
	backends []string // slot order: address:port(state)
	ids      []uint32
	maglev   bool
}

func readFrontend(t *testing.T, root string, fe maps.Frontend) lbState {
	t.Helper()
	m, err := maps.OpenPinnedLB(root, true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, ok, err := m.ServiceMap().Lookup(fe)
	if err != nil || !ok {
		return lbState{}
	}
	st := lbState{found: true, svc: s}
	ids, err := m.SlotMap().Get(s.ID, int(s.Count))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		b, ok, err := m.BackendMap().Lookup(id)
		if err != nil || !ok {
			st.backends = append(st.backends, fmt.Sprintf("missing#%d", id))
			continue
		}
		st.backends = append(st.backends, fmt.Sprintf("%s(%s)", b.AddrPort(), maps.BackendStateNames()[b.State]))
		st.ids = append(st.ids, id)
	}
	sort.Strings(st.backends)
	_, st.maglev, _ = m.MaglevMap().Lookup(s.ID)
	return st
}

// backendStates maps every backend in the map to its state.
func backendStates(t *testing.T, root string) map[string]string {
	t.Helper()
	m, err := maps.OpenPinnedLB(root, true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	out := map[string]string{}
	if err := m.BackendMap().Iterate(func(_ uint32, b maps.Backend) bool {
		out[b.AddrPort().String()] = maps.BackendStateNames()[b.State]
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func endpoint(ip string, ready, serving, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To("node-svc"),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(serving), Terminating: ptr.To(terminating)}}
}

func slice(ns, name, svc string, port int32, proto corev1.Protocol, portName string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To(port), Protocol: ptr.To(proto)}},
	}
}

func (a *agent) services(t *testing.T) []*models.Service {
	t.Helper()
	var out []*models.Service
	if err := a.api.Do(context.Background(), http.MethodGet, "/service", nil, nil, nil, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func (a *agent) status(t *testing.T) *ext.StatusResponse {
	t.Helper()
	var st ext.StatusResponse
	if err := a.api.Do(context.Background(), http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func (a *agent) stop(t *testing.T) {
	t.Helper()
	_ = a.cmd.Process.Kill()
	err := <-a.exited
	a.exited <- err // for the cleanup
}

// TestPrivilegedServicesInKubernetes: Services and EndpointSlices reach
// GET /v1/service and the pinned LB maps of an agent with its datapath
// on; backends scale up and down (terminating ones fill the slots only
// when none is ready); a restart keeps every ID; a service deleted while
// the agent is down is pruned only after the caches synced; a deleted
// service leaves the maps. (The API server's own default/kubernetes
// service is load-balanced too: the checks name their services.)
func TestPrivilegedServicesInKubernetes(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, startErr == nil, fmt.Sprintf("no control plane: %v", startErr))
	clients, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	cs := clients.Core
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-svc"},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.30.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := "svc"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	web, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
			SessionAffinity:       corev1.ServiceAffinityClientIP,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dns, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "dns", Namespace: ns,
		Annotations: map[string]string{"service.tendril.io/lb-algorithm": "maglev"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	webFE := maps.Frontend{Addr: netip.MustParseAddr(web.Spec.ClusterIP), Port: 80, Proto: maps.ProtoTCP}
	dnsFE := maps.Frontend{Addr: netip.MustParseAddr(dns.Spec.ClusterIP), Port: 53, Proto: maps.ProtoUDP}
	slices := cs.DiscoveryV1().EndpointSlices(ns)
	webSlice, err := slices.Create(ctx, slice(ns, "web-1", "web", 8080, corev1.ProtocolTCP, "http",
		endpoint("10.244.30.11", true, true, false), endpoint("10.244.30.12", true, true, false)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := slices.Create(ctx, slice(ns, "dns-1", "dns", 5353, corev1.ProtocolUDP, "dns",
		endpoint("10.244.30.21", true, true, false)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	root := "/sys/fs/bpf/tendril-k8s-svc-" + randHex()
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	// Socket LB on a child cgroup, never the machine's root.
	cg := "/sys/fs/cgroup/unified/tendril-test-svc-" + randHex()
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })
	flags := []string{"--enable-datapath=true", "--bpf-root", root, "--ipv4-range", "10.244.30.0/24", "--ipv6-range", "none", "--cgroup-root", cg}
	a := startAgent(t, "node-svc", flags...)
	a.waitServing(t)

	waitLB := func(what string, fe maps.Frontend, cond func(lbState) bool) lbState {
		t.Helper()
		var st lbState
		eventually(t, what, func() (bool, error) {
			st = readFrontend(t, root, fe)
			return cond(st), fmt.Errorf("maps hold %+v", st)
		})
		return st
	}
	want2 := []string{"10.244.30.11:8080(active)", "10.244.30.12:8080(active)"}
	st := waitLB("web with two backends in the LB maps", webFE, func(s lbState) bool { return s.found && fmt.Sprint(s.backends) == fmt.Sprint(want2) })
	if st.svc.Flags&maps.SvcFlagAffinity == 0 || st.svc.AffinityTimeout != 60 {
		t.Fatalf("web service entry %+v: want ClientIP affinity of 60s", st.svc)
	}
	dst := waitLB("dns with a Maglev table", dnsFE, func(s lbState) bool { return s.found && s.maglev && len(s.backends) == 1 })
	if dst.svc.Flags&maps.SvcFlagMaglev == 0 {
		t.Fatalf("dns flags %x", dst.svc.Flags)
	}

	t.Run("GET /v1/service", func(t *testing.T) {
		var got *models.Service
		for _, s := range a.services(t) {
			if s.Spec.FrontendAddress.IP == web.Spec.ClusterIP && s.Spec.FrontendAddress.Port == 80 {
				got = s
			}
		}
		if got == nil || got.Spec.ID != int64(st.svc.ID) || len(got.Spec.BackendAddresses) != 2 || got.Status.Realized == nil ||
			got.Spec.Flags.Name != "web" || got.Spec.Flags.Namespace != ns || got.Spec.FrontendAddress.Protocol != "TCP" {
			t.Fatalf("web in GET /v1/service: %s", mustJSON(got))
		}
		var one models.Service
		if err := a.api.Do(ctx, http.MethodGet, fmt.Sprintf("/service/%d", st.svc.ID), nil, nil, nil, &one); err != nil {
			t.Fatal(err)
		}
		if one.Spec.FrontendAddress.IP != web.Spec.ClusterIP {
			t.Fatalf("GET /v1/service/%d: %s", st.svc.ID, mustJSON(one))
		}
		if err := a.api.Do(ctx, http.MethodGet, "/service/65000", nil, nil, nil, &one); !client.IsNotFound(err) {
			t.Fatalf("unknown service: %v", err)
		}
	})

	t.Run("status", func(t *testing.T) {
		st := a.status(t)
		if v := section(st, "Services", "socket LB"); v != cg+" (8 hooks, 0 kept from the previous run)" {
			t.Errorf("socket LB line %q", v)
		}
		if v := section(st, "Services", "sources synced"); v != "true" {
			t.Errorf("sources synced line %q", v)
		}
	})

	t.Run("CLI", func(t *testing.T) {
		bin, err := builder.Build("tendril")
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "-H", "unix://"+a.api.Socket(), "service", "list").CombinedOutput()
		if err != nil || !strings.Contains(string(out), web.Spec.ClusterIP+":80/TCP") || !strings.Contains(string(out), "10.244.30.12:8080 (active)") {
			t.Fatalf("tendril service list: %v\n%s", err, out)
		}
		out, err = exec.Command(bin, "bpf", "lb", "list", "--bpf-root", root).CombinedOutput()
		if err != nil || !strings.Contains(string(out), web.Spec.ClusterIP+":80/6") || !strings.Contains(string(out), "affinity (60s)") ||
			!strings.Contains(string(out), "maglev") {
			t.Fatalf("tendril bpf lb list: %v\n%s", err, out)
		}
	})

	// Scale up to three, then down to one ready and one terminating: the
	// terminating one leaves the slots but stays in the backend map.
	webSlice.Endpoints = []discoveryv1.Endpoint{endpoint("10.244.30.11", true, true, false), endpoint("10.244.30.12", true, true, false), endpoint("10.244.30.13", true, true, false)}
	if webSlice, err = slices.Update(ctx, webSlice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLB("web scaled up to three", webFE, func(s lbState) bool { return len(s.backends) == 3 })
	webSlice.Endpoints = []discoveryv1.Endpoint{endpoint("10.244.30.11", true, true, false), endpoint("10.244.30.12", false, true, true)}
	if webSlice, err = slices.Update(ctx, webSlice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLB("web scaled down to one ready", webFE, func(s lbState) bool { return fmt.Sprint(s.backends) == "[10.244.30.11:8080(active)]" })
	eventually(t, "the removed backend deleted, the terminating one kept", func() (bool, error) {
		b := backendStates(t, root)
		_, removed := b["10.244.30.13:8080"]
		return !removed && b["10.244.30.12:8080"] == "terminating", fmt.Errorf("backends %v", b)
	})
	webSlice.Endpoints = []discoveryv1.Endpoint{endpoint("10.244.30.12", false, true, true), endpoint("10.244.30.11", false, false, true)}
	if webSlice, err = slices.Update(ctx, webSlice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLB("only the serving terminating backend when none is ready", webFE, func(s lbState) bool {
		return fmt.Sprint(s.backends) == "[10.244.30.12:8080(terminating)]"
	})
	webSlice.Endpoints = []discoveryv1.Endpoint{endpoint("10.244.30.11", true, true, false), endpoint("10.244.30.12", true, true, false)}
	if _, err = slices.Update(ctx, webSlice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := waitLB("web back to two", webFE, func(s lbState) bool { return fmt.Sprint(s.backends) == fmt.Sprint(want2) })
	dnsBefore := readFrontend(t, root, dnsFE)

	// Restart: every ID stays, and the service keeps its two backends
	// throughout (the new agent writes nothing before it has seen both
	// the Service and its EndpointSlice).
	lb, err := maps.OpenPinnedLB(root, true)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	watchDone, counts := make(chan struct{}), make(chan map[uint16]int, 1)
	go func() {
		seen := map[uint16]int{}
		for {
			select {
			case <-watchDone:
				counts <- seen
				return
			default:
			}
			if s, ok, err := lb.ServiceMap().Lookup(webFE); err == nil && ok {
				seen[s.Count]++
			} else {
				seen[0]++
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	a.stop(t)
	a = startAgent(t, "node-svc", flags...)
	a.waitServing(t)
	eventually(t, "web realized after the restart", func() (bool, error) {
		for _, s := range a.services(t) {
			if s.Spec.FrontendAddress.IP == web.Spec.ClusterIP && s.Status.Realized != nil {
				return true, nil
			}
		}
		return false, nil
	})
	close(watchDone)
	if seen := <-counts; len(seen) != 1 || seen[2] == 0 {
		t.Errorf("web's backend count during the restart (count: samples) %v, want always 2", seen)
	}
	after := readFrontend(t, root, webFE)
	if v := section(a.status(t), "Services", "socket LB"); v != cg+" (8 hooks, 8 kept from the previous run)" {
		t.Errorf("socket LB line after the restart %q", v)
	}
	if after.svc.ID != before.svc.ID || after.svc.RevNATID != before.svc.RevNATID || fmt.Sprint(after.ids) != fmt.Sprint(before.ids) {
		t.Fatalf("IDs changed across the restart: before %+v %v, after %+v %v", before.svc, before.ids, after.svc, after.ids)
	}
	if d := readFrontend(t, root, dnsFE); d.svc.ID != dnsBefore.svc.ID {
		t.Fatalf("dns ID %d -> %d across the restart", dnsBefore.svc.ID, d.svc.ID)
	}

	// A service deleted while the agent is down is pruned once it is back
	// and synced; web keeps its IDs.
	a.stop(t)
	if err := cs.CoreV1().Services(ns).Delete(ctx, "dns", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := readFrontend(t, root, dnsFE); !d.found {
		t.Fatal("dns left the maps with no agent running")
	}
	a = startAgent(t, "node-svc", flags...)
	a.waitServing(t)
	waitLB("dns pruned after the restart", dnsFE, func(s lbState) bool { return !s.found })
	if w := readFrontend(t, root, webFE); w.svc.ID != before.svc.ID {
		t.Fatalf("web ID %d -> %d", before.svc.ID, w.svc.ID)
	}

	// Deleting the service removes its frontend; its slice's deletion its
	// backends. The API answers an empty array.
	if err := cs.CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLB("web removed", webFE, func(s lbState) bool { return !s.found })
	eventually(t, "no backend of web left", func() (bool, error) {
		b := backendStates(t, root)
		for addr := range b {
			if strings.HasPrefix(addr, "10.244.30.") {
				return false, fmt.Errorf("backends %v", b)
			}
		}
		return true, nil
	})
	for _, s := range a.services(t) {
		if s.Spec.Flags.Namespace == ns {
			t.Fatalf("service of %s still listed: %s", ns, mustJSON(s))
		}
	}
}

func randHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
