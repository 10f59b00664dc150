package nodehealth

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/nodemanager"
)

// maxConcurrentProbes bounds the probes in flight in a round (each holds
// a socket; a raw ICMP socket sees every ICMP packet of the namespace).
const maxConcurrentProbes = 64

// Prober probes every other node of the nodes table, both probes on each
// of its addresses, once per round, and writes the outcome to the node
// health table: it is the table's only writer.
type Prober struct {
	DB    *statedb.DB
	Table statedb.RWTable[*Status]
	Peers statedb.Table[*nodemanager.Peer]
	ICMP  ProbeFunc
	HTTP  ProbeFunc
	// Timeout bounds each probe.
	Timeout time.Duration
	// Now is the clock of the probes' times.
	Now func() time.Time
	Log *slog.Logger
	// Written, if set, is told after each write what was written and
	// which nodes' rows were deleted (the metrics follow it).
	Written func(written []*Status, deleted []string)
	// Self is this node's name, the row of its own health endpoint.
	Self string
	// Local, if set, gives this node's health endpoint's addresses (none
	// while it has none): they are probed too, from the node through the
	// datapath to the endpoint's namespace, as Cilium's health shows the
	// local node's endpoint. Their row is named Self and has no node
	// address (this node's own are not probed).
	Local func() []netip.Addr
}

// localAddresses are this node's health endpoint's addresses now.
func (p *Prober) localAddresses() []netip.Addr {
	if p.Local == nil || p.Self == "" {
		return nil
	}
	return p.Local()
}

// present reports whether node still has a row: a node of the nodes
// table, or this node while its health endpoint has an address.
func (p *Prober) present(txn statedb.ReadTxn, node string) bool {
	if node == p.Self && p.Self != "" {
		return len(p.localAddresses()) > 0
	}
	_, _, ok := p.Peers.Get(txn, nodemanager.PeerNameIndex.Query(node))
	return ok
}

// Round probes every node in the nodes table at once and writes the
// results in one transaction; the rows of nodes no longer in the nodes
// table are deleted. A round cut short by ctx writes nothing: the
// probes it cancelled say nothing of the nodes.
func (p *Prober) Round(ctx context.Context) error {
	peers := statedb.Collect(p.Peers.All(p.DB.ReadTxn()))
	results := make([]*Status, len(peers), len(peers)+1)
	sem := make(chan struct{}, maxConcurrentProbes)
	var wg sync.WaitGroup
	probe := func(f ProbeFunc, ip netip.Addr, out *Result) {
		defer wg.Done()
		defer func() { <-sem }()
		pctx, cancel := context.WithTimeout(ctx, p.Timeout)
		defer cancel()
		out.Probed = p.Now()
		latency, err := f(pctx, ip)
		if err != nil {
			out.Error = err.Error()
			return
		}
		out.Reachable, out.Latency = true, latency
	}
	for i, peer := range peers {
		// The node's addresses, then its health endpoint's (only those
		// inside its accepted pod CIDRs: another node published them).
		health := peer.HealthEndpointIPs()
		st := &Status{Node: peer.Name, Addresses: make([]Address, 0, len(peer.IPs)+len(health))}
		for _, ip := range peer.IPs {
			st.Addresses = append(st.Addresses, Address{IP: ip})
		}
		for _, ip := range health {
			st.Addresses = append(st.Addresses, Address{IP: ip, HealthEndpoint: true})
		}
		results[i] = st
	}
	if local := p.localAddresses(); len(local) > 0 {
		st := &Status{Node: p.Self, Addresses: make([]Address, 0, len(local))}
		for _, ip := range local {
			st.Addresses = append(st.Addresses, Address{IP: ip, HealthEndpoint: true})
		}
		results = append(results, st)
	}
	for _, st := range results {
		for j := range st.Addresses {
			a := &st.Addresses[j]
			ip := a.IP
			if err := probeable(ip); err != nil {
				now := p.Now()
				a.ICMP = Result{Error: err.Error(), Probed: now}
				a.HTTP = a.ICMP
				continue
			}
			for _, job := range []struct {
				f   ProbeFunc
				out *Result
			}{{p.ICMP, &a.ICMP}, {p.HTTP, &a.HTTP}} {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					wg.Wait()
					return ctx.Err()
				}
				wg.Add(1)
				go probe(job.f, ip, job.out)
			}
		}
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	p.write(results)
	return nil
}

// probeable refuses what a Node's address must not make every agent
// send to: no address, the unspecified address, multicast and the IPv4
// broadcast (the addresses come from Node and TendrilNode objects).
func probeable(ip netip.Addr) error {
	ip = ip.Unmap()
	switch {
	case !ip.IsValid(), ip.IsUnspecified():
		return fmt.Errorf("not probed: %q is not a node address", ip)
	case ip.IsMulticast(), ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("not probed: %s is not a unicast address", ip)
	}
	return nil
}

// write stores the results of the nodes still in the nodes table and
// deletes the rows of those that left, in one transaction.
func (p *Prober) write(results []*Status) {
	wtxn := p.DB.WriteTxn(p.Table)
	written := results[:0:0]
	for _, st := range results {
		// A node that left during the round gets no row back.
		if !p.present(wtxn, st.Node) {
			continue
		}
		if _, _, err := p.Table.Insert(wtxn, st); err != nil {
			p.Log.Error("Cannot write a node's health", "node", st.Node, "error", err)
			continue
		}
		written = append(written, st)
	}
	deleted := p.deleteGone(wtxn)
	wtxn.Commit()
	if p.Written != nil {
		p.Written(written, deleted)
	}
}

// deleteGone deletes the rows of nodes not in the nodes table.
func (p *Prober) deleteGone(wtxn statedb.WriteTxn) []string {
	var deleted []string
	for st := range p.Table.All(wtxn) {
		if p.present(wtxn, st.Node) {
			continue
		}
		if _, _, err := p.Table.Delete(wtxn, st); err != nil {
			p.Log.Error("Cannot delete a node's health", "node", st.Node, "error", err)
			continue
		}
		deleted = append(deleted, st.Node)
	}
	return deleted
}

// Prune deletes the rows of nodes that left the nodes table, at once
// rather than at the next round; it writes only when there is one.
func (p *Prober) Prune() {
	txn := p.DB.ReadTxn()
	stale := false
	for st := range p.Table.All(txn) {
		if !p.present(txn, st.Node) {
			stale = true
			break
		}
	}
	if !stale {
		return
	}
	wtxn := p.DB.WriteTxn(p.Table)
	deleted := p.deleteGone(wtxn)
	wtxn.Commit()
	if p.Written != nil {
		p.Written(nil, deleted)
	}
}

// Run probes a round at once and then every interval until ctx ends; a
// node leaving the nodes table loses its row as soon as it leaves.
func (p *Prober) Run(ctx context.Context, interval time.Duration, health cell.Health) error {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		_, peersChanged := p.Peers.AllWatch(p.DB.ReadTxn())
		if err := p.Round(ctx); err != nil {
			return nil // only a cancelled round fails: the agent stops
		}
		health.OK(p.summary())
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				return nil
			case <-ticker.C:
				waiting = false
			case <-peersChanged:
				p.Prune()
				_, peersChanged = p.Peers.AllWatch(p.DB.ReadTxn())
			}
		}
	}
}

func (p *Prober) summary() string {
	txn := p.DB.ReadTxn()
	n, m := 0, 0
	local := ""
	for st := range p.Table.All(txn) {
		if st.Node == p.Self {
			if a, ok := st.HealthEndpoint(); ok && !a.Reachable() {
				local = "; this node's health endpoint unreachable"
			}
			continue
		}
		m++
		if st.Reachable() {
			n++
		}
	}
	return fmt.Sprintf("%d/%d nodes reachable%s", n, m, local)
}
