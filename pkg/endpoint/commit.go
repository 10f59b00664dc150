package endpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// maxParallelSyncs bounds the fsyncs one batch runs at once (each holds an
// OS thread while it waits for the disk).
const maxParallelSyncs = 16

// committer writes files atomically and durably, in batches: whatever is
// submitted while a batch is being committed goes into the next one. No
// goroutine outlives a batch: the first write after an idle period starts
// the committing goroutine, which ends when nothing is queued.
type committer struct {
	mu      sync.Mutex
	queue   []*pendingFile
	running bool
}

// pendingFile is one file to write: dir/name, whose directory is created
// when missing (parent is then fsynced too, so the new directory's entry
// is durable; empty when dir exists for sure).
type pendingFile struct {
	parent, dir, name string
	data              []byte
	done              chan error
}

// write submits one file and waits until it is on disk.
func (c *committer) write(parent, dir, name string, data []byte) error {
	p := &pendingFile{parent: parent, dir: dir, name: name, data: data, done: make(chan error, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, p)
	if !c.running {
		c.running = true
		go c.run()
	}
	c.mu.Unlock()
	return <-p.done
}

func (c *committer) run() {
	for {
		c.mu.Lock()
		batch := c.queue
		c.queue = nil
		if len(batch) == 0 {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		commitBatch(batch)
	}
}

// target is one file of a batch; several writes of the same file in one
// batch are coalesced into the last one.
type target struct {
	parent, dir, name string
	data              []byte
	tmp               string
	waiters           []*pendingFile
	err               error
}

// commitBatch writes every file of the batch: temp files first, fsynced in
// parallel, then renamed, then the directories fsynced in parallel. Each
// waiter gets its own file's outcome.
func commitBatch(batch []*pendingFile) {
	var targets []*target
	byPath := map[string]*target{}
	for _, p := range batch {
		path := filepath.Join(p.dir, p.name)
		t, ok := byPath[path]
		if !ok {
			t = &target{parent: p.parent, dir: p.dir, name: p.name}
			byPath[path] = t
			targets = append(targets, t)
		}
		t.data = p.data // submission order: the last write wins
		t.waiters = append(t.waiters, p)
	}
	dirs := map[string]bool{}
	for _, t := range targets {
		if _, err := os.Stat(t.dir); errors.Is(err, os.ErrNotExist) && t.parent != "" {
			dirs[t.parent] = true
		}
		if err := os.MkdirAll(t.dir, 0o750); err != nil {
			t.err = fmt.Errorf("create %s: %w", t.dir, err)
			continue
		}
		t.tmp, t.err = writeTemp(t.dir, t.name, t.data)
	}
	parallel(targets, func(t *target) {
		if t.err == nil {
			t.err = syncPath(t.tmp)
		}
	})
	for _, t := range targets {
		if t.err == nil {
			if err := os.Rename(t.tmp, filepath.Join(t.dir, t.name)); err != nil {
				t.err = fmt.Errorf("rename into %s: %w", filepath.Join(t.dir, t.name), err)
			} else {
				t.tmp = ""
				dirs[t.dir] = true
			}
		}
		if t.tmp != "" {
			_ = os.Remove(t.tmp)
		}
	}
	var dirList []string
	for d := range dirs {
		dirList = append(dirList, d)
	}
	dirErr := map[string]error{}
	var mu sync.Mutex
	parallel(dirList, func(d string) {
		if err := syncPath(d); err != nil {
			mu.Lock()
			dirErr[d] = err
			mu.Unlock()
		}
	})
	for _, t := range targets {
		if t.err == nil {
			t.err = errors.Join(dirErr[t.dir], dirErr[t.parent])
		}
		for _, w := range t.waiters {
			w.done <- t.err
		}
	}
}

// writeTemp writes data to a new temp file beside name and returns its
// path.
func writeTemp(dir, name string, data []byte) (string, error) {
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	return tmp.Name(), nil
}

// syncPath fsyncs a file or directory.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return nil
}

// parallel runs fn on every item, at most maxParallelSyncs at once:
// concurrent fsyncs of one filesystem share its journal commits.
func parallel[T any](items []T, fn func(T)) {
	if len(items) == 1 {
		fn(items[0])
		return
	}
	sem := make(chan struct{}, maxParallelSyncs)
	var wg sync.WaitGroup
	for _, it := range items {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(it)
		}()
	}
	wg.Wait()
}
