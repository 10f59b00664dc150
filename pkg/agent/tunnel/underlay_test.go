package tunnel

import (
	"net/netip"
	"testing"

	dptunnel "github.com/tendril-net/tendril/pkg/datapath/tunnel"
)

func TestDetectUnderlay6(t *testing.T) {
	for _, c := range []struct {
		name  string
		addrs []string
		want  bool
	}{
		{"IPv6 only", []string{"::1", "127.0.0.1", "fe80::1", "fd99::1"}, true},
		{"public IPv6 only", []string{"2001:db8::7"}, true},
		{"dual stack", []string{"fd99::1", "192.168.50.1"}, false},
		{"IPv4 only", []string{"10.0.0.4", "fe80::1"}, false},
		{"link-local and loopback only", []string{"::1", "127.0.0.1", "fe80::1", "169.254.0.3"}, false},
		{"none", nil, false},
	} {
		var addrs []netip.Addr
		for _, a := range c.addrs {
			addrs = append(addrs, netip.MustParseAddr(a))
		}
		if got := detectUnderlay6(addrs); got != c.want {
			t.Errorf("%s %v: %v, want %v", c.name, c.addrs, got, c.want)
		}
	}
}

// TestOverheadUnderlay6: 50 bytes over IPv4 and 70 over IPv6 for both
// protocols, 0 in native routing; the carrier's MTU 1450 and 1430.
func TestOverheadUnderlay6(t *testing.T) {
	for _, p := range []string{"vxlan", "geneve"} {
		c := Config{RoutingMode: ModeTunnel, TunnelProtocol: p}
		if got4, got6 := c.Overhead(false), c.Overhead(true); got4 != 50 || got6 != 70 {
			t.Errorf("%s: overhead %d over IPv4, %d over IPv6; want 50, 70", p, got4, got6)
		}
	}
	if got := (Config{RoutingMode: ModeNative, TunnelProtocol: "vxlan"}).Overhead(true); got != 0 {
		t.Errorf("native routing: overhead %d, want 0", got)
	}
	if m4, m6 := dptunnel.CarrierMTU(false), dptunnel.CarrierMTU(true); m4 != 1450 || m6 != 1430 {
		t.Errorf("carrier MTU %d over IPv4, %d over IPv6; want 1450, 1430", m4, m6)
	}
	if u := routingSection(Config{RoutingMode: ModeTunnel, TunnelProtocol: "geneve"}, nil, true).Lines[0].Value; u != "tunnel (geneve on UDP 6081 over an IPv6 underlay, identity from the ipcache, pod MTU -70)" {
		t.Errorf("routing section over IPv6: %q", u)
	}
}
