// Package api holds the policy rule types: the CiliumNetworkPolicy rule
// schema (endpointSelector, ingress, egress, ingressDeny, egressDeny, ...)
// with the same JSON names, and their validation. A rule that does not
// validate is rejected whole.
//
// The types are also the spec of the Tendril policy CRDs: deepcopy and the
// CRDs' OpenAPI schema are generated from them (`make generate`).
//
// +kubebuilder:object:generate=true
// +k8s:deepcopy-gen=package
package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/tendril-net/tendril/pkg/labels"
)

// Rule is one policy rule.
type Rule struct {
	EndpointSelector  *EndpointSelector  `json:"endpointSelector,omitempty"`
	NodeSelector      *EndpointSelector  `json:"nodeSelector,omitempty"`
	Ingress           []IngressRule      `json:"ingress,omitempty"`
	IngressDeny       []IngressRule      `json:"ingressDeny,omitempty"`
	Egress            []EgressRule       `json:"egress,omitempty"`
	EgressDeny        []EgressRule       `json:"egressDeny,omitempty"`
	EnableDefaultDeny *DefaultDenyConfig `json:"enableDefaultDeny,omitempty"`
	// EnforcementMode is enforce (the default) or audit: an audited rule
	// never drops; what it would deny passes, reported with an AUDIT
	// verdict naming it and counted. Switching to enforce takes effect as
	// any policy change does.
	// +kubebuilder:validation:Enum=enforce;audit
	EnforcementMode string `json:"enforcementMode,omitempty"`
	// Labels identify the rule: policy get and delete select rules by
	// them, and an import with replace replaces the rules with the same.
	Labels      LabelArray `json:"labels,omitempty"`
	Description string     `json:"description,omitempty"`
}

// Enforcement modes of a rule.
const (
	ModeEnforce = "enforce"
	ModeAudit   = "audit"
)

// Audited reports whether the rule is in audit mode.
func (r *Rule) Audited() bool { return r.EnforcementMode == ModeAudit }

// Rules is a list of rules.
type Rules []*Rule

// DefaultDenyConfig says whether a rule puts the endpoint in default deny.
type DefaultDenyConfig struct {
	Ingress *bool `json:"ingress,omitempty"`
	Egress  *bool `json:"egress,omitempty"`
}

// EndpointSelector selects endpoints by labels (a Kubernetes label selector).
type EndpointSelector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions []Requirement     `json:"matchExpressions,omitempty"`
}

// Requirement is one matchExpressions entry.
type Requirement struct {
	Key string `json:"key"`
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// IngressRule is one ingress (or ingressDeny) section.
type IngressRule struct {
	FromEndpoints []EndpointSelector `json:"fromEndpoints,omitempty"`
	FromEntities  []string           `json:"fromEntities,omitempty"`
	FromCIDR      []string           `json:"fromCIDR,omitempty"`
	FromCIDRSet   []CIDRRule         `json:"fromCIDRSet,omitempty"`
	ToPorts       []PortRule         `json:"toPorts,omitempty"`
	ICMPs         []ICMPRule         `json:"icmps,omitempty"`
}

// EgressRule is one egress (or egressDeny) section.
type EgressRule struct {
	ToEndpoints []EndpointSelector `json:"toEndpoints,omitempty"`
	ToEntities  []string           `json:"toEntities,omitempty"`
	ToCIDR      []string           `json:"toCIDR,omitempty"`
	ToCIDRSet   []CIDRRule         `json:"toCIDRSet,omitempty"`
	// ToFQDNs select the addresses the node's DNS proxy saw answered for
	// the names (egress only; not combined with other peers of the
	// section). The pod's DNS lookups must go through a port with DNS
	// rules for the proxy to see them.
	ToFQDNs []FQDNSelector `json:"toFQDNs,omitempty"`
	ToPorts []PortRule     `json:"toPorts,omitempty"`
	ICMPs   []ICMPRule     `json:"icmps,omitempty"`
}

// CIDRRule is a CIDR with exceptions.
type CIDRRule struct {
	CIDR   string   `json:"cidr"`
	Except []string `json:"except,omitempty"`
}

// PortRule lists ports.
type PortRule struct {
	Ports []PortProtocol `json:"ports,omitempty"`
	// Rules are L7 rules for the ports (allow sections only).
	Rules *L7Rules `json:"rules,omitempty"`
}

// PortProtocol is a port (or named port) with an optional range end.
type PortProtocol struct {
	// Port is a number (0 = any) or a named port.
	// +kubebuilder:validation:Pattern=`^(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})|([a-zA-Z0-9]-?)*[a-zA-Z](-?[a-zA-Z0-9])*$`
	Port string `json:"port,omitempty"`
	// EndPort makes Port the start of a range.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	EndPort int32 `json:"endPort,omitempty"`
	// +kubebuilder:validation:Enum=TCP;UDP;SCTP;ANY
	Protocol string `json:"protocol,omitempty"`
}

// ICMPRule lists ICMP types.
type ICMPRule struct {
	Fields []ICMPField `json:"fields,omitempty"`
}

// ICMPField is one ICMP type of a family (IPv4 default).
type ICMPField struct {
	// +kubebuilder:validation:Enum=IPv4;IPv6
	Family string `json:"family,omitempty"`
	// Type is an ICMP type number or name (EchoRequest, ...).
	Type *ICMPValue `json:"type"`
}

// ICMPValue is an ICMP type as a number or (Cilium) name.
//
// +kubebuilder:validation:XIntOrString
// +kubebuilder:validation:Type=""
type ICMPValue struct {
	Value uint8 `json:"-"`
}

// UnmarshalJSON accepts a number, a numeric string or a name.
func (v *ICMPValue) UnmarshalJSON(b []byte) error {
	var n int
	if err := json.Unmarshal(b, &n); err == nil {
		if n < 0 || n > 255 {
			return fmt.Errorf("ICMP type %d out of range", n)
		}
		v.Value = uint8(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("ICMP type must be a number or a name")
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n <= 255 {
		v.Value = uint8(n)
		return nil
	}
	names := map[string]uint8{"EchoReply": 0, "DestinationUnreachable": 3, "Redirect": 5, "Echo": 8, "EchoRequest": 8, "TimeExceeded": 11}
	if n, ok := names[s]; ok {
		v.Value = n
		return nil
	}
	return fmt.Errorf("unknown ICMP type %q", s)
}

// MarshalJSON writes the number.
func (v ICMPValue) MarshalJSON() ([]byte, error) { return json.Marshal(int(v.Value)) }

// Entities the policy language knows.
var entities = []string{"all", "world", "cluster", "host", "remote-node", "kube-apiserver", "health", "init", "unmanaged", "ingress", "world-ipv4", "world-ipv6"}

// IsEntity reports whether name is a known entity.
func IsEntity(name string) bool {
	for _, e := range entities {
		if e == name {
			return true
		}
	}
	return false
}

// ParseRules decodes a JSON array of rules (or a single rule) and validates
// every one; any error rejects the whole document.
func ParseRules(data []byte) (Rules, error) {
	trimmed := strings.TrimSpace(string(data))
	if trimmed == "" {
		return nil, errors.New("policy: empty document")
	}
	var rules Rules
	dec := json.NewDecoder(strings.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if strings.HasPrefix(trimmed, "{") {
		var r Rule
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("policy: %w", err)
		}
		rules = Rules{&r}
	} else if err := dec.Decode(&rules); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	// Only white space may follow (More alone misses a stray ']' or '}').
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("policy: trailing data after the rules")
	}
	if len(rules) == 0 {
		return nil, errors.New("policy: no rules")
	}
	for i, r := range rules {
		if r == nil {
			return nil, fmt.Errorf("policy: rule %d is null", i)
		}
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("policy: rule %d: %w", i, err)
		}
	}
	return rules, nil
}

// Validate checks the rule; errors name the field.
func (r *Rule) Validate() error {
	if r.EnforcementMode != "" && r.EnforcementMode != ModeEnforce && r.EnforcementMode != ModeAudit {
		return fmt.Errorf("enforcementMode %q: want %s or %s", r.EnforcementMode, ModeEnforce, ModeAudit)
	}
	if r.EndpointSelector == nil && r.NodeSelector == nil {
		return errors.New("endpointSelector is required")
	}
	if r.EndpointSelector != nil && r.NodeSelector != nil {
		return errors.New("endpointSelector and nodeSelector are exclusive")
	}
	if r.NodeSelector != nil {
		if err := r.validateHost(); err != nil {
			return err
		}
	} else if err := r.EndpointSelector.Validate("endpointSelector"); err != nil {
		return err
	}
	for i := range r.Ingress {
		if err := r.Ingress[i].validate(fmt.Sprintf("ingress[%d]", i), false); err != nil {
			return err
		}
	}
	for i := range r.IngressDeny {
		if err := r.IngressDeny[i].validate(fmt.Sprintf("ingressDeny[%d]", i), true); err != nil {
			return err
		}
	}
	for i := range r.Egress {
		if err := r.Egress[i].validate(fmt.Sprintf("egress[%d]", i), false); err != nil {
			return err
		}
	}
	for i := range r.EgressDeny {
		if err := r.EgressDeny[i].validate(fmt.Sprintf("egressDeny[%d]", i), true); err != nil {
			return err
		}
	}
	for i, l := range r.Labels {
		if _, err := labels.New(l.Source, l.Key, l.Value); err != nil {
			return fmt.Errorf("labels[%d]: %w", i, err)
		}
	}
	return nil
}

// IsHostPolicy reports whether the rule is a host policy: it selects
// nodes (the host endpoint, the node itself) by their labels instead of
// endpoints. Only cluster-wide policies may be host policies.
func (r *Rule) IsHostPolicy() bool { return r.NodeSelector != nil }

// validateHost checks what a host policy may not hold: the node's own
// traffic is not redirected to a proxy, so L7 rules and toFQDNs (learned
// by the DNS proxy from pods' lookups) cannot apply to it.
func (r *Rule) validateHost() error {
	if err := r.NodeSelector.Validate("nodeSelector"); err != nil {
		return err
	}
	for _, sec := range []struct {
		name  string
		ports func(i int) []PortRule
		n     int
	}{
		{"ingress", func(i int) []PortRule { return r.Ingress[i].ToPorts }, len(r.Ingress)},
		{"egress", func(i int) []PortRule { return r.Egress[i].ToPorts }, len(r.Egress)},
	} {
		for i := 0; i < sec.n; i++ {
			for j, pr := range sec.ports(i) {
				if pr.Rules != nil {
					return fmt.Errorf("%s[%d].toPorts[%d].rules: L7 rules are not allowed in host policies (nodeSelector)", sec.name, i, j)
				}
			}
		}
	}
	for i := range r.Egress {
		if len(r.Egress[i].ToFQDNs) > 0 {
			return fmt.Errorf("egress[%d].toFQDNs: not allowed in host policies (nodeSelector): the DNS proxy sees only pods' lookups", i)
		}
	}
	return nil
}

// ValidateScope checks the rule for a policy of namespace ns ("" for a
// cluster-wide policy): a host policy selects nodes, which belong to no
// namespace.
func (r *Rule) ValidateScope(ns string) error {
	if r.IsHostPolicy() && ns != "" {
		return fmt.Errorf("nodeSelector: host policies must be cluster-wide (a policy of namespace %q cannot select nodes)", ns)
	}
	return nil
}

// Validate checks a selector.
func (s *EndpointSelector) Validate(field string) error {
	for k := range s.MatchLabels {
		if k == "" {
			return fmt.Errorf("%s.matchLabels: empty key", field)
		}
	}
	for i, req := range s.MatchExpressions {
		f := fmt.Sprintf("%s.matchExpressions[%d]", field, i)
		if req.Key == "" {
			return fmt.Errorf("%s.key: empty", f)
		}
		switch req.Operator {
		case "In", "NotIn":
			if len(req.Values) == 0 {
				return fmt.Errorf("%s: operator %s needs values", f, req.Operator)
			}
		case "Exists", "DoesNotExist":
			if len(req.Values) != 0 {
				return fmt.Errorf("%s: operator %s takes no values", f, req.Operator)
			}
		default:
			return fmt.Errorf("%s.operator: %q is not In, NotIn, Exists or DoesNotExist", f, req.Operator)
		}
	}
	return nil
}

func (r *IngressRule) validate(field string, deny bool) error {
	if err := validatePeers(field, "from", r.FromEndpoints, r.FromEntities, r.FromCIDR, r.FromCIDRSet, r.ToPorts, r.ICMPs, deny); err != nil {
		return err
	}
	return validateL7(field, r.ToPorts, deny, false)
}

func (r *EgressRule) validate(field string, deny bool) error {
	if err := validatePeers(field, "to", r.ToEndpoints, r.ToEntities, r.ToCIDR, r.ToCIDRSet, r.ToPorts, r.ICMPs, deny); err != nil {
		return err
	}
	if len(r.ToFQDNs) > 0 {
		if deny {
			return fmt.Errorf("%s.toFQDNs: not allowed in deny rules (a name's addresses are learned after the lookup)", field)
		}
		if len(r.ToEndpoints)+len(r.ToEntities)+len(r.ToCIDR)+len(r.ToCIDRSet) > 0 {
			return fmt.Errorf("%s.toFQDNs: cannot be combined with toEndpoints, toEntities, toCIDR or toCIDRSet in one section", field)
		}
	}
	for i, f := range r.ToFQDNs {
		if err := f.Validate(fmt.Sprintf("%s.toFQDNs[%d]", field, i)); err != nil {
			return err
		}
	}
	return validateL7(field, r.ToPorts, deny, true)
}

// validateL7 checks the L7 rules of a section's ports.
func validateL7(field string, ports []PortRule, deny, egress bool) error {
	for i, pr := range ports {
		if pr.Rules == nil {
			continue
		}
		f := fmt.Sprintf("%s.toPorts[%d].rules", field, i)
		if deny && len(pr.Rules.DNS)+len(pr.Rules.HTTP) > 0 {
			return fmt.Errorf("%s: L7 rules are not allowed in deny rules", f)
		}
		if err := pr.Rules.validate(f, pr.Ports, egress); err != nil {
			return err
		}
	}
	return nil
}

func validatePeers(field, dir string, eps []EndpointSelector, ents []string, cidrs []string, sets []CIDRRule, ports []PortRule, icmps []ICMPRule, deny bool) error {
	for i := range eps {
		if err := eps[i].Validate(fmt.Sprintf("%s.%sEndpoints[%d]", field, dir, i)); err != nil {
			return err
		}
	}
	for i, e := range ents {
		if !IsEntity(e) {
			return fmt.Errorf("%s.%sEntities[%d]: unknown entity %q (known: %s)", field, dir, i, e, strings.Join(entities, ", "))
		}
	}
	for i, c := range cidrs {
		if _, err := ParseCIDR(c); err != nil {
			return fmt.Errorf("%s.%sCIDR[%d]: %w", field, dir, i, err)
		}
	}
	for i, s := range sets {
		p, err := ParseCIDR(s.CIDR)
		if err != nil {
			return fmt.Errorf("%s.%sCIDRSet[%d].cidr: %w", field, dir, i, err)
		}
		for j, e := range s.Except {
			ep, err := ParseCIDR(e)
			if err != nil {
				return fmt.Errorf("%s.%sCIDRSet[%d].except[%d]: %w", field, dir, i, j, err)
			}
			if !p.Contains(ep.Addr()) || ep.Bits() < p.Bits() {
				return fmt.Errorf("%s.%sCIDRSet[%d].except[%d]: %s is not inside %s", field, dir, i, j, e, s.CIDR)
			}
		}
	}
	if len(ports) > 0 && len(icmps) > 0 {
		return fmt.Errorf("%s: toPorts and icmps cannot be combined in one section", field)
	}
	for i, pr := range ports {
		for j, p := range pr.Ports {
			if _, _, _, err := p.Parse(); err != nil {
				return fmt.Errorf("%s.toPorts[%d].ports[%d]: %w", field, i, j, err)
			}
			if deny && p.Port != "" {
				if _, err := strconv.Atoi(p.Port); err != nil {
					return fmt.Errorf("%s.toPorts[%d].ports[%d]: named ports are not allowed in deny rules", field, i, j)
				}
			}
		}
	}
	for i, ic := range icmps {
		for j, f := range ic.Fields {
			if f.Type == nil {
				return fmt.Errorf("%s.icmps[%d].fields[%d].type: required", field, i, j)
			}
			if f.Family != "" && f.Family != "IPv4" && f.Family != "IPv6" {
				return fmt.Errorf("%s.icmps[%d].fields[%d].family: %q is not IPv4 or IPv6", field, i, j, f.Family)
			}
		}
	}
	return nil
}

// ParseCIDR parses a CIDR, or a bare address as its host prefix.
func ParseCIDR(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if p != p.Masked() {
			return netip.Prefix{}, fmt.Errorf("%q has host bits set (did you mean %s?)", s, p.Masked())
		}
		return p, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
}

// Protocol numbers.
const (
	ProtoAny   uint8 = 0
	ProtoICMP  uint8 = 1
	ProtoTCP   uint8 = 6
	ProtoUDP   uint8 = 17
	ProtoICMP6 uint8 = 58
	ProtoSCTP  uint8 = 132
)

// Parse returns the protocols (ANY expands to TCP, UDP and SCTP), the port
// range and the port name (for named ports; then the range is zero).
func (p PortProtocol) Parse() (protos []uint8, from, to uint16, err error) {
	name, from, to, protos, err := p.parse()
	_ = name
	return protos, from, to, err
}

// NamedPort returns the port name when the port is a name.
func (p PortProtocol) NamedPort() string {
	name, _, _, _, _ := p.parse()
	return name
}

func (p PortProtocol) parse() (name string, from, to uint16, protos []uint8, err error) {
	switch strings.ToUpper(p.Protocol) {
	case "", "ANY":
		protos = []uint8{ProtoTCP, ProtoUDP, ProtoSCTP}
	case "TCP":
		protos = []uint8{ProtoTCP}
	case "UDP":
		protos = []uint8{ProtoUDP}
	case "SCTP":
		protos = []uint8{ProtoSCTP}
	default:
		return "", 0, 0, nil, fmt.Errorf("protocol %q: must be TCP, UDP, SCTP or ANY", p.Protocol)
	}
	if p.Port == "" || p.Port == "0" {
		if p.EndPort != 0 {
			return "", 0, 0, nil, errors.New("endPort needs a port")
		}
		return "", 0, 0, protos, nil
	}
	n, convErr := strconv.Atoi(p.Port)
	if convErr != nil {
		if !validPortName(p.Port) {
			return "", 0, 0, nil, fmt.Errorf("port %q: not a number 1-65535 nor a valid port name", p.Port)
		}
		if p.EndPort != 0 {
			return "", 0, 0, nil, fmt.Errorf("port %q: endPort cannot follow a named port", p.Port)
		}
		return p.Port, 0, 0, protos, nil
	}
	if n < 1 || n > 65535 {
		return "", 0, 0, nil, fmt.Errorf("port %d: out of range 1-65535", n)
	}
	end := n
	if p.EndPort != 0 {
		if p.EndPort < int32(n) || p.EndPort > 65535 {
			return "", 0, 0, nil, fmt.Errorf("endPort %d: must be between port %d and 65535", p.EndPort, n)
		}
		end = int(p.EndPort)
	}
	return "", uint16(n), uint16(end), protos, nil
}

// validPortName follows the IANA_SVC_NAME rules Kubernetes uses.
func validPortName(s string) bool {
	if len(s) == 0 || len(s) > 15 {
		return false
	}
	hasLetter := false
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z':
			hasLetter = true
		case c >= '0' && c <= '9':
		case c == '-':
			if i == 0 || i == len(s)-1 || s[i-1] == '-' {
				return false
			}
		default:
			return false
		}
	}
	return hasLetter
}
