package kvstore

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/kvstore/kvembed"
	"github.com/tendril-net/tendril/pkg/testutil/etcdproc"
)

// testLog returns a logger writing to the test's log; lines logged by
// goroutines after the test ended are dropped instead of panicking.
func testLog(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.stop)
	level := slog.LevelInfo
	if os.Getenv("TENDRIL_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(string(p[:len(p)-1]))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}

func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// testServer is an etcd the tests can restart on the same data and address.
type testServer interface {
	Endpoints() []string
	// Stop takes the server down; Start brings it back on the same data
	// directory and address.
	Stop(t testing.TB)
	Start(t testing.TB)
}

// embeddedServer is an in-process etcd.
type embeddedServer struct {
	cfg kvembed.Config
	log *slog.Logger
	e   *kvembed.Server
}

// newEmbeddedServer starts an embedded etcd without fsync: tests check
// behaviour, not durability against machine crashes.
func newEmbeddedServer(t testing.TB) *embeddedServer {
	return newEmbeddedServerFsync(t, false)
}

func newEmbeddedServerFsync(t testing.TB, fsync bool) *embeddedServer {
	s := &embeddedServer{cfg: kvembed.Config{Dir: t.TempDir(), UnsafeNoFsync: !fsync}, log: testLog(t)}
	s.Start(t)
	t.Cleanup(func() {
		if s.e != nil {
			_ = s.e.Stop(context.Background())
		}
	})
	return s
}

func (s *embeddedServer) Endpoints() []string { return s.e.Endpoints() }

func (s *embeddedServer) Start(t testing.TB) {
	t.Helper()
	e, err := kvembed.Start(testContext(t, 30*time.Second), s.cfg, s.log)
	if err != nil {
		t.Fatal(err)
	}
	s.e = e
	// Restarts come back on the same address.
	s.cfg.ClientURL = e.Endpoints()[0]
}

func (s *embeddedServer) Stop(t testing.TB) {
	t.Helper()
	if err := s.e.Stop(testContext(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// etcdBinary is where hack/k8s-binaries.sh puts the etcd binary.
func etcdBinary() string { return etcdproc.Binary() }

// newProcessServer is the real etcd binary as a child process.
func newProcessServer(t testing.TB) *etcdproc.Server { return etcdproc.Start(t) }

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// servers runs f against each kind of etcd: embedded, and the real binary
// when built.
func forEachServer(t *testing.T, f func(t *testing.T, srv testServer)) {
	t.Run("embedded", func(t *testing.T) { f(t, newEmbeddedServer(t)) })
	t.Run("binary", func(t *testing.T) { f(t, newProcessServer(t)) })
}

type configOption func(*Config)

func withOption(k, v string) configOption {
	return func(c *Config) { c.Options[k] = v }
}

func withLeaseTTL(d time.Duration) configOption {
	return func(c *Config) { c.LeaseTTL = d }
}

func testConfig(endpoints []string, opts ...configOption) Config {
	cfg := DefaultConfig()
	cfg.Endpoints = endpoints
	cfg.ConnectTimeout = 30 * time.Second
	cfg.LeaseTTL = 30 * time.Second
	cfg.Options[OptHealthInterval] = "100ms"
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// connect returns a client closed at the end of the test.
func connect(t testing.TB, endpoints []string, opts ...configOption) *Client {
	t.Helper()
	c, err := Connect(testContext(t, 60*time.Second), testConfig(endpoints, opts...), testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// eventString is an event as tests compare it.
func eventString(ev Event) string {
	switch ev.Type {
	case EventListDone:
		return "list-done"
	case EventDelete:
		return "delete " + ev.Key
	}
	return fmt.Sprintf("%s %s=%s", ev.Type, ev.Key, ev.Value)
}

// expectEvents reads exactly the wanted events, in order, from ch.
func expectEvents(t testing.TB, ctx context.Context, ch <-chan Event, want ...string) []Event {
	t.Helper()
	var got []Event
	for i, w := range want {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("event %d: channel closed, want %q", i, w)
			}
			got = append(got, ev)
			if s := eventString(ev); s != w {
				t.Fatalf("event %d = %q, want %q (events so far: %q)", i, s, w, eventStrings(got))
			}
		case <-ctx.Done():
			t.Fatalf("event %d: %v waiting for %q (got %q)", i, ctx.Err(), w, eventStrings(got))
		}
	}
	return got
}

// expectEventSet reads len(want) events and checks that they are the
// wanted ones in any order (for writes that race each other); it returns
// them sorted by key.
func expectEventSet(t testing.TB, ctx context.Context, ch <-chan Event, want ...string) []Event {
	t.Helper()
	var got []Event
	for len(got) < len(want) {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("channel closed after %q, want %q", eventStrings(got), want)
			}
			got = append(got, ev)
		case <-ctx.Done():
			t.Fatalf("%v after %q, want %q", ctx.Err(), eventStrings(got), want)
		}
	}
	slices.SortFunc(got, func(a, b Event) int { return strings.Compare(a.Key, b.Key) })
	gotStrings, wantSorted := eventStrings(got), slices.Sorted(slices.Values(want))
	slices.Sort(gotStrings)
	if !slices.Equal(gotStrings, wantSorted) {
		t.Fatalf("events %q, want %q in any order", gotStrings, wantSorted)
	}
	return got
}

// expectClosed drains ch until it is closed, failing if ctx ends first.
func expectClosed(t testing.TB, ctx context.Context, ch <-chan Event) {
	t.Helper()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-ctx.Done():
			t.Fatalf("event channel not closed: %v", ctx.Err())
		}
	}
}

func eventStrings(evs []Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = eventString(ev)
	}
	return out
}

// waitFor polls cond until it holds or ctx ends. Polling waits for a state
// to be reached; it asserts nothing about how fast.
func waitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
