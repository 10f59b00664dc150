package api

import (
	"os"
	"path/filepath"
	"testing"
)

// The example policies the README points to must parse.
func TestExamplePoliciesParse(t *testing.T) {
	files, err := filepath.Glob("../../../examples/policies/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example policies: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseRules(data); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
