package ipcache

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
)

// TableName is the name of the ipcache's statedb table.
const TableName = "ipcache"

// Claim is one owner's claim on a prefix with the order it was first made
// in: of one source's claims, the highest Seq wins.
type Claim struct {
	Entry
	Seq uint64
}

// PrefixClaims is the table's object: every claim on one prefix, the
// resolved (effective) entry, and whether the backend holds it. Objects
// are immutable once in the table: a change is a new object.
type PrefixClaims struct {
	Prefix netip.Prefix
	// Claims are sorted effective first: by source, highest first, then
	// most recent first. Never empty: a prefix without claims is deleted.
	Claims []Claim
	// Resolved is the entry the backend should hold (Claims[0]).
	Resolved Entry
	// Status is the reconciler's: pending, done, or error with message.
	Status reconciler.Status
}

// PrefixIndex is the primary index: one object per prefix.
var PrefixIndex = statedb.Index[*PrefixClaims, netip.Prefix]{
	Name: "prefix",
	FromObject: func(p *PrefixClaims) index.KeySet {
		return index.NewKeySet(index.NetIPPrefix(p.Prefix))
	},
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

// NewTable creates the ipcache table and registers it with db.
func NewTable(db *statedb.DB) (statedb.RWTable[*PrefixClaims], error) {
	return statedb.NewTable(db, TableName, PrefixIndex)
}

// TableHeader implements statedb.TableWritable (`tendril statedb dump`).
func (p *PrefixClaims) TableHeader() []string {
	return []string{"Prefix", "Identity", "Source", "Owner", "HostIP", "Claims", "Status"}
}

// TableRow implements statedb.TableWritable.
func (p *PrefixClaims) TableRow() []string {
	host := ""
	if p.Resolved.HostIP.IsValid() {
		host = p.Resolved.HostIP.String()
	}
	others := make([]string, 0, len(p.Claims))
	for _, c := range p.Claims {
		others = append(others, c.Source.String()+":"+string(c.Owner)+"="+strconv.FormatUint(uint64(c.Identity), 10))
	}
	return []string{p.Prefix.String(), strconv.FormatUint(uint64(p.Resolved.Identity), 10), p.Resolved.Source.String(),
		string(p.Resolved.Owner), host, strings.Join(others, " "), p.Status.String()}
}

func (p *PrefixClaims) clone() *PrefixClaims {
	c := *p
	return &c
}

func (p *PrefixClaims) setStatus(s reconciler.Status) *PrefixClaims {
	p.Status = s
	return p
}

func (p *PrefixClaims) getStatus() reconciler.Status { return p.Status }

// compareClaims orders claims effective first: the higher source, then of
// one source the more recent claim.
func compareClaims(a, b Claim) int {
	if a.Source != b.Source {
		return cmp.Compare(b.Source, a.Source)
	}
	return cmp.Compare(b.Seq, a.Seq)
}

// withClaim returns the claims with e.Owner's claim in e.Source set to e.
// A claim keeps its Seq when its owner changes it; a new one is more
// recent than every claim on the prefix.
func withClaim(claims []Claim, e Entry) []Claim {
	out := make([]Claim, 0, len(claims)+1)
	var seq uint64
	found := false
	for _, c := range claims {
		seq = max(seq, c.Seq)
		if c.Source == e.Source && c.Owner == e.Owner {
			c.Entry = e
			found = true
		}
		out = append(out, c)
	}
	if !found {
		out = append(out, Claim{Entry: e, Seq: seq + 1})
	}
	slices.SortStableFunc(out, compareClaims)
	return out
}

// withoutClaim returns the claims without owner's claim in src, and
// whether there was one.
func withoutClaim(claims []Claim, src Source, owner Owner) ([]Claim, bool) {
	i := slices.IndexFunc(claims, func(c Claim) bool { return c.Source == src && c.Owner == owner })
	if i < 0 {
		return claims, false
	}
	return slices.Delete(slices.Clone(claims), i, i+1), true
}
