package l7proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// One proxy, two rule sets (ConnOptions.Both): a request passes only when
// an egress rule and an ingress rule allow it; the 403 of each side is
// told apart in the flows (an ingress denial also gives the egress flow of
// the 403, as Cilium shows it), a passed request gives one flow per side,
// and the connection's own Dial is used for the upstream. Ingress rules
// that are nil allow nothing. A rule that does not compile allows nothing
// and does not shift which rule the flows name.
func TestHTTPProxyBothRuleSets(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok "+r.URL.Path)
	}))
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())

	var mu sync.Mutex
	var flows []string
	p := NewHTTP(Config{
		Rules: func(Source, netip.AddrPort) []api.PortRuleHTTP {
			return []api.PortRuleHTTP{{Path: "("}, {Path: "/both"}, {Path: "/egress-only"}}
		},
		Dial: func(_, _ netip.AddrPort) (net.Conn, error) { return nil, fmt.Errorf("the proxy's own Dial was used") },
		Flow: func(f *flowpb.Flow) {
			mu.Lock()
			defer mu.Unlock()
			flows = append(flows, fmt.Sprintf("%s %s %d %s", f.GetTrafficDirection(), f.GetVerdict(), f.GetL7().GetHttp().GetCode(), f.GetSummary()))
		},
	})
	var dials atomic.Int32
	serve := func(ingress []api.PortRuleHTTP) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.ServeConnWith(c, Source{EndpointID: 7, Identity: 4242}, upAddr, ConnOptions{
				Both: &Both{IngressRules: ingress},
				Dial: func(_, dst netip.AddrPort) (net.Conn, error) {
					dials.Add(1)
					return net.Dial("tcp", dst.String())
				},
			})
		}()
		return "http://" + ln.Addr().String()
	}
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}}
	get := func(base, path string) int {
		t.Helper()
		resp, err := client.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	base := serve([]api.PortRuleHTTP{{Path: "/both"}, {Path: "/ingress-only"}})
	var codes []int
	for _, path := range []string{"/both", "/egress-only", "/ingress-only"} {
		codes = append(codes, get(base, path))
	}
	client.CloseIdleConnections()
	if fmt.Sprint(codes) != "[200 403 403]" {
		t.Errorf("/both, /egress-only, /ingress-only answered %v, want [200 403 403]", codes)
	}
	if dials.Load() != 1 {
		t.Errorf("the connection's Dial was called %d times, want 1", dials.Load())
	}
	want := []string{
		`INGRESS FORWARDED 200 HTTP allowed by the destination's ingress http rule 0 {method: "", path: "/both", host: "", headers: []}`,
		`EGRESS FORWARDED 200 HTTP allowed by http rule 1 {method: "", path: "/both", host: "", headers: []}`,
		`INGRESS DROPPED 403 HTTP no http rule of the destination's ingress allows it`,
		`EGRESS FORWARDED 403 HTTP allowed by http rule 2 {method: "", path: "/egress-only", host: "", headers: []}`,
		`EGRESS DROPPED 403 HTTP no http rule of the source's egress allows it`,
	}
	mu.Lock()
	if strings.Join(flows, "\n") != strings.Join(want, "\n") {
		t.Errorf("flows:\n%s\nwant:\n%s", strings.Join(flows, "\n"), strings.Join(want, "\n"))
	}
	flows = nil
	mu.Unlock()

	// No ingress rules: nothing passes, whatever the egress allows.
	base = serve(nil)
	if code := get(base, "/both"); code != http.StatusForbidden {
		t.Errorf("/both with no ingress rules answered %d, want 403", code)
	}
	client.CloseIdleConnections()
}
