// Package dnsfallback turns an endpoint's DNS rules into the entries of
// the datapath's DNS fallback (bpf/lib/dnsfb.h, tdr_dns_fallback_v1): the
// names the datapath lets through while no DNS proxy listens. A name is
// held as the 64-bit FNV-1a hash of its lowercased wire format (length
// octets, labels, the final zero), the same hash the datapath computes
// over a query's QNAME. What the map can express: an exact name
// (matchName, or a pattern without `*`) and a pattern `*.rest` (any first
// label, then exactly rest: the hash of rest's wire format). Any other
// pattern (a lone `*`, `api-*.example`, `a.*.example`) makes the endpoint's
// names unfiltered during the fallback (All).
package dnsfallback

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Kinds of entries: the datapath's DNSFB_KIND_* (bpf/lib/enums.h; the
// agent checks at build time that they agree).
const (
	KindName   uint8 = 1
	KindSuffix uint8 = 2
	KindAll    uint8 = 3
	KindFilter uint8 = 4
)

// FNV-1a 64-bit parameters.
const (
	fnvOffset uint64 = 0xcbf29ce484222325
	fnvPrime  uint64 = 0x100000001b3
)

// Hash is the 64-bit FNV-1a of wire with ASCII letters lowercased, as the
// datapath hashes a query's name (length octets are at most 63, never a
// letter).
func Hash(wire []byte) uint64 {
	h := fnvOffset
	for _, b := range wire {
		if b >= 'A' && b <= 'Z' {
			b |= 0x20
		}
		h ^= uint64(b)
		h *= fnvPrime
	}
	return h
}

// Wire is name (with or without its trailing dot) in DNS wire format:
// each label behind its length, then a zero. The root name is an error,
// as are empty labels, labels over 63 bytes and names over 255 bytes.
func Wire(name string) ([]byte, error) {
	n := strings.TrimSuffix(name, ".")
	if n == "" {
		return nil, errors.New("empty name")
	}
	out := make([]byte, 0, len(n)+2)
	for _, label := range strings.Split(n, ".") {
		if label == "" || len(label) > 63 {
			return nil, fmt.Errorf("name %q: a label is empty or longer than 63 bytes", name)
		}
		out = append(out, byte(len(label)))
		out = append(out, label...)
	}
	out = append(out, 0)
	if len(out) > 255 {
		return nil, fmt.Errorf("name %q is longer than 255 bytes in wire format", name)
	}
	return out, nil
}

// Entry is one allowed name of an endpoint: KindName or KindSuffix and
// its hash.
type Entry struct {
	Kind uint8
	Hash uint64
}

// Names are the entries of an endpoint's DNS rules.
type Names struct {
	// Entries are the exact names and *.rest suffixes.
	Entries map[Entry]struct{}
	// All: a rule the map cannot express (or a rule allowing every name):
	// the endpoint's names pass unfiltered during the fallback.
	All bool
	// Unexpressed are the patterns that made All (for the log).
	Unexpressed []string
}

// Compile turns DNS rules (the union of an endpoint's, over every
// destination) into the fallback's entries. allowAll is a port whose
// rules allow every name (an empty L7 rule set).
func Compile(rules []api.PortRuleDNS, allowAll bool) Names {
	out := Names{Entries: map[Entry]struct{}{}, All: allowAll}
	for _, r := range rules {
		sel := api.FQDNSelector(r)
		if sel.Validate("dns") != nil {
			// Invalid rules are refused before they reach a
			// repository; one that got here allows nothing.
			continue
		}
		if sel.MatchName != "" {
			if w, err := Wire(api.NormalizeName(sel.MatchName)); err == nil {
				out.Entries[Entry{KindName, Hash(w)}] = struct{}{}
			}
			continue
		}
		pat := api.NormalizeName(sel.MatchPattern)
		switch {
		case !strings.Contains(pat, "*"):
			if w, err := Wire(pat); err == nil {
				out.Entries[Entry{KindName, Hash(w)}] = struct{}{}
			}
		case strings.HasPrefix(pat, "*.") && !strings.Contains(pat[2:], "*"):
			if w, err := Wire(pat[2:]); err == nil {
				out.Entries[Entry{KindSuffix, Hash(w)}] = struct{}{}
			}
		default:
			out.All = true
			out.Unexpressed = append(out.Unexpressed, pat)
		}
	}
	return out
}
