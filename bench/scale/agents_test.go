package main

import (
	"os"
	"slices"
	"testing"
)

func TestParseAgents(t *testing.T) {
	got, err := parseAgents("old=/tmp/old-agent, new=bin/tendril-agent")
	if err != nil {
		t.Fatal(err)
	}
	want := []agentBinary{{"old", "/tmp/old-agent"}, {"new", "bin/tendril-agent"}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"", "old", "=x", "old=", "a=b,"} {
		if _, err := parseAgents(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestReadProcMemSelf(t *testing.T) {
	m := readProcMem(os.Getpid())
	if m.RSS <= 0 || m.HWM < m.RSS || m.Anon+m.File > m.RSS+1 {
		t.Fatalf("implausible /proc/self/status memory: %+v", m)
	}
}
