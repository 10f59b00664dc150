package api

import (
	"regexp"
	"strings"
	"testing"
)

func TestFQDNPolicyParses(t *testing.T) {
	doc := `[{
	  "endpointSelector": {"matchLabels": {"app": "client"}},
	  "egress": [
	    {"toEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s-app": "kube-dns"}}],
	     "toPorts": [{"ports": [{"port": "53", "protocol": "ANY"}],
	                  "rules": {"dns": [{"matchName": "world.example"}, {"matchPattern": "*.example"}]}}]},
	    {"toFQDNs": [{"matchName": "World.Example."}, {"matchPattern": "api-*.example"}],
	     "toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}],
	                  "rules": {"http": [{"method": "GET", "path": "/healthz|/api/.*", "host": "world\\.example", "headers": ["X-Token: abc", "X-Trace"]}]}}]}
	  ]
	}]`
	rules, err := ParseRules([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	eg := rules[0].Egress
	if got := eg[0].ToPorts[0].Rules.DNS; len(got) != 2 || got[1].MatchPattern != "*.example" {
		t.Fatalf("dns rules: %+v", got)
	}
	if got := eg[1].ToFQDNs; len(got) != 2 || got[0].MatchName != "World.Example." {
		t.Fatalf("toFQDNs: %+v", got)
	}
	if h := eg[1].ToPorts[0].Rules.HTTP[0]; h.Method != "GET" || len(h.Headers) != 2 {
		t.Fatalf("http rule: %+v", h)
	}
}

// Each bad L7 or FQDN part rejects the whole document, naming the field.
func TestL7PolicyRejected(t *testing.T) {
	const sel = `"endpointSelector": {"matchLabels": {"app": "a"}}`
	cases := []struct{ name, section, want string }{
		{"pattern char", `"egress": [{"toFQDNs": [{"matchPattern": "a?.example"}]}]`, `egress[0].toFQDNs[0].matchPattern: "a?.example": character '?'`},
		{"empty label", `"egress": [{"toFQDNs": [{"matchName": "a..example"}]}]`, "empty label"},
		{"both fields", `"egress": [{"toFQDNs": [{"matchName": "a.example", "matchPattern": "*.example"}]}]`, "exclusive"},
		{"no field", `"egress": [{"toFQDNs": [{}]}]`, "one of matchName and matchPattern is required"},
		{"star in name", `"egress": [{"toFQDNs": [{"matchName": "*.example"}]}]`, "not allowed in a name"},
		{"long label", `"egress": [{"toFQDNs": [{"matchName": "` + strings.Repeat("a", 64) + `.example"}]}]`, "longer than 63"},
		{"fqdn in deny", `"egressDeny": [{"toFQDNs": [{"matchName": "a.example"}]}]`, "not allowed in deny rules"},
		{"fqdn with peers", `"egress": [{"toFQDNs": [{"matchName": "a.example"}], "toEntities": ["world"]}]`, "cannot be combined"},
		{"dns bad pattern", `"egress": [{"toPorts": [{"ports": [{"port": "53"}], "rules": {"dns": [{"matchPattern": "a b"}]}}]}]`, `toPorts[0].rules.dns[0].matchPattern`},
		{"dns on ingress", `"ingress": [{"toPorts": [{"ports": [{"port": "53"}], "rules": {"dns": [{"matchName": "a"}]}}]}]`, "egress only"},
		{"l7 without ports", `"egress": [{"toPorts": [{"rules": {"dns": [{"matchName": "a"}]}}]}]`, "L7 rules need ports"},
		{"l7 port range", `"egress": [{"toPorts": [{"ports": [{"port": "53", "endPort": 60}], "rules": {"dns": [{"matchName": "a"}]}}]}]`, "port range"},
		{"l7 named port", `"ingress": [{"toPorts": [{"ports": [{"port": "http", "protocol": "TCP"}], "rules": {"http": [{}]}}]}]`, "need a port number"},
		{"http udp", `"ingress": [{"toPorts": [{"ports": [{"port": "80", "protocol": "UDP"}], "rules": {"http": [{}]}}]}]`, "need protocol TCP"},
		{"http bad path", `"ingress": [{"toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}], "rules": {"http": [{"path": "/a(b"}]}}]}]`, `ingress[0].toPorts[0].rules.http[0]: path "/a(b"`},
		{"http bad header", `"ingress": [{"toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}], "rules": {"http": [{"headers": ["Bad Name: x"]}]}}]}]`, `headers[0]`},
		{"both kinds", `"egress": [{"toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}], "rules": {"http": [{}], "dns": [{"matchName": "a"}]}}]}]`, "cannot be combined on one port"},
		{"l7 in deny", `"ingressDeny": [{"toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}], "rules": {"http": [{"method": "GET"}]}}]}]`, "not allowed in deny rules"},
		{"unknown field", `"egress": [{"toPorts": [{"ports": [{"port": "80"}], "rules": {"kafka": [{}]}}]}]`, "unknown field"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A valid rule before the bad one: the document is rejected whole.
			doc := `[{` + sel + `, "egress": [{"toEntities": ["world"]}]}, {` + sel + `, ` + c.section + `}]`
			rules, err := ParseRules([]byte(doc))
			if err == nil {
				t.Fatalf("accepted: %+v", rules)
			}
			if rules != nil {
				t.Errorf("returned rules with the error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

func TestFQDNSelectorMatches(t *testing.T) {
	cases := []struct {
		sel  FQDNSelector
		name string
		want bool
	}{
		{FQDNSelector{MatchName: "world.example"}, "world.example.", true},
		{FQDNSelector{MatchName: "World.Example."}, "WORLD.example", true},
		{FQDNSelector{MatchName: "world.example"}, "www.world.example", false},
		{FQDNSelector{MatchPattern: "*"}, "anything.at.all", true},
		{FQDNSelector{MatchPattern: "*.example"}, "world.example", true},
		{FQDNSelector{MatchPattern: "*.example"}, "a.world.example", false},
		{FQDNSelector{MatchPattern: "*.example"}, "example", false},
		{FQDNSelector{MatchPattern: "api-*.example"}, "api-1.example", true},
		{FQDNSelector{MatchPattern: "api-*.example"}, "api-.example", true},
		{FQDNSelector{MatchPattern: "api-*.example"}, "web-1.example", false},
		{FQDNSelector{MatchPattern: "a*b*c.example"}, "aXbYbZc.example", true},
		{FQDNSelector{MatchPattern: "a*b*c.example"}, "aXbYbZ.example", false},
		{FQDNSelector{MatchPattern: "a?.example"}, "a?.example", false}, // invalid selects nothing
		{FQDNSelector{}, "world.example", false},
	}
	for _, c := range cases {
		if got := c.sel.Matches(c.name); got != c.want {
			t.Errorf("%+v.Matches(%q) = %v, want %v", c.sel, c.name, got, c.want)
		}
		// The regular expression the API shows agrees with Matches.
		if c.sel.Validate("s") == nil {
			if got := regexp.MustCompile(c.sel.Regexp()).MatchString(NormalizeName(c.name) + "."); got != c.want {
				t.Errorf("%+v.Regexp() %s on %q = %v, want %v", c.sel, c.sel.Regexp(), c.name, got, c.want)
			}
		}
	}
}
