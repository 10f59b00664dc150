package clusterpool

import (
	"errors"
	"net/netip"
	"testing"
)

func TestPoolAllocatesLowestFreeAndExhausts(t *testing.T) {
	p, err := NewPool([]string{"10.0.0.0/23", "10.9.0.0/24"}, 24, true)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Occupy(netip.MustParsePrefix("10.0.1.0/24")) {
		t.Fatal("occupy a pool subnet")
	}
	if p.Occupy(netip.MustParsePrefix("192.168.0.0/24")) {
		t.Fatal("occupied a subnet outside the pool")
	}
	var got []string
	for i := 0; i < 2; i++ {
		c, err := p.Allocate()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c.String())
	}
	if got[0] != "10.0.0.0/24" || got[1] != "10.9.0.0/24" {
		t.Fatalf("allocated %v", got)
	}
	if _, err := p.Allocate(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("want exhausted, got %v", err)
	}
}

func TestPoolIPv6(t *testing.T) {
	p, err := NewPool([]string{"fd00:10::/119"}, 120, false)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := p.Allocate()
	b, _ := p.Allocate()
	if a.String() != "fd00:10::/120" || b.String() != "fd00:10::100/120" {
		t.Fatalf("allocated %v %v", a, b)
	}
	if _, err := p.Allocate(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("want exhausted, got %v", err)
	}
}

func TestPoolRejectsBadInput(t *testing.T) {
	for _, c := range []struct {
		cidrs []string
		mask  int
		v4    bool
	}{
		{[]string{"10.0.0.0/8"}, 33, true},
		{[]string{"10.0.0.0/25"}, 24, true},
		{[]string{"fd00::/64"}, 24, true},
		{[]string{"not-a-cidr"}, 24, true},
	} {
		if _, err := NewPool(c.cidrs, c.mask, c.v4); err == nil {
			t.Errorf("NewPool(%v, %d) accepted", c.cidrs, c.mask)
		}
	}
}
