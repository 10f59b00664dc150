package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/lab"
)

// Count is one leak count: what is left at the end that was not there at
// the start (for sets, the new members; for goroutines and descriptors,
// the growth), and how much of it is allowed.
type Count struct {
	// Node is the lab node it was counted on; "" for the cluster.
	Node string
	What string
	// Before and After are the totals at the start and at the end.
	Before, After int
	// N is the count: members of After not in Before, or After-Before.
	N int
	// Allowance is the steady-state allowance (|N| up to it is no leak).
	Allowance int
	// Examples are a few of the leaked members.
	Examples []string
}

// Leaked says whether the count is beyond its allowance (a count that
// fell is no leak).
func (c Count) Leaked() bool { return c.N > c.Allowance }

// set is a snapshot of named things.
type set map[string]bool

// nodeSnap is what one node holds.
type nodeSnap struct {
	ipam, endpoints, bpfEndpoints, policy, ipcache, pins, ifaces set
	// ct and nat are the conntrack and NAT entries of the churn pods'
	// addresses that the datapath still treats as live (or that its GC
	// should long have removed); only counted at the end.
	ct, nat       set
	goroutines    int
	fds           int
	goroutinesErr error
}

// clusterSnap is what the cluster and the machine hold.
type clusterSnap struct {
	teps, identities, kvIdentities, kvIPs, netns set
	nodes                                        map[string]*nodeSnap
}

// ctGCMax is the conntrack GC's longest interval (pkg/agent/hostips):
// an entry expired longer ago than this plus a margin should be gone.
const ctGCMax = 5*time.Minute + time.Minute

// snapshot counts everything; churnIPs (nil at the start) are the
// addresses the churn's pods had, whose conntrack, NAT and ipcache
// entries must be gone at the end.
func snapshot(ctx context.Context, st *lab.State, cl *k8s.Clients, ns string, churnIPs map[string]bool) (*clusterSnap, error) {
	cs := &clusterSnap{nodes: map[string]*nodeSnap{}}
	teps, err := cl.Tendril.TendrilV1alpha1().TendrilEndpoints(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list TendrilEndpoints: %w", err)
	}
	cs.teps = set{}
	for _, t := range teps.Items {
		cs.teps[t.Namespace+"/"+t.Name] = true
	}
	ids, err := cl.Tendril.TendrilV1alpha1().TendrilIdentities().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list TendrilIdentities: %w", err)
	}
	cs.identities = set{}
	for _, id := range ids.Items {
		cs.identities[id.Name] = true
	}
	if st.KVStorePort != 0 {
		if cs.kvIdentities, cs.kvIPs, err = kvstoreKeys(ctx, st); err != nil {
			return nil, err
		}
	}
	names, err := lab.ListLabNetns(st.Name)
	if err != nil {
		return nil, fmt.Errorf("list network namespaces: %w", err)
	}
	cs.netns = set{}
	for _, n := range names {
		cs.netns[n] = true
	}
	procs, err := lab.ReadProcesses(st.PidDir())
	if err != nil {
		return nil, fmt.Errorf("lab processes: %w", err)
	}
	for _, n := range st.Nodes {
		pid := AgentPID(procs, n.Name)
		if pid == 0 {
			return nil, fmt.Errorf("no agent process recorded for %s", n.Name)
		}
		s, err := snapNode(ctx, n, pid, churnIPs)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		cs.nodes[n.Name] = s
	}
	return cs, nil
}

func kvstoreKeys(ctx context.Context, st *lab.State) (ids, ips set, err error) {
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{st.KVStoreURL()}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, nil, fmt.Errorf("kvstore: %w", err)
	}
	defer kv.Close()
	keys := func(prefix string) (set, error) {
		resp, err := kv.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, fmt.Errorf("kvstore list %s: %w", prefix, err)
		}
		out := set{}
		for _, k := range resp.Kvs {
			out[strings.TrimPrefix(string(k.Key), prefix)] = true
		}
		return out, nil
	}
	if ids, err = keys(kvalloc.IDPrefix); err != nil {
		return nil, nil, err
	}
	ips, err = keys(ipKeyPrefix)
	return ids, ips, err
}

// ipKeyPrefix is where agents publish their endpoints' addresses in the
// kvstore (pkg/agent: tendril/state/ip/v1/<cluster>/<ip>).
const ipKeyPrefix = "tendril/state/ip/v1/"

// agentGet GETs path (below /v1) from the agent's socket on a connection
// of its own, closed after: an idle connection kept open would hold a
// goroutine and a descriptor in the agent and skew the counts.
func agentGet(ctx context.Context, socket, path string, out any) error {
	c := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}, Timeout: 30 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/v1"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// goroutines reads the agent's go_goroutines (runtime.NumGoroutine, the
// count pprof's goroutine profile totals) over its API socket.
func goroutines(ctx context.Context, socket string) (int, error) {
	var ms []*models.Metric
	if err := agentGet(ctx, socket, "/metrics/", &ms); err != nil {
		return 0, err
	}
	for _, m := range ms {
		if m.Name == "go_goroutines" {
			return int(m.Value), nil
		}
	}
	return 0, fmt.Errorf("the agent's metrics have no go_goroutines")
}

func countFDs(pid int) (int, error) {
	entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return 0, fmt.Errorf("agent file descriptors: %w", err)
	}
	return len(entries), nil
}

func snapNode(ctx context.Context, n lab.Node, pid int, churnIPs map[string]bool) (*nodeSnap, error) {
	s := &nodeSnap{ipam: set{}, endpoints: set{}, bpfEndpoints: set{}, policy: set{}, ipcache: set{}, pins: set{}, ifaces: set{}, ct: set{}, nat: set{}}
	var status ext.StatusResponse
	if err := agentGet(ctx, n.Socket, "/healthz", &status); err != nil {
		return nil, err
	}
	if status.Ipam != nil {
		for ip, owner := range status.Ipam.Allocations {
			s.ipam[ip+" ("+owner+")"] = true
		}
	}
	var eps []*models.Endpoint
	if err := agentGet(ctx, n.Socket, "/endpoint", &eps); err != nil {
		return nil, err
	}
	for _, e := range eps {
		name := strconv.FormatInt(e.ID, 10)
		if e.Status != nil && e.Status.ExternalIdentifiers != nil && e.Status.ExternalIdentifiers.K8sPodName != "" {
			name += " " + e.Status.ExternalIdentifiers.K8sNamespace + "/" + e.Status.ExternalIdentifiers.K8sPodName
		}
		s.endpoints[name] = true
	}
	if err := snapMaps(n.BPFRoot, s, churnIPs); err != nil {
		return nil, err
	}
	err := filepath.WalkDir(n.BPFRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(n.BPFRoot, path); rel != "." {
			s.pins[rel] = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk %s: %w", n.BPFRoot, err)
	}
	err = lab.InNetns(lab.NetnsPath(n.Netns), func() error {
		ifs, err := net.Interfaces()
		for _, i := range ifs {
			s.ifaces[i.Name] = true
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("interfaces of %s: %w", n.Netns, err)
	}
	// The least of three samples a second apart: a request in flight (a
	// CNI call, a watch event being handled) is not a leak.
	s.goroutines, s.fds = -1, -1
	for i := range 3 {
		if i > 0 {
			time.Sleep(time.Second)
		}
		g, err := goroutines(ctx, n.Socket)
		if err != nil {
			s.goroutinesErr = err
		} else if s.goroutines < 0 || g < s.goroutines {
			s.goroutines = g
		}
		f, err := countFDs(pid)
		if err != nil {
			return nil, err
		}
		if s.fds < 0 || f < s.fds {
			s.fds = f
		}
	}
	return s, nil
}

func snapMaps(root string, s *nodeSnap, churnIPs map[string]bool) error {
	m, err := maps.OpenPinned(root, true)
	if err != nil {
		return err
	}
	defer m.Close()
	ids, err := m.EndpointMap().IDs()
	if err != nil {
		return fmt.Errorf("endpoint map: %w", err)
	}
	for id := range ids {
		s.bpfEndpoints[strconv.Itoa(int(id))] = true
	}
	err = m.PolicyMap().Iterate(func(k maps.PolicyKey, _ maps.PolicyValue) bool {
		s.policy[k.String()] = true
		return true
	})
	if err != nil {
		return fmt.Errorf("policy map: %w", err)
	}
	ipc, err := m.IPCacheMap().Dump()
	if err != nil {
		return fmt.Errorf("ipcache: %w", err)
	}
	for p, e := range ipc {
		s.ipcache[fmt.Sprintf("%s identity=%d", p, e.Identity)] = true
	}
	if churnIPs == nil {
		return nil
	}
	churn := func(a netip.Addr) bool { return a.IsValid() && churnIPs[a.Unmap().String()] }
	now := maps.MonotonicNow()
	err = m.CTMap().Iterate(func(e maps.CTEntry) bool {
		if !churn(e.Src) && !churn(e.Dst) {
			return true
		}
		// Live (the datapath would still match it), or expired so long
		// ago that the GC should have removed it.
		if e.Expires > now || now-e.Expires > uint64(ctGCMax) {
			s.ct[fmt.Sprintf("%d %s:%d -> %s:%d expires in %s", e.Proto, e.Src, e.SrcPort, e.Dst, e.DstPort,
				time.Duration(int64(e.Expires)-int64(now)).Round(time.Second))] = true
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("conntrack: %w", err)
	}
	nat, err := maps.OpenPinnedNAT(root, true)
	if err != nil {
		return err
	}
	defer nat.Close()
	mappings, err := nat.NATMap().List()
	if err != nil {
		return fmt.Errorf("NAT: %w", err)
	}
	for _, nm := range mappings {
		if churn(nm.Pod) || churn(nm.Remote) {
			s.nat[fmt.Sprintf("%d %s:%d -> %s:%d", nm.Proto, nm.Pod, nm.PodPort, nm.Remote, nm.RemotePort)] = true
		}
	}
	return nil
}

// compare counts what after holds beyond before.
func compare(before, after *clusterSnap, allow Allowance) []Count {
	var out []Count
	diff := func(node, what string, b, a set) {
		c := Count{Node: node, What: what, Before: len(b), After: len(a)}
		var extra []string
		for k := range a {
			if !b[k] {
				extra = append(extra, k)
			}
		}
		sort.Strings(extra)
		c.N = len(extra)
		c.Examples = extra[:min(len(extra), 3)]
		out = append(out, c)
	}
	diff("", "TendrilEndpoints", before.teps, after.teps)
	diff("", "identities (TendrilIdentity)", before.identities, after.identities)
	if after.kvIdentities != nil {
		diff("", "identities (kvstore)", before.kvIdentities, after.kvIdentities)
		diff("", "endpoint addresses (kvstore)", before.kvIPs, after.kvIPs)
	}
	diff("", "network namespaces", before.netns, after.netns)
	var names []string
	for n := range after.nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b, a := before.nodes[n], after.nodes[n]
		diff(n, "IPAM addresses", b.ipam, a.ipam)
		diff(n, "endpoints (agent API)", b.endpoints, a.endpoints)
		diff(n, "endpoint map (lxc)", b.bpfEndpoints, a.bpfEndpoints)
		diff(n, "policy map entries", b.policy, a.policy)
		diff(n, "ipcache entries", b.ipcache, a.ipcache)
		diff(n, "conntrack entries of gone pods", set{}, a.ct)
		diff(n, "NAT entries of gone pods", set{}, a.nat)
		diff(n, "bpffs pins", b.pins, a.pins)
		diff(n, "interfaces (veths)", b.ifaces, a.ifaces)
		g := Count{Node: n, What: "agent goroutines", Before: b.goroutines, After: a.goroutines, N: a.goroutines - b.goroutines, Allowance: allow.Goroutines}
		if a.goroutinesErr != nil || b.goroutinesErr != nil {
			// Unreadable counts as a leak: a soak that cannot see the
			// goroutines must not pass.
			g.N, g.Allowance = 1, 0
			g.Examples = []string{fmt.Sprint(a.goroutinesErr, b.goroutinesErr)}
		}
		out = append(out, g)
		out = append(out, Count{Node: n, What: "agent file descriptors", Before: b.fds, After: a.fds, N: a.fds - b.fds, Allowance: allow.FDs})
	}
	return out
}
