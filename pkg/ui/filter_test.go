package ui

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestQueryFiltersDemoFlows(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	flows := demoFlows(t, base, 4) // rounds at base+0..3 s
	now := base.Add(10 * time.Second)
	count := func(query string) (int, []Row) {
		t.Helper()
		v, err := url.ParseQuery(query)
		if err != nil {
			t.Fatal(err)
		}
		q, err := ParseQuery(v, now)
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		m, err := q.Compile()
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		var rows []Row
		for _, f := range flows {
			if m.Match(f) {
				rows = append(rows, RowOf(f))
			}
		}
		return len(rows), rows
	}
	for _, c := range []struct {
		query string
		want  int
		check func(Row) bool
	}{
		{"", 40, nil},
		{"verdict=DROPPED", 8, func(r Row) bool { return r.Verdict == "DROPPED" }},
		{"verdict=dropped,audit", 12, func(r Row) bool { return r.Verdict != "FORWARDED" }},
		{"verdict=AUDIT", 4, func(r Row) bool { return r.Verdict == "AUDIT" && r.Policies[0] == "demo/lockdown" }},
		// Either side: other's trace out, its drop, its audited verdict.
		{"pod=demo/other", 12, func(r Row) bool { return r.SourcePod == "demo/other" || r.DestPod == "demo/other" }},
		{"port=443", 4, func(r Row) bool { return r.Destination.ID == "world" }},
		// As hubble builds them: (source in demo and source port 8080) or
		// (destination in demo and destination port 8080).
		{"namespace=demo&verdict=FORWARDED&port=8080", 4, func(r Row) bool { return r.Source.ID == "host" }},
		{"label=app=far", 4, func(r Row) bool { return r.Source.ID == "demo/far" }},
		{"label=app in (far,other)&verdict=DROPPED", 8, func(r Row) bool { return r.Destination.ID == "demo/backend" }},
		{"protocol=udp", 0, nil},
		{"port=8080&verdict=FORWARDED", 4, func(r Row) bool { return r.Source.ID == "host" }},
		{"policy=demo/allow-frontend&verdict=FORWARDED", 4, func(r Row) bool { return r.Type == "policy-verdict" }},
		{"policy=lockdown", 4, func(r Row) bool { return r.Verdict == "AUDIT" }},
		{"policy=nosuch", 0, nil},
		{"since=" + base.Add(2*time.Second).Format(time.RFC3339), 20, func(r Row) bool { return !r.Time.Before(base.Add(2 * time.Second)) }},
		{"until=9500ms", 10, func(r Row) bool { return r.Time.Equal(base) }},
	} {
		n, rows := count(c.query)
		if n != c.want {
			t.Errorf("%q: %d flows, want %d", c.query, n, c.want)
		}
		for _, r := range rows {
			if c.check != nil && !c.check(r) {
				t.Errorf("%q matched %+v", c.query, r)
				break
			}
		}
	}

	for query, want := range map[string]string{
		"verdict=MAYBE":    "verdict",
		"since=yesterday":  "since",
		"limit=x":          "limit",
		"protocol=carrier": "protocol",
		"label=app in (":   "label",
	} {
		v, _ := url.ParseQuery(query)
		q, err := ParseQuery(v, now)
		if err == nil {
			_, err = q.Compile()
		}
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), want) {
			t.Errorf("%q: error %v, want one about %s", query, err, want)
		}
	}
}
