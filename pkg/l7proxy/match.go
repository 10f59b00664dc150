package l7proxy

import (
	"net/http"
	"regexp"
	"strings"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Matcher is a compiled HTTP rule.
type Matcher struct {
	Rule               api.PortRuleHTTP
	method, path, host *regexp.Regexp
	headers            []headerMatch
}

type headerMatch struct {
	name, value string
	hasValue    bool
}

// Compile compiles an HTTP rule (validated with its policy).
func Compile(h api.PortRuleHTTP) (*Matcher, error) {
	m := &Matcher{Rule: h}
	var err error
	if m.method, err = api.HTTPExpr("method", h.Method); err != nil {
		return nil, err
	}
	if m.path, err = api.HTTPExpr("path", h.Path); err != nil {
		return nil, err
	}
	if m.host, err = api.HTTPExpr("host", h.Host); err != nil {
		return nil, err
	}
	for _, hd := range h.Headers {
		name, value, hasValue, err := api.ParseHeader(hd)
		if err != nil {
			return nil, err
		}
		m.headers = append(m.headers, headerMatch{http.CanonicalHeaderKey(name), value, hasValue})
	}
	return m, nil
}

// Matches reports whether the request matches every field of the rule.
func (m *Matcher) Matches(r *http.Request) bool {
	if m.method != nil && !m.method.MatchString(r.Method) {
		return false
	}
	if m.path != nil && !m.path.MatchString(r.URL.Path) {
		return false
	}
	if m.host != nil {
		host := r.Host
		if h, _, ok := strings.Cut(host, ":"); ok && !strings.HasPrefix(host, "[") {
			host = h
		}
		if !m.host.MatchString(host) {
			return false
		}
	}
	for _, h := range m.headers {
		vals, ok := r.Header[h.name]
		if !ok {
			return false
		}
		if h.hasValue {
			found := false
			for _, v := range vals {
				if v == h.value {
					found = true
				}
			}
			if !found {
				return false
			}
		}
	}
	return true
}
