package identity

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/tendril-net/tendril/pkg/labels"
)

// ErrExhausted means no free identity is left in the range.
var ErrExhausted = errors.New("identity range exhausted")

// Identity is an allocated identity and its labels.
type Identity struct {
	ID     NumericIdentity
	Labels []string
	// RefCount is how many users on this node hold it.
	RefCount int
}

// CheckLabels checks the labels of an identity before it is allocated:
// each one must pass labels.CheckString, or the set's key (LabelsKey)
// would name another set.
func CheckLabels(ls []string) error {
	for _, l := range ls {
		if err := labels.CheckString(l); err != nil {
			return err
		}
	}
	return nil
}

// LabelsKey is the stable string form of a label set (sorted, joined by
// ';', which CheckLabels keeps out of the labels).
func LabelsKey(labels []string) string {
	s := append([]string(nil), labels...)
	sort.Strings(s)
	return strings.Join(s, ";")
}

// SplitLabelsKey is the inverse of LabelsKey.
func SplitLabelsKey(key string) []string {
	if key == "" {
		return nil
	}
	return strings.Split(key, ";")
}

// LocalAllocator allocates cluster-range identities in memory, reference
// counted. It is the allocator of standalone mode (no kvstore, no CRDs);
// the same label set always gets the same identity while referenced.
type LocalAllocator struct {
	mu        sync.Mutex
	byKey     map[string]*Identity
	byID      map[NumericIdentity]*Identity
	next      NumericIdentity
	listeners []func(added, deleted []Identity)
	refFns    []func(NumericIdentity)
	// generation changes whenever the set of identities does.
	generation uint64
}

// Generation is a number that changes whenever identities are added or
// removed (selector caches key on it).
func (a *LocalAllocator) Generation() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.generation
}

// NewLocalAllocator returns an empty allocator.
func NewLocalAllocator() *LocalAllocator {
	return &LocalAllocator{byKey: map[string]*Identity{}, byID: map[NumericIdentity]*Identity{}, next: MinCluster}
}

// Subscribe calls fn after identities are added or deleted.
func (a *LocalAllocator) Subscribe(fn func(added, deleted []Identity)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.listeners = append(a.listeners, fn)
}

// SubscribeReferences calls fn after an identity's references changed
// without it being added or deleted, and after Reserve.
func (a *LocalAllocator) SubscribeReferences(fn func(NumericIdentity)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refFns = append(a.refFns, fn)
}

// SubscribeRevoked is part of Allocator: a local allocator owns its
// numbers, so it never revokes one and never calls fn.
func (a *LocalAllocator) SubscribeRevoked(func(NumericIdentity, []string)) {}

// referencesChanged tells the reference subscribers about id; a.mu must
// not be held.
func (a *LocalAllocator) referencesChanged(id NumericIdentity) {
	a.mu.Lock()
	fns := append(([]func(NumericIdentity))(nil), a.refFns...)
	a.mu.Unlock()
	for _, fn := range fns {
		fn(id)
	}
}

// Allocate returns the identity of labels, allocating it on first use, and
// takes a reference. isNew tells whether it was created.
func (a *LocalAllocator) Allocate(labels []string) (Identity, bool, error) {
	if len(labels) == 0 {
		return Identity{}, false, fmt.Errorf("allocate identity: empty label set")
	}
	if err := CheckLabels(labels); err != nil {
		return Identity{}, false, fmt.Errorf("allocate identity: %w", err)
	}
	key := LabelsKey(labels)
	a.mu.Lock()
	if id, ok := a.byKey[key]; ok {
		id.RefCount++
		out := *id
		a.mu.Unlock()
		a.referencesChanged(out.ID)
		return out, false, nil
	}
	var chosen NumericIdentity
	for n := 0; n <= int(MaxCluster-MinCluster); n++ {
		c := a.next
		a.next++
		if a.next > MaxCluster {
			a.next = MinCluster
		}
		if _, used := a.byID[c]; !used {
			chosen = c
			break
		}
	}
	if chosen == 0 {
		a.mu.Unlock()
		return Identity{}, false, ErrExhausted
	}
	sorted := append([]string(nil), labels...)
	sort.Strings(sorted)
	id := &Identity{ID: chosen, Labels: sorted, RefCount: 1}
	a.byKey[key] = id
	a.byID[chosen] = id
	a.generation++
	out := *id
	ls := append(([]func(added, deleted []Identity))(nil), a.listeners...)
	a.mu.Unlock()
	for _, fn := range ls {
		fn([]Identity{out}, nil)
	}
	return out, true, nil
}

// Release drops a reference; the identity is deleted with its last one.
func (a *LocalAllocator) Release(id NumericIdentity) error {
	a.mu.Lock()
	ident, ok := a.byID[id]
	if !ok {
		a.mu.Unlock()
		return fmt.Errorf("release identity %d: not allocated", id)
	}
	ident.RefCount--
	if ident.RefCount > 0 {
		a.mu.Unlock()
		a.referencesChanged(id)
		return nil
	}
	delete(a.byID, id)
	delete(a.byKey, LabelsKey(ident.Labels))
	a.generation++
	out := *ident
	ls := append(([]func(added, deleted []Identity))(nil), a.listeners...)
	a.mu.Unlock()
	for _, fn := range ls {
		fn(nil, []Identity{out})
	}
	return nil
}

// Lookup returns the identity with the given ID.
func (a *LocalAllocator) Lookup(id NumericIdentity) (Identity, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ident, ok := a.byID[id]; ok {
		return *ident, true
	}
	return Identity{}, false
}

// List returns every allocated identity sorted by ID.
func (a *LocalAllocator) List() []Identity {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Identity, 0, len(a.byID))
	for _, id := range a.byID {
		out = append(out, *id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Reserve re-creates an identity with a known ID (restore after restart, so
// a restored endpoint keeps its identity and its pinned policy entries stay
// valid). A conflicting existing allocation is an error (see Reserve).
func (a *LocalAllocator) Reserve(id NumericIdentity, labels []string) error {
	if err := Reserve(localReserveStore{a}, id, labels); err != nil {
		return err
	}
	a.referencesChanged(id)
	return nil
}

// localReserveStore is the LocalAllocator's half of Reserve: it owns its
// numbers, so it creates the identity as the asked number. It tells no
// subscriber (Reserve's caller tells the reference subscribers once it
// succeeded), and its Release only undoes an Acquire.
type localReserveStore struct{ a *LocalAllocator }

func (s localReserveStore) Acquire(id NumericIdentity, sorted []string) (NumericIdentity, error) {
	a := s.a
	key := LabelsKey(sorted)
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur, ok := a.byKey[key]; ok {
		cur.RefCount++
		return cur.ID, nil
	}
	if _, used := a.byID[id]; used {
		return 0, fmt.Errorf("in use by other labels: %w", ErrReserveConflict)
	}
	ident := &Identity{ID: id, Labels: sorted, RefCount: 1}
	a.byKey[key] = ident
	a.byID[id] = ident
	a.generation++
	return id, nil
}

// Release undoes an Acquire that found the labels under another number:
// that identity had references before, so it is never the last one and
// the count is back where it was (nothing for subscribers to see).
func (s localReserveStore) Release(id NumericIdentity) error {
	a := s.a
	a.mu.Lock()
	defer a.mu.Unlock()
	ident, ok := a.byID[id]
	if !ok || ident.RefCount < 2 {
		return fmt.Errorf("undo reference on identity %d: not held twice", id)
	}
	ident.RefCount--
	return nil
}

type notHeldError NumericIdentity

func (e notHeldError) Error() string {
	return "release identity " + NumericIdentity(e).String() + ": not held"
}

func errNotHeld(id NumericIdentity) error { return notHeldError(id) }
