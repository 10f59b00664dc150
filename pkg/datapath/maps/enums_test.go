package maps

import "testing"

// The flags CTEntry shows by Src and Dst are Go's own: they must not take
// a bit the map stores (enums_gen.go), or a stored flag would read as one
// of them.
func TestCTViewFlagsDistinctFromStored(t *testing.T) {
	stored := CTFlagSeenReply | CTFlagClosing | CTFlagAStarted | CTFlagANotLocal | CTFlagBNotLocal
	if view := CTFlagSrcNotLocal | CTFlagDstNotLocal; view&stored != 0 {
		t.Fatalf("CTEntry's Src/Dst flags %#x overlap the stored flags %#x", view, stored)
	}
}

// Every reason fits the metrics map, has a name and is a drop exactly when
// the datapath drops with it.
func TestReasons(t *testing.T) {
	names := ReasonNames()
	if len(names) != 33 {
		t.Fatalf("%d reasons, want 33", len(names))
	}
	for r, name := range names {
		if r >= reasonMax {
			t.Errorf("reason %d (%s) does not fit the metrics map (%d reasons)", r, name, reasonMax)
		}
		if got := ReasonName(r); got != name || name == "" {
			t.Errorf("ReasonName(%d) = %q, want %q", r, got, name)
		}
	}
	for r, drop := range map[uint8]bool{
		ReasonForwarded: false, ReasonCTRelated: false, ReasonDeliveredDirect: false,
		ReasonPolicyDenied: true, ReasonMalformed: true, ReasonUnknownInterface: true, ReasonSvcNoBackend: true, ReasonNatFailed: true,
		ReasonMasqueraded: false, ReasonMasqReply: false, ReasonMasqNoPort: true, ReasonMasqTableFull: true, ReasonMasqFailed: true,
		ReasonNodeport: false, ReasonNodeportReply: false, ReasonNodeportICMPError: false, ReasonSvcNoLocalBackend: true, ReasonSourceRangeDenied: true, ReasonNodeportNoRoute: true,
		ReasonDsrMtuExceeded: true, ReasonToOverlay: false, ReasonNoTunnelKey: true, ReasonTunnelNotANode: true, ReasonUnencrypted: true, ReasonDnsNameDenied: true,
	} {
		if IsDrop(r) != drop {
			t.Errorf("IsDrop(%s) = %v, want %v", ReasonName(r), !drop, drop)
		}
	}
	if got := ReasonName(99); got != "Reason 99" {
		t.Errorf("ReasonName(99) = %q", got)
	}
	if got := ReasonName(ReasonPolicyDenyRule); got != "Policy denied by deny rule" {
		t.Errorf("ReasonName(ReasonPolicyDenyRule) = %q", got)
	}
}
