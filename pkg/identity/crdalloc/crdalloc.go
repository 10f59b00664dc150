// Package crdalloc allocates cluster-wide security identities as
// TendrilIdentity objects (the CRD identity allocation mode): the object's
// name is the numeric identity, its security-labels the label set. The
// first candidate number is derived from the labels' hash and collisions
// probe onwards in a fixed order, so agents allocating the same label set
// at once try the same numbers: one create wins, the others get
// AlreadyExists, re-read the object, find their labels and use it. Two IDs
// for one label set never arise from a race.
package crdalloc

import (
	"context"
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
}

// New returns an allocator without a client; SetClient gives it one
// before the first allocation (the agent builds its clients at start).
func New(log *slog.Logger) *Allocator {
	return &Allocator{ClusterCache: identity.NewClusterCache(), log: log, timeout: 10 * time.Second}
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
}

// Delete forgets an identity the watcher saw go (identity GC). A local
// reference keeps it known: the endpoint still uses the number.
func (a *Allocator) Delete(obj *v1alpha1.TendrilIdentity) {
	if id, err := strconv.ParseUint(obj.Name, 10, 32); err == nil {
		a.Forget(identity.NumericIdentity(id))
	}
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
		refs := a.Ref(id)
		if refs > 1 || client == nil {
			return identity.Identity{ID: id, Labels: sorted, RefCount: refs}, false, nil
		}
		// This node's first use: claim it from the GC.
		alive, err := a.claim(client, id)
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
				alive, cerr := a.claim(client, id)
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
		refs := a.Ref(id)
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
// the version it marked) fail. alive is false when the object is gone.
func (a *Allocator) claim(client tendrilclient.Interface, id identity.NumericIdentity) (alive bool, err error) {
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
// when the cluster knows that number with other labels.
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
