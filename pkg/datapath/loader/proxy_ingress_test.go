package loader

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// An ingress entry naming the HTTP proxy opens its port only through the
// proxy: a packet to_pod would deliver (the node routed it, or it came
// through the tunnel) is dropped, since only from_pod (a tc ingress hook)
// can assign it to the proxy's socket (from_pod's own drop when no proxy
// listens is TestPrivilegedIngressRedirectRealTraffic's last step, in
// pkg/l7redirect). The proxy's own
// connection, marked PROXY_MARK_UPSTREAM, passes to_pod without the
// pod's ingress policy, which admits nothing else here.
func TestPrivilegedIngressProxyPortClosedElsewhere(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(true, false)
	m := n.l.Maps()
	const syn = 0x02
	tcp := func(sp, dp uint16) l4 { return l4{proto: 6, sport: sp, dport: dp, tcpFlags: syn} }
	for _, id := range []uint32{idRemote, idB} {
		k := maps.PolicyKey{EndpointID: 1, Direction: maps.DirIngress, Identity: id, Proto: 6, Port: 8080, PortPrefixLen: 16}
		if err := m.PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 12, Proxy: maps.ProxyHttp}); err != nil {
			t.Fatal(err)
		}
	}
	denied := n.metric(maps.ReasonPolicyDenied, maps.DirIngress)
	if got := n.toPod(n.ifidx, packet(remote, podA, tcp(42000, 8080))); got != actShot {
		t.Fatalf("to_pod of a flow for the ingress HTTP proxy = %d, want drop", got)
	}
	if d := n.metric(maps.ReasonPolicyDenied, maps.DirIngress) - denied; d != 1 {
		t.Errorf("%d ingress policy drops counted, want 1", d)
	}
	// The proxy's upstream connection: the node's address, no entry.
	_, to := n.l.Programs()
	run := func(mark uint32, sport uint16) uint32 {
		ctx := skbContext{}
		ctx.Fields[2] = mark
		ctx.Fields[10] = uint32(n.ifidx)
		ret, err := to.Run(&ebpf.RunOptions{Data: packet(remote, podA, tcp(sport, 8080)), Context: ctx})
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}
	if got := run(0, 42002); got != actShot {
		t.Fatalf("the node's connection without the proxy's mark = %d, want drop", got)
	}
	if got := run(maps.ProxyMarkUpstream, 42003); got != actOK {
		t.Fatalf("the proxy's marked connection = %d, want pass", got)
	}
	if got := run(maps.ProxyMarkValue, 42004); got != actShot {
		t.Fatalf("a connection with the redirect's mark (not the upstream's) = %d, want drop", got)
	}
}
