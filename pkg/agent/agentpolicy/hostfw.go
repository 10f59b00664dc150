package agentpolicy

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// The host firewall: host policies (rules with a nodeSelector) resolved
// against this node's labels into the policy of the host endpoint
// (endpoint 0 of the policy map; bpf/lib/hostfw.h), with its enforcement
// and audit flags, on every policy pass. docs/host-firewall.md.

// NodeLabels is this node's Kubernetes labels (the k8s client; nil in
// standalone mode, where the node has none).
type NodeLabels interface {
	NodeLabels() map[string]string
}

// DefaultHostFirewallAlwaysAllow are the ports the host firewall keeps
// open to every peer while a host policy enforces their direction, unless
// a host policy names them: the API server (6443, both ways: the agent and
// the kubelet reach it), the kubelet (10250), the agent's health endpoint
// (4240, the default --health-port, both ways: nodes probe each other).
var DefaultHostFirewallAlwaysAllow = []string{"ingress/tcp/6443", "egress/tcp/6443", "ingress/tcp/10250", "ingress/tcp/4240", "egress/tcp/4240"}

// parseAlwaysAllow parses --host-firewall-always-allow entries
// (direction/protocol/port).
func parseAlwaysAllow(list []string) ([]policy.AlwaysAllowPort, error) {
	out := make([]policy.AlwaysAllowPort, 0, len(list))
	for _, s := range list {
		parts := strings.Split(strings.ToLower(strings.TrimSpace(s)), "/")
		if len(parts) != 3 {
			return nil, fmt.Errorf("host-firewall-always-allow %q: want direction/protocol/port (ingress/tcp/6443)", s)
		}
		var ap policy.AlwaysAllowPort
		switch parts[0] {
		case "ingress":
			ap.Direction = policy.Ingress
		case "egress":
			ap.Direction = policy.Egress
		default:
			return nil, fmt.Errorf("host-firewall-always-allow %q: direction %q is not ingress or egress", s, parts[0])
		}
		switch parts[1] {
		case "tcp":
			ap.Proto = api.ProtoTCP
		case "udp":
			ap.Proto = api.ProtoUDP
		case "sctp":
			ap.Proto = api.ProtoSCTP
		default:
			return nil, fmt.Errorf("host-firewall-always-allow %q: protocol %q is not tcp, udp or sctp", s, parts[1])
		}
		n, err := strconv.Atoi(parts[2])
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("host-firewall-always-allow %q: port %q is not 1-65535", s, parts[2])
		}
		ap.Port = uint16(n)
		out = append(out, ap)
	}
	return out, nil
}

// hostFirewallConfig is the host firewall's part of Config, parsed.
type hostFirewallConfig struct {
	enabled, audit bool
	alwaysAllow    []policy.AlwaysAllowPort
}

// policyKeyOf is a policy map key in the engine's terms.
func policyKeyOf(k maps.PolicyKey) policy.Key {
	return policy.Key{Identity: identity.NumericIdentity(k.Identity), Direction: k.Direction, Proto: k.Proto, Port: k.Port, PrefixLen: k.PortPrefixLen}
}

// hostEndpoint is what the host policy is resolved for.
func (p *Module) hostEndpoint() policy.Endpoint {
	var labels []string
	if p.nodeLabels != nil {
		for k, v := range p.nodeLabels.NodeLabels() {
			labels = append(labels, "k8s:"+k+"="+v)
		}
	}
	return policy.Endpoint{Labels: labels, Host: true, AuditAll: p.hostCfg.audit, AlwaysAllow: p.hostCfg.alwaysAllow}
}

// hostFlags are the datapath flags of a host resolution.
func hostFlags(res policy.Result) uint8 {
	var f uint8
	if res.EnforceIngress {
		f |= maps.FlagEnforceIngress
	}
	if res.EnforceEgress {
		f |= maps.FlagEnforceEgress
	}
	if res.AuditIngress {
		f |= maps.FlagAuditIngress
	}
	if res.AuditEgress {
		f |= maps.FlagAuditEgress
	}
	return f
}

// realizeHost writes the host endpoint's policy and flags. With the host
// firewall off (or enforcement never) the wanted state is empty, so what
// an earlier run left in the pinned maps goes.
//
// The order keeps the node reachable through every step: directions the
// new flags drop stop being checked first, then the entries change (in
// writeOrdered's fail-closed order), and directions the new flags add are
// checked only once their entries are there.
func (p *Module) realizeHost() error {
	if p.dp == nil || p.dp.Maps() == nil {
		return nil
	}
	m := p.dp.Maps()
	epm := m.EndpointMap()
	var res policy.Result
	want := policy.MapState{}
	if p.hostCfg.enabled && p.runtime.Values().PolicyEnforcement != option.EnforcementNever {
		sh := p.sharedFor(p.repo.Revision())
		res = p.repo.Resolve(p.hostEndpoint(), sh.universe)
		want = res.MapState
	}
	newFlags := hostFlags(res)
	p.mu.Lock()
	cur, known := p.hostRealized, p.hostKnown
	p.mu.Unlock()
	oldFlags, err := epm.HostFirewall()
	if err != nil {
		return err
	}
	if !known {
		pinned, err := m.PolicyMap().DumpHost()
		if err != nil {
			return fmt.Errorf("read the host endpoint's realized policy: %w", err)
		}
		cur = fromPinned(pinned)
	}
	if keep := oldFlags & newFlags; keep != oldFlags {
		if err := epm.SetHostFirewall(keep); err != nil {
			return err
		}
	}
	w := writeOrdered(recordPolicyMap(m.PolicyMap(), p.mapEvents), maps.HostEndpointID, cur, want)
	p.mu.Lock()
	p.hostRealized, p.hostKnown, p.hostResult = w.landed, true, res
	p.mu.Unlock()
	if w.err != nil {
		// The new directions stay unchecked until their entries are all
		// there: a partial allow list would lock the node out.
		return fmt.Errorf("host firewall: %w", w.err)
	}
	if newFlags != oldFlags&newFlags {
		if err := epm.SetHostFirewall(newFlags); err != nil {
			return err
		}
	}
	if err := p.revokeHostFlows(m, w, oldFlags, newFlags, res); err != nil {
		return fmt.Errorf("host firewall: %w", err)
	}
	if w.writes > 0 || newFlags != oldFlags {
		p.log.Info("Host firewall policy applied", "revision", res.Revision, "rules", len(res.Rules),
			"enforce-ingress", res.EnforceIngress, "enforce-egress", res.EnforceEgress,
			"audit-ingress", res.AuditIngress, "audit-egress", res.AuditEgress, "entries", len(want))
	}
	return nil
}

// revokeHostFlows ends the node's established flows the host policy just
// realized no longer admits, as --policy-revoke-established says for pods
// (revoke.go): the same walk, over the conntrack entries whose node side
// the host firewall admitted. It runs once the entries and the flags
// landed, so a flow ended here meets the new policy on its next packet.
// What is pending survives a failed walk: the next pass repeats it.
func (p *Module) revokeHostFlows(m *maps.Maps, w writeResult, oldFlags, newFlags uint8, res policy.Result) error {
	pending := revokeFlags(w)
	if began := newFlags &^ oldFlags; began&(maps.FlagEnforceIngress|maps.FlagEnforceEgress) != 0 {
		pending |= revokeAllowGone
	}
	p.mu.Lock()
	p.hostRevoke |= pending
	pending = p.hostRevoke
	p.mu.Unlock()
	if !needsWalk(p.revokeMode, pending) {
		return nil
	}
	side := revokeSide{ctID: maps.HostFirewallCTID, policyID: maps.HostEndpointID,
		ingress: newFlags&maps.FlagEnforceIngress != 0, egress: newFlags&maps.FlagEnforceEgress != 0}
	ended, err := revokeFlows(side, p.revokeMode, flowChecker{pm: m.PolicyMap(), ipc: m.IPCacheMap(), cidr: m.PolicyCIDRMap()}, m.CTMap())
	if err != nil {
		return fmt.Errorf("end the node's established flows its policy revokes: %w", err)
	}
	p.mu.Lock()
	p.hostRevoke &^= pending
	p.mu.Unlock()
	if ended > 0 {
		p.log.Info("Ended the node's established flows the host policy no longer admits", "flows", ended, "mode", p.revokeMode, "revision", res.Revision)
	}
	return nil
}

// fromPinned is a map state read back from the policy map.
func fromPinned(pinned map[maps.PolicyKey]maps.PolicyValue) policy.MapState {
	out := policy.MapState{}
	for k, v := range pinned {
		out[policyKeyOf(k)] = policy.Entry{Deny: v.Deny, Cookie: v.Cookie, Views: viewFlags(v.Flags)}
	}
	return out
}

// HostFirewall is the host firewall's state for the API and the status:
// whether it is on, in audit mode, and the last resolution.
func (p *Module) HostFirewall() (enabled, audit bool, res policy.Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hostCfg.enabled, p.hostCfg.audit, p.hostResult
}

// hostFirewallCollector exports the host firewall's state.
type hostFirewallCollector struct {
	p                 *Module
	enforced, audited *prometheus.Desc
	entries           *prometheus.Desc
}

func newHostFirewallCollector(p *Module) *hostFirewallCollector {
	return &hostFirewallCollector{p: p,
		enforced: prometheus.NewDesc("tendril_host_firewall_enforced", "1 when a host policy enforces the direction on this node.", []string{"direction"}, nil),
		audited:  prometheus.NewDesc("tendril_host_firewall_audited", "1 when a host policy in audit mode (or --host-firewall-audit) audits the direction on this node: its denials are counted in tendril_policy_audited_connections_total and pass.", []string{"direction"}, nil),
		entries:  prometheus.NewDesc("tendril_host_firewall_policy_entries", "Entries of the host endpoint's policy in the policy map.", nil, nil),
	}
}

func (c *hostFirewallCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.enforced
	ch <- c.audited
	ch <- c.entries
}

func (c *hostFirewallCollector) Collect(ch chan<- prometheus.Metric) {
	_, _, res := c.p.HostFirewall()
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	ch <- prometheus.MustNewConstMetric(c.enforced, prometheus.GaugeValue, b(res.EnforceIngress), "ingress")
	ch <- prometheus.MustNewConstMetric(c.enforced, prometheus.GaugeValue, b(res.EnforceEgress), "egress")
	ch <- prometheus.MustNewConstMetric(c.audited, prometheus.GaugeValue, b(res.AuditIngress), "ingress")
	ch <- prometheus.MustNewConstMetric(c.audited, prometheus.GaugeValue, b(res.AuditEgress), "egress")
	ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(len(res.MapState)))
}
