// Package profiling serves Go's pprof endpoints (/debug/pprof/...) on
// --pprof-serve-addr, off by default: an operator turns it on to find
// where the agent spends its time.
package profiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"

	"github.com/spf13/pflag"
)

// Config is the profiling server's configuration.
type Config struct {
	// ServeAddr is the TCP address of the pprof endpoints; empty disables.
	ServeAddr string `mapstructure:"pprof-serve-addr"`
	// BlockProfileRate samples one blocking event per this many
	// nanoseconds blocked (runtime.SetBlockProfileRate); 0 records none.
	// Only applied while pprof is served.
	BlockProfileRate int `mapstructure:"pprof-block-profile-rate"`
	// MutexProfileFraction samples 1/n of mutex contention events
	// (runtime.SetMutexProfileFraction); 0 records none. Only applied while
	// pprof is served.
	MutexProfileFraction int `mapstructure:"pprof-mutex-profile-fraction"`
}

// DefaultConfig returns the defaults (disabled).
func DefaultConfig() Config { return Config{} }

// Flags registers the flags.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("pprof-serve-addr", c.ServeAddr, "Address to serve Go pprof profiles on, e.g. 127.0.0.1:6060 (empty disables)")
	fs.Int("pprof-block-profile-rate", c.BlockProfileRate, "With --pprof-serve-addr: record one blocking event per this many nanoseconds blocked for /debug/pprof/block (0: none)")
	fs.Int("pprof-mutex-profile-fraction", c.MutexProfileFraction, "With --pprof-serve-addr: record 1/n of mutex contention events for /debug/pprof/mutex (0: none)")
}

// Server serves the pprof handlers.
type Server struct {
	cfg  Config
	log  *slog.Logger
	srv  *http.Server
	done chan struct{}
}

// New returns a server; nothing listens until Start.
func New(cfg Config, log *slog.Logger) *Server { return &Server{cfg: cfg, log: log} }

// Start listens; it does nothing when disabled.
func (s *Server) Start(context.Context) error {
	if s.cfg.ServeAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.ServeAddr)
	if err != nil {
		return fmt.Errorf("pprof-serve-addr %s: %w", s.cfg.ServeAddr, err)
	}
	if s.cfg.BlockProfileRate < 0 || s.cfg.MutexProfileFraction < 0 {
		ln.Close()
		return fmt.Errorf("pprof-block-profile-rate and pprof-mutex-profile-fraction must not be negative")
	}
	runtime.SetBlockProfileRate(s.cfg.BlockProfileRate)
	runtime.SetMutexProfileFraction(s.cfg.MutexProfileFraction)
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.srv = &http.Server{Handler: mux}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("pprof server", "error", err)
		}
	}()
	s.log.Info("Serving pprof", "address", ln.Addr().String())
	return nil
}

// Stop closes the listener.
func (s *Server) Stop(ctx context.Context) error {
	if s.srv == nil {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	<-s.done
	runtime.SetBlockProfileRate(0)
	runtime.SetMutexProfileFraction(0)
	return err
}
