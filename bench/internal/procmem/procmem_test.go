package procmem

import (
	"os"
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
