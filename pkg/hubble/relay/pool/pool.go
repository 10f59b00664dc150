// Package pool keeps the relay's connections to the cluster's nodes: it
// learns the nodes from a Peer service (api/v1/peer Notify), holds one
// gRPC connection per node (TLS with the node's announced server name, or
// plain text) and tracks whether each is connected. A node that goes away
// stays in the pool as unavailable and is redialled with backoff until it
// returns or the Peer service deletes it.
package pool

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	peerpb "github.com/cilium/cilium/api/v1/peer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Config configures a Pool.
type Config struct {
	// PeerService is the Peer service to follow: unix:///path or
	// host:port.
	PeerService string
	// PeerServiceTLS secures a TCP Peer service (with its server name
	// set); nil: plain text. A unix socket is always plain text.
	PeerServiceTLS *tls.Config
	// NodeTLS secures the connections to the nodes (the server name is
	// each node's announced one); nil: plain text.
	NodeTLS *tls.Config
	// RetryMin and RetryMax bound the backoff between attempts to reach
	// the Peer service or a node.
	RetryMin, RetryMax time.Duration
}

// State is a node's connection state.
type State int

const (
	// Connecting: not connected yet since the node was announced.
	Connecting State = iota
	Connected
	// Unavailable: the connection failed or was lost; retried.
	Unavailable
)

func (s State) String() string {
	switch s {
	case Connected:
		return "connected"
	case Unavailable:
		return "unavailable"
	}
	return "connecting"
}

// Node is a node of the pool as callers see it.
type Node struct {
	Name, Address, TLSServerName string
	State                        State
	// Conn is the node's connection (usable when State is Connected).
	Conn *grpc.ClientConn
	// LastError says why the node is unavailable, when known.
	LastError error
}

type member struct {
	Node
	cancel context.CancelFunc
	done   chan struct{}
}

// Pool is the set of nodes and their connections.
type Pool struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	nodes   map[string]*member
	changed chan struct{}
	// wg joins the nodes' connection watchers.
	wg sync.WaitGroup
}

// New returns a pool; nothing is dialled until Run.
func New(cfg Config, log *slog.Logger) *Pool {
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 200 * time.Millisecond
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = 10 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Pool{cfg: cfg, log: log, nodes: map[string]*member{}, changed: make(chan struct{})}
}

// Nodes lists the nodes by name and returns a channel closed at the next
// change of the list or of a node's state.
func (p *Pool) Nodes() ([]Node, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Node, 0, len(p.nodes))
	for _, m := range p.nodes {
		out = append(out, m.Node)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, p.changed
}

// wakeLocked tells the waiters of Nodes that something changed.
func (p *Pool) wakeLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Run follows the Peer service until ctx ends, reconnecting with backoff
// when its stream breaks, and closes every node's connection on return.
func (p *Pool) Run(ctx context.Context) error {
	defer p.closeAll()
	delay := p.cfg.RetryMin
	for {
		started := time.Now()
		err := p.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(started) > p.cfg.RetryMax {
			delay = p.cfg.RetryMin // it worked for a while: start over
		}
		p.log.Warn("Peer service stream ended; retrying", "peer-service", p.cfg.PeerService, "error", err, "retry-in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(delay*2, p.cfg.RetryMax)
	}
}

// follow reads one Notify stream and applies its changes.
func (p *Pool) follow(ctx context.Context) error {
	creds := insecure.NewCredentials()
	target := p.cfg.PeerService
	if !strings.HasPrefix(target, "unix://") && p.cfg.PeerServiceTLS != nil {
		creds = credentials.NewTLS(p.cfg.PeerServiceTLS)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("peer service %s: %w", target, err)
	}
	defer conn.Close()
	stream, err := peerpb.NewPeerClient(conn).Notify(ctx, &peerpb.NotifyRequest{})
	if err != nil {
		return fmt.Errorf("peer service %s: notify: %w", target, err)
	}
	for {
		cn, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("peer service %s: %w", target, err)
		}
		switch cn.GetType() {
		case peerpb.ChangeNotificationType_PEER_ADDED, peerpb.ChangeNotificationType_PEER_UPDATED:
			p.upsert(ctx, Node{Name: cn.GetName(), Address: cn.GetAddress(), TLSServerName: cn.GetTls().GetServerName()})
		case peerpb.ChangeNotificationType_PEER_DELETED:
			p.remove(cn.GetName())
		}
	}
}

// upsert adds a node or, when its address or server name changed,
// replaces its connection.
func (p *Pool) upsert(ctx context.Context, n Node) {
	p.mu.Lock()
	old, ok := p.nodes[n.Name]
	p.mu.Unlock()
	if ok && old.Address == n.Address && old.TLSServerName == n.TLSServerName {
		return
	}
	if ok {
		p.remove(n.Name)
	}
	p.log.Info("Node added", "node", n.Name, "address", n.Address, "tls-server-name", n.TLSServerName)
	m := &member{Node: Node{Name: n.Name, Address: n.Address, TLSServerName: n.TLSServerName, State: Connecting}, done: make(chan struct{})}
	if n.Address == "" {
		m.State = Unavailable
		m.LastError = errors.New("the node announces no address (no --hubble-listen-address)")
		close(m.done)
		p.mu.Lock()
		p.nodes[n.Name] = m
		p.wakeLocked()
		p.mu.Unlock()
		return
	}
	conn, err := p.dial(n)
	if err != nil {
		m.State, m.LastError = Unavailable, err
		close(m.done)
	} else {
		m.Conn = conn
		var cctx context.Context
		cctx, m.cancel = context.WithCancel(ctx)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer close(m.done)
			p.watch(cctx, m)
		}()
	}
	p.mu.Lock()
	p.nodes[n.Name] = m
	p.wakeLocked()
	p.mu.Unlock()
}

func (p *Pool) dial(n Node) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if p.cfg.NodeTLS != nil {
		c := p.cfg.NodeTLS.Clone()
		c.ServerName = n.TLSServerName
		creds = credentials.NewTLS(c)
	}
	bo := backoff.DefaultConfig
	bo.BaseDelay, bo.MaxDelay = p.cfg.RetryMin, p.cfg.RetryMax
	conn, err := grpc.NewClient(n.Address, grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 5 * time.Second}))
	if err != nil {
		return nil, fmt.Errorf("node %s at %s: %w", n.Name, n.Address, err)
	}
	return conn, nil
}

// watch follows a node's connection state: gRPC redials a failed
// connection with the configured backoff; an idle one (its transport
// closed) is told to connect again at once.
func (p *Pool) watch(ctx context.Context, m *member) {
	m.Conn.Connect()
	for {
		s := m.Conn.GetState()
		state := Connecting
		switch s {
		case connectivity.Ready:
			state = Connected
		case connectivity.TransientFailure, connectivity.Shutdown:
			state = Unavailable
		case connectivity.Idle:
			if m.State == Connected {
				state = Unavailable // it was lost; reconnecting
			} else {
				state = m.State
			}
			m.Conn.Connect()
		case connectivity.Connecting:
			state = m.State
			if state == Connected {
				state = Unavailable
			}
		}
		p.setState(m, state, s)
		if !m.Conn.WaitForStateChange(ctx, s) {
			return
		}
	}
}

func (p *Pool) setState(m *member, state State, s connectivity.State) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m.State == state {
		return
	}
	m.State = state
	if state == Unavailable {
		m.LastError = fmt.Errorf("connection %s", strings.ToLower(s.String()))
	} else {
		m.LastError = nil
	}
	p.log.Info("Node connection", "node", m.Name, "state", state.String())
	p.wakeLocked()
}

// remove closes a node's connection and forgets it.
func (p *Pool) remove(name string) {
	p.mu.Lock()
	m, ok := p.nodes[name]
	delete(p.nodes, name)
	if ok {
		p.wakeLocked()
	}
	p.mu.Unlock()
	if !ok {
		return
	}
	p.log.Info("Node deleted", "node", name)
	stopMember(m)
}

func stopMember(m *member) {
	if m.cancel != nil {
		m.cancel()
	}
	<-m.done
	if m.Conn != nil {
		_ = m.Conn.Close()
	}
}

func (p *Pool) closeAll() {
	p.mu.Lock()
	all := p.nodes
	p.nodes = map[string]*member{}
	p.wakeLocked()
	p.mu.Unlock()
	for _, m := range all {
		stopMember(m)
	}
	p.wg.Wait()
}
