package observer

import (
	"slices"
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// l7TestFlows are flows as the proxies build them, and one L4 flow.
func l7TestFlows() map[string]*flowpb.Flow {
	httpFlow := func(method, url string, code uint32) *flowpb.Flow {
		return &flowpb.Flow{Type: flowpb.FlowType_L7,
			L4: &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40000, DestinationPort: 80}}},
			L7: &flowpb.Layer7{Type: flowpb.L7FlowType_RESPONSE, Record: &flowpb.Layer7_Http{Http: &flowpb.HTTP{Method: method, Url: url, Code: code}}}}
	}
	dnsFlow := func(query string, rcode uint32) *flowpb.Flow {
		return &flowpb.Flow{Type: flowpb.FlowType_L7,
			L4: &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: 5353, DestinationPort: 53}}},
			L7: &flowpb.Layer7{Type: flowpb.L7FlowType_RESPONSE, Record: &flowpb.Layer7_Dns{Dns: &flowpb.DNS{Query: query, Rcode: rcode}}}}
	}
	return map[string]*flowpb.Flow{
		"get-healthz":  httpFlow("GET", "http://web.example/healthz?x=1", 200),
		"post-admin":   httpFlow("POST", "http://web.example/admin/users", 403),
		"get-missing":  httpFlow("get", "http://web.example/nothing", 404),
		"get-upstream": httpFlow("GET", "http://web.example/api/v1", 503),
		"dns-world":    dnsFlow("world.example.", 0),
		"dns-refused":  dnsFlow("evil.test.", 5),
		"l4-tcp": {Type: flowpb.FlowType_L3_L4,
			L4: &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40001, DestinationPort: 80}}}},
	}
}

// TestL7Filters: hubble observe's --http-status, --http-method,
// --http-path, --http-url, --dns-query and --protocol http|dns select the
// proxies' flows; a flow without the record asked about never matches.
func TestL7Filters(t *testing.T) {
	flows := l7TestFlows()
	names := make([]string, 0, len(flows))
	for n := range flows {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, c := range []struct {
		name string
		f    *flowpb.FlowFilter
		want []string
	}{
		{"status exact", &flowpb.FlowFilter{HttpStatusCode: []string{"403"}}, []string{"post-admin"}},
		{"status class", &flowpb.FlowFilter{HttpStatusCode: []string{"4+"}}, []string{"get-missing", "post-admin"}},
		{"status two-digit prefix or exact", &flowpb.FlowFilter{HttpStatusCode: []string{"50+", "200"}}, []string{"get-healthz", "get-upstream"}},
		{"method without case", &flowpb.FlowFilter{HttpMethod: []string{"get"}}, []string{"get-healthz", "get-missing", "get-upstream"}},
		{"path regexp on the path only", &flowpb.FlowFilter{HttpPath: []string{"^/admin/", "^/healthz$"}}, []string{"get-healthz", "post-admin"}},
		{"url regexp", &flowpb.FlowFilter{HttpUrl: []string{`\?x=1$`}}, []string{"get-healthz"}},
		{"dns query", &flowpb.FlowFilter{DnsQuery: []string{`^world\.example\.$`}}, []string{"dns-world"}},
		{"dns query unanchored", &flowpb.FlowFilter{DnsQuery: []string{"example"}}, []string{"dns-world"}},
		{"protocol http", &flowpb.FlowFilter{Protocol: []string{"http"}}, []string{"get-healthz", "get-missing", "get-upstream", "post-admin"}},
		{"protocol dns", &flowpb.FlowFilter{Protocol: []string{"DNS"}}, []string{"dns-refused", "dns-world"}},
		{"protocol tcp still matches L7 HTTP flows", &flowpb.FlowFilter{Protocol: []string{"tcp"}}, []string{"get-healthz", "get-missing", "get-upstream", "l4-tcp", "post-admin"}},
		{"fields are and-ed", &flowpb.FlowFilter{HttpMethod: []string{"GET"}, HttpStatusCode: []string{"5+"}}, []string{"get-upstream"}},
		{"dns and http fields exclude each other", &flowpb.FlowFilter{HttpMethod: []string{"GET"}, DnsQuery: []string{"."}}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs, err := CompileFilters([]*flowpb.FlowFilter{c.f}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range names {
				if fs.Match(flows[n]) {
					got = append(got, n)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("matched %v, want %v", got, c.want)
			}
		})
	}
	// As a deny list: everything but the denied HTTP requests.
	fs, err := CompileFilters(nil, []*flowpb.FlowFilter{{HttpStatusCode: []string{"403"}}})
	if err != nil {
		t.Fatal(err)
	}
	if fs.Match(flows["post-admin"]) || !fs.Match(flows["get-healthz"]) || !fs.Match(flows["l4-tcp"]) {
		t.Fatal("a deny list of 403s does not exclude exactly the 403")
	}
}

// TestL7FiltersRejectBadValues: a malformed code or regular expression is
// an error naming the field, never a filter that matches nothing.
func TestL7FiltersRejectBadValues(t *testing.T) {
	for _, f := range []*flowpb.FlowFilter{
		{HttpStatusCode: []string{"600"}},
		{HttpStatusCode: []string{"20"}},
		{HttpStatusCode: []string{"2000"}},
		{HttpStatusCode: []string{"+"}},
		{HttpStatusCode: []string{"200+"}},
		{HttpStatusCode: []string{"-1+"}},
		{HttpStatusCode: []string{"2x+"}},
		{HttpMethod: []string{""}},
		{HttpPath: []string{"("}},
		{HttpUrl: []string{"[a"}},
		{DnsQuery: []string{"*"}},
		{HttpHeader: []*flowpb.HTTPHeader{{Key: "X", Value: "y"}}},
	} {
		if _, err := CompileFilters([]*flowpb.FlowFilter{f}, nil); err == nil {
			t.Errorf("filter %v compiled", f)
		}
	}
}
