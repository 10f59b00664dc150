package epattach

import (
	"bytes"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
)

// TableName is the name of the endpoints table.
const TableName = "endpoints"

// Endpoint is the table's object: what the datapath should hold for one
// local endpoint (its endpoint map entries and its programs on the host
// veth), with the pod it belongs to for inspection. Objects are immutable
// once in the table: a change is a new object.
type Endpoint struct {
	loader.EndpointInfo
	Namespace string
	Pod       string
	// Restored marks an endpoint of the previous run that has not been
	// regenerated yet: the kernel holds what the previous run wrote, and
	// the reconciler leaves it so (its Update writes nothing) while the
	// prune keeps it.
	Restored bool
	// Status is the reconciler's: pending, done, or error with message.
	Status reconciler.Status
}

// IDIndex is the primary index: one object per endpoint ID.
var IDIndex = statedb.Index[*Endpoint, uint16]{
	Name: "id",
	FromObject: func(e *Endpoint) index.KeySet {
		return index.NewKeySet(index.Uint16(e.ID))
	},
	FromKey:    index.Uint16,
	FromString: index.Uint16String,
	Unique:     true,
}

// NewTable creates the endpoints table and registers it with db.
func NewTable(db *statedb.DB) (statedb.RWTable[*Endpoint], error) {
	return statedb.NewTable(db, TableName, IDIndex)
}

// sameSpec reports whether two versions of an endpoint want the same
// kernel state (and show the same pod).
func (e *Endpoint) sameSpec(o *Endpoint) bool {
	a, b := e.EndpointInfo, o.EndpointInfo
	return a.ID == b.ID && a.IfIndex == b.IfIndex && a.IfName == b.IfName && slices.Equal(a.Addresses, b.Addresses) &&
		bytes.Equal(a.MAC, b.MAC) && bytes.Equal(a.HostMAC, b.HostMAC) && a.Identity == b.Identity &&
		a.EnforceIngress == b.EnforceIngress && a.EnforceEgress == b.EnforceEgress &&
		a.AuditIngress == b.AuditIngress && a.AuditEgress == b.AuditEgress && a.L7Ingress == b.L7Ingress && a.L7Egress == b.L7Egress &&
		e.Namespace == o.Namespace && e.Pod == o.Pod && e.Restored == o.Restored
}

// TableHeader implements statedb.TableWritable (`tendril statedb dump`).
func (e *Endpoint) TableHeader() []string {
	return []string{"ID", "Pod", "Interface", "Addresses", "Identity", "Policy", "State", "Status"}
}

// TableRow implements statedb.TableWritable.
func (e *Endpoint) TableRow() []string {
	pod := ""
	if e.Pod != "" {
		pod = e.Namespace + "/" + e.Pod
	}
	addrs := make([]string, len(e.Addresses))
	for i, a := range e.Addresses {
		addrs[i] = a.String()
	}
	var policy []string
	for _, f := range []struct {
		on   bool
		name string
	}{{e.EnforceIngress, "enforce-ingress"}, {e.EnforceEgress, "enforce-egress"}, {e.AuditIngress, "audit-ingress"}, {e.AuditEgress, "audit-egress"}, {e.L7Ingress, "l7-ingress"}, {e.L7Egress, "l7-egress"}} {
		if f.on {
			policy = append(policy, f.name)
		}
	}
	state := "regenerated"
	if e.Restored {
		state = "restored (kept as the previous run left it)"
	}
	return []string{strconv.Itoa(int(e.ID)), pod, e.IfName + " (" + strconv.Itoa(e.IfIndex) + ")", strings.Join(addrs, ","),
		strconv.FormatUint(uint64(e.Identity), 10), strings.Join(policy, ","), state, e.Status.String()}
}

func (e *Endpoint) clone() *Endpoint {
	c := *e
	return &c
}

func (e *Endpoint) setStatus(s reconciler.Status) *Endpoint {
	e.Status = s
	return e
}

func (e *Endpoint) getStatus() reconciler.Status { return e.Status }
