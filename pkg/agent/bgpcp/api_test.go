package bgpcp

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
	"github.com/tendril-net/tendril/pkg/bgp/speaker"
)

// serve registers the handlers of cp on an API server on a socket and
// returns a GET against it.
func serve(t *testing.T, cp *ControlPlane) func(path string) (int, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	srv, err := server.New(server.Config{Socket: sock}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range apiHandlers(cp).Handlers {
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
		resp, err := c.Get("http://agent" + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
}

// TestAPIDisabled: with the control plane off both routes answer 501, as
// Cilium's do.
func TestAPIDisabled(t *testing.T) {
	get := serve(t, nil)
	for _, p := range []string{"/v1/bgp/peers", "/v1/bgp/routes?table_type=loc-rib&afi=ipv4&safi=unicast", "/v1/bgp/route-policies"} {
		if code, body := get(p); code != http.StatusNotImplemented {
			t.Fatalf("GET %s: %d %s, want 501", p, code, body)
		}
	}
}

// TestAPIQueries: a running control plane with no config answers empty
// lists (JSON arrays, not null); bad parameters are 400 with a message.
func TestAPIQueries(t *testing.T) {
	sp := speaker.New(slog.New(slog.DiscardHandler), -1)
	t.Cleanup(func() { sp.Stop(context.Background()) })
	get := serve(t, &ControlPlane{speaker: sp})
	for p, want := range map[string]int{
		"/v1/bgp/peers": http.StatusOK,
		"/v1/bgp/routes?table_type=loc-rib&afi=ipv4&safi=unicast":                          http.StatusOK,
		"/v1/bgp/routes?table_type=loc-rib&afi=ipv6&safi=unicast&router_asn=65001":         http.StatusOK,
		"/v1/bgp/routes?table_type=loc-rib&afi=ipv4":                                       http.StatusBadRequest,
		"/v1/bgp/routes?table_type=rib&afi=ipv4&safi=unicast":                              http.StatusBadRequest,
		"/v1/bgp/routes?table_type=adj-rib-in&afi=ipv4&safi=unicast":                       http.StatusBadRequest,
		"/v1/bgp/routes?table_type=adj-rib-out&afi=ipv4&safi=unicast&neighbor=not-an-addr": http.StatusBadRequest,
		"/v1/bgp/routes?table_type=loc-rib&afi=ipv4&safi=unicast&router_asn=x":             http.StatusBadRequest,
		"/v1/bgp/route-policies":               http.StatusOK,
		"/v1/bgp/route-policies?router_asn=-1": http.StatusBadRequest,
	} {
		code, body := get(p)
		if code != want {
			t.Errorf("GET %s: %d %s, want %d", p, code, body, want)
			continue
		}
		if code == http.StatusOK {
			var list []json.RawMessage
			if err := json.Unmarshal([]byte(body), &list); err != nil || list == nil {
				t.Errorf("GET %s: %q, want an empty JSON array", p, body)
			}
		}
	}
}
