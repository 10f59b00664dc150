package soak

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tendril-net/tendril/pkg/lab"
)

// Slope is an agent's memory over the churn: RSS samples fitted by least
// squares to a line.
type Slope struct {
	Node    string
	Samples int
	// First, Last, Max are RSS samples in KiB.
	First, Last, Max int64
	// KiBPerMin is the fitted slope and StdErr its standard error (the
	// noise: a slope within about two of it is flat).
	KiBPerMin, StdErr float64
	// LateKiBPerMin and LateStdErr fit the second half of the samples
	// only: the heap grows to its working size early in a run, and a
	// leak shows as a slope that goes on.
	LateKiBPerMin, LateStdErr float64
	// Anon and File split the second half's slope into RssAnon (the
	// heap, stacks: what a leak grows) and RssFile (pages of the agent's
	// own binary, mapped back as code runs that had not run since the
	// start released them: clean, reclaimable page cache, bounded by the
	// binary's read-only mappings), and LastAnon, LastFile are the last
	// samples of each in KiB.
	AnonLateKiBPerMin, AnonLateStdErr float64
	FileLateKiBPerMin, FileLateStdErr float64
	LastAnon, LastFile                int64
	Err                               string
}

// Flat says whether the second half's RSS slope is within twice its
// noise of zero.
func (s Slope) Flat() bool { return math.Abs(s.LateKiBPerMin) <= 2*s.LateStdErr }

// AnonFlat says the same of the anonymous part alone.
func (s Slope) AnonFlat() bool { return math.Abs(s.AnonLateKiBPerMin) <= 2*s.AnonLateStdErr }

// FitSlope fits y = a + b·t by least squares (t in minutes, y in KiB)
// and returns b and its standard error.
func FitSlope(t, y []float64) (slope, stderr float64, err error) {
	n := float64(len(t))
	if len(t) != len(y) || len(t) < 3 {
		return 0, 0, fmt.Errorf("fit: %d times and %d samples, need 3 or more of each", len(t), len(y))
	}
	var mt, my float64
	for i := range t {
		mt += t[i]
		my += y[i]
	}
	mt /= n
	my /= n
	var sxx, sxy float64
	for i := range t {
		sxx += (t[i] - mt) * (t[i] - mt)
		sxy += (t[i] - mt) * (y[i] - my)
	}
	if sxx == 0 {
		return 0, 0, fmt.Errorf("fit: every sample at the same time")
	}
	slope = sxy / sxx
	icept := my - slope*mt
	var sse float64
	for i := range t {
		r := y[i] - (icept + slope*t[i])
		sse += r * r
	}
	return slope, math.Sqrt(sse / (n - 2) / sxx), nil
}

// rssSampler samples every agent's VmRSS at a fixed interval.
type rssSampler struct {
	st    *lab.State
	every time.Duration

	mu    sync.Mutex
	start time.Time
	t     map[string][]float64
	// kib, anon and file are VmRSS, RssAnon and RssFile samples.
	kib, anon, file map[string][]float64
	lastErr         map[string]error
	// cpu accounts every process's CPU at the same samples.
	cpu *cpuAccount
}

func newRSSSampler(st *lab.State, every time.Duration) *rssSampler {
	return &rssSampler{st: st, every: every, t: map[string][]float64{}, kib: map[string][]float64{},
		anon: map[string][]float64{}, file: map[string][]float64{}, lastErr: map[string]error{}, cpu: newCPUAccount()}
}

func (r *rssSampler) run(ctx context.Context) {
	r.start = time.Now()
	tick := time.NewTicker(r.every)
	defer tick.Stop()
	for {
		r.sample()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (r *rssSampler) sample() {
	procs, err := lab.ReadProcesses(r.st.PidDir())
	r.cpu.sample(procs)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.st.Nodes {
		if err != nil {
			r.lastErr[n.Name] = err
			continue
		}
		m, err := residentKiB(AgentPID(procs, n.Name))
		if err != nil {
			r.lastErr[n.Name] = err
			continue
		}
		r.t[n.Name] = append(r.t[n.Name], time.Since(r.start).Minutes())
		r.kib[n.Name] = append(r.kib[n.Name], float64(m.rss))
		r.anon[n.Name] = append(r.anon[n.Name], float64(m.anon))
		r.file[n.Name] = append(r.file[n.Name], float64(m.file))
	}
}

// AgentPID is the pid the lab recorded for node's agent among procs
// (lab.ReadProcesses), 0 when there is none.
func AgentPID(procs []lab.Process, node string) int {
	pid := 0
	for _, p := range procs {
		if p.Role == "agent-"+node {
			pid = p.PID
		}
	}
	return pid
}

// resident is a process's resident set and its anonymous and
// file-backed parts, in KiB.
type resident struct{ rss, anon, file int64 }

// residentKiB reads pid's resident set from /proc.
func residentKiB(pid int) (resident, error) {
	if pid <= 0 {
		return resident{}, fmt.Errorf("no agent process")
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return resident{}, err
	}
	defer f.Close()
	return parseResident(f, pid)
}

func parseResident(r io.Reader, pid int) (resident, error) {
	var m resident
	found := 0
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.rss
		case "RssAnon":
			dst = &m.anon
		case "RssFile":
			dst = &m.file
		}
		if !ok || dst == nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return resident{}, fmt.Errorf("/proc/%d/status: %s: %w", pid, k, err)
		}
		*dst = n
		found++
	}
	if found != 3 {
		return resident{}, fmt.Errorf("/proc/%d/status lacks VmRSS, RssAnon or RssFile", pid)
	}
	return m, sc.Err()
}

func (r *rssSampler) slopes() []Slope {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Slope
	for _, n := range r.st.Nodes {
		ys := r.kib[n.Name]
		s := Slope{Node: n.Name, Samples: len(ys)}
		if len(ys) > 0 {
			s.First, s.Last = int64(ys[0]), int64(ys[len(ys)-1])
			for _, y := range ys {
				s.Max = max(s.Max, int64(y))
			}
		}
		var err error
		s.KiBPerMin, s.StdErr, err = FitSlope(r.t[n.Name], ys)
		if half := len(ys) / 2; err == nil && len(ys)-half >= 3 {
			t := r.t[n.Name][half:]
			s.LateKiBPerMin, s.LateStdErr, _ = FitSlope(t, ys[half:])
			s.AnonLateKiBPerMin, s.AnonLateStdErr, _ = FitSlope(t, r.anon[n.Name][half:])
			s.FileLateKiBPerMin, s.FileLateStdErr, _ = FitSlope(t, r.file[n.Name][half:])
		}
		if k := len(r.anon[n.Name]); k > 0 {
			s.LastAnon, s.LastFile = int64(r.anon[n.Name][k-1]), int64(r.file[n.Name][k-1])
		}
		if err != nil {
			s.Err = err.Error()
			if e := r.lastErr[n.Name]; e != nil {
				s.Err += " (last sample: " + e.Error() + ")"
			}
		}
		out = append(out, s)
	}
	return out
}
