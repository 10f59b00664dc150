package loader

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// An endpoint under audited policy: what the audit view denies passes
// (unless the enforced view denies it), counted per rule and reported with
// an AUDIT verdict naming the rule; what the enforced view denies drops as
// before. An endpoint that only audits passes everything.
func TestPrivilegedAuditedPolicy(t *testing.T) {
	n := newTestNode(t)
	for _, ep := range []EndpointInfo{
		{ID: 1, IfIndex: n.ifidx, IfName: "tdrtest0", Addresses: []netip.Addr{podA, podA6}, Identity: idA, EnforceEgress: true, AuditEgress: true},
		{ID: 2, IfIndex: n.ifidx2, IfName: "tdrtest1", Addresses: []netip.Addr{podB, podB6}, Identity: idB, AuditIngress: true},
	} {
		if err := n.l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	m := n.l.Maps()
	for p, id := range map[string]uint32{"10.1.0.2/32": idA, "10.1.0.3/32": idB, "10.2.0.0/24": idRemote} {
		if err := m.IPCacheMap().Upsert(netip.MustParsePrefix(p), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	pm := m.PolicyMap()
	put := func(ep uint16, dir uint8, id uint32, proto uint8, port uint16, v maps.PolicyValue) {
		t.Helper()
		k := maps.PolicyKey{EndpointID: ep, Direction: dir, Identity: id, Proto: proto, Port: port}
		if proto != 0 {
			k.PortPrefixLen = 16
		}
		if err := pm.Upsert(k, v); err != nil {
			t.Fatal(err)
		}
	}
	const allowCookie, auditDefault, auditDeny, auditOnlyDefault = 11, 42, 77, 55
	// A's egress: both views allow 80; the enforced view allows 81 and 83
	// where the audit view has nothing (81) or a deny rule (83); 82 is
	// nowhere.
	put(1, maps.DirEgress, idRemote, 6, 80, maps.PolicyValue{Cookie: allowCookie})
	put(1, maps.DirEgress, idRemote, 6, 81, maps.PolicyValue{Cookie: allowCookie, Flags: maps.PolicyFlagANone})
	put(1, maps.DirEgress, idRemote, 6, 83, maps.PolicyValue{Cookie: auditDeny, Flags: maps.PolicyFlagADeny})
	put(1, maps.DirEgress, 0, maps.PolicyAuditCookieProto, 0, maps.PolicyValue{Cookie: auditDefault, Flags: maps.PolicyFlagENone | maps.PolicyFlagANone})
	// B audits ingress only: the audit view allows A on 8080.
	put(2, maps.DirIngress, idA, 6, 8080, maps.PolicyValue{Cookie: 12, Flags: maps.PolicyFlagENone})
	put(2, maps.DirIngress, 0, maps.PolicyAuditCookieProto, 0, maps.PolicyValue{Cookie: auditOnlyDefault, Flags: maps.PolicyFlagENone | maps.PolicyFlagANone})

	er, err := n.l.NewEventReader()
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()

	tcp := func(sport, dport uint16) l4 { return l4{proto: 6, sport: sport, dport: dport, tcpFlags: 0x02} }
	for _, c := range []struct {
		name string
		ep   int
		pkt  []byte
		to   bool
		want uint32
	}{
		{"both views allow", n.ifidx, packet(podA, remote, tcp(40000, 80)), false, actOK},
		{"audit view has no rule: passes, audited", n.ifidx, packet(podA, remote, tcp(40001, 81)), false, actOK},
		{"enforced view denies: dropped", n.ifidx, packet(podA, remote, tcp(40002, 82)), false, actShot},
		{"audit deny rule: passes, audited", n.ifidx, packet(podA, remote, tcp(40003, 83)), false, actOK},
		{"a second connection the audit view has no rule for", n.ifidx, packet(podA, remote, tcp(40004, 81)), false, actOK},
		{"its next packet (established): not audited again", n.ifidx, packet(podA, remote, l4{proto: 6, sport: 40004, dport: 81, tcpFlags: 0x10}), false, actOK},
		{"audit only, allowed by the audit view", n.ifidx2, packet(podA, podB, tcp(40005, 8080)), true, actOK},
		{"audit only, no rule: passes, audited", n.ifidx2, packet(remote, podB, tcp(40006, 9090)), true, actOK},
	} {
		var got uint32
		if c.to {
			got = n.toPod(c.ep, c.pkt)
		} else {
			got = n.fromPod(c.ep, c.pkt)
		}
		if got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
	counts, err := m.AuditMap().Dump()
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]uint64{auditDefault: 2, auditDeny: 1, auditOnlyDefault: 1}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("audit count of rule %d = %d, want %d (all: %v)", k, counts[k], v, counts)
		}
	}
	if len(counts) != len(want) {
		t.Errorf("audit counts %v, want %v", counts, want)
	}
	// The AUDIT events name the rules.
	er.SetDeadline(time.Now().Add(10 * time.Second))
	seen := map[uint32]int{}
	for i := 0; i < 64 && len(seen) < 3; i++ {
		ev, err := er.Read()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == EventPolicyVerdict && ev.Audit && ev.Allowed {
			seen[ev.Cookie]++
		}
	}
	for _, c := range []uint32{auditDefault, auditDeny, auditOnlyDefault} {
		if seen[c] == 0 {
			t.Errorf("no AUDIT event naming rule %d (seen %v)", c, seen)
		}
	}
}
