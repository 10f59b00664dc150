package wireguard

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/tendril-net/tendril/api/v1/server"
)

// post registers the handlers of e on an API server on a socket and
// returns a POST against it.
func post(t *testing.T, e *Encryption) func(path string) (int, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	srv, err := server.New(server.Config{Socket: sock}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range apiHandlers(e).Handlers {
		r(srv)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	return func(path string) (int, string) {
		resp, err := c.Post("http://agent"+path, "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
}

func TestRotateKeyAPI(t *testing.T) {
	if code, body := post(t, nil)("/v1/encrypt/rotate-key"); code != http.StatusNotImplemented {
		t.Fatalf("encryption off: %d %s, want 501", code, body)
	}
	v := newEnv(t)
	v.set(t, peer("b", "192.168.1.2", "10.244.2.0/24", pub(t)))
	v.synced()
	if err := v.e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	before, _ := v.e.WireGuardPublicKey()
	code, body := post(t, v.e)("/v1/encrypt/rotate-key")
	if code != http.StatusOK {
		t.Fatalf("rotate: %d %s", code, body)
	}
	var out RotateResponse
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	if out.PublicKey == before || v.dev.dev.PrivateKey.PublicKey().String() != out.PublicKey {
		t.Fatalf("answered %s (before %s), device has %s", out.PublicKey, before, v.dev.dev.PrivateKey.PublicKey())
	}
}
