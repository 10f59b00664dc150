// Package endpointmanager owns the node's set of endpoints: it assigns their
// 16-bit IDs (persisted, never reused while in use), finds them by every ID
// form of the Cilium v1 API, persists them, restores them after a restart and
// drives their regeneration through the Regenerator the agent plugs in.
//
// It keeps the endpoint guarantee: every endpoint converges to the current
// policy revision and its desired labels. A regeneration that fails is
// retried with a growing backoff until it succeeds, and a periodic pass
// regenerates every endpoint that is behind or whose last regeneration
// failed, so no failure is final and no change is lost because the endpoint
// was busy or not ready when it happened.
package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/ipam"
)

// Regenerator brings an endpoint's datapath in line with its desired state
// (identity, ipcache, policy, BPF programs, routes) and tears it down.
type Regenerator interface {
	// Regenerate realizes the endpoint; it may update ep (identity, policy
	// revision, enforcement) in place.
	Regenerate(ctx context.Context, ep *endpoint.Endpoint) error
	// Remove undoes Regenerate for a deleted endpoint.
	Remove(ctx context.Context, ep *endpoint.Endpoint) error
}

// NopRegenerator does nothing: an endpoint is ready as soon as it exists.
type NopRegenerator struct{}

func (NopRegenerator) Regenerate(context.Context, *endpoint.Endpoint) error { return nil }
func (NopRegenerator) Remove(context.Context, *endpoint.Endpoint) error     { return nil }

// Errors the API maps to status codes.
var (
	ErrNotFound  = errors.New("endpoint not found")
	ErrInvalidID = errors.New("invalid endpoint ID")
	ErrExists    = errors.New("endpoint already exists")
	ErrNoIDs     = errors.New("no free endpoint ID")
)

// Retry is how the manager brings failed or lagging endpoints back in line.
type Retry struct {
	// Base is the delay before the first retry of a failed regeneration;
	// it doubles with each consecutive failure up to Max.
	Base, Max time.Duration
	// FullPass is the period of the pass that regenerates every endpoint
	// that is behind the desired policy revision or failed last time.
	FullPass time.Duration
	// Workers bound how many endpoints regenerate at once.
	Workers int
}

// DefaultRetry is 100 ms doubling to 30 s, a full pass every minute, 8
// workers (a regeneration waits mostly on the kernel and the disk).
func DefaultRetry() Retry {
	return Retry{Base: 100 * time.Millisecond, Max: 30 * time.Second, FullPass: time.Minute, Workers: 8}
}

// delay is the backoff after the given number of consecutive failures.
func (r Retry) delay(failures int) time.Duration {
	d := r.Base
	for i := 1; i < failures && d < r.Max; i++ {
		d *= 2
	}
	return min(d, r.Max)
}

// Manager holds the endpoints.
type Manager struct {
	log   *slog.Logger
	store *endpoint.Store
	ipam  *ipam.IPAM
	now   func() time.Time

	mu        sync.Mutex
	regen     Regenerator
	retry     Retry
	queue     *regenQueue
	endpoints map[uint16]*endpoint.Endpoint
	// byAddr finds an endpoint by one of its addresses: the L7 proxies ask
	// it once per redirected flow, so a scan of every endpoint would cost
	// O(endpoints) on the data path. An endpoint's addresses never change
	// after Create, so the index follows endpoints' inserts and deletes.
	byAddr map[netip.Addr]uint16
	// policyRevision is the latest policy revision announced
	// (SetPolicyRevision): every endpoint must realize it.
	policyRevision uint64
	nextID         uint16
	// mark is the ID cursor as it must be on disk: ahead of every ID handed
	// out; ahead is how many more steps nextID may take before mark must
	// move (see allocateIDLocked).
	mark  uint16
	ahead int
	// cursorMu orders writes of the cursor file; persisted is the mark on
	// disk.
	cursorMu  sync.Mutex
	persisted uint16
	// regenMu serializes regenerations per endpoint.
	regenLocks map[uint16]*sync.Mutex
	listeners  []func(ev Event)
}

// EventKind says what happened to an endpoint.
type EventKind int

const (
	EventUpsert EventKind = iota
	EventDelete
)

// Event tells listeners about endpoint changes.
type Event struct {
	Kind     EventKind
	Endpoint *endpoint.Endpoint
}

// New returns a manager persisting to store and allocating from ipam.
func New(store *endpoint.Store, ipamAlloc *ipam.IPAM, log *slog.Logger) *Manager {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		log: log, store: store, ipam: ipamAlloc, now: time.Now,
		regen: NopRegenerator{}, retry: DefaultRetry(), endpoints: map[uint16]*endpoint.Endpoint{}, byAddr: map[netip.Addr]uint16{}, nextID: 1,
		regenLocks: map[uint16]*sync.Mutex{},
	}
	m.queue = newRegenQueue(func() time.Time { return m.now() })
	if data, err := store.ReadFile("next-id"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 16); err == nil && n >= 1 && n <= MaxID {
			m.nextID = uint16(n)
		}
	}
	m.mark, m.persisted = m.nextID, m.nextID
	return m
}

// SetRegenerator plugs in the datapath side.
func (m *Manager) SetRegenerator(r Regenerator) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.regen = r
}

// SetRetry changes the retry policy (tests shorten it); call it before Run.
func (m *Manager) SetRetry(r Retry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.retry = r
}

// Subscribe calls fn after each endpoint change (outside the manager's lock).
func (m *Manager) Subscribe(fn func(Event)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listeners = append(m.listeners, fn)
}

func (m *Manager) notify(ev Event) {
	m.mu.Lock()
	ls := append(([]func(Event))(nil), m.listeners...)
	m.mu.Unlock()
	for _, fn := range ls {
		fn(ev)
	}
}

// Lookup finds an endpoint by any ID form of the API: "N", "cilium-local:N",
// "container-id:X", "cni-attachment-id:X", "pod-name:NS/NAME",
// "container-name:X". It returns a copy.
func (m *Manager) Lookup(id string) (*endpoint.Endpoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ep, err := m.lookupLocked(id)
	if err != nil {
		return nil, err
	}
	return ep.Clone(), nil
}

func (m *Manager) lookupLocked(id string) (*endpoint.Endpoint, error) {
	prefix, value, hasPrefix := strings.Cut(id, ":")
	if !hasPrefix {
		prefix, value = "cilium-local", id
	}
	match := func(pred func(*endpoint.Endpoint) bool) (*endpoint.Endpoint, error) {
		for _, ep := range m.endpoints {
			if pred(ep) {
				return ep, nil
			}
		}
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	switch prefix {
	case "cilium-local":
		n, err := strconv.ParseUint(value, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("%w: %q is not a number", ErrInvalidID, id)
		}
		if ep, ok := m.endpoints[uint16(n)]; ok {
			return ep, nil
		}
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	case "container-id":
		return match(func(e *endpoint.Endpoint) bool { return e.ContainerID == value })
	case "cni-attachment-id":
		return match(func(e *endpoint.Endpoint) bool { return e.AttachmentID() == value })
	case "pod-name":
		if !strings.Contains(value, "/") {
			return nil, fmt.Errorf("%w: %q: pod-name needs namespace/name", ErrInvalidID, id)
		}
		return match(func(e *endpoint.Endpoint) bool { return e.PodKey() == value })
	case "container-name":
		return match(func(e *endpoint.Endpoint) bool { return e.ContainerName == value })
	case "docker-endpoint", "docker-net-endpoint", "ipv4", "ipv6", "cep-name":
		return nil, fmt.Errorf("%w: ID form %s: is not supported by tendril", ErrInvalidID, prefix)
	}
	return nil, fmt.Errorf("%w: unknown ID prefix %q", ErrInvalidID, prefix)
}

// AddrOwner is the local endpoint that holds an address, as the L7
// proxies name a redirected flow's sender.
type AddrOwner struct {
	EndpointID uint16
	Identity   uint32
}

// LookupAddr finds the local endpoint holding addr in constant time,
// without copying the endpoint.
func (m *Manager) LookupAddr(addr netip.Addr) (AddrOwner, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.byAddr[addr.Unmap()]
	if !ok {
		return AddrOwner{}, false
	}
	ep := m.endpoints[id]
	return AddrOwner{EndpointID: ep.ID, Identity: ep.Identity}, true
}

// Names is what a flow shows of a local endpoint.
type Names struct {
	ID                    uint16
	Identity              uint32
	PodNamespace, PodName string
	// Labels are a copy: the caller may keep them.
	Labels []string
}

// LookupNames is the endpoint of an ID as flows name it: every flow
// asks, so it copies its labels and nothing else (Lookup copies the
// whole endpoint with its log).
func (m *Manager) LookupNames(id uint16) (Names, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ep, ok := m.endpoints[id]
	if !ok {
		return Names{}, false
	}
	return Names{ID: ep.ID, Identity: ep.Identity, PodNamespace: ep.PodNamespace, PodName: ep.PodName,
		Labels: slices.Clone(ep.Labels)}, true
}

// insertLocked makes ep visible by its ID and its addresses.
func (m *Manager) insertLocked(ep *endpoint.Endpoint) {
	m.endpoints[ep.ID] = ep
	for _, a := range []netip.Addr{ep.IPv4, ep.IPv6} {
		if a.IsValid() {
			m.byAddr[a.Unmap()] = ep.ID
		}
	}
}

// removeLocked undoes insertLocked. An address index entry is removed only
// while it still names this endpoint.
func (m *Manager) removeLocked(id uint16) {
	ep, ok := m.endpoints[id]
	if !ok {
		return
	}
	delete(m.endpoints, id)
	for _, a := range []netip.Addr{ep.IPv4, ep.IPv6} {
		if a.IsValid() && m.byAddr[a.Unmap()] == id {
			delete(m.byAddr, a.Unmap())
		}
	}
}

// IsNewID reports whether id asks the agent to assign an ID ("0",
// "cilium-local:0").
func IsNewID(id string) bool {
	return id == "0" || id == "cilium-local:0"
}

// CreateOptions are the caller's wishes for a new endpoint.
type CreateOptions struct {
	// SyncBuild waits until the endpoint's datapath is ready.
	SyncBuild bool
	// ExpirationUUIDs claim IPAM allocations made with expiration.
	ExpirationUUIDs map[netip.Addr]string
	// RequestedID is a specific ID, 0 to assign one.
	RequestedID uint16
}

// Create adds an endpoint: it claims (or reserves) its addresses, persists
// it and regenerates it (waiting when SyncBuild). A failure leaves nothing
// behind: each step records what it takes in claims, and one deferred
// rollback gives it all back, newest first.
func (m *Manager) Create(ctx context.Context, ep *endpoint.Endpoint, opts CreateOptions) (_ *endpoint.Endpoint, err error) {
	// Deferred first, so it runs last: the ID cursor is on disk (or its
	// write failed) before the ID is reported, after any rollback.
	var cursorDone chan error
	defer func() {
		if cursorDone != nil {
			if err := <-cursorDone; err != nil {
				m.log.Warn("Persist endpoint ID cursor", "error", err)
			}
		}
	}()
	c := claims{mu: &m.mu}
	c.lock()
	defer func() {
		if err != nil {
			c.rollback()
		}
		if c.held {
			c.unlock()
		}
	}()

	if err := m.checkAttachmentLocked(ep); err != nil {
		return nil, err
	}
	newMark, err := m.pickIDLocked(ep, opts.RequestedID)
	if err != nil {
		return nil, err
	}
	if err := m.claimAddressesLocked(ep, opts.ExpirationUUIDs, &c); err != nil {
		return nil, err
	}
	ep.Created = m.now()
	ep.DesiredPolicyRevision = m.policyRevision
	if err := ep.SetState(endpoint.StateWaitingForIdentity, "Endpoint created", m.now()); err != nil {
		return nil, err
	}
	// Visible at once (its ID and addresses are taken); the disk writes
	// happen outside the lock so concurrent creates do not queue behind
	// each other's fsyncs.
	id := ep.ID
	m.insertLocked(ep)
	c.addLocked(func() { m.removeLocked(id) })
	snapshot := ep.Clone()
	c.unlock()
	if newMark {
		// The cursor moves on disk beside this endpoint's first state write
		// (the store commits concurrent writes together); a failure only
		// lets freed IDs come back sooner after a crash.
		cursorDone = make(chan error, 1)
		go func() { cursorDone <- m.persistCursor() }()
	}

	if opts.SyncBuild {
		// The caller waits for the build: the state is written once, after
		// it, and is on disk before Create returns. A crash during the build
		// loses an endpoint nobody was told about; its caller sees the
		// failure (a CNI ADD is retried after a DEL).
		//
		// A pod whose datapath cannot be built must not run half-wired: a
		// failure from here deletes the endpoint (datapath, addresses,
		// state) so the CNI plugin can retry from scratch.
		c.handOver(func() { _ = m.Delete(context.WithoutCancel(ctx), id) })
		if regenErr, writeErr := m.regenerate(ctx, id, "Initial build"); regenErr != nil || writeErr != nil {
			if regenErr != nil {
				return nil, fmt.Errorf("build endpoint %d: %w", id, regenErr)
			}
			return nil, fmt.Errorf("persist endpoint %d: %w", id, writeErr)
		}
		c.keep()
		m.log.Info("Endpoint created", "endpoint", id, "pod", ep.PodKey(), "ipv4", ep.IPv4, "ipv6", ep.IPv6, "interface", ep.HostIfName)
	} else {
		if err := m.store.Write(snapshot); err != nil {
			return nil, err
		}
		c.keep()
		m.log.Info("Endpoint created", "endpoint", id, "pod", ep.PodKey(), "ipv4", ep.IPv4, "ipv6", ep.IPv6, "interface", ep.HostIfName)
		// The regeneration workers (Run) build it, retrying until it
		// succeeds.
		m.queue.add(id, "Initial build", 0)
	}
	m.notify(Event{Kind: EventUpsert, Endpoint: m.mustGet(id)})
	return m.Lookup(strconv.Itoa(int(id)))
}

// checkAttachmentLocked refuses a second endpoint for one attachment
// (container and interface).
func (m *Manager) checkAttachmentLocked(ep *endpoint.Endpoint) error {
	if ep.ContainerID == "" {
		return nil
	}
	for _, other := range m.endpoints {
		if other.AttachmentID() == ep.AttachmentID() {
			return fmt.Errorf("%w: attachment %s is endpoint %d", ErrExists, ep.AttachmentID(), other.ID)
		}
	}
	return nil
}

// claimAddressesLocked claims the endpoint's addresses: it stops their
// expiration, or reserves them when the caller allocated them elsewhere
// (e.g. a restarted plugin). What it claimed or reserved is recorded in c,
// to be released if Create fails (an address it did not take, held by
// another endpoint say, stays as it is).
func (m *Manager) claimAddressesLocked(ep *endpoint.Endpoint, uuids map[netip.Addr]string, c *claims) error {
	if m.ipam == nil {
		return nil
	}
	// One claim for all: the addresses go back in the order taken.
	var taken []netip.Addr
	c.add(func() {
		for _, ip := range taken {
			_ = m.ipam.Release(ip)
		}
	})
	for _, ip := range ep.Addresses() {
		if alloc, ok := m.ipam.Lookup(ip); ok {
			if alloc.Claimed {
				return fmt.Errorf("%w: address %s is held by another endpoint", ErrExists, ip)
			}
			if err := m.ipam.Claim(ip, uuids[ip]); err != nil {
				return fmt.Errorf("claim address %s: %w", ip, err)
			}
			taken = append(taken, ip)
			continue
		}
		if _, err := m.ipam.Allocate(ip, ep.IPAMOwner()); err != nil {
			return fmt.Errorf("reserve address %s: %w", ip, err)
		}
		_ = m.ipam.Claim(ip, "")
		taken = append(taken, ip)
	}
	return nil
}

func (m *Manager) mustGet(id uint16) *endpoint.Endpoint {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ep, ok := m.endpoints[id]; ok {
		return ep.Clone()
	}
	return nil
}

func (m *Manager) regenLock(id uint16) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.regenLocks[id]
	if !ok {
		l = &sync.Mutex{}
		m.regenLocks[id] = l
	}
	return l
}

// Regenerate runs the regenerator on the endpoint and records the outcome.
// A failure to persist the outcome is logged; the endpoint keeps running.
func (m *Manager) Regenerate(ctx context.Context, id uint16, reason string) error {
	regenErr, writeErr := m.regenerate(ctx, id, reason)
	if writeErr != nil {
		m.log.Error("Persist endpoint", "endpoint", id, "error", writeErr)
	}
	return regenErr
}

// regenerate is Regenerate returning the regeneration's and the state
// write's errors apart.
func (m *Manager) regenerate(ctx context.Context, id uint16, reason string) (regenErr, writeErr error) {
	lock := m.regenLock(id)
	lock.Lock()
	defer lock.Unlock()

	m.mu.Lock()
	ep, ok := m.endpoints[id]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("%w: %d", ErrNotFound, id), nil
	}
	if ep.State == endpoint.StateDisconnecting || ep.State == endpoint.StateDisconnected {
		m.mu.Unlock()
		return nil, nil
	}
	if ep.State != endpoint.StateWaitingToRegenerate && ep.State != endpoint.StateRestoring {
		if err := ep.SetState(endpoint.StateWaitingToRegenerate, reason, m.now()); err != nil {
			m.mu.Unlock()
			return err, nil
		}
	}
	if err := ep.SetState(endpoint.StateRegenerating, "Regenerating: "+reason, m.now()); err != nil {
		m.mu.Unlock()
		return err, nil
	}
	work := ep.Clone()
	regen := m.regen
	m.mu.Unlock()

	err := regen.Regenerate(ctx, work)

	m.mu.Lock()
	ep, ok = m.endpoints[id]
	if !ok || ep.State != endpoint.StateRegenerating {
		m.mu.Unlock()
		return nil, nil // deleted meanwhile
	}
	// Take over what the regenerator computed. The labels stay: they are
	// the desired ones, and SetLabels may have changed them meanwhile (a
	// regeneration for them is queued then).
	ep.Identity, ep.PolicyRevision = work.Identity, work.PolicyRevision
	ep.EnforceIngress, ep.EnforceEgress = work.EnforceIngress, work.EnforceEgress
	if ep.HostIfIndex == 0 {
		ep.HostIfIndex = work.HostIfIndex
	}
	ep.RecordRegeneration(err, m.now())
	if err != nil {
		_ = ep.SetState(endpoint.StateNotReady, "Regeneration failed: "+err.Error(), m.now())
		ep.LogFailure(err.Error(), m.now())
	} else {
		_ = ep.SetState(endpoint.StateReady, "Completed endpoint regeneration", m.now())
	}
	snapshot := ep.Clone()
	m.mu.Unlock()
	m.scheduleFollowUp(snapshot)
	// The per-endpoint regeneration lock (held) orders this endpoint's
	// writes; other endpoints do not wait for this fsync.
	return err, m.store.Write(snapshot)
}

// scheduleFollowUp queues what an endpoint still needs after a
// regeneration or refresh: a retry after the backoff when it failed, one
// at once when it succeeded but realized an older policy revision than the
// one announced meanwhile.
func (m *Manager) scheduleFollowUp(ep *endpoint.Endpoint) {
	m.mu.Lock()
	retry := m.retry
	m.mu.Unlock()
	switch {
	case ep.LastRegenerationError != "":
		delay := retry.delay(ep.Regeneration.ConsecutiveFailures)
		m.log.Warn("Endpoint regeneration failed; retrying", "endpoint", ep.ID, "pod", ep.PodKey(),
			"failures", ep.Regeneration.ConsecutiveFailures, "retry-in", delay, "error", ep.LastRegenerationError)
		m.queue.add(ep.ID, "Retry after failure: "+ep.LastRegenerationError, delay)
	case ep.PolicyRevision < ep.DesiredPolicyRevision:
		m.queue.add(ep.ID, fmt.Sprintf("Policy revision %d realized, %d wanted", ep.PolicyRevision, ep.DesiredPolicyRevision), 0)
	}
}

// Update applies fn to the endpoint, persists it and regenerates it.
func (m *Manager) Update(ctx context.Context, id string, reason string, fn func(*endpoint.Endpoint) error) (*endpoint.Endpoint, error) {
	m.mu.Lock()
	ep, err := m.lookupLocked(id)
	if err != nil {
		m.mu.Unlock()
		return nil, err
	}
	work := ep.Clone()
	if err := fn(work); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	work.State, work.Log = ep.State, ep.Log
	*ep = *work
	numeric := ep.ID
	m.mu.Unlock()
	// The regeneration persists the updated endpoint (under its
	// regeneration lock, outside the manager's).
	if err := m.Regenerate(ctx, numeric, reason); err != nil {
		return nil, err
	}
	m.notify(Event{Kind: EventUpsert, Endpoint: m.mustGet(numeric)})
	return m.Lookup(strconv.Itoa(int(numeric)))
}

// Delete removes an endpoint: tears down its datapath, releases its
// addresses and removes its state. It answers ErrNotFound for an unknown ID.
func (m *Manager) Delete(ctx context.Context, id uint16) error {
	lock := m.regenLock(id)
	lock.Lock()
	defer lock.Unlock()
	m.mu.Lock()
	ep, ok := m.endpoints[id]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	_ = ep.SetState(endpoint.StateDisconnecting, "Deleting endpoint", m.now())
	work := ep.Clone()
	regen := m.regen
	m.mu.Unlock()

	var errs []error
	if err := regen.Remove(ctx, work); err != nil {
		errs = append(errs, fmt.Errorf("remove datapath of endpoint %d: %w", id, err))
	}
	if m.ipam != nil {
		for _, ip := range work.Addresses() {
			if err := m.ipam.Release(ip); err != nil && !errors.Is(err, ipam.ErrNotAllocated) {
				errs = append(errs, err)
			}
		}
	}
	if err := m.store.Remove(id); err != nil {
		errs = append(errs, err)
	}
	m.queue.remove(id)
	m.mu.Lock()
	_ = ep.SetState(endpoint.StateDisconnected, "Endpoint deleted", m.now())
	m.removeLocked(id)
	delete(m.regenLocks, id)
	m.mu.Unlock()
	m.log.Info("Endpoint deleted", "endpoint", id, "pod", work.PodKey())
	m.notify(Event{Kind: EventDelete, Endpoint: work})
	return errors.Join(errs...)
}

// DeleteByContainerID deletes every endpoint of a container and returns how
// many there were.
func (m *Manager) DeleteByContainerID(ctx context.Context, containerID string) (int, error) {
	var ids []uint16
	m.mu.Lock()
	for id, ep := range m.endpoints {
		if ep.ContainerID == containerID {
			ids = append(ids, id)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := m.Delete(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return len(ids), errors.Join(errs...)
}

// List returns copies of all endpoints, sorted by ID.
func (m *Manager) List() []*endpoint.Endpoint {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*endpoint.Endpoint, 0, len(m.endpoints))
	for _, ep := range m.endpoints {
		out = append(out, ep.Clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Refresh is the light path for policy changes (no re-attachment, no host
// networking): it runs fn on a copy of a ready endpoint under its
// regeneration lock and takes over its policy fields (identity, revision,
// enforcement); the state is written only when they changed. An endpoint
// that is not ready, or whose last regeneration failed, gets a full
// regeneration instead (queued unless one is queued or running already: it
// resolves the policy current when it runs). When fn fails, the endpoint
// waits for a full regeneration, retried with backoff.
func (m *Manager) Refresh(ctx context.Context, id uint16, fn func(*endpoint.Endpoint) error) error {
	lock := m.regenLock(id)
	lock.Lock()
	defer lock.Unlock()
	m.mu.Lock()
	ep, ok := m.endpoints[id]
	if !ok || ep.State == endpoint.StateDisconnecting || ep.State == endpoint.StateDisconnected {
		m.mu.Unlock()
		return nil
	}
	if ep.State != endpoint.StateReady || ep.LastRegenerationError != "" {
		m.mu.Unlock()
		m.queue.ensure(id, "Policy changed while the endpoint was not ready")
		return nil
	}
	work := ep.Clone()
	m.mu.Unlock()
	err := fn(work)
	m.mu.Lock()
	ep, ok = m.endpoints[id]
	if !ok || ep.State != endpoint.StateReady {
		m.mu.Unlock()
		return nil
	}
	changed := ep.EnforceIngress != work.EnforceIngress || ep.EnforceEgress != work.EnforceEgress || ep.Identity != work.Identity
	ep.PolicyRevision = work.PolicyRevision
	ep.EnforceIngress, ep.EnforceEgress, ep.Identity = work.EnforceIngress, work.EnforceEgress, work.Identity
	ep.RecordRegeneration(err, m.now())
	if err != nil {
		// The datapath may hold part of the change: a full regeneration
		// (retried until it succeeds) brings it in line.
		changed = true
		_ = ep.SetState(endpoint.StateWaitingToRegenerate, "Policy update failed: "+err.Error(), m.now())
		ep.LogFailure(err.Error(), m.now())
	}
	snapshot := ep.Clone()
	m.mu.Unlock()
	m.scheduleFollowUp(snapshot)
	if err != nil {
		if werr := m.store.Write(snapshot); werr != nil {
			m.log.Error("Persist endpoint", "endpoint", id, "error", werr)
		}
		return fmt.Errorf("refresh policy of endpoint %d: %w", id, err)
	}
	if changed {
		return m.store.Write(snapshot)
	}
	return nil
}

// SetPolicyRevision announces a policy revision: every endpoint (and every
// endpoint created from now on) must realize it. The caller then refreshes
// the endpoints; those that cannot take the change now catch up through
// their regeneration.
func (m *Manager) SetPolicyRevision(rev uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rev > m.policyRevision {
		m.policyRevision = rev
	}
	for _, ep := range m.endpoints {
		if ep.DesiredPolicyRevision < m.policyRevision {
			ep.DesiredPolicyRevision = m.policyRevision
		}
	}
}

// PolicyRevision is the latest policy revision announced.
func (m *Manager) PolicyRevision() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.policyRevision
}

// SetLabels records the labels an endpoint must have (from its pod and
// namespace) and queues its regeneration, which allocates the identity and
// realizes the policy, retried until it succeeds. It does not wait and
// reports whether the labels changed: what a watcher callback may call.
func (m *Manager) SetLabels(id uint16, labels []string, reason string) (bool, error) {
	labels = endpoint.SortedLabels(labels)
	m.mu.Lock()
	ep, ok := m.endpoints[id]
	if !ok {
		m.mu.Unlock()
		return false, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	if slices.Equal(ep.Labels, labels) {
		m.mu.Unlock()
		return false, nil
	}
	ep.Labels = labels
	if ep.State == endpoint.StateReady || ep.State == endpoint.StateNotReady {
		// Not converged until the labels are realized.
		_ = ep.SetState(endpoint.StateWaitingToRegenerate, reason, m.now())
	}
	m.mu.Unlock()
	m.queue.add(id, reason, 0)
	return true, nil
}

// Requeue queues a full regeneration of an endpoint that must resolve
// again what it holds (its identity was revoked, say), after the one
// running if any: what a callback may call, it does not wait. An unknown
// endpoint is ignored.
func (m *Manager) Requeue(id uint16, reason string) {
	m.mu.Lock()
	ep, ok := m.endpoints[id]
	if !ok {
		m.mu.Unlock()
		return
	}
	if ep.State == endpoint.StateReady || ep.State == endpoint.StateNotReady {
		_ = ep.SetState(endpoint.StateWaitingToRegenerate, reason, m.now())
	}
	m.mu.Unlock()
	m.queue.add(id, reason, 0)
}

// Run regenerates the queued endpoints with the retry policy's workers and
// runs the periodic full pass, until ctx ends; it returns once every worker
// has stopped.
func (m *Manager) Run(ctx context.Context) {
	m.mu.Lock()
	retry := m.retry
	m.mu.Unlock()
	var wg sync.WaitGroup
	for range max(retry.Workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.work(ctx)
		}()
	}
	if retry.FullPass > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(retry.FullPass)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					m.FullPass()
				}
			}
		}()
	}
	wg.Wait()
}

// work regenerates queued endpoints until ctx ends.
func (m *Manager) work(ctx context.Context) {
	for {
		id, reason, ok := m.queue.get(ctx)
		if !ok {
			return
		}
		before := m.mustGet(id)
		err := m.Regenerate(ctx, id, reason)
		m.queue.done(id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		// Publishers (ipcache, TendrilEndpoint) follow identity and label
		// changes.
		if after := m.mustGet(id); after != nil && before != nil &&
			(after.Identity != before.Identity || !slices.Equal(after.Labels, before.Labels) || after.State != before.State) {
			m.notify(Event{Kind: EventUpsert, Endpoint: after})
		}
	}
}

// FullPass queues every endpoint that has not converged: behind the
// desired policy revision, failed last time, or not ready, unless it is
// queued or being regenerated already. It returns how many it queued.
func (m *Manager) FullPass() int {
	n := 0
	for _, ep := range m.List() {
		if ep.Converged() || ep.State == endpoint.StateDisconnecting || ep.State == endpoint.StateDisconnected {
			continue
		}
		if _, waiting, busy := m.queue.state(ep.ID); waiting || busy {
			continue
		}
		m.queue.add(ep.ID, "Periodic pass: endpoint not converged", 0)
		n++
	}
	if n > 0 {
		m.log.Info("Periodic pass queued endpoints that had not converged", "endpoints", n)
	}
	return n
}

// Convergence counts the endpoints against the announced policy revision.
type Convergence struct {
	Endpoints int
	// Converged endpoints are ready, realize their desired revision and
	// their last regeneration succeeded.
	Converged int
	// Failing are endpoints whose last regeneration failed (retried).
	Failing int
	// Pending are the others not converged: behind the revision, or not
	// built yet.
	Pending        int
	PolicyRevision uint64
}

// Convergence reports how many endpoints have not yet realized what they
// should.
func (m *Manager) Convergence() Convergence {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := Convergence{Endpoints: len(m.endpoints), PolicyRevision: m.policyRevision}
	for _, ep := range m.endpoints {
		switch {
		case ep.Converged():
			c.Converged++
		case ep.LastRegenerationError != "":
			c.Failing++
		default:
			c.Pending++
		}
	}
	return c
}
