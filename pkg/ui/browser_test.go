package ui

import (
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tendril-net/tendril/pkg/hubble/exporter"
	"github.com/tendril-net/tendril/pkg/ui/uitest"
)

// TestBrowserServiceMapFlowsPolicy loads the page in Chromium over the UI
// server reading a real Hubble server fed the lab demo's traffic.
func TestBrowserServiceMapFlowsPolicy(t *testing.T) {
	ctx := uitest.Browser(t)
	// An export file of earlier flows, for the table's history search.
	history := filepath.Join(t.TempDir(), "flows.json")
	ex, err := exporter.New(exporter.Config{Path: history, MaxSizeBytes: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range demoFlows(t, time.Now().Add(-time.Hour), 7) {
		ex.Export(f)
	}
	if err := ex.Close(); err != nil {
		t.Fatal(err)
	}
	// The page's next live stream request can be held at a gate, so the
	// test can send flows between the list's answer and the stream's
	// start, where the page once missed them.
	gate := &streamGate{}
	demo, s, hs := uiOverDemoWith(t, Config{StreamBatch: 50 * time.Millisecond, HistoryFiles: []string{history}}, gate.wrap)
	for i := range 3 {
		demo.round(t, time.Duration(i)*time.Second, uint16(40000+i))
	}
	eventually(t, "the flows in the UI", func() bool { return s.Store().Len() == 30 })

	// The service map: the frontend → backend edge, and other → backend
	// dropped, drawn in red, naming allow-frontend.
	type edgeLook struct{ Text, Stroke string }
	uitest.Do(t, ctx, "the service map",
		chromedp.Navigate(hs.URL),
		chromedp.WaitVisible(`g.edge.forwarded[data-source="demo/frontend"][data-target="demo/backend"]`),
		chromedp.WaitVisible(`g.edge.dropped[data-source="demo/other"][data-target="demo/backend"]`),
	)
	// How long the page took to load its assets (logged, not bounded).
	load := uitest.Value(t, ctx, "the page's load time", chromedp.Evaluate[float64](`performance.getEntriesByType('navigation')[0].loadEventEnd`))
	t.Logf("the page and its assets loaded in %.0f ms", load)
	drop := uitest.Value(t, ctx, "the dropped edge", chromedp.Evaluate[edgeLook](`(() => {
		const g = document.querySelector('g.edge.dropped[data-source="demo/other"][data-target="demo/backend"]');
		return { Text: g.querySelector('text').textContent, Stroke: getComputedStyle(g.querySelector('path')).stroke }; })()`))
	if !strings.Contains(drop.Text, "dropped") || !strings.Contains(drop.Text, "demo/allow-frontend") || drop.Stroke != "rgb(211, 47, 47)" {
		t.Errorf("the dropped edge reads %q in %s, want red naming demo/allow-frontend", drop.Text, drop.Stroke)
	}

	// The flow table filtered by verdict: only drops (two a round), and a
	// new round's drops arrive while following.
	arrived, release := gate.hold("DROPPED")
	uitest.Do(t, ctx, "the flow table filtered to drops",
		chromedp.Click(`nav button[data-tab="flows"]`),
		chromedp.SetValue(`select[name="verdict"]`, "DROPPED"),
		chromedp.Click(`#filters button[type="submit"]`),
		uitest.Poll(`(() => { const rows = document.querySelectorAll('#flows tbody tr.flow');
			return rows.length === 6 && Array.from(rows).every(r => r.dataset.verdict === 'DROPPED'); })()`),
	)
	// A round sent after the list answered and before the stream started
	// arrives in the table: the stream starts where the list ended.
	select {
	case <-arrived:
	case <-time.After(45 * time.Second):
		t.Fatal("the page opened no live stream")
	}
	demo.round(t, 3*time.Second, 40003)
	eventually(t, "the fourth round in the UI", func() bool { return s.Store().Len() == 40 })
	close(release)
	uitest.Do(t, ctx, "the followed drops",
		uitest.Poll(`(() => { const rows = document.querySelectorAll('#flows tbody tr.flow');
			return rows.length === 8 && Array.from(rows).every(r => r.dataset.verdict === 'DROPPED'); })()`),
	)

	// The export files: the seven earlier rounds' audit verdicts.
	uitest.Do(t, ctx, "the history search",
		chromedp.SetValue(`select[name="verdict"]`, "AUDIT"),
		chromedp.Click(`#history-box input`),
		chromedp.Click(`#filters button[type="submit"]`),
		uitest.Poll(`(() => { const rows = document.querySelectorAll('#flows tbody tr.flow');
			return rows.length === 7 && Array.from(rows).every(r => r.dataset.verdict === 'AUDIT')
				&& document.querySelector('#flows-info').textContent.includes('export files'); })()`),
	)

	// The policy view of the backend (a click on its node): the suggested
	// policy admits the frontend; what-if answers for a pasted policy.
	uitest.Do(t, ctx, "the policy view",
		chromedp.Click(`nav button[data-tab="map"]`),
		chromedp.WaitVisible(`g.node[data-id="demo/backend"]`),
		chromedp.Click(`g.node[data-id="demo/backend"] rect`),
		uitest.Poll(`(document.querySelector('#suggested') || {}).textContent?.includes('kind: NetworkPolicy')`),
	)
	suggested := uitest.Value(t, ctx, "the suggested policy", chromedp.Text(`#suggested`))
	uitest.Do(t, ctx, "what-if", chromedp.Click(`#whatif-run`), chromedp.WaitVisible(`#whatif-summary`))
	summary := uitest.Value(t, ctx, "the what-if summary", chromedp.Text(`#whatif-summary`))
	if !strings.Contains(suggested, "app: backend") || !strings.Contains(suggested, "app: frontend") || strings.Contains(suggested, "app: other") {
		t.Errorf("suggested policy:\n%s", suggested)
	}
	// With no rules in force, the suggestion (which admits only the
	// frontend into the backend) would deny what other and far sent.
	if !strings.Contains(summary, "change verdict") || strings.HasPrefix(summary, "0 of") {
		t.Errorf("what-if summary %q", summary)
	}
}

// streamGate holds the next /api/stream request of a verdict until
// released.
type streamGate struct {
	mu               sync.Mutex
	verdict          string
	arrived, release chan struct{}
}

// hold makes the gate hold the next stream request filtered to verdict
// (the page's stream of the unfiltered table may come later than the
// test arms the gate): arrived closes when it comes, and it proceeds when
// release is closed.
func (g *streamGate) hold(verdict string) (arrived, release chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.verdict, g.arrived, g.release = verdict, make(chan struct{}), make(chan struct{})
	return g.arrived, g.release
}

func (g *streamGate) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/stream" {
			g.mu.Lock()
			arrived, release := g.arrived, g.release
			if r.URL.Query().Get("verdict") == g.verdict {
				g.arrived, g.release = nil, nil
			} else {
				arrived = nil
			}
			g.mu.Unlock()
			if arrived != nil {
				close(arrived)
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}
