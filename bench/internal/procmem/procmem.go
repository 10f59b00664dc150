// Package procmem reads a process's memory from /proc/PID/status for the
// benchmarks that report an agent's memory (bench/services, bench/scale):
// the resident set, its anonymous part (heap, stacks), its file-backed
// part (the binary's text, rodata and pclntab pages the process touched)
// and the resident set's peak, in MiB.
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
