package agentpolicy

import (
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/policy"
)

// TestHostFirewallSection: the status section says per direction whether
// the host endpoint enforces, audits or is open, the last resolution's
// rules and entries, and the always-open ports in the flag's spelling;
// off, the firewall contributes no section.
func TestHostFirewallSection(t *testing.T) {
	always, err := parseAlwaysAllow(DefaultHostFirewallAlwaysAllow)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range always {
		if got := alwaysAllowString(a); got != DefaultHostFirewallAlwaysAllow[i] {
			t.Errorf("always-open port %d reads %q, the flag said %q", i, got, DefaultHostFirewallAlwaysAllow[i])
		}
	}
	if out := hostFirewallStatus(&Module{}); len(out.Contributions) != 0 {
		t.Fatalf("the firewall off contributed %d sections", len(out.Contributions))
	}
	m := &Module{hostCfg: hostFirewallConfig{enabled: true, alwaysAllow: always[:1]}}
	m.hostResult = policy.Result{EnforceIngress: true, AuditEgress: true, Rules: []uint32{3, 4}, Revision: 9,
		MapState: policy.MapState{{Direction: policy.Ingress, Port: 30080, Proto: 6}: {}}}
	out := hostFirewallStatus(m)
	if len(out.Contributions) != 1 {
		t.Fatalf("%d sections", len(out.Contributions))
	}
	sec, ok := out.Contributions[0].Section()
	if !ok {
		t.Fatal("no section")
	}
	got := map[string]string{}
	for _, l := range sec.Lines {
		got[l.Key] = l.Value
	}
	for key, want := range map[string]string{
		"Ingress":     "enforced",
		"Egress":      "audit (",
		"Policy":      "revision 9: 2 rules select this node, 1 map entries",
		"Always open": "ingress/tcp/6443 (unless",
	} {
		if !strings.HasPrefix(got[key], want) {
			t.Errorf("%s: %q, want it to start %q", key, got[key], want)
		}
	}
}
