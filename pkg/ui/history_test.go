package ui

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/hubble/exporter"
)

// TestHistoryFromExportFiles: flows the agent's exporter wrote (rotated
// into a backup, the file ending in a partial line) are searched with the
// page's filters, oldest first across the files.
func TestHistoryFromExportFiles(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	flows := demoFlows(t, base, 20)
	path := filepath.Join(t.TempDir(), "flows.json")
	ex, err := exporter.New(exporter.Config{Path: path, MaxSizeBytes: 64 << 10, MaxBackups: 5}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		ex.Export(f)
	}
	if err := ex.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".1"); err != nil {
		t.Fatalf("the export did not rotate (the test wants a backup): %v", err)
	}
	fh, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fh.WriteString(`{"flow":{"time":"2030-01-01T00:00:30Z","verd`)
	fh.Close()

	v, _ := url.ParseQuery("verdict=DROPPED&pod=demo/far")
	q, err := ParseQuery(v, base)
	if err != nil {
		t.Fatal(err)
	}
	m, err := q.Compile()
	if err != nil {
		t.Fatal(err)
	}
	res, err := SearchHistory([]string{path}, m, 5)
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 20 || len(res.Flows) != 5 || res.Unreadable != 1 || len(res.Files) < 2 {
		t.Fatalf("matched %d, got %d, unreadable %d, files %v", res.Matched, len(res.Flows), res.Unreadable, res.Files)
	}
	for i, r := range res.Flows {
		// The last five rounds, oldest first.
		if r.Source.ID != "demo/far" || r.Verdict != "DROPPED" || !r.Time.Equal(base.Add(time.Duration(15+i)*time.Second)) {
			t.Errorf("flow %d: %s %s at %v", i, r.Source.ID, r.Verdict, r.Time)
		}
	}

	// The server: without files the endpoint says how to get them.
	hs := httptest.NewServer(New(Config{Relay: "unix:///nonexistent"}, nil).Handler())
	defer hs.Close()
	resp, err := http.Get(hs.URL + "/api/history")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("history without files: %d", resp.StatusCode)
	}
	hs2 := httptest.NewServer(New(Config{Relay: "unix:///nonexistent", HistoryFiles: []string{path}}, nil).Handler())
	defer hs2.Close()
	var got HistoryResult
	if code := getJSON(t, hs2.URL+"/api/history?verdict=AUDIT&limit=3", &got); code != 200 || got.Matched != 20 || len(got.Flows) != 3 {
		t.Errorf("history over HTTP: %d, matched %d, %d flows", code, got.Matched, len(got.Flows))
	}
}
