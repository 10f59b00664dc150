package ipcache

import (
	"cmp"
	"encoding/json"
	"fmt"
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
// are immutable once in the table: a change is a new object. The
// effective claim is held inline (Resolved, Seq) and only the others in
// a slice: almost every prefix has one claim (a pod's address), and one
// object per prefix, not an object and a slice, is what the agent holds
// for each of 50,000 remote pods.
type PrefixClaims struct {
	Prefix netip.Prefix
	// Resolved is the effective claim's entry: the one the backend
	// should hold.
	Resolved Entry
	// Seq is the effective claim's order (Claim.Seq).
	Seq uint64
	// Shadowed are the other claims, effective first: by source, highest
	// first, then most recent first. Nil when the prefix has one claim.
	Shadowed []Claim
	// Status is the reconciler's: pending, done, or error with message.
	Status reconciler.Status
}

// Claims returns every claim on the prefix, the effective one first (a
// new slice: the object is not changed through it).
func (p *PrefixClaims) Claims() []Claim {
	out := make([]Claim, 0, 1+len(p.Shadowed))
	out = append(out, Claim{Entry: p.Resolved, Seq: p.Seq})
	return append(out, p.Shadowed...)
}

// setClaims holds claims (sorted, effective first, not empty) in p: the
// first inline, the rest in a slice of their own (a sub-slice would keep
// the first one's copy alive as well).
func (p *PrefixClaims) setClaims(claims []Claim) {
	p.Resolved, p.Seq = claims[0].Entry, claims[0].Seq
	p.Shadowed = nil
	if len(claims) > 1 {
		p.Shadowed = slices.Clone(claims[1:])
	}
}

// prefixClaimsJSON is the dump's form (`tendril statedb dump`, the
// agent's statedb API): every claim in one list, as before the effective
// one was held apart.
type prefixClaimsJSON struct {
	Prefix   netip.Prefix
	Claims   []Claim
	Resolved Entry
	Status   reconciler.Status
}

// MarshalJSON writes the claims as one list, effective first.
func (p *PrefixClaims) MarshalJSON() ([]byte, error) {
	return json.Marshal(prefixClaimsJSON{Prefix: p.Prefix, Claims: p.Claims(), Resolved: p.Resolved, Status: p.Status})
}

// UnmarshalJSON reads what MarshalJSON wrote (a remote reader of the
// table).
func (p *PrefixClaims) UnmarshalJSON(b []byte) error {
	var j prefixClaimsJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	if len(j.Claims) == 0 {
		return fmt.Errorf("ipcache %s: no claims", j.Prefix)
	}
	*p = PrefixClaims{Prefix: j.Prefix, Status: j.Status}
	p.setClaims(j.Claims)
	return nil
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
	claims := p.Claims()
	others := make([]string, 0, len(claims))
	for _, c := range claims {
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
