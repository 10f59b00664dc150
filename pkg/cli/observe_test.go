package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/testutil"
)

func runObserve(ctx context.Context, t *testing.T, out *testutil.SyncBuffer, args ...string) error {
	t.Helper()
	cmd := NewRootCommand()
	cmd.SetArgs(append([]string{"observe"}, args...))
	cmd.SetOut(out)
	cmd.SetErr(out)
	return cmd.ExecuteContext(ctx)
}

func observeLines(t *testing.T, args ...string) []string {
	t.Helper()
	var out testutil.SyncBuffer
	if err := runObserve(context.Background(), t, &out, args...); err != nil {
		t.Fatalf("observe %v: %v\n%s", args, err, out.String())
	}
	return strings.Split(strings.TrimSpace(out.String()), "\n")
}

func parseJSONLines(t *testing.T, lines []string) []*flowpb.Flow {
	t.Helper()
	var out []*flowpb.Flow
	for _, l := range lines {
		if l == "" {
			continue
		}
		var r observerpb.GetFlowsResponse
		if err := protojson.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("parse %q: %v", l, err)
		}
		out = append(out, r.GetFlow())
	}
	return out
}

// TestPrivilegedObserveCommand runs `tendril observe` against the Hubble
// server, fed with flows decoded from the real datapath's events.
func TestPrivilegedObserveCommand(t *testing.T) {
	evs := hubbletest.DatapathEvents(t, hubbletest.Scenario())
	obs := observer.New(observer.Config{}, hubbletest.Node{Name: "node-a"}, nil)
	for _, ev := range evs[:len(evs)-1] {
		if err := obs.Observe(ev); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(t.TempDir(), "hubble.sock")
	srv := hubble.New(hubble.Config{SocketPath: sock, TCPAddress: "127.0.0.1:0"}, obs, nil)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	stored := len(evs) - 1

	for _, server := range []string{"unix://" + sock, srv.TCPAddr().String()} {
		flows := parseJSONLines(t, observeLines(t, "--server", server, "--all", "-o", "json"))
		if len(flows) != stored {
			t.Fatalf("%s: %d flows, want %d", server, len(flows), stored)
		}
	}
	sock = "unix://" + sock

	compact := strings.Join(observeLines(t, "--server", sock, "--last", "100"), "\n")
	for _, want := range []string{
		"shop/web-7d9f:40000 (ID:1000) -> data/db-0:5432 (ID:1001) policy-verdict FORWARDED TCP Flags: SYN; allowed by data/db-allow-web",
		"192.0.2.9:50000 (ID:2) -> data/db-0:22 (ID:1001) drop DROPPED (Policy deny) TCP Flags: SYN; denied by data/db-deny-ssh",
		"shop/web-7d9f:40001 (ID:1000) -> data/db-0:3306 (ID:1001) drop DROPPED (Policy denied) TCP Flags: SYN; default deny",
		"data/db-0:5432 (ID:1001) -> shop/web-7d9f:40000 (ID:1000) from-endpoint FORWARDED TCP Flags: SYN, ACK; reply",
	} {
		if !strings.Contains(compact, want) {
			t.Errorf("compact output lacks %q:\n%s", want, compact)
		}
	}
	if lines := observeLines(t, "--server", sock, "--last", "3"); len(lines) != 3 {
		t.Errorf("--last 3 printed %d lines", len(lines))
	}
	table := observeLines(t, "--server", sock, "--verdict", "DROPPED", "-o", "table")
	if len(table) != 3 || !strings.HasPrefix(table[0], "TIME") || !strings.Contains(table[0], "VERDICT") {
		t.Errorf("table of drops:\n%s", strings.Join(table, "\n"))
	}

	filters := []struct {
		args  []string
		check func(*flowpb.Flow) bool
	}{
		{[]string{"--pod", "shop/web"}, func(f *flowpb.Flow) bool {
			return f.GetSource().GetPodName() == "web-7d9f" || f.GetDestination().GetPodName() == "web-7d9f"
		}},
		{[]string{"--from-namespace", "data"}, func(f *flowpb.Flow) bool { return f.GetSource().GetNamespace() == "data" }},
		{[]string{"--to-label", "app=db", "--type", "drop"}, func(f *flowpb.Flow) bool {
			return f.GetDestination().GetPodName() == "db-0" && f.GetVerdict() == flowpb.Verdict_DROPPED
		}},
		{[]string{"--to-port", "22"}, func(f *flowpb.Flow) bool { return f.GetL4().GetTCP().GetDestinationPort() == 22 }},
		{[]string{"--protocol", "udp"}, func(f *flowpb.Flow) bool { return f.GetL4().GetUDP() != nil }},
		{[]string{"--ip", "192.0.2.0/24"}, func(f *flowpb.Flow) bool {
			return f.GetIP().GetSource() == "192.0.2.9" || f.GetIP().GetDestination() == "192.0.2.9"
		}},
		{[]string{"--tcp-flags", "SYN,ACK"}, func(f *flowpb.Flow) bool { return f.GetL4().GetTCP().GetFlags().GetACK() }},
		{[]string{"--type", "trace:to-endpoint"}, func(f *flowpb.Flow) bool {
			return f.GetTraceObservationPoint() == flowpb.TraceObservationPoint_TO_ENDPOINT
		}},
		{[]string{"--identity", "2"}, func(f *flowpb.Flow) bool {
			return f.GetSource().GetIdentity() == 2 || f.GetDestination().GetIdentity() == 2
		}},
		{[]string{"--drop-reason", "POLICY_DENY"}, func(f *flowpb.Flow) bool {
			return f.GetDropReasonDesc() == flowpb.DropReason_POLICY_DENY
		}},
	}
	for _, c := range filters {
		flows := parseJSONLines(t, observeLines(t, append([]string{"--server", sock, "--all", "-o", "json"}, c.args...)...))
		if len(flows) == 0 || len(flows) == stored {
			t.Errorf("%v selected %d of %d flows", c.args, len(flows), stored)
		}
		for _, f := range flows {
			if !c.check(f) {
				t.Errorf("%v let through %v", c.args, f)
			}
		}
	}
	// The stored flows are L3/L4: an L7 protocol selects none of them,
	// and a malformed L7 filter is refused, not turned into one that
	// matches nothing.
	if flows := parseJSONLines(t, observeLines(t, "--server", sock, "--all", "-o", "json", "--protocol", "http")); len(flows) != 0 {
		t.Errorf("--protocol http selected %d L3/L4 flows", len(flows))
	}
	var out testutil.SyncBuffer
	if err := runObserve(context.Background(), t, &out, "--server", sock, "--http-status", "abc"); err == nil {
		t.Error("a malformed --http-status was accepted")
	}

	// --follow prints a flow made after it started, while it runs (the
	// deadline only ends a follow that never prints).
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var fout testutil.SyncBuffer
	go func() {
		done <- runObserve(ctx, t, &fout, "--server", sock, "--follow", "--protocol", "udp", "-o", "json")
	}()
	deadline := time.Now().Add(30 * time.Second)
	for obs.Followers() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := obs.Observe(evs[len(evs)-1]); err != nil {
		t.Fatal(err)
	}
	for fout.String() == "" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("follow: %v", err)
	}
	flows := parseJSONLines(t, strings.Split(strings.TrimSpace(fout.String()), "\n"))
	if len(flows) != 1 || !flows[0].GetIsReply().GetValue() {
		t.Fatalf("followed %d flows (%v)", len(flows), flows)
	}
}

func TestObserveRequest(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		o      observeOptions
		number uint64
		first  bool
		nf     int
		err    bool
	}{
		{o: observeOptions{}, number: 20},
		{o: observeOptions{follow: true}, number: 0},
		{o: observeOptions{last: 100, follow: true}, number: 100},
		{o: observeOptions{first: 5}, number: 5, first: true},
		{o: observeOptions{first: 5, follow: true}, err: true},
		{o: observeOptions{all: true, verdict: []string{"dropped"}}, nf: 1},
		{o: observeOptions{pod: []string{"ns/a"}, verdict: []string{"DROPPED"}}, number: 20, nf: 2},
		{o: observeOptions{verdict: []string{"sideways"}}, err: true},
		{o: observeOptions{types: []string{"l8"}}, err: true},
		{o: observeOptions{types: []string{"l7"}}, number: 20, nf: 1},
		{o: observeOptions{since: "5m"}, number: 0},
	}
	for i, c := range cases {
		req, err := c.o.request(now)
		if c.err {
			if err == nil {
				t.Errorf("case %d: no error", i)
			}
			continue
		}
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if req.GetNumber() != c.number || req.GetFirst() != c.first || len(req.GetWhitelist()) != c.nf {
			t.Errorf("case %d: %v", i, req)
		}
	}
	req, _ := (&observeOptions{since: "5m"}).request(now)
	if !req.GetSince().AsTime().Equal(now.Add(-5 * time.Minute)) {
		t.Errorf("since %v", req.GetSince().AsTime())
	}
	req, _ = (&observeOptions{pod: []string{"ns/a"}, ns: []string{"kube-system"}}).request(now)
	if w := req.GetWhitelist(); len(w) != 2 || strings.Join(w[0].GetSourcePod(), " ") != "ns/a kube-system/" ||
		strings.Join(w[1].GetDestinationPod(), " ") != "ns/a kube-system/" || len(w[0].GetDestinationPod()) != 0 {
		t.Errorf("either-side filters: %v", w)
	}
}

// TestCompactPolicyDetails: a compact line names the deny rule's policy,
// the default deny, and a verdict's match type.
func TestCompactPolicyDetails(t *testing.T) {
	for _, tc := range []struct {
		f    *flowpb.Flow
		want string
	}{
		{&flowpb.Flow{Verdict: flowpb.Verdict_DROPPED, DropReasonDesc: flowpb.DropReason_POLICY_DENY,
			IngressDeniedBy: []*flowpb.Policy{{Namespace: "data", Name: "db-deny"}}}, "denied by data/db-deny"},
		{&flowpb.Flow{Verdict: flowpb.Verdict_DROPPED, DropReasonDesc: flowpb.DropReason_POLICY_DENIED}, "default deny"},
		{&flowpb.Flow{Verdict: flowpb.Verdict_DROPPED, DropReasonDesc: flowpb.DropReason_POLICY_DENIED,
			IngressDeniedBy: []*flowpb.Policy{{Namespace: "demo", Name: "allow-frontend"}}}, "default deny of demo/allow-frontend"},
		{&flowpb.Flow{Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 5}, PolicyMatchType: 2,
			IngressAllowedBy: []*flowpb.Policy{{Namespace: "data", Name: "db"}}}, "allowed by data/db; match L3-L4"},
	} {
		if got := summary(tc.f); got != tc.want {
			t.Errorf("summary %q, want %q", got, tc.want)
		}
	}
}

// TestObserveVerdictHelpNamesEveryVerdict: --verdict's help and its error
// name every verdict the agent's flows carry, AUDIT (audit-mode policy)
// included.
func TestObserveVerdictHelpNamesEveryVerdict(t *testing.T) {
	cmd := newObserveCommand(nil)
	usage := cmd.Flags().Lookup("verdict").Usage
	_, err := (&observeOptions{verdict: []string{"sideways"}}).request(time.Now())
	for _, v := range []string{"FORWARDED", "DROPPED", "AUDIT"} {
		if !strings.Contains(usage, v) {
			t.Errorf("--verdict help %q does not name %s", usage, v)
		}
		if err == nil || !strings.Contains(err.Error(), v) {
			t.Errorf("--verdict error %v does not name %s", err, v)
		}
	}
}

// TestObserveL7Flows: `tendril observe --type l7` asks for the proxies'
// flows alone and prints each readably: the DNS query, its rcode and
// answer, the HTTP request and its status, and the proxy's reason.
func TestObserveL7Flows(t *testing.T) {
	obs := observer.New(observer.Config{}, hubbletest.Node{Name: "node-a"}, nil)
	// A datapath flow the filter must leave out.
	if err := obs.Observe(loader.Event{Type: maps.EventTrace, Direction: maps.DirEgress, EndpointID: 1, Proto: 6,
		Src: hubbletest.WebIP, Dst: hubbletest.DBIP, SrcPort: 40000, DstPort: 5432, TCPFlags: 0x02, ObsPoint: maps.ObsFromEndpoint}); err != nil {
		t.Fatal(err)
	}
	// As the proxies build them (pkg/fqdn, pkg/l7proxy).
	udp := &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: 34561, DestinationPort: 53}}}
	tcp := &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 58808, DestinationPort: 5432}}}
	web := func() *flowpb.Endpoint { return &flowpb.Endpoint{ID: 1, Identity: hubbletest.WebIdentity} }
	ip := &flowpb.IP{Source: hubbletest.WebIP.String(), Destination: hubbletest.DBIP.String(), IpVersion: flowpb.IPVersion_IPv4}
	obs.PublishL7(&flowpb.Flow{Type: flowpb.FlowType_L7, EventType: &flowpb.CiliumEventType{Type: observer.MessageTypeAccessLog},
		Verdict: flowpb.Verdict_FORWARDED, IP: ip, L4: udp, Source: web(), Summary: "DNS allowed by dns rule matchName: world.example",
		L7: &flowpb.Layer7{Type: flowpb.L7FlowType_RESPONSE, LatencyNs: 1500000, Record: &flowpb.Layer7_Dns{Dns: &flowpb.DNS{
			Query: "world.example.", Qtypes: []string{"A"}, Ips: []string{"192.0.2.10"}, Ttl: 30, Rcode: 0, ObservationSource: "proxy"}}}})
	obs.PublishL7(&flowpb.Flow{Type: flowpb.FlowType_L7, EventType: &flowpb.CiliumEventType{Type: observer.MessageTypeAccessLog},
		Verdict: flowpb.Verdict_DROPPED, DropReasonDesc: flowpb.DropReason_POLICY_DENIED, IP: ip, L4: tcp, Source: web(), Summary: "HTTP no http rule allows it",
		L7: &flowpb.Layer7{Type: flowpb.L7FlowType_RESPONSE, LatencyNs: 250000, Record: &flowpb.Layer7_Http{Http: &flowpb.HTTP{
			Code: 403, Method: "POST", Url: "http://db/healthz", Protocol: "HTTP/1.1"}}}})
	sock := filepath.Join(t.TempDir(), "hubble.sock")
	srv := hubble.New(hubble.Config{SocketPath: sock}, obs, nil)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()

	lines := observeLines(t, "--server", "unix://"+sock, "--type", "l7", "--all")
	if len(lines) != 2 {
		t.Fatalf("--type l7 printed %d lines, want 2:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for i, want := range []string{
		"shop/web-7d9f:34561 (ID:1000) -> data/db-0:53 (ID:1001) dns-response FORWARDED DNS world.example. A NOERROR 192.0.2.10 TTL 30 1.5ms; DNS allowed by dns rule matchName: world.example",
		"shop/web-7d9f:58808 (ID:1000) -> data/db-0:5432 (ID:1001) http-response DROPPED (Policy denied) HTTP/1.1 POST http://db/healthz => 403 250µs; HTTP no http rule allows it",
	} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d:\n%s\nlacks\n%s", i, lines[i], want)
		}
	} // The L7 filters, through the server's GetFlows: each flag keeps
	// exactly the flow with that record.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--http-status", "4+"}, "POST http://db/healthz"},
		{[]string{"--http-method", "post"}, "POST http://db/healthz"},
		{[]string{"--http-path", "^/healthz$"}, "POST http://db/healthz"},
		{[]string{"--http-url", "^http://db/"}, "POST http://db/healthz"},
		{[]string{"--dns-query", `^world\.example\.$`}, "DNS world.example."},
		{[]string{"--protocol", "dns"}, "DNS world.example."},
		{[]string{"--protocol", "http", "--from-pod", "shop/"}, "POST http://db/healthz"},
	} {
		lines := observeLines(t, append([]string{"--server", "unix://" + sock, "--all"}, c.args...)...)
		if len(lines) != 1 || !strings.Contains(lines[0], c.want) {
			t.Errorf("observe %v: want one line with %q, got:\n%s", c.args, c.want, strings.Join(lines, "\n"))
		}
	}
}
