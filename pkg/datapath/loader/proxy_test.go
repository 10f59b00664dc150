package loader

import (
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// The redirect decision, by BPF_PROG_TEST_RUN: a new flow allowed by an
// entry naming a proxy records the proxy in its conntrack entry (its
// later packets go there too), one allowed by an entry without a proxy
// does not. With no proxy socket (none here: the agent is down), a DNS
// proxy's flow passes as its L4 allow says and an HTTP proxy's is
// dropped; an entry without a proxy passes.
func TestPrivilegedRedirectDecision(t *testing.T) {
	n := newNode(t)
	n.addEndpoints(false, true)
	pm := n.l.Maps().PolicyMap()
	for _, e := range []struct {
		proto uint8
		port  uint16
		proxy uint8
	}{{17, 53, maps.ProxyDns}, {6, 80, maps.ProxyHttp}, {6, 443, maps.ProxyNone}} {
		k := maps.PolicyKey{EndpointID: 1, Direction: maps.DirEgress, Identity: idRemote, Proto: e.proto, Port: e.port, PortPrefixLen: 16}
		if err := pm.Upsert(k, maps.PolicyValue{Cookie: 11, Proxy: e.proxy}); err != nil {
			t.Fatal(err)
		}
		v, ok, err := pm.Lookup(k)
		if err != nil || !ok || v.Proxy != e.proxy {
			t.Fatalf("entry %v read back as %+v (%v, %v), want proxy %d", k, v, ok, err, e.proxy)
		}
	}
	for _, c := range []struct {
		name  string
		l4    l4
		want  uint32
		proxy uint8
	}{
		{"DNS, no proxy socket: passes at L4", l4{proto: 17, sport: 40000, dport: 53}, 0, maps.ProxyDns},
		{"HTTP, no proxy socket: dropped", l4{proto: 6, sport: 40001, dport: 80, tcpFlags: 0x02}, 2, maps.ProxyHttp},
		{"no proxy", l4{proto: 6, sport: 40002, dport: 443, tcpFlags: 0x02}, 0, maps.ProxyNone},
	} {
		if got := n.fromPod(n.ifidx, packet(podA, remote, c.l4)); got != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, got, c.want)
		}
		var found bool
		for _, e := range n.ctEntries(1) {
			if e.SrcPort == c.l4.sport {
				found = true
				if e.Proxy != c.proxy {
					t.Errorf("%s: conntrack entry names proxy %d, want %d", c.name, e.Proxy, c.proxy)
				}
			}
		}
		if !found && c.want == 0 {
			t.Errorf("%s: no conntrack entry", c.name)
		}
	}
}
