package uitest

import (
	"bytes"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/chromedp/chromedp"
)

// failOnPurpose makes TestScreenshotOnFailure's child run fail after
// loading a page.
const failOnPurpose = "TENDRIL_UITEST_FAIL_ON_PURPOSE"

// TestScreenshotOnFailure runs a browser test that fails (this test in a
// child process of the test binary) and checks what its output says: the
// path of a PNG of the page as it was at the failure, written to the test's
// artifact directory with -test.artifacts and under $TMPDIR without.
func TestScreenshotOnFailure(t *testing.T) {
	if os.Getenv(failOnPurpose) != "" {
		ctx := Browser(t)
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte(`<body style="background:#d32f2f"><h1 id="x">failing page</h1></body>`))
		}))
		defer hs.Close()
		Do(t, ctx, "the page", chromedp.Navigate(hs.URL), chromedp.WaitVisible(`#x`))
		t.Fatal("failing on purpose")
	}
	// Without a browser the child would skip and pass: check here.
	Browser(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	shot := regexp.MustCompile(`screenshot of the page at the failure: (\S+\.png) \(<nil>\)`)
	for name, args := range map[string][]string{
		"artifacts":    {"-test.artifacts", "-test.outputdir", t.TempDir()},
		"no artifacts": nil,
	} {
		t.Run(name, func(t *testing.T) {
			tmp := t.TempDir()
			cmd := exec.Command(self, append([]string{"-test.run", "^TestScreenshotOnFailure$", "-test.v"}, args...)...)
			cmd.Env = append(os.Environ(), failOnPurpose+"=1", "TMPDIR="+tmp)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the failing test passed:\n%s", out)
			}
			m := shot.FindSubmatch(out)
			if m == nil {
				t.Fatalf("no screenshot in the output:\n%s", out)
			}
			path := string(m[1])
			want := filepath.Join(tmp, "tendril-ui-artifacts")
			if args != nil {
				want = args[2]
			}
			if rel, err := filepath.Rel(want, path); err != nil || !filepath.IsLocal(rel) {
				t.Errorf("screenshot %s is not under %s", path, want)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			img, err := png.Decode(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("screenshot %s: %v", path, err)
			}
			// The page's red background fills the shot.
			if r, g, _, _ := img.At(img.Bounds().Dx()-5, img.Bounds().Dy()-5).RGBA(); r>>8 != 0xd3 || g>>8 != 0x2f {
				t.Errorf("screenshot %s is not the page (corner %v)", path, img.At(img.Bounds().Dx()-5, img.Bounds().Dy()-5))
			}
		})
	}
}
