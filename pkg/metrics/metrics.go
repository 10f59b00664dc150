// Package metrics owns the agent's Prometheus registry (Go runtime and
// process collectors plus whatever the modules register) and serves it on
// --prometheus-serve-addr.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
)

// Config is the metrics server's configuration.
type Config struct {
	// ServeAddr is the TCP address of the /metrics endpoint; empty disables it.
	ServeAddr string `mapstructure:"prometheus-serve-addr"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{ServeAddr: "127.0.0.1:9962"} }

// Flags registers the metrics flags.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("prometheus-serve-addr", c.ServeAddr, "Address to serve Prometheus metrics on (empty disables)")
}

// Server serves a registry over HTTP.
type Server struct {
	cfg      Config
	log      *slog.Logger
	Registry *prometheus.Registry

	srv  *http.Server
	addr string
	done chan struct{}
}

// New returns a server with a fresh registry holding the Go and process
// collectors.
func New(cfg Config, log *slog.Logger) *Server {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Server{cfg: cfg, log: log, Registry: reg}
}

// Start listens and serves; it does nothing when the address is empty.
func (s *Server) Start(context.Context) error {
	if s.cfg.ServeAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.ServeAddr)
	if err != nil {
		return fmt.Errorf("listen for metrics on %s: %w", s.cfg.ServeAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{}))
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	s.addr = ln.Addr().String()
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("Metrics server stopped", "error", err)
		}
	}()
	s.log.Info("Serving Prometheus metrics", "addr", s.addr)
	return nil
}

// Addr is the address actually listened on (empty when disabled).
func (s *Server) Addr() string { return s.addr }

// Stop shuts the server down.
func (s *Server) Stop(ctx context.Context) error {
	if s.srv == nil {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}
