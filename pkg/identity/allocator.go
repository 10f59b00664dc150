package identity

// Allocator hands out identities for label sets: LocalAllocator in
// standalone mode, a cluster-wide allocator (CRD or kvstore) otherwise.
type Allocator interface {
	// Allocate returns the identity of labels and takes a reference;
	// isNew says whether it was created by this call.
	Allocate(labels []string) (ident Identity, isNew bool, err error)
	// Release drops a reference.
	Release(id NumericIdentity) error
	// Reserve takes a reference on a known ID for labels (restore).
	Reserve(id NumericIdentity, labels []string) error
	// Lookup returns a known identity.
	Lookup(id NumericIdentity) (Identity, bool)
	// List returns every known identity, by ID.
	List() []Identity
	// Generation changes whenever identities are added or removed.
	Generation() uint64
	// Subscribe calls fn after identities are added or removed.
	Subscribe(fn func(added, deleted []Identity))
	// SubscribeReferences calls fn after id's local references changed
	// (or it was reserved) without it being added or removed.
	SubscribeReferences(fn func(id NumericIdentity))
	// SubscribeRevoked calls fn when the cluster no longer gives id to the
	// labels this node holds it for (it was collected and taken by
	// another label set while this node could not keep it): every local
	// user of id for labels must allocate again (its references are
	// dropped already, nothing to release).
	SubscribeRevoked(fn func(id NumericIdentity, labels []string))
}

var _ Allocator = (*LocalAllocator)(nil)
