package ui

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// browser starts headless Chromium (Debian's chromium, from
// hack/install-deps.sh) for the test. Under CI=true a missing chromium
// fails the test. On failure the page's screenshot is written to the
// test's artifact directory (go test -artifacts -outputdir DIR keeps it;
// without -artifacts, under $TMPDIR/tendril-ui-artifacts).
func browser(t *testing.T) context.Context {
	t.Helper()
	exe, err := exec.LookPath("chromium")
	testutil.Require(t, err == nil, "no chromium on PATH (hack/install-deps.sh installs Debian's)")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.Headless,
		// Root has no sandbox; a container's /dev/shm is small.
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1400, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
		defer scancel()
		png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100)) // quality 100: a PNG
		if err != nil {
			t.Logf("screenshot: %v", err)
			return
		}
		dir := t.ArtifactDir()
		if f := flag.Lookup("test.artifacts"); f == nil || f.Value.String() != "true" {
			dir = filepath.Join(os.TempDir(), "tendril-ui-artifacts")
		}
		path := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".png")
		if err := os.MkdirAll(dir, 0o755); err == nil {
			err = os.WriteFile(path, png, 0o644)
		}
		t.Logf("screenshot of the page at the failure: %s (%v)", path, err)
	})
	return ctx
}

// do runs browser steps with a generous deadline.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(cctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// value runs one browser action that answers a value.
func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(cctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// poll waits until a JavaScript expression is true.
func poll(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(45*time.Second))
}

// TestBrowserServiceMapFlowsPolicy loads the page in Chromium over the UI
// server reading a real Hubble server fed the lab demo's traffic.
func TestBrowserServiceMapFlowsPolicy(t *testing.T) {
	ctx := browser(t)
	demo, s, hs := uiOverDemo(t, Config{StreamBatch: 50 * time.Millisecond})
	for i := range 3 {
		demo.round(t, time.Duration(i)*time.Second, uint16(40000+i))
	}
	eventually(t, "the flows in the UI", func() bool { return s.Store().Len() == 30 })

	// The service map: the frontend → backend edge, and other → backend
	// dropped, drawn in red, naming allow-frontend.
	type edgeLook struct{ Text, Stroke string }
	do(t, ctx, "the service map",
		chromedp.Navigate(hs.URL),
		chromedp.WaitVisible(`g.edge.forwarded[data-source="demo/frontend"][data-target="demo/backend"]`),
		chromedp.WaitVisible(`g.edge.dropped[data-source="demo/other"][data-target="demo/backend"]`),
	)
	drop := value(t, ctx, "the dropped edge", chromedp.Evaluate[edgeLook](`(() => {
		const g = document.querySelector('g.edge.dropped[data-source="demo/other"][data-target="demo/backend"]');
		return { Text: g.querySelector('text').textContent, Stroke: getComputedStyle(g.querySelector('path')).stroke }; })()`))
	if !strings.Contains(drop.Text, "dropped") || !strings.Contains(drop.Text, "demo/allow-frontend") || drop.Stroke != "rgb(211, 47, 47)" {
		t.Errorf("the dropped edge reads %q in %s, want red naming demo/allow-frontend", drop.Text, drop.Stroke)
	}

	// The flow table filtered by verdict: only drops (two a round), and a
	// new round's drops arrive while following.
	do(t, ctx, "the flow table filtered to drops",
		chromedp.Click(`nav button[data-tab="flows"]`),
		chromedp.SetValue(`select[name="verdict"]`, "DROPPED"),
		chromedp.Click(`#filters button[type="submit"]`),
		poll(`(() => { const rows = document.querySelectorAll('#flows tbody tr.flow');
			return rows.length === 6 && Array.from(rows).every(r => r.dataset.verdict === 'DROPPED'); })()`),
	)
	demo.round(t, 3*time.Second, 40003)
	do(t, ctx, "the followed drops",
		poll(`(() => { const rows = document.querySelectorAll('#flows tbody tr.flow');
			return rows.length === 8 && Array.from(rows).every(r => r.dataset.verdict === 'DROPPED'); })()`),
	)

	// The policy view of the backend (a click on its node): the suggested
	// policy admits the frontend; what-if answers for a pasted policy.
	do(t, ctx, "the policy view",
		chromedp.Click(`nav button[data-tab="map"]`),
		chromedp.WaitVisible(`g.node[data-id="demo/backend"]`),
		chromedp.Click(`g.node[data-id="demo/backend"] rect`),
		poll(`(document.querySelector('#suggested') || {}).textContent?.includes('kind: NetworkPolicy')`),
	)
	suggested := value(t, ctx, "the suggested policy", chromedp.Text(`#suggested`))
	do(t, ctx, "what-if", chromedp.Click(`#whatif-run`), chromedp.WaitVisible(`#whatif-summary`))
	summary := value(t, ctx, "the what-if summary", chromedp.Text(`#whatif-summary`))
	if !strings.Contains(suggested, "app: backend") || !strings.Contains(suggested, "app: frontend") || strings.Contains(suggested, "app: other") {
		t.Errorf("suggested policy:\n%s", suggested)
	}
	// With no rules in force, the suggestion (which admits only the
	// frontend into the backend) would deny what other and far sent.
	if !strings.Contains(summary, "change verdict") || strings.HasPrefix(summary, "0 of") {
		t.Errorf("what-if summary %q", summary)
	}
}
