// Package delqueue keeps the CNI DELs that tendril-cni could not hand to
// the agent because none was listening (uninstalled, crashed, or not yet
// serving after a restart). The plugin records the DEL and succeeds, so
// the runtime does not hold the pod in Terminating until an agent comes
// back; the agent runs the recorded DELs once it has started (Cilium's
// deletion queue does the same). The queue is a directory beside the
// agent's API socket, writable by root only: whoever can write there can
// already talk to the agent.
package delqueue

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// MaxEntryBytes bounds what the agent reads of one entry: a DEL request
// is a few kilobytes (its network configuration), and a larger file is
// not one the plugin wrote.
const MaxEntryBytes = 1 << 20

// Dir is the queue beside the agent's API socket.
func Dir(socket string) string { return filepath.Join(filepath.Dir(socket), "cni-delete-queue") }

// Add records the DEL request body of one attachment (container and
// interface) in dir, replacing an earlier record of the same attachment.
// The file appears whole or not at all (written aside, then renamed).
func Add(dir, containerID, ifName string, body []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the CNI delete queue %s: %w", dir, err)
	}
	sum := sha256.Sum256([]byte(containerID + "\x00" + ifName))
	name := hex.EncodeToString(sum[:16]) + ".json"
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("queue DEL of %s: %w", containerID, err)
	}
	_, werr := tmp.Write(body)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("queue DEL of %s: %w", containerID, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("queue DEL of %s: %w", containerID, err)
	}
	return nil
}

// Entry is one recorded DEL.
type Entry struct {
	// Path is the entry's file; Remove it once the DEL is done.
	Path string
	// Body is the request the plugin would have sent.
	Body []byte
}

// List returns the recorded DELs of dir (none when it does not exist).
// An entry larger than MaxEntryBytes is returned with an error of its own
// in errs, and no body, so the caller can drop it.
func List(dir string) (entries []Entry, errs []error) {
	des, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, []error{fmt.Errorf("read the CNI delete queue %s: %w", dir, err)}
	}
	for _, de := range des {
		if !de.Type().IsRegular() || !strings.HasSuffix(de.Name(), ".json") {
			continue // a write in progress (.tmp-*), or not ours
		}
		p := filepath.Join(dir, de.Name())
		body, err := readBounded(p)
		if err != nil {
			errs = append(errs, err)
			entries = append(entries, Entry{Path: p})
			continue
		}
		entries = append(entries, Entry{Path: p, Body: body})
	}
	return entries, errs
}

func readBounded(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read queued DEL %s: %w", p, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxEntryBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read queued DEL %s: %w", p, err)
	}
	if len(b) > MaxEntryBytes {
		return nil, fmt.Errorf("queued DEL %s: larger than %d bytes", p, MaxEntryBytes)
	}
	return b, nil
}

// Remove drops a done entry; one already gone is fine.
func Remove(e Entry) error {
	if err := os.Remove(e.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove queued DEL %s: %w", e.Path, err)
	}
	return nil
}
