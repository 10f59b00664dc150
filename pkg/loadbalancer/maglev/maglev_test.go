package maglev

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func backends(n int) []Backend {
	out := make([]Backend, n)
	for i := range out {
		out[i] = Backend{Key: fmt.Sprintf("10.0.%d.%d:8080", i/250, i%250+1), ID: uint32(i + 1), Weight: 1}
	}
	return out
}

func shares(table []uint32) map[uint32]int {
	s := map[uint32]int{}
	for _, id := range table {
		s[id]++
	}
	return s
}

func TestSizes(t *testing.T) {
	for _, m := range Sizes {
		for d := 2; d*d <= m; d++ {
			if m%d == 0 {
				t.Errorf("size %d is not prime (%d divides it)", m, d)
			}
		}
	}
	if Sizes[0] != 251 || Sizes[len(Sizes)-1] != 131071 || !ValidSize(DefaultSize) {
		t.Errorf("sizes %v, default %d", Sizes, DefaultSize)
	}
	if _, err := Table(backends(3), Config{Size: 1000}); err == nil {
		t.Error("size 1000 accepted")
	}
	if _, err := Table([]Backend{{Key: "a", ID: 1, Weight: 1}, {Key: "a", ID: 2, Weight: 1}}, DefaultConfig()); err == nil {
		t.Error("a key given twice accepted")
	}
}

// Every backend owns M/N entries, give or take one (each round of the fill
// gives every backend one entry).
func TestEvenShares(t *testing.T) {
	for _, m := range []int{251, 16381, 131071} {
		for _, n := range []int{1, 2, 3, 10, 100} {
			table, err := Table(backends(n), Config{Size: m, Seed: 42})
			if err != nil {
				t.Fatal(err)
			}
			s := shares(table)
			if len(s) != n {
				t.Fatalf("M=%d N=%d: %d backends in the table", m, n, len(s))
			}
			lo, hi := m/n, (m+n-1)/n
			for id, c := range s {
				if id == 0 || c < lo || c > hi {
					t.Errorf("M=%d N=%d: backend %d owns %d entries, want %d..%d", m, n, id, c, lo, hi)
				}
			}
		}
	}
}

// The table depends on the backends and the seed, not on the order they
// come in: every node computes the same.
func TestDeterministic(t *testing.T) {
	bs := backends(20)
	a, _ := Table(bs, Config{Size: 4093, Seed: 7})
	shuffled := slices.Clone(bs)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	b, _ := Table(shuffled, Config{Size: 4093, Seed: 7})
	if !slices.Equal(a, b) {
		t.Error("the table depends on the backends' order")
	}
	c, _ := Table(bs, Config{Size: 4093, Seed: 8})
	if slices.Equal(a, c) {
		t.Error("another seed gives the same table")
	}
	empty, _ := Table(nil, DefaultConfig())
	if len(empty) != DefaultSize || slices.ContainsFunc(empty, func(id uint32) bool { return id != 0 }) {
		t.Error("a table without backends is not all zeros")
	}
}

// disruption removes backend `gone` of bs and returns the fraction of the
// table's entries that changed although they did not belong to it.
func disruption(t *testing.T, bs []Backend, gone int, cfg Config) float64 {
	t.Helper()
	before, err := Table(bs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rest := slices.Delete(slices.Clone(bs), gone, gone+1)
	after, err := Table(rest, cfg)
	if err != nil {
		t.Fatal(err)
	}
	removed := bs[gone].ID
	moved := 0
	for i := range before {
		if after[i] == removed {
			t.Fatalf("entry %d still names the removed backend", i)
		}
		if before[i] != removed && before[i] != after[i] {
			moved++
		}
	}
	return float64(moved) / float64(len(before))
}

// Removing one of N backends moves its own entries and few others: the
// flows of the other backends keep their backend. Maglev's fill is not
// perfectly stable (a removed backend's turns shift the order in which the
// others claim entries), and the larger the table per backend the smaller
// the shift. Measured, removing each of the first ten backends in turn
// (seed 0), the worst share of the table that moved without having
// belonged to the removed backend: M=16381: N=10 1.42 %, N=100 1.51 %,
// N=1000 0.66 % (the removed backend's own share: 10 %, 1 %, 0.1 %);
// M=131071: 0.19 %, 0.36 %, 0.58 %. Bounds: 2 % at the default size, 1 %
// at 131071.
func TestMinimalDisruption(t *testing.T) {
	for _, tc := range []struct {
		size  int
		bound float64
	}{{DefaultSize, 0.02}, {131071, 0.01}} {
		for _, n := range []int{10, 100, 1000} {
			bs := backends(n)
			worst := 0.0
			for gone := 0; gone < 10; gone++ {
				worst = max(worst, disruption(t, bs, gone, Config{Size: tc.size}))
			}
			t.Logf("M=%d N=%d: at most %.2f%% of the entries moved that did not belong to the removed backend", tc.size, n, 100*worst)
			if worst >= tc.bound {
				t.Errorf("M=%d N=%d: %.2f%% of the entries moved that did not belong to the removed backend, want < %.0f%%",
					tc.size, n, 100*worst, 100*tc.bound)
			}
		}
	}
}

// A backend of weight 3 owns three times the entries of one of weight 1;
// weight 0 owns none.
func TestWeights(t *testing.T) {
	bs := []Backend{{Key: "a", ID: 1, Weight: 1}, {Key: "b", ID: 2, Weight: 3}, {Key: "c", ID: 3, Weight: 1}, {Key: "d", ID: 4, Weight: 0}}
	table, err := Table(bs, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	s := shares(table)
	if s[4] != 0 {
		t.Errorf("a backend of weight 0 owns %d entries", s[4])
	}
	for id, w := range map[uint32]int{1: 1, 2: 3, 3: 1} {
		want := DefaultSize * w / 5
		if d := s[id] - want; d < -2 || d > 2 {
			t.Errorf("backend %d (weight %d) owns %d entries, want %d", id, w, s[id], want)
		}
	}
}
