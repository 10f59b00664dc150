package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/cilium/hive/cell"
)

// Responder answers the other nodes' HTTP probes: GET /hello on the
// health port of every address of the agent's network namespace, with
// the node's name.
type Responder struct {
	Node string
	Port uint16
	// Listening, if set, is called with the address once the responder
	// listens (tests use port 0).
	Listening func(net.Addr)
}

// Handler serves GET /hello (and nothing else).
func (r *Responder) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(r.Node + "\n"))
	})
	return mux
}

// Run listens and serves until ctx ends. A port taken (another agent in
// the same namespace, or anything else) is an error: the job retries it
// with backoff and its health shows the error meanwhile.
func (r *Responder) Run(ctx context.Context, health cell.Health) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort("", strconv.Itoa(int(r.Port))))
	if err != nil {
		err = fmt.Errorf("health responder: listen on port %d: %w", r.Port, err)
		health.Degraded("health responder not listening", err)
		return err
	}
	if r.Listening != nil {
		r.Listening(ln.Addr())
	}
	health.OK("serving on " + ln.Addr().String())
	return r.Serve(ctx, ln)
}

// Serve answers on ln until ctx ends (nil then) or serving fails; it
// closes ln.
func (r *Responder) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler: r.Handler(),
		// Anyone who reaches the node reaches this port: bound what a
		// slow or large request can hold.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       5 * time.Second,
		WriteTimeout:      5 * time.Second,
		IdleTimeout:       30 * time.Second,
		MaxHeaderBytes:    8 << 10,
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("health responder: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("health responder: %w", err)
	}
	return nil
}
