package procmem

import (
	"bytes"
	"fmt"
	"os"
	"runtime/pprof"
	"testing"
)

func TestParse(t *testing.T) {
	m := Parse("Name:\tx\nVmHWM:\t  409600 kB\nVmRSS:\t  204800 kB\nRssAnon:\t  153600 kB\nRssFile:\t   51200 kB\nThreads:\t7\n")
	if m != (Mem{RSS: 200, Anon: 150, File: 50, HWM: 400}) {
		t.Fatalf("Parse = %+v", m)
	}
}

func TestReadSelf(t *testing.T) {
	m := Read(os.Getpid())
	if m.RSS <= 0 || m.Anon <= 0 || m.HWM < m.RSS {
		t.Fatalf("Read(self) = %+v: want a resident set, its anonymous part and a peak at least the resident set", m)
	}
	if Read(-1) != (Mem{}) {
		t.Fatal("Read of no process is not zero")
	}
}

func TestHeapAllocMiB(t *testing.T) {
	got, err := HeapAllocMiB([]byte("heap profile: 1: 2 [3: 4] @ heap/1048576\n\n# runtime.MemStats\n# Alloc = 1\n# HeapAlloc = 104857600\n# Sys = 3\n"))
	if err != nil || got != 100 {
		t.Fatalf("HeapAllocMiB = %v, %v; want 100", got, err)
	}
	if _, err := HeapAllocMiB([]byte("# Sys = 3\n")); err == nil {
		t.Fatal("no error for a profile without HeapAlloc")
	}
	if _, err := HeapAllocMiB([]byte("# HeapAlloc = x\n")); err == nil {
		t.Fatal("no error for a malformed HeapAlloc")
	}
}

func TestParseHeap(t *testing.T) {
	const m = 1 << 20
	profile := fmt.Sprintf("heap profile: 1: 2 [3: 4] @ heap/1048576\n\n# runtime.MemStats\n# HeapAlloc = %d\n# HeapSys = 1\n# HeapIdle = %d\n# HeapInuse = %d\n# HeapReleased = %d\n# Stack = %d / %d\n# MSpan = %d / %d\n# MCache = %d / %d\n# BuckHashSys = %d\n# GCSys = %d\n# OtherSys = %d\n",
		100*m, 30*m, 140*m, 20*m, 2*m, 2*m, 3*m, 4*m, m/2, m, m/2, 5*m, m)
	h, err := ParseHeap([]byte(profile))
	if err != nil {
		t.Fatal(err)
	}
	want := Heap{Live: 100, Spans: 140, Stacks: 2, Metadata: 10, Unreturned: 10}
	if h != want {
		t.Fatalf("ParseHeap = %+v, want %+v", h, want)
	}
	if _, err := ParseHeap([]byte("# HeapAlloc = 3\n")); err == nil {
		t.Fatal("no error for a profile without the span figures")
	}
	// This process's own profile parses, and its figures are the runtime's.
	var buf bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&buf, 1); err != nil {
		t.Fatal(err)
	}
	self, err := ParseHeap(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if self.Live <= 0 || self.Spans < self.Live || self.Stacks <= 0 || self.Metadata <= 0 {
		t.Fatalf("this process's heap: %+v", self)
	}
}
