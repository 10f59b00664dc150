package identity

import (
	"errors"
	"fmt"
	"sort"
)

// ErrReserveConflict is wrapped by Reserve's error when the number or the
// labels already belong to something else: the restored endpoint cannot
// keep its number and must allocate again.
var ErrReserveConflict = errors.New("reservation conflict")

// ReserveStore is the allocator-specific half of Reserve: how one
// allocator takes and drops a reference in the store that decides which
// number a label set has (its own memory for LocalAllocator, the
// TendrilIdentity objects or the kvstore for the cluster allocators).
type ReserveStore interface {
	// Acquire takes a reference on the identity the store gives labels
	// (sorted, checked) and returns its number. A store that chooses
	// numbers itself may return another number than id (Reserve then
	// drops the reference again); a store that owns its numbers creates
	// labels' identity as id when it has none. An error means no
	// reference was taken.
	Acquire(id NumericIdentity, labels []string) (NumericIdentity, error)
	// Release drops a reference Acquire took.
	Release(id NumericIdentity) error
}

// Reserve takes a reference on a known number for labels: a restored
// endpoint keeps the identity its pinned policy entries were computed
// for. It is every allocator's Reserve, with the store's part in s.
//
// The number must be a cluster identity and the labels a non-empty set
// passing CheckLabels. When the store gives labels another number, or id
// belongs to other labels, Reserve fails with an error wrapping
// ErrReserveConflict and holds no reference: the endpoint must allocate
// again rather than use a number that means other labels elsewhere.
// Telling subscribers about the new reference is the store's (Acquire).
func Reserve(s ReserveStore, id NumericIdentity, labels []string) error {
	if !id.IsCluster() {
		return fmt.Errorf("reserve identity %d: not in the cluster range %d-%d", id, MinCluster, MaxCluster)
	}
	if len(labels) == 0 {
		return fmt.Errorf("reserve identity %d: empty label set", id)
	}
	if err := CheckLabels(labels); err != nil {
		return fmt.Errorf("reserve identity %d: %w", id, err)
	}
	sorted := append([]string(nil), labels...)
	sort.Strings(sorted)
	got, err := s.Acquire(id, sorted)
	if err != nil {
		return fmt.Errorf("reserve identity %d: %w", id, err)
	}
	if got != id {
		if err := s.Release(got); err != nil {
			return fmt.Errorf("reserve identity %d: labels already have identity %d (%w), and dropping that reference failed: %w",
				id, got, ErrReserveConflict, err)
		}
		return fmt.Errorf("reserve identity %d: labels already have identity %d: %w", id, got, ErrReserveConflict)
	}
	return nil
}

// AllocatingStore is the ReserveStore of a cluster-wide allocator, whose
// store chooses the numbers: Acquire is an Allocate of the labels.
type AllocatingStore interface {
	Allocate(labels []string) (ident Identity, isNew bool, err error)
	Release(id NumericIdentity) error
}

// allocatingStore adapts an AllocatingStore to ReserveStore.
type allocatingStore struct{ a AllocatingStore }

func (s allocatingStore) Acquire(_ NumericIdentity, labels []string) (NumericIdentity, error) {
	got, _, err := s.a.Allocate(labels)
	return got.ID, err
}

func (s allocatingStore) Release(id NumericIdentity) error { return s.a.Release(id) }

// ReserveByAllocating is Reserve for an allocator whose store chooses
// the numbers (crdalloc, kvalloc): the labels are allocated as usual and
// the result must be id.
func ReserveByAllocating(a AllocatingStore, id NumericIdentity, labels []string) error {
	return Reserve(allocatingStore{a}, id, labels)
}
