package soak

import (
	"math"
	"strings"
	"testing"
)

func TestFitSlope(t *testing.T) {
	// y = 100 + 3t exactly: slope 3, no noise.
	ts := []float64{0, 1, 2, 3, 4}
	ys := []float64{100, 103, 106, 109, 112}
	b, se, err := FitSlope(ts, ys)
	if err != nil || math.Abs(b-3) > 1e-9 || se > 1e-9 {
		t.Fatalf("exact line: slope %g stderr %g err %v, want 3, 0", b, se, err)
	}
	// Flat with noise: slope 0, a stderr of its own.
	ys = []float64{100, 110, 100, 110, 100, 110}
	b, se, err = FitSlope([]float64{0, 1, 2, 3, 4, 5}, ys)
	if err != nil {
		t.Fatal(err)
	}
	if s := (Slope{LateKiBPerMin: b, LateStdErr: se}); !s.Flat() || se == 0 {
		t.Fatalf("noisy flat series: slope %g stderr %g, want flat with noise", b, se)
	}
	if s := (Slope{LateKiBPerMin: 50, LateStdErr: 1}); s.Flat() {
		t.Fatal("a slope of 50 ± 1 is not flat")
	}
	if _, _, err := FitSlope([]float64{0, 1}, []float64{1, 2}); err == nil {
		t.Fatal("two samples: want an error")
	}
	if _, _, err := FitSlope([]float64{1, 1, 1}, []float64{1, 2, 3}); err == nil {
		t.Fatal("samples all at one time: want an error")
	}
}

func TestCompare(t *testing.T) {
	node := func(g, fds int, pins ...string) *nodeSnap {
		s := &nodeSnap{ipam: set{}, endpoints: set{}, bpfEndpoints: set{}, policy: set{}, ipcache: set{}, pins: set{}, ifaces: set{},
			ct: set{}, nat: set{}, goroutines: g, fds: fds}
		for _, p := range pins {
			s.pins[p] = true
		}
		return s
	}
	before := &clusterSnap{teps: set{"soak/server": true}, identities: set{"1": true}, netns: set{"sk-node1": true},
		nodes: map[string]*nodeSnap{"node1": node(100, 40, "a")}}
	clean := &clusterSnap{teps: set{"soak/server": true}, identities: set{}, netns: set{"sk-node1": true},
		nodes: map[string]*nodeSnap{"node1": node(110, 38, "a")}}
	for _, c := range compare(before, clean, Allowance{Goroutines: 25, FDs: 10}) {
		if c.Leaked() {
			t.Errorf("clean end: %s on %q leaked %d", c.What, c.Node, c.N)
		}
	}
	leaky := &clusterSnap{teps: set{"soak/server": true, "soak/soak-7": true}, identities: set{"1": true}, netns: set{"sk-node1": true, "sk-pod-0123456789ab": true},
		nodes: map[string]*nodeSnap{"node1": node(200, 40, "a", "b")}}
	leaked := map[string]int{}
	for _, c := range compare(before, leaky, Allowance{Goroutines: 25, FDs: 10}) {
		if c.Leaked() {
			leaked[c.What] = c.N
		}
	}
	want := map[string]int{"TendrilEndpoints": 1, "network namespaces": 1, "bpffs pins": 1, "agent goroutines": 100}
	for what, n := range want {
		if leaked[what] != n {
			t.Errorf("%s: leaked %d, want %d (all: %v)", what, leaked[what], n, leaked)
		}
	}
	if len(leaked) != len(want) {
		t.Errorf("leaked %v, want only %v", leaked, want)
	}
}

// TestParseResident: the three resident-set lines of /proc/PID/status,
// in KiB; a status without one of them is an error, not a zero.
func TestParseResident(t *testing.T) {
	status := "Name:\ttendril-agent\nVmHWM:\t  102568 kB\nVmRSS:\t  100548 kB\nRssAnon:\t   46652 kB\nRssFile:\t   53896 kB\nRssShmem:\t       0 kB\n"
	m, err := parseResident(strings.NewReader(status), 1)
	if err != nil || m != (resident{rss: 100548, anon: 46652, file: 53896}) {
		t.Fatalf("parse: %+v, %v", m, err)
	}
	if _, err := parseResident(strings.NewReader("VmRSS:\t 1 kB\nRssAnon:\t 1 kB\n"), 1); err == nil {
		t.Fatal("no RssFile: want an error")
	}
	if s := (Slope{AnonLateKiBPerMin: 3, AnonLateStdErr: 2, LateKiBPerMin: 50, LateStdErr: 1}); !s.AnonFlat() || s.Flat() {
		t.Fatal("anon 3 ± 2 is flat, RSS 50 ± 1 is not")
	}
}
