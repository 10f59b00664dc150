package freeport

import (
	"net"
	"slices"
	"strconv"
	"testing"
)

func TestPickRange(t *testing.T) {
	for _, tc := range []struct {
		eLo, eHi, lo, hi int
		fail             bool
	}{
		{eLo: 32768, eHi: 60999, lo: 10000, hi: 32767},
		{eLo: 1024, eHi: 40000, lo: 40001, hi: 65535},
		{eLo: 1024, eHi: 65000, fail: true},
	} {
		lo, hi, err := pickRange(tc.eLo, tc.eHi)
		if tc.fail {
			if err == nil {
				t.Errorf("ephemeral %d-%d: got %d-%d, want an error", tc.eLo, tc.eHi, lo, hi)
			}
			continue
		}
		if err != nil || lo != tc.lo || hi != tc.hi {
			t.Errorf("ephemeral %d-%d: got %d-%d %v, want %d-%d", tc.eLo, tc.eHi, lo, hi, err, tc.lo, tc.hi)
		}
	}
}

func TestParseRange(t *testing.T) {
	if lo, hi, err := parseRange("32768\t60999\n"); err != nil || lo != 32768 || hi != 60999 {
		t.Errorf("got %d-%d %v", lo, hi, err)
	}
	for _, bad := range []string{"", "1", "a b", "5 4"} {
		if _, _, err := parseRange(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestLoopbackOutsideTheEphemeralRange: the port is bindable, outside
// the kernel's source-port range and not one of those to avoid.
func TestLoopbackOutsideTheEphemeralRange(t *testing.T) {
	eLo, eHi, err := ephemeral()
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for range 50 {
		p, err := Loopback(got...)
		if err != nil {
			t.Fatal(err)
		}
		if p >= eLo && p <= eHi {
			t.Fatalf("port %d is in the ephemeral range %d-%d", p, eLo, eHi)
		}
		if slices.Contains(got, p) {
			t.Fatalf("port %d picked twice", p)
		}
		got = append(got, p)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(got[0]))
	if err != nil {
		t.Fatalf("bind the picked port: %v", err)
	}
	ln.Close()
}
