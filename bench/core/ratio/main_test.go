package main

import (
	"math/rand/v2"
	"testing"
)

func TestBootstrapRatioTellsApartOnlyWhatDiffers(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	old := []float64{10, 10.5, 9.8, 10.1, 10.3, 9.9, 10.2, 10.4}
	slower := []float64{11, 11.2, 10.9, 11.1, 11.0, 10.8, 11.3, 11.1}
	same := []float64{10.1, 9.9, 10.4, 10.0, 10.2, 10.3, 9.8, 10.5}
	if _, lo, hi := bootstrapRatio(rng, old, slower, 2000); reading(lo, hi) != "new slower" {
		t.Errorf("10%% slower read as %q [%.3f, %.3f]", reading(lo, hi), lo, hi)
	}
	if _, lo, hi := bootstrapRatio(rng, slower, old, 2000); reading(lo, hi) != "new faster" {
		t.Errorf("10%% faster read as %q [%.3f, %.3f]", reading(lo, hi), lo, hi)
	}
	if _, lo, hi := bootstrapRatio(rng, old, same, 2000); reading(lo, hi) != "within noise" {
		t.Errorf("the same distribution read as %q [%.3f, %.3f]", reading(lo, hi), lo, hi)
	}
}

func TestMedian(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median(3,1,2) = %v", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median(4,1,3,2) = %v", m)
	}
}
