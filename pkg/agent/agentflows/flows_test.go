package agentflows

import (
	"log/slog"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// sourceAPI is the policy source of rules imported through the API.
const sourceAPI = "api"

// TestHubbleTraceModeAndSocket: the flag's values map to the loader's
// trace modes (off whatever the flag when flows are disabled), and the
// socket defaults to hubble.sock beside the API socket.
func TestHubbleTraceModeAndSocket(t *testing.T) {
	for _, tt := range []struct {
		flag   string
		enable bool
		want   loader.TraceMode
	}{
		{TraceEventsPerConnection, true, loader.TracePerConnection},
		{TraceEventsAll, true, loader.TraceEveryPacket},
		{TraceEventsOff, true, loader.TraceOff},
		{TraceEventsAll, false, loader.TraceOff},
	} {
		c := Config{Enable: tt.enable, TraceEvents: tt.flag, FlowBufferSize: 1}
		if got, err := c.TraceMode(); err != nil || got != tt.want {
			t.Errorf("trace events %q (enable %v) = %q, %v; want %q", tt.flag, tt.enable, got, err, tt.want)
		}
	}
	cfg := DefaultConfig()
	if got := cfg.SocketPath("/run/x/tendril.sock"); got != "/run/x/hubble.sock" {
		t.Errorf("default hubble socket %q", got)
	}
	cfg.Socket = "/tmp/h.sock"
	if got := cfg.SocketPath("/run/x/tendril.sock"); got != "/tmp/h.sock" {
		t.Errorf("hubble socket %q, want the flag's", got)
	}
}

// TestNodeKnowledgeIdentitiesAndPolicies: reserved identities name
// themselves, others come from the identities table; a rule cookie names the
// Kubernetes object behind it (or the API's source and labels), and a
// change of the repository is seen by the next lookup.
func TestNodeKnowledgeIdentitiesAndPolicies(t *testing.T) {
	alloc := identity.NewLocalAllocator()
	web, _, err := alloc.Allocate([]string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := identitytable.New(statedb.New(), alloc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	repo := policy.NewRepository()
	// The policy's CIDR identities (pkg/agent's CIDRIdentityLabels has
	// its own test): 192.0.2.0/24 has LocalScope|1.
	cidrLabels := func(id identity.NumericIdentity) []string {
		if id&^identity.InClusterCIDR == identity.LocalScope|1 {
			return []string{"cidr:" + netip.MustParsePrefix("192.0.2.0/24").String()}
		}
		return nil
	}
	k := &nodeKnowledge{node: "node-a", identities: ids, repo: repo, cidrLabels: cidrLabels}

	if got := k.IdentityLabels(uint32(identity.World)); !slices.Equal(got, []string{"reserved:world"}) {
		t.Errorf("world's labels %v", got)
	}
	if got := k.IdentityLabels(uint32(web.ID)); !slices.Contains(got, "k8s:app=web") {
		t.Errorf("web's labels %v", got)
	}
	if got := k.IdentityLabels(uint32(identity.LocalScope | 1)); !slices.Equal(got, []string{"cidr:192.0.2.0/24"}) {
		t.Errorf("CIDR identity's labels %v", got)
	}
	if got := k.IdentityLabels(uint32(identity.LocalScope | 2)); got != nil {
		t.Errorf("unknown CIDR identity's labels %v", got)
	}
	if got := k.IdentityLabels(60000); got != nil {
		t.Errorf("unknown identity's labels %v", got)
	}

	parse := func(doc string) api.Rules {
		t.Helper()
		rs, err := api.ParseRules([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	if _, err := repo.Add(parse(`[{"endpointSelector":{"matchLabels":{"app":"db"}},"labels":["test=api"],
		"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"web"}}]}]}]`), "", sourceAPI, false); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.ReplaceSource("k8s/NetworkPolicy/shop/db-allow", "shop", parse(`[{"endpointSelector":{"matchLabels":{"app":"db"}},
		"labels":["k8s:io.cilium.k8s.policy.name=db-allow","k8s:io.cilium.k8s.policy.namespace=shop","k8s:io.cilium.k8s.policy.derived-from=NetworkPolicy"],
		"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"web"}}]}]}]`)); err != nil {
		t.Fatal(err)
	}
	rules, _ := repo.Rules(nil)
	if len(rules) != 2 {
		t.Fatalf("%d rules", len(rules))
	}
	byName := map[string]observer.Policy{}
	for _, r := range rules {
		p, ok := k.PolicyByCookie(r.ID)
		if !ok {
			t.Fatalf("cookie %d unknown", r.ID)
		}
		byName[p.Name] = p
	}
	if p := byName["db-allow"]; p.Namespace != "shop" || p.Kind != "NetworkPolicy" {
		t.Errorf("Kubernetes policy %+v", p)
	}
	if p := byName[sourceAPI]; !slices.Contains(p.Labels, "unspec:test=api") || p.Kind != "" {
		t.Errorf("API policy %+v (of %v)", p, byName)
	}

	// The Kubernetes object goes: its cookie is no longer known.
	if _, err := repo.ReplaceSource("k8s/NetworkPolicy/shop/db-allow", "shop", nil); err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		_, ok := k.PolicyByCookie(r.ID)
		if isK8s := r.Source != sourceAPI; ok == isK8s {
			t.Errorf("cookie %d (%s) known %v after the object's delete", r.ID, r.Source, ok)
		}
	}
}

// TestHubblePeerOfNode: the Peer service announces a node at its
// InternalIP with the Hubble TCP port, and its TLS server name when the
// listener serves TLS.
func TestHubblePeerOfNode(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node2"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "node2"}, {Type: corev1.NodeInternalIP, Address: "10.0.0.12"}}}}
	m := &Module{port: "4244", clusterName: "lab", tls: true}
	if got := m.peerOf(n); got != (hubble.Peer{Name: "node2", Address: "10.0.0.12:4244", TLSServerName: "node2.lab.hubble-grpc.tendril.io"}) {
		t.Errorf("peer %+v", got)
	}
	m.tls = false
	if got := m.peerOf(n); got.TLSServerName != "" {
		t.Errorf("plain-text peer with a TLS name: %+v", got)
	}
}
