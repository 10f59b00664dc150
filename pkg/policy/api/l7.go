// DNS-aware and HTTP-aware rule parts: toFQDNs (the names an egress rule
// selects, through the IPs the node's DNS proxy saw answered for them),
// and the L7 rules of a port (toPorts[].rules): dns (which names a pod may
// look up) and http (which requests may pass). Names and patterns are
// case-insensitive and compared without the trailing dot.

package api

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// FQDNSelector selects the addresses DNS answered for a name: exactly one
// of MatchName (one name) and MatchPattern (a name where `*` stands for
// any run of name characters within a label; a lone `*` for any name).
type FQDNSelector struct {
	// +kubebuilder:validation:Pattern=`^([-a-zA-Z0-9_]+[.]?)+$`
	// +kubebuilder:validation:MaxLength=255
	MatchName string `json:"matchName,omitempty"`
	// +kubebuilder:validation:Pattern=`^([-a-zA-Z0-9_*]+[.]?)+$`
	// +kubebuilder:validation:MaxLength=255
	MatchPattern string `json:"matchPattern,omitempty"`
}

// L7Rules are a port's application-level rules: one kind per port.
type L7Rules struct {
	// DNS rules say which names may be looked up through the port (the
	// egress DNS port of a DNS server).
	DNS []PortRuleDNS `json:"dns,omitempty"`
	// HTTP rules say which requests may pass; none matching is 403.
	HTTP []PortRuleHTTP `json:"http,omitempty"`
}

// PortRuleDNS allows the lookups of one name or pattern (the FQDNSelector
// syntax).
type PortRuleDNS FQDNSelector

// PortRuleHTTP allows the HTTP requests matching every field it sets.
type PortRuleHTTP struct {
	// Method is a regular expression matched against the whole method.
	Method string `json:"method,omitempty"`
	// Path is a regular expression matched against the whole URL path.
	Path string `json:"path,omitempty"`
	// Host is a regular expression matched against the whole Host header
	// (without the port).
	Host string `json:"host,omitempty"`
	// Headers each name a header that must be present ("X-Token"), or a
	// header and its exact value ("X-Token: abc").
	Headers []string `json:"headers,omitempty"`
}

// Validate checks a selector: exactly one field, a valid name or pattern.
func (s FQDNSelector) Validate(field string) error {
	switch {
	case s.MatchName != "" && s.MatchPattern != "":
		return fmt.Errorf("%s: matchName and matchPattern are exclusive", field)
	case s.MatchName != "":
		if err := validateDNSName(s.MatchName, false); err != nil {
			return fmt.Errorf("%s.matchName: %w", field, err)
		}
	case s.MatchPattern != "":
		if err := validateDNSName(s.MatchPattern, true); err != nil {
			return fmt.Errorf("%s.matchPattern: %w", field, err)
		}
	default:
		return fmt.Errorf("%s: one of matchName and matchPattern is required", field)
	}
	return nil
}

// String is the selector as the API and flows show it.
func (s FQDNSelector) String() string {
	if s.MatchName != "" {
		return "matchName: " + strings.ToLower(strings.TrimSuffix(s.MatchName, "."))
	}
	return "matchPattern: " + strings.ToLower(strings.TrimSuffix(s.MatchPattern, "."))
}

// Matches reports whether name (any case, with or without the trailing
// dot) is selected. An invalid selector matches nothing.
func (s FQDNSelector) Matches(name string) bool {
	name = NormalizeName(name)
	if s.MatchName != "" {
		return s.MatchPattern == "" && name == NormalizeName(s.MatchName)
	}
	if s.MatchPattern == "" || validateDNSName(s.MatchPattern, true) != nil {
		return false
	}
	return matchPattern(NormalizeName(s.MatchPattern), name)
}

// NormalizeName lower-cases a DNS name and drops its trailing dot.
func NormalizeName(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// matchPattern matches label by label: a lone `*` pattern matches every
// name; otherwise the label counts must agree and each `*` matches any run
// (also empty) of a label's characters, never a dot.
func matchPattern(pattern, name string) bool {
	if pattern == "*" {
		return name != ""
	}
	pl, nl := strings.Split(pattern, "."), strings.Split(name, ".")
	if len(pl) != len(nl) {
		return false
	}
	for i := range pl {
		if !matchLabel(pl[i], nl[i]) {
			return false
		}
	}
	return true
}

// matchLabel is glob matching with `*` only, iterative with backtracking
// to the last star (linear in practice, no regexp per lookup).
func matchLabel(p, s string) bool {
	pi, si, star, mark := 0, 0, -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && p[pi] == s[si]:
			pi++
			si++
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// validateDNSName checks a name (or, with pattern, a pattern): letters,
// digits, '-', '_' (and '*' in a pattern), labels of 1-63 characters, at
// most 253 characters without the trailing dot.
func validateDNSName(s string, pattern bool) error {
	n := strings.TrimSuffix(s, ".")
	if n == "" {
		return errors.New("empty name")
	}
	if len(n) > 253 {
		return fmt.Errorf("%q is longer than 253 characters", s)
	}
	for _, label := range strings.Split(n, ".") {
		if label == "" {
			return fmt.Errorf("%q has an empty label", s)
		}
		if len(label) > 63 {
			return fmt.Errorf("%q has a label longer than 63 characters", s)
		}
		for _, c := range label {
			switch {
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			case c == '*' && pattern:
			default:
				what := "name"
				if pattern {
					what = "pattern (letters, digits, '-', '_', '.', '*')"
				}
				return fmt.Errorf("%q: character %q is not allowed in a %s", s, c, what)
			}
		}
	}
	return nil
}

// Validate checks a port's L7 rules; proto is the port's protocol (as
// written), egress says whether the rule is an egress one.
func (r *L7Rules) validate(field string, ports []PortProtocol, egress bool) error {
	if len(r.DNS) > 0 && len(r.HTTP) > 0 {
		return fmt.Errorf("%s: dns and http rules cannot be combined on one port", field)
	}
	if len(r.DNS)+len(r.HTTP) == 0 {
		return nil
	}
	if len(ports) == 0 {
		return fmt.Errorf("%s: L7 rules need ports", field)
	}
	for j, p := range ports {
		n, err := strconv.Atoi(p.Port)
		if err != nil || n == 0 {
			return fmt.Errorf("%s: ports[%d]: L7 rules need a port number, not %q", field, j, p.Port)
		}
		if p.EndPort != 0 && p.EndPort != int32(n) {
			return fmt.Errorf("%s: ports[%d]: L7 rules cannot apply to a port range", field, j)
		}
		proto := strings.ToUpper(p.Protocol)
		if len(r.HTTP) > 0 && proto != "TCP" {
			return fmt.Errorf("%s: ports[%d]: http rules need protocol TCP, not %q", field, j, p.Protocol)
		}
		if proto == "SCTP" {
			return fmt.Errorf("%s: ports[%d]: L7 rules do not apply to SCTP", field, j)
		}
	}
	if len(r.DNS) > 0 && !egress {
		return fmt.Errorf("%s.dns: dns rules apply to egress only", field)
	}
	for i, d := range r.DNS {
		if err := FQDNSelector(d).Validate(fmt.Sprintf("%s.dns[%d]", field, i)); err != nil {
			return err
		}
	}
	for i, h := range r.HTTP {
		if err := h.validate(fmt.Sprintf("%s.http[%d]", field, i)); err != nil {
			return err
		}
	}
	return nil
}

// HTTPExpr compiles one of an HTTP rule's expressions anchored (it
// matches the whole method, path or host); nil for an empty one.
func HTTPExpr(what, expr string) (*regexp.Regexp, error) {
	if expr == "" {
		return nil, nil
	}
	re, err := regexp.Compile("^(?:" + expr + ")$")
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", what, expr, err)
	}
	return re, nil
}

// ParseHeader parses an HTTP rule's header: "Name" or "Name: value".
func ParseHeader(h string) (name, value string, hasValue bool, err error) {
	name, value, hasValue = strings.Cut(h, ":")
	name = strings.TrimSpace(name)
	if name == "" || !validHeaderName(name) {
		return "", "", false, fmt.Errorf("header %q: want \"Name\" or \"Name: value\"", h)
	}
	return name, strings.TrimSpace(value), hasValue, nil
}

func (h PortRuleHTTP) validate(field string) error {
	for _, e := range [][2]string{{"method", h.Method}, {"path", h.Path}, {"host", h.Host}} {
		if _, err := HTTPExpr(e[0], e[1]); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
	}
	for i, hd := range h.Headers {
		if _, _, _, err := ParseHeader(hd); err != nil {
			return fmt.Errorf("%s.headers[%d]: %w", field, i, err)
		}
	}
	return nil
}

// validHeaderName: RFC 9110 token characters.
func validHeaderName(s string) bool {
	for _, c := range s {
		if c > 0x7e || c <= ' ' || strings.ContainsRune("\"(),/:;<=>?@[\\]{}", c) {
			return false
		}
	}
	return true
}

// Regexp is the selector as an anchored regular expression over the
// normalized name with its trailing dot (what the v1 API's
// /fqdn/names shows as regexString).
func (s FQDNSelector) Regexp() string {
	if s.MatchName != "" {
		return "^" + regexp.QuoteMeta(NormalizeName(s.MatchName)+".") + "$"
	}
	p := NormalizeName(s.MatchPattern)
	if p == "*" {
		return `^[-a-zA-Z0-9_]+(\.[-a-zA-Z0-9_]+)*\.$`
	}
	return "^" + strings.ReplaceAll(regexp.QuoteMeta(p+"."), `\*`, `[-a-zA-Z0-9_]*`) + "$"
}
