package kvstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// SharedStoreConfig configures a SharedStore.
type SharedStoreConfig struct {
	// Prefix is the directory of the store's keys, ending in "/", e.g.
	// StatePrefix+"nodes/v1/". Keys are named relative to it.
	Prefix string
	// SyncInterval is how often local keys are checked and written again
	// if missing or different (0: five minutes).
	SyncInterval time.Duration
	// OnEvent, if set, receives every change under the prefix in order,
	// with the key named relative to the prefix, and EventListDone once.
	// It runs on the store's watch goroutine: a slow OnEvent delays the
	// store's view.
	OnEvent func(Event)
}

// SharedStore is a prefix that many clients share, each owning some keys
// (typically one per node): this client's local keys are written bound to
// its session, written again when missing (periodically, after a session
// renewal, and as soon as someone deletes one), and deleted on Close; all
// keys under the prefix, local and remote, are observed with ListAndWatch.
type SharedStore struct {
	c   *Client
	cfg SharedStoreConfig
	log *slog.Logger

	// writeMu orders writes of local keys, so that a periodic sync cannot
	// write back a value an UpsertLocal has just replaced.
	writeMu sync.Mutex

	mu       sync.Mutex
	local    map[string][]byte
	observed map[string][]byte

	synced   chan struct{}
	resync   chan struct{}
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	closeErr error
	closed   bool
}

// JoinSharedStore starts observing the prefix and keeping local keys.
func JoinSharedStore(c *Client, cfg SharedStoreConfig, log *slog.Logger) (*SharedStore, error) {
	if cfg.Prefix == "" || !strings.HasSuffix(cfg.Prefix, "/") {
		return nil, fmt.Errorf("shared store prefix %q: must be non-empty and end in '/'", cfg.Prefix)
	}
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = 5 * time.Minute
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &SharedStore{
		c: c, cfg: cfg, log: log.With("store", cfg.Prefix),
		local: map[string][]byte{}, observed: map[string][]byte{},
		synced: make(chan struct{}), resync: make(chan struct{}, 1), cancel: cancel,
	}
	renewals, unsubscribe := c.SessionRenewals()
	events := c.ListAndWatch(ctx, cfg.Prefix)
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.observe(events)
	}()
	go func() {
		defer s.wg.Done()
		defer unsubscribe()
		s.syncLoop(ctx, renewals)
	}()
	return s, nil
}

// Synced is closed once every key that existed when the store joined has
// been observed.
func (s *SharedStore) Synced() <-chan struct{} { return s.synced }

// Get returns the observed value of a key (local or remote).
func (s *SharedStore) Get(name string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.observed[name]
	return v, ok
}

// List returns a copy of every observed key and value.
func (s *SharedStore) List() map[string][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.observed)
}

// UpsertLocal makes name one of this client's keys with value and writes
// it now. On error the key stays local and the next sync writes it.
func (s *SharedStore) UpsertLocal(ctx context.Context, name string, value []byte) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("shared store %s: closed", s.cfg.Prefix)
	}
	s.local[name] = bytes.Clone(value)
	s.mu.Unlock()
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.c.Update(ctx, s.cfg.Prefix+name, value, SessionLease); err != nil {
		return fmt.Errorf("shared store upsert %q: %w", name, err)
	}
	return nil
}

// DeleteLocal stops keeping name and deletes it.
func (s *SharedStore) DeleteLocal(ctx context.Context, name string) error {
	s.mu.Lock()
	delete(s.local, name)
	s.mu.Unlock()
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.c.Delete(ctx, s.cfg.Prefix+name); err != nil {
		return fmt.Errorf("shared store delete %q: %w", name, err)
	}
	return nil
}

// LocalKeys returns the names of this client's keys, sorted.
func (s *SharedStore) LocalKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.local))
}

// Close stops the store and deletes its local keys (ctx bounds the
// deletes). Other clients see them go.
func (s *SharedStore) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.closeErr
	}
	s.closed = true
	local := slices.Sorted(maps.Keys(s.local))
	s.local = map[string][]byte{}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	var errs []error
	for _, name := range local {
		if err := s.c.Delete(ctx, s.cfg.Prefix+name); err != nil {
			errs = append(errs, err)
		}
	}
	s.closeErr = errors.Join(errs...)
	if s.closeErr != nil {
		s.closeErr = fmt.Errorf("shared store %s: close: %w", s.cfg.Prefix, s.closeErr)
	}
	return s.closeErr
}

func (s *SharedStore) triggerSync() {
	select {
	case s.resync <- struct{}{}:
	default:
	}
}

// observe applies watch events to the observed view.
func (s *SharedStore) observe(events <-chan Event) {
	for ev := range events {
		if ev.Type == EventListDone {
			close(s.synced)
			if s.cfg.OnEvent != nil {
				s.cfg.OnEvent(ev)
			}
			continue
		}
		name := strings.TrimPrefix(ev.Key, s.cfg.Prefix)
		s.mu.Lock()
		if ev.Type == EventDelete {
			delete(s.observed, name)
		} else {
			s.observed[name] = ev.Value
		}
		_, isLocal := s.local[name]
		s.mu.Unlock()
		if ev.Type == EventDelete && isLocal {
			// Someone removed one of our keys (or its lease went): put it
			// back without waiting for the next periodic sync.
			s.log.Info("Local key deleted from the kvstore; writing it again", "key", name)
			s.triggerSync()
		}
		if s.cfg.OnEvent != nil {
			ev.Key = name
			s.cfg.OnEvent(ev)
		}
	}
}

func (s *SharedStore) syncLoop(ctx context.Context, renewals <-chan struct{}) {
	t := time.NewTicker(s.cfg.SyncInterval)
	defer t.Stop()
	// retry fires soon after a failed sync: a write that failed right
	// after a session renewal must not wait a whole interval.
	var retry <-chan time.Time
	b := newBackoff(time.Second, s.cfg.SyncInterval)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-renewals:
			s.log.Info("New kvstore session; writing local keys again")
		case <-s.resync:
		case <-retry:
		}
		retry = nil
		if err := s.syncLocal(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("Cannot write local keys; retrying", "error", err)
			retry = time.After(b.next)
			b.next = min(b.next*2, b.max)
			continue
		}
		b.reset()
	}
}

// syncLocal writes every local key that is missing or differs in etcd
// (value, or lease after a session renewal).
func (s *SharedStore) syncLocal(ctx context.Context) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	local := maps.Clone(s.local)
	s.mu.Unlock()
	var errs []error
	written := 0
	for _, name := range slices.Sorted(maps.Keys(local)) {
		wrote, err := s.c.UpdateIfMissing(ctx, s.cfg.Prefix+name, local[name], SessionLease)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if wrote {
			written++
		}
	}
	if written > 0 {
		s.log.Info("Wrote local keys again", "written", written, "local", len(local))
	}
	return errors.Join(errs...)
}
