// Claims: what a Create has taken so far (its addresses, its entry in the
// endpoint table), each with how to give it back, so that one deferred
// rollback undoes a failed Create, newest claim first.

package endpointmanager

import "sync"

// claims records what a Create has taken and whether it holds the
// manager's lock. Create drops the lock around its slow steps (disk
// writes, the build), so an undo must know the lock's state: one that
// changes the manager's own state (addLocked) runs under the lock, taking
// it if it is not held; the others (addresses, given back to the IPAM,
// which has its own lock) run as the lock is at the failure: held when a
// step under the lock failed, so no other Create sees them in between.
type claims struct {
	mu    *sync.Mutex
	held  bool
	undos []undo
}

type undo struct {
	fn     func()
	locked bool
}

// lock and unlock take and drop the manager's lock, recording its state.
func (c *claims) lock() {
	c.mu.Lock()
	c.held = true
}

func (c *claims) unlock() {
	c.held = false
	c.mu.Unlock()
}

// add records a claim given back by fn, which needs no lock.
func (c *claims) add(fn func()) { c.undos = append(c.undos, undo{fn: fn}) }

// addLocked records a claim on the manager's state, given back by fn
// under the manager's lock.
func (c *claims) addLocked(fn func()) { c.undos = append(c.undos, undo{fn: fn, locked: true}) }

// handOver replaces every claim by one undo that gives them all back at
// once: the endpoint now owns what was claimed for it, and undoing is
// deleting it.
func (c *claims) handOver(fn func()) { c.undos = []undo{{fn: fn}} }

// keep forgets the claims: the Create succeeded.
func (c *claims) keep() { c.undos = nil }

// rollback gives back every claim, newest first.
func (c *claims) rollback() {
	for i := len(c.undos) - 1; i >= 0; i-- {
		u := c.undos[i]
		if u.locked && !c.held {
			c.lock()
			u.fn()
			c.unlock()
			continue
		}
		u.fn()
	}
	c.undos = nil
}
