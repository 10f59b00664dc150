package policy

import (
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
)

// A port with L7 rules gets an egress entry naming the proxy that enforces
// them, and the result holds the rules; an allow without L7 rules at the
// same key or covering it makes the proxy allow everything there; a pod's
// ingress L7 rules give ingress entries naming the HTTP proxy.
func TestL7RedirectEntries(t *testing.T) {
	repo := NewRepository()
	if _, err := repo.Add(mustRules(t, `[{"endpointSelector":{"matchLabels":{"app":"a"}},"egress":[
	  {"toEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"53","protocol":"ANY"}],"rules":{"dns":[{"matchName":"world.example"}]}}]},
	  {"toEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"53","protocol":"UDP"}],"rules":{"dns":[{"matchPattern":"*.test"}]}}]},
	  {"toEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}],"rules":{"http":[{"method":"GET"}]}}]},
	  {"toEntities":["world"],"toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}],"rules":{"http":[{"method":"GET"}]}}]},
	  {"toEntities":["world"],"toPorts":[{"ports":[{"port":"8000","protocol":"TCP","endPort":8100}]}]}
	],"ingress":[
	  {"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"81","protocol":"TCP"}],"rules":{"http":[{"method":"GET"}]}}]}
	]}]`), "x", "t", false); err != nil {
		t.Fatal(err)
	}
	res := repo.Resolve(Endpoint{Labels: xa.Labels}, universe())
	key := func(id identity.NumericIdentity, dir, proto uint8, port uint16) Key {
		return Key{Identity: id, Direction: dir, Proto: proto, Port: port, PrefixLen: 16}
	}
	for _, c := range []struct {
		name     string
		k        Key
		proxy    uint8
		dns      int
		http     int
		allowAll bool
	}{
		{"DNS over UDP, both sections' names", key(xb.ID, Egress, 17, 53), ProxyDNS, 2, 0, false},
		{"DNS over TCP", key(xb.ID, Egress, 6, 53), ProxyDNS, 1, 0, false},
		{"HTTP", key(xb.ID, Egress, 6, 80), ProxyHTTP, 0, 1, false},
		{"HTTP under an L4 allow of its port range", key(identity.World, Egress, 6, 8080), ProxyHTTP, 0, 1, true},
		{"ingress HTTP", key(xb.ID, Ingress, 6, 81), ProxyHTTP, 0, 1, false},
	} {
		e, ok := res.MapState[c.k]
		if !ok || e.Deny || e.Proxy != c.proxy {
			t.Errorf("%s: entry %+v (present %v), want an allow with proxy %d", c.name, e, ok, c.proxy)
			continue
		}
		r := res.L7[c.k]
		if r == nil || len(r.DNS) != c.dns || len(r.HTTP) != c.http || r.AllowAll != c.allowAll {
			t.Errorf("%s: L7 rules %+v, want %d DNS, %d HTTP, allow all %v", c.name, r, c.dns, c.http, c.allowAll)
		}
	}
	// Host policies cannot hold L7 rules (validation); the host
	// endpoint's resolution would not open such a port either.
}

// Proxied's ingress half (the datapath's EP_L7_INGRESS) holds only for an endpoint
// whose ingress allows name a proxy: egress L7 rules, plain ingress
// allows and denies do not make its packets from other nodes pay the
// ingress proxy's lookup.
func TestIngressProxied(t *testing.T) {
	for _, c := range []struct {
		name  string
		rules string
		want  bool
	}{
		{"ingress HTTP rules", `[{"endpointSelector":{"matchLabels":{"app":"a"}},"ingress":[
		  {"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"81","protocol":"TCP"}],"rules":{"http":[{"method":"GET"}]}}]}]}]`, true},
		{"egress HTTP rules only", `[{"endpointSelector":{"matchLabels":{"app":"a"}},"egress":[
		  {"toEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}],"rules":{"http":[{"method":"GET"}]}}]}]}]`, false},
		{"plain ingress allow", `[{"endpointSelector":{"matchLabels":{"app":"a"}},"ingress":[
		  {"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"81","protocol":"TCP"}]}]}]}]`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			repo := NewRepository()
			if _, err := repo.Add(mustRules(t, c.rules), "x", "t", false); err != nil {
				t.Fatal(err)
			}
			res := repo.Resolve(Endpoint{Labels: xa.Labels}, universe())
			if got, _ := res.MapState.Proxied(); got != c.want {
				t.Errorf("ingress proxied = %v, want %v (map state %v)", got, c.want, res.MapState)
			}
		})
	}
}

// Proxied's egress half (the datapath's EP2_L7_EGRESS) holds only for an endpoint
// whose egress allows name a proxy (DNS or HTTP rules): ingress L7 rules
// and plain egress allows do not make its packets from other nodes pay the
// lookup for the HTTP proxy's upstream connection.
func TestEgressProxied(t *testing.T) {
	for _, c := range []struct {
		name  string
		rules string
		want  bool
	}{
		{"egress HTTP rules", `[{"endpointSelector":{"matchLabels":{"app":"a"}},"egress":[
		  {"toEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}],"rules":{"http":[{"method":"GET"}]}}]}]}]`, true},
		{"egress DNS rules", `[{"endpointSelector":{"matchLabels":{"app":"a"}},"egress":[
		  {"toEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"53","protocol":"ANY"}],"rules":{"dns":[{"matchPattern":"*"}]}}]}]}]`, true},
		{"ingress HTTP rules only", `[{"endpointSelector":{"matchLabels":{"app":"a"}},"ingress":[
		  {"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"81","protocol":"TCP"}],"rules":{"http":[{"method":"GET"}]}}]}]}]`, false},
		{"plain egress allow", `[{"endpointSelector":{"matchLabels":{"app":"a"}},"egress":[
		  {"toEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]}]`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			repo := NewRepository()
			if _, err := repo.Add(mustRules(t, c.rules), "x", "t", false); err != nil {
				t.Fatal(err)
			}
			res := repo.Resolve(Endpoint{Labels: xa.Labels}, universe())
			if _, got := res.MapState.Proxied(); got != c.want {
				t.Errorf("egress proxied = %v, want %v (map state %v)", got, c.want, res.MapState)
			}
		})
	}
}
