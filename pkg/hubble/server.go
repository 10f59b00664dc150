// Package hubble serves an observer's flows over the Hubble gRPC API
// (github.com/cilium/cilium/api/v1/observer: GetFlows, ServerStatus,
// GetNodes, GetNamespaces; api/v1/peer: Notify) and the standard gRPC
// health service, on a unix socket and optionally on TCP, so the stock
// hubble CLI and relay can talk to a Tendril node.
package hubble

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	peerpb "github.com/cilium/cilium/api/v1/peer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tendril-net/tendril/pkg/observer"
)

// ObserverServiceName is the name the hubble CLI health-checks.
const ObserverServiceName = "hubble.server.Observer"

// DefaultSocketPath is where the agent serves the API.
const DefaultSocketPath = "/var/run/tendril/hubble.sock"

// Config configures a Server.
type Config struct {
	// SocketPath is the unix socket (mode 0660); empty: none.
	SocketPath string
	// TCPAddress is an optional TCP listen address (host:port) for the
	// relay; empty: none.
	TCPAddress string
	// TLS secures the TCP listener (with ClientCAs: mTLS); nil serves it
	// in plain text. The unix socket is always plain text (file
	// permissions guard it).
	TLS *tls.Config
	// TLSServerName is the name on this node's certificate, announced by
	// the Peer service when Peers is nil.
	TLSServerName string
	// Peers are the cluster's nodes the Peer service announces; nil: only
	// this node.
	Peers *PeerSet
	// Version is reported by ServerStatus and GetNodes.
	Version string
	// PeerAddress is how other processes reach this node's TCP server,
	// as the Peer service announces it; TCPAddress when empty.
	PeerAddress string
	// MaxConcurrentStreams bounds the streams (RPCs) of one connection,
	// announced in its HTTP/2 settings and enforced by refusing streams
	// past it; 0: gRPC's default (no bound).
	MaxConcurrentStreams uint32
	// MaxConnections bounds the TCP listener's open connections: one past
	// it is closed as soon as it is accepted; 0: no bound.
	MaxConnections int
}

// Server is the gRPC server of one node's observer.
type Server struct {
	cfg  Config
	obs  *observer.Observer
	log  *slog.Logger
	grpc *grpc.Server // the unix socket, and TCP in plain text
	// tlsGRPC serves the TCP listener when TLS is configured.
	tlsGRPC *grpc.Server

	mu        sync.Mutex
	listeners []net.Listener
	wg        sync.WaitGroup
}

// New returns a server of obs; nothing listens until Start.
func New(cfg Config, obs *observer.Observer, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, obs: obs, log: log}
	var opts []grpc.ServerOption
	if cfg.MaxConcurrentStreams > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams))
	}
	s.grpc = s.newGRPC(opts...)
	if cfg.TLS != nil {
		s.tlsGRPC = s.newGRPC(append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))...)
	}
	return s
}

// newGRPC is a gRPC server with the Observer, Peer and health services.
func (s *Server) newGRPC(opts ...grpc.ServerOption) *grpc.Server {
	g := grpc.NewServer(opts...)
	observerpb.RegisterObserverServer(g, &observerService{s: s})
	peerpb.RegisterPeerServer(g, &peerService{s: s})
	hs := health.NewServer()
	hs.SetServingStatus(ObserverServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	return g
}

// Start listens on the configured socket and address and serves in the
// background until Stop.
func (s *Server) Start() error {
	if s.cfg.SocketPath == "" && s.cfg.TCPAddress == "" {
		return errors.New("hubble server: neither a socket path nor a TCP address")
	}
	if s.cfg.SocketPath != "" {
		if err := os.MkdirAll(filepath.Dir(s.cfg.SocketPath), 0o750); err != nil {
			return fmt.Errorf("create socket directory: %w", err)
		}
		// A socket left by an earlier run would make Listen fail.
		if err := os.Remove(s.cfg.SocketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove stale socket %s: %w", s.cfg.SocketPath, err)
		}
		l, err := net.Listen("unix", s.cfg.SocketPath)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", s.cfg.SocketPath, err)
		}
		if err := os.Chmod(s.cfg.SocketPath, 0o660); err != nil {
			l.Close()
			return fmt.Errorf("chmod %s: %w", s.cfg.SocketPath, err)
		}
		s.serve(s.grpc, l)
	}
	if s.cfg.TCPAddress != "" {
		l, err := net.Listen("tcp", s.cfg.TCPAddress)
		if err != nil {
			s.Stop()
			return fmt.Errorf("listen on %s: %w", s.cfg.TCPAddress, err)
		}
		if s.cfg.MaxConnections > 0 {
			l = newLimitListener(l, s.cfg.MaxConnections, s.log)
		}
		g := s.grpc
		if s.tlsGRPC != nil {
			g = s.tlsGRPC
		}
		s.serve(g, l)
	}
	return nil
}

func (s *Server) serve(g *grpc.Server, l net.Listener) {
	s.mu.Lock()
	s.listeners = append(s.listeners, l)
	s.mu.Unlock()
	s.log.Info("Serving the Hubble API", "address", l.Addr().String(), "tls", g == s.tlsGRPC)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := g.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("Hubble API server stopped", "address", l.Addr().String(), "error", err)
		}
	}()
}

// TCPAddr is the TCP listener's address (its port when TCPAddress asked
// for port 0), or nil.
func (s *Server) TCPAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.listeners {
		if l.Addr().Network() == "tcp" {
			return l.Addr()
		}
	}
	return nil
}

// Stop ends every stream and joins the serving goroutines.
func (s *Server) Stop() {
	s.grpc.Stop()
	if s.tlsGRPC != nil {
		s.tlsGRPC.Stop()
	}
	s.wg.Wait()
	if s.cfg.SocketPath != "" {
		_ = os.Remove(s.cfg.SocketPath)
	}
}

type observerService struct {
	observerpb.UnimplementedObserverServer
	s *Server
}

// GetFlows streams the ring's flows as the request asks.
func (o *observerService) GetFlows(req *observerpb.GetFlowsRequest, stream grpc.ServerStreamingServer[observerpb.GetFlowsResponse]) error {
	filters, err := observer.CompileFilters(req.GetWhitelist(), req.GetBlacklist())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	q := observer.Query{Number: req.GetNumber(), First: req.GetFirst(), Follow: req.GetFollow(), Filters: filters}
	if req.GetSince() != nil {
		q.Since = req.GetSince().AsTime()
	}
	if req.GetUntil() != nil {
		q.Until = req.GetUntil().AsTime()
	}
	node := o.s.obs.NodeName()
	send := func(f *flowpb.Flow) error {
		return stream.Send(&observerpb.GetFlowsResponse{NodeName: node, Time: f.GetTime(), ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: f}})
	}
	lost := func(n uint64) error {
		return stream.Send(&observerpb.GetFlowsResponse{NodeName: node, Time: timestamppb.Now(),
			ResponseTypes: &observerpb.GetFlowsResponse_LostEvents{LostEvents: &flowpb.LostEvent{
				Source: flowpb.LostEventSource_HUBBLE_RING_BUFFER, NumEventsLost: n,
			}}})
	}
	err = o.s.obs.Flows(stream.Context(), q, send, lost)
	if errors.Is(err, observer.ErrUntilPassed) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// ServerStatus reports the ring.
func (o *observerService) ServerStatus(context.Context, *observerpb.ServerStatusRequest) (*observerpb.ServerStatusResponse, error) {
	r := o.s.obs.Ring()
	return &observerpb.ServerStatusResponse{
		NumFlows: uint64(r.Len()), MaxFlows: uint64(r.Cap()), SeenFlows: r.Seen(),
		UptimeNs:            uint64(o.s.obs.Uptime().Nanoseconds()),
		NumConnectedNodes:   wrapperspb.UInt32(1),
		NumUnavailableNodes: wrapperspb.UInt32(0),
		Version:             o.s.cfg.Version,
	}, nil
}

// GetNodes lists this node (a relay lists every node).
func (o *observerService) GetNodes(context.Context, *observerpb.GetNodesRequest) (*observerpb.GetNodesResponse, error) {
	r := o.s.obs.Ring()
	n := &observerpb.Node{
		Name: o.s.obs.NodeName(), Version: o.s.cfg.Version, Address: o.s.peerAddress(),
		UptimeNs: uint64(o.s.obs.Uptime().Nanoseconds()),
		NumFlows: uint64(r.Len()), MaxFlows: uint64(r.Cap()), SeenFlows: r.Seen(),
	}
	SetNodeState(n, NodeConnected)
	return &observerpb.GetNodesResponse{Nodes: []*observerpb.Node{n}}, nil
}

// Node states (relay.NodeState, the enum of Node.state). They are set by
// number: the enum's Go package (api/v1/relay) is not among the wire
// packages this project imports.
const (
	NodeConnected   = 1
	NodeUnavailable = 2
)

// SetNodeState sets a Node's state enum by its number.
func SetNodeState(n *observerpb.Node, state protoreflect.EnumNumber) {
	m := n.ProtoReflect()
	m.Set(m.Descriptor().Fields().ByName("state"), protoreflect.ValueOfEnum(state))
}

// GetNamespaces lists the namespaces of the flows the ring holds.
func (o *observerService) GetNamespaces(context.Context, *observerpb.GetNamespacesRequest) (*observerpb.GetNamespacesResponse, error) {
	r := o.s.obs.Ring()
	oldest, next, _ := r.Bounds()
	seen := map[string]bool{}
	for seq := oldest; seq < next; seq++ {
		f, ok := r.At(seq)
		if !ok {
			continue
		}
		for _, ns := range []string{f.GetSource().GetNamespace(), f.GetDestination().GetNamespace()} {
			if ns != "" {
				seen[ns] = true
			}
		}
	}
	var out []*observerpb.Namespace
	for ns := range seen {
		out = append(out, &observerpb.Namespace{Namespace: ns})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace < out[j].Namespace })
	return &observerpb.GetNamespacesResponse{Namespaces: out}, nil
}

func (s *Server) peerAddress() string {
	if s.cfg.PeerAddress != "" {
		return s.cfg.PeerAddress
	}
	if a := s.TCPAddr(); a != nil {
		return a.String()
	}
	return ""
}
