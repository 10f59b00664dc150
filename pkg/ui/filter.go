package ui

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/observer"
)

// Query is a flow query of the page: the filters `hubble observe` has and
// a time range. Each list matches any of its values; lists combine with
// AND; a namespace, pod, label or port matches either side of the flow.
type Query struct {
	Namespace []string
	Pod       []string
	Label     []string
	Verdict   []string
	Protocol  []string
	Port      []string
	Policy    []string
	Since     time.Time
	Until     time.Time
	// Limit caps the answer to the last Limit flows (0: DefaultLimit).
	Limit int
}

// DefaultLimit is how many flows a query answers when it names no limit.
const DefaultLimit = 1000

// ParseQuery reads a Query from URL parameters: repeated or
// comma-separated namespace, pod, label (one selector per parameter),
// verdict, protocol, port, policy; since and until as RFC 3339 times or
// durations ago; limit.
func ParseQuery(v url.Values, now time.Time) (Query, error) {
	list := func(k string) []string {
		var out []string
		for _, s := range v[k] {
			for _, p := range strings.Split(s, ",") {
				if p = strings.TrimSpace(p); p != "" {
					out = append(out, p)
				}
			}
		}
		return out
	}
	q := Query{Namespace: list("namespace"), Pod: list("pod"), Verdict: list("verdict"), Protocol: list("protocol"),
		Port: list("port"), Policy: list("policy")}
	for _, l := range v["label"] {
		if l = strings.TrimSpace(l); l != "" {
			q.Label = append(q.Label, l)
		}
	}
	for _, t := range []struct {
		key string
		dst *time.Time
	}{{"since", &q.Since}, {"until", &q.Until}} {
		s := v.Get(t.key)
		if s == "" {
			continue
		}
		if d, err := time.ParseDuration(s); err == nil {
			*t.dst = now.Add(-d)
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return Query{}, fmt.Errorf("%s %q: want an RFC 3339 time or a duration ago (5m)", t.key, s)
		}
		*t.dst = at
	}
	if s := v.Get("limit"); s != "" {
		if _, err := fmt.Sscanf(s, "%d", &q.Limit); err != nil || q.Limit < 0 {
			return Query{}, fmt.Errorf("limit %q: want a number", s)
		}
	}
	return q, nil
}

// Matcher is a compiled Query.
type Matcher struct {
	filters *observer.Filters
	policy  []string
	since   time.Time
	until   time.Time
}

// Compile turns the query into hubble's flow filters (two, one per side,
// as `hubble observe` builds them for either-side flags) and checks them
// with the observer's filter compiler, so the page matches exactly as the
// CLI and the relay do.
func (q Query) Compile() (*Matcher, error) {
	src, dst := &flowpb.FlowFilter{}, &flowpb.FlowFilter{}
	either := len(q.Namespace)+len(q.Pod)+len(q.Label)+len(q.Port) > 0
	if either {
		pods := append([]string{}, q.Pod...)
		for _, ns := range q.Namespace {
			pods = append(pods, strings.TrimSuffix(ns, "/")+"/")
		}
		src.SourcePod, dst.DestinationPod = pods, pods
		src.SourceLabel, dst.DestinationLabel = q.Label, q.Label
		src.SourcePort, dst.DestinationPort = q.Port, q.Port
	}
	var verdicts []flowpb.Verdict
	for _, v := range q.Verdict {
		n, ok := flowpb.Verdict_value[strings.ToUpper(v)]
		if !ok {
			return nil, fmt.Errorf("verdict %q: want FORWARDED, DROPPED or AUDIT", v)
		}
		verdicts = append(verdicts, flowpb.Verdict(n))
	}
	for _, f := range []*flowpb.FlowFilter{src, dst} {
		f.Verdict = verdicts
		f.Protocol = q.Protocol
	}
	allow := []*flowpb.FlowFilter{src}
	if either {
		allow = append(allow, dst)
	}
	fs, err := observer.CompileFilters(allow, nil)
	if err != nil {
		return nil, err
	}
	return &Matcher{filters: fs, policy: q.Policy, since: q.Since, until: q.Until}, nil
}

// Match reports whether f passes the query.
func (m *Matcher) Match(f *flowpb.Flow) bool {
	if !m.since.IsZero() || !m.until.IsZero() {
		t := f.GetTime().AsTime()
		if (!m.since.IsZero() && t.Before(m.since)) || (!m.until.IsZero() && t.After(m.until)) {
			return false
		}
	}
	if len(m.policy) > 0 {
		ok := false
		for _, p := range m.policy {
			if hasPolicy(f, p) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return m.filters.Match(f)
}
