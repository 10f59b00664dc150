package k8s_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// The client of TestPrivilegedLocalRedirectDNSCache runs in a child of
// the test binary, in a network namespace of its own and the agent's
// socket-LB cgroup (a pod's): the node-local cache and the cluster's DNS
// server are addresses on its loopback, each answering with its address.
const lrpHelperEnv = "TENDRIL_K8S_LRP_HELPER"

type lrpRequest struct {
	// Servers are the addresses that answer on UDP and TCP port 53.
	Servers []string
	// Ask is the ClusterIP:53 queried on each "ask" line.
	Ask string
}

type lrpAnswer struct {
	UDP, TCP, Err string
}

func lrpHelperMain() int {
	var req lrpRequest
	if err := json.Unmarshal([]byte(os.Getenv(lrpHelperEnv)), &req); err != nil {
		fmt.Fprintln(os.Stderr, "helper request:", err)
		return 2
	}
	if err := lrpHelper(req); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	return 0
}

func lrpHelper(req lrpRequest) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	for _, s := range req.Servers {
		addr, err := netlink.ParseAddr(s + "/32")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(lo, addr); err != nil {
			return fmt.Errorf("add %s: %w", s, err)
		}
		pc, err := net.ListenPacket("udp", net.JoinHostPort(s, "53"))
		if err != nil {
			return err
		}
		go func(name string) {
			buf := make([]byte, 64)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo([]byte(name), from)
			}
		}(s)
		ln, err := net.Listen("tcp", net.JoinHostPort(s, "53"))
		if err != nil {
			return err
		}
		go func(name string) {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = c.Write([]byte(name))
				_ = c.Close()
			}
		}(s)
	}
	out := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() != "ask" {
			return fmt.Errorf("unknown command %q", in.Text())
		}
		var a lrpAnswer
		var errs []string
		if c, err := net.Dial("udp", req.Ask); err != nil {
			errs = append(errs, "udp: "+err.Error())
		} else {
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 64)
			if _, err := c.Write([]byte("query")); err != nil {
				errs = append(errs, "udp: "+err.Error())
			} else if n, err := c.Read(buf); err != nil {
				errs = append(errs, "udp: "+err.Error())
			} else {
				a.UDP = string(buf[:n])
			}
			c.Close()
		}
		if c, err := net.DialTimeout("tcp", req.Ask, 2*time.Second); err != nil {
			errs = append(errs, "tcp: "+err.Error())
		} else {
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 64)
			if n, err := c.Read(buf); err != nil {
				errs = append(errs, "tcp: "+err.Error())
			} else {
				a.TCP = string(buf[:n])
			}
			c.Close()
		}
		a.Err = strings.Join(errs, "; ")
		if err := out.Encode(a); err != nil {
			return err
		}
	}
	return in.Err()
}

func lrpPort(port, proto, name string) v1alpha1.LRPPort {
	return v1alpha1.LRPPort{Port: port, Protocol: proto, Name: name}
}

// TestPrivilegedLocalRedirectDNSCache: the node-local DNS cache. Pods
// keep using the kube-dns ClusterIP; a TendrilLocalRedirectPolicy
// (serviceMatcher) sends their UDP and TCP DNS to the cache pod on their
// own node, through the agent's socket LB, with real sockets in a pod's
// network namespace and cgroup, also while the agent is down and after it
// restarted; with the cache pod deleted the same
// ClusterIP reaches the Service's own backend again. An addressMatcher
// policy gets its frontend in the LB maps while the cache pod exists and
// loses it after. A policy of another namespace naming kube-dns, and one
// with a bad address, are refused (counted in the status, nothing in the
// maps or GET /v1/lrp). The stock cilium-dbg and tendril list the policy.
func TestPrivilegedLocalRedirectDNSCache(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, startErr == nil, fmt.Sprintf("no control plane: %v", startErr))
	clients, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	cs := clients.Core
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName, ns, tenant = "node-lrp", "lrp-dns", "lrp-tenant"
	const cacheIP, clusterDNSIP = "10.244.33.11", "10.244.33.21"
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.33.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{ns, tenant} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dns := createKubeDNS(ctx, t, cs, ns, clusterDNSIP)
	// The cache pods: one in the Service's namespace, and a tenant's with
	// the same labels, which no policy of kube-dns's namespace selects.
	cacheLabels := map[string]string{"k8s-app": "node-local-dns"}
	createReadyPod(ctx, t, cs, ns, "cache", nodeName, cacheIP, cacheLabels)
	createReadyPod(ctx, t, cs, tenant, "cache", nodeName, "10.244.33.66", cacheLabels)

	backend := v1alpha1.RedirectBackend{LocalEndpointSelector: metav1.LabelSelector{MatchLabels: cacheLabels},
		ToPorts: []v1alpha1.LRPPort{lrpPort("53", "UDP", "dns"), lrpPort("53", "TCP", "dns-tcp")}}
	lrps := func(namespace string) interface {
		Create(context.Context, *v1alpha1.TendrilLocalRedirectPolicy, metav1.CreateOptions) (*v1alpha1.TendrilLocalRedirectPolicy, error)
	} {
		return clients.Tendril.TendrilV1alpha1().TendrilLocalRedirectPolicies(namespace)
	}
	policies := []*v1alpha1.TendrilLocalRedirectPolicy{
		{ObjectMeta: metav1.ObjectMeta{Name: "nodelocaldns", Namespace: ns}, Spec: v1alpha1.LocalRedirectPolicySpec{
			RedirectFrontend: v1alpha1.RedirectFrontend{ServiceMatcher: &v1alpha1.LRPServiceMatcher{ServiceName: "kube-dns", Namespace: ns}},
			RedirectBackend:  backend}},
		{ObjectMeta: metav1.ObjectMeta{Name: "link-local", Namespace: ns}, Spec: v1alpha1.LocalRedirectPolicySpec{
			RedirectFrontend: v1alpha1.RedirectFrontend{AddressMatcher: &v1alpha1.LRPAddressMatcher{IP: "169.254.20.10",
				ToPorts: []v1alpha1.LRPPort{lrpPort("53", "UDP", "dns")}}},
			RedirectBackend: backend}},
		// Refused: another namespace's Service, a bad address, and an
		// address from a namespace the agent does not let redirect
		// addresses (it would redirect every pod of the node).
		{ObjectMeta: metav1.ObjectMeta{Name: "steal-dns", Namespace: tenant}, Spec: v1alpha1.LocalRedirectPolicySpec{
			RedirectFrontend: v1alpha1.RedirectFrontend{ServiceMatcher: &v1alpha1.LRPServiceMatcher{ServiceName: "kube-dns", Namespace: ns}},
			RedirectBackend:  backend}},
		{ObjectMeta: metav1.ObjectMeta{Name: "bad-ip", Namespace: tenant}, Spec: v1alpha1.LocalRedirectPolicySpec{
			RedirectFrontend: v1alpha1.RedirectFrontend{AddressMatcher: &v1alpha1.LRPAddressMatcher{IP: "169.254.20.300",
				ToPorts: []v1alpha1.LRPPort{lrpPort("53", "UDP", "dns")}}},
			RedirectBackend: backend}},
		{ObjectMeta: metav1.ObjectMeta{Name: "tenant-addr", Namespace: tenant}, Spec: v1alpha1.LocalRedirectPolicySpec{
			RedirectFrontend: v1alpha1.RedirectFrontend{AddressMatcher: &v1alpha1.LRPAddressMatcher{IP: "169.254.20.11",
				ToPorts: []v1alpha1.LRPPort{lrpPort("53", "UDP", "dns")}}},
			RedirectBackend: backend}},
	}

	root := "/sys/fs/bpf/tendril-k8s-lrp-" + randHex()
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	cg := "/sys/fs/cgroup/unified/tendril-test-lrp-" + randHex()
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })
	// The agent installs the CRDs at its start; the policies follow.
	a := startAgent(t, nodeName, "--enable-datapath=true", "--bpf-root", root, "--ipv4-range", "10.244.33.0/24", "--ipv6-range", "none", "--cgroup-root", cg,
		"--lrp-address-matcher-namespaces", ns)
	a.waitServing(t)
	for _, p := range policies {
		eventually(t, "the policy CRD to take "+p.Name, func() (bool, error) {
			_, err := lrps(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
			return err == nil, err
		})
	}

	dnsUDP := maps.Frontend{Addr: netip.MustParseAddr(dns.Spec.ClusterIP), Port: 53, Proto: maps.ProtoUDP}
	dnsTCP := maps.Frontend{Addr: netip.MustParseAddr(dns.Spec.ClusterIP), Port: 53, Proto: maps.ProtoTCP}
	linkLocal := maps.Frontend{Addr: netip.MustParseAddr("169.254.20.10"), Port: 53, Proto: maps.ProtoUDP}
	for _, fe := range []maps.Frontend{dnsUDP, dnsTCP, linkLocal} {
		eventually(t, fmt.Sprintf("%s:%d to the cache pod in the LB maps", fe.Addr, fe.Port), func() (bool, error) {
			st := readFrontend(t, root, fe)
			return len(st.backends) == 1 && st.backends[0] == cacheIP+":53(active)", fmt.Errorf("maps hold %+v", st)
		})
	}
	eventually(t, "the status to count the policies", func() (bool, error) {
		v := section(a.status(t), "Services", "local redirect policies")
		return strings.HasPrefix(v, "2 applied, 3 refused"), fmt.Errorf("status line %q", v)
	})
	st := a.status(t)
	for key, why := range map[string]string{"lrp-tenant/steal-dns": "own namespace", "lrp-tenant/bad-ip": "169.254.20.300",
		"lrp-tenant/tenant-addr": "namespace lrp-tenant may not redirect addresses"} {
		if !strings.Contains(a.logs.String(), why) {
			t.Errorf("the agent's log does not say why a policy was refused (%q)", why)
		}
		if v := section(st, "Services", "refused "+key); !strings.Contains(v, why) {
			t.Errorf("status line refused %s: %q, want the reason %q", key, v, why)
		}
	}
	if st := readFrontend(t, root, maps.Frontend{Addr: netip.MustParseAddr("169.254.20.11"), Port: 53, Proto: maps.ProtoUDP}); st.found {
		t.Errorf("a refused policy's address reached the LB maps: %+v", st)
	}

	// A pod's DNS, through the socket LB.
	ask := startLRPClient(t, cg, "", lrpRequest{Servers: []string{cacheIP, clusterDNSIP}, Ask: net.JoinHostPort(dns.Spec.ClusterIP, "53")})
	if got := ask(); got.Err != "" || got.UDP != cacheIP || got.TCP != cacheIP {
		t.Fatalf("with the cache pod on the node, the kube-dns ClusterIP should reach it: %+v", got)
	}

	// The agent restarts: while it is down the pinned maps keep
	// redirecting, and the new agent writes the redirect again before it
	// changes anything (its frontends wait for both sources' lists), so
	// every answer comes from the cache.
	agentArgs := []string{"--enable-datapath=true", "--bpf-root", root, "--ipv4-range", "10.244.33.0/24", "--ipv6-range", "none", "--cgroup-root", cg,
		"--lrp-address-matcher-namespaces", ns}
	a.stop(t)
	if got := ask(); got.Err != "" || got.UDP != cacheIP || got.TCP != cacheIP {
		t.Fatalf("with the agent down, the redirect should hold: %+v", got)
	}
	a = startAgent(t, nodeName, agentArgs...)
	a.waitServing(t)
	eventually(t, "the restarted agent to have reconciled the redirect", func() (bool, error) {
		for _, s := range a.services(t) {
			if s.Spec.FrontendAddress.IP == dns.Spec.ClusterIP && s.Spec.Flags.Type == "LocalRedirect" && s.Status.Realized != nil {
				return true, nil
			}
		}
		return false, fmt.Errorf("no realized LocalRedirect frontend for %s", dns.Spec.ClusterIP)
	})
	for range 3 {
		if got := ask(); got.Err != "" || got.UDP != cacheIP || got.TCP != cacheIP {
			t.Fatalf("after the restart the redirect should hold: %+v", got)
		}
	}

	t.Run("lrp list", func(t *testing.T) {
		out, err := exec.Command("../../hack/cilium-dbg.sh").Output()
		testutil.Require(t, err == nil, fmt.Sprintf("stock cilium-dbg not built: %v", err))
		dbg := strings.TrimSpace(string(out))
		list, err := exec.Command(dbg, "-H", "unix://"+a.api.Socket(), "lrp", "list").CombinedOutput()
		if err != nil {
			t.Fatalf("cilium-dbg lrp list: %v\n%s", err, list)
		}
		t.Logf("cilium-dbg lrp list:\n%s", list)
		for _, want := range []string{"nodelocaldns", ns + "/kube-dns", dns.Spec.ClusterIP + ":53/UDP -> " + cacheIP + ":53(" + ns + "/cache)",
			"link-local", "169.254.20.10:53/UDP -> " + cacheIP + ":53(" + ns + "/cache)"} {
			if !strings.Contains(string(list), want) {
				t.Errorf("cilium-dbg lrp list lacks %q", want)
			}
		}
		for _, refused := range []string{"steal-dns", "bad-ip", "tenant-addr", "10.244.33.66"} {
			if strings.Contains(string(list), refused) {
				t.Errorf("cilium-dbg lrp list shows %q, which was refused", refused)
			}
		}
		tendril, err := builder.Build("tendril")
		if err != nil {
			t.Fatal(err)
		}
		own, err := exec.Command(tendril, "-H", "unix://"+a.api.Socket(), "lrp", "list").CombinedOutput()
		if err != nil {
			t.Fatalf("tendril lrp list: %v\n%s", err, own)
		}
		t.Logf("tendril lrp list:\n%s", own)
		if !strings.Contains(string(own), dns.Spec.ClusterIP+":53/TCP -> "+cacheIP+":53("+ns+"/cache)") {
			t.Errorf("tendril lrp list lacks the TCP mapping")
		}
	})

	// The cache pod goes: the ClusterIP falls back to the Service's own
	// backend, and the address policy stops redirecting.
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "cache", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ClusterIP to fall back to the Service's backend", func() (bool, error) {
		got := ask()
		return got.Err == "" && got.UDP == clusterDNSIP && got.TCP == clusterDNSIP, fmt.Errorf("answer %+v", got)
	})
	eventually(t, "the address policy's frontend to leave the maps", func() (bool, error) {
		st := readFrontend(t, root, linkLocal)
		return !st.found, fmt.Errorf("maps hold %+v", st)
	})
}

// createKubeDNS creates the Service kube-dns of namespace ns (DNS over UDP
// and TCP) with one ready backend at ip on another node, in an
// EndpointSlice per protocol.
func createKubeDNS(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, ip string) *corev1.Service {
	t.Helper()
	dns, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	at := endpoint(ip, true, true, false)
	at.NodeName = ptr.To("node-elsewhere")
	for _, s := range []struct {
		name, port string
		proto      corev1.Protocol
	}{{"kube-dns-udp", "dns", corev1.ProtocolUDP}, {"kube-dns-tcp", "dns-tcp", corev1.ProtocolTCP}} {
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice(ns, s.name, "kube-dns", 53, s.proto, s.port, at), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return dns
}

// createReadyPod creates a pod on node, running and ready at ip (its
// status written as the kubelet would).
func createReadyPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name, node, ip string, labels map[string]string) {
	t.Helper()
	p, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
