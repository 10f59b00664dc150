package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/cilium/api/v1/models"
	gobgp "github.com/osrg/gobgp/v3/pkg/packet/bgp"

	"github.com/tendril-net/tendril/api/v1/server"
)

func b64(t *testing.T, a gobgp.PathAttributeInterface) *models.BgpPathAttribute {
	t.Helper()
	b, err := a.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return &models.BgpPathAttribute{Base64: base64.StdEncoding.EncodeToString(b)}
}

// TestBGPCommands: `tendril bgp peers` prints a row per session and
// family; `tendril bgp routes` asks GET /v1/bgp/routes with Cilium's
// parameters (loc-rib ipv4 unicast by default; advertised needs a
// neighbor) and prints each path's next hop decoded from the attributes'
// wire format.
func TestBGPCommands(t *testing.T) {
	peers := []*models.BgpPeer{{LocalAsn: 65001, PeerAsn: 65000, PeerAddress: "172.30.0.1", PeerPort: 179, SessionState: "established",
		UptimeNanoseconds: 61e9, Families: []*models.BgpPeerFamilies{{Afi: "ipv4", Safi: "unicast", Received: 3, Advertised: 2}}}}
	routes := []*models.BgpRoute{{Prefix: "10.244.1.0/24", RouterAsn: 65001, Paths: []*models.BgpPath{{Best: true, AgeNanoseconds: 5e9,
		PathAttributes: []*models.BgpPathAttribute{b64(t, gobgp.NewPathAttributeOrigin(0)), b64(t, gobgp.NewPathAttributeNextHop("172.30.0.11"))}}}}}
	var queries []string
	sock := filepath.Join(t.TempDir(), "tendril.sock")
	srv, err := server.New(server.Config{Socket: sock}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.Handle(http.MethodGet, "/v1/bgp/peers", func(w http.ResponseWriter, _ *http.Request) error {
		server.WriteJSON(w, http.StatusOK, peers)
		return nil
	})
	srv.Handle(http.MethodGet, "/v1/bgp/routes", func(w http.ResponseWriter, r *http.Request) error {
		queries = append(queries, r.URL.RawQuery)
		server.WriteJSON(w, http.StatusOK, routes)
		return nil
	})
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := NewRootCommand()
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"-H", "unix://" + sock, "bgp"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run("peers")
	if err != nil || !strings.Contains(out, "65001     65000    172.30.0.1:179  established  1m1s    ipv4/unicast  3         2") {
		t.Fatalf("bgp peers: %v\n%s", err, out)
	}
	out, err = run("routes")
	if err != nil || !strings.Contains(out, "10.244.1.0/24") || !strings.Contains(out, "172.30.0.11") || !strings.Contains(out, "true") {
		t.Fatalf("bgp routes: %v\n%s", err, out)
	}
	if _, err := run("routes", "advertised", "neighbor", "172.30.0.1", "ipv6"); err != nil {
		t.Fatal(err)
	}
	want := []string{"afi=ipv4&safi=unicast&table_type=loc-rib", "afi=ipv6&neighbor=172.30.0.1&safi=unicast&table_type=adj-rib-out"}
	if strings.Join(queries, " ") != strings.Join(want, " ") {
		t.Fatalf("queries %q, want %q", queries, want)
	}
	if _, err := run("routes", "advertised"); err == nil || !strings.Contains(err.Error(), "needs neighbor") {
		t.Fatalf("advertised without a neighbor: %v", err)
	}
}
