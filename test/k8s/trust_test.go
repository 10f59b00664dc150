package k8s_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/agent/agentkv"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/etcdproc"
)

// TestPrivilegedForgedClaimsStayOutOfIPCache: other nodes' endpoint
// claims, as TendrilEndpoints in a real API server and as address keys
// in a real etcd, reach the agent's BPF ipcache only when their identity
// is a cluster one and their address is inside the pod CIDR of the node
// that published them; forged ones (a reserved identity, one past 32
// bits that would truncate to host, an address outside the node's pod
// CIDR, the node's own address, under a node whose only pod CIDR is the
// default route) never do. The hostile node's CIDR shows as refused in
// the status.
func TestPrivilegedForgedClaimsStayOutOfIPCache(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, startErr == nil, fmt.Sprintf("no control plane: %v", startErr))
	etcd := etcdproc.Start(t)
	clients, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	cs, td := clients.Core, clients.Tendril.TendrilV1alpha1()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	mkNode := func(name, ip string, cidrs ...string) {
		n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.NodeSpec{PodCIDRs: cidrs}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ip == "" {
			return
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkNode("node-trust", "", "10.244.40.0/24")
	mkNode("node-peer", "172.30.41.2", "10.244.41.0/24")
	mkNode("node-evil", "172.30.42.2")
	// The agent first: it installs the CRDs; every claim below comes
	// while it runs.
	root := "/sys/fs/bpf/tendril-k8s-trust-" + randHex()
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	cg := "/sys/fs/cgroup/unified/tendril-test-trust-" + randHex()
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })
	a := startAgent(t, "node-trust", "--enable-datapath=true", "--bpf-root", root, "--ipv4-range", "10.244.40.0/24",
		"--ipv6-range", "none", "--cgroup-root", cg, "--kvstore", "etcd", "--kvstore-endpoints", strings.Join(etcd.Endpoints(), ","))
	a.waitServing(t)
	if _, err := td.TendrilNodes().Create(ctx, &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: "node-evil"},
		Spec: v1alpha1.NodeSpec{IPAM: v1alpha1.IPAMSpec{PodCIDRs: []string{"0.0.0.0/0"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := "trust"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mkTEP := func(name, nodeIP, ip string, id int64) {
		tep := &v1alpha1.TendrilEndpoint{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Status: v1alpha1.EndpointStatus{Identity: &v1alpha1.EndpointIdentity{ID: id},
				Networking: &v1alpha1.EndpointNetworking{NodeIP: nodeIP, Addressing: []v1alpha1.AddressPair{{IPv4: ip}}}}}
		if _, err := td.TendrilEndpoints(ns).Create(ctx, tep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkTEP("legit", "172.30.41.2", "10.244.41.10", 4321)
	mkTEP("reserved", "172.30.41.2", "10.244.41.11", 1)
	mkTEP("truncated", "172.30.41.2", "10.244.41.12", 1<<32+1)
	mkTEP("outside", "172.30.41.2", "10.244.99.13", 4321)
	mkTEP("node-ip", "172.30.41.2", "172.30.41.2", 4321)
	mkTEP("evil", "172.30.42.2", "8.8.8.8", 4321)

	kc, err := kvstore.Connect(ctx, func() kvstore.Config {
		c := kvstore.DefaultConfig()
		c.Endpoints, c.ConnectTimeout = etcd.Endpoints(), 30*time.Second
		return c
	}(), quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close(ctx)
	putKey := func(e agentkv.IPEntry) {
		v, _ := json.Marshal(e)
		if err := kc.Update(ctx, agentkv.IPPrefix+e.IP, v, kvstore.NoLease); err != nil {
			t.Fatal(err)
		}
	}
	putKey(agentkv.IPEntry{IP: "10.244.41.20", Identity: 5000, Node: "node-peer", HostIP: "172.30.41.2"})
	putKey(agentkv.IPEntry{IP: "10.244.41.21", Identity: 2, Node: "node-peer"})
	putKey(agentkv.IPEntry{IP: "10.244.77.22", Identity: 5000, Node: "node-peer"})
	putKey(agentkv.IPEntry{IP: "10.244.41.23", Identity: 5000, Node: "node-peer", HostIP: "172.30.42.2"})
	putKey(agentkv.IPEntry{IP: "1.1.1.1", Identity: 5000, Node: "node-evil"})

	// Only the claims under 10.244.0.0/16 and the forged ones' addresses
	// matter here (the map also holds host and other tests' addresses).
	watched := map[string]bool{}
	for _, ip := range []string{"10.244.41.10", "10.244.41.11", "10.244.41.12", "10.244.99.13", "172.30.41.2", "8.8.8.8",
		"10.244.41.20", "10.244.41.21", "10.244.77.22", "10.244.41.23", "1.1.1.1"} {
		watched[ip+"/32"] = true
	}
	ipcacheOf := func() (string, error) {
		m, err := maps.OpenPinned(root, true)
		if err != nil {
			return "", err
		}
		defer m.Close()
		entries, err := m.IPCacheMap().Dump()
		if err != nil {
			return "", err
		}
		var out []string
		for p, e := range entries {
			if watched[p.String()] {
				out = append(out, fmt.Sprintf("%s=%d", p, e.Identity))
			}
		}
		sort.Strings(out)
		return fmt.Sprint(out), nil
	}
	// The peer's own address is remote-node (6), claimed by the node.
	want := "[10.244.41.10/32=4321 10.244.41.20/32=5000 172.30.41.2/32=6]"
	eventually(t, "the legitimate claims in the BPF ipcache", func() (bool, error) {
		got, err := ipcacheOf()
		return got == want, fmt.Errorf("ipcache %s (%v), want %s", got, err, want)
	})
	eventually(t, "the hostile node's pod CIDR refused in the status", func() (bool, error) {
		var st ext.StatusResponse
		if err := a.api.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
			return false, err
		}
		v := section(&st, "Kubernetes", "Refused pod CIDRs")
		return strings.Contains(v, "node-evil: 0.0.0.0/0 (default-route"), fmt.Errorf("refused line %q", v)
	})
	// A later legitimate claim arrives after the forged ones were judged:
	// the map is settled, and no forged one slipped in meanwhile.
	mkTEP("legit-2", "172.30.41.2", "10.244.41.30", 4322)
	watched["10.244.41.30/32"] = true
	want = "[10.244.41.10/32=4321 10.244.41.20/32=5000 10.244.41.30/32=4322 172.30.41.2/32=6]"
	eventually(t, "the second legitimate claim", func() (bool, error) {
		got, err := ipcacheOf()
		return got == want, fmt.Errorf("ipcache %s (%v), want %s", got, err, want)
	})
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
