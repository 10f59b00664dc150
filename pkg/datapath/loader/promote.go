package loader

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netns"
)

// Deferred TCX: in TCX mode with Config.DeferTCX, a new endpoint gets tc
// filters when it is created, and a background job moves it to TCX links
// once no endpoint has been attached for Config.TCXQuietPeriod.
//
// Why: attaching a TCX link waits for an RCU grace period holding rtnl
// (12-15 ms here, two per endpoint), so a burst of pod creations queues
// behind it: 50 concurrent CNI ADDs took 0.75 s at p50 and 1.5 s at p99,
// three times the reference plugins. A tc filter attaches in 0.1 ms. The
// programs are the same, and the switch has no gap: the TCX link is
// attached first, and while both are there only the TCX program runs (the
// kernel runs tc filters only after TCX programs that return "next", which
// Tendril's never do); then the filter is deleted. So the pod is policed
// from its first packet, and owned by TCX links (which nobody else can
// replace or detach by mistake) shortly after the burst.

// defaultTCXQuietPeriod is how long no endpoint must have been attached
// before the next promotion starts: long enough that a burst of ADDs
// never waits for one, short enough that TCX ownership follows promptly.
const defaultTCXQuietPeriod = 500 * time.Millisecond

// deferLocked reports whether ep's attachment goes through tc filters
// first: TCX mode, deferral on, and the endpoint has no TCX link on this
// interface yet (an endpoint that has them gets their programs updated,
// which is cheap).
func (l *Loader) deferLocked(ep EndpointInfo) bool {
	if l.cfg.AttachMode != AttachTCX || !l.cfg.DeferTCX {
		return false
	}
	for _, dir := range directions {
		lk, ok := l.links[linkName(ep.ID, dir)]
		if !ok {
			return true
		}
		if ifindex, err := TCXIfindex(lk); err != nil || ifindex != ep.IfIndex {
			return true
		}
	}
	return false
}

// markPendingLocked records that endpoint id waits for its TCX links and
// wakes the promotion job.
func (l *Loader) markPendingLocked(id uint16) {
	l.pendingTCX[id] = struct{}{}
	l.lastAttach = time.Now()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// HoldPromotions tells the loader that an endpoint is being created or
// removed (a CNI ADD or DEL has begun): no promotion starts until every
// hold is released and the node has been quiet for the period after. A
// promotion holds rtnl through two RCU grace periods, and everything an ADD
// does to links and routes needs rtnl too; so the quiet period starts
// when the ADD starts, not when it reaches the attach. release is
// idempotent.
func (l *Loader) HoldPromotions() (release func()) {
	l.mu.Lock()
	l.holds++
	l.lastAttach = time.Now()
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			l.holds--
			l.lastAttach = time.Now()
			l.mu.Unlock()
			select {
			case l.wake <- struct{}{}:
			default:
			}
		})
	}
}

// PendingTCX counts endpoints attached by tc filters that wait to be
// moved to TCX links.
func (l *Loader) PendingTCX() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pendingTCX)
}

// RunTCXPromotion moves endpoints from their first tc filters to TCX links
// when the node is quiet, one endpoint at a time, until ctx ends. It does
// nothing unless the loader defers TCX attachments.
func (l *Loader) RunTCXPromotion(ctx context.Context) {
	if l.cfg.AttachMode != AttachTCX || !l.cfg.DeferTCX {
		return
	}
	if err := l.enterNetns(); err != nil {
		l.log.Error("Cannot move endpoints to TCX links: they stay on tc filters", "error", err)
		return
	}
	quiet := l.cfg.TCXQuietPeriod
	if quiet <= 0 {
		quiet = defaultTCXQuietPeriod
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait, ok := l.promoteOne(quiet)
		if ok {
			continue
		}
		if wait <= 0 {
			wait = time.Hour // nothing pending: sleep until woken
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		case <-timer.C:
		}
	}
}

// enterNetns locks the calling goroutine to its thread and moves the thread
// into the network namespace Start ran in, where interface indexes mean
// the node's interfaces. The thread is never unlocked: it ends with the
// goroutine instead of carrying the namespace to others.
func (l *Loader) enterNetns() error {
	runtime.LockOSThread()
	l.mu.Lock()
	ns := l.netns
	l.mu.Unlock()
	if !ns.IsOpen() {
		return errors.New("the loader has not started")
	}
	cur, err := netns.Get()
	if err != nil {
		return fmt.Errorf("read the network namespace: %w", err)
	}
	defer cur.Close()
	if cur.Equal(ns) {
		return nil
	}
	if err := netns.Set(ns); err != nil {
		return fmt.Errorf("enter the node's network namespace: %w", err)
	}
	return nil
}

// promoteOne moves one pending endpoint to TCX links when the node has
// been quiet for the period. It reports whether it did, or else how long
// to wait before the node can be quiet enough (0: nothing pending).
func (l *Loader) promoteOne(quiet time.Duration) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pendingTCX) == 0 {
		return 0, false
	}
	if l.holds > 0 {
		return quiet, false // woken again when the last hold goes
	}
	if left := quiet - time.Since(l.lastAttach); left > 0 {
		return left, false
	}
	ids := make([]uint16, 0, len(l.pendingTCX))
	for id := range l.pendingTCX {
		ids = append(ids, id)
	}
	id := slices.Min(ids)
	delete(l.pendingTCX, id)
	start := time.Now()
	for _, dir := range directions {
		name := linkName(id, dir)
		f, ok := l.filters[name]
		if !ok {
			continue // detached meanwhile, or promoted by a takeover
		}
		if err := l.switchToTCX(name, f); err != nil {
			// The endpoint keeps its filter (policed as before); its next
			// regeneration in TCX mode tries the link again.
			l.log.Warn("Cannot move an endpoint's tc filter to a TCX link; it keeps the filter",
				"endpoint", id, "attachment", name, "error", err)
			continue
		}
		delete(l.filters, name)
	}
	l.log.Debug("Moved endpoint to TCX links", "endpoint", id, "duration", time.Since(start), "pending", len(l.pendingTCX))
	return 0, true
}
