package ui

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// uiOverDemo runs the UI server reading a real Hubble server fed the demo's
// events, and serves it over HTTP.
func uiOverDemo(t testing.TB, cfg Config) (*demoServer, *Server, *httptest.Server) {
	t.Helper()
	return uiOverDemoWith(t, cfg, nil)
}

// uiOverDemoWith is uiOverDemo with the UI's handler wrapped by wrap (when
// not nil), for a test to hold a request.
func uiOverDemoWith(t testing.TB, cfg Config, wrap func(http.Handler) http.Handler) (*demoServer, *Server, *httptest.Server) {
	t.Helper()
	demo := newDemoServer(t)
	cfg.Relay = "unix://" + demo.socket
	s := New(cfg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ReadRelay(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("read relay: %v", err)
		}
	})
	h := s.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	hs := httptest.NewServer(h)
	// A page's event stream stays open while its browser lives: close the
	// connections first, or Close waits for them forever (a failed browser
	// test hung its package until the go test timeout).
	t.Cleanup(func() { hs.CloseClientConnections(); hs.Close() })
	return demo, s, hs
}

func getJSON(t testing.TB, u string, v any) int {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	return resp.StatusCode
}

// eventually polls cond every 20 ms until it holds, failing after a
// generous deadline.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestServerOverObserverAPI(t *testing.T) {
	demo, s, hs := uiOverDemo(t, Config{StreamBatch: 20 * time.Millisecond})
	// Flows the server had before the UI connected come in its first
	// request; later ones by following.
	demo.round(t, 0, 40000)
	eventually(t, "the first round in the UI", func() bool { return s.Store().Len() == 10 })
	demo.round(t, time.Second, 40001)
	eventually(t, "the second round in the UI", func() bool { return s.Store().Len() == 20 })

	var st Status
	if getJSON(t, hs.URL+"/api/status", &st); !st.Connected || st.Flows != 20 || st.RulesSource != "none" {
		t.Errorf("status %+v", st)
	}
	var m Map
	if code := getJSON(t, hs.URL+"/api/map?namespace=demo", &m); code != 200 {
		t.Fatalf("map: %d", code)
	}
	if edgeOf(&m, "demo/frontend", "demo/backend", "FORWARDED") == nil || edgeOf(&m, "demo/other", "demo/backend", "DROPPED") == nil {
		t.Errorf("map edges %+v", m.Edges)
	}
	var ns []string
	if getJSON(t, hs.URL+"/api/namespaces", &ns); strings.Join(ns, ",") != "demo" {
		t.Errorf("namespaces %v", ns)
	}
	var fl FlowList
	getJSON(t, hs.URL+"/api/flows?verdict=DROPPED&limit=3", &fl)
	if fl.Matched != 4 || len(fl.Flows) != 3 {
		t.Errorf("dropped flows: matched %d, got %d", fl.Matched, len(fl.Flows))
	}
	for _, r := range fl.Flows {
		if r.Verdict != "DROPPED" || r.Policies[0] != "demo/allow-frontend" {
			t.Errorf("row %+v", r)
		}
	}
	var bad map[string]string
	if code := getJSON(t, hs.URL+"/api/flows?verdict=MAYBE", &bad); code != 400 || !strings.Contains(bad["error"], "verdict") {
		t.Errorf("bad verdict: %d %v", code, bad)
	}
	var pv PolicyView
	if code := getJSON(t, hs.URL+"/api/policy?workload="+url.QueryEscape("demo/backend"), &pv); code != 200 || !strings.Contains(pv.Suggested, "kind: NetworkPolicy") {
		t.Errorf("policy view %d: %+v", code, pv)
	}

	// The live stream: a drop observed after it started arrives in it.
	resp, err := http.Get(hs.URL + "/api/stream?verdict=DROPPED&pod=demo/far")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("stream content type %q", ct)
	}
	rd := bufio.NewReader(resp.Body)
	if l, _ := rd.ReadString('\n'); !strings.HasPrefix(l, ":") {
		t.Fatalf("stream's first line %q", l)
	}
	demo.round(t, 2*time.Second, 40002)
	var msg StreamMessage
	for {
		l, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if data, ok := strings.CutPrefix(l, "data: "); ok {
			if err := json.Unmarshal([]byte(data), &msg); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if len(msg.Flows) != 1 || msg.Flows[0].Source.ID != "demo/far" || msg.Flows[0].SourcePort != 40002 || msg.Skipped != 0 {
		t.Errorf("stream message %+v", msg)
	}

	// What-if: with no rules in force everything is allowed; the demo's
	// allow-frontend would deny other and far.
	policy, err := os.ReadFile("../../examples/lab/allow-frontend.yaml")
	if err != nil {
		t.Fatal(err)
	}
	wr, err := http.Post(hs.URL+"/api/whatif", "application/yaml", strings.NewReader(string(policy)))
	if err != nil {
		t.Fatal(err)
	}
	var ans WhatIfAnswer
	if err := json.NewDecoder(wr.Body).Decode(&ans); err != nil || wr.StatusCode != 200 {
		t.Fatalf("what-if: %d %v", wr.StatusCode, err)
	}
	wr.Body.Close()
	var changed []string
	for _, c := range ans.Changes {
		changed = append(changed, c.Source+" → "+c.Destination+" "+c.Now+"→"+c.With)
	}
	if got := strings.Join(changed, "; "); !strings.Contains(got, "demo/app=other → demo/app=backend allowed→denied") ||
		!strings.Contains(got, "demo/app=far → demo/app=backend allowed→denied") || strings.Contains(got, "app=frontend → demo/app=backend") {
		t.Errorf("what-if changes: %s", got)
	}
	for body, want := range map[string]string{
		"kind: Pod\nmetadata: {name: x}\n": "(Pod)",
		"{{{":                              "document 1",
	} {
		wr, err := http.Post(hs.URL+"/api/whatif", "application/yaml", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(wr.Body)
		wr.Body.Close()
		if wr.StatusCode != 400 || !strings.Contains(string(b), want) {
			t.Errorf("what-if of %q: %d %s", body, wr.StatusCode, b)
		}
	}
}

func TestStaticAssetsEmbedded(t *testing.T) {
	hs := httptest.NewServer(New(Config{Relay: "unix:///nonexistent"}, nil).Handler())
	defer hs.Close()
	for _, p := range []string{"/", "/app.js", "/style.css"} {
		resp, err := http.Get(hs.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(b) == 0 {
			t.Errorf("GET %s: %d, %d bytes", p, resp.StatusCode, len(b))
		}
		// No CDN at run time: every asset the page loads is its own.
		// (The SVG namespace is a name, not a place the page loads from.)
		if strings.Contains(strings.ReplaceAll(string(b), "http://www.w3.org/2000/svg", ""), "://") {
			t.Errorf("%s refers to another site", p)
		}
	}
}

// TestHostChecked: the page answers for addresses, localhost and the
// allowed names only, so a site whose name is rebound to the UI's address
// (DNS rebinding) cannot read the flows from a browser.
func TestHostChecked(t *testing.T) {
	hs := httptest.NewServer(New(Config{Relay: "unix:///nonexistent", AllowedHosts: []string{"ui.example"}}, nil).Handler())
	defer hs.Close()
	for host, want := range map[string]int{
		"127.0.0.1:12000": 200, "localhost:12000": 200, "[::1]:12000": 200, "LOCALHOST": 200, "ui.example": 200, "ui.example:80": 200,
		"evil.example:12000": 403, "evil.example": 403, "127.0.0.1.evil.example": 403,
	} {
		req, err := http.NewRequest(http.MethodGet, hs.URL+"/api/status", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %s: %d %s, want %d", host, resp.StatusCode, b, want)
		}
	}
}
