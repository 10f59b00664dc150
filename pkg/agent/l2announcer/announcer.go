// Package l2announcer makes the node answer ARP for the IPv4 addresses of
// services that a TendrilLoadBalancerIPPool's spec.l2Announcements admits
// (L2 announcements, as Cilium's; never a node's address, a gateway, or an
// address another service holds: policy.go, candidates.go): for each
// service with such an address on the subnet of one of the node's
// devices, the candidate nodes (every node; with externalTrafficPolicy
// Local, those with a ready backend) elect one with a coordination.k8s.io
// Lease per service. The winner's announcements are the desired state in
// the l2-announcements table; a reconciler writes them into the host
// device programs' responder map (tdr_l2_responder_v4, bpf/lib/arp.h),
// and sends a gratuitous ARP when it takes an address over, so that
// neighbours' caches move to it at once.
package l2announcer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// Announcer runs this node's campaigns for the services it is a candidate
// of and keeps the announcements table to the services it leads.
type Announcer struct {
	cfg   Config
	node  string
	log   *slog.Logger
	db    *statedb.DB
	table statedb.RWTable[*Announcement]
	// campaign runs one service's election until its context ends; the
	// agent's is a client-go leader election on the service's Lease.
	campaign Campaign

	mu        sync.Mutex
	wants     map[loadbalancer.ServiceName]Want
	leading   map[loadbalancer.ServiceName]bool
	campaigns map[loadbalancer.ServiceName]*campaign
	// stopping: the agent stops; the table (and so the responder map) is
	// left as it is, for the datapath to answer until a restart takes the
	// leases back or they expire.
	stopping bool
	wg       sync.WaitGroup
}

// Campaign runs one service's election until ctx ends: it calls lead
// with true when this node takes the service's lease and false when it
// no longer holds it, and observed once it has read who holds it (itself
// or another node).
type Campaign func(ctx context.Context, svc loadbalancer.ServiceName, lead func(bool), observed func())

// Why a campaign's context ends (context.Cause): a campaign ended because
// the node is no longer a candidate gives its lease up, so that a
// candidate takes it over at its next try; one ended by the agent's stop
// keeps it.
var (
	ErrNotCandidate = errors.New("no longer a candidate")
	ErrStopping     = errors.New("agent stopping")
)

type campaign struct {
	cancel   context.CancelCauseFunc
	done     chan struct{}
	observed chan struct{}
	once     sync.Once
}

// NewAnnouncer returns an announcer writing table; campaign runs one
// service's election (LeaseCampaign in the agent).
func NewAnnouncer(cfg Config, node string, db *statedb.DB, table statedb.RWTable[*Announcement],
	run Campaign, log *slog.Logger) *Announcer {
	return &Announcer{cfg: cfg, node: node, log: log, db: db, table: table, campaign: run,
		wants: map[loadbalancer.ServiceName]Want{}, leading: map[loadbalancer.ServiceName]bool{},
		campaigns: map[loadbalancer.ServiceName]*campaign{}}
}

// Sync makes the campaigns and the table follow wants: a campaign starts
// for each service this node is a candidate of and stops (releasing the
// lease, so another candidate takes it at its next try) for each it no
// longer is.
func (a *Announcer) Sync(ctx context.Context, wants map[loadbalancer.ServiceName]Want) {
	a.mu.Lock()
	a.wants = wants
	var stopping []*campaign
	for name, c := range a.campaigns {
		if w, ok := wants[name]; !ok || !w.Candidate {
			c.cancel(ErrNotCandidate)
			delete(a.campaigns, name)
			delete(a.leading, name)
			stopping = append(stopping, c)
		}
	}
	for name, w := range wants {
		if !w.Candidate || a.campaigns[name] != nil {
			continue
		}
		cctx, cancel := context.WithCancelCause(ctx)
		c := &campaign{cancel: cancel, done: make(chan struct{}), observed: make(chan struct{})}
		a.campaigns[name] = c
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			defer close(c.done)
			a.campaign(cctx, name, func(lead bool) {
				c.once.Do(func() { close(c.observed) })
				if !lead && cctx.Err() != nil {
					// Ended by Sync (which has rewritten the table) or
					// by the agent's stop (the table stays): not a
					// lease lost while campaigning.
					return
				}
				a.setLeading(name, c, lead)
			}, func() { c.once.Do(func() { close(c.observed) }) })
		}()
		a.log.Info("Candidate for a service's L2 announcement", "service", name, "lease", LeaseName(name))
	}
	a.writeTableLocked()
	a.mu.Unlock()
	for _, c := range stopping {
		<-c.done
	}
}

// WaitObserved waits until every running campaign has read its lease's
// holder, or ctx ends: then the table holds the announcements this node
// had before a restart, if it still holds their leases.
func (a *Announcer) WaitObserved(ctx context.Context) {
	a.mu.Lock()
	var chans []chan struct{}
	for _, c := range a.campaigns {
		chans = append(chans, c.observed)
	}
	a.mu.Unlock()
	for _, ch := range chans {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// setLeading records a campaign's state; a campaign that was stopped
// meanwhile leads nothing.
func (a *Announcer) setLeading(name loadbalancer.ServiceName, c *campaign, lead bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopping || lead && a.campaigns[name] != c {
		return
	}
	if a.leading[name] == lead {
		return
	}
	if lead {
		a.leading[name] = true
		a.log.Info("Announcing a service's addresses", "service", name)
	} else {
		delete(a.leading, name)
		a.log.Info("No longer announcing a service's addresses", "service", name)
	}
	a.writeTableLocked()
}

// Leading returns the services this node announces.
func (a *Announcer) Leading() map[loadbalancer.ServiceName]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.leading)
}

// writeTableLocked makes the table hold exactly the desired announcements,
// in one short transaction; an unchanged object is left as it is (no
// kernel write, no gratuitous ARP).
func (a *Announcer) writeTableLocked() {
	desired := Desired(a.wants, a.leading)
	wtxn := a.db.WriteTxn(a.table)
	for obj := range a.table.All(wtxn) {
		if d, ok := desired[obj.Key()]; !ok || !d.same(obj) {
			if _, _, err := a.table.Delete(wtxn, obj); err != nil {
				a.log.Error("Cannot delete an L2 announcement", "address", obj.Addr, "error", err)
			}
			continue
		}
		delete(desired, obj.Key())
	}
	for _, d := range desired {
		d.Status = reconciler.StatusPending()
		if _, _, err := a.table.Insert(wtxn, d); err != nil {
			a.log.Error("Cannot insert an L2 announcement", "address", d.Addr, "error", err)
		}
	}
	wtxn.Commit()
}

// Stop ends every campaign and waits for them. The leases are kept: a
// restarted agent takes its own leases back at once, and a stopped one's
// expire (and with them its datapath's answers) for another node to take.
func (a *Announcer) Stop() {
	a.mu.Lock()
	a.stopping = true
	for name, c := range a.campaigns {
		c.cancel(ErrStopping)
		delete(a.campaigns, name)
	}
	a.mu.Unlock()
	a.wg.Wait()
}

// LeaseCampaign returns the campaign of the agent: client-go's leader
// election on the service's Lease in cfg.LeaseNamespace, identity the
// node's name, campaigning again after a lost term until ctx ends. When
// ctx ends because the node is no longer a candidate (ErrNotCandidate)
// the lease is released, so another candidate takes it over at its next
// retry instead of after the lease duration; otherwise it is kept.
func LeaseCampaign(cfg Config, client func() kubernetes.Interface, node string, log *slog.Logger) Campaign {
	return func(ctx context.Context, svc loadbalancer.ServiceName, lead func(bool), observed func()) {
		lock := &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.LeaseNamespace, Name: LeaseName(svc)},
			Client:     client().CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: node},
		}
		for ctx.Err() == nil {
			le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
				Lock:          lock,
				LeaseDuration: cfg.LeaseDuration,
				RenewDeadline: cfg.RenewDeadline,
				RetryPeriod:   cfg.RetryPeriod,
				Name:          LeaseName(svc),
				Callbacks: leaderelection.LeaderCallbacks{
					OnStartedLeading: func(context.Context) { lead(true) },
					OnStoppedLeading: func() { lead(false) },
					OnNewLeader:      func(string) { observed() },
				},
			})
			if err != nil {
				log.Error("L2 announcement election", "service", svc, "error", err)
				return
			}
			le.Run(ctx)
			if ctx.Err() == nil {
				log.Info("Lost an L2 announcement lease, campaigning again", "service", svc)
				select {
				case <-ctx.Done():
				case <-time.After(cfg.RetryPeriod):
				}
			}
		}
		if errors.Is(context.Cause(ctx), ErrNotCandidate) {
			if err := releaseLease(lock, node, cfg); err != nil {
				log.Warn("Cannot release an L2 announcement lease: it expires instead", "service", svc, "error", err)
			}
		}
	}
}

// releaseLease gives the lease up if node holds it, as client-go's
// ReleaseOnCancel does: no holder, and a one-second duration. One slow
// answer from a loaded API server must not leave a service unannounced
// for a whole lease duration, so it tries again (each try bounded by the
// renew deadline) for up to two renew deadlines, and never past the
// moment the lease would have expired anyway. The bound matters: Sync
// waits for the release, and the agent's stop waits for Sync.
func releaseLease(lock *resourcelock.LeaseLock, node string, cfg Config) error {
	deadline := time.Now().Add(min(cfg.LeaseDuration, 2*cfg.RenewDeadline))
	var err error
	for {
		if err = releaseLeaseOnce(lock, node, cfg.RenewDeadline); err == nil {
			return nil
		}
		if time.Now().Add(cfg.RetryPeriod).After(deadline) {
			return err
		}
		time.Sleep(cfg.RetryPeriod)
	}
}

func releaseLeaseOnce(lock *resourcelock.LeaseLock, node string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rec, _, err := lock.Get(ctx)
	if err != nil {
		return fmt.Errorf("get lease %s: %w", lock.Describe(), err)
	}
	if rec.HolderIdentity != node {
		return nil
	}
	now := metav1.NewTime(time.Now())
	if err := lock.Update(ctx, resourcelock.LeaderElectionRecord{LeaderTransitions: rec.LeaderTransitions,
		LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now}); err != nil {
		return fmt.Errorf("release lease %s: %w", lock.Describe(), err)
	}
	return nil
}

// StatusSection is the announcer's part of `tendril status`: the addresses
// this node answers for and the services it is a candidate of.
func (a *Announcer) StatusSection() ext.Section {
	a.mu.Lock()
	candidates, leading := len(a.campaigns), len(a.leading)
	a.mu.Unlock()
	sec := ext.Section{Title: "L2 announcements", Lines: []ext.Line{
		{Key: "Services", Value: fmt.Sprintf("candidate for %d, announcing %d (Leases in %s, duration %s)", candidates, leading, a.cfg.LeaseNamespace, a.cfg.LeaseDuration)},
	}}
	var rows []string
	for obj := range a.table.All(a.db.ReadTxn()) {
		rows = append(rows, fmt.Sprintf("%s on %s (%s) %s", obj.Addr, obj.Device, obj.Service, obj.Status.Kind))
	}
	slices.Sort(rows)
	for _, r := range rows {
		sec.Lines = append(sec.Lines, ext.Line{Key: "Announcing", Value: r})
	}
	return sec
}
