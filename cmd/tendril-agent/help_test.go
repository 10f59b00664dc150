package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/help.golden from the command")

// TestHelpGolden holds every flag of tendril-agent, its type, default and
// text: a flag that moves between cells keeps its name and default, and a
// change to any flag shows in review as a change of testdata/help.golden
// (go test ./cmd/tendril-agent -update rewrites it).
func TestHelpGolden(t *testing.T) {
	var out bytes.Buffer
	cmd := newCommand(&out)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("tendril-agent --help: %v", err)
	}
	golden := filepath.Join("testdata", "help.golden")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("read %s: %v (go test -update writes it)", golden, err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Errorf("tendril-agent --help differs from %s (go test ./cmd/tendril-agent -update rewrites it after a deliberate change):\n%s", golden, out.String())
	}
}
