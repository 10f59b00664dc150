// Package maglev computes Maglev lookup tables (Eisenbud et al., "Maglev:
// A Fast and Reliable Software Network Load Balancer", NSDI 2016): a table
// of M entries (M prime) in which every backend owns about M/N entries
// (in proportion to its weight), and which changes little when a backend
// comes or goes, so most flows keep their backend. Every node computes the
// same table from the same backends and seed: the table depends on the
// backends' keys, never on the order they are given in or on node-local
// IDs.
package maglev

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
)

// Sizes are the table sizes a table may have: primes, each about twice the
// one before, as Cilium offers them. A table should have at least 100
// entries per backend for an even spread.
var Sizes = []int{251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071}

// DefaultSize is the size of the datapath's tables (LB_MAGLEV_TABLE_SIZE).
const DefaultSize = 16381

// ValidSize reports whether m is one of Sizes.
func ValidSize(m int) bool { return slices.Contains(Sizes, m) }

// Backend is one backend of a service.
type Backend struct {
	// Key names the backend the same way on every node (e.g. its address
	// and port): the permutation is derived from it.
	Key string
	// ID is what the table holds for the backend (the datapath's backend
	// ID).
	ID uint32
	// Weight is the backend's share relative to the others; 0 gives it
	// no entry.
	Weight uint16
}

// Config selects the table size and the seed of the permutations. All
// nodes of a cluster must use the same.
type Config struct {
	Size int
	Seed uint64
}

// DefaultConfig is the datapath's size with seed 0.
func DefaultConfig() Config { return Config{Size: DefaultSize} }

// Table returns the lookup table: entry i is the ID of the backend that
// flows hashing to i (modulo the size) go to. With no backend of positive
// weight every entry is 0. Two backends with the same key are an error.
func Table(backends []Backend, cfg Config) ([]uint32, error) {
	m := cfg.Size
	if !ValidSize(m) {
		return nil, fmt.Errorf("maglev table size %d is not one of %v", m, Sizes)
	}
	bs := make([]Backend, 0, len(backends))
	for _, b := range backends {
		if b.Weight > 0 {
			bs = append(bs, b)
		}
	}
	// The fill order decides ties, so it must not depend on the caller's
	// order: sort by key.
	slices.SortFunc(bs, func(a, b Backend) int { return cmp.Compare(a.Key, b.Key) })
	for i := 1; i < len(bs); i++ {
		if bs[i].Key == bs[i-1].Key {
			return nil, fmt.Errorf("maglev: backend key %q given twice", bs[i].Key)
		}
	}
	table := make([]uint32, m)
	if len(bs) == 0 {
		return table, nil
	}

	// Backend i visits the entries offset, offset+skip, offset+2·skip, ...
	// (mod m): a permutation of the table since m is prime and 0 < skip <
	// m.
	offset := make([]uint64, len(bs))
	skip := make([]uint64, len(bs))
	next := make([]uint64, len(bs))
	var maxWeight uint64
	for i, b := range bs {
		offset[i] = hash(cfg.Seed, 1, b.Key) % uint64(m)
		skip[i] = hash(cfg.Seed, 2, b.Key)%uint64(m-1) + 1
		maxWeight = max(maxWeight, uint64(b.Weight))
	}
	filled := make([]bool, m)
	credit := make([]uint64, len(bs))
	n := 0
	for n < m {
		for i := range bs {
			// Weights: a backend takes a turn each time its credit
			// reaches the largest weight, so over many rounds its turns
			// (hence its entries) are in proportion to its weight. With
			// equal weights every backend takes a turn every round: the
			// classic algorithm, whose shares differ by at most one entry.
			credit[i] += uint64(bs[i].Weight)
			if credit[i] < maxWeight {
				continue
			}
			credit[i] -= maxWeight
			c := (offset[i] + next[i]*skip[i]) % uint64(m)
			for filled[c] {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			filled[c] = true
			table[c] = bs[i].ID
			next[i]++
			n++
			if n == m {
				break
			}
		}
	}
	return table, nil
}

// hash is FNV-1a (64 bits) over the seed, which of the two hashes it is,
// and the key, finished with the SplitMix64 mixer so that the two hashes
// of one key are independent.
func hash(seed uint64, which byte, key string) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:8], seed)
	b[8] = which
	for _, c := range b {
		h = (h ^ uint64(c)) * prime64
	}
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime64
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
