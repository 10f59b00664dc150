// Package bgpcp is the agent's cell for the BGP control plane (after
// Cilium's, v2): with --enable-bgp-control-plane, a BGP speaker (gobgp,
// in-process) that runs the TendrilBGPClusterConfig selecting this node,
// opens its peers' sessions and announces what its
// TendrilBGPAdvertisements ask for, as far as the node was given it:
// its own pod CIDRs, and LoadBalancer addresses that lie in a
// TendrilLoadBalancerIPPool serving their Service (pkg/bgp's guard). It
// writes the node's entry of the config's status, serves GET
// /v1/bgp/peers and /v1/bgp/routes as Cilium's v1 API does, exports the
// sessions' state as metrics and adds a `tendril status` section.
package bgpcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/bgp"
	"github.com/tendril-net/tendril/pkg/bgp/speaker"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/ipam"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell is the BGP control plane; it provides *ControlPlane (nil when
// off).
var Cell = cell.Module("bgp-control-plane", "Announces pod CIDRs and LoadBalancer addresses over BGP",
	cell.Provide(lifecycle.Build[*ControlPlane]),
	cell.Config(DefaultConfig()),
	cell.Provide(newControlPlane, statusContribution, apiHandlers),
)

// PodCIDRs returns the node's pod CIDRs (none before IPAM started).
type PodCIDRs func() []netip.Prefix

// Timings of the control plane's job.
const (
	// settle is the least time from a pass that wrote the node's status
	// to the next pass: a burst of changes (each new address changes the
	// count announced) reaches the speaker and the API server in batches,
	// at most ten a second.
	settle = 100 * time.Millisecond
	// quietGap is the least time between two passes otherwise; passCost
	// keeps passes to about a tenth of the job's time (a pass over a big
	// cluster's Services is not free), up to settle.
	quietGap = 10 * time.Millisecond
	passCost = 10
	// refresh: the sessions' state (status, metrics) is read again, and
	// a failed pass retried, this often.
	refresh = 5 * time.Second
)

// passGap is the least time from the start of a pass that took took (its
// computation and the speaker's work, not the status write's wait for the
// API server) to the start of the next: settle after a pass that wrote
// the status, else ten times took within [quietGap, settle]. A change
// after a quiet spell is applied at once: only the gap after the last
// pass is waited for, not a fixed delay per change (the fixed 100 ms this
// replaced held every new LoadBalancer address that long, and the pass
// the Service's creation woke, which announced nothing, started it anew
// just before LB-IPAM wrote the address; bench/bgp). It is never longer
// than that fixed delay was.
func passGap(took time.Duration, wroteStatus bool) time.Duration {
	if wroteStatus {
		return settle
	}
	return min(settle, max(quietGap, passCost*took))
}

type params struct {
	cell.In

	Config    Config
	Node      option.LocalNode
	Services  statedb.Table[*loadbalancer.Service]
	Backends  statedb.Table[*loadbalancer.Backend]
	K8s       *agentk8s.Client       `optional:"true"`
	Endpoints *agentendpoints.Module `optional:"true"`
	DB        *statedb.DB
	Log       *slog.Logger
	Jobs      job.Registry
	Health    *health.Registry
	Lifecycle cell.Lifecycle
	Metrics   *metrics.Server `optional:"true"`
}

// ControlPlane is the running BGP control plane.
type ControlPlane struct {
	node     string
	log      *slog.Logger
	db       *statedb.DB
	services statedb.Table[*loadbalancer.Service]
	backends statedb.Table[*loadbalancer.Backend]
	source   Source
	// secretsNamespace is where authSecretRef's Secrets are (messages).
	secretsNamespace string
	podCIDRs         PodCIDRs
	speaker          *speaker.Speaker
	// apply stands in for speaker in the passes when set (tests).
	apply   applier
	metrics *peerMetrics

	mu   sync.Mutex
	last Pass
}

// applier is what a pass needs of the speaker.
type applier interface {
	Apply(ctx context.Context, d bgp.Desired, routerID netip.Addr, allowed bgp.Allowed) (speaker.Applied, error)
	PeerStates(ctx context.Context) ([]speaker.PeerState, error)
}

// Pass is the outcome of the last reconciliation, for the status section
// and the API.
type Pass struct {
	Time     time.Time
	Desired  bgp.Desired
	RouterID netip.Addr
	Applied  speaker.Applied
	// Err is the apply's error ("" when it succeeded).
	Err string
	// Waiting says what the control plane waits for ("" once running).
	Waiting string
	Peers   []speaker.PeerState
}

func newControlPlane(p params) (*ControlPlane, error) {
	if !p.Config.EnableBGPControlPlane {
		return nil, nil
	}
	if p.K8s == nil {
		return nil, errors.New("enable-bgp-control-plane: needs Kubernetes (the TendrilBGPClusterConfigs say what the node runs)")
	}
	cp := &ControlPlane{node: p.Node.Name, log: p.Log, db: p.DB, services: p.Services, backends: p.Backends,
		source: kubeSource(p.K8s, p.Node.Name, p.Config.BGPSecretsNamespace), secretsNamespace: p.Config.BGPSecretsNamespace, podCIDRs: ipamCIDRs(p.Endpoints), metrics: newPeerMetrics()}
	if p.Metrics != nil {
		p.Metrics.Registry.MustRegister(cp.metrics.collectors()...)
	}
	cp.last.Waiting = "the Kubernetes caches"
	// The speaker listens nowhere (port -1): the node opens its sessions,
	// so agents in one network namespace (tests) do not contend for 179.
	cp.speaker = speaker.New(p.Log, -1)
	// The agent stops to restart (an upgrade, a SIGTERM of its pod): the
	// sessions with graceful restart outlive the stop, so that their peers
	// keep the node's routes, as after a kill -9 (StopForRestart says why).
	p.Lifecycle.Append(cell.Hook{OnStop: func(ctx cell.HookContext) error {
		cp.speaker.StopForRestart(ctx)
		return nil
	}})
	jobs := p.Jobs.NewGroup(p.Health.Scope("bgp-control-plane"), job.WithLogger(p.Log))
	jobs.Add(job.OneShot("bgp-control-plane", func(ctx context.Context, h cell.Health) error { return cp.run(ctx, h) },
		job.WithRetry(-1, &job.ExponentialBackoff{Min: time.Second, Max: 30 * time.Second})))
	return cp, nil
}

// ipamCIDRs are the pod CIDRs of the endpoints' IPAM.
func ipamCIDRs(m *agentendpoints.Module) PodCIDRs {
	return func() []netip.Prefix {
		if m == nil || m.IPAM() == nil {
			return nil
		}
		var out []netip.Prefix
		for _, f := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
			if c := m.IPAM().CIDR(f); c.IsValid() {
				out = append(out, c.Masked())
			}
		}
		return out
	}
}

// run follows the services tables and the cluster and applies each
// change; every refresh it reads the sessions' state back.
func (cp *ControlPlane) run(ctx context.Context, h cell.Health) error {
	if ok, watch := cp.services.Initialized(cp.db.ReadTxn()); !ok {
		select {
		case <-watch:
		case <-ctx.Done():
			return nil
		}
	}
	read, changed, writeStatus, err := cp.source(ctx)
	if err != nil {
		return err
	}
	ticker := time.NewTicker(refresh)
	defer ticker.Stop()
	statuses := map[string]string{} // config → the status last written (JSON-ish key)
	for {
		start := time.Now()
		txn := cp.db.ReadTxn()
		svcs, svcWatch := cp.services.AllWatch(txn)
		_, beWatch := cp.backends.AllWatch(txn)
		pass := cp.pass(ctx, read(), statedb.Collect(svcs), func(n loadbalancer.ServiceName) bool {
			for b := range loadbalancer.ServiceBackends(txn, cp.backends, n) {
				if b.NodeName == cp.node && b.Ready && !b.Terminating {
					return true
				}
			}
			return false
		})
		took := time.Since(start)
		cp.metrics.update(pass)
		if pass.Err != "" {
			h.Degraded("BGP control plane", errors.New(pass.Err))
		} else {
			h.OK(cmpOr(pass.Waiting, "running"))
		}
		wrote := cp.writeStatuses(ctx, read(), pass, writeStatus, statuses)
		cp.mu.Lock()
		cp.last = pass
		cp.mu.Unlock()
		gap := passGap(took, wrote)
		select {
		case <-ctx.Done():
			return nil
		case <-svcWatch:
		case <-beWatch:
		case <-changed:
		case <-ticker.C:
		}
		if wait := gap - time.Since(start); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// pass computes the desired state from one snapshot and applies it.
func (cp *ControlPlane) pass(ctx context.Context, s Snapshot, svcs []*loadbalancer.Service, localReady func(loadbalancer.ServiceName) bool) Pass {
	out := Pass{Time: time.Now(), RouterID: s.RouterID}
	podCIDRs := cp.podCIDRs()
	var pools []bgp.Pool
	for _, p := range s.Pools {
		pp, err := bgp.ParsePool(p)
		if err != nil {
			// A pool that does not parse lends no address to anyone.
			out.Desired.Errors = append(out.Desired.Errors, err.Error())
			continue
		}
		pools = append(pools, pp)
	}
	allowed := bgp.NewAllowed(podCIDRs, pools).WithServiceCIDRs(s.ServiceCIDRs)
	d := bgp.Compute(bgp.Input{NodeName: cp.node, NodeLabels: s.NodeLabels, PodCIDRs: podCIDRs,
		ClusterConfigs: s.ClusterConfigs, PeerConfigs: s.PeerConfigs, Adverts: s.Adverts,
		Services: svcs, LocalReady: localReady, Allowed: allowed, Passwords: s.Passwords, SecretsNamespace: cp.secretsNamespace})
	d.Errors = append(out.Desired.Errors, d.Errors...)
	out.Desired = d
	switch {
	case !s.NodeFound:
		out.Waiting = "this node's Node"
		d = bgp.Desired{}
	case d.Config != "" && !s.RouterID.IsValid():
		out.Err = "the node has no IPv4 address for a router ID"
		d = bgp.Desired{}
	}
	var sp applier = cp.speaker
	if cp.apply != nil {
		sp = cp.apply
	}
	applied, err := sp.Apply(ctx, d, s.RouterID, allowed)
	out.Applied = applied
	if err != nil {
		out.Err = err.Error()
		cp.log.Warn("BGP control plane: apply", "error", err)
	}
	if out.Peers, err = sp.PeerStates(ctx); err != nil {
		cp.log.Warn("BGP control plane: read the sessions", "error", err)
	}
	return out
}

// writeStatuses writes this node's entry in the status of the config it
// runs (and removes it from those it no longer runs), when it changed;
// it reports whether it wrote (or tried to).
func (cp *ControlPlane) writeStatuses(ctx context.Context, s Snapshot, p Pass, write StatusWriter, last map[string]string) bool {
	wrote := false
	for _, cc := range s.ClusterConfigs {
		var st *v1alpha1.BGPNodeStatus
		if cc.Name == p.Desired.Config {
			st = nodeStatus(cp.node, p)
		} else if !hasNode(cc, cp.node) {
			continue
		}
		key := statusKey(st)
		if last[cc.Name] == key {
			continue
		}
		wrote = true
		if err := write(ctx, cc.Name, st); err != nil {
			cp.log.Warn("BGP control plane: write status", "config", cc.Name, "error", err)
			continue
		}
		last[cc.Name] = key
	}
	return wrote
}

func hasNode(cc *v1alpha1.TendrilBGPClusterConfig, node string) bool {
	return slices.ContainsFunc(cc.Status.Nodes, func(n v1alpha1.BGPNodeStatus) bool { return n.Node == node })
}

// nodeStatus is the node's entry: errors, sessions, counts.
func nodeStatus(node string, p Pass) *v1alpha1.BGPNodeStatus {
	st := &v1alpha1.BGPNodeStatus{Node: node, Advertised: p.Applied.Paths}
	errs := slices.Clone(p.Desired.Errors)
	if p.Err != "" {
		errs = append(errs, p.Err)
	}
	for i, e := range errs {
		if i > 0 {
			st.Error += "; "
		}
		st.Error += e
	}
	for _, ps := range p.Peers {
		st.Peers = append(st.Peers, v1alpha1.BGPPeerStatus{Name: ps.Name, State: ps.State, Reason: ps.Reason})
	}
	for _, r := range p.Desired.Refused {
		st.Refused = append(st.Refused, r.String())
	}
	return st
}

func statusKey(st *v1alpha1.BGPNodeStatus) string {
	if st == nil {
		return "<none>"
	}
	k := fmt.Sprintf("%s|%d", st.Error, st.Advertised)
	for _, p := range st.Peers {
		k += "|" + p.Name + "=" + p.State + ":" + p.Reason
	}
	for _, r := range st.Refused {
		k += "|" + r
	}
	return k
}

// Last is the last pass.
func (cp *ControlPlane) Last() Pass {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.last
}

// Speaker is the node's speaker.
func (cp *ControlPlane) Speaker() *speaker.Speaker { return cp.speaker }
