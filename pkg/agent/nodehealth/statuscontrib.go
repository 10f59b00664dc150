package nodehealth

import (
	"fmt"
	"strings"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// after Hubble (70), before the tables (80).
const statusOrder = 75

// statusContribution is node health's section of `tendril status`; none
// with health checking off.
func statusContribution(c *Checker) status.Out {
	if c == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(c.StatusSection)})
}

// StatusSection is "N/M nodes reachable" over the nodes table, and a
// line per node that is not: what failed on which address, or that it
// has not been probed yet.
func (c *Checker) StatusSection() ext.Section {
	txn := c.db.ReadTxn()
	sec := ext.Section{Title: "Node health"}
	var lines []ext.Line
	total, reachable := 0, 0
	for peer := range c.peers.All(txn) {
		total++
		st, _, ok := c.table.Get(txn, StatusByNode.Query(peer.Name))
		switch {
		case !ok:
			lines = append(lines, ext.Line{Key: peer.Name, Value: "not probed yet"})
		case st.Reachable():
			reachable++
		default:
			lines = append(lines, ext.Line{Key: peer.Name, Value: "unreachable: " + failures(st)})
		}
	}
	sec.Lines = append([]ext.Line{{Key: "Nodes", Value: fmt.Sprintf("%d/%d reachable (probed every %s on port %d)",
		reachable, total, c.cfg.HealthCheckInterval, c.cfg.HealthPort)}}, lines...)
	// This node's own health endpoint, probed from the node.
	if st, _, ok := c.table.Get(txn, StatusByNode.Query(c.node)); ok {
		if a, ok := st.HealthEndpoint(); ok && a.Reachable() {
			sec.Lines = append(sec.Lines, ext.Line{Key: "Local endpoint", Value: a.IP.String() + " reachable"})
		} else {
			sec.Lines = append(sec.Lines, ext.Line{Key: "Local endpoint", Value: "unreachable: " + failures(st)})
		}
	}
	return sec
}

// failures says which probes of which addresses failed.
func failures(st *Status) string {
	if len(st.Addresses) == 0 {
		return "no address"
	}
	var out []string
	for _, a := range st.Addresses {
		if !a.ICMP.Reachable {
			out = append(out, fmt.Sprintf("%s icmp: %s", a.IP, a.ICMP.Error))
		}
		if !a.HTTP.Reachable {
			out = append(out, fmt.Sprintf("%s http: %s", a.IP, a.HTTP.Error))
		}
	}
	return strings.Join(out, "; ")
}
