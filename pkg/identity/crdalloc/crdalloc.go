// Package crdalloc allocates cluster-wide security identities as
// TendrilIdentity objects (the CRD identity allocation mode): the object's
// name is the numeric identity, its security-labels the label set. The
// first candidate number is derived from the labels' hash and collisions
// probe onwards in a fixed order, so agents allocating the same label set
// at once try the same numbers: one create wins, the others get
// AlreadyExists, re-read the object, find their labels and use it. Two IDs
// for one label set never arise from a race.
//
// An identity this node uses must not disappear: Run recreates, with the
// same number and labels, every identity the watcher reports deleted
// while a local endpoint holds it (the GC collected it because nothing
// it counts showed the use, or someone deleted it by hand). If the number
// was taken by other labels meanwhile, the local references are revoked
// and the users allocate again (fail closed: the number means the other
// labels everywhere else). Run also publishes the numbers this node holds
// in its TendrilNode's AnnotationIdentitiesInUse, the evidence the
// operator's GC counts besides TendrilEndpoints: an endpoint without a
// pod, or whose TendrilEndpoint cannot be written, still keeps its
// identity.
package crdalloc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tendril-net/tendril/pkg/identity"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilclient "github.com/tendril-net/tendril/pkg/k8s/client/clientset/versioned"
)

// AnnotationUnusedSince is set by the operator's identity GC on an
// identity no TendrilEndpoint uses, with the time it first saw it unused
// (RFC 3339). An agent that starts using such an identity removes it
// (claim); the GC deletes an identity only with the resourceVersion it
// marked, so a claim in between makes the delete fail.
const AnnotationUnusedSince = "tendril.io/identity-unused-since"

// AnnotationIdentitiesInUse is set by each agent on its own TendrilNode:
// the cluster identities its endpoints hold, as sorted decimal numbers
// separated by commas. The identity GC keeps every identity an existing
// TendrilNode lists (and ignores entries that are not cluster identity
// numbers).
const AnnotationIdentitiesInUse = "tendril.io/identities-in-use"

// DefaultResyncInterval is how often Run retries what it could not do
// (recreate an identity, publish the annotation) without a new trigger.
const DefaultResyncInterval = time.Minute

// maxProbes bounds the search for a free number; the range holds 65,280.
const maxProbes = 4096

// Allocator is a cluster-wide identity allocator backed by TendrilIdentity
// objects. It knows every identity of the cluster (fed by the watcher
// through Upsert and Delete) and counts this node's references.
type Allocator struct {
	*identity.ClusterCache
	log     *slog.Logger
	timeout time.Duration

	mu     sync.Mutex
	client tendrilclient.Interface
	node   string
	// gone are held identities whose object the watcher saw deleted or
	// given other labels, with the labels key they are held for: Run
	// recreates (or revokes) them.
	gone map[identity.NumericIdentity]string
	// published is the annotation value last written ("" before any).
	published      string
	publishedOnce  bool
	resync         chan struct{}
	resyncInterval time.Duration
}

// New returns an allocator without a client; SetClient gives it one
// before the first allocation (the agent builds its clients at start).
func New(log *slog.Logger) *Allocator {
	a := &Allocator{ClusterCache: identity.NewClusterCache(), log: log, timeout: 10 * time.Second,
		gone: map[identity.NumericIdentity]string{}, resync: make(chan struct{}, 1), resyncInterval: DefaultResyncInterval}
	// The set of held numbers may have changed: publish it (Run).
	a.SubscribeReferences(func(identity.NumericIdentity) { a.trigger() })
	return a
}

// SetNode names this node's TendrilNode, where Run publishes the
// identities in use (none: not published).
func (a *Allocator) SetNode(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.node = name
}

func (a *Allocator) trigger() {
	select {
	case a.resync <- struct{}{}:
	default:
	}
}

// SetClient sets the API client.
func (a *Allocator) SetClient(c tendrilclient.Interface) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.client = c
}

// SecurityLabels turns "source:key=value" labels into the object's map.
func SecurityLabels(labels []string) map[string]string {
	out := make(map[string]string, len(labels))
	for _, l := range labels {
		k, v, _ := strings.Cut(l, "=")
		out[k] = v
	}
	return out
}

// LabelsOf turns an object's security-labels back into sorted labels.
func LabelsOf(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// candidate is the n-th number to try for a label set.
func candidate(key string, n int) identity.NumericIdentity {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	span := uint64(identity.MaxCluster-identity.MinCluster) + 1
	return identity.MinCluster + identity.NumericIdentity((h.Sum64()+uint64(n))%span)
}

// Upsert records an identity the watcher saw.
func (a *Allocator) Upsert(obj *v1alpha1.TendrilIdentity) {
	id, err := strconv.ParseUint(obj.Name, 10, 32)
	if err != nil || !identity.NumericIdentity(id).IsCluster() {
		a.log.Warn("Ignoring TendrilIdentity with a name that is not a cluster identity", "name", obj.Name)
		return
	}
	labels := LabelsOf(obj.SecurityLabels)
	if err := identity.CheckLabels(labels); err != nil {
		// Another party wrote it (no agent allocates such labels): its
		// labels would read as another set's.
		a.log.Warn("Ignoring TendrilIdentity with a malformed label", "name", obj.Name, "error", err)
		return
	}
	a.Learn(identity.NumericIdentity(id), labels)
	if key, held := a.BoundLabels(identity.NumericIdentity(id)); held && key != identity.LabelsKey(labels) {
		// Deleted and created again with other labels (the watcher
		// may see only the change): Run revokes our references.
		a.markGone(identity.NumericIdentity(id), key)
	}
}

func (a *Allocator) markGone(id identity.NumericIdentity, key string) {
	a.mu.Lock()
	a.gone[id] = key
	a.mu.Unlock()
	a.trigger()
}

// Delete forgets an identity the watcher saw go (identity GC). A local
// reference keeps it known: the endpoint still uses the number.
func (a *Allocator) Delete(obj *v1alpha1.TendrilIdentity) {
	if id, err := strconv.ParseUint(obj.Name, 10, 32); err == nil {
		a.Forget(identity.NumericIdentity(id))
		if key, held := a.BoundLabels(identity.NumericIdentity(id)); held {
			// Still in use here: Run creates it again.
			a.markGone(identity.NumericIdentity(id), key)
		}
	}
}

// Run keeps this node's identities until ctx ends: it recreates the held
// identities whose objects went, and publishes the held numbers on this
// node's TendrilNode, whenever something changed and every resync
// interval while something is left to do.
func (a *Allocator) Run(ctx context.Context) {
	t := time.NewTicker(a.resyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.resync:
		case <-t.C:
		}
		if err := a.keep(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("Cannot keep this node's identities; retrying", "retry-in", a.resyncInterval, "error", err)
		}
	}
}

// keep is one pass of Run.
func (a *Allocator) keep(ctx context.Context) error {
	a.mu.Lock()
	client, node := a.client, a.node
	gone := make(map[identity.NumericIdentity]string, len(a.gone))
	for id, key := range a.gone {
		gone[id] = key
	}
	a.mu.Unlock()
	if client == nil {
		return fmt.Errorf("no Kubernetes client yet")
	}
	var errs []error
	for id, key := range gone {
		done, err := a.recreate(ctx, client, id, key)
		if err != nil {
			errs = append(errs, err)
		}
		if done {
			a.mu.Lock()
			if a.gone[id] == key {
				delete(a.gone, id)
			}
			a.mu.Unlock()
		}
	}
	if node != "" {
		if err := a.publish(ctx, client, node); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// recreate creates a held identity's object again with the same number
// and labels; done is false when it must be tried again.
func (a *Allocator) recreate(ctx context.Context, client tendrilclient.Interface, id identity.NumericIdentity, key string) (done bool, err error) {
	if cur, held := a.BoundLabels(id); !held || cur != key {
		return true, nil // released or revoked meanwhile
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	labels := identity.SplitLabelsKey(key)
	ids := client.TendrilV1alpha1().TendrilIdentities()
	obj := &v1alpha1.TendrilIdentity{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(int(id))}, SecurityLabels: SecurityLabels(labels)}
	_, err = ids.Create(ctx, obj, metav1.CreateOptions{})
	switch {
	case err == nil:
		a.log.Warn("Identity in use on this node was deleted; created it again with the same number", "identity", id, "labels", key)
		a.Learn(id, labels)
		return true, nil
	case !apierrors.IsAlreadyExists(err):
		return false, fmt.Errorf("recreate identity %d: %w", id, err)
	}
	cur, err := ids.Get(ctx, obj.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil // deleted again: the next pass creates it
	}
	if err != nil {
		return false, fmt.Errorf("recreate identity %d: re-read: %w", id, err)
	}
	curLabels := LabelsOf(cur.SecurityLabels)
	a.Learn(id, curLabels)
	if identity.LabelsKey(curLabels) == key {
		return true, nil // someone (another agent) recreated it
	}
	// The number means other labels now, everywhere else: fail closed.
	a.log.Warn("Identity in use on this node was deleted and its number given to other labels; its endpoints get a new identity",
		"identity", id, "labels", key, "now", identity.LabelsKey(curLabels))
	a.Revoke(id, key)
	return true, nil
}

// publish writes the held numbers into this node's TendrilNode
// annotation when they changed since the last write (a merge patch: the
// node write-back's updates keep it).
func (a *Allocator) publish(ctx context.Context, client tendrilclient.Interface, node string) error {
	held := a.Held()
	nums := make([]string, 0, len(held))
	for _, h := range held {
		nums = append(nums, strconv.Itoa(int(h.ID)))
	}
	value := strings.Join(nums, ",")
	a.mu.Lock()
	same := a.publishedOnce && a.published == value
	a.mu.Unlock()
	if same {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnotationIdentitiesInUse: value}}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	if _, err := client.TendrilV1alpha1().TendrilNodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("publish identities in use on TendrilNode %s: %w", node, err)
	}
	a.mu.Lock()
	a.published, a.publishedOnce = value, true
	a.mu.Unlock()
	return nil
}

// ParseIdentitiesInUse reads AnnotationIdentitiesInUse: the cluster
// identity numbers it lists, and how many entries were not one (skipped).
func ParseIdentitiesInUse(value string) (ids []identity.NumericIdentity, bad int) {
	for _, f := range strings.Split(value, ",") {
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
		if err != nil || !identity.NumericIdentity(n).IsCluster() {
			bad++
			continue
		}
		ids = append(ids, identity.NumericIdentity(n))
	}
	return ids, bad
}

// Allocate returns the cluster identity of labels, creating its object
// when no node has it yet, and takes a reference. isNew reports whether
// this call created it.
func (a *Allocator) Allocate(labels []string) (identity.Identity, bool, error) {
	if err := identity.CheckLabels(labels); err != nil {
		return identity.Identity{}, false, fmt.Errorf("allocate identity: %w", err)
	}
	sorted := append([]string(nil), labels...)
	sort.Strings(sorted)
	key := identity.LabelsKey(sorted)
	a.mu.Lock()
	client := a.client
	a.mu.Unlock()
	if id, ok := a.KnownID(key); ok {
		refs := a.RefAs(id, sorted)
		if refs > 1 || client == nil {
			return identity.Identity{ID: id, Labels: sorted, RefCount: refs}, false, nil
		}
		// This node's first use: claim it from the GC.
		alive, err := a.claim(client, id, key)
		if err != nil {
			_, _ = a.Unref(id)
			return identity.Identity{}, false, err
		}
		if alive {
			return identity.Identity{ID: id, Labels: sorted, RefCount: refs}, false, nil
		}
		// Collected meanwhile: allocate it anew below.
		_, _ = a.Unref(id)
		a.Forget(id)
	}
	if client == nil {
		return identity.Identity{}, false, fmt.Errorf("allocate identity: no Kubernetes client yet")
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	ids := client.TendrilV1alpha1().TendrilIdentities()
	for n := 0; n < maxProbes; n++ {
		id := candidate(key, n)
		if other, taken := a.LabelsOf(id); taken && identity.LabelsKey(other) != key {
			continue // known to hold other labels
		}
		obj := &v1alpha1.TendrilIdentity{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(int(id))}, SecurityLabels: SecurityLabels(sorted)}
		_, err := ids.Create(ctx, obj, metav1.CreateOptions{})
		created := err == nil
		if apierrors.IsAlreadyExists(err) {
			cur, gerr := ids.Get(ctx, obj.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(gerr) && ctx.Err() == nil {
				// Collected (the operator's GC) between the create and the
				// read: create this number again, as after a lost claim.
				n--
				continue
			}
			if gerr != nil {
				return identity.Identity{}, false, fmt.Errorf("allocate identity: re-read %s: %w", obj.Name, gerr)
			}
			curLabels := LabelsOf(cur.SecurityLabels)
			a.Learn(id, curLabels)
			if identity.LabelsKey(curLabels) != key {
				continue // collision: the next number in the fixed order
			}
			if _, marked := cur.Annotations[AnnotationUnusedSince]; marked {
				alive, cerr := a.claim(client, id, key)
				if cerr != nil {
					return identity.Identity{}, false, cerr
				}
				if !alive {
					a.Forget(id)
					n-- // collected meanwhile: create this number again
					continue
				}
			}
			err = nil
		}
		if err != nil {
			return identity.Identity{}, false, fmt.Errorf("allocate identity %d: %w", id, err)
		}
		a.Learn(id, sorted)
		refs := a.RefAs(id, sorted)
		if created {
			a.log.Info("Allocated identity", "identity", id, "labels", key)
		}
		return identity.Identity{ID: id, Labels: sorted, RefCount: refs}, created, nil
	}
	return identity.Identity{}, false, identity.ErrExhausted
}

// claim makes sure the identity object exists and carries no GC mark:
// it removes AnnotationUnusedSince with an update at the read
// resourceVersion, which makes a concurrent GC delete (preconditioned on
// the version it marked) fail. alive is false when the object is gone or
// now holds other labels than key (collected and taken meanwhile).
func (a *Allocator) claim(client tendrilclient.Interface, id identity.NumericIdentity, key string) (alive bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	ids := client.TendrilV1alpha1().TendrilIdentities()
	name := strconv.Itoa(int(id))
	for attempt := 0; attempt < 5; attempt++ {
		cur, err := ids.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("claim identity %d: %w", id, err)
		}
		if identity.LabelsKey(LabelsOf(cur.SecurityLabels)) != key {
			return false, nil
		}
		if _, marked := cur.Annotations[AnnotationUnusedSince]; !marked {
			return true, nil
		}
		cur = cur.DeepCopy()
		delete(cur.Annotations, AnnotationUnusedSince)
		_, err = ids.Update(ctx, cur, metav1.UpdateOptions{})
		switch {
		case err == nil:
			a.log.Info("Claimed identity marked unused by the GC", "identity", id)
			return true, nil
		case apierrors.IsNotFound(err):
			return false, nil
		case apierrors.IsConflict(err):
			continue // changed meanwhile (GC or another agent): read again
		default:
			return false, fmt.Errorf("claim identity %d: %w", id, err)
		}
	}
	return false, fmt.Errorf("claim identity %d: conflicts on every attempt", id)
}

// Release drops a local reference. The object stays: other nodes may use
// it, and deleting unused identities is the operator's identity GC.
func (a *Allocator) Release(id identity.NumericIdentity) error {
	_, err := a.Unref(id)
	return err
}

// Reserve takes a reference on a restored endpoint's identity; it fails
// when the cluster gives these labels another number (identity.Reserve).
func (a *Allocator) Reserve(id identity.NumericIdentity, labels []string) error {
	return identity.ReserveByAllocating(a, id, labels)
}

var _ identity.Allocator = (*Allocator)(nil)
