package soak

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tendril-net/tendril/pkg/lab"
)

// The churn's CPU, by who spent it: the soak's rate is bounded by the
// machine's CPUs when they are all busy, and this says how much of them
// Tendril (its agents, operator and CNI plugin) took and how much the rest
// of the lab did, in the same run. That is the reference for the rate a
// machine can churn at with Tendril's share made free.

// CPUShare is one group's CPU over the churn.
type CPUShare struct {
	// Group is a lab process's role without its node ("agent",
	// "kubelet", "operator", "apiserver") or another process's command
	// name ("tendril-workload", "tendril-cni", "nsenter").
	Group string
	// Seconds of CPU time (user + system) seen in the group's processes.
	Seconds float64
	// Tendril says the group is Tendril's own (agent, operator, CNI).
	Tendril bool
}

// CPUUse is the machine's CPU over the churn.
type CPUUse struct {
	// CPUs and Elapsed (from the first sample to the last) give the
	// capacity: CPUs × Elapsed seconds.
	CPUs    int
	Elapsed float64
	// Busy is every CPU's non-idle time (/proc/stat), seconds.
	Busy float64
	// Groups are the processes seen, largest first; what they do not
	// add up to of Busy is processes that lived between two samples and
	// the kernel's own work (softirq: the packets).
	Groups []CPUShare
	Err    string
}

// Attributed is the sum of the groups' seconds.
func (u CPUUse) Attributed() float64 {
	var s float64
	for _, g := range u.Groups {
		s += g.Seconds
	}
	return s
}

// TendrilSeconds is the sum of Tendril's own groups.
func (u CPUUse) TendrilSeconds() float64 {
	var s float64
	for _, g := range u.Groups {
		if g.Tendril {
			s += g.Seconds
		}
	}
	return s
}

// isTendril says whether a group is Tendril's own processes.
func isTendril(group string) bool {
	switch group {
	case "agent", "operator", "tendril-cni", "cilium-cni":
		return true
	}
	return false
}

// procKey names one process: a pid with its start time, so a recycled
// pid is a new process.
type procKey struct {
	pid   int
	start uint64
}

// cpuAccount sums CPU per group from samples of every process.
type cpuAccount struct {
	proc string // /proc, a field for tests

	mu        sync.Mutex
	bootTicks uint64 // clock ticks since boot at the first sample
	last      map[procKey]uint64
	group     map[procKey]string
	ticks     map[string]uint64
	busy0     uint64
	busy      uint64
	sampled   bool
	// t0 and t1 are the first and the last sample's times.
	t0, t1 time.Time
	err    error
}

func newCPUAccount() *cpuAccount {
	return &cpuAccount{proc: "/proc", last: map[procKey]uint64{}, group: map[procKey]string{}, ticks: map[string]uint64{}}
}

// clockTicks is USER_HZ: /proc reports CPU times in it, and Linux fixes
// it at 100 for user space on every architecture Go runs on.
const clockTicks = 100

// sample reads the machine's busy time and every process's CPU time, and
// adds each process's growth since its last sample to its group. A
// process first seen after the first sample counts from its start.
func (a *cpuAccount) sample(roles []lab.Process) {
	busy, uptime, err := a.readMachine()
	if err != nil {
		a.mu.Lock()
		a.err = err
		a.mu.Unlock()
		return
	}
	byPID := map[procKey]string{}
	for _, p := range roles {
		byPID[procKey{p.PID, p.Start}] = roleGroup(p.Role)
	}
	ents, err := os.ReadDir(a.proc)
	if err != nil {
		a.mu.Lock()
		a.err = err
		a.mu.Unlock()
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	first := !a.sampled
	if first {
		a.busy0 = busy
		a.bootTicks = uptime
		a.t0 = time.Now()
	}
	a.busy = busy
	a.t1 = time.Now()
	a.sampled = true
	// Only the processes of this sample are kept: an hour of churn
	// starts hundreds of thousands of short ones.
	seenNow := make(map[procKey]bool, len(a.last))
	defer func() {
		for k := range a.last {
			if !seenNow[k] {
				delete(a.last, k)
				delete(a.group, k)
			}
		}
	}()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, start, cpu, err := readProcCPU(filepath.Join(a.proc, e.Name(), "stat"))
		if err != nil {
			continue // gone since the listing
		}
		k := procKey{pid, start}
		seenNow[k] = true
		prev, seen := a.last[k]
		a.last[k] = cpu
		if !seen {
			g := byPID[k]
			if g == "" {
				g = commandName(filepath.Join(a.proc, e.Name(), "cmdline"), comm)
			}
			a.group[k] = g
			if first || start < a.bootTicks {
				continue // its CPU before the churn is not the churn's
			}
			prev = 0
		}
		a.ticks[a.group[k]] += cpu - prev
	}
}

// use is the account from the first sample to the last, on a machine of
// cpus CPUs.
func (a *cpuAccount) use(cpus int) CPUUse {
	a.mu.Lock()
	defer a.mu.Unlock()
	u := CPUUse{CPUs: cpus, Elapsed: a.t1.Sub(a.t0).Seconds(), Busy: float64(a.busy-a.busy0) / clockTicks}
	if a.err != nil {
		u.Err = a.err.Error()
	}
	for g, t := range a.ticks {
		if t > 0 {
			u.Groups = append(u.Groups, CPUShare{Group: g, Seconds: float64(t) / clockTicks, Tendril: isTendril(g)})
		}
	}
	sort.Slice(u.Groups, func(i, j int) bool {
		if u.Groups[i].Seconds != u.Groups[j].Seconds {
			return u.Groups[i].Seconds > u.Groups[j].Seconds
		}
		return u.Groups[i].Group < u.Groups[j].Group
	})
	return u
}

// roleGroup is a lab role without its node or instance: "agent-node1"
// and "agent-node2" are both "agent", "operator-0" is "operator".
func roleGroup(role string) string {
	for _, p := range []string{"agent", "kubelet", "operator"} {
		if strings.HasPrefix(role, p+"-") {
			return p
		}
	}
	return role
}

// readMachine reads every CPU's busy time and the time since boot, both
// in clock ticks.
func (a *cpuAccount) readMachine() (busy, uptime uint64, err error) {
	f, err := os.Open(filepath.Join(a.proc, "stat"))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	if busy, err = parseBusy(f); err != nil {
		return 0, 0, err
	}
	b, err := os.ReadFile(filepath.Join(a.proc, "uptime"))
	if err != nil {
		return 0, 0, err
	}
	f0, _, _ := strings.Cut(string(b), " ")
	up, err := strconv.ParseFloat(f0, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("%s/uptime: %w", a.proc, err)
	}
	return busy, uint64(up * clockTicks), nil
}

// parseBusy reads the "cpu" line of /proc/stat: user, nice, system, idle,
// iowait, irq, softirq, steal; busy is all but idle and iowait.
func parseBusy(r io.Reader) (uint64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 9 || f[0] != "cpu" {
			continue
		}
		var busy uint64
		for i, s := range f[1:9] {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/stat cpu field %d: %w", i+1, err)
			}
			if i != 3 && i != 4 {
				busy += v
			}
		}
		return busy, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/stat has no cpu line")
}

// readProcCPU reads a process's command name, start time and CPU time
// (utime + stime, clock ticks) from /proc/PID/stat.
func readProcCPU(path string) (comm string, start, cpu uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", 0, 0, err
	}
	return parseProcCPU(b)
}

func parseProcCPU(b []byte) (comm string, start, cpu uint64, err error) {
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after the last ')'.
	i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if i < 0 || j < i {
		return "", 0, 0, fmt.Errorf("stat: malformed")
	}
	f := strings.Fields(string(b[j+1:]))
	// f[0] is field 3 (state): utime is field 14, stime 15, starttime 22.
	if len(f) < 20 {
		return "", 0, 0, fmt.Errorf("stat: %d fields after the name", len(f))
	}
	var v [3]uint64
	for n, idx := range []int{11, 12, 19} {
		if v[n], err = strconv.ParseUint(f[idx], 10, 64); err != nil {
			return "", 0, 0, fmt.Errorf("stat field %d: %w", idx+3, err)
		}
	}
	return string(b[i+1 : j]), v[2], v[0] + v[1], nil
}

// commandName is the base name of a process's argv[0]: the kernel's
// command name is cut at 15 bytes ("tendril-workloa"). A process whose
// command line cannot be read (a kernel thread, gone) keeps comm.
func commandName(cmdlinePath, comm string) string {
	b, err := os.ReadFile(cmdlinePath)
	if err != nil {
		return comm
	}
	argv0, _, _ := bytes.Cut(b, []byte{0})
	if len(argv0) == 0 {
		return comm
	}
	return filepath.Base(string(argv0))
}
