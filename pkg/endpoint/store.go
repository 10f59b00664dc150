package endpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// stateVersion is the on-disk format version; a newer or older version is
// not misread.
const stateVersion = 1

type onDisk struct {
	Version  int       `json:"version"`
	Endpoint *Endpoint `json:"endpoint"`
}

// Store keeps one directory per endpoint under Dir: Dir/<id>/state.json,
// written atomically (temp file, fsync, rename, fsync of the directory).
//
// Writes that arrive while others are being committed are committed
// together (group commit): one batch writes its temp files, fsyncs them in
// parallel, renames them and fsyncs the directories in parallel, so the
// filesystem's journal commits once or twice for the whole batch instead
// of twice per file. A write returns only when its file is renamed into
// place and on disk: an endpoint the caller reported created survives a
// kill -9 of the agent right after.
type Store struct {
	Dir string
	Log *slog.Logger

	commit *committer
}

// NewStore returns a store under dir, creating it.
func NewStore(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create endpoint state dir %s: %w", dir, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{Dir: dir, Log: log, commit: &committer{}}, nil
}

func (s *Store) epDir(id uint16) string { return filepath.Join(s.Dir, strconv.Itoa(int(id))) }

// Write stores the endpoint durably (see Store).
func (s *Store) Write(ep *Endpoint) error {
	// Compact JSON: the state is written on every create and regeneration
	// (jq shows it indented).
	data, err := json.Marshal(onDisk{Version: stateVersion, Endpoint: ep})
	if err != nil {
		return fmt.Errorf("encode endpoint %d: %w", ep.ID, err)
	}
	if err := s.commit.write(s.Dir, s.epDir(ep.ID), "state.json", data); err != nil {
		return fmt.Errorf("write endpoint %d: %w", ep.ID, err)
	}
	return nil
}

// Remove deletes the endpoint's directory.
func (s *Store) Remove(id uint16) error {
	if err := os.RemoveAll(s.epDir(id)); err != nil {
		return fmt.Errorf("remove state of endpoint %d: %w", id, err)
	}
	return nil
}

// LoadAll reads every endpoint. A directory whose state is missing, corrupt
// or of another version is logged and moved aside (renamed *.corrupt-<time>)
// so the others still restore and the bad one is kept for inspection.
func (s *Store) LoadAll() ([]*Endpoint, error) {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("read endpoint state dir %s: %w", s.Dir, err)
	}
	type state struct {
		name string
		id   uint16
		ep   *Endpoint
		err  error
	}
	var states []state
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		id, err := strconv.ParseUint(e.Name(), 10, 16)
		if err != nil {
			continue // moved-aside or foreign directories
		}
		states = append(states, state{name: e.Name(), id: uint16(id)})
	}
	// The files are read and decoded on every CPU: the restore is on the
	// agent's start path, and a node's endpoints are many small files.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(states)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(states); i = int(next.Add(1) - 1) {
				states[i].ep, states[i].err = s.load(states[i].name)
			}
		})
	}
	wg.Wait()
	out := make([]*Endpoint, 0, len(states))
	for _, st := range states {
		if st.err == nil && st.ep.ID != st.id {
			st.err = fmt.Errorf("state says ID %d", st.ep.ID)
		}
		if st.err != nil {
			aside := filepath.Join(s.Dir, fmt.Sprintf("%s.corrupt-%d", st.name, time.Now().UnixNano()))
			s.Log.Error("Endpoint state unreadable; moved aside, the other endpoints still restore",
				"endpoint", st.name, "error", st.err, "moved-to", aside)
			if mvErr := os.Rename(filepath.Join(s.Dir, st.name), aside); mvErr != nil {
				s.Log.Error("Could not move bad endpoint state aside", "endpoint", st.name, "error", mvErr)
			}
			continue
		}
		out = append(out, st.ep)
	}
	return out, nil
}

func (s *Store) load(name string) (*Endpoint, error) {
	data, err := os.ReadFile(filepath.Join(s.Dir, name, "state.json"))
	if err != nil {
		return nil, err
	}
	var d onDisk
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("parse state: %w", err)
	}
	if d.Version != stateVersion {
		return nil, fmt.Errorf("state version %d, this agent reads %d", d.Version, stateVersion)
	}
	if d.Endpoint == nil {
		return nil, errors.New("state holds no endpoint")
	}
	return d.Endpoint, nil
}

// WriteFile writes a small file in the store's directory atomically and
// durably, committed with the endpoint writes of the moment (used for the
// ID allocator's cursor).
func (s *Store) WriteFile(name string, data []byte) error {
	return s.commit.write("", s.Dir, name, data)
}

// ReadFile reads a file written by WriteFile.
func (s *Store) ReadFile(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(s.Dir, name))
}
