package policy

import (
	"strings"
	"testing"
)

// TestTraceNamesL7Rules: a trace on a port with DNS rules says the L4
// allow and the names the DNS proxy lets through; on a port with HTTP
// rules, the requests the HTTP proxy allows; on a port of the same rule
// without L7 rules, nothing about L7; for a peer the L7 section does not
// select, nothing either.
func TestTraceNamesL7Rules(t *testing.T) {
	repo := NewRepository()
	rules := mustRules(t, `[
	 {"endpointSelector":{"matchLabels":{"app":"b"}},"labels":["k8s:io.cilium.k8s.policy.name=dns-only"],
	  "egress":[{"toEndpoints":[{"matchLabels":{"app":"a"}}],
	             "toPorts":[{"ports":[{"port":"53","protocol":"ANY"}],"rules":{"dns":[{"matchName":"World.Example."},{"matchPattern":"*.example"}]}},
	                        {"ports":[{"port":"9090","protocol":"TCP"}]}]}]},
	 {"endpointSelector":{"matchLabels":{"app":"a"}},"labels":["k8s:io.cilium.k8s.policy.name=http-get"],
	  "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"b"}}],
	              "toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}],"rules":{"http":[{"method":"GET","path":"/healthz"},{"path":"/api/.*","headers":["X-Token: abc"]}]}}]},
	             {"fromEndpoints":[{"matchLabels":{"app":"b"}}],"toPorts":[{"ports":[{"port":"53","protocol":"UDP"}]}]}]}]`)
	if _, err := repo.Add(rules, "x", "api", false); err != nil {
		t.Fatal(err)
	}

	dns := repo.Trace(xb.Labels, xa.Labels, 17, 53, universe())
	lines := strings.Join(dns.Lines, "\n")
	want := "Egress of the source: allowed by rule 1 (api) [k8s:io.cilium.k8s.policy.name=dns-only], L7: DNS names world.example, *.example (rule 1)"
	if !strings.Contains(lines, want) {
		t.Fatalf("trace b→a udp/53 lacks\n%s\n%s", want, lines)
	}
	if len(dns.Egress.L7) != 1 || dns.Egress.L7[0].Rule != 1 || strings.Join(dns.Egress.L7[0].DNS, " ") != "world.example *.example" || len(dns.Ingress.L7) != 0 {
		t.Fatalf("trace b→a udp/53 L7: egress %+v, ingress %+v", dns.Egress.L7, dns.Ingress.L7)
	}
	if !dns.Allowed || strings.Contains(strings.SplitN(lines, "Ingress", 2)[1], "L7") {
		t.Fatalf("trace b→a udp/53: the ingress part (no L7 rules) names L7, or denied:\n%s", lines)
	}

	// A port of the same section without L7 rules.
	plain := strings.Join(repo.Trace(xb.Labels, xa.Labels, 6, 9090, universe()).Lines, "\n")
	if strings.Contains(plain, "L7") {
		t.Fatalf("trace b→a tcp/9090 names L7 rules it has none of:\n%s", plain)
	}

	// The HTTP rules on a's ingress; whatever the L4 verdict (the port is
	// open only through the L7 proxy), the trace names them.
	http := repo.Trace(xb.Labels, xa.Labels, 6, 8080, universe())
	lines = strings.Join(http.Lines, "\n")
	wantHTTP := `HTTP GET /healthz or any method /api/.* header "X-Token: abc" (rule 2)`
	if !strings.Contains(lines, "Ingress of the destination: ") || !strings.Contains(lines, wantHTTP) {
		t.Fatalf("trace b→a tcp/8080 lacks %q:\n%s", wantHTTP, lines)
	}
	if len(http.Ingress.L7) != 1 || len(http.Ingress.L7[0].HTTP) != 2 {
		t.Fatalf("trace b→a tcp/8080 L7: %+v", http.Ingress.L7)
	}

	// y/a is not selected by the HTTP section's peers (app=b in x).
	other := strings.Join(repo.Trace(ya.Labels, xa.Labels, 6, 8080, universe()).Lines, "\n")
	if strings.Contains(other, "L7") {
		t.Fatalf("trace y/a→a tcp/8080 names L7 rules of a section that does not select it:\n%s", other)
	}
}
