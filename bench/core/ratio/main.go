// Command ratio reads bench/core's results ("TREE NAME VALUE UNIT" per
// line, trees old and new) and prints, per measurement with at least
// -min samples in each tree, the new/old ratio of the medians with a 95%
// bootstrap interval, and the same ratio between two halves of the old
// samples (odd and even in the order they were taken: an A/A comparison
// under the same machine, which is what "the machine's noise" means for
// that run). A ratio whose interval holds 1 is not told apart from noise.
//
//	ratio [-min 6] [-resamples 10000] results
//
// The resampling uses a fixed seed, so a results file always reads the
// same.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	minSamples := flag.Int("min", 6, "measurements with fewer samples per tree are left out")
	resamples := flag.Int("resamples", 10000, "bootstrap resamples")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: ratio [-min N] [-resamples N] results")
		os.Exit(2)
	}
	samples, order, err := read(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	fmt.Printf("%-40s %5s %10s %10s %22s %22s  %s\n", "measurement", "n", "old med", "new med",
		"new/old [95%]", "A/A old [95%]", "reading")
	for _, name := range order {
		o, n := samples[key{"old", name}], samples[key{"new", name}]
		if len(o) < *minSamples || len(n) < *minSamples {
			continue
		}
		r, lo, hi := bootstrapRatio(rng, o, n, *resamples)
		var odd, even []float64
		for i, v := range o {
			if i%2 == 0 {
				even = append(even, v)
			} else {
				odd = append(odd, v)
			}
		}
		ar, alo, ahi := bootstrapRatio(rng, even, odd, *resamples)
		fmt.Printf("%-40s %2d/%-2d %10.2f %10.2f %6.2f [%5.2f, %5.2f] %6.2f [%5.2f, %5.2f]  %s\n", name,
			len(o), len(n), median(o), median(n), r, lo, hi, ar, alo, ahi, reading(lo, hi))
	}
}

type key struct{ tree, name string }

// read returns each tree's samples per measurement, in file order, and
// the measurements in the order they first appear.
func read(path string) (map[key][]float64, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open results: %w", err)
	}
	defer f.Close()
	samples := map[key][]float64{}
	var order []string
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 {
			continue
		}
		v, err := strconv.ParseFloat(fields[2], 64)
		if err != nil {
			return nil, nil, fmt.Errorf("%s line %d: value %q: %w", path, line, fields[2], err)
		}
		k := key{fields[0], fields[1]}
		if !slices.Contains(order, k.name) {
			order = append(order, k.name)
		}
		samples[k] = append(samples[k], v)
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("read results: %w", err)
	}
	return samples, order, nil
}

// bootstrapRatio is median(b)/median(a) and its 2.5th and 97.5th
// percentiles over resamples drawn with replacement from each.
func bootstrapRatio(rng *rand.Rand, a, b []float64, resamples int) (ratio, lo, hi float64) {
	ratio = median(b) / median(a)
	ratios := make([]float64, resamples)
	ra, rb := make([]float64, len(a)), make([]float64, len(b))
	for i := range ratios {
		for j := range ra {
			ra[j] = a[rng.IntN(len(a))]
		}
		for j := range rb {
			rb[j] = b[rng.IntN(len(b))]
		}
		ratios[i] = median(rb) / median(ra)
	}
	slices.Sort(ratios)
	return ratio, ratios[resamples*25/1000], ratios[resamples*975/1000]
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	m := len(s)
	if m%2 == 1 {
		return s[m/2]
	}
	return (s[m/2-1] + s[m/2]) / 2
}

// reading says whether the interval tells the trees apart.
func reading(lo, hi float64) string {
	switch {
	case lo > 1:
		return "new slower"
	case hi < 1:
		return "new faster"
	default:
		return "within noise"
	}
}
