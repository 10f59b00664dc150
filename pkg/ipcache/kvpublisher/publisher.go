// Package kvpublisher keeps this node's keys in the kvstore (its endpoint
// addresses, for other nodes' ipcaches) without making anyone wait for
// etcd: Set and Delete only record the desired state of a key and return;
// one goroutine (Run) writes what changed, retries failed writes with
// backoff, and writes every key again when the kvstore session that the
// keys are bound to is recreated. A slow or unreachable etcd therefore
// delays the keys, never the caller (an endpoint's creation, a CNI ADD).
package kvpublisher

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/tendril-net/tendril/pkg/kvstore"
)

// Store writes keys (a kvstore.SharedStore's local keys).
type Store interface {
	UpsertLocal(ctx context.Context, name string, value []byte) error
	DeleteLocal(ctx context.Context, name string) error
}

// Config tunes the publisher; zero values take the defaults.
type Config struct {
	// WriteTimeout bounds one write (default 5 s): etcd's client waits for
	// a connection, so an attempt against a stopped etcd takes this long.
	WriteTimeout time.Duration
	// MinRetry and MaxRetry space the retries after a failed write
	// (defaults 100 ms and 1 s). The spacing stays short because a failed
	// attempt has already waited WriteTimeout, and keys should reach etcd
	// soon after it is back.
	MinRetry, MaxRetry time.Duration
}

func (c Config) withDefaults() Config {
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 5 * time.Second
	}
	if c.MinRetry <= 0 {
		c.MinRetry = 100 * time.Millisecond
	}
	if c.MaxRetry < c.MinRetry {
		c.MaxRetry = max(c.MinRetry, time.Second)
	}
	return c
}

// key is the desired state of one key.
type key struct {
	// value is what the key should hold; nil: it should not exist.
	value []byte
	// dirty: the desired state is not confirmed in the kvstore yet.
	dirty bool
	// gen changes with every change of value, so that a write of an older
	// value does not mark a newer one done.
	gen uint64
}

// Status says how far the kvstore is behind the desired state.
type Status struct {
	// Keys is how many keys should exist.
	Keys int
	// Pending is how many keys (writes and deletes) are not confirmed yet.
	Pending int
	// LastError is the last failed write (nil if none yet), at
	// LastErrorAt; it stays after later successes, for diagnosis.
	LastError   error
	LastErrorAt time.Time
}

// Publisher holds the desired keys and writes them.
type Publisher struct {
	store Store
	cfg   Config
	log   *slog.Logger

	mu          sync.Mutex
	keys        map[string]*key
	gen         uint64
	lastErr     error
	lastErrTime time.Time
	kick        chan struct{}
}

// New returns a publisher writing to store once Run runs.
func New(store Store, cfg Config, log *slog.Logger) *Publisher {
	return &Publisher{store: store, cfg: cfg.withDefaults(), log: log,
		keys: map[string]*key{}, kick: make(chan struct{}, 1)}
}

// Set makes name hold value. It returns at once.
func (p *Publisher) Set(name string, value []byte) {
	p.mu.Lock()
	k := p.keys[name]
	if k != nil && k.value != nil && bytes.Equal(k.value, value) {
		p.mu.Unlock()
		return
	}
	if k == nil {
		k = &key{}
		p.keys[name] = k
	}
	p.gen++
	k.value, k.dirty, k.gen = append([]byte{}, value...), true, p.gen
	p.mu.Unlock()
	p.trigger()
}

// Delete makes name not exist. It returns at once. Only keys this
// publisher was asked to Set are deleted: others belong to other writers
// (or to an earlier run's session, and go with its lease).
func (p *Publisher) Delete(name string) {
	p.mu.Lock()
	k := p.keys[name]
	if k == nil || k.value == nil {
		p.mu.Unlock()
		return
	}
	p.gen++
	k.value, k.dirty, k.gen = nil, true, p.gen
	p.mu.Unlock()
	p.trigger()
}

func (p *Publisher) trigger() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Status returns the publisher's state.
func (p *Publisher) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Status{LastError: p.lastErr, LastErrorAt: p.lastErrTime}
	for _, k := range p.keys {
		if k.value != nil {
			st.Keys++
		}
		if k.dirty {
			st.Pending++
		}
	}
	return st
}

// Run writes changes until ctx ends. After a failure it waits (backing
// off) before the next attempt, and new changes wait with it, so a down
// etcd is not hammered; a signal on renewals (a new session: the keys
// bound to the old lease are gone) marks every key to be written again and
// ends any wait.
func (p *Publisher) Run(ctx context.Context, renewals <-chan struct{}) {
	b := kvstore.NewBackoff(p.cfg.MinRetry, p.cfg.MaxRetry)
	var retry *time.Timer
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		kick := p.kick
		var retryC <-chan time.Time
		if retry != nil {
			kick, retryC = nil, retry.C
		}
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-retryC:
		case <-renewals:
			p.log.Info("New kvstore session; publishing every key again")
			p.markAll()
		}
		if retry != nil {
			retry.Stop()
			retry = nil
		}
		if err := p.flush(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			d := b.Next()
			p.log.Warn("Cannot write to the kvstore; will retry", "pending", p.Status().Pending, "retry-in", d, "error", err)
			retry = time.NewTimer(d)
			continue
		}
		b.Reset()
	}
}

// markAll marks every key that should exist to be written again.
func (p *Publisher) markAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range p.keys {
		if k.value != nil {
			p.gen++
			k.dirty, k.gen = true, p.gen
		}
	}
}

// flush writes every dirty key once, in name order, stopping at the first
// failure (etcd is likely down: the others would wait as long).
func (p *Publisher) flush(ctx context.Context) error {
	p.mu.Lock()
	var names []string
	for name, k := range p.keys {
		if k.dirty {
			names = append(names, name)
		}
	}
	p.mu.Unlock()
	slices.Sort(names)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		p.mu.Lock()
		k := p.keys[name]
		if k == nil || !k.dirty {
			p.mu.Unlock()
			continue
		}
		value, gen := k.value, k.gen
		p.mu.Unlock()
		wctx, cancel := context.WithTimeout(ctx, p.cfg.WriteTimeout)
		var err error
		if value == nil {
			err = p.store.DeleteLocal(wctx, name)
		} else {
			err = p.store.UpsertLocal(wctx, name, value)
		}
		cancel()
		p.mu.Lock()
		if err != nil {
			p.lastErr, p.lastErrTime = err, time.Now()
			p.mu.Unlock()
			return fmt.Errorf("publish %q: %w", name, err)
		}
		if p.keys[name] == k && k.gen == gen {
			k.dirty = false
			if k.value == nil {
				delete(p.keys, name)
			}
		}
		p.mu.Unlock()
	}
	return nil
}

// Keys returns the names of the keys that should exist, sorted.
func (p *Publisher) Keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, name := range slices.Sorted(maps.Keys(p.keys)) {
		if p.keys[name].value != nil {
			out = append(out, name)
		}
	}
	return out
}
