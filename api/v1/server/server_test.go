package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func startServer(t *testing.T) (*Server, *http.Client, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	sock := filepath.Join(t.TempDir(), "sub", "api.sock")
	s, err := New(Config{Socket: sock, MaxBodyBytes: 64}, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	s.Handle(http.MethodGet, "/v1/thing/{id}", func(w http.ResponseWriter, r *http.Request) error {
		WriteJSON(w, http.StatusOK, map[string]string{"id": r.PathValue("id")})
		return nil
	})
	s.Handle(http.MethodPut, "/v1/thing/{id}", func(w http.ResponseWriter, r *http.Request) error {
		var body map[string]any
		if err := DecodeJSON(r, &body); err != nil {
			return err
		}
		WriteJSON(w, http.StatusCreated, body)
		return nil
	})
	s.Handle(http.MethodDelete, "/v1/thing/{id}", func(w http.ResponseWriter, r *http.Request) error {
		panic("handler bug")
	})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	return s, hc, reg
}

func TestRoutesThroughRealSocket(t *testing.T) {
	_, hc, reg := startServer(t)
	tests := []struct {
		name, method, path, body string
		wantCode                 int
		wantBody                 string
	}{
		{"get with id", "GET", "/v1/thing/pod-name:ns%2Fa", "", 200, `{"id":"pod-name:ns/a"}`},
		{"put ok", "PUT", "/v1/thing/1", `{"a":1}`, 201, `{"a":1}`},
		{"malformed body", "PUT", "/v1/thing/1", `{"a":`, 400, `"malformed JSON body`},
		{"empty body", "PUT", "/v1/thing/1", ``, 400, `"request body is empty`},
		{"trailing data", "PUT", "/v1/thing/1", `{} {}`, 400, `trailing data`},
		{"body too large", "PUT", "/v1/thing/1", `{"a":"` + strings.Repeat("x", 100) + `"}`, 413, `larger than 64 bytes`},
		{"unknown path", "GET", "/v1/nothing", "", 404, `"no such API path: GET /v1/nothing"`},
		{"wrong method", "POST", "/v1/thing/1", "", 405, `not allowed`},
		{"panic is a 500", "DELETE", "/v1/thing/1", "", 500, `internal error: handler bug`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, "http://api"+tt.path, strings.NewReader(tt.body))
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantCode {
				t.Fatalf("code = %d, want %d (body %s)", resp.StatusCode, tt.wantCode, data)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type = %q", ct)
			}
			if !strings.Contains(string(data), tt.wantBody) {
				t.Fatalf("body = %s, want it to contain %s", data, tt.wantBody)
			}
		})
	}
	if got := counterValue(t, reg, "/v1/thing/{id}", "PUT", "400"); got != 3 {
		t.Fatalf("400s counted for PUT = %v, want 3", got)
	}
}

func counterValue(t *testing.T, reg *prometheus.Registry, path, method, code string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tendril_api_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["path"] == path && labels["method"] == method && labels["code"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no counter for %s %s %s", method, path, code)
	return 0
}

func TestSocketLifecycle(t *testing.T) {
	s, _, _ := startServer(t)
	info, err := os.Stat(s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	if mode := info.Mode().Perm(); mode != 0o660 {
		t.Fatalf("socket mode = %o, want 660", mode)
	}
	// A second server on a live socket refuses to start.
	second, _ := New(Config{Socket: s.Socket()}, slog.New(slog.DiscardHandler), nil)
	if err := second.Listen(); err == nil || !strings.Contains(err.Error(), "served by a running agent") {
		t.Fatalf("second Listen = %v, want refusal", err)
	}
	// Stop removes the socket.
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Socket()); !os.IsNotExist(err) {
		t.Fatalf("socket still there after Stop: %v", err)
	}
}

func TestStaleSocketIsReplaced(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "stale.sock")
	// A socket file nobody listens on, as a killed agent leaves it.
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}
	s, _ := New(Config{Socket: sock}, slog.New(slog.DiscardHandler), nil)
	if err := s.Listen(); err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	if err := s.Serve(); err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		t.Fatalf("dial new socket: %v", err)
	}
	conn.Close()
	_ = s.Stop(context.Background())
}

// TestConfigValidate: the socket must be absolute and the body bound
// positive; each error names its option.
func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Socket: "rel.sock", MaxBodyBytes: 1}, "socket"},
		{Config{Socket: "/a.sock", MaxBodyBytes: 0}, "api-max-body-bytes 0"},
		{Config{Socket: "/a.sock", MaxBodyBytes: -5}, "api-max-body-bytes -5"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %q", tc.cfg, err, tc.want)
		}
	}
}
