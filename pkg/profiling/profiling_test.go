package profiling

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestServesPprofIndexAndIsOffByDefault(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	off := New(DefaultConfig(), quiet)
	if err := off.Start(context.Background()); err != nil || off.srv != nil {
		t.Fatalf("disabled server started: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := New(Config{ServeAddr: addr}, quiet)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	resp, err := http.Get("http://" + addr + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "goroutine") {
		t.Fatalf("index: %d %s", resp.StatusCode, body)
	}
}
