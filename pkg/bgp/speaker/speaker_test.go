// The test routers listen; Go's listeners are MPTCP by default since Go
// 1.24, and an MPTCP socket refuses TCP_MD5SIG (ENOPROTOOPT), so gobgp
// could not set a router's password. The node's speaker listens nowhere
// and dials plain TCP, where the password is set.
//go:debug multipathtcp=0

package speaker

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	gobgpapi "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/server"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/bgp"
	"github.com/tendril-net/tendril/pkg/freeport"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// router is a second gobgp server on loopback: the node's peer. It
// listens on port, accepts the node (127.0.0.1, ASN nodeASN) passively
// and announces 192.0.2.0/24 to it.
func router(t testing.TB, port int, nodeASN uint32) *server.BgpServer {
	t.Helper()
	return routerWithPassword(t, port, nodeASN, "")
}

// routerWithPassword is router, requiring the TCP MD5 password pw of the
// node's session ("": none).
func routerWithPassword(t testing.TB, port int, nodeASN uint32, pw string) *server.BgpServer {
	t.Helper()
	r := server.NewBgpServer(server.LoggerOption(newLogger(slog.New(slog.DiscardHandler))))
	go r.Serve()
	t.Cleanup(r.Stop)
	ctx := context.Background()
	if err := r.StartBgp(ctx, &gobgpapi.StartBgpRequest{Global: &gobgpapi.Global{Asn: 65000, RouterId: "10.0.0.254",
		ListenPort: int32(port), ListenAddresses: []string{"127.0.0.1"}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.StopBgp(context.Background(), &gobgpapi.StopBgpRequest{}) })
	if err := r.AddPeer(ctx, &gobgpapi.AddPeerRequest{Peer: &gobgpapi.Peer{
		Conf:      &gobgpapi.PeerConf{NeighborAddress: "127.0.0.1", PeerAsn: nodeASN, AuthPassword: pw},
		Transport: &gobgpapi.Transport{PassiveMode: true},
		Timers:    &gobgpapi.Timers{Config: &gobgpapi.TimersConfig{HoldTime: 9, KeepaliveInterval: 3, ConnectRetry: 1}},
	}}); err != nil {
		t.Fatal(err)
	}
	p, err := newPath(netip.MustParsePrefix("192.0.2.0/24"), bgp.Attributes{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddPath(ctx, &gobgpapi.AddPathRequest{Path: p}); err != nil {
		t.Fatal(err)
	}
	return r
}

// learned are the prefixes the router's RIB holds.
func learned(t *testing.T, r *server.BgpServer) []string {
	t.Helper()
	var out []string
	err := r.ListPath(context.Background(), &gobgpapi.ListPathRequest{TableType: gobgpapi.TableType_GLOBAL,
		Family: &gobgpapi.Family{Afi: gobgpapi.Family_AFI_IP, Safi: gobgpapi.Family_SAFI_UNICAST}}, func(d *gobgpapi.Destination) {
		out = append(out, d.Prefix)
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func desired(port int, peerASN uint32, adverts ...string) bgp.Desired {
	d := bgp.Desired{Config: "test", LocalASN: 65001, Peers: []bgp.Peer{{Name: "router", Address: netip.MustParseAddr("127.0.0.1"),
		ASN: peerASN, Port: uint16(port), HoldTime: 9, KeepAlive: 3, ConnectRetry: 1}}}
	for _, a := range adverts {
		d.Adverts = append(d.Adverts, bgp.Advert{Prefix: netip.MustParsePrefix(a), Source: "test"})
	}
	return d
}

func allowed(t *testing.T) bgp.Allowed {
	pool, err := bgp.ParsePool(&v1alpha1.TendrilLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: "lb"},
		Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: "172.30.1.0/28"}}}})
	if err != nil {
		t.Fatal(err)
	}
	return bgp.NewAllowed([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, []bgp.Pool{pool})
}

// TestSpeakerAnnouncesToARealPeer runs the speaker against a second
// gobgp server on loopback: the session comes up, the router learns the
// pod CIDR and the pool address, a prefix the guard refuses never
// reaches it (Apply fails naming it), a withdrawn advert leaves the
// router's table, and the routes read back in Cilium's shape.
func TestSpeakerAnnouncesToARealPeer(t *testing.T) {
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	r := router(t, port, 65001)
	s := New(slog.New(slog.DiscardHandler), -1)
	t.Cleanup(func() { s.Stop(context.Background()) })
	ctx := context.Background()
	routerID := netip.MustParseAddr("10.0.0.1")

	if _, err := s.Apply(ctx, desired(port, 65000, "10.244.1.0/24", "172.30.1.2/32"), routerID, allowed(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the router to learn the node's prefixes", func() bool {
		return slices.Equal(learned(t, r), []string{"10.244.1.0/24", "172.30.1.2/32", "192.0.2.0/24"})
	})
	peers, err := s.Peers(ctx)
	if err != nil || len(peers) != 1 || peers[0].SessionState != "established" || peers[0].PeerAsn != 65000 || peers[0].LocalAsn != 65001 {
		t.Fatalf("peers %+v, %v", peers, err)
	}

	// An advert outside what the node was given: refused before gobgp.
	_, err = s.Apply(ctx, desired(port, 65000, "10.244.1.0/24", "172.30.1.2/32", "8.8.8.8/32", "10.244.0.0/16"), routerID, allowed(t))
	if err == nil || !strings.Contains(err.Error(), "refused to announce 8.8.8.8/32") || !strings.Contains(err.Error(), "refused to announce 10.244.0.0/16") {
		t.Fatalf("Apply with prefixes outside the node's: %v", err)
	}
	if got := s.Announced(); len(got) != 2 {
		t.Fatalf("announced %v", got)
	}

	// Withdraw the service address.
	if _, err := s.Apply(ctx, desired(port, 65000, "10.244.1.0/24"), routerID, allowed(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the router to drop the withdrawn address", func() bool {
		return slices.Equal(learned(t, r), []string{"10.244.1.0/24", "192.0.2.0/24"})
	})
	for _, l := range learned(t, r) {
		if l == "8.8.8.8/32" || l == "10.244.0.0/16" {
			t.Fatalf("router learned %s", l)
		}
	}

	loc, err := s.Routes(ctx, RouteQuery{TableType: "loc-rib", AFI: "ipv4", SAFI: "unicast"})
	if err != nil {
		t.Fatal(err)
	}
	if len(loc) != 2 || loc[0].Prefix != "10.244.1.0/24" || len(loc[0].Paths) != 1 || loc[0].Paths[0].Nlri.Base64 == "" ||
		len(loc[0].Paths[0].PathAttributes) == 0 || loc[1].Prefix != "192.0.2.0/24" {
		t.Fatalf("loc-rib %+v: want the node's own pod CIDR and the router's route", loc)
	}
	in, err := s.Routes(ctx, RouteQuery{TableType: "adj-rib-in", AFI: "ipv4", SAFI: "unicast", Neighbor: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(in) != 1 || in[0].Prefix != "192.0.2.0/24" {
		t.Fatalf("adj-rib-in %+v: want the router's route", in)
	}
	if _, err := s.Routes(ctx, RouteQuery{TableType: "adj-rib-in", AFI: "ipv4", SAFI: "unicast"}); err == nil {
		t.Fatal("adj-rib-in without a neighbor accepted")
	}

	// No config: BGP stops, the router loses the routes.
	if _, err := s.Apply(ctx, bgp.Desired{}, routerID, allowed(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the router to drop the node's routes", func() bool {
		return slices.Equal(learned(t, r), []string{"192.0.2.0/24"})
	})
}

// TestSpeakerReportsAWrongASN: the peer's ASN in the config is not the
// router's; the session does not come up and PeerStates says why.
func TestSpeakerReportsAWrongASN(t *testing.T) {
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	router(t, port, 65001)
	s := New(slog.New(slog.DiscardHandler), -1)
	t.Cleanup(func() { s.Stop(context.Background()) })
	ctx := context.Background()
	if _, err := s.Apply(ctx, desired(port, 65099), netip.MustParseAddr("10.0.0.1"), allowed(t)); err != nil {
		t.Fatal(err)
	}
	var st []PeerState
	eventually(t, "a reason for the session that is down", func() bool {
		st, err = s.PeerStates(ctx)
		return err == nil && len(st) == 1 && st[0].Reason != ""
	})
	if st[0].State == "established" || st[0].Name != "router" {
		t.Fatalf("peer state %+v", st[0])
	}
	if !strings.Contains(st[0].Reason, "as number mismatch expected 65099, received 65000") {
		t.Fatalf("reason %q does not name the ASN mismatch", st[0].Reason)
	}
}

// TestSpeakerReportsAnUnreachablePeer: nothing listens at the peer's
// port; PeerStates says the connection failed.
func TestSpeakerReportsAnUnreachablePeer(t *testing.T) {
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	s := New(slog.New(slog.DiscardHandler), -1)
	t.Cleanup(func() { s.Stop(context.Background()) })
	ctx := context.Background()
	if _, err := s.Apply(ctx, desired(port, 65000), netip.MustParseAddr("10.0.0.1"), allowed(t)); err != nil {
		t.Fatal(err)
	}
	var st []PeerState
	eventually(t, "a reason for the unreachable peer", func() bool {
		st, err = s.PeerStates(ctx)
		return err == nil && len(st) == 1 && st[0].Reason != ""
	})
	if st[0].State == "established" || !strings.Contains(st[0].Reason, "failed to connect") || !strings.Contains(st[0].Reason, "connection refused") {
		t.Fatalf("peer state %+v", st[0])
	}
}

// routerAttrs are the communities, large communities and local preference
// of prefix in the router's table ("" when absent).
func routerAttrs(t *testing.T, r *server.BgpServer, prefix string) (comms []uint32, large []string, localPref uint32, found bool) {
	t.Helper()
	err := r.ListPath(context.Background(), &gobgpapi.ListPathRequest{TableType: gobgpapi.TableType_GLOBAL,
		Family: &gobgpapi.Family{Afi: gobgpapi.Family_AFI_IP, Safi: gobgpapi.Family_SAFI_UNICAST}}, func(d *gobgpapi.Destination) {
		if d.Prefix != prefix || len(d.Paths) == 0 {
			return
		}
		found = true
		for _, a := range d.Paths[0].Pattrs {
			v, err := a.UnmarshalNew()
			if err != nil {
				t.Fatal(err)
			}
			switch x := v.(type) {
			case *gobgpapi.CommunitiesAttribute:
				comms = x.Communities
			case *gobgpapi.LargeCommunitiesAttribute:
				for _, l := range x.Communities {
					large = append(large, bgp.LargeCommunity{GlobalAdmin: l.GlobalAdmin, LocalData1: l.LocalData1, LocalData2: l.LocalData2}.String())
				}
			case *gobgpapi.LocalPrefAttribute:
				localPref = x.LocalPref
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return comms, large, localPref, found
}

// TestSpeakerSendsAttributes: the router gets a prefix's communities and
// large communities, and a change of them reaches it as a new path of the
// prefix; LOCAL_PREF goes to an iBGP peer and never to an eBGP one.
func TestSpeakerSendsAttributes(t *testing.T) {
	attrs := bgp.Attributes{Communities: []uint32{65000<<16 | 100, 0xFFFFFF01},
		LargeCommunities: []bgp.LargeCommunity{{GlobalAdmin: 65000, LocalData1: 1, LocalData2: 2}}, LocalPreference: 200}
	for _, c := range []struct {
		name    string
		nodeASN uint32 // the router is AS 65000
		wantLP  uint32
	}{{"eBGP", 65001, 0}, {"iBGP", 65000, 200}} {
		t.Run(c.name, func(t *testing.T) {
			port, err := freeport.Loopback()
			if err != nil {
				t.Fatal(err)
			}
			r := router(t, port, c.nodeASN)
			s := New(slog.New(slog.DiscardHandler), -1)
			t.Cleanup(func() { s.Stop(context.Background()) })
			ctx := context.Background()
			routerID := netip.MustParseAddr("10.0.0.1")
			d := desired(port, 65000, "10.244.1.0/24")
			d.LocalASN = c.nodeASN
			d.Adverts[0].Attributes = attrs
			if _, err := s.Apply(ctx, d, routerID, allowed(t)); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the router to learn the prefix with its communities", func() bool {
				comms, large, _, found := routerAttrs(t, r, "10.244.1.0/24")
				return found && slices.Equal(comms, attrs.Communities) && slices.Equal(large, []string{"65000:1:2"})
			})
			if _, _, lp, _ := routerAttrs(t, r, "10.244.1.0/24"); lp != c.wantLP {
				t.Errorf("LOCAL_PREF %d at the router, want %d", lp, c.wantLP)
			}
			changed := bgp.Attributes{Communities: []uint32{65000<<16 | 300}}
			d.Adverts[0].Attributes = changed
			if _, err := s.Apply(ctx, d, routerID, allowed(t)); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the router to get the changed communities", func() bool {
				comms, large, _, found := routerAttrs(t, r, "10.244.1.0/24")
				return found && slices.Equal(comms, changed.Communities) && len(large) == 0
			})
		})
	}
}

// TestSpeakerMD5: a router that requires a TCP MD5 password (RFC 2385)
// gets no session from a node without it or with another, and one with
// the right password; the API says the session has a password, never
// which.
func TestSpeakerMD5(t *testing.T) {
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	r := routerWithPassword(t, port, 65001, "s3cret-of-the-rack")
	ctx := context.Background()
	routerID := netip.MustParseAddr("10.0.0.1")
	established := func(s *Speaker) bool {
		peers, err := s.Peers(ctx)
		return err == nil && len(peers) == 1 && peers[0].SessionState == "established"
	}
	for _, pw := range []string{"", "wrong-password"} {
		s := New(slog.New(slog.DiscardHandler), -1)
		d := desired(port, 65000, "10.244.1.0/24")
		d.Peers[0].Password = pw
		if _, err := s.Apply(ctx, d, routerID, allowed(t)); err != nil {
			t.Fatal(err)
		}
		// The node retries every second (connect retry 1): five tries.
		time.Sleep(5 * time.Second)
		if established(s) || len(learned(t, r)) != 1 {
			t.Errorf("password %q: a session to the router that requires another (router's table %v)", pw, learned(t, r))
		}
		s.Stop(ctx)
	}
	s := New(slog.New(slog.DiscardHandler), -1)
	t.Cleanup(func() { s.Stop(context.Background()) })
	d := desired(port, 65000, "10.244.1.0/24")
	d.Peers[0].Password = "s3cret-of-the-rack"
	if _, err := s.Apply(ctx, d, routerID, allowed(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the session with the right password", func() bool { return established(s) })
	eventually(t, "the router to learn the pod CIDR", func() bool {
		return slices.Equal(learned(t, r), []string{"10.244.1.0/24", "192.0.2.0/24"})
	})
	peers, _ := s.Peers(ctx)
	if !peers[0].TCPPasswordEnabled {
		t.Error("the peer's model says no password")
	}
	if printed := fmt.Sprintf("%v %+v", d.Peers[0], d.Peers); strings.Contains(printed, "s3cret") {
		t.Error("a peer printed with fmt shows its password")
	}
}
