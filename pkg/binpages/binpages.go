// Package binpages unmaps the pages of the running binary's read-only
// segments (code, read-only data, the function tables) from the process,
// so that its resident set counts only what it touches afterwards.
//
// A process's RSS includes every page of its executable mapped into it
// (RssFile in /proc/PID/status). The agent's start runs the init functions
// of about 1,100 packages and builds every cell: it touches code and type
// data spread over most of its 78 MB of text, and the kernel maps up to 16
// cached neighbours of each faulting page (fault-around), so an agent that
// had started carried 50–77 MiB of its own binary, most of which it never
// reads again (docs/benchmarks.md, "Memory (issue 31)"). MADV_DONTNEED on
// a private, read-only file mapping only drops the process's page table
// entries: the pages stay in the page cache (shared, reclaimable), and the
// next access maps them again with a minor fault. Writable mappings (the
// data segment, whose pages may differ from the file) are never touched.
package binpages

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Segment is one mapping of the executable.
type Segment struct {
	Start, End uint64
	Perms      string
}

// Release unmaps the executable's read-only mappings from this process
// and returns how many bytes of address space it advised.
func Release() (uint64, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, fmt.Errorf("the executable's path: %w", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("read /proc/self/maps: %w", err)
	}
	var total uint64
	for _, s := range ReadOnly(string(maps), exe) {
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(s.Start), uintptr(s.End-s.Start), syscall.MADV_DONTNEED); errno != 0 {
			return total, fmt.Errorf("madvise %x-%x: %w", s.Start, s.End, errno)
		}
		total += s.End - s.Start
	}
	return total, nil
}

// ReadOnly parses maps (the text of /proc/PID/maps) and returns the
// mappings of path that are neither writable nor shared.
func ReadOnly(maps, path string) []Segment {
	var out []Segment
	for _, l := range strings.Split(maps, "\n") {
		// start-end perms offset dev inode path
		f := strings.Fields(l)
		if len(f) < 6 || strings.Join(f[5:], " ") != path {
			continue
		}
		perms := f[1]
		if len(perms) != 4 || perms[1] == 'w' || perms[3] != 'p' {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		out = append(out, Segment{Start: start, End: end, Perms: perms})
	}
	return out
}
