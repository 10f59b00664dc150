package reconcile

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/netip"

	"github.com/cilium/statedb"
)

// PrefixOps are the operations of a reconciler that writes objects keyed
// by prefix into a kernel table keyed the same way (the BPF ipcache, the
// policy CIDR map, the routes to peers' pod CIDRs): Update puts an object
// under its prefix, Delete removes its prefix, Prune removes what the
// kernel holds under a prefix no object has. Every function but Pruned
// must be set.
//
// PrefixOps implements statedb's reconciler.Operations[Obj].
type PrefixOps[Obj any] struct {
	// Prefix is an object's key.
	Prefix func(Obj) netip.Prefix
	// Kernel is the table written.
	Kernel PrefixKernel[Obj]

	// Entry names one kernel entry in the errors of a failed prune delete
	// ("route": "prune route 10.1.0.0/24: ..."); empty leaves it out.
	Entry string
	// Pruned, if set, is told what a prune deleted when it deleted
	// anything (for the log).
	Pruned func(gone []Stale)
}

// PrefixKernel is a kernel table keyed by prefix as PrefixOps writes it.
// Its functions are called from the reconciler's goroutine only.
type PrefixKernel[Obj any] struct {
	// Put writes obj's value (what the kernel holds for it: a map value,
	// a route's next hop) under prefix, obj's own, replacing what the
	// kernel held there. It is given the object rather than a value
	// PrefixOps would get from it: a value returned through a function
	// of a type parameter costs several times the call it feeds.
	Put func(prefix netip.Prefix, obj Obj) error
	// Delete removes prefix; an absent prefix is not an error.
	Delete func(prefix netip.Prefix) error
	// List returns what the kernel holds that is the reconciler's to
	// prune (a routing table's routes of the reconciler's protocol only),
	// each prefix with log fields that describe it (a route's next hop),
	// or none. Prune walks the listing before it deletes anything, so the
	// listing may read the kernel as it goes. A failed listing's error
	// is returned as it is: it should say what it listed.
	List func() (iter.Seq2[netip.Prefix, []any], error)
}

// Stale is a kernel entry no object had, which a prune deleted.
type Stale struct {
	Prefix netip.Prefix
	// Attrs are the log fields List gave it.
	Attrs []any
}

// ListPrefixes is the List of a kernel that lists bare prefixes (a BPF
// map's keys): list's error is wrapped as "list <what>: ...".
func ListPrefixes(what string, list func() ([]netip.Prefix, error)) func() (iter.Seq2[netip.Prefix, []any], error) {
	return func() (iter.Seq2[netip.Prefix, []any], error) {
		ps, err := list()
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", what, err)
		}
		return func(yield func(netip.Prefix, []any) bool) {
			for _, p := range ps {
				if !yield(p, nil) {
					return
				}
			}
		}, nil
	}
}

// Update puts obj under its prefix.
func (o PrefixOps[Obj]) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, obj Obj) error {
	return o.Kernel.Put(o.Prefix(obj), obj)
}

// Delete removes obj's prefix.
func (o PrefixOps[Obj]) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, obj Obj) error {
	return o.Kernel.Delete(o.Prefix(obj))
}

// Prune deletes each prefix the kernel lists and no object of objs has:
// entries of a previous run whose objects are gone, or written by hand.
// It goes on past a failed delete and returns the failures joined (the
// reconciler prunes again at its next full round). A failed listing
// deletes nothing.
func (o PrefixOps[Obj]) Prune(_ context.Context, _ statedb.ReadTxn, objs iter.Seq2[Obj, statedb.Revision]) error {
	listing, err := o.Kernel.List()
	if err != nil {
		return err
	}
	want := map[netip.Prefix]struct{}{}
	for obj := range objs {
		want[o.Prefix(obj)] = struct{}{}
	}
	var stale []Stale
	for p, attrs := range listing {
		if _, ok := want[p]; !ok {
			stale = append(stale, Stale{Prefix: p, Attrs: attrs})
		}
	}
	var errs []error
	gone := stale[:0]
	for _, s := range stale {
		if err := o.Kernel.Delete(s.Prefix); err != nil {
			if o.Entry != "" {
				errs = append(errs, fmt.Errorf("prune %s %s: %w", o.Entry, s.Prefix, err))
			} else {
				errs = append(errs, fmt.Errorf("prune %s: %w", s.Prefix, err))
			}
			continue
		}
		gone = append(gone, s)
	}
	if len(gone) > 0 && o.Pruned != nil {
		o.Pruned(gone)
	}
	return errors.Join(errs...)
}
