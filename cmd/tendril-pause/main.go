// Command tendril-pause is the lab's pod sandbox ("pause") container: it
// holds a pod's namespaces open and does nothing else, sleeping until
// SIGINT or SIGTERM ends it. As PID 1 of the sandbox it also reaps the
// zombies re-parented to it (SIGCHLD). The lab's real-node mode (`tendril
// lab up --runtime containerd`) builds the pause image from it
// (pkg/lab/realnode), so no registry is needed.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
