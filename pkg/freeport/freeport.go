// Package freeport picks TCP ports on loopback for processes that bind
// them later (etcd, kube-apiserver, a test's server).
//
// The kernel's own choice (listen on port 0) comes from the ephemeral
// range, the same range connect() takes source ports from: between the
// pick and the child's bind, any outgoing connection on the machine (an
// API server's to its etcd, a parallel test package's) may take the port
// and the child fails with "address already in use". Ports below the
// ephemeral range are only ever taken by an explicit bind, so Loopback
// picks there, at random, and checks that nothing listens.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
)

// rangeFile holds the ephemeral range as "low high".
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// floor is the lowest port picked: below it sit well-known services.
const floor = 10000

// Loopback returns a TCP port on 127.0.0.1 that nothing listens on and
// that the kernel does not hand out as a source port, avoiding the ports
// in avoid (picked earlier for the same set of processes).
func Loopback(avoid ...int) (int, error) {
	lo, hi, err := candidates()
	if err != nil {
		return 0, err
	}
	for range 200 {
		p := lo + rand.IntN(hi-lo+1)
		if slices.Contains(avoid, p) {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		ln.Close()
		return p, nil
	}
	return 0, fmt.Errorf("find a free port in %d-%d: 200 tries, all taken", lo, hi)
}

// candidates is the range outside the ephemeral one: below it when there
// is room, else above it.
func candidates() (int, int, error) {
	eLo, eHi, err := ephemeral()
	if err != nil {
		return 0, 0, err
	}
	return pickRange(eLo, eHi)
}

func pickRange(eLo, eHi int) (int, int, error) {
	switch {
	case eLo-floor >= 1000:
		return floor, eLo - 1, nil
	case 65535-eHi >= 1000:
		return eHi + 1, 65535, nil
	}
	return 0, 0, fmt.Errorf("the ephemeral port range %d-%d leaves no room for fixed ports", eLo, eHi)
}

func ephemeral() (int, int, error) {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0, 0, fmt.Errorf("read the ephemeral port range: %w", err)
	}
	return parseRange(string(b))
}

func parseRange(s string) (int, int, error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("ephemeral port range %q: want two numbers", strings.TrimSpace(s))
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err := errors.Join(err1, err2); err != nil || lo > hi {
		return 0, 0, fmt.Errorf("ephemeral port range %q: not low and high", strings.TrimSpace(s))
	}
	return lo, hi, nil
}
