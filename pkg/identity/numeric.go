// Package identity defines security identities: the reserved ones (host,
// world, ...), the cluster-wide range for label sets, node-local CIDR
// identities, and allocators mapping a label set to its identity.
package identity

import (
	"fmt"
	"strconv"
)

// NumericIdentity is a security identity.
type NumericIdentity uint32

// Reserved identities, as Cilium numbers them.
const (
	Unknown       NumericIdentity = 0
	Host          NumericIdentity = 1
	World         NumericIdentity = 2
	Unmanaged     NumericIdentity = 3
	Health        NumericIdentity = 4
	Init          NumericIdentity = 5
	RemoteNode    NumericIdentity = 6
	KubeAPIServer NumericIdentity = 7
	Ingress       NumericIdentity = 8
	WorldIPv4     NumericIdentity = 9
	WorldIPv6     NumericIdentity = 10
)

// Ranges.
const (
	MinReserved NumericIdentity = 1
	MaxReserved NumericIdentity = 255
	MinCluster  NumericIdentity = 256
	MaxCluster  NumericIdentity = 65535
	// LocalScope marks node-local identities (CIDR identities).
	LocalScope NumericIdentity = 1 << 24
	// InClusterCIDR marks, among node-local identities, the one a pod's or
	// a node's address inside a rule's prefix carries for that rule
	// (pkg/policy/policycidr): the plain CIDR identity of the same prefix
	// is the world's, this one never is.
	InClusterCIDR NumericIdentity = 1 << 23
)

// reservedNames are the entity names of the reserved identities.
func reservedNames() map[NumericIdentity]string {
	return map[NumericIdentity]string{
		Host: "host", World: "world", Unmanaged: "unmanaged", Health: "health", Init: "init",
		RemoteNode: "remote-node", KubeAPIServer: "kube-apiserver", Ingress: "ingress",
		WorldIPv4: "world-ipv4", WorldIPv6: "world-ipv6",
	}
}

// ReservedByName looks up a reserved identity by its entity name. It is a
// switch rather than a lookup in reservedNames: policy resolution calls it
// for every entity selector against every identity.
func ReservedByName(name string) (NumericIdentity, bool) {
	switch name {
	case "host":
		return Host, true
	case "world":
		return World, true
	case "unmanaged":
		return Unmanaged, true
	case "health":
		return Health, true
	case "init":
		return Init, true
	case "remote-node":
		return RemoteNode, true
	case "kube-apiserver":
		return KubeAPIServer, true
	case "ingress":
		return Ingress, true
	case "world-ipv4":
		return WorldIPv4, true
	case "world-ipv6":
		return WorldIPv6, true
	}
	return 0, false
}

// IsReserved reports whether id is in the reserved range.
func (id NumericIdentity) IsReserved() bool { return id >= MinReserved && id <= MaxReserved }

// IsCluster reports whether id is a cluster-wide label identity.
func (id NumericIdentity) IsCluster() bool { return id >= MinCluster && id <= MaxCluster }

// IsLocal reports whether id is node-local (CIDR).
func (id NumericIdentity) IsLocal() bool { return id&LocalScope != 0 }

// IsInClusterCIDR reports whether id is the in-cluster identity of a
// rule's prefix.
func (id NumericIdentity) IsInClusterCIDR() bool { return id.IsLocal() && id&InClusterCIDR != 0 }

// String names reserved identities and prints others as numbers.
func (id NumericIdentity) String() string {
	if n, ok := reservedNames()[id]; ok {
		return "reserved:" + n
	}
	return strconv.FormatUint(uint64(id), 10)
}

// Parse parses a numeric identity or a reserved entity name.
func Parse(s string) (NumericIdentity, error) {
	if id, ok := ReservedByName(s); ok {
		return id, nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("identity %q: not a number or reserved name", s)
	}
	return NumericIdentity(n), nil
}
