package relay

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	"github.com/tendril-net/tendril/pkg/hubble/relay/pool"
	"github.com/tendril-net/tendril/pkg/observer"
)

// t0 is the tests' clock: flows are placed at t0 + n ms.
var t0 = time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)

// testNode is a real Hubble server (package hubble) of an observer whose
// ring the test fills with flows it makes (a fake flow source).
type testNode struct {
	name string
	obs  *observer.Observer
	srv  *hubble.Server
	addr string // TCP host:port, kept across restarts
	sock string
	cfg  hubble.Config
}

func newTestNode(t *testing.T, name string, peers *hubble.PeerSet, mutate func(*hubble.Config)) *testNode {
	t.Helper()
	n := &testNode{name: name, obs: observer.New(observer.Config{}, hubbletest.Node{Name: name}, nil),
		sock: filepath.Join(t.TempDir(), "hubble.sock")}
	n.cfg = hubble.Config{SocketPath: n.sock, TCPAddress: "127.0.0.1:0", Version: "test-" + name, Peers: peers}
	if mutate != nil {
		mutate(&n.cfg)
	}
	n.start(t)
	n.addr = n.srv.TCPAddr().String()
	n.cfg.TCPAddress = n.addr // a restart comes back on the same port
	t.Cleanup(func() { n.srv.Stop() })
	return n
}

func (n *testNode) start(t *testing.T) {
	t.Helper()
	n.srv = hubble.New(n.cfg, n.obs, nil)
	var err error
	for range 50 { // the port may linger a moment after a stop
		if err = n.srv.Start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("start %s: %v", n.name, err)
}

// flow writes a flow of this node at t0+ms into its ring.
func (n *testNode) flow(ms int, ns string, verdict flowpb.Verdict) *flowpb.Flow {
	f := &flowpb.Flow{
		Time:        timestamppb.New(t0.Add(time.Duration(ms) * time.Millisecond)),
		NodeName:    n.name,
		Verdict:     verdict,
		Source:      &flowpb.Endpoint{Namespace: ns, PodName: "client-" + n.name},
		Destination: &flowpb.Endpoint{Namespace: ns, PodName: "server"},
		L4:          &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: uint32(40000 + ms), DestinationPort: 80}}},
		Type:        flowpb.FlowType_L3_L4,
	}
	n.obs.Ring().Write(f)
	return f
}

// startRelay runs a pool over the Peer service at peerService and a relay
// server on a unix socket; it returns a client of the relay and the pool.
func startRelay(t *testing.T, peerService string, cfg pool.Config) (observerpb.ObserverClient, *pool.Pool) {
	t.Helper()
	c, p, _ := startRelayAt(t, peerService, cfg)
	return c, p
}

// startRelayAt is startRelay that also returns the relay's socket.
func startRelayAt(t *testing.T, peerService string, cfg pool.Config) (observerpb.ObserverClient, *pool.Pool, string) {
	t.Helper()
	cfg.PeerService = peerService
	if cfg.RetryMax == 0 {
		cfg.RetryMin, cfg.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p := pool.New(cfg, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	sock := filepath.Join(t.TempDir(), "relay.sock")
	srv := NewServer(Config{ListenAddress: []string{"unix://" + sock}}, p, "relay-test", nil, log)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pool: %v", err)
		}
	})
	return observerpb.NewObserverClient(conn), p, sock
}

// waitNodes waits until the pool has want nodes connected.
func waitConnected(t *testing.T, p *pool.Pool, want ...string) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		nodes, changed := p.Nodes()
		var up []string
		for _, n := range nodes {
			if n.State == pool.Connected {
				up = append(up, n.Name)
			}
		}
		if slices.Equal(up, want) {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("connected nodes %v, want %v (pool: %+v)", up, want, nodes)
		}
	}
}

// twoNodes are node-a and node-b; node-a's Peer service announces both.
func twoNodes(t *testing.T, mutate func(name string, c *hubble.Config)) (a, b *testNode, peers *hubble.PeerSet) {
	t.Helper()
	peers = hubble.NewPeerSet()
	cfgFor := func(name string) func(*hubble.Config) {
		if mutate == nil {
			return nil
		}
		return func(c *hubble.Config) { mutate(name, c) }
	}
	a = newTestNode(t, "node-a", peers, cfgFor("node-a"))
	b = newTestNode(t, "node-b", nil, cfgFor("node-b"))
	for _, n := range []*testNode{a, b} {
		peers.Upsert(hubble.Peer{Name: n.name, Address: n.addr, TLSServerName: n.cfg.TLSServerName})
	}
	return a, b, peers
}

func collect(t *testing.T, c observerpb.ObserverClient, req *observerpb.GetFlowsRequest) []*observerpb.GetFlowsResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.GetFlows(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var out []*observerpb.GetFlowsResponse
	for {
		r, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
}

// times is the flows' offsets from t0 in ms, and their nodes.
func times(rs []*observerpb.GetFlowsResponse) (ms []int, nodes []string) {
	for _, r := range rs {
		ms = append(ms, int(r.GetFlow().GetTime().AsTime().Sub(t0)/time.Millisecond))
		nodes = append(nodes, r.GetNodeName())
	}
	return ms, nodes
}

// TestRelayMergesNodes: the relay finds both nodes through node-a's Peer
// service and answers GetFlows in time order across nodes (all, last N,
// first N, since/until, filters passed down), ServerStatus summed,
// GetNodes with both connected and GetNamespaces merged.
func TestRelayMergesNodes(t *testing.T) {
	a, b, _ := twoNodes(t, nil)
	// Interleaved times: a 1,4,5,8  b 2,3,6,7,9; b's 3 and 7 dropped.
	for _, ms := range []int{1, 4, 5, 8} {
		a.flow(ms, "shop", flowpb.Verdict_FORWARDED)
	}
	for _, ms := range []int{2, 3, 6, 7, 9} {
		v := flowpb.Verdict_FORWARDED
		if ms == 3 || ms == 7 {
			v = flowpb.Verdict_DROPPED
		}
		b.flow(ms, "data", v)
	}
	c, p := startRelay(t, "unix://"+a.sock, pool.Config{})
	waitConnected(t, p, "node-a", "node-b")

	for _, tt := range []struct {
		name  string
		req   *observerpb.GetFlowsRequest
		want  []int
		nodes []string
	}{
		{"all", &observerpb.GetFlowsRequest{}, []int{1, 2, 3, 4, 5, 6, 7, 8, 9}, nil},
		{"last 3", &observerpb.GetFlowsRequest{Number: 3}, []int{7, 8, 9}, []string{"node-b", "node-a", "node-b"}},
		{"first 2", &observerpb.GetFlowsRequest{Number: 2, First: true}, []int{1, 2}, []string{"node-a", "node-b"}},
		{"since and until", &observerpb.GetFlowsRequest{
			Since: timestamppb.New(t0.Add(4 * time.Millisecond)), Until: timestamppb.New(t0.Add(6 * time.Millisecond))}, []int{4, 5, 6}, nil},
		{"verdict filter passed down", &observerpb.GetFlowsRequest{
			Whitelist: []*flowpb.FlowFilter{{Verdict: []flowpb.Verdict{flowpb.Verdict_DROPPED}}}}, []int{3, 7}, nil},
		{"namespace deny filter", &observerpb.GetFlowsRequest{
			Blacklist: []*flowpb.FlowFilter{{SourcePod: []string{"data/"}}}}, []int{1, 4, 5, 8}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, nodes := times(collect(t, c, tt.req))
			if !slices.Equal(got, tt.want) {
				t.Fatalf("flows at %v ms, want %v", got, tt.want)
			}
			if tt.nodes != nil && !slices.Equal(nodes, tt.nodes) {
				t.Fatalf("flows of %v, want %v", nodes, tt.nodes)
			}
		})
	}

	ctx := context.Background()
	st, err := c.ServerStatus(ctx, &observerpb.ServerStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetNumFlows() != 9 || st.GetMaxFlows() != 2*uint64(observer.DefaultRingCapacity) || st.GetSeenFlows() != 9 ||
		st.GetNumConnectedNodes().GetValue() != 2 || st.GetNumUnavailableNodes().GetValue() != 0 || len(st.GetUnavailableNodes()) != 0 {
		t.Fatalf("status %v", st)
	}
	nodes, err := c.GetNodes(ctx, &observerpb.GetNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.GetNodes()) != 2 {
		t.Fatalf("nodes %v", nodes)
	}
	for i, n := range nodes.GetNodes() {
		want := []*testNode{a, b}[i]
		if n.GetName() != want.name || n.GetAddress() != want.addr || n.GetVersion() != "test-"+want.name ||
			int(n.GetState()) != hubble.NodeConnected || n.GetNumFlows() == 0 {
			t.Errorf("node %d: %v", i, n)
		}
	}
	nss, err := c.GetNamespaces(ctx, &observerpb.GetNamespacesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ns := range nss.GetNamespaces() {
		names = append(names, ns.GetNamespace())
	}
	if !slices.Equal(names, []string{"data", "shop"}) {
		t.Fatalf("namespaces %v", names)
	}
}

// followed reads a follow stream in the background.
type followed struct {
	mu    sync.Mutex
	flows []*observerpb.GetFlowsResponse
	more  chan struct{}
}

func follow(t *testing.T, c observerpb.ObserverClient, req *observerpb.GetFlowsRequest) *followed {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.GetFlows(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f := &followed{more: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.flows = append(f.flows, r)
			f.mu.Unlock()
			select {
			case f.more <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// waitFlow waits for a followed flow from node with source port port.
func (f *followed) waitFlow(t *testing.T, node string, ms int) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		f.mu.Lock()
		for _, r := range f.flows {
			if r.GetNodeName() == node && r.GetFlow().GetL4().GetTCP().GetSourcePort() == uint32(40000+ms) {
				f.mu.Unlock()
				return
			}
		}
		f.mu.Unlock()
		select {
		case <-f.more:
		case <-deadline:
			t.Fatalf("flow %d of %s not followed", ms, node)
		}
	}
}

// TestRelayNodeGoesAwayAndReturns: with node-b stopped, the relay keeps
// serving node-a (status and follow), names node-b unavailable and lists
// it as such; when node-b returns, the follow query resumes its flows,
// those it saw while away included.
func TestRelayNodeGoesAwayAndReturns(t *testing.T) {
	a, b, _ := twoNodes(t, nil)
	c, p := startRelay(t, "unix://"+a.sock, pool.Config{})
	waitConnected(t, p, "node-a", "node-b")

	fl := follow(t, c, &observerpb.GetFlowsRequest{Follow: true})
	// The follow query starts "now" on each node: wait until both follow.
	waitFollowers(t, a, b)
	a.flow(1, "shop", flowpb.Verdict_FORWARDED)
	b.flow(2, "data", flowpb.Verdict_FORWARDED)
	fl.waitFlow(t, "node-a", 1)
	fl.waitFlow(t, "node-b", 2)

	b.srv.Stop()
	waitConnected(t, p, "node-a")
	ctx := context.Background()
	st, err := c.ServerStatus(ctx, &observerpb.ServerStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetNumConnectedNodes().GetValue() != 1 || st.GetNumUnavailableNodes().GetValue() != 1 ||
		!slices.Equal(st.GetUnavailableNodes(), []string{"node-b"}) {
		t.Fatalf("status with node-b away: %v", st)
	}
	nodes, err := c.GetNodes(ctx, &observerpb.GetNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := nodes.GetNodes(); len(n) != 2 || int(n[0].GetState()) != hubble.NodeConnected || int(n[1].GetState()) != hubble.NodeUnavailable {
		t.Fatalf("nodes with node-b away: %v", n)
	}
	// node-a still serves, to the followed and to a new query.
	a.flow(3, "shop", flowpb.Verdict_FORWARDED)
	fl.waitFlow(t, "node-a", 3)
	if got, _ := times(collect(t, c, &observerpb.GetFlowsRequest{})); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("flows with node-b away: %v", got)
	}

	// node-b sees a flow while away, then returns on its address.
	b.flow(4, "data", flowpb.Verdict_FORWARDED)
	b.start(t)
	waitConnected(t, p, "node-a", "node-b")
	fl.waitFlow(t, "node-b", 4)
	b.flow(5, "data", flowpb.Verdict_DROPPED)
	fl.waitFlow(t, "node-b", 5)
	st, err = c.ServerStatus(ctx, &observerpb.ServerStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetNumConnectedNodes().GetValue() != 2 || st.GetNumUnavailableNodes().GetValue() != 0 {
		t.Fatalf("status with node-b back: %v", st)
	}
	// Each flow followed once: the resumed stream starts after the last.
	fl.mu.Lock()
	defer fl.mu.Unlock()
	got, from := times(fl.flows)
	if !slices.Equal(got, []int{1, 2, 3, 4, 5}) && !slices.Equal(got, []int{2, 1, 3, 4, 5}) {
		t.Fatalf("followed %v of %v", got, from)
	}
}

func waitFollowers(t *testing.T, nodes ...*testNode) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, n := range nodes {
		for n.obs.Followers() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s has no followed", n.name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestRelayPeerChanges: a node the Peer service deletes leaves the relay;
// one it adds later joins it.
func TestRelayPeerChanges(t *testing.T) {
	a, b, peers := twoNodes(t, nil)
	_, p := startRelay(t, "unix://"+a.sock, pool.Config{})
	waitConnected(t, p, "node-a", "node-b")
	peers.Delete("node-b")
	waitConnected(t, p, "node-a")
	if nodes, _ := p.Nodes(); len(nodes) != 1 {
		t.Fatalf("nodes after the delete: %+v", nodes)
	}
	peers.Upsert(hubble.Peer{Name: "node-b", Address: b.addr})
	waitConnected(t, p, "node-a", "node-b")
}

// TestRelayFollowUntil: a follow query with an until time gets the flows
// before it and then ends, though no node sees a later flow.
func TestRelayFollowUntil(t *testing.T) {
	a, b, _ := twoNodes(t, nil)
	c, p := startRelay(t, "unix://"+a.sock, pool.Config{})
	waitConnected(t, p, "node-a", "node-b")
	// Flows of the last second: the query's until time is in half a second.
	now := time.Now()
	a.flow(1, "shop", flowpb.Verdict_FORWARDED).Time = timestamppb.New(now.Add(-time.Second))
	b.flow(2, "data", flowpb.Verdict_FORWARDED).Time = timestamppb.New(now.Add(-time.Second / 2))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.GetFlows(ctx, &observerpb.GetFlowsRequest{Follow: true, Since: timestamppb.New(now.Add(-time.Minute)),
		Until: timestamppb.New(now.Add(500 * time.Millisecond))})
	if err != nil {
		t.Fatal(err)
	}
	var got []*observerpb.GetFlowsResponse
	for {
		r, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("follow until: %v (after %d flows)", err, len(got))
		}
		got = append(got, r)
	}
	if _, nodes := times(got); !slices.Equal(nodes, []string{"node-a", "node-b"}) && !slices.Equal(nodes, []string{"node-b", "node-a"}) {
		t.Fatalf("followed flows of %v until the end, want one of each node", nodes)
	}
}

// TestRelayPeerServiceRestart: when the Peer service's node restarts, the
// pool follows the service again and both nodes are served.
func TestRelayPeerServiceRestart(t *testing.T) {
	a, b, _ := twoNodes(t, nil)
	c, p := startRelay(t, "unix://"+a.sock, pool.Config{})
	waitConnected(t, p, "node-a", "node-b")
	a.srv.Stop()
	waitConnected(t, p, "node-b")
	a.start(t)
	waitConnected(t, p, "node-a", "node-b")
	a.flow(1, "shop", flowpb.Verdict_FORWARDED)
	b.flow(2, "data", flowpb.Verdict_FORWARDED)
	if got, _ := times(collect(t, c, &observerpb.GetFlowsRequest{})); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("flows after the restart: %v", got)
	}
}
