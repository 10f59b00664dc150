package relay

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/hubble/relay/merge"
	"github.com/tendril-net/tendril/pkg/hubble/relay/pool"
)

// Nodes is what the relay asks of its pool: the nodes and their
// connections, and a channel closed at the next change.
type Nodes interface {
	Nodes() ([]pool.Node, <-chan struct{})
}

// callTimeout bounds a unary call to one node: a node that hangs must not
// hang the relay's answer.
const callTimeout = 5 * time.Second

// resumeInterval is how often a follow query looks for nodes it does not
// stream from yet (besides every change of the pool).
const resumeInterval = time.Second

// observerService is the Observer API over every node of the pool.
type observerService struct {
	observerpb.UnimplementedObserverServer
	nodes   Nodes
	version string
	log     *slog.Logger
}

func connected(nodes []pool.Node) (up []pool.Node, down []string) {
	for _, n := range nodes {
		if n.State == pool.Connected {
			up = append(up, n)
		} else {
			down = append(down, n.Name)
		}
	}
	return up, down
}

// GetFlows asks every connected node with the same request. Without
// follow, the nodes' answers are merged in time order (and cut to the
// request's number); with follow, flows are sent as they come, and a node
// that connects (or comes back) later joins the stream from the time of
// its last flow sent, so what it saw meanwhile is not lost.
func (o *observerService) GetFlows(req *observerpb.GetFlowsRequest, stream grpc.ServerStreamingServer[observerpb.GetFlowsResponse]) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	if !req.GetFollow() {
		all, _ := o.nodes.Nodes()
		up, _ := connected(all)
		var sources []merge.Source
		var names []string
		for _, n := range up {
			s, err := observerpb.NewObserverClient(n.Conn).GetFlows(ctx, req)
			if err != nil {
				o.log.Warn("GetFlows from a node failed", "node", n.Name, "error", err)
				continue
			}
			sources = append(sources, s)
			names = append(names, n.Name)
		}
		return merge.Sorted(sources, merge.Options{Number: req.GetNumber(), First: req.GetFirst(),
			OnError: func(i int, err error) {
				o.log.Warn("GetFlows from a node ended with an error", "node", names[i], "error", err)
			}}, stream.Send)
	}
	return o.follow(ctx, req, stream)
}

// follower streams one node's flows into the shared channel.
type follower struct {
	running bool
	// done: the node's stream reached the query's until time.
	done bool
	// last is the time of the last response sent from the node.
	last *timestamppb.Timestamp
}

func (o *observerService) follow(ctx context.Context, req *observerpb.GetFlowsRequest, stream grpc.ServerStreamingServer[observerpb.GetFlowsResponse]) error {
	type item struct {
		node string
		resp *observerpb.GetFlowsResponse
		err  error // the node's stream ended
	}
	out := make(chan item)
	var wg sync.WaitGroup
	defer wg.Wait()
	// Cancelled before the wait: the node streams end and their
	// goroutines stop waiting to hand over a flow.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	followers := map[string]*follower{}
	begin := timestamppb.Now()
	start := func(n pool.Node, f *follower) {
		r := req
		if f.last != nil {
			// Resume after the last flow sent: what the node saw while the
			// relay could not reach it (and its ring still holds) comes now.
			r = cloneRequest(req)
			r.Number, r.First = 0, false
			r.Since = timestamppb.New(f.last.AsTime().Add(time.Nanosecond))
		} else if _, seen := followers[n.Name]; seen && req.GetSince() == nil && req.GetNumber() == 0 {
			r = cloneRequest(req)
			r.Since = begin
		}
		f.running = true
		s, err := observerpb.NewObserverClient(n.Conn).GetFlows(ctx, r)
		if err != nil {
			f.running = false
			o.log.Debug("Follow a node failed", "node", n.Name, "error", err)
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				resp, err := s.Recv()
				if err == nil && resp.GetFlow() == nil && resp.GetLostEvents() == nil {
					continue // nothing a client of the relay reads
				}
				select {
				case out <- item{node: n.Name, resp: resp, err: err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	tick := time.NewTicker(resumeInterval)
	defer tick.Stop()
	// A follow query with an until time ends then, whether or not every
	// node has seen a later flow (a node's stream ends only at one).
	var until <-chan time.Time
	if req.GetUntil() != nil {
		timer := time.NewTimer(time.Until(req.GetUntil().AsTime()))
		defer timer.Stop()
		until = timer.C
	}
	for {
		nodes, changed := o.nodes.Nodes()
		up, _ := connected(nodes)
		for _, n := range up {
			f, ok := followers[n.Name]
			if !ok {
				f = &follower{}
			}
			if !f.running {
				start(n, f)
			}
			followers[n.Name] = f
		}
		select {
		case <-ctx.Done():
			return nil
		case <-until:
			return nil
		case <-changed:
		case <-tick.C:
		case it := <-out:
			f := followers[it.node]
			if it.err != nil {
				f.running = false
				if !errors.Is(it.err, io.EOF) && ctx.Err() == nil {
					o.log.Info("Following a node stopped; resumed when it is back", "node", it.node, "error", it.err)
				}
				if errors.Is(it.err, io.EOF) && req.GetUntil() != nil {
					// The node reached the query's end; do not restart it.
					f.running, f.done = true, true
					if allDone(followers) {
						return nil
					}
				}
				continue
			}
			if t := it.resp.GetTime(); t != nil {
				f.last = t
			}
			if err := stream.Send(it.resp); err != nil {
				return err
			}
		}
	}
}

func allDone(followers map[string]*follower) bool {
	for _, f := range followers {
		if !f.done {
			return false
		}
	}
	return len(followers) > 0
}

func cloneRequest(r *observerpb.GetFlowsRequest) *observerpb.GetFlowsRequest {
	return &observerpb.GetFlowsRequest{
		Number: r.Number, First: r.First, Follow: r.Follow, Blacklist: r.Blacklist, Whitelist: r.Whitelist,
		Since: r.Since, Until: r.Until, FieldMask: r.FieldMask, Experimental: r.Experimental, Extensions: r.Extensions,
	}
}

// each calls fn on every connected node at once and waits for all.
func each(ctx context.Context, nodes []pool.Node, fn func(ctx context.Context, i int, n pool.Node)) {
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			fn(cctx, i, n)
		}()
	}
	wg.Wait()
}

// ServerStatus sums the connected nodes' rings and names the nodes the
// relay cannot reach (a node that fails to answer counts as unavailable).
func (o *observerService) ServerStatus(ctx context.Context, _ *observerpb.ServerStatusRequest) (*observerpb.ServerStatusResponse, error) {
	all, _ := o.nodes.Nodes()
	up, down := connected(all)
	answers := make([]*observerpb.ServerStatusResponse, len(up))
	each(ctx, up, func(ctx context.Context, i int, n pool.Node) {
		r, err := observerpb.NewObserverClient(n.Conn).ServerStatus(ctx, &observerpb.ServerStatusRequest{})
		if err != nil {
			o.log.Warn("ServerStatus of a node failed", "node", n.Name, "error", err)
			return
		}
		answers[i] = r
	})
	out := &observerpb.ServerStatusResponse{Version: o.version}
	var ok uint32
	for i, r := range answers {
		if r == nil {
			down = append(down, up[i].Name)
			continue
		}
		ok++
		out.NumFlows += r.GetNumFlows()
		out.MaxFlows += r.GetMaxFlows()
		out.SeenFlows += r.GetSeenFlows()
		out.UptimeNs = max(out.UptimeNs, r.GetUptimeNs())
		out.FlowsRate += r.GetFlowsRate()
	}
	sort.Strings(down)
	out.NumConnectedNodes = wrapperspb.UInt32(ok)
	out.NumUnavailableNodes = wrapperspb.UInt32(uint32(len(down)))
	out.UnavailableNodes = down
	return out, nil
}

// GetNodes lists every node of the pool with its state; a connected node
// adds what it reports of itself (version, uptime, ring).
func (o *observerService) GetNodes(ctx context.Context, _ *observerpb.GetNodesRequest) (*observerpb.GetNodesResponse, error) {
	all, _ := o.nodes.Nodes()
	out := make([]*observerpb.Node, len(all))
	each(ctx, all, func(ctx context.Context, i int, n pool.Node) {
		node := &observerpb.Node{Name: n.Name, Address: n.Address,
			Tls: &observerpb.TLS{Enabled: n.TLSServerName != "", ServerName: n.TLSServerName}}
		out[i] = node
		if n.State != pool.Connected {
			hubble.SetNodeState(node, hubble.NodeUnavailable)
			return
		}
		r, err := observerpb.NewObserverClient(n.Conn).ServerStatus(ctx, &observerpb.ServerStatusRequest{})
		if err != nil {
			hubble.SetNodeState(node, hubble.NodeUnavailable)
			o.log.Warn("ServerStatus of a node failed", "node", n.Name, "error", err)
			return
		}
		hubble.SetNodeState(node, hubble.NodeConnected)
		node.Version, node.UptimeNs = r.GetVersion(), r.GetUptimeNs()
		node.NumFlows, node.MaxFlows, node.SeenFlows = r.GetNumFlows(), r.GetMaxFlows(), r.GetSeenFlows()
	})
	return &observerpb.GetNodesResponse{Nodes: out}, nil
}

// GetNamespaces merges the connected nodes' namespaces.
func (o *observerService) GetNamespaces(ctx context.Context, _ *observerpb.GetNamespacesRequest) (*observerpb.GetNamespacesResponse, error) {
	all, _ := o.nodes.Nodes()
	up, _ := connected(all)
	answers := make([][]*observerpb.Namespace, len(up))
	each(ctx, up, func(ctx context.Context, i int, n pool.Node) {
		r, err := observerpb.NewObserverClient(n.Conn).GetNamespaces(ctx, &observerpb.GetNamespacesRequest{})
		if err != nil {
			o.log.Warn("GetNamespaces of a node failed", "node", n.Name, "error", err)
			return
		}
		answers[i] = r.GetNamespaces()
	})
	type key struct{ cluster, ns string }
	seen := map[key]bool{}
	var out []*observerpb.Namespace
	for _, nss := range answers {
		for _, ns := range nss {
			k := key{ns.GetCluster(), ns.GetNamespace()}
			if !seen[k] {
				seen[k] = true
				out = append(out, ns)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].GetCluster() != out[j].GetCluster() {
			return out[i].GetCluster() < out[j].GetCluster()
		}
		return out[i].GetNamespace() < out[j].GetNamespace()
	})
	return &observerpb.GetNamespacesResponse{Namespaces: out}, nil
}
