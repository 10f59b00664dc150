package testutil

import (
	"os/exec"
	"runtime"
	"sync"
)

// The kernel sends a child's parent-death signal (Pdeathsig) when the
// thread that forked it exits, not when the process does. Go ends a
// thread whose goroutine locked it and returned without unlocking, and
// code that enters network namespaces does exactly that (namedns,
// netns.Set on a throwaway thread), so a control-plane process started
// from such a thread died at random in the middle of a test. StartPinned
// forks every such child from one thread that is locked for the process's
// whole life, so their parent-death signal comes only when the test
// process ends. Process-wide on purpose: the thread must outlive every
// child, whoever started it.
var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

// StartPinned starts cmd (which may set Pdeathsig) from the pinned
// thread; the caller waits for it as usual.
func StartPinned(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawner.reqs <- spawnRequest{cmd: cmd, done: done}
	return <-done
}
