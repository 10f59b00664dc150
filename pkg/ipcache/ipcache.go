// Package ipcache maps IP prefixes to security identities (and the node
// that owns them) for the datapath. Many claims may name one prefix: each
// comes from one owner (the object it was learned from: a local endpoint, a
// Node, a TendrilEndpoint, a kvstore key, a policy CIDR) in one source. The
// source of highest precedence wins (a local endpoint over Kubernetes over
// the kvstore over prefixes generated for policy), so a policy CIDR equal to
// a pod's address never hides the pod's identity; among claims of one
// source the most recent one wins while it exists. Withdrawing a claim
// touches only its owner's: the prefix falls back to the best remaining
// claim, whatever order the owners' events came in.
//
// The claims live in a statedb table ("ipcache", one object per prefix with
// its claims, the resolved entry and its reconciliation status): writers
// change it in a short write transaction and return. A statedb reconciler
// writes the resolved entries to a Backend (the BPF ipcache map): changes
// incrementally, failures retried with backoff, and once the table is
// initialized a periodic prune of what the backend holds and the table
// does not.
package ipcache

import (
	"fmt"
	"net/netip"
	"strconv"

	"github.com/tendril-net/tendril/pkg/identity"
)

// Source is the kind of origin of a claim; a higher value wins. One byte:
// it sits beside the identity in an Entry, of which the agent holds one
// per remote pod.
type Source uint8

// Sources, lowest precedence first.
const (
	// SourceGenerated: prefixes the agent derives (world, policy CIDRs).
	SourceGenerated Source = iota
	// SourceKVStore: other nodes' endpoints published in the kvstore.
	SourceKVStore
	// SourceKubernetes: other nodes' endpoints (TendrilEndpoints) and node
	// addresses learned from Kubernetes objects.
	SourceKubernetes
	// SourceLocal: this node's endpoints and addresses.
	SourceLocal
)

// Sources lists every source, lowest precedence first.
func Sources() []Source {
	return []Source{SourceGenerated, SourceKVStore, SourceKubernetes, SourceLocal}
}

func (s Source) String() string {
	switch s {
	case SourceGenerated:
		return "generated"
	case SourceKVStore:
		return "kvstore"
	case SourceKubernetes:
		return "kubernetes"
	case SourceLocal:
		return "local"
	}
	return fmt.Sprintf("source(%d)", int(s))
}

// MarshalText names the source in dumps of the table.
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a source's name.
func (s *Source) UnmarshalText(b []byte) error {
	for _, src := range Sources() {
		if src.String() == string(b) {
			*s = src
			return nil
		}
	}
	return fmt.Errorf("unknown ipcache source %q", b)
}

// Owner names the object a claim comes from, as kind/key ("node/node2",
// "endpoint/17"). Two objects never share an owner, so one object's delete
// cannot withdraw another's claim on the same prefix.
type Owner string

// Owners of the agent's claims.
const (
	// OwnerHost: the node's own addresses.
	OwnerHost Owner = "host"
	// OwnerWorld: the default routes, claimed as world.
	OwnerWorld Owner = "world"
)

// OwnerEndpoint is a local endpoint's owner.
func OwnerEndpoint(id uint16) Owner { return Owner("endpoint/" + strconv.Itoa(int(id))) }

// OwnerNode is a peer node's owner (its Node object).
func OwnerNode(name string) Owner { return Owner("node/" + name) }

// OwnerTendrilEndpoint is another node's endpoint published as a
// TendrilEndpoint.
func OwnerTendrilEndpoint(namespace, name string) Owner {
	return Owner("tendrilendpoint/" + namespace + "/" + name)
}

// OwnerKVStore is another node's endpoint address published under key in
// the kvstore.
func OwnerKVStore(key string) Owner { return Owner("kvstore/" + key) }

// OwnerPolicyCIDR is the claim of a prefix that policy rules select.
func OwnerPolicyCIDR(prefix netip.Prefix) Owner { return Owner("policy-cidr/" + prefix.String()) }

// Entry is one owner's claim on a prefix. Its fields are ordered for size
// (the identity and the source share a word: 80 bytes), as the agent holds
// one per address it knows.
type Entry struct {
	Identity identity.NumericIdentity
	Source   Source
	// HostIP is the node that owns the prefix (unset: this node or none).
	HostIP netip.Addr `json:",omitzero"`
	// Owner is the object the claim comes from; required.
	Owner Owner
	// Name and Namespace say which pod the claim is about, for display.
	Name      string `json:",omitempty"`
	Namespace string `json:",omitempty"`
}
