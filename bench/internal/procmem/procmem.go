// Package procmem reads a process's memory for the benchmarks that report
// an agent's memory (bench/services, bench/scale): from /proc/PID/status
// the resident set, its anonymous part (heap, stacks), its file-backed
// part (the binary's text, rodata and pclntab pages the process touched)
// and the resident set's peak, in MiB; and the Go heap's live bytes from
// a text heap profile.
package procmem

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Mem is one reading, in MiB.
type Mem struct {
	RSS, Anon, File, HWM float64
}

func (m Mem) String() string {
	return fmt.Sprintf("anon %.0f file %.0f peak %.0f MiB", m.Anon, m.File, m.HWM)
}

// Read returns pid's reading; zero when the process is gone (a benchmark
// reports the zero rather than failing a run for it).
func Read(pid int) Mem {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Mem{}
	}
	return Parse(string(b))
}

// Parse reads the VmRSS, RssAnon, RssFile and VmHWM lines of a
// /proc/PID/status text (values in kB).
func Parse(status string) Mem {
	var m Mem
	for _, l := range strings.Split(status, "\n") {
		k, rest, ok := strings.Cut(l, ":")
		f := strings.Fields(rest)
		if !ok || len(f) == 0 {
			continue
		}
		kb, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		v := float64(kb) / 1024
		switch k {
		case "VmRSS":
			m.RSS = v
		case "RssAnon":
			m.Anon = v
		case "RssFile":
			m.File = v
		case "VmHWM":
			m.HWM = v
		}
	}
	return m
}

// HeapAllocMiB is HeapAlloc of the runtime.MemStats that a text heap
// profile (pprof's /debug/pprof/heap?debug=1; with gc=1, the live heap
// after a forced collection) ends with.
func HeapAllocMiB(profile []byte) (float64, error) {
	v, err := memStats(profile, "HeapAlloc")
	if err != nil {
		return 0, err
	}
	return mib(v["HeapAlloc"]), nil
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// memStats reads the "# Name = value" lines of a text heap profile's
// MemStats ("Stack = inuse / sys" and the like: the first figure, what is
// in use) and fails unless every one of want is there and a number.
func memStats(profile []byte, want ...string) (map[string]uint64, error) {
	v := map[string]uint64{}
	bad := map[string]string{}
	for _, l := range strings.Split(string(profile), "\n") {
		rest, ok := strings.CutPrefix(l, "# ")
		if !ok {
			continue
		}
		k, val, ok := strings.Cut(rest, " = ")
		if !ok {
			continue
		}
		f := strings.Fields(val)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			bad[k] = val
			continue
		}
		v[k] = n
	}
	for _, k := range want {
		if _, ok := v[k]; !ok {
			if val, ok := bad[k]; ok {
				return nil, fmt.Errorf("%s %q in the heap profile: not a number", k, val)
			}
			return nil, fmt.Errorf("no %s in the heap profile", k)
		}
	}
	return v, nil
}

// Heap is the Go runtime's own account of its memory, from the
// runtime.MemStats that a text heap profile ends with, in MiB: what of
// the anonymous resident set is live objects, what is the unused room of
// the spans that hold them (fragmentation: a collection cannot return a
// span with one live object left), stacks, the runtime's metadata and
// free heap not yet returned to the kernel.
type Heap struct {
	// Live is HeapAlloc (after gc=1, the live objects).
	Live float64
	// Spans is HeapInuse: the spans holding live objects.
	Spans float64
	// Stacks is StackInuse.
	Stacks float64
	// Metadata is MSpanInuse + MCacheInuse + GCSys + OtherSys + BuckHashSys.
	Metadata float64
	// Unreturned is HeapIdle - HeapReleased: free spans the process
	// still holds.
	Unreturned float64
}

func (h Heap) String() string {
	return fmt.Sprintf("live %.1f, spans %.1f (unused room %.1f), stacks %.1f, runtime metadata %.1f, free not returned %.1f MiB",
		h.Live, h.Spans, h.Spans-h.Live, h.Stacks, h.Metadata, h.Unreturned)
}

// ParseHeap reads Heap from a text heap profile (debug=1).
func ParseHeap(profile []byte) (Heap, error) {
	v, err := memStats(profile, "HeapAlloc", "HeapInuse", "HeapIdle", "HeapReleased", "Stack", "MSpan", "GCSys", "OtherSys")
	if err != nil {
		return Heap{}, err
	}
	return Heap{
		Live:       mib(v["HeapAlloc"]),
		Spans:      mib(v["HeapInuse"]),
		Stacks:     mib(v["Stack"]),
		Metadata:   mib(v["MSpan"] + v["MCache"] + v["GCSys"] + v["OtherSys"] + v["BuckHashSys"]),
		Unreturned: mib(v["HeapIdle"] - v["HeapReleased"]),
	}, nil
}
