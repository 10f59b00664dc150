package prefilter

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/cli"
	dpprefilter "github.com/tendril-net/tendril/pkg/datapath/prefilter"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// serveAPI serves the cell's /v1/prefilter handlers over pf on a unix
// socket and returns its path.
func serveAPI(t *testing.T, pf *Prefilter) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	api, err := server.New(server.Config{Socket: sock}, quiet, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range apiHandlers(pf).Handlers {
		r(api)
	}
	if err := api.Listen(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = api.Serve() }()
	t.Cleanup(func() { _ = api.Stop(context.Background()) })
	return sock
}

// openPrefilter is the cell's Prefilter over real maps (attached to no
// device) under a fresh BPF root, its list saved in dir.
func openPrefilter(t *testing.T, dir string) *Prefilter {
	t.Helper()
	testutil.Privileged(t)
	if _, err := bpffs.EnsureMounted(); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	root := filepath.Join("/sys/fs/bpf", "tendril-pfapi-"+hex.EncodeToString(b))
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dp, err := dpprefilter.Open(root, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dp.Close)
	return &Prefilter{dp: dp, list: startList(t, dp, dir), log: quiet}
}

// TestPrivilegedStockCiliumDbgPrefilter: the stock cilium-dbg (v1.18.8)
// drives /v1/prefilter: `prefilter update --cidr` adds (IPv4 and IPv6),
// `prefilter list` shows the realized revision and CIDRs, an update at a
// stale --revision fails and changes nothing, `prefilter delete` removes.
// The raw API answers 461 for a bad CIDR (the list unchanged) and
// malformed JSON with 400.
func TestPrivilegedStockCiliumDbgPrefilter(t *testing.T) {
	pf := openPrefilter(t, t.TempDir())
	sock := serveAPI(t, pf)
	out, err := exec.Command("../../../hack/cilium-dbg.sh").Output()
	testutil.Require(t, err == nil, "stock cilium-dbg not built: "+string(out))
	bin := strings.TrimSpace(string(out))
	dbg := func(args ...string) (string, error) {
		t.Helper()
		out, err := exec.Command(bin, append([]string{"-H", "unix://" + sock}, args...)...).CombinedOutput()
		return string(out), err
	}

	if out, err := dbg("prefilter", "update", "--cidr", "198.51.100.0/24", "--cidr", "2001:db8:bad::/48"); err != nil || !strings.Contains(out, "Updated 2 prefilter entries") {
		t.Fatalf("cilium-dbg prefilter update: %v\n%s", err, out)
	}
	list, err := dbg("prefilter", "list")
	if err != nil || !strings.Contains(list, "Revision: 2") || !strings.Contains(list, "198.51.100.0/24") || !strings.Contains(list, "2001:db8:bad::/48") {
		t.Fatalf("cilium-dbg prefilter list: %v\n%s", err, list)
	}
	t.Logf("cilium-dbg prefilter list:\n%s", list)
	if out, err := dbg("prefilter", "update", "--revision", "1", "--cidr", "203.0.113.0/24"); err == nil || !strings.Contains(out, "revision") {
		t.Fatalf("update at a stale revision: %v\n%s", err, out)
	}
	if out, err := dbg("prefilter", "delete", "--revision", "2", "--cidr", "198.51.100.0/24"); err != nil || !strings.Contains(out, "Deleted 1 prefilter entries") {
		t.Fatalf("cilium-dbg prefilter delete: %v\n%s", err, out)
	}
	js, _ := dbg("prefilter", "list", "-o", "json")
	var m models.Prefilter
	if err := json.Unmarshal([]byte(js), &m); err != nil || m.Spec == nil || m.Spec.Revision != 3 || len(m.Spec.Deny) != 1 || m.Spec.Deny[0] != "2001:db8:bad::/48" ||
		m.Status == nil || m.Status.Realized == nil || m.Status.Realized.Revision != 3 {
		t.Fatalf("prefilter list -o json after delete (%v):\n%s", err, js)
	}

	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	do := func(method, body string) (int, string) {
		req, _ := http.NewRequest(method, "http://agent/v1/prefilter", strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do(http.MethodPatch, `{"deny":["192.0.2.0/24","192.0.2.0/40"]}`); code != 461 || !strings.Contains(body, "192.0.2.0/40") {
		t.Errorf("PATCH with a bad CIDR: %d %s", code, body)
	}
	if code, body := do(http.MethodDelete, `{"deny":"x"`); code != http.StatusBadRequest {
		t.Errorf("DELETE with malformed JSON: %d %s", code, body)
	}
	if code, body := do(http.MethodPatch, `{"revision":2,"deny":["192.0.2.0/24"]}`); code != http.StatusInternalServerError || !strings.Contains(body, "stale revision") {
		t.Errorf("PATCH at a stale revision: %d %s", code, body)
	}
	if code, body := do(http.MethodGet, ""); code != http.StatusOK || !strings.Contains(body, `"revision":3`) || !strings.Contains(body, `"dropped"`) {
		t.Errorf("GET after refused changes: %d %s", code, body)
	}
}

// TestPrivilegedTendrilPrefilterCommand: `tendril prefilter update`,
// `list` and `delete` drive the same handlers over real maps: the list
// shows each CIDR as in the maps, the revision and the counters; a stale
// --revision is refused with the reason and changes nothing; an update
// without --cidr is refused before any request.
func TestPrivilegedTendrilPrefilterCommand(t *testing.T) {
	pf := openPrefilter(t, t.TempDir())
	sock := serveAPI(t, pf)
	run := func(args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		cmd := cli.NewRootCommand()
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"-H", "unix://" + sock, "prefilter"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	if out, err := run("update", "--cidr", "198.51.100.0/24", "--cidr", "2001:db8:bad::/48"); err != nil || !strings.Contains(out, "Denied 2 CIDRs; the list is at revision 2") {
		t.Fatalf("tendril prefilter update: %v\n%s", err, out)
	}
	list, err := run("list")
	if err != nil || !strings.Contains(list, "Revision: 2 (in the maps: 2)") || !strings.Contains(list, "Dropped:  IPv4 0 packets") ||
		!regexp.MustCompile(`(?m)^198\.51\.100\.0/24 +yes$`).MatchString(list) || !regexp.MustCompile(`(?m)^2001:db8:bad::/48 +yes$`).MatchString(list) {
		t.Fatalf("tendril prefilter list: %v\n%s", err, list)
	}
	if out, err := run("update", "--revision", "1", "--cidr", "203.0.113.0/24"); err == nil || !strings.Contains(err.Error(), "revision") {
		t.Fatalf("update at a stale revision: %v\n%s", err, out)
	}
	if _, err := run("update"); err == nil || !strings.Contains(err.Error(), "no --cidr") {
		t.Fatalf("update without --cidr: %v", err)
	}
	if out, err := run("delete", "--revision", "2", "--cidr", "198.51.100.0/24"); err != nil || !strings.Contains(out, "Removed 1 CIDRs; the list is at revision 3") {
		t.Fatalf("tendril prefilter delete: %v\n%s", err, out)
	}
	js, err := run("list", "-o", "json")
	var m models.Prefilter
	if err != nil || json.Unmarshal([]byte(js), &m) != nil || m.Spec == nil || m.Spec.Revision != 3 || len(m.Spec.Deny) != 1 || m.Spec.Deny[0] != "2001:db8:bad::/48" {
		t.Fatalf("tendril prefilter list -o json after delete (%v):\n%s", err, js)
	}
}
