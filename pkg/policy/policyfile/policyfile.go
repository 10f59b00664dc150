// Package policyfile keeps the policy rules imported through the API on
// disk, so that a restarted agent enforces them again (rules from
// Kubernetes objects come back from the API server instead, and are never
// written). One writer writes the file when the repository's revision
// changes, a burst of changes folding into one write, and replaces it
// atomically; Load refuses a corrupt file with a message that names it and
// says how to recover.
package policyfile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// retryAfter is how long the writer waits before trying a failed write
// again (a full disk, say) when no new change comes first.
const retryAfter = time.Second

// File is the policy file of one repository: the rules of one source.
type File struct {
	path   string
	repo   *policy.Repository
	source string
	log    *slog.Logger

	// changed holds a pending "the repository changed" for the writer;
	// changes that come while one is pending fold into it.
	changed chan struct{}

	// mu serializes writes, so that a snapshot is always written after
	// every older one.
	mu sync.Mutex
	// written is the file's content as last written or loaded; an equal
	// snapshot is not written again.
	written []byte
}

// New returns the file at path for the rules of source in repo, and
// subscribes it to repo's changes. Nothing is written until Run.
func New(path string, repo *policy.Repository, source string, log *slog.Logger) *File {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &File{path: path, repo: repo, source: source, log: log, changed: make(chan struct{}, 1)}
	repo.Subscribe(func(uint64) {
		select {
		case f.changed <- struct{}{}:
		default:
		}
	})
	return f
}

// Path is the file's path.
func (f *File) Path() string { return f.path }

// Load reads the file: no file is no rules. A file that does not parse or
// holds a rule that does not validate is an error that names the file and
// the way out: starting without those rules would enforce less than
// before, so the caller should not start.
func (f *File) Load() (api.Rules, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removeTemporaries()
	data, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		f.written = encode(nil)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read policy file %s: %w", f.path, err)
	}
	var rules api.Rules
	if strings.TrimSpace(string(data)) != "[]" {
		// ParseRules refuses an empty list, which is what a file
		// written with no rules left holds.
		if rules, err = api.ParseRules(data); err != nil {
			return nil, fmt.Errorf("policy file %s is corrupt: %w; move it away to start without the policies imported through the API, then import them again", f.path, err)
		}
	}
	f.written = encode(rules)
	return rules, nil
}

// removeTemporaries deletes temporary files that a crash in the middle of
// a write left behind; f.mu must be held.
func (f *File) removeTemporaries() {
	tmps, _ := filepath.Glob(filepath.Join(filepath.Dir(f.path), tempPattern(f.path)))
	for _, tmp := range tmps {
		if err := os.Remove(tmp); err != nil {
			f.log.Warn("Remove a temporary policy file", "file", tmp, "error", err)
		}
	}
}

// Run writes the file after each change of the repository until ctx ends,
// then writes the last changes and returns. Run it in one goroutine.
func (f *File) Run(ctx context.Context) {
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			if err := f.Write(); err != nil {
				f.log.Error("Write the policy file on stop", "file", f.path, "error", err)
			}
			return
		case <-f.changed:
		case <-retry:
		}
		retry = nil
		if err := f.Write(); err != nil {
			f.log.Error("Write the policy file", "file", f.path, "error", err, "retry-in", retryAfter)
			retry = time.After(retryAfter)
		}
	}
}

// Write writes the source's rules as the repository holds them now, unless
// the file already holds them.
func (f *File) Write() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	stored, rev := f.repo.Rules(nil)
	var rules api.Rules
	for _, s := range stored {
		if s.Source == f.source {
			rules = append(rules, s.Rule)
		}
	}
	data := encode(rules)
	if bytes.Equal(data, f.written) {
		return nil
	}
	if err := replaceFile(f.path, data); err != nil {
		return fmt.Errorf("write policy file %s at revision %d: %w", f.path, rev, err)
	}
	f.written = data
	f.log.Debug("Policy file written", "file", f.path, "revision", rev, "rules", len(rules))
	return nil
}

// encode is the file's content for rules: an indented JSON list, "[]" for
// none.
func encode(rules api.Rules) []byte {
	if len(rules) == 0 {
		// What MarshalIndent writes for an empty list, without building
		// its encoders for the rule types (0.15 ms at the agent's start,
		// whose policy-restore loads no file on a new node).
		return []byte("[]\n")
	}
	data, err := json.MarshalIndent(rules, "", "  ")
	if err != nil {
		// Unreachable: rules are plain data that marshal.
		panic(fmt.Sprintf("encode policy rules: %v", err))
	}
	return append(data, '\n')
}

// tempPattern is the glob of path's temporary files (os.CreateTemp's *).
func tempPattern(path string) string { return "." + filepath.Base(path) + ".tmp-*" }

// replaceFile replaces path with data so that a crash leaves either the old
// or the new content: a temporary file of its own in the same directory,
// synced, renamed over path, and the directory synced so the rename lasts.
func replaceFile(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, tempPattern(path))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
