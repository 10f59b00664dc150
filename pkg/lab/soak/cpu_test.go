package soak

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/lab"
)

func TestParseProcCPU(t *testing.T) {
	// A name holding spaces and a parenthesis, as a process may set.
	line := "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 3 4 20 0 12 0 98765 1000 200 18446744073709551615"
	comm, start, cpu, err := parseProcCPU([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if comm != "a (b) c" || start != 98765 || cpu != 325 {
		t.Errorf("got %q start %d cpu %d, want \"a (b) c\" 98765 325", comm, start, cpu)
	}
	for _, bad := range []string{"", "1 noparen S", "1 (x) S 1 2"} {
		if _, _, _, err := parseProcCPU([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseBusy(t *testing.T) {
	busy, err := parseBusy(strings.NewReader("cpu  100 5 50 1000 20 3 7 0 0 0\ncpu0 50 2 25 500 10 1 3 0 0 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if busy != 100+5+50+3+7 {
		t.Errorf("busy %d, want %d (all but idle and iowait)", busy, 100+5+50+3+7)
	}
	if _, err := parseBusy(strings.NewReader("intr 1 2\n")); err == nil {
		t.Error("no cpu line: no error")
	}
}

// fakeProc is a /proc of a few processes whose times a test sets.
type fakeProc struct {
	t   *testing.T
	dir string
}

func (f fakeProc) machine(busy, uptimeTicks uint64) {
	f.write("stat", fmt.Sprintf("cpu  %d 0 0 5000 0 0 0 0 0 0\n", busy))
	f.write("uptime", fmt.Sprintf("%.2f 100.00\n", float64(uptimeTicks)/clockTicks))
}

func (f fakeProc) process(pid int, comm string, start, utime, stime uint64) {
	f.write(fmt.Sprintf("%d/stat", pid), fmt.Sprintf("%d (%s) S 1 1 1 0 -1 0 0 0 0 0 %d %d 0 0 20 0 1 0 %d 1000 10", pid, comm, utime, stime, start))
}

func (f fakeProc) cmdline(pid int, argv ...string) {
	f.write(fmt.Sprintf("%d/cmdline", pid), strings.Join(argv, "\x00")+"\x00")
}

func (f fakeProc) gone(pid int) {
	if err := os.RemoveAll(filepath.Join(f.dir, fmt.Sprint(pid))); err != nil {
		f.t.Fatal(err)
	}
}

func (f fakeProc) write(name, s string) {
	p := filepath.Join(f.dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func TestCPUAccount(t *testing.T) {
	f := fakeProc{t, t.TempDir()}
	a := newCPUAccount()
	a.proc = f.dir
	roles := []lab.Process{{Role: "agent-node1", PID: 10, Start: 500}, {Role: "agent-node2", PID: 11, Start: 510}, {Role: "apiserver", PID: 12, Start: 400}}
	// Before the churn: what the processes spent so far is not counted.
	f.machine(10000, 100000)
	f.process(10, "tendril-agent", 500, 300, 100)
	f.process(11, "tendril-agent", 510, 200, 100)
	f.process(12, "kube-apiserver", 400, 900, 100)
	f.process(20, "tendril-workload", 99000, 5, 5)
	a.sample(roles)
	// Ten seconds on: the agents grew, a pod process started and one
	// ended, the pid of the one that ended came back as a new process,
	// and a CNI plugin run started after the first sample.
	f.machine(11500, 101000)
	f.process(10, "tendril-agent", 500, 350, 120)   // +70
	f.process(11, "tendril-agent", 510, 230, 110)   // +40
	f.process(12, "kube-apiserver", 400, 1200, 150) // +350
	f.process(20, "tendril-workloa", 100500, 30, 10)
	f.cmdline(20, "/opt/lab/bin/tendril-workload", "--listen", ":80") // a new process on a recycled pid: 40
	f.process(21, "tendril-cni", 100800, 8, 4)                        // 12 from its start
	f.process(22, "tendril-workload", 90000, 1, 1)                    // started before the first sample, first seen now: not counted
	a.sample(roles)
	f.gone(21)
	a.t1 = a.t0.Add(10 * time.Second)
	u := a.use(2)
	want := map[string]float64{"agent": 1.1, "apiserver": 3.5, "tendril-workload": 0.4, "tendril-cni": 0.12}
	got := map[string]float64{}
	for _, g := range u.Groups {
		got[g.Group] = g.Seconds
		if g.Tendril != (g.Group == "agent" || g.Group == "tendril-cni") {
			t.Errorf("%s: Tendril's %v", g.Group, g.Tendril)
		}
	}
	for g, s := range want {
		if d := got[g] - s; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: %.3f CPU s, want %.3f (all: %v)", g, got[g], s, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("groups %v, want %v", got, want)
	}
	if u.Busy != 15 || u.Elapsed != 10 || u.CPUs != 2 {
		t.Errorf("busy %.1f s over %.1f s of %d CPUs, want 15 s over 10 s of 2", u.Busy, u.Elapsed, u.CPUs)
	}
	if u.Groups[0].Group != "apiserver" {
		t.Errorf("first group %s, want the largest, apiserver", u.Groups[0].Group)
	}
	if ts := u.TendrilSeconds(); ts < 1.2199 || ts > 1.2201 {
		t.Errorf("Tendril's %.3f s, want 1.22", ts)
	}
}

func TestCPUMarkdownFloor(t *testing.T) {
	r := &Result{Churn: Churn{Created: 400, Elapsed: 100 * time.Second},
		CPU: CPUUse{CPUs: 2, Elapsed: 100, Busy: 196, Groups: []CPUShare{{Group: "kubelet", Seconds: 100}, {Group: "agent", Seconds: 46, Tendril: true}}}}
	var b bytes.Buffer
	r.cpuMarkdown(&b)
	// 4 pods/s × 200 CPU s / (196 - 46) = 5.33.
	if !strings.Contains(b.String(), "at most 5.33 pods/s") || !strings.Contains(b.String(), "| agent | 46.0 | 23.0 | yes |") {
		t.Errorf("report:\n%s", b.String())
	}
	r.CPU.Busy = 120
	b.Reset()
	r.cpuMarkdown(&b)
	if strings.Contains(b.String(), "at most") || !strings.Contains(b.String(), "not the bound") {
		t.Errorf("CPUs 60 %% busy: report:\n%s", b.String())
	}
}
