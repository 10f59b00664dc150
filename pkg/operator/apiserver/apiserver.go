// Package apiserver serves the operator's HTTP endpoints: /healthz (200
// when every registered check passes, 503 with the failing checks
// otherwise) and /metrics (the operator's Prometheus registry, with the
// Go and process collectors).
package apiserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
)

// Config is the listen address.
type Config struct {
	OperatorAPIServeAddr string
}

// DefaultConfig listens on loopback, Cilium's operator port.
func DefaultConfig() Config { return Config{OperatorAPIServeAddr: "127.0.0.1:9234"} }

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("operator-api-serve-addr", c.OperatorAPIServeAddr, "Address of /healthz and /metrics (empty disables them)")
}

// Check is one health check: nil when healthy.
type Check func(ctx context.Context) error

// Server is the HTTP server with its registry and checks.
type Server struct {
	cfg      Config
	log      *slog.Logger
	Registry *prometheus.Registry

	mu     sync.Mutex
	checks map[string]Check

	srv  *http.Server
	addr string
	done chan struct{}
}

// Cell provides *Server and starts it.
var Cell = cell.Module("api-server", "Health and metrics endpoints",
	cell.Config(DefaultConfig()),
	cell.Provide(newServer),
)

func newServer(cfg Config, log *slog.Logger, lc cell.Lifecycle) *Server {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &Server{cfg: cfg, log: log, Registry: reg, checks: map[string]Check{}}
	lc.Append(cell.Hook{OnStart: func(cell.HookContext) error { return s.start() }, OnStop: s.stop})
	return s
}

// AddCheck registers a named health check.
func (s *Server) AddCheck(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = c
}

// Addr is the address listened on (empty when disabled or not started).
func (s *Server) Addr() string { return s.addr }

func (s *Server) start() error {
	if s.cfg.OperatorAPIServeAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.OperatorAPIServeAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.OperatorAPIServeAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", s.healthz)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	s.addr = ln.Addr().String()
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("Operator API server stopped", "error", err)
		}
	}()
	s.log.Info("Serving /healthz and /metrics", "addr", s.addr)
	return nil
}

func (s *Server) stop(ctx cell.HookContext) error {
	if s.srv == nil {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}

// Health runs every check and returns the failures by name.
func (s *Server) Health(ctx context.Context) map[string]error {
	s.mu.Lock()
	checks := make(map[string]Check, len(s.checks))
	for k, v := range s.checks {
		checks[k] = v
	}
	s.mu.Unlock()
	failed := map[string]error{}
	for name, c := range checks {
		if err := c(ctx); err != nil {
			failed[name] = err
		}
	}
	return failed
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	failed := s.Health(ctx)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if len(failed) == 0 {
		_, _ = w.Write([]byte("ok\n"))
		return
	}
	lines := make([]string, 0, len(failed))
	for name, err := range failed {
		lines = append(lines, name+": "+err.Error())
	}
	sort.Strings(lines)
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte(strings.Join(lines, "\n") + "\n"))
}
