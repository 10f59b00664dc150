package kvstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// sessionManager keeps one session (a lease kept alive) current. When the
// lease is lost (revoked, or expired while etcd was out of reach) every key
// and lock bound to it is gone: the manager creates a new session and tells
// subscribers, so that they write their keys again.
type sessionManager struct {
	c *Client

	mu      sync.Mutex
	current *concurrency.Session
	// ready is closed while current is set; a fresh one replaces it when
	// the session is lost.
	ready chan struct{}
	subs  map[chan struct{}]struct{}
	// closeCtx bounds the lease revocation at Close.
	closeCtx context.Context
}

func newSessionManager(c *Client) *sessionManager {
	return &sessionManager{c: c, ready: make(chan struct{}), subs: map[chan struct{}]struct{}{}, closeCtx: context.Background()}
}

func (m *sessionManager) setCloseContext(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closeCtx = ctx
}

// run keeps a session until ctx ends, then revokes it.
func (m *sessionManager) run(ctx context.Context) {
	b := newBackoff(200*time.Millisecond, 10*time.Second)
	renewal := false
	for ctx.Err() == nil {
		s, err := m.create(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.c.log.Warn("Cannot create kvstore session; retrying", "error", err)
				_ = b.wait(ctx)
			}
			continue
		}
		b.reset()
		m.publish(s, renewal)
		renewal = true
		select {
		case <-ctx.Done():
			m.clear(s)
			m.revoke(s)
			return
		case <-s.Done():
			m.clear(s)
			m.c.log.Warn("kvstore session lost (lease revoked or expired); creating a new one", "lease", fmt.Sprintf("%x", int64(s.Lease())))
		}
	}
}

// create grants a lease (bounded by probeTimeout, so that an unreachable
// etcd means a retry, not a hang) and keeps it alive until ctx ends.
func (m *sessionManager) create(ctx context.Context) (*concurrency.Session, error) {
	grantCtx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	lease, err := m.c.etcd.Grant(grantCtx, m.c.cfg.leaseTTLSeconds())
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	s, err := concurrency.NewSession(m.c.etcd, concurrency.WithLease(lease.ID), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("keep lease %x alive: %w", int64(lease.ID), err)
	}
	return s, nil
}

func (m *sessionManager) publish(s *concurrency.Session, renewal bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.current = s
	close(m.ready)
	if !renewal {
		return
	}
	m.c.log.Info("New kvstore session", "lease", fmt.Sprintf("%x", int64(s.Lease())))
	for ch := range m.subs {
		// A pending signal already says "rewrite"; one is enough.
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// clear forgets s if it is still the current session.
func (m *sessionManager) clear(s *concurrency.Session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clearLocked(s)
}

func (m *sessionManager) clearLocked(s *concurrency.Session) {
	if m.current == s && s != nil {
		m.current = nil
		m.ready = make(chan struct{})
	}
}

// revoke ends the session at Close: keys bound to it go now rather than
// after the TTL.
func (m *sessionManager) revoke(s *concurrency.Session) {
	s.Orphan()
	m.mu.Lock()
	ctx := m.closeCtx
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if _, err := m.c.etcd.Revoke(ctx, s.Lease()); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		m.c.log.Warn("Cannot revoke kvstore session lease; its keys stay until it expires", "lease", fmt.Sprintf("%x", int64(s.Lease())), "error", err)
	}
}

// invalidate ends the session of lease id at once when etcd has said that
// the lease no longer exists (a write bound to it failed): the keep-alive
// would only notice at its next beat, up to a third of the TTL later, and
// every write until then would fail the same way.
func (m *sessionManager) invalidate(id clientv3.LeaseID) {
	m.mu.Lock()
	s := m.current
	m.mu.Unlock()
	if s != nil && s.Lease() == id {
		s.Orphan() // closes Done: run creates the next session
	}
}

// wait returns the current session, waiting for one if there is none.
func (m *sessionManager) wait(ctx context.Context) (*concurrency.Session, error) {
	for {
		m.mu.Lock()
		s := m.current
		if s != nil {
			select {
			case <-s.Done():
				// Lost, and run has not noticed yet.
				m.clearLocked(s)
				s = nil
			default:
			}
		}
		ready := m.ready
		m.mu.Unlock()
		if s != nil {
			return s, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for kvstore session: %w", ctx.Err())
		case <-m.c.ctx.Done():
			return nil, fmt.Errorf("wait for kvstore session: client closed")
		}
	}
}

// subscribe returns a channel that receives a value after each session
// renewal, and a function that ends the subscription.
func (m *sessionManager) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	m.subs[ch] = struct{}{}
	m.mu.Unlock()
	return ch, func() {
		m.mu.Lock()
		delete(m.subs, ch)
		m.mu.Unlock()
	}
}

// SessionLease returns the ID of the current session lease, waiting for a
// session if there is none (for diagnostics and tests).
func (c *Client) SessionLease(ctx context.Context) (int64, error) {
	s, err := c.sessions.wait(ctx)
	if err != nil {
		return 0, err
	}
	return int64(s.Lease()), nil
}

// SessionRenewals returns a channel that receives a value each time a new
// session replaces a lost one (keys bound to the old lease are gone and
// should be written again), and a function ending the subscription.
// Signals coalesce: a slow reader sees one for several renewals.
func (c *Client) SessionRenewals() (<-chan struct{}, func()) {
	return c.sessions.subscribe()
}
