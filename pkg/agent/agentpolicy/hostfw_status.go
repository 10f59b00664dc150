package agentpolicy

import (
	"fmt"
	"strings"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/status"
)

// hostFirewallStatusOrder places the host firewall's section in `tendril
// status` (pkg/status): after Masquerade (40), before the Prefilter (44).
const hostFirewallStatusOrder = 42

// hostFirewallStatus is the host firewall's section, shown only with
// --enable-host-firewall: off, the node has no host endpoint policy.
func hostFirewallStatus(p *Module) status.Out {
	if p == nil || !p.hostCfg.enabled {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: hostFirewallStatusOrder, Section: status.Always(p.hostFirewallSection)})
}

// hostFirewallSection says what the host endpoint enforces now: per
// direction enforced, audited or open, the rules and entries of the last
// resolution, and the ports kept open unless a policy names them.
func (p *Module) hostFirewallSection() ext.Section {
	_, audit, res := p.HostFirewall()
	sec := ext.Section{Title: "Host firewall"}
	mode := func(enforce, audited bool) string {
		switch {
		case audited:
			return "audit (denials counted and shown as AUDIT flows, not dropped)"
		case enforce:
			return "enforced"
		default:
			return "open (no host policy selects this node in this direction)"
		}
	}
	sec.Lines = append(sec.Lines,
		ext.Line{Key: "Ingress", Value: mode(res.EnforceIngress, res.AuditIngress)},
		ext.Line{Key: "Egress", Value: mode(res.EnforceEgress, res.AuditEgress)})
	if audit {
		sec.Lines = append(sec.Lines, ext.Line{Key: "Audit mode", Value: "on for every host policy (--host-firewall-audit)"})
	}
	sec.Lines = append(sec.Lines, ext.Line{Key: "Policy", Value: fmt.Sprintf("revision %d: %d rules select this node, %d map entries", res.Revision, len(res.Rules), len(res.MapState))})
	if len(p.hostCfg.alwaysAllow) > 0 {
		ports := make([]string, 0, len(p.hostCfg.alwaysAllow))
		for _, a := range p.hostCfg.alwaysAllow {
			ports = append(ports, alwaysAllowString(a))
		}
		sec.Lines = append(sec.Lines, ext.Line{Key: "Always open", Value: strings.Join(ports, ", ") + " (unless a host policy names the port)"})
	}
	return sec
}

// alwaysAllowString is the flag's own spelling (ingress/tcp/6443).
func alwaysAllowString(a policy.AlwaysAllowPort) string {
	dir := "ingress"
	if a.Direction == policy.Egress {
		dir = "egress"
	}
	proto := fmt.Sprint(a.Proto)
	switch a.Proto {
	case api.ProtoTCP:
		proto = "tcp"
	case api.ProtoUDP:
		proto = "udp"
	case api.ProtoSCTP:
		proto = "sctp"
	}
	return fmt.Sprintf("%s/%s/%d", dir, proto, a.Port)
}
