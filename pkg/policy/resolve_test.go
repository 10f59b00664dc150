package policy

import (
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

type probe struct {
	dir   uint8
	peer  identity.NumericIdentity
	proto uint8
	port  uint16
	allow bool
}

func TestResolution(t *testing.T) {
	tests := []struct {
		name      string
		ns        string
		doc       string
		target    Peer
		enforceIn bool
		enforceEg bool
		probes    []probe
	}{
		{
			name: "no rule selects: nothing enforced",
			doc:  `[{"endpointSelector":{"matchLabels":{"app":"zzz"}},"ingress":[{}]}]`, target: xa,
		},
		{
			name: "default deny ingress with an empty rule", doc: `[{"endpointSelector":{},"ingress":[{}]}]`, target: xa, enforceIn: true,
			probes: []probe{{Ingress, xb.ID, 6, 80, false}, {Ingress, identity.World, 6, 80, false}},
		},
		{
			name: "allow from pods of the namespace by label and port", ns: "x",
			doc:    `[{"endpointSelector":{"matchLabels":{"app":"a"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]}]`,
			target: xa, enforceIn: true,
			probes: []probe{{Ingress, xb.ID, 6, 80, true}, {Ingress, xb.ID, 6, 81, false}, {Ingress, xb.ID, 17, 80, false}, {Ingress, ya.ID, 6, 80, false}},
		},
		{
			name: "namespaced rule does not select other namespaces", ns: "x",
			doc:    `[{"endpointSelector":{"matchLabels":{"app":"a"}},"ingress":[{}]}]`,
			target: ya,
		},
		{
			name: "explicit namespace in a peer selector", ns: "x",
			doc:    `[{"endpointSelector":{},"ingress":[{"fromEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"y"}}]}]}]`,
			target: xa, enforceIn: true,
			probes: []probe{{Ingress, ya.ID, 6, 1, true}, {Ingress, xb.ID, 6, 1, false}},
		},
		{
			// A key that merely ends in the namespace key names no
			// namespace: the peer stays restricted to the rule's own.
			name: "a key ending in the namespace key does not lift the namespace restriction", ns: "x",
			doc:    `[{"endpointSelector":{},"ingress":[{"fromEndpoints":[{"matchExpressions":[{"key":"k8s:evil.io.kubernetes.pod.namespace","operator":"DoesNotExist"}]}]}]}]`,
			target: xa, enforceIn: true,
			probes: []probe{{Ingress, xb.ID, 6, 1, true}, {Ingress, ya.ID, 6, 1, false}},
		},
		{
			name: "the namespace key of any source names a namespace", ns: "x",
			doc:    `[{"endpointSelector":{},"ingress":[{"fromEndpoints":[{"matchLabels":{"any:io.kubernetes.pod.namespace":"y"}},{"matchLabels":{"io.kubernetes.pod.namespace":"y","app":"a"}}]}]}]`,
			target: xa, enforceIn: true,
			probes: []probe{{Ingress, ya.ID, 6, 1, true}, {Ingress, xb.ID, 6, 1, false}},
		},
		{
			name: "the namespace key of another source names no namespace", ns: "x",
			doc:    `[{"endpointSelector":{},"ingress":[{"fromEndpoints":[{"matchExpressions":[{"key":"unspec:io.kubernetes.pod.namespace","operator":"DoesNotExist"}]}]}]}]`,
			target: xa, enforceIn: true,
			probes: []probe{{Ingress, xb.ID, 6, 1, true}, {Ingress, ya.ID, 6, 1, false}},
		},
		{
			name:   "matchExpressions",
			doc:    `[{"endpointSelector":{"matchExpressions":[{"key":"app","operator":"In","values":["a","c"]}]},"egress":[{"toEndpoints":[{"matchExpressions":[{"key":"app","operator":"NotIn","values":["a"]}]}]}]}]`,
			target: xa, enforceEg: true,
			probes: []probe{{Egress, xb.ID, 6, 1, true}, {Egress, ya.ID, 6, 1, false}},
		},
		{
			name:   "entities",
			doc:    `[{"endpointSelector":{},"ingress":[{"fromEntities":["host","remote-node"]}],"egress":[{"toEntities":["world"]}]}]`,
			target: xa, enforceIn: true, enforceEg: true,
			probes: []probe{{Ingress, identity.Host, 6, 1, true}, {Ingress, identity.RemoteNode, 17, 1, true}, {Ingress, xb.ID, 6, 1, false},
				{Egress, identity.World, 6, 443, true}, {Egress, c8.ID, 6, 443, true}, {Egress, xb.ID, 6, 443, false}},
		},
		{
			name:   "entity cluster",
			doc:    `[{"endpointSelector":{},"egress":[{"toEntities":["cluster"]}]}]`,
			target: xa, enforceEg: true,
			probes: []probe{{Egress, ya.ID, 6, 1, true}, {Egress, identity.Host, 6, 1, true}, {Egress, identity.World, 6, 1, false}},
		},
		{
			name:   "CIDR set with except",
			doc:    `[{"endpointSelector":{},"egress":[{"toCIDRSet":[{"cidr":"10.0.0.0/8","except":["10.1.2.0/24"]}]}]}]`,
			target: xa, enforceEg: true,
			probes: []probe{{Egress, c8.ID, 6, 1, true}, {Egress, c24.ID, 6, 1, false}, {Egress, identity.World, 6, 1, false}},
		},
		{
			name:   "port range and L4-only egress",
			doc:    `[{"endpointSelector":{},"egress":[{"toPorts":[{"ports":[{"port":"8000","endPort":8100,"protocol":"UDP"}]}]}]}]`,
			target: xa, enforceEg: true,
			probes: []probe{{Egress, identity.World, 17, 8050, true}, {Egress, xb.ID, 17, 8100, true}, {Egress, xb.ID, 17, 8101, false}, {Egress, xb.ID, 6, 8050, false}},
		},
		{
			name: "deny wins over allow",
			doc: `[{"endpointSelector":{},"ingress":[{"fromEntities":["all"],"toPorts":[{"ports":[{"port":"80"}]}]}],
			        "ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}]}]}]`,
			target: xa, enforceIn: true,
			probes: []probe{{Ingress, xb.ID, 6, 80, false}, {Ingress, ya.ID, 6, 80, true}, {Ingress, ya.ID, 17, 80, true}, {Ingress, ya.ID, 6, 81, false}},
		},
		{
			name:   "deny of all ports beats an allow of one port for the same peer",
			doc:    `[{"endpointSelector":{},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}],"ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}]}]}]`,
			target: xa, enforceIn: true,
			probes: []probe{{Ingress, xb.ID, 6, 80, false}},
		},
		{
			name:   "enableDefaultDeny false: only the deny applies",
			doc:    `[{"endpointSelector":{},"enableDefaultDeny":{"ingress":false},"ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}]}]}]`,
			target: xa, enforceIn: true,
			probes: []probe{{Ingress, xb.ID, 6, 80, false}, {Ingress, ya.ID, 6, 80, true}, {Ingress, identity.World, 17, 53, true}},
		},
		{
			name:   "icmp types",
			doc:    `[{"endpointSelector":{},"ingress":[{"icmps":[{"fields":[{"type":8},{"type":"EchoRequest","family":"IPv6"}]}]}]}]`,
			target: xa, enforceIn: true,
			probes: []probe{{Ingress, xb.ID, 1, 8, true}, {Ingress, xb.ID, 1, 0, false}, {Ingress, xb.ID, 58, 8, true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repo := NewRepository()
			if _, err := repo.Add(mustRules(t, tt.doc), tt.ns, "test", false); err != nil {
				t.Fatal(err)
			}
			res := repo.Resolve(Endpoint{Labels: tt.target.Labels}, universe())
			if res.EnforceIngress != tt.enforceIn || res.EnforceEgress != tt.enforceEg {
				t.Fatalf("enforce = %v/%v, want %v/%v", res.EnforceIngress, res.EnforceEgress, tt.enforceIn, tt.enforceEg)
			}
			for _, p := range tt.probes {
				got, _ := res.MapState.Allowed(p.dir, p.peer, p.proto, p.port)
				if got != p.allow {
					t.Errorf("dir %d from %d %d/%d: allowed=%v, want %v (state %v)", p.dir, p.peer, p.proto, p.port, got, p.allow, res.MapState)
				}
			}
		})
	}
}

func TestNamedPorts(t *testing.T) {
	repo := NewRepository()
	_, err := repo.Add(mustRules(t, `[{"endpointSelector":{},"ingress":[{"toPorts":[{"ports":[{"port":"http","protocol":"TCP"}]}]}]}]`), "", "t", false)
	if err != nil {
		t.Fatal(err)
	}
	res := repo.Resolve(Endpoint{Labels: xa.Labels, NamedPorts: map[string]NamedPort{"http": {8080, 6}}}, universe())
	if ok, _ := res.MapState.Allowed(Ingress, xb.ID, 6, 8080); !ok {
		t.Fatal("named port not resolved")
	}
	other := repo.Resolve(Endpoint{Labels: xb.Labels}, universe())
	if ok, _ := other.MapState.Allowed(Ingress, xa.ID, 6, 8080); ok {
		t.Fatal("named port allowed on an endpoint without it")
	}
}

// Egress named ports name the destination's container ports, so they
// resolve per selected peer (and, for an L4-only section, per identity that
// names the port); the selector-cache path must agree with the plain one.
func TestEgressNamedPorts(t *testing.T) {
	web := Peer{ID: 1010, Labels: []string{"k8s:app=web", NamespaceLabel + "=x"}, NamedPorts: map[string]NamedPort{"http": {8080, api.ProtoTCP}}}
	alt := Peer{ID: 1011, Labels: []string{"k8s:app=alt", NamespaceLabel + "=x"}, NamedPorts: map[string]NamedPort{"http": {9090, api.ProtoTCP}, "dns": {53, api.ProtoUDP}}}
	u := append(universe(), web, alt)
	tests := []struct {
		name   string
		doc    string
		probes []probe
	}{
		{
			name: "selected peers",
			doc:  `[{"endpointSelector":{},"egress":[{"toEndpoints":[{"matchLabels":{"app":"web"}}],"toPorts":[{"ports":[{"port":"http","protocol":"TCP"},{"port":"443","protocol":"TCP"}]}]}]}]`,
			probes: []probe{
				{Egress, web.ID, api.ProtoTCP, 8080, true}, {Egress, web.ID, api.ProtoTCP, 443, true},
				{Egress, web.ID, api.ProtoTCP, 9090, false}, {Egress, alt.ID, api.ProtoTCP, 9090, false},
			},
		},
		{
			name: "L4-only: every identity naming the port, at its own number",
			doc:  `[{"endpointSelector":{},"egress":[{"toPorts":[{"ports":[{"port":"http","protocol":"TCP"}]}]}]}]`,
			probes: []probe{
				{Egress, web.ID, api.ProtoTCP, 8080, true}, {Egress, alt.ID, api.ProtoTCP, 9090, true},
				{Egress, web.ID, api.ProtoTCP, 9090, false}, {Egress, alt.ID, api.ProtoTCP, 8080, false},
				{Egress, identity.World, api.ProtoTCP, 8080, false}, {Egress, xb.ID, api.ProtoTCP, 8080, false},
			},
		},
		{
			name:   "protocol must match the container port's",
			doc:    `[{"endpointSelector":{},"egress":[{"toPorts":[{"ports":[{"port":"dns","protocol":"TCP"}]}]}]}]`,
			probes: []probe{{Egress, alt.ID, api.ProtoTCP, 53, false}, {Egress, alt.ID, api.ProtoUDP, 53, false}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repo := NewRepository()
			if _, err := repo.Add(mustRules(t, tt.doc), "x", "test", false); err != nil {
				t.Fatal(err)
			}
			plain := repo.Resolve(Endpoint{Labels: xa.Labels}, u)
			cached := repo.ResolveCached(Endpoint{Labels: xa.Labels}, u, 1, NewSelectorCache())
			if len(plain.MapState) != len(cached.MapState) {
				t.Fatalf("cached resolution differs: %v vs %v", cached.MapState, plain.MapState)
			}
			for k, e := range plain.MapState {
				if cached.MapState[k] != e {
					t.Fatalf("cached resolution differs at %+v: %v vs %v", k, cached.MapState, plain.MapState)
				}
			}
			for _, p := range tt.probes {
				if got, _ := plain.MapState.Allowed(p.dir, p.peer, p.proto, p.port); got != p.allow {
					t.Errorf("to %d %d/%d: allowed=%v, want %v (state %v)", p.peer, p.proto, p.port, got, p.allow, plain.MapState)
				}
			}
		})
	}
}

// The in-cluster identity of a prefix (what a pod's address inside a
// rule's block carries) is selected by CIDR rules naming the block, never
// by the world entity; and the datapath's verdict for a pod combines its
// own identity's entries with its block's, a deny in either winning.
func TestInClusterCIDRIdentity(t *testing.T) {
	c24in := Peer{ID: c24.ID | identity.InClusterCIDR, Labels: c24.Labels, CIDR: c24.CIDR}
	u := append(universe(), c24in)
	repo := NewRepository()
	if _, err := repo.Add(mustRules(t, `[
	 {"endpointSelector":{"matchLabels":{"app":"a"}},"egress":[{"toCIDR":["10.1.2.0/24"],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}, {"toEntities":["world"],"toPorts":[{"ports":[{"port":"443","protocol":"TCP"}]}]}]},
	 {"endpointSelector":{"matchLabels":{"app":"a"}},"egressDeny":[{"toCIDR":["10.1.2.0/24"],"toPorts":[{"ports":[{"port":"22","protocol":"TCP"}]}]}],"egress":[{"toEndpoints":[{"matchLabels":{"app":"b"}}]}]}
	]`), "x", "t", false); err != nil {
		t.Fatal(err)
	}
	res := repo.Resolve(Endpoint{Labels: xa.Labels}, u)
	for _, c := range []struct {
		name   string
		id     identity.NumericIdentity
		cidrID identity.NumericIdentity
		port   uint16
		want   bool
	}{
		{"world address in the block, by its CIDR identity", c24.ID, 0, 80, true},
		{"pod in the block", ya.ID, c24in.ID, 80, true},
		{"pod outside every block", ya.ID, 0, 80, false},
		{"world entity does not select a pod through its block", ya.ID, c24in.ID, 443, false},
		{"world entity selects the world's CIDR identity", c24.ID, 0, 443, true},
		{"pod allowed by label, denied by its block", xb.ID, c24in.ID, 22, false},
		{"pod allowed by label, outside the denied block", xb.ID, 0, 22, true},
	} {
		got, _ := res.MapState.AllowedWithCIDR(Egress, c.id, c.cidrID, 6, c.port)
		if got != c.want {
			t.Errorf("%s: allowed = %v, want %v", c.name, got, c.want)
		}
	}
}

// An audited rule selects an endpoint: the resolution holds both views in
// one map state, and each view evaluated on it answers as that view
// resolved alone (the enforced view: without the audited rules; the audit
// view: with them enforced).
func TestAuditedRulesMergeBothViews(t *testing.T) {
	enforced := `[
	 {"endpointSelector":{"matchLabels":{"app":"a"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"},{"port":"81","protocol":"TCP"}]}]}],
	  "egress":[{"toEntities":["all"]}]},
	 {"endpointSelector":{"matchLabels":{"app":"a"}},"ingressDeny":[{"fromEntities":["world"],"toPorts":[{"ports":[{"port":"22","protocol":"TCP"}]}]}]}
	]`
	audited := `[
	 {"endpointSelector":{"matchLabels":{"app":"a"}},"enforcementMode":"audit",
	  "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]},{"fromEntities":["world"],"toPorts":[{"ports":[{"port":"1024","endPort":2047,"protocol":"TCP"}]}]}],
	  "ingressDeny":[{"fromEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"y"}}]}],
	  "egressDeny":[{"toCIDR":["10.1.2.0/24"],"toPorts":[{"ports":[{"port":"443","protocol":"TCP"}]}]}]}
	]`
	both := NewRepository()
	if _, err := both.Add(mustRules(t, enforced), "x", "e", false); err != nil {
		t.Fatal(err)
	}
	if _, err := both.Add(mustRules(t, audited), "x", "a", false); err != nil {
		t.Fatal(err)
	}
	onlyE := NewRepository()
	if _, err := onlyE.Add(mustRules(t, enforced), "x", "e", false); err != nil {
		t.Fatal(err)
	}
	asEnforced := NewRepository()
	if _, err := asEnforced.Add(mustRules(t, enforced), "x", "e", false); err != nil {
		t.Fatal(err)
	}
	rules := mustRules(t, audited)
	for _, r := range rules {
		r.EnforcementMode = ""
	}
	if _, err := asEnforced.Add(rules, "x", "a", false); err != nil {
		t.Fatal(err)
	}
	ep := Endpoint{Labels: xa.Labels}
	res := both.Resolve(ep, universe())
	if !res.AuditIngress || !res.AuditEgress || res.AuditCookie[Ingress] == 0 {
		t.Fatalf("audit flags %v %v cookie %v", res.AuditIngress, res.AuditEgress, res.AuditCookie)
	}
	e, a := onlyE.Resolve(ep, universe()), asEnforced.Resolve(ep, universe())
	ids := []identity.NumericIdentity{xb.ID, ya.ID, identity.World, c8.ID, c24.ID, identity.Host}
	checked := 0
	for _, dir := range []uint8{Ingress, Egress} {
		for _, id := range ids {
			for _, port := range []uint16{22, 79, 80, 81, 443, 1024, 1500, 2047, 2048} {
				ge, _ := res.MapState.Allowed(dir, id, 6, port)
				we, _ := e.MapState.Allowed(dir, id, 6, port)
				ga, _ := res.MapState.AuditAllowed(dir, id, 6, port)
				wa, _ := a.MapState.Allowed(dir, id, 6, port)
				if ge != we || ga != wa {
					t.Errorf("dir %d identity %d port %d: enforced view %v (alone %v), audit view %v (alone %v)", dir, id, port, ge, we, ga, wa)
				}
				checked++
			}
		}
	}
	// The views differ where the audited rule would deny what passes (an
	// audited allow cannot take away another rule's allow: b:81 stays
	// allowed in both).
	if ok, _ := res.MapState.AuditAllowed(Ingress, xb.ID, 6, 81); !ok {
		t.Error("audit view denies b:81, which an enforced rule allows")
	}
	if ok, _ := res.MapState.Allowed(Egress, c24.ID, 6, 443); !ok {
		t.Error("enforced view denies the CIDR")
	}
	if ok, _ := res.MapState.AuditAllowed(Egress, c24.ID, 6, 443); ok {
		t.Error("audit view allows the denied CIDR")
	}
	t.Logf("%d probes", checked)
}

// TestAllowLocalhost: with AllowLocalhost (Cilium's --allow-localhost
// always) the node may reach its endpoints under ingress policy on every
// port (the kubelet's probes come from it), a deny from host still wins
// for what it covers, egress is not affected, and without it host is an
// identity like any other.
func TestAllowLocalhost(t *testing.T) {
	doc := `[{"endpointSelector":{},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}],` +
		`"ingressDeny":[{"fromEntities":["host"],"toPorts":[{"ports":[{"port":"22","protocol":"TCP"}]}]}],"egress":[{"toEndpoints":[{"matchLabels":{"app":"b"}}]}]}]`
	for _, allow := range []bool{false, true} {
		repo := NewRepository()
		repo.SetAllowLocalhost(allow)
		if _, err := repo.Add(mustRules(t, doc), "x", "test", false); err != nil {
			t.Fatal(err)
		}
		res := repo.Resolve(Endpoint{Labels: xa.Labels}, universe())
		for _, p := range []probe{
			{Ingress, identity.Host, 6, 8080, allow}, {Ingress, identity.Host, 17, 53, allow},
			{Ingress, identity.Host, 6, 22, false}, {Ingress, xb.ID, 6, 80, true}, {Ingress, xb.ID, 6, 8080, false},
			{Ingress, identity.World, 6, 8080, false}, {Egress, identity.Host, 6, 80, false},
		} {
			if got, _ := res.MapState.Allowed(p.dir, p.peer, p.proto, p.port); got != p.allow {
				t.Errorf("allowLocalhost=%v: dir %d from %d %d/%d: allowed=%v, want %v (state %v)", allow, p.dir, p.peer, p.proto, p.port, got, p.allow, res.MapState)
			}
		}
	}
}
