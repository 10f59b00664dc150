package agentpolicy

import (
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// TestL7RulesLookup: the proxy gets the rules of the entry the datapath
// took for the flow: the peer's identity's (an address in no ipcache
// prefix is the world), else any peer's, at the flow's protocol and port;
// nothing for another port, protocol or endpoint.
func TestL7RulesLookup(t *testing.T) {
	worldRules := &policy.L7Rules{DNS: []api.PortRuleDNS{{MatchName: "world.example"}}}
	anyRules := &policy.L7Rules{HTTP: []api.PortRuleHTTP{{Method: "GET"}}}
	key := func(id identity.NumericIdentity, proto uint8, port uint16) policy.Key {
		return policy.Key{Identity: id, Direction: policy.Egress, Proto: proto, Port: port, PrefixLen: 16}
	}
	m := &Module{results: map[uint16]policy.Result{1: {L7: policy.L7Map{
		key(identity.World, 17, 53): worldRules,
		key(0, 6, 80):               anyRules,
	}}}}
	dst := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), port) }
	for _, c := range []struct {
		name  string
		ep    uint16
		proto uint8
		port  uint16
		want  *policy.L7Rules
	}{
		{"the peer's identity", 1, 17, 53, worldRules},
		{"any peer", 1, 6, 80, anyRules},
		{"another protocol", 1, 6, 53, nil},
		{"another port", 1, 6, 81, nil},
		{"another endpoint", 2, 17, 53, nil},
	} {
		if got := m.L7Rules(c.ep, dst(c.port), c.proto); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestL7IngressRulesLookup: the ingress proxy gets the rules of the
// destination's ingress entry for the peer's identity, else any peer's;
// an egress entry at the same port is not an ingress one.
func TestL7IngressRulesLookup(t *testing.T) {
	peerRules := &policy.L7Rules{HTTP: []api.PortRuleHTTP{{Method: "GET", Path: "/ok"}}}
	anyRules := &policy.L7Rules{HTTP: []api.PortRuleHTTP{{Method: "HEAD"}}}
	egressRules := &policy.L7Rules{HTTP: []api.PortRuleHTTP{{Method: "POST"}}}
	key := func(dir uint8, id identity.NumericIdentity, port uint16) policy.Key {
		return policy.Key{Identity: id, Direction: dir, Proto: 6, Port: port, PrefixLen: 16}
	}
	m := &Module{results: map[uint16]policy.Result{2: {L7: policy.L7Map{
		key(policy.Ingress, 1000, 8080): peerRules,
		key(policy.Ingress, 0, 8081):    anyRules,
		key(policy.Egress, 1000, 8082):  egressRules,
	}}}}
	src := netip.MustParseAddr("10.0.0.1")
	for _, c := range []struct {
		name string
		ep   uint16
		peer identity.NumericIdentity
		port uint16
		want *policy.L7Rules
	}{
		{"the peer's identity", 2, 1000, 8080, peerRules},
		{"another identity", 2, 1001, 8080, nil},
		{"any peer", 2, 1001, 8081, anyRules},
		{"an egress entry", 2, 1000, 8082, nil},
		{"another endpoint", 3, 1000, 8080, nil},
	} {
		if got := m.L7IngressRules(c.ep, c.peer, src, c.port, 6); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
