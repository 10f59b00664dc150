// Package binaries builds the project's commands once per test binary so
// tests can run them as real processes.
package binaries

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// Builder builds commands of this module into a directory, once each.
type Builder struct {
	Dir string

	mu    sync.Mutex
	built map[string]string
}

// NewBuilder builds into dir.
func NewBuilder(dir string) *Builder {
	return &Builder{Dir: dir, built: map[string]string{}}
}

// moduleRoot finds the repository root from this source file's location.
func moduleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("cannot locate source of package binaries")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", "..")), nil
}

// Build builds ./cmd/<name> and returns the binary's path. When
// TENDRIL_BIN_DIR names a directory holding the binary (as `make test` does
// after `make build`), that binary is used instead.
func (b *Builder) Build(name string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.built[name]; ok {
		return p, nil
	}
	if dir := os.Getenv("TENDRIL_BIN_DIR"); dir != "" {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			b.built[name] = p
			return p, nil
		}
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(b.Dir, name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w: %s", name, err, strings.TrimSpace(string(msg)))
	}
	b.built[name] = out
	return out, nil
}

// Run is a TestMain body: it points *b at a builder whose binaries live in
// a temporary directory for the test binary's lifetime, runs the tests and
// returns their exit code.
func Run(m interface{ Run() int }, b **Builder) int {
	dir, err := os.MkdirTemp("", "tendril-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	*b = NewBuilder(dir)
	return m.Run()
}
