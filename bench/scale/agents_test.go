package main

import (
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
