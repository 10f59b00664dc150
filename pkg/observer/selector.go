package observer

import (
	"fmt"
	"strings"
)

// Selector is a parsed label selector (the Kubernetes syntax: "a=b",
// "a==b", "a!=b", "a", "!a", "a in (x,y)", "a notin (x,y)", comma
// separated, all must hold) matched against labels in "source:key=value"
// form. A key without a source matches the key from any source
// ("app=web" matches "k8s:app=web"); "any:" says the same explicitly.
type Selector []requirement

type requirement struct {
	key    string
	op     string // "=", "!=", "in", "notin", "exists", "!exists"
	values []string
}

// ParseSelector parses a selector.
func ParseSelector(s string) (Selector, error) {
	var sel Selector
	for _, part := range splitTop(s) {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		r, err := parseRequirement(part)
		if err != nil {
			return nil, fmt.Errorf("label selector %q: %w", s, err)
		}
		sel = append(sel, r)
	}
	if len(sel) == 0 {
		return nil, fmt.Errorf("label selector %q is empty", s)
	}
	return sel, nil
}

// splitTop splits at commas outside parentheses.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

func parseRequirement(p string) (requirement, error) {
	if strings.HasPrefix(p, "!") {
		return requirement{key: strings.TrimSpace(p[1:]), op: "!exists"}, nil
	}
	for _, op := range []string{" notin ", " in "} {
		if k, rest, ok := strings.Cut(p, op); ok {
			rest = strings.TrimSpace(rest)
			if !strings.HasPrefix(rest, "(") || !strings.HasSuffix(rest, ")") {
				return requirement{}, fmt.Errorf("%q: values of %s must be in parentheses", p, strings.TrimSpace(op))
			}
			var vals []string
			for _, v := range strings.Split(rest[1:len(rest)-1], ",") {
				vals = append(vals, strings.TrimSpace(v))
			}
			return requirement{key: strings.TrimSpace(k), op: strings.TrimSpace(op), values: vals}, nil
		}
	}
	if k, v, ok := strings.Cut(p, "!="); ok {
		return requirement{key: strings.TrimSpace(k), op: "!=", values: []string{strings.TrimSpace(v)}}, nil
	}
	if k, v, ok := strings.Cut(p, "=="); ok {
		return requirement{key: strings.TrimSpace(k), op: "=", values: []string{strings.TrimSpace(v)}}, nil
	}
	if k, v, ok := strings.Cut(p, "="); ok {
		return requirement{key: strings.TrimSpace(k), op: "=", values: []string{strings.TrimSpace(v)}}, nil
	}
	if strings.ContainsAny(p, " ()") {
		return requirement{}, fmt.Errorf("%q: not a requirement", p)
	}
	return requirement{key: p, op: "exists"}, nil
}

// Matches reports whether labels satisfy every requirement.
func (s Selector) Matches(labels []string) bool {
	for _, r := range s {
		if !r.matches(labels) {
			return false
		}
	}
	return true
}

// values returns the values of key among labels.
func values(key string, labels []string) []string {
	source, name, hasSource := strings.Cut(key, ":")
	if !hasSource || source == "any" {
		source, name = "", key
		if hasSource {
			name = key[len("any:"):]
		}
	}
	var out []string
	for _, l := range labels {
		kv := l
		src, rest, ok := strings.Cut(l, ":")
		if ok {
			kv = rest
		} else {
			src = ""
		}
		k, v, _ := strings.Cut(kv, "=")
		if k == name && (source == "" || source == src) {
			out = append(out, v)
		}
	}
	return out
}

func (r requirement) matches(labels []string) bool {
	vs := values(r.key, labels)
	has := func(want string) bool {
		for _, v := range vs {
			if v == want {
				return true
			}
		}
		return false
	}
	switch r.op {
	case "exists":
		return len(vs) > 0
	case "!exists":
		return len(vs) == 0
	case "=":
		return has(r.values[0])
	case "!=":
		return !has(r.values[0])
	case "in":
		for _, w := range r.values {
			if has(w) {
				return true
			}
		}
		return false
	case "notin":
		for _, w := range r.values {
			if has(w) {
				return false
			}
		}
		return true
	}
	return false
}
