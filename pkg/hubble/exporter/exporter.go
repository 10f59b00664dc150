// Package exporter writes flows as JSON lines (one GetFlowsResponse per
// line, as `hubble observe -o json` prints them) to a file that rotates
// by size, keeping a bounded number of backups, with the observer's
// allow and deny filters deciding which flows are written.
package exporter

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tendril-net/tendril/pkg/observer"
)

// Defaults of Config.
const (
	DefaultMaxSizeMB  = 10
	DefaultMaxBackups = 5
	// flushInterval bounds how long a written flow may sit in the buffer.
	flushInterval = time.Second
)

// Config configures an Exporter.
type Config struct {
	// Path is the file flows are appended to.
	Path string
	// MaxSizeBytes is the size past which the file is rotated.
	MaxSizeBytes int64
	// MaxBackups is how many rotated files (Path.1 newest ... Path.N) are
	// kept; 0 keeps none (the file is truncated at rotation).
	MaxBackups int
	// Allow and Deny are Hubble flow filters: a flow is written when it
	// matches any allow filter (or there are none) and no deny filter.
	Allow, Deny []*flowpb.FlowFilter
}

// ParseFilters reads a filter list the way Cilium's
// --hubble-export-allowlist takes it: JSON FlowFilter objects, one after
// the other or as a JSON array; empty is none.
func ParseFilters(s string) ([]*flowpb.FlowFilter, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	var out []*flowpb.FlowFilter
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("flow filters: %w", err)
		}
		var items []json.RawMessage
		if len(raw) > 0 && raw[0] == '[' {
			if err := json.Unmarshal(raw, &items); err != nil {
				return nil, fmt.Errorf("flow filters: %w", err)
			}
		} else {
			items = []json.RawMessage{raw}
		}
		for _, it := range items {
			f := &flowpb.FlowFilter{}
			if err := protojson.Unmarshal(it, f); err != nil {
				return nil, fmt.Errorf("flow filter %s: %w", it, err)
			}
			out = append(out, f)
		}
	}
}

// Exporter appends flows to its file. Export is safe for concurrent use.
type Exporter struct {
	cfg     Config
	log     *slog.Logger
	filters *observer.Filters

	mu      sync.Mutex
	file    *os.File
	buf     *bufio.Writer
	size    int64
	dirty   bool
	written uint64
	rotated uint64
	failed  uint64
	lastErr error
}

// New checks the configuration, compiles the filters and opens (or
// creates, mode 0600) the file for appending.
func New(cfg Config, log *slog.Logger) (*Exporter, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Path == "" || !filepath.IsAbs(cfg.Path) {
		return nil, fmt.Errorf("export file %q: must be an absolute path", cfg.Path)
	}
	if cfg.MaxSizeBytes <= 0 {
		return nil, fmt.Errorf("export file max size %d: must be positive", cfg.MaxSizeBytes)
	}
	if cfg.MaxBackups < 0 {
		return nil, fmt.Errorf("export file max backups %d: must not be negative", cfg.MaxBackups)
	}
	filters, err := observer.CompileFilters(cfg.Allow, cfg.Deny)
	if err != nil {
		return nil, fmt.Errorf("export filters: %w", err)
	}
	e := &Exporter{cfg: cfg, log: log, filters: filters}
	if err := e.open(); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Exporter) open() error {
	if err := os.MkdirAll(filepath.Dir(e.cfg.Path), 0o750); err != nil {
		return fmt.Errorf("export file directory: %w", err)
	}
	f, err := os.OpenFile(e.cfg.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open export file: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("stat export file: %w", err)
	}
	e.file, e.size = f, st.Size()
	if e.buf == nil {
		e.buf = bufio.NewWriterSize(f, 64*1024)
	} else {
		e.buf.Reset(f)
	}
	return nil
}

// Export writes the flow when the filters let it through. A write error
// is counted and logged once per kind, not returned: the observer must
// go on.
func (e *Exporter) Export(f *flowpb.Flow) {
	if !e.filters.Match(f) {
		return
	}
	line, err := protojson.MarshalOptions{}.Marshal(&observerpb.GetFlowsResponse{
		ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: f},
		NodeName:      f.GetNodeName(),
		Time:          orNow(f.GetTime()),
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.fail(fmt.Errorf("encode flow: %w", err))
		return
	}
	line = append(line, '\n')
	if e.file == nil {
		e.fail(errors.New("export file closed"))
		return
	}
	if e.size > 0 && e.size+int64(len(line)) > e.cfg.MaxSizeBytes {
		if err := e.rotate(); err != nil {
			e.fail(err)
			return
		}
	}
	n, err := e.buf.Write(line)
	e.size += int64(n)
	if err != nil {
		e.fail(fmt.Errorf("write export file: %w", err))
		return
	}
	e.written++
	e.dirty = true
}

func (e *Exporter) fail(err error) {
	e.failed++
	if e.lastErr == nil || e.lastErr.Error() != err.Error() {
		e.log.Error("Cannot export flow", "file", e.cfg.Path, "error", err)
	}
	e.lastErr = err
}

// rotate shifts Path.i to Path.i+1 (dropping the oldest), Path to Path.1,
// and starts an empty Path.
func (e *Exporter) rotate() error {
	if err := e.buf.Flush(); err != nil {
		return fmt.Errorf("flush export file: %w", err)
	}
	if err := e.file.Close(); err != nil {
		return fmt.Errorf("close export file: %w", err)
	}
	e.file = nil
	backup := func(i int) string { return e.cfg.Path + "." + strconv.Itoa(i) }
	if e.cfg.MaxBackups == 0 {
		if err := os.Truncate(e.cfg.Path, 0); err != nil {
			return fmt.Errorf("truncate export file: %w", err)
		}
	} else {
		if err := os.Remove(backup(e.cfg.MaxBackups)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove oldest export backup: %w", err)
		}
		for i := e.cfg.MaxBackups - 1; i >= 1; i-- {
			if err := os.Rename(backup(i), backup(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("rotate export backup: %w", err)
			}
		}
		if err := os.Rename(e.cfg.Path, backup(1)); err != nil {
			return fmt.Errorf("rotate export file: %w", err)
		}
	}
	e.rotated++
	return e.open()
}

// Flush writes what is buffered to the file.
func (e *Exporter) Flush() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.file == nil || !e.dirty {
		return nil
	}
	e.dirty = false
	if err := e.buf.Flush(); err != nil {
		return fmt.Errorf("flush export file: %w", err)
	}
	return nil
}

// Run flushes the buffer every second until ctx ends, so an exported
// flow reaches the file within about a second.
func (e *Exporter) Run(ctx context.Context) {
	t := time.NewTicker(flushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := e.Flush(); err != nil {
				e.log.Error("Cannot flush export file", "file", e.cfg.Path, "error", err)
			}
		}
	}
}

// Close flushes and closes the file.
func (e *Exporter) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.file == nil {
		return nil
	}
	ferr := e.buf.Flush()
	cerr := e.file.Close()
	e.file = nil
	if err := errors.Join(ferr, cerr); err != nil {
		return fmt.Errorf("close export file: %w", err)
	}
	return nil
}

// Stats are the exporter's counters.
type Stats struct {
	Written, Rotated, Failed uint64
	LastError                string
}

// Stats returns the counters.
func (e *Exporter) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := Stats{Written: e.written, Rotated: e.rotated, Failed: e.failed}
	if e.lastErr != nil {
		s.LastError = e.lastErr.Error()
	}
	return s
}

// Path is the file written.
func (e *Exporter) Path() string { return e.cfg.Path }

func orNow(t *timestamppb.Timestamp) *timestamppb.Timestamp {
	if t == nil {
		return timestamppb.Now()
	}
	return t
}
