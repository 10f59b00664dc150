package l2announcer

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// fakeElection stands for the Leases: a campaign leads when the test
// says so, and reports observed at once.
type fakeElection struct {
	mu      sync.Mutex
	running map[loadbalancer.ServiceName]func(bool)
	// ended are the causes the campaigns' contexts ended with.
	ended   map[loadbalancer.ServiceName]error
	changed chan struct{}
}

func newFakeElection() *fakeElection {
	return &fakeElection{running: map[loadbalancer.ServiceName]func(bool){}, ended: map[loadbalancer.ServiceName]error{},
		changed: make(chan struct{}, 100)}
}

func (f *fakeElection) campaign(ctx context.Context, svc loadbalancer.ServiceName, lead func(bool), observed func()) {
	f.mu.Lock()
	f.running[svc] = lead
	f.mu.Unlock()
	observed()
	f.changed <- struct{}{}
	<-ctx.Done()
	lead(false)
	f.mu.Lock()
	delete(f.running, svc)
	f.ended[svc] = context.Cause(ctx)
	f.mu.Unlock()
}

func (f *fakeElection) win(t *testing.T, svc loadbalancer.ServiceName) {
	t.Helper()
	f.mu.Lock()
	lead := f.running[svc]
	f.mu.Unlock()
	if lead == nil {
		t.Fatalf("no campaign for %s", svc)
	}
	lead(true)
}

func (f *fakeElection) campaigning(svc loadbalancer.ServiceName) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running[svc] != nil
}

func newTestAnnouncer(t *testing.T) (*Announcer, *fakeElection, *statedb.DB, statedb.RWTable[*Announcement]) {
	db := statedb.New()
	table, err := NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeElection()
	a := NewAnnouncer(DefaultConfig(), "node-1", db, table, f.campaign, slog.New(slog.DiscardHandler))
	t.Cleanup(a.Stop)
	return a, f, db, table
}

func tableKeys(db *statedb.DB, table statedb.Table[*Announcement]) map[AnnouncementKey]loadbalancer.ServiceName {
	out := map[AnnouncementKey]loadbalancer.ServiceName{}
	for a := range table.All(db.ReadTxn()) {
		out[a.Key()] = a.Service
	}
	return out
}

// TestAnnouncerFollowsLeasesAndCandidacy: a candidate campaigns; the
// table holds its addresses only while it leads; when it stops being a
// candidate (ETP Local, the backend gone) its campaign ends and the
// announcement goes.
func TestAnnouncerFollowsLeasesAndCandidacy(t *testing.T) {
	a, f, db, table := newTestAnnouncer(t)
	ctx := t.Context()
	want := map[loadbalancer.ServiceName]Want{web: {Service: web, Candidate: true, Placements: []Placement{{Addr: lbIP, Device: eth0}}}}
	a.Sync(ctx, want)
	<-f.changed
	a.WaitObserved(ctx)
	if got := tableKeys(db, table); len(got) != 0 {
		t.Fatalf("before winning the lease: %v", got)
	}
	f.win(t, web)
	if got := tableKeys(db, table); got[AnnouncementKey{lbIP, 2}] != web || len(got) != 1 {
		t.Fatalf("leading: table %v, want %s on ifindex 2", got, lbIP)
	}
	sec := a.StatusSection()
	if len(sec.Lines) != 2 || !strings.Contains(sec.Lines[1].Value, "172.30.0.241 on eth0 (default/web)") ||
		!strings.Contains(sec.Lines[0].Value, "candidate for 1, announcing 1") {
		t.Fatalf("status section %+v", sec)
	}
	obj, _, _ := table.Get(db.ReadTxn(), announcementByKey.Query(AnnouncementKey{lbIP, 2}))
	if obj.Status.Kind != reconciler.StatusKindPending {
		t.Fatalf("new announcement status %s, want pending", obj.Status.Kind)
	}

	// Same wants again: the object is left alone (no rewrite, no GARP).
	rev := table.Revision(db.ReadTxn())
	a.Sync(ctx, want)
	if table.Revision(db.ReadTxn()) != rev {
		t.Fatal("an unchanged want rewrote the table")
	}

	// No longer a candidate: the campaign is stopped, the lease given
	// up, the announcement removed.
	a.Sync(ctx, map[loadbalancer.ServiceName]Want{web: {Service: web, Candidate: false, Placements: want[web].Placements}})
	if f.campaigning(web) {
		t.Fatal("campaign still running after the node stopped being a candidate")
	}
	if cause := f.ended[web]; !errors.Is(cause, ErrNotCandidate) {
		t.Fatalf("campaign ended with %v, want ErrNotCandidate (the lease is released)", cause)
	}
	if got := tableKeys(db, table); len(got) != 0 {
		t.Fatalf("not a candidate: table %v", got)
	}
	if len(a.Leading()) != 0 {
		t.Fatalf("still leading %v", a.Leading())
	}
	// A late "won" from the stopped campaign changes nothing.
	a.setLeading(web, &campaign{}, true)
	if got := tableKeys(db, table); len(got) != 0 {
		t.Fatalf("a stopped campaign's win was recorded: %v", got)
	}
}

// TestAnnouncerStopKeepsLeases: the agent's stop ends the campaigns with
// ErrStopping: the leases are kept (a restart takes them back at once),
// and so are the announcements (the datapath keeps answering meanwhile).
func TestAnnouncerStopKeepsLeases(t *testing.T) {
	a, f, db, table := newTestAnnouncer(t)
	a.Sync(t.Context(), map[loadbalancer.ServiceName]Want{web: {Service: web, Candidate: true, Placements: []Placement{{Addr: lbIP, Device: eth0}}}})
	<-f.changed
	f.win(t, web)
	a.Stop()
	if cause := f.ended[web]; !errors.Is(cause, ErrStopping) {
		t.Fatalf("campaign ended with %v, want ErrStopping", cause)
	}
	if got := tableKeys(db, table); got[AnnouncementKey{lbIP, 2}] != web {
		t.Fatalf("after the stop: table %v, want the announcement kept", got)
	}
}

// TestAnnouncerJobContextEnds: the job's context ending (the agent stops,
// before Stop is called) leaves the announcements in place.
func TestAnnouncerJobContextEnds(t *testing.T) {
	a, f, db, table := newTestAnnouncer(t)
	ctx, cancel := context.WithCancel(t.Context())
	a.Sync(ctx, map[loadbalancer.ServiceName]Want{web: {Service: web, Candidate: true, Placements: []Placement{{Addr: lbIP, Device: eth0}}}})
	<-f.changed
	f.win(t, web)
	cancel()
	a.wg.Wait()
	if got := tableKeys(db, table); got[AnnouncementKey{lbIP, 2}] != web {
		t.Fatalf("after the job's context ended: table %v, want the announcement kept", got)
	}
}

// TestAnnouncerLosesLease: losing the lease removes the announcement.
func TestAnnouncerLosesLease(t *testing.T) {
	a, f, db, table := newTestAnnouncer(t)
	a.Sync(t.Context(), map[loadbalancer.ServiceName]Want{web: {Service: web, Candidate: true, Placements: []Placement{{Addr: lbIP, Device: eth0}}}})
	<-f.changed
	f.win(t, web)
	f.mu.Lock()
	lead := f.running[web]
	f.mu.Unlock()
	lead(false)
	if got := tableKeys(db, table); len(got) != 0 {
		t.Fatalf("lease lost: table %v", got)
	}
}

type fakeResponder struct {
	entries map[maps.L2ResponderKey]maps.L2ResponderEntry
	fail    error
}

func (r *fakeResponder) Set(k maps.L2ResponderKey, e maps.L2ResponderEntry) error {
	if r.fail != nil {
		return r.fail
	}
	r.entries[k] = e
	return nil
}

func (r *fakeResponder) Delete(k maps.L2ResponderKey) error { delete(r.entries, k); return nil }

func (r *fakeResponder) List() (map[maps.L2ResponderKey]maps.L2ResponderEntry, error) {
	out := map[maps.L2ResponderKey]maps.L2ResponderEntry{}
	for k, v := range r.entries {
		out[k] = v
	}
	return out, nil
}

// TestOps: an update writes the entry with the lease's end and sends a
// gratuitous ARP, a refresh only moves the end; a failing write is an
// error; the prune removes entries no announcement backs.
func TestOps(t *testing.T) {
	resp := &fakeResponder{entries: map[maps.L2ResponderKey]maps.L2ResponderEntry{}}
	var garps []netip.Addr
	now := uint64(1000)
	o := &ops{resp: resp, ttl: 15 * time.Second, log: slog.New(slog.DiscardHandler),
		clock: func() (uint64, error) { return now, nil },
		garp: func(ifindex int, mac net.HardwareAddr, addr netip.Addr) error {
			garps = append(garps, addr)
			return nil
		}}
	an := &Announcement{Addr: lbIP, Device: "eth0", IfIndex: 2, MAC: eth0.MAC, Service: web, Status: reconciler.StatusPending()}
	if err := o.Update(t.Context(), nil, 0, an); err != nil {
		t.Fatal(err)
	}
	k := maps.L2ResponderKey{Addr: lbIP, IfIndex: 2}
	if e := resp.entries[k]; e.Expires != now+uint64(15*time.Second) || e.MAC.String() != eth0.MAC.String() {
		t.Fatalf("entry %+v", e)
	}
	if len(garps) != 1 || garps[0] != lbIP {
		t.Fatalf("gratuitous ARPs %v, want one for %s", garps, lbIP)
	}
	now += 2e9
	an.Status = reconciler.StatusRefreshing()
	if err := o.Update(t.Context(), nil, 0, an); err != nil {
		t.Fatal(err)
	}
	if len(garps) != 1 || resp.entries[k].Expires != now+uint64(15*time.Second) {
		t.Fatalf("refresh: %d GARPs, expires %d", len(garps), resp.entries[k].Expires)
	}
	resp.fail = errors.New("map full")
	if err := o.Update(t.Context(), nil, 0, an); err == nil {
		t.Fatal("failing write: no error")
	}
	resp.fail = nil

	stale := maps.L2ResponderKey{Addr: extIP, IfIndex: 3}
	resp.entries[stale] = maps.L2ResponderEntry{MAC: eth1.MAC}
	objs := iter.Seq2[*Announcement, statedb.Revision](func(yield func(*Announcement, statedb.Revision) bool) { yield(an, 1) })
	if err := o.Prune(t.Context(), nil, objs); err != nil {
		t.Fatal(err)
	}
	if _, ok := resp.entries[stale]; ok {
		t.Fatal("prune kept an entry no announcement backs")
	}
	if _, ok := resp.entries[k]; !ok {
		t.Fatal("prune removed a backed entry")
	}
	if err := o.Delete(t.Context(), nil, 0, an); err != nil || len(resp.entries) != 0 {
		t.Fatalf("delete: %v, left %v", err, resp.entries)
	}
}

func TestGARPFrame(t *testing.T) {
	f := GARPFrame(eth0.MAC, lbIP)
	if len(f) != 42 || f[0] != 0xff || f[12] != 0x08 || f[13] != 0x06 || f[21] != 1 {
		t.Fatalf("frame %x", f)
	}
	if netip.AddrFrom4([4]byte(f[28:32])) != lbIP || netip.AddrFrom4([4]byte(f[38:42])) != lbIP {
		t.Fatalf("sender/target address of %x: want %s both", f, lbIP)
	}
	if net.HardwareAddr(f[22:28]).String() != eth0.MAC.String() {
		t.Fatalf("sender MAC %s", net.HardwareAddr(f[22:28]))
	}
}
