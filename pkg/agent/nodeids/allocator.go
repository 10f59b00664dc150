package nodeids

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/cilium/api/v1/models"
)

// Node IDs are 16 bits, as Cilium's: 0 is this node (never listed, as in
// Cilium, whose local node's addresses are not in its node ID map), the
// other nodes take 1 to 65535.
const (
	minID = 1
	maxID = 1<<16 - 1
)

// StateFile is the allocations' file in the agent's state directory.
const StateFile = "node-ids.json"

// Node is what the allocator needs of a peer of the nodes table.
type Node struct {
	Name string
	IPs  []netip.Addr
}

// saved is the state file's content.
type saved struct {
	// Nodes is each node's ID, by node name.
	Nodes map[string]uint16 `json:"nodes"`
}

// Allocator gives each other node an ID, stable while the node stays in
// the nodes table and across the agent's restarts (the allocations are
// saved in the state directory and restored at start). An ID is keyed by
// node name, not by address: a node whose address changes keeps its ID,
// which Cilium gets by moving the ID from the old addresses to the new.
// A new node takes the lowest free ID. Not safe for concurrent use.
type Allocator struct {
	// ids is every allocation: the nodes of the last Sync, and, until
	// the nodes table is complete, the restored ones not seen yet.
	ids map[string]uint16
	// ips are the addresses of the nodes of the last Sync.
	ips map[string][]netip.Addr
}

// NewAllocator is an allocator with nothing allocated.
func NewAllocator() *Allocator {
	return &Allocator{ids: map[string]uint16{}, ips: map[string][]netip.Addr{}}
}

// Restore reads the allocations saved in dir. A missing file restores
// nothing; a file that is malformed or holds an ID out of range or twice
// is refused whole (the error says why) and restores nothing, so no two
// nodes ever share an ID.
func (a *Allocator) Restore(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read node IDs: %w", err)
	}
	var s saved
	if err := json.Unmarshal(b, &s); err != nil {
		return 0, fmt.Errorf("parse node IDs %s: %w", filepath.Join(dir, StateFile), err)
	}
	owner := map[uint16]string{}
	for name, id := range s.Nodes {
		if name == "" {
			return 0, fmt.Errorf("node IDs %s: an ID without a node name", filepath.Join(dir, StateFile))
		}
		if id < minID {
			return 0, fmt.Errorf("node IDs %s: node %q: ID %d out of range [%d, %d]", filepath.Join(dir, StateFile), name, id, minID, maxID)
		}
		if other, dup := owner[id]; dup {
			return 0, fmt.Errorf("node IDs %s: ID %d held by both %q and %q", filepath.Join(dir, StateFile), id, other, name)
		}
		owner[id] = name
	}
	for name, id := range s.Nodes {
		a.ids[name] = id
	}
	return len(s.Nodes), nil
}

// Save writes the allocations to dir, atomically (a rename), so a crash
// leaves the old file or the new one.
func (a *Allocator) Save(dir string) error {
	b, err := json.Marshal(saved{Nodes: a.ids})
	if err != nil {
		return fmt.Errorf("encode node IDs: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("save node IDs: %w", err)
	}
	tmp, err := os.CreateTemp(dir, StateFile+".*")
	if err != nil {
		return fmt.Errorf("save node IDs: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("save node IDs: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save node IDs: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, StateFile)); err != nil {
		return fmt.Errorf("save node IDs: %w", err)
	}
	return nil
}

// ErrExhausted: every ID is taken; the node is listed without one.
var ErrExhausted = errors.New("no free node ID")

// Sync makes the allocations follow the nodes table: every node has an
// ID (its own from before, else the lowest free one). complete says the
// table holds every node (its initializers are done): only then are the
// IDs of nodes not in it freed. Before that, a node the agent knew
// before its restart that the table has not listed yet keeps its ID.
// changed says whether an allocation was added or freed (the state file
// is then out of date).
func (a *Allocator) Sync(nodes []Node, complete bool) (changed bool, err error) {
	in := map[string]bool{}
	a.ips = map[string][]netip.Addr{}
	for _, n := range nodes {
		in[n.Name] = true
		a.ips[n.Name] = n.IPs
	}
	if complete {
		for name := range a.ids {
			if !in[name] {
				delete(a.ids, name)
				changed = true
			}
		}
	}
	var errs []error
	for _, n := range nodes {
		if _, ok := a.ids[n.Name]; ok {
			continue
		}
		id, ok := a.free()
		if !ok {
			errs = append(errs, fmt.Errorf("node %q: %w", n.Name, ErrExhausted))
			continue
		}
		a.ids[n.Name] = id
		changed = true
	}
	return changed, errors.Join(errs...)
}

// free is the lowest ID no node holds.
func (a *Allocator) free() (uint16, bool) {
	used := make(map[uint16]bool, len(a.ids))
	for _, id := range a.ids {
		used[id] = true
	}
	for id := minID; id <= maxID; id++ {
		if !used[uint16(id)] {
			return uint16(id), true
		}
	}
	return 0, false
}

// ID is a node's ID (false for a node without one).
func (a *Allocator) ID(name string) (uint16, bool) {
	id, ok := a.ids[name]
	return id, ok
}

// Dump is GET /v1/node/ids: each node of the last Sync that has an ID,
// with its addresses, by ID.
func (a *Allocator) Dump() []*models.NodeID {
	out := []*models.NodeID{}
	for name, ips := range a.ips {
		id, ok := a.ids[name]
		if !ok {
			continue
		}
		v := int64(id)
		n := &models.NodeID{ID: &v, Ips: []string{}}
		for _, ip := range ips {
			n.Ips = append(n.Ips, ip.Unmap().String())
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(x, y *models.NodeID) int { return int(*x.ID - *y.ID) })
	return out
}
