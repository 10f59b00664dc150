package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tendril-net/tendril/bench/internal/procmem"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/soak"
)

// agentPprof is where run.sh has every agent serve pprof, in its node's
// network namespace.
const agentPprof = "127.0.0.1:6060"

// heapSample is one reading of one agent: the runtime's account after a
// forced collection beside the kernel's.
type heapSample struct {
	at   time.Duration
	heap procmem.Heap
	mem  procmem.Mem
}

// heapSampler reads every agent's live heap at a fixed interval and, with
// a directory, saves a heap profile at each reading: RSS alone cannot
// tell a leak (live objects that keep growing) from a heap that settles
// into more spans or pages of the binary touched late, and two profiles
// of one agent compared with `go tool pprof -base` name what grew.
type heapSampler struct {
	st    *lab.State
	every time.Duration
	dir   string

	mu      sync.Mutex
	samples map[string][]heapSample
	errs    map[string]error
}

func (h *heapSampler) run(ctx context.Context) {
	start := time.Now()
	tick := time.NewTicker(h.every)
	defer tick.Stop()
	for {
		for _, n := range h.st.Nodes {
			s, err := h.read(n, time.Since(start))
			h.mu.Lock()
			if err != nil {
				h.errs[n.Name] = err
			} else {
				h.samples[n.Name] = append(h.samples[n.Name], s)
			}
			h.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (h *heapSampler) read(n lab.Node, at time.Duration) (heapSample, error) {
	text, err := procmem.PprofGet(lab.NetnsPath(n.Netns), agentPprof, "/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return heapSample{}, err
	}
	heap, err := procmem.ParseHeap(text)
	if err != nil {
		return heapSample{}, fmt.Errorf("agent %s: %w", n.Name, err)
	}
	s := heapSample{at: at, heap: heap}
	if procs, err := lab.ReadProcesses(h.st.PidDir()); err == nil {
		s.mem = procmem.Read(soak.AgentPID(procs, n.Name))
	}
	if h.dir != "" {
		// The binary profile right after the text one: the GC just ran,
		// so it holds the same live objects without forcing another.
		prof, err := procmem.PprofGet(lab.NetnsPath(n.Netns), agentPprof, "/debug/pprof/heap")
		if err != nil {
			return s, err
		}
		name := fmt.Sprintf("heap-%s-%03dm.pprof", n.Name, int(at.Minutes()))
		if err := os.WriteFile(filepath.Join(h.dir, name), prof, 0o644); err != nil {
			return s, fmt.Errorf("save %s: %w", name, err)
		}
	}
	return s, nil
}

// markdown prints each agent's readings and the live heap's slope over
// the readings taken during the churn (the settle after it frees the
// churn's last objects and would pull a fit down); the soak's own report
// fits RssAnon and RssFile from its denser samples.
func (h *heapSampler) markdown(w io.Writer, churn time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintln(w, "| agent | minute | live heap MiB | spans MiB | stacks MiB | runtime metadata MiB | free not returned MiB | RssAnon MiB | RssFile MiB |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, n := range h.st.Nodes {
		for _, s := range h.samples[n.Name] {
			fmt.Fprintf(w, "| %s | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", n.Name, s.at.Minutes(),
				s.heap.Live, s.heap.Spans, s.heap.Stacks, s.heap.Metadata, s.heap.Unreturned, s.mem.Anon, s.mem.File)
		}
	}
	fmt.Fprintln(w)
	for _, n := range h.st.Nodes {
		var t, live []float64
		for _, s := range h.samples[n.Name] {
			if s.at <= churn {
				t = append(t, s.at.Minutes())
				live = append(live, s.heap.Live*1024)
			}
		}
		half := len(t) / 2
		ls, le, err := soak.FitSlope(t[half:], live[half:])
		if err != nil {
			fmt.Fprintf(w, "- %s: live heap slope not fitted: %v\n", n.Name, err)
			continue
		}
		fmt.Fprintf(w, "- %s, second half of the churn: live heap %+.1f ± %.1f KiB/min\n", n.Name, ls, le)
	}
	for node, err := range h.errs {
		fmt.Fprintf(w, "- %s: last heap reading error: %v\n", node, err)
	}
}
