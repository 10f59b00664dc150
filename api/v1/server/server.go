// Package server serves the agent's REST API: the paths and JSON models of
// the Cilium agent API v1 (basePath /v1) on a unix socket. Handlers are
// registered by the agent's modules; this package owns the socket, routing,
// JSON encoding, error bodies, body limits and request metrics.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
)

// Config is the API server's configuration.
type Config struct {
	// Socket is the unix socket path the API is served on.
	Socket string
	// MaxBodyBytes bounds request bodies; larger bodies get 413.
	MaxBodyBytes int64 `mapstructure:"api-max-body-bytes"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Socket: "/var/run/tendril/tendril.sock", MaxBodyBytes: 4 << 20}
}

// Flags registers the server's flags.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("socket", c.Socket, "Unix socket path of the agent API")
	fs.Int64("api-max-body-bytes", c.MaxBodyBytes, "Largest request body the API accepts")
}

// Validate checks the values; each error names its option.
func (c Config) Validate() error {
	if c.Socket == "" || !filepath.IsAbs(c.Socket) {
		return fmt.Errorf("socket %q: must be an absolute path", c.Socket)
	}
	// New turns a zero bound into the default for its callers in tests;
	// from the command line a bound of 0 or less is a mistake to name.
	if c.MaxBodyBytes <= 0 {
		return fmt.Errorf("api-max-body-bytes %d: must be positive", c.MaxBodyBytes)
	}
	return nil
}

// HandlerFunc serves one route. Returning an error writes it as a JSON error
// body: an *Error keeps its status code, anything else is a 500.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Error is an API error with its HTTP status code.
type Error struct {
	Code    int
	Message string
}

func (e *Error) Error() string { return e.Message }

// Errorf returns an *Error with code and a formatted message.
func Errorf(code int, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Server is the REST API server.
type Server struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *requestMetrics

	mu       sync.Mutex
	routes   map[string]map[string]HandlerFunc // path pattern → method → handler
	httpSrv  *http.Server
	listener net.Listener
	done     chan struct{}
}

// New returns a server; registry may be nil (no request metrics).
func New(cfg Config, log *slog.Logger, registry prometheus.Registerer) (*Server, error) {
	if cfg.Socket == "" {
		return nil, errors.New("api server: socket path is empty")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultConfig().MaxBodyBytes
	}
	s := &Server{cfg: cfg, log: log, mux: http.NewServeMux(), routes: map[string]map[string]HandlerFunc{}}
	m, err := newRequestMetrics(registry)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("no such API path: %s %s", r.Method, r.URL.Path))
	})
	return s, nil
}

// Handle registers h for method on path, a net/http pattern path below the
// API root such as "/v1/endpoint/{id}".
func (s *Server) Handle(method, path string, h HandlerFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	methods, ok := s.routes[path]
	if !ok {
		methods = map[string]HandlerFunc{}
		s.routes[path] = methods
		s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) { s.dispatch(path, w, r) })
	}
	methods[method] = h
}

func (s *Server) dispatch(path string, w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	h, ok := s.routes[path][r.Method]
	var allowed []string
	if !ok {
		for m := range s.routes[path] {
			allowed = append(allowed, m)
		}
	}
	s.mu.Unlock()
	if !ok {
		sort.Strings(allowed)
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		WriteError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allowed, ", ")))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	if err := h(w, r); err != nil {
		var apiErr *Error
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &apiErr):
			WriteError(w, apiErr.Code, apiErr.Message)
		case errors.As(err, &tooLarge):
			WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", tooLarge.Limit))
		default:
			s.log.Error("API handler failed", "method", r.Method, "path", r.URL.Path, "error", err)
			WriteError(w, http.StatusInternalServerError, err.Error())
		}
	}
}

// Handler returns the server's HTTP handler with recovery and metrics, for
// tests that serve it on their own listener.
func (s *Server) Handler() http.Handler {
	return s.metrics.wrap(recoverPanics(s.log, s.mux))
}

// Listen creates the socket's directory, refuses to start when a live agent
// already serves the socket, replaces a stale one, and listens with mode 0660.
func (s *Server) Listen() error {
	ln, err := ListenUnix(s.cfg.Socket)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.listener = ln
	s.mu.Unlock()
	return nil
}

// ListenUnix is the socket handling of Listen, for other unix servers.
func ListenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory %s: %w", filepath.Dir(path), err)
	}
	if _, err := os.Lstat(path); err == nil {
		conn, dialErr := net.DialTimeout("unix", path, time.Second)
		if dialErr == nil {
			conn.Close()
			return nil, fmt.Errorf("socket %s is served by a running agent; stop it first", path)
		}
		if !errors.Is(dialErr, syscall.ECONNREFUSED) && !errors.Is(dialErr, syscall.ENOENT) {
			return nil, fmt.Errorf("check existing socket %s: %w", path, dialErr)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// Close must not unlink a socket another process may own by then: we
	// remove it ourselves in Stop.
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	return ln, nil
}

// Serve serves on the listener opened by Listen until Stop.
func (s *Server) Serve() error {
	s.mu.Lock()
	ln := s.listener
	if ln == nil {
		s.mu.Unlock()
		return errors.New("api server: Serve before Listen")
	}
	s.httpSrv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	s.done = make(chan struct{})
	srv, done := s.httpSrv, s.done
	s.mu.Unlock()
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("API server stopped", "error", err)
		}
	}()
	s.log.Info("Serving the API", "socket", s.cfg.Socket)
	return nil
}

// Stop shuts the server down, waiting for requests in flight until ctx ends,
// and removes the socket.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	srv, done, ln := s.httpSrv, s.done, s.listener
	s.httpSrv, s.listener = nil, nil
	s.mu.Unlock()
	var err error
	if srv != nil {
		err = srv.Shutdown(ctx)
		<-done
	} else if ln != nil {
		err = ln.Close()
	}
	if rmErr := os.Remove(s.cfg.Socket); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
		err = errors.Join(err, fmt.Errorf("remove socket: %w", rmErr))
	}
	return err
}

// Socket returns the socket path.
func (s *Server) Socket() string { return s.cfg.Socket }

// WriteJSON writes v as JSON with the status code.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if v == nil {
		return
	}
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

// WriteError writes an error body. Like the Cilium API (models.Error is a
// string), the body is a JSON string.
func WriteError(w http.ResponseWriter, code int, msg string) {
	WriteJSON(w, code, msg)
}

// DecodeJSON decodes a request body into v; an empty, malformed or oversized
// body is a 4xx *Error with a message saying what is wrong.
func DecodeJSON(r *http.Request, v any) error {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return Errorf(http.StatusRequestEntityTooLarge, "request body larger than %d bytes", tooLarge.Limit)
		}
		return Errorf(http.StatusBadRequest, "read request body: %v", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return Errorf(http.StatusBadRequest, "request body is empty; a JSON document is required")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return Errorf(http.StatusBadRequest, "malformed JSON body: %v", err)
	}
	if dec.More() {
		return Errorf(http.StatusBadRequest, "malformed JSON body: trailing data after the document")
	}
	return nil
}

// BoolHeader reads a boolean header such as "brief: true"; absent is def.
func BoolHeader(r *http.Request, name string, def bool) (bool, error) {
	v := r.Header.Get(name)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, Errorf(http.StatusBadRequest, "header %s: %q is not a boolean", name, v)
	}
	return b, nil
}

func recoverPanics(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.Error("API handler panicked", "method", r.Method, "path", r.URL.Path, "panic", v)
				WriteError(w, http.StatusInternalServerError, fmt.Sprintf("internal error: %v", v))
			}
		}()
		next.ServeHTTP(w, r)
	})
}
