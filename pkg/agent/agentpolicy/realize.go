package agentpolicy

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/tendril-net/tendril/pkg/policy"
)

// effect is what an entry does for the enforced view: an entry of the
// audit view alone (EnforcedNone) enforces nothing.
type effect uint8

const (
	effectNone effect = iota
	effectAllow
	effectDeny
)

func effectOf(e policy.Entry, ok bool) effect {
	switch {
	case !ok || e.Views.Has(policy.EnforcedNone):
		return effectNone
	case e.Deny:
		return effectDeny
	}
	return effectAllow
}

// writeResult is what one ordered write of an endpoint's map difference
// did.
type writeResult struct {
	// landed is the endpoint's map state after the write: the state it
	// started from with every write that succeeded (a failed write leaves
	// its key as it was), so the next attempt diffs against the truth.
	landed policy.MapState
	// denied is set when an enforced deny entry landed (new, or an allow
	// that became a deny): established flows it covers may be ended.
	denied bool
	// revoked is set when an enforced allow went away.
	revoked bool
	// closed are the allows taken out, or held back, because a deny that
	// overlaps them could not be written (fail closed).
	closed int
	// writes counts the writes that landed; failed those that failed,
	// err joins their errors.
	writes int
	failed int
	err    error
}

// writeOrdered writes the difference between cur (what the endpoint's map
// holds) and want, ordered so that no state in between lets through what
// neither cur nor want allows, and so that a failed write does not stop
// the ones that take access away:
//
//  1. new enforced denies (and allows that become denies);
//  2. enforced allows that go away (deleted, or left to the audit view);
//  3. the denies of step 1 that failed, again (step 2 may have made room);
//     an allow that overlaps a deny still missing is deleted (fail
//     closed: the deny would have overridden it), and the missing denies
//     are tried once more;
//  4. new allows and the other changes, except allows overlapping a
//     deny still missing;
//  5. entries that go away and allowed nothing (denies, audit-only ones);
//  6. the writes of step 4 that failed, again (step 5 may have made room).
//
// Every write is attempted whatever failed before it; the error joins
// the failures.
func writeOrdered(pm PolicyMap, epID uint16, cur, want policy.MapState) writeResult {
	res := writeResult{landed: maps.Clone(cur)}
	if res.landed == nil {
		res.landed = policy.MapState{}
	}
	// failures holds the last error per key: a write that fails and then
	// lands on its second attempt is no failure.
	failures := map[policy.Key]error{}
	upsert := func(k policy.Key, e policy.Entry) bool {
		if err := pm.Upsert(toMapKey(epID, k), mapValue(e)); err != nil {
			failures[k] = err
			return false
		}
		delete(failures, k)
		res.landed[k] = e
		res.writes++
		return true
	}
	del := func(k policy.Key) bool {
		if err := pm.Delete(toMapKey(epID, k)); err != nil {
			failures[k] = err
			return false
		}
		delete(failures, k)
		delete(res.landed, k)
		res.writes++
		return true
	}

	upserts, deletes := policy.Diff(cur, want)
	var denies, revokes, others []policy.Key
	for _, k := range sortedKeys(upserts) {
		old, had := cur[k]
		switch now := effectOf(upserts[k], true); {
		case now == effectDeny:
			denies = append(denies, k)
		case now == effectNone && effectOf(old, had) == effectAllow:
			revokes = append(revokes, k)
		default:
			others = append(others, k)
		}
	}
	var revokeDeletes, plainDeletes []policy.Key
	for _, k := range deletes {
		if effectOf(cur[k], true) == effectAllow {
			revokeDeletes = append(revokeDeletes, k)
		} else {
			plainDeletes = append(plainDeletes, k)
		}
	}

	// 1. Denies first: from here on they override what they must.
	var missing []policy.Key
	for _, k := range denies {
		if upsert(k, upserts[k]) {
			res.denied = true
		} else {
			missing = append(missing, k)
		}
	}
	// 2. Allows that go away.
	for _, k := range revokes {
		if upsert(k, upserts[k]) {
			res.revoked = true
		}
	}
	for _, k := range revokeDeletes {
		if del(k) {
			res.revoked = true
		}
	}
	// 3. Missing denies again, then fail closed on what they overlap.
	retryMissing := func() {
		still := missing[:0]
		for _, k := range missing {
			if upsert(k, upserts[k]) {
				res.denied = true
			} else {
				still = append(still, k)
			}
		}
		missing = still
	}
	retryMissing()
	shadowed := func(k policy.Key) bool {
		for _, d := range missing {
			if overlaps(k, d) {
				return true
			}
		}
		return false
	}
	if len(missing) > 0 {
		for _, k := range sortedKeys(res.landed) {
			if effectOf(res.landed[k], true) == effectAllow && shadowed(k) && del(k) {
				res.revoked = true
				res.closed++
			}
		}
		// The allows taken out may have made room.
		retryMissing()
	}
	// 4. New allows and the other changes.
	var retry []policy.Key
	for _, k := range others {
		if effectOf(upserts[k], true) == effectAllow && shadowed(k) {
			res.closed++
			continue
		}
		if !upsert(k, upserts[k]) {
			retry = append(retry, k)
		}
	}
	// 5. Entries that go away and allowed nothing.
	for _, k := range plainDeletes {
		del(k)
	}
	// 6. Failed writes of step 4 again, with the room step 5 made.
	for _, k := range retry {
		upsert(k, upserts[k])
	}

	res.failed = len(failures)
	if len(failures) > 0 {
		errs := make([]error, 0, len(failures))
		for _, k := range sortedKeys(failures) {
			errs = append(errs, failures[k])
		}
		res.err = fmt.Errorf("%d of %d policy map writes of endpoint %d failed: %w", len(errs), len(upserts)+len(deletes), epID, errors.Join(errs...))
	}
	return res
}

// overlaps reports whether some packet matches both keys' peers, protocol
// and ports: an allow that overlaps a deny could let through what the
// deny would have stopped. It errs towards yes: a CIDR identity (node
// local scope) may be any in-cluster peer's too (bpf/lib/policy.h looks
// both up).
func overlaps(a, b policy.Key) bool {
	if a.Direction != b.Direction {
		return false
	}
	if a.Identity != b.Identity && a.Identity != 0 && b.Identity != 0 &&
		!a.Identity.IsLocal() && !b.Identity.IsLocal() {
		return false
	}
	if a.Proto == 0 || b.Proto == 0 {
		return true
	}
	if a.Proto != b.Proto {
		return false
	}
	n := min(a.PrefixLen, b.PrefixLen)
	if n == 0 {
		return true
	}
	mask := ^uint16(0) << (16 - n)
	return a.Port&mask == b.Port&mask
}

// sortedKeys are m's keys in a fixed order (map order would make the
// writes, and which of them fail on a full map, random).
func sortedKeys[V any](m map[policy.Key]V) []policy.Key {
	keys := make([]policy.Key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	return keys
}

func compareKeys(a, b policy.Key) int {
	for _, d := range []int{int(a.Direction) - int(b.Direction), int(a.Identity) - int(b.Identity), int(a.Proto) - int(b.Proto),
		int(a.Port) - int(b.Port), int(a.PrefixLen) - int(b.PrefixLen)} {
		if d != 0 {
			return d
		}
	}
	return 0
}
