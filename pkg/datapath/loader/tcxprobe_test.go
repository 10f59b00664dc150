package loader

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestResolveAttachMode: tcx on a kernel without TCX falls back to tc
// with a note naming why; tc stays tc without probing; a probe failing
// for another reason keeps tcx.
func TestResolveAttachMode(t *testing.T) {
	noTCX := func() error { return fmt.Errorf("tcx: %w", ebpf.ErrNotSupported) }
	for _, tc := range []struct {
		name      string
		requested AttachMode
		probe     func() error
		want      AttachMode
		note      string
	}{
		{"tcx available", AttachTCX, func() error { return nil }, AttachTCX, ""},
		{"no tcx", AttachTCX, noTCX, AttachTC, "no TCX"},
		{"tc asked", AttachTC, func() error { t.Error("tc probed tcx"); return nil }, AttachTC, ""},
		{"probe failed otherwise", AttachTCX, func() error { return errors.New("operation not permitted") }, AttachTCX, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mode, note := ResolveAttachMode(tc.requested, tc.probe)
			if mode != tc.want || (tc.note == "") != (note == "") || !strings.Contains(note, tc.note) {
				t.Errorf("ResolveAttachMode(%s) = %s, %q; want %s, a note with %q", tc.requested, mode, note, tc.want, tc.note)
			}
		})
	}
}

// TestPrivilegedProbeTCX: this machine's kernel (6.18) has TCX.
func TestPrivilegedProbeTCX(t *testing.T) {
	testutil.Privileged(t)
	if err := ProbeTCX(); err != nil {
		t.Fatalf("ProbeTCX on a kernel with TCX: %v", err)
	}
}
