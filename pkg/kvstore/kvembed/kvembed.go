// Package kvembed runs a single-member etcd server in the calling process,
// for tests, benchmarks and standalone labs. It is a package of its own so
// that only they link etcd's server (about 10 MB of the binary): the agent
// talks to an etcd it does not run (docs/kvstore.md).
package kvembed

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/tendril-net/tendril/pkg/kvstore/etcdlog"
)

// Config configures an in-process etcd server.
type Config struct {
	// Dir holds the data (required). Starting again on the same Dir
	// resumes the same data, revisions and leases.
	Dir string
	// ClientURL is where clients connect: "" picks a free loopback TCP
	// port; "http://127.0.0.1:2379" a given one (reuse Endpoints()[0] to
	// restart on the same address); "unix:///path/etcd.sock" a socket.
	ClientURL string
	// UnsafeNoFsync skips fsync: much faster, loses data on a machine
	// crash. For tests and throwaway labs only.
	UnsafeNoFsync bool
}

// Server is a single-member etcd running in this process, for
// standalone labs and tests.
type Server struct {
	etcd      *embed.Etcd
	endpoints []string
	log       *slog.Logger
	quiet     *atomic.Bool
}

// Start starts etcd and waits until it serves clients (or ctx
// ends).
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Server, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("embedded etcd: no data directory")
	}
	clientURL := cfg.ClientURL
	if clientURL == "" {
		// Port 0: the kernel picks a free port and Endpoints reports it.
		clientURL = "http://127.0.0.1:0"
	}
	cu, err := url.Parse(clientURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd client URL %q: %w", clientURL, err)
	}
	unix := cu.Scheme == "unix"
	if !unix && cu.Scheme != "http" {
		return nil, fmt.Errorf("embedded etcd client URL %q: want http://host:port or unix:///path", clientURL)
	}
	if unix && !filepath.IsAbs(cu.Host+cu.Path) {
		return nil, fmt.Errorf("embedded etcd client URL %q: the socket path must be absolute (unix:///path)", clientURL)
	}
	// A single member never talks to peers, but etcd wants a peer
	// listener: a free loopback port.
	pu, _ := url.Parse("http://127.0.0.1:0")

	ec := embed.NewConfig()
	ec.Name = "tendril"
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{*cu}
	ec.AdvertiseClientUrls = []url.URL{*cu}
	if unix {
		// etcd insists on host:port in advertised URLs; a socket has
		// none, and a single member's advertised URL is only informative.
		ec.AdvertiseClientUrls = []url.URL{*pu}
	}
	ec.ListenPeerUrls = []url.URL{*pu}
	ec.AdvertisePeerUrls = []url.URL{*pu}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	quiet := new(atomic.Bool)
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdlog.New(log.With("component", "etcd-server"), quiet))

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", cfg.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s: %w", cfg.Dir, err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s: not ready: %w", cfg.Dir, ctx.Err())
	}
	endpoint := clientURL
	if !unix {
		endpoint = "http://" + e.Clients[0].Addr().String()
	}
	log.Info("Embedded etcd ready", "dir", cfg.Dir, "endpoint", endpoint)
	return &Server{etcd: e, endpoints: []string{endpoint}, log: log, quiet: quiet}, nil
}

// Endpoints are the client URLs to put in kvstore.Config.Endpoints.
func (e *Server) Endpoints() []string { return append([]string(nil), e.endpoints...) }

// Stop shuts the server down and waits until it has (ctx bounds the wait).
// Connected clients see the connection drop. etcd lets open client streams
// (watches) finish for up to about 7 s before it cuts them: close clients
// first for a quick stop.
func (e *Server) Stop(ctx context.Context) error {
	e.quiet.Store(true)
	stopped := make(chan struct{})
	go func() {
		e.etcd.Close()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		return fmt.Errorf("stop embedded etcd: %w", ctx.Err())
	}
	// Close returns once the server has stopped and its listeners are
	// closed, so a restart on the same address can bind it.
	e.log.Info("Embedded etcd stopped", "endpoint", strings.Join(e.endpoints, ","))
	return nil
}
