// Package linux holds the agent's host networking: the host device that
// carries the router addresses, the per-endpoint routes to the host-side
// veths and the sysctls that make a node forward pod traffic.
//
// Every function works on explicit handles (a netlink handle and a network
// namespace), so tests run them in a namespace of their own and never touch
// the host's.
//
// Design (see docs/cni.md): pods get /32 and /128 addresses and reach
// everything through the router address. The router addresses live on the
// device tendril_host (one end of a veth pair); the node routes each pod address to the pod's
// host-side veth. Inside the pod the router addresses have permanent
// neighbor entries pointing at the host-side veth's MAC, so the pod never
// needs ARP or NDP answers for an address that is not on that veth (IPv6
// would not answer them, and proxy ARP would answer for everything).
package linux

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// InNetNS runs fn on an OS thread switched into ns. A handle that is not
// open (the zero value or netns.None()) runs fn in the caller's namespace. The thread is never handed back to the
// Go scheduler (it exits with the goroutine), so a failed switch back can not
// leak a thread in the wrong namespace into other goroutines.
func InNetNS(ns netns.NsHandle, fn func() error) error {
	if int(ns) <= 0 {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// No UnlockOSThread: the runtime terminates this thread when the
		// goroutine returns, whatever namespace it is left in.
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
