// Package kvalloc allocates cluster-wide security identities in the
// kvstore (etcd), the kvstore identity allocation mode:
//
//	tendril/state/identities/v1/id/<ID>                 → labels (master key)
//	tendril/state/identities/v1/labels/<sha256(labels)> → ID (one per label set)
//	tendril/state/identities/v1/value/<sha256>/<node>   → ID (this node's reference, on its session lease)
//
// A new label set takes a free ID by creating its master key (create-only,
// so two label sets never share an ID), then claims the label set's index
// key (create-only, so one label set never gets two IDs: the loser of a
// race drops its master key and uses the winner's ID). References are
// value keys bound to the node's session lease: a node that dies stops
// holding its identities when its lease expires. Unreferenced master keys
// are the operator's to collect: it deletes a master key (with its index
// key) only in a transaction that finds no value key, and a value key is
// written only in a transaction that finds the master key holding the
// reference's labels, so a reference never points at a collected identity
// nor at its number reused by another label set.
//
// A reference lives on the session lease, so it goes when the lease does
// (etcd out of reach longer than the TTL, or revoked): the agent's
// endpoints still use the identity, but the cluster no longer sees that.
// After every new session (and every resync interval, and when the watch
// sees a held identity's master key go or change) the allocator writes
// each reference again; a master key the GC collected meanwhile is created
// again with the same number and labels. If the number went to another
// label set meanwhile, the references are revoked (identity.ClusterCache
// Revoke): the users of the number allocate their labels again and get a
// number that means them. Keeping the old number is never an option then:
// every other node maps it to the other labels.
package kvalloc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/kvstore"
)

// Key prefixes.
const (
	Prefix       = kvstore.StatePrefix + "identities/v1/"
	IDPrefix     = Prefix + "id/"
	LabelsPrefix = Prefix + "labels/"
	ValuePrefix  = Prefix + "value/"
)

// maxAttempts bounds the search for a free ID.
const maxAttempts = 64

// DefaultResyncInterval is how often every reference is checked and
// written again if missing, besides after each new session.
const DefaultResyncInterval = 5 * time.Minute

// stripes is the number of locks ordering the writes and deletes of one
// label set's reference (per label set, not one for all: allocations of
// different label sets proceed in parallel).
const stripes = 64

// Allocator is the kvstore identity allocator of one node.
type Allocator struct {
	*identity.ClusterCache
	kv      *kvstore.Client
	node    string
	log     *slog.Logger
	timeout time.Duration
	synced  chan struct{}
	// resyncInterval is DefaultResyncInterval unless a test sets it.
	resyncInterval time.Duration
	// resync asks the keeper to check the references now.
	resync chan struct{}
	// locks order, per label set, taking the first reference (write the
	// value key, count it), dropping the last (uncount, delete it) and
	// writing it again after a lost session, so that no value key
	// outlives its last local user and none is missing while one exists.
	locks [stripes]sync.Mutex
}

// New returns an allocator for node; Run keeps its view of the cluster's
// identities current. kv may be nil until SetClient (the agent connects to
// the kvstore after building its modules).
func New(kv *kvstore.Client, node string, log *slog.Logger) *Allocator {
	return &Allocator{ClusterCache: identity.NewClusterCache(), kv: kv, node: node, log: log, timeout: 10 * time.Second,
		synced: make(chan struct{}), resyncInterval: DefaultResyncInterval, resync: make(chan struct{}, 1)}
}

// lockFor returns the lock of a label set's reference.
func (a *Allocator) lockFor(key string) *sync.Mutex {
	h := sha256.Sum256([]byte(key))
	return &a.locks[int(h[0])%stripes]
}

// valueKey is this node's reference key of a label set.
func (a *Allocator) valueKey(key string) string { return ValuePrefix + hashOf(key) + "/" + a.node }

// SetClient sets the kvstore client before Run and the first allocation.
func (a *Allocator) SetClient(kv *kvstore.Client) { a.kv = kv }

// LabelsHash is the hash naming a label set's index and value keys (key
// is identity.LabelsKey of the sorted labels, the master key's value).
func LabelsHash(key string) string { return hashOf(key) }

func hashOf(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Run watches the master keys and keeps this node's references written
// until ctx ends; a value that does not parse is logged and skipped, the
// watch goes on.
func (a *Allocator) Run(ctx context.Context) {
	renewals, unsubscribe := a.kv.SessionRenewals()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer unsubscribe()
		a.keepReferences(ctx, renewals)
	}()
	defer wg.Wait()
	for ev := range a.kv.ListAndWatch(ctx, IDPrefix) {
		switch ev.Type {
		case kvstore.EventListDone:
			close(a.synced)
		case kvstore.EventCreate, kvstore.EventModify:
			id, err := strconv.ParseUint(strings.TrimPrefix(ev.Key, IDPrefix), 10, 32)
			if err != nil || !identity.NumericIdentity(id).IsCluster() || len(ev.Value) == 0 {
				a.log.Warn("Skipping a malformed identity key", "key", ev.Key, "value", string(ev.Value))
				continue
			}
			labels := strings.Split(string(ev.Value), ";")
			if err := identity.CheckLabels(labels); err != nil {
				a.log.Warn("Skipping an identity key with a malformed label", "key", ev.Key, "value", string(ev.Value), "error", err)
				continue
			}
			a.Learn(identity.NumericIdentity(id), labels)
			if key, held := a.BoundLabels(identity.NumericIdentity(id)); held && key != string(ev.Value) {
				// Our number now names other labels: revoke (keeper).
				a.triggerResync()
			}
		case kvstore.EventDelete:
			id, err := strconv.ParseUint(strings.TrimPrefix(ev.Key, IDPrefix), 10, 32)
			if err == nil {
				a.Forget(identity.NumericIdentity(id))
				if _, held := a.BoundLabels(identity.NumericIdentity(id)); held {
					// Collected (or removed by hand) while in use here:
					// the keeper creates it again.
					a.triggerResync()
				}
			}
		}
	}
}

func (a *Allocator) triggerResync() {
	select {
	case a.resync <- struct{}{}:
	default:
	}
}

// keepReferences writes the references again after each new session
// (the old lease took them), when the watch asks, and every resync
// interval; a failed pass is retried with backoff.
func (a *Allocator) keepReferences(ctx context.Context, renewals <-chan struct{}) {
	t := time.NewTicker(a.resyncInterval)
	defer t.Stop()
	const retryMin, retryMax = 200 * time.Millisecond, 10 * time.Second
	delay := retryMin
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-renewals:
			a.log.Info("New kvstore session; writing this node's identity references again")
		case <-a.resync:
		case <-t.C:
		case <-retry:
		}
		retry = nil
		if err := a.restoreReferences(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			a.log.Warn("Cannot write this node's identity references; retrying", "retry-in", delay, "error", err)
			retry = time.After(delay)
			delay = min(delay*2, retryMax)
			continue
		}
		delay = retryMin
	}
}

// restoreReferences writes every reference this node holds that is
// missing, re-creating a collected master key, and revokes the ones whose
// number another label set took.
func (a *Allocator) restoreReferences(ctx context.Context) error {
	var errs []error
	for _, h := range a.Held() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := a.restoreReference(ctx, h.ID, h.LabelsKey); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (a *Allocator) restoreReference(ctx context.Context, id identity.NumericIdentity, key string) error {
	mu := a.lockFor(key)
	mu.Lock()
	defer mu.Unlock()
	if cur, held := a.BoundLabels(id); !held || cur != key {
		return nil // released (or revoked) meanwhile
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	master := IDPrefix + strconv.Itoa(int(id))
	for round := 0; round < 3; round++ {
		wrote, holds, err := a.kv.UpdateIfMissingWhileHolds(ctx, a.valueKey(key), []byte(strconv.Itoa(int(id))), kvstore.SessionLease, master, []byte(key))
		if err != nil {
			return fmt.Errorf("restore reference to identity %d: %w", id, err)
		}
		if holds {
			if wrote {
				a.log.Info("Wrote a lost identity reference again", "identity", id, "labels", key)
			}
			return a.ensureIndex(ctx, id, key)
		}
		kv, found, err := a.kv.Get(ctx, master)
		if err != nil {
			return fmt.Errorf("restore identity %d: %w", id, err)
		}
		if found && string(kv.Value) != key {
			// Collected while this node could not hold it, and taken by
			// another label set: every other node maps the number to
			// those labels now. Fail closed: the local users resolve
			// their labels again (a new number), and the number is not
			// referenced for these labels.
			a.log.Warn("Identity was collected and reused for other labels while this node's references were lost; its endpoints get a new identity",
				"identity", id, "labels", key, "now", string(kv.Value))
			a.Revoke(id, key)
			return nil
		}
		if !found {
			created, err := a.kv.CreateOnly(ctx, master, []byte(key), kvstore.NoLease)
			if err != nil {
				return fmt.Errorf("re-create identity %d: %w", id, err)
			}
			if created {
				a.log.Warn("Identity in use here was collected while this node's references were lost; created it again with the same number",
					"identity", id, "labels", key)
			}
		}
	}
	return fmt.Errorf("restore identity %d: its master key changes under us", id)
}

// ensureIndex puts back the label set's index key after its master key
// was re-created: other nodes allocating these labels then find this
// number. If the labels got another number meanwhile, the index names
// that one and stays: both numbers mean the same labels.
func (a *Allocator) ensureIndex(ctx context.Context, id identity.NumericIdentity, key string) error {
	index := LabelsPrefix + hashOf(key)
	created, err := a.kv.CreateOnly(ctx, index, []byte(strconv.Itoa(int(id))), kvstore.NoLease)
	if err != nil {
		return fmt.Errorf("restore identity %d: index: %w", id, err)
	}
	if created {
		a.log.Info("Wrote a lost identity index key again", "identity", id, "labels", key)
	}
	return nil
}

// WaitSynced waits for the first complete list of identities.
func (a *Allocator) WaitSynced(ctx context.Context) error {
	select {
	case <-a.synced:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("identities from the kvstore: %w", ctx.Err())
	}
}

// Allocate returns the cluster identity of labels, creating it when the
// cluster has none, and records this node's reference.
func (a *Allocator) Allocate(labels []string) (identity.Identity, bool, error) {
	if err := identity.CheckLabels(labels); err != nil {
		return identity.Identity{}, false, fmt.Errorf("allocate identity: %w", err)
	}
	sorted := append([]string(nil), labels...)
	sort.Strings(sorted)
	key := identity.LabelsKey(sorted)
	mu := a.lockFor(key)
	mu.Lock()
	defer mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	var id identity.NumericIdentity
	var created bool
	// The reference is written only while the master key exists; the
	// operator deletes a master key only while no reference exists. When
	// the operator wins, the label set's keys are gone and the second
	// round allocates anew.
	for round := 0; ; round++ {
		var err error
		id, created, err = a.lookupOrCreate(ctx, key)
		if err != nil {
			return identity.Identity{}, false, err
		}
		exists, err := a.reference(ctx, key, id)
		if err != nil {
			return identity.Identity{}, false, err
		}
		if exists {
			break
		}
		if round == 2 {
			return identity.Identity{}, false, fmt.Errorf("allocate identity: %d collected under us three times", id)
		}
		a.log.Info("Identity was collected while referencing it, allocating again", "identity", id)
	}
	a.Learn(id, sorted)
	n := a.RefAs(id, sorted)
	if created {
		a.log.Info("Allocated identity", "identity", id, "labels", key)
	}
	return identity.Identity{ID: id, Labels: sorted, RefCount: n}, created, nil
}

// lookupOrCreate finds the label set's ID through its index key, or
// creates master and index keys.
func (a *Allocator) lookupOrCreate(ctx context.Context, key string) (identity.NumericIdentity, bool, error) {
	index := LabelsPrefix + hashOf(key)
	if kv, found, err := a.kv.Get(ctx, index); err != nil {
		return 0, false, fmt.Errorf("allocate identity: read %s: %w", index, err)
	} else if found {
		id, err := parseID(kv.Value)
		if err != nil {
			return 0, false, fmt.Errorf("allocate identity: index %s: %w", index, err)
		}
		return id, false, nil
	}
	span := int(identity.MaxCluster-identity.MinCluster) + 1
	for attempt := 0; attempt < maxAttempts; attempt++ {
		id := identity.MinCluster + identity.NumericIdentity(rand.IntN(span))
		if _, taken := a.LabelsOf(id); taken {
			continue
		}
		ok, err := a.kv.CreateOnly(ctx, IDPrefix+strconv.Itoa(int(id)), []byte(key), kvstore.NoLease)
		if err != nil {
			return 0, false, fmt.Errorf("allocate identity %d: %w", id, err)
		}
		if !ok {
			continue // the ID is someone else's
		}
		won, err := a.kv.CreateOnly(ctx, index, []byte(strconv.Itoa(int(id))), kvstore.NoLease)
		if err != nil {
			return 0, false, fmt.Errorf("allocate identity %d: claim labels: %w", id, err)
		}
		if won {
			return id, true, nil
		}
		// Another node claimed the label set meanwhile: use its ID and
		// drop the master key just made.
		if err := a.kv.Delete(ctx, IDPrefix+strconv.Itoa(int(id))); err != nil {
			a.log.Warn("Remove an identity lost in a race", "identity", id, "error", err)
		}
		kv, found, err := a.kv.Get(ctx, index)
		if err != nil || !found {
			return 0, false, fmt.Errorf("allocate identity: re-read %s: found=%v: %v", index, found, err)
		}
		theirs, err := parseID(kv.Value)
		return theirs, false, err
	}
	return 0, false, identity.ErrExhausted
}

// reference writes this node's value key on its session lease, only
// while the identity's master key exists and names these labels (exists
// reports it).
func (a *Allocator) reference(ctx context.Context, key string, id identity.NumericIdentity) (exists bool, err error) {
	_, exists, err = a.kv.UpdateIfMissingWhileHolds(ctx, a.valueKey(key), []byte(strconv.Itoa(int(id))), kvstore.SessionLease, IDPrefix+strconv.Itoa(int(id)), []byte(key))
	if err != nil {
		return false, fmt.Errorf("reference identity %d: %w", id, err)
	}
	return exists, nil
}

func parseID(b []byte) (identity.NumericIdentity, error) {
	n, err := strconv.ParseUint(string(b), 10, 32)
	if err != nil || !identity.NumericIdentity(n).IsCluster() {
		return 0, fmt.Errorf("value %q is not a cluster identity", b)
	}
	return identity.NumericIdentity(n), nil
}

// Release drops a reference; the node's value key goes with the last.
func (a *Allocator) Release(id identity.NumericIdentity) error {
	key, held := a.BoundLabels(id)
	if !held {
		_, err := a.Unref(id) // the not-held error
		return err
	}
	mu := a.lockFor(key)
	mu.Lock()
	defer mu.Unlock()
	last, err := a.Unref(id)
	if err != nil || !last {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	if err := a.kv.Delete(ctx, a.valueKey(key)); err != nil {
		return fmt.Errorf("release identity %d: %w", id, err)
	}
	return nil
}

// Reserve takes a reference on a restored endpoint's identity; it fails
// when the cluster gives these labels another number (identity.Reserve).
func (a *Allocator) Reserve(id identity.NumericIdentity, labels []string) error {
	return identity.ReserveByAllocating(a, id, labels)
}

var _ identity.Allocator = (*Allocator)(nil)
