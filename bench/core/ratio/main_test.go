package main

import (
	"math/rand/v2"
	"testing"
)

func TestPairsTellApartOnlyWhatDiffers(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// The load drifts: the samples double over the run, in both trees.
	old := []float64{10, 12, 14, 16, 18, 20, 22, 24}
	slower := []float64{11, 13.2, 15.4, 17.6, 19.8, 22, 24.2, 26.4}
	same := []float64{10.2, 11.8, 14.1, 15.9, 18.2, 19.9, 22.1, 23.8}
	read := func(old, new []float64) string {
		_, lo, hi := bootstrapMedian(rng, pairRatios(old, new), 2000)
		return reading(lo, hi)
	}
	if got := read(old, slower); got != "new slower" {
		t.Errorf("10%% slower in every pair read as %q", got)
	}
	if got := read(slower, old); got != "new faster" {
		t.Errorf("10%% faster in every pair read as %q", got)
	}
	if got := read(old, same); got != "within noise" {
		t.Errorf("the same trees read as %q", got)
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
