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
// written only in a transaction that finds the master key, so a reference
// never points at a collected identity.
package kvalloc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
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

// Allocator is the kvstore identity allocator of one node.
type Allocator struct {
	*identity.ClusterCache
	kv      *kvstore.Client
	node    string
	log     *slog.Logger
	timeout time.Duration
	synced  chan struct{}
}

// New returns an allocator for node; Run keeps its view of the cluster's
// identities current. kv may be nil until SetClient (the agent connects to
// the kvstore after building its modules).
func New(kv *kvstore.Client, node string, log *slog.Logger) *Allocator {
	return &Allocator{ClusterCache: identity.NewClusterCache(), kv: kv, node: node, log: log, timeout: 10 * time.Second,
		synced: make(chan struct{})}
}

// SetClient sets the kvstore client before Run and the first allocation.
func (a *Allocator) SetClient(kv *kvstore.Client) { a.kv = kv }

// LabelsHash is the hash naming a label set's index and value keys (key
// is identity.LabelsKey of the sorted labels, the master key's value).
func LabelsHash(key string) string { return hashOf(key) }

func hashOf(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Run watches the master keys until ctx ends; a value that does not parse
// is logged and skipped, the watch goes on.
func (a *Allocator) Run(ctx context.Context) {
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
		case kvstore.EventDelete:
			id, err := strconv.ParseUint(strings.TrimPrefix(ev.Key, IDPrefix), 10, 32)
			if err == nil {
				a.Forget(identity.NumericIdentity(id))
			}
		}
	}
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
	n := a.Ref(id)
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
// while the identity's master key exists (exists reports it).
func (a *Allocator) reference(ctx context.Context, key string, id identity.NumericIdentity) (exists bool, err error) {
	vk := ValuePrefix + hashOf(key) + "/" + a.node
	_, exists, err = a.kv.UpdateIfMissingWhileExists(ctx, vk, []byte(strconv.Itoa(int(id))), kvstore.SessionLease, IDPrefix+strconv.Itoa(int(id)))
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
	last, err := a.Unref(id)
	if err != nil || !last {
		return err
	}
	labels, _ := a.LabelsOf(id)
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	vk := ValuePrefix + hashOf(identity.LabelsKey(labels)) + "/" + a.node
	if err := a.kv.Delete(ctx, vk); err != nil {
		return fmt.Errorf("release identity %d: %w", id, err)
	}
	return nil
}

// Reserve takes a reference on a restored endpoint's identity; it fails
// when the cluster gives these labels another ID.
func (a *Allocator) Reserve(id identity.NumericIdentity, labels []string) error {
	got, _, err := a.Allocate(labels)
	if err != nil {
		return err
	}
	if got.ID != id {
		_ = a.Release(got.ID)
		return fmt.Errorf("reserve identity %d: the cluster has these labels as %d", id, got.ID)
	}
	return nil
}

var _ identity.Allocator = (*Allocator)(nil)
