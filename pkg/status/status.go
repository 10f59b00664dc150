// Package status collects the subsystems' parts of `tendril status`: each
// subsystem cell provides a Contribution into a hive value group, and the
// daemon status handler (pkg/agent/daemonapi) orders them by their Order
// key, so the handler does not name the subsystems.
package status

import (
	"sort"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/api/v1/ext"
)

// The order of the sections is part of what users and tests read, so each
// contribution carries an Order key, and the subsystem that owns a section
// owns its key (a constant in its package, with the neighbours it sits
// between): adding a subsystem never edits this package. The keys in use,
// smallest first: KVStore 10, Kubernetes 20, Datapath 30, Routing 35, Masquerade 40,
// Services 50, L2 announcements 60, Hubble 70, Node health 75, Tables 80,
// IPAM and endpoints 90, Identities 100; a new one takes a free value
// between the sections it belongs between. Equal keys keep the order of
// the cell list.

// Contribution is one subsystem's part of the status.
type Contribution struct {
	// Order places Section among the others: smaller first.
	Order int
	// Section returns the subsystem's section; false leaves it out (e.g.
	// nothing to show yet). Nil: no section.
	Section func() (ext.Section, bool)
	// Model fills the subsystem's fields of the Cilium v1 status (those
	// the handler otherwise reports as disabled). Nil: none.
	Model func(*ext.StatusResponse)
}

// Out is what a subsystem cell provides: its contributions (none when the
// subsystem is off).
type Out struct {
	cell.Out
	Contributions []Contribution `group:"status-contributions,flatten"`
}

// In is what the status handler takes: every contribution.
type In struct {
	cell.In
	Contributions []Contribution `group:"status-contributions"`
}

// Provide returns Out holding c; a provider's one-liner.
func Provide(c ...Contribution) Out { return Out{Contributions: c} }

// Always is a Section func that always shows the section fn returns.
func Always(fn func() ext.Section) func() (ext.Section, bool) {
	return func() (ext.Section, bool) { return fn(), true }
}

// Sections returns the contributions' sections in their order.
func Sections(cs []Contribution) []ext.Section {
	sorted := append([]Contribution(nil), cs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Order < sorted[j].Order })
	var out []ext.Section
	for _, c := range sorted {
		if c.Section == nil {
			continue
		}
		if sec, ok := c.Section(); ok {
			out = append(out, sec)
		}
	}
	return out
}

// FillModels lets each contribution fill its fields of resp.
func FillModels(cs []Contribution, resp *ext.StatusResponse) {
	for _, c := range cs {
		if c.Model != nil {
			c.Model(resp)
		}
	}
}
