package maps

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// TestPrivilegedDSRRecords: DSR records of both families read back as
// written, one of mixed families is refused, and the GC takes those whose
// flow has no live conntrack entry (none, or an expired one) once old
// enough, leaving live flows and fresh records.
func TestPrivilegedDSRRecords(t *testing.T) {
	m := newUnpinnedMaps(t)
	spec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	var mp [2]*ebpf.Map
	for i, name := range []string{DSR4MapName, DSR6MapName} {
		ms := spec.Maps[name].Copy()
		ms.Pinning = ebpf.PinNone
		if mp[i], err = ebpf.NewMap(ms); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mp[i].Close() })
	}
	dsr := (&NATMaps{DSR4: mp[0], DSR6: mp[1]}).DSRMap()
	ct := m.CTMap()
	now := MonotonicNow()
	old := now - uint64(NATMinAge.Nanoseconds()) - 1e9
	a := netip.MustParseAddr
	fe := a("172.30.0.12")
	live := DSRFlow{Proto: 6, Client: a("198.51.100.2"), ClientPort: 40000, Backend: a("10.244.0.3"), BackendPort: 80, Frontend: fe, FrontendPort: 30080, Created: old}
	gone := DSRFlow{Proto: 17, Client: a("198.51.100.2"), ClientPort: 40001, Backend: a("10.244.0.3"), BackendPort: 81, Frontend: fe, FrontendPort: 30081, Created: old}
	expired := DSRFlow{Proto: 6, Client: a("198.51.100.2"), ClientPort: 40002, Backend: a("10.244.0.3"), BackendPort: 80, Frontend: fe, FrontendPort: 30080, Created: old}
	fresh := DSRFlow{Proto: 6, Client: a("198.51.100.2"), ClientPort: 40003, Backend: a("10.244.0.3"), BackendPort: 80, Frontend: fe, FrontendPort: 30080, Created: now}
	fe6 := a("fd00:172:30:1::11")
	live6 := DSRFlow{Proto: 6, Client: a("2001:db8::2"), ClientPort: 40000, Backend: a("fd00:10:244::3"), BackendPort: 80, Frontend: fe6, FrontendPort: 30080, Created: old}
	gone6 := DSRFlow{Proto: 17, Client: a("2001:db8::2"), ClientPort: 40001, Backend: a("fd00:10:244::3"), BackendPort: 81, Frontend: fe6, FrontendPort: 30081, Created: old}
	for _, f := range []DSRFlow{live, gone, expired, fresh, live6, gone6} {
		if err := dsr.Upsert(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := dsr.Upsert(DSRFlow{Client: a("2001:db8::1"), Backend: a("10.244.0.3"), Frontend: fe}); err == nil {
		t.Fatal("an IPv6 client of an IPv4 backend was accepted")
	}
	for f, expires := range map[DSRFlow]uint64{live: now + 60e9, expired: now - 1, live6: now + 60e9} {
		if err := ct.Upsert(CTEntry{Proto: f.Proto, Src: f.Client, SrcPort: f.ClientPort, Dst: f.Backend, DstPort: f.BackendPort, Expires: expires}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := dsr.List()
	if err != nil || len(list) != 6 {
		t.Fatalf("listed %+v (%v), want 6 records", list, err)
	}
	for _, f := range list {
		if (f.Frontend != fe && f.Frontend != fe6) || f.Frontend.Is4() != f.Client.Is4() || (f.FrontendPort != 30080 && f.FrontendPort != 30081) {
			t.Errorf("record %+v: frontend read back wrong", f)
		}
	}
	res, err := dsr.CollectDSR(ct, now)
	if err != nil || res.Seen != 6 || res.Deleted != 3 {
		t.Fatalf("sweep %+v (%v), want 6 seen, 3 deleted", res, err)
	}
	list, _ = dsr.List()
	left := map[DSRFlow]bool{}
	for _, f := range list {
		left[f] = true
	}
	if len(list) != 3 || !left[live] || !left[fresh] || !left[live6] {
		t.Fatalf("left %+v, want the live records of both families and the fresh one", list)
	}
}
