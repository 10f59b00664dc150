// Command ratio reads bench/core's results ("TREE NAME VALUE UNIT" per
// line, trees old and new) and prints, per measurement with at least -min
// samples in each tree, how new compares with old and how old compares
// with itself in the same run, each with a 95% bootstrap interval.
//
// The samples are read as pairs: the i-th old and the i-th new sample of
// a measurement were taken back to back (bench/core/run.sh takes the
// starts so), and the reading is the median of the pairs' new/old. On
// this machine the load drifts within a run by more than the trees
// differ; a pair sees one load, so the drift cancels, where medians of
// all old against all new samples would compare two different moments.
// The A/A line pairs consecutive old samples (1st with 2nd, 3rd with
// 4th, ...): its interval is the run's own noise. A ratio whose interval
// holds 1 is not told apart from noise.
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
	fmt.Printf("%-32s %5s %9s %9s %22s %22s  %s\n", "measurement", "pairs", "old med", "new med",
		"new/old [95%]", "A/A old [95%]", "reading")
	for _, name := range order {
		o, n := samples[key{"old", name}], samples[key{"new", name}]
		if len(o) < *minSamples || len(n) < *minSamples {
			continue
		}
		pairs := pairRatios(o, n)
		r, lo, hi := bootstrapMedian(rng, pairs, *resamples)
		var aa []float64
		for i := 0; i+1 < len(o); i += 2 {
			aa = append(aa, o[i+1]/o[i])
		}
		ar, alo, ahi := bootstrapMedian(rng, aa, *resamples)
		fmt.Printf("%-32s %5d %9.2f %9.2f %6.2f [%5.2f, %5.2f] %6.2f [%5.2f, %5.2f]  %s\n", name,
			len(pairs), median(o), median(n), r, lo, hi, ar, alo, ahi, reading(lo, hi))
	}
}

// pairRatios is new[i]/old[i] for the pairs both trees have.
func pairRatios(old, new []float64) []float64 {
	out := make([]float64, min(len(old), len(new)))
	for i := range out {
		out[i] = new[i] / old[i]
	}
	return out
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

// bootstrapMedian is the median of vs and its 2.5th and 97.5th
// percentiles over resamples drawn from vs with replacement.
func bootstrapMedian(rng *rand.Rand, vs []float64, resamples int) (med, lo, hi float64) {
	meds := make([]float64, resamples)
	r := make([]float64, len(vs))
	for i := range meds {
		for j := range r {
			r[j] = vs[rng.IntN(len(vs))]
		}
		meds[i] = median(r)
	}
	slices.Sort(meds)
	return median(vs), meds[resamples*25/1000], meds[resamples*975/1000]
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
