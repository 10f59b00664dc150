package mapeventlog

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/mapevents"
	"github.com/tendril-net/tendril/pkg/testutil"
)

func serve(t *testing.T, reg *mapevents.Registry) (string, *http.Client) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	api, err := server.New(server.Config{Socket: sock}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range apiHandlers(reg).Handlers {
		r(api)
	}
	if err := api.Listen(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = api.Serve() }()
	t.Cleanup(func() { _ = api.Stop(context.Background()) })
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	return sock, client
}

// TestMapEventsAPI: GET /v1/map/{name}/events streams the ring's events
// as MapEvent objects, by the map's pinned or short name; an unknown map
// is 404 naming those that record events; follow=true streams the events
// recorded after the request; the stock cilium-dbg `map events` reads
// them.
func TestMapEventsAPI(t *testing.T) {
	reg := mapevents.NewRegistry(8)
	ring := reg.Ring(maps.IPCacheMapName)
	ring.Record(models.MapEventActionUpdate, "10.244.1.7/32", "identity=1234", nil)
	ring.Record(models.MapEventActionDelete, "10.244.1.8/32", "identity=1235", errors.New("injected"))
	sock, client := serve(t, reg)

	get := func(path string) (int, string) {
		resp, err := client.Get("http://agent" + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, name := range []string{maps.IPCacheMapName, "ipcache"} {
		code, body := get("/v1/map/" + name + "/events")
		dec := json.NewDecoder(strings.NewReader(body))
		var evs []models.MapEvent
		for dec.More() {
			var ev models.MapEvent
			if err := dec.Decode(&ev); err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		if code != 200 || len(evs) != 2 || evs[0].Key != "10.244.1.7/32" || evs[1].LastError != "injected" || evs[1].DesiredAction != "delete" {
			t.Fatalf("events of %s: %d %s", name, code, body)
		}
	}
	if code, body := get("/v1/map/nosuch/events"); code != 404 || !strings.Contains(body, maps.IPCacheMapName) {
		t.Errorf("unknown map: %d %s", code, body)
	}
	if code, _ := get("/v1/map/ipcache/events?follow=maybe"); code != 400 {
		t.Errorf("follow=maybe: %d", code)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/v1/map/ipcache/events?follow=true", nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for range 2 {
		if !sc.Scan() {
			t.Fatal("follow: the past events missing")
		}
	}
	ring.Record(models.MapEventActionUpdate, "10.244.1.9/32", "identity=7", nil)
	if !sc.Scan() || !strings.Contains(sc.Text(), "10.244.1.9/32") {
		t.Fatalf("follow: the new event missing: %q", sc.Text())
	}
	cancel()

	out, err := exec.Command("../../../hack/cilium-dbg.sh").Output()
	testutil.Require(t, err == nil, "stock cilium-dbg not built")
	bin := strings.TrimSpace(string(out))
	cmd := exec.Command(bin, "-H", "unix://"+sock, "map", "events", maps.IPCacheMapName)
	done := make(chan struct{})
	var got []byte
	go func() { got, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	if err != nil || !strings.Contains(string(got), `key="10.244.1.7/32"`) || !strings.Contains(string(got), `lastError="injected"`) || !strings.Contains(string(got), "10.244.1.9/32") {
		t.Fatalf("cilium-dbg map events: %v\n%s", err, got)
	}
	t.Logf("cilium-dbg map events %s:\n%s", maps.IPCacheMapName, got)
}
