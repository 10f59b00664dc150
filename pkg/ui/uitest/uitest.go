// Package uitest drives the web UI (pkg/ui) in headless Chromium for
// tests: the unit tests' page over an in-process server, the lab's over
// the lab's relay (test/e2e).
package uitest

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

// Browser starts headless Chromium (Debian's chromium, from
// hack/install-deps.sh) for the test. Under CI=true a missing chromium
// fails the test. On failure the page's screenshot is written to the
// test's artifact directory (go test -artifacts -outputdir DIR keeps it;
// without -artifacts, under $TMPDIR/tendril-ui-artifacts).
func Browser(t testing.TB) context.Context {
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

// Do runs browser steps with a generous deadline.
func Do(t testing.TB, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(cctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Value runs one browser action that answers a value.
func Value[T any](t testing.TB, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(cctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// Poll waits until a JavaScript expression is true.
func Poll(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(45*time.Second))
}
