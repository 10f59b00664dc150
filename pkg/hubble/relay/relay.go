// Package relay is the Hubble relay: it finds every node through the Peer
// service of a local agent (package pool), connects to each node's Hubble
// API and serves one Observer API over all of them (flows merged in time
// order by package merge, status summed, nodes with their state). It is a
// hive cell, run by `tendril relay`.
package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletls"
	"github.com/tendril-net/tendril/pkg/hubble/relay/pool"
)

// DefaultListenAddress is where hubble looks for a relay by default.
const DefaultListenAddress = "localhost:4245"

// Config is the relay's configuration (its flags).
type Config struct {
	// PeerService is the Peer service of a local agent: unix:///path or
	// host:port.
	PeerService string `mapstructure:"peer-service"`
	// PeerServiceTLSServerName is the name on the certificate of a TCP
	// Peer service (with client TLS on).
	PeerServiceTLSServerName string `mapstructure:"peer-service-tls-server-name"`
	// ListenAddress are the relay's listeners: host:port or unix:///path.
	ListenAddress []string `mapstructure:"listen-address"`
	// Client TLS towards the nodes (Cilium relay's flags).
	DisableClientTLS       bool     `mapstructure:"disable-client-tls"`
	TLSHubbleServerCAFiles []string `mapstructure:"tls-hubble-server-ca-files"`
	TLSClientCertFile      string   `mapstructure:"tls-client-cert-file"`
	TLSClientKeyFile       string   `mapstructure:"tls-client-key-file"`
	// Server TLS of the relay's TCP listeners (with client CAs: mTLS);
	// none given: plain text. Unix sockets are always plain text.
	TLSRelayServerCertFile string   `mapstructure:"tls-relay-server-cert-file"`
	TLSRelayServerKeyFile  string   `mapstructure:"tls-relay-server-key-file"`
	TLSRelayClientCAFiles  []string `mapstructure:"tls-relay-client-ca-files"`
	// TLSRelayDisableClientAuth serves TLS clients of the relay without a
	// certificate: an explicit choice, as for the agents.
	TLSRelayDisableClientAuth bool `mapstructure:"tls-relay-disable-client-auth"`
	// RetryTimeout is the longest wait between attempts to reach a node
	// or the Peer service.
	RetryTimeout time.Duration `mapstructure:"retry-timeout"`
}

// DefaultConfig is the relay's defaults.
var DefaultConfig = Config{
	PeerService:   "unix://" + hubble.DefaultSocketPath,
	ListenAddress: []string{DefaultListenAddress},
	RetryTimeout:  10 * time.Second,
}

// Flags registers the relay's flags.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("peer-service", def.PeerService, "Peer service of a local agent, to find the nodes: unix:///path or host:port")
	fs.String("peer-service-tls-server-name", def.PeerServiceTLSServerName, "Server name on the certificate of a TCP --peer-service (with client TLS)")
	fs.StringSlice("listen-address", def.ListenAddress, "Where the relay serves the Observer API: host:port or unix:///path (repeatable)")
	fs.Bool("disable-client-tls", def.DisableClientTLS, "Connect to the nodes in plain text")
	fs.StringSlice("tls-hubble-server-ca-files", def.TLSHubbleServerCAFiles, "PEM CAs of the nodes' Hubble server certificates")
	fs.String("tls-client-cert-file", def.TLSClientCertFile, "PEM certificate the relay presents to the nodes (for nodes with --hubble-tls-client-ca-files)")
	fs.String("tls-client-key-file", def.TLSClientKeyFile, "PEM key of --tls-client-cert-file")
	fs.String("tls-relay-server-cert-file", def.TLSRelayServerCertFile, "PEM certificate of the relay's TCP listeners (TLS); empty: plain text")
	fs.String("tls-relay-server-key-file", def.TLSRelayServerKeyFile, "PEM key of --tls-relay-server-cert-file")
	fs.StringSlice("tls-relay-client-ca-files", def.TLSRelayClientCAFiles, "PEM CAs of the relay's clients' certificates, which clients must present (mTLS); required with --tls-relay-server-cert-file unless --tls-relay-disable-client-auth")
	fs.Bool("tls-relay-disable-client-auth", def.TLSRelayDisableClientAuth, "Serve TLS clients of the relay without a client certificate (anyone who reaches the port reads every flow of the cluster)")
	fs.Duration("retry-timeout", def.RetryTimeout, "Longest wait between attempts to reach a node or the Peer service")
}

// Validate checks the configuration before anything starts.
func (c Config) Validate() error {
	if c.PeerService == "" {
		return errors.New("--peer-service is required")
	}
	if len(c.ListenAddress) == 0 {
		return errors.New("--listen-address is required")
	}
	for _, a := range c.ListenAddress {
		if strings.HasPrefix(a, "unix://") {
			if !filepath.IsAbs(strings.TrimPrefix(a, "unix://")) {
				return fmt.Errorf("--listen-address %q: the socket path must be absolute", a)
			}
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("--listen-address %q: %w", a, err)
		}
	}
	if c.DisableClientTLS && (len(c.TLSHubbleServerCAFiles) > 0 || c.TLSClientCertFile != "") {
		return errors.New("--disable-client-tls with TLS files: choose one")
	}
	if !c.DisableClientTLS && (c.TLSClientCertFile == "" || c.TLSClientKeyFile == "") {
		// The nodes require a client certificate (unless they were told
		// to serve any client): without one every node would stay
		// unavailable, with a handshake error in the log only.
		return errors.New("--tls-client-cert-file and --tls-client-key-file are required: the nodes' Hubble API requires a client certificate (or --disable-client-tls for nodes serving plain text)")
	}
	if (c.TLSRelayServerCertFile == "") != (c.TLSRelayServerKeyFile == "") {
		return errors.New("--tls-relay-server-cert-file and --tls-relay-server-key-file go together")
	}
	if len(c.TLSRelayClientCAFiles) > 0 && c.TLSRelayServerCertFile == "" {
		return errors.New("--tls-relay-client-ca-files needs --tls-relay-server-cert-file")
	}
	if c.TLSRelayServerCertFile != "" && len(c.TLSRelayClientCAFiles) == 0 && !c.TLSRelayDisableClientAuth {
		return errors.New("--tls-relay-server-cert-file needs --tls-relay-client-ca-files, so that clients must present a certificate (or --tls-relay-disable-client-auth to serve any client)")
	}
	if c.TLSRelayDisableClientAuth && len(c.TLSRelayClientCAFiles) > 0 {
		return errors.New("--tls-relay-disable-client-auth with --tls-relay-client-ca-files: choose one")
	}
	if c.RetryTimeout <= 0 {
		return fmt.Errorf("--retry-timeout %s: must be positive", c.RetryTimeout)
	}
	return nil
}

// Cell is the relay: its pool of nodes (a job following the Peer service)
// and its gRPC server.
var Cell = cell.Module("hubble-relay", "Hubble relay serving one Observer API over every node",
	cell.Config(DefaultConfig),
	cell.Provide(newPool, newServer),
	cell.Invoke(func(*Server) {}),
)

type poolParams struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Registry
	Health    cell.Health
}

func newPool(p poolParams) (*pool.Pool, error) {
	if err := p.Config.Validate(); err != nil {
		return nil, err
	}
	cfg := pool.Config{PeerService: p.Config.PeerService, RetryMax: p.Config.RetryTimeout}
	if !p.Config.DisableClientTLS {
		tc, err := hubbletls.Client{CAFiles: p.Config.TLSHubbleServerCAFiles, CertFile: p.Config.TLSClientCertFile, KeyFile: p.Config.TLSClientKeyFile}.Config()
		if err != nil {
			return nil, fmt.Errorf("relay client TLS: %w", err)
		}
		cfg.NodeTLS = tc
		peer := tc.Clone()
		peer.ServerName = p.Config.PeerServiceTLSServerName
		cfg.PeerServiceTLS = peer
	}
	pl := pool.New(cfg, p.Log.With("component", "pool"))
	g := p.Jobs.NewGroup(p.Health, job.WithLogger(p.Log))
	g.Add(job.OneShot("peers", func(ctx context.Context, _ cell.Health) error { return pl.Run(ctx) }))
	return pl, nil
}

// Server serves the relay's Observer API.
type Server struct {
	cfg  Config
	log  *slog.Logger
	grpc *grpc.Server // unix sockets, and TCP in plain text
	// tlsGRPC serves the TCP listeners when server TLS is configured.
	tlsGRPC *grpc.Server

	mu        sync.Mutex
	listeners []net.Listener
	wg        sync.WaitGroup
}

type serverParams struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Pool      *pool.Pool
	Version   Version `optional:"true"`
}

// Version is the version the relay reports (provided by the binary).
type Version string

func newServer(p serverParams) (*Server, error) {
	var serverTLS *tls.Config
	if p.Config.TLSRelayServerCertFile != "" {
		var err error
		serverTLS, err = hubbletls.Server{CertFile: p.Config.TLSRelayServerCertFile, KeyFile: p.Config.TLSRelayServerKeyFile,
			ClientCAFiles: p.Config.TLSRelayClientCAFiles, AllowAnyClient: p.Config.TLSRelayDisableClientAuth}.Config()
		if err != nil {
			return nil, fmt.Errorf("relay server TLS: %w", err)
		}
	}
	s := NewServer(p.Config, p.Pool, string(p.Version), serverTLS, p.Log)
	p.Lifecycle.Append(cell.Hook{OnStart: func(cell.HookContext) error { return s.Start() }, OnStop: func(cell.HookContext) error {
		s.Stop()
		return nil
	}})
	return s, nil
}

// NewServer returns a server of the nodes' API, its TCP listeners with
// serverTLS unless nil; nothing listens until Start.
func NewServer(cfg Config, nodes Nodes, version string, serverTLS *tls.Config, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	svc := &observerService{nodes: nodes, version: version, log: log}
	newGRPC := func(opts ...grpc.ServerOption) *grpc.Server {
		g := grpc.NewServer(opts...)
		observerpb.RegisterObserverServer(g, svc)
		hs := health.NewServer()
		hs.SetServingStatus(hubble.ObserverServiceName, healthpb.HealthCheckResponse_SERVING)
		healthpb.RegisterHealthServer(g, hs)
		return g
	}
	s := &Server{cfg: cfg, log: log, grpc: newGRPC()}
	if serverTLS != nil {
		s.tlsGRPC = newGRPC(grpc.Creds(credentials.NewTLS(serverTLS)))
	}
	return s
}

// Start listens on every address and serves in the background.
func (s *Server) Start() error {
	for _, a := range s.cfg.ListenAddress {
		network, addr := "tcp", a
		if p, ok := strings.CutPrefix(a, "unix://"); ok {
			network, addr = "unix", p
			if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
				s.Stop()
				return fmt.Errorf("create socket directory: %w", err)
			}
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				s.Stop()
				return fmt.Errorf("remove stale socket %s: %w", p, err)
			}
		}
		l, err := net.Listen(network, addr)
		if err != nil {
			s.Stop()
			return fmt.Errorf("relay: listen on %s: %w", a, err)
		}
		s.mu.Lock()
		s.listeners = append(s.listeners, l)
		s.mu.Unlock()
		g := s.grpc
		if network == "tcp" && s.tlsGRPC != nil {
			g = s.tlsGRPC
		}
		s.log.Info("Relay serving the Observer API", "address", a, "tls", g == s.tlsGRPC)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := g.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				s.log.Error("Relay server stopped", "address", a, "error", err)
			}
		}()
	}
	return nil
}

// Addrs are the listeners' addresses (a TCP port asked as 0 resolved).
func (s *Server) Addrs() []net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []net.Addr
	for _, l := range s.listeners {
		out = append(out, l.Addr())
	}
	return out
}

// Stop ends every stream and joins the serving goroutines.
func (s *Server) Stop() {
	s.grpc.Stop()
	if s.tlsGRPC != nil {
		s.tlsGRPC.Stop()
	}
	s.wg.Wait()
	for _, a := range s.cfg.ListenAddress {
		if p, ok := strings.CutPrefix(a, "unix://"); ok {
			_ = os.Remove(p)
		}
	}
}
