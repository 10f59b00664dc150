package agentpolicy

import (
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/policy"
)

func TestHostFirewallAlwaysAllowParsing(t *testing.T) {
	got, err := parseAlwaysAllow(DefaultHostFirewallAlwaysAllow)
	if err != nil {
		t.Fatal(err)
	}
	want := []policy.AlwaysAllowPort{{Direction: policy.Ingress, Proto: 6, Port: 6443}, {Direction: policy.Egress, Proto: 6, Port: 6443}, {Direction: policy.Ingress, Proto: 6, Port: 10250}, {Direction: policy.Ingress, Proto: 6, Port: 4240}, {Direction: policy.Egress, Proto: 6, Port: 4240}}
	if len(got) != len(want) {
		t.Fatalf("defaults %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("default %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"ingress/tcp", "in/tcp/1", "ingress/icmp/8", "egress/udp/0", "egress/udp/65536", "egress/udp/http"} {
		c := DefaultConfig()
		c.HostFirewallAlwaysAllow = []string{bad}
		if err := c.validate(); err == nil || !strings.Contains(err.Error(), "host-firewall-always-allow") {
			t.Errorf("%q: error %v, want one naming the flag", bad, err)
		}
	}
}
