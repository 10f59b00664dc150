// Package watchers keeps the agent's caches of Kubernetes objects (local
// pods, namespaces, nodes, services, EndpointSlices, NetworkPolicies and
// the Tendril CRDs) with informers, and delivers typed upsert and delete
// events to subscribers, followed by a Synced marker once a subscriber has
// seen every object of the initial list.
package watchers

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// EventKind is what happened to an object.
type EventKind int

// Event kinds.
const (
	// Upsert: the object was added or changed.
	Upsert EventKind = iota
	// Delete: the object is gone; Object is its last known state.
	Delete
	// Synced: the subscriber has received every object of the initial
	// list. Object is the zero value.
	Synced
)

func (k EventKind) String() string {
	switch k {
	case Upsert:
		return "upsert"
	case Delete:
		return "delete"
	case Synced:
		return "synced"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one change of a resource.
type Event[T runtime.Object] struct {
	Kind EventKind
	// Key is namespace/name (name for cluster-scoped objects).
	Key    string
	Object T
}

// Resource is one watched kind of object: an informer's cache and its
// subscribers.
type Resource[T runtime.Object] struct {
	name     string
	informer cache.SharedIndexInformer
}

func newResource[T runtime.Object](name string, inf cache.SharedIndexInformer) *Resource[T] {
	return &Resource[T]{name: name, informer: inf}
}

// Name is the resource's plural name (pods, tendrilnetworkpolicies, ...).
func (r *Resource[T]) Name() string { return r.name }

// HasSynced reports whether the cache holds the initial list.
func (r *Resource[T]) HasSynced() bool { return r.informer.HasSynced() }

// Len is the number of cached objects.
func (r *Resource[T]) Len() int { return len(r.informer.GetStore().ListKeys()) }

// Get returns the cached object with key namespace/name (or name).
func (r *Resource[T]) Get(key string) (T, bool) {
	var zero T
	obj, ok, err := r.informer.GetStore().GetByKey(key)
	if err != nil || !ok {
		return zero, false
	}
	t, ok := obj.(T)
	return t, ok
}

// List returns every cached object.
func (r *Resource[T]) List() []T {
	items := r.informer.GetStore().List()
	out := make([]T, 0, len(items))
	for _, o := range items {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// Subscribe delivers every object (existing ones first, as upserts), then
// Synced, then each change, to fn. Calls to fn are serialized; fn must not
// block for long, since it holds up this subscriber's later events. The
// returned function unsubscribes.
func (r *Resource[T]) Subscribe(fn func(Event[T])) (unsubscribe func(), err error) {
	var mu sync.Mutex
	deliver := func(ev Event[T]) {
		mu.Lock()
		defer mu.Unlock()
		fn(ev)
	}
	upsert := func(obj any) {
		t, ok := obj.(T)
		if !ok {
			return
		}
		key, err := cache.MetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		deliver(Event[T]{Kind: Upsert, Key: key, Object: t})
	}
	reg, err := r.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    upsert,
		UpdateFunc: func(_, obj any) { upsert(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			t, ok := obj.(T)
			if !ok {
				return
			}
			key, err := cache.MetaNamespaceKeyFunc(obj)
			if err != nil {
				return
			}
			deliver(Event[T]{Kind: Delete, Key: key, Object: t})
		},
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", r.name, err)
	}
	stop := make(chan struct{})
	go func() {
		// The registration is synced once this handler got every object
		// of the initial list, so Synced follows them.
		if cache.WaitForCacheSync(stop, reg.HasSynced) {
			deliver(Event[T]{Kind: Synced})
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stop)
			_ = r.informer.RemoveEventHandler(reg)
		})
	}, nil
}
