// Package startgc holds the Go garbage collector back while the process
// starts, and gives it back its configured target once the caller is
// ready.
//
// A Go process starts with a 4 MB heap goal: the agent's package
// initialization (client-go's scheme, the etcd client's packages, the API
// models' validators) and the building of its hive allocate far
// more, so that with the default target the collector ran three or four
// times before the agent served, each cycle with its stop-the-world pauses,
// its write barrier and its assists slowing the one goroutine that
// starts the agent. With a target of StartPercent the start collects once
// or not at all and peaks at about 17 MB of heap instead of 10.
//
// The package's init sets the start target. Go initializes, among the
// packages whose dependencies are initialized, the first by import path;
// this one depends on a few standard packages (runtime/debug, os,
// strconv, strings, and through pkg/binpages fmt and syscall), so it is
// initialized before the heavy packages above: after 1.9 of the 6.5 MB
// they allocate, measured before pkg/binpages added fmt
// (GODEBUG=inittrace=1 shows the order).
// Importing it from package main is enough to have its effect; Done ends
// it.
package startgc

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/tendril-net/tendril/pkg/binpages"
)

// StartPercent is the collector's target (GOGC) while the process starts:
// the heap grows to five times what was live after the last collection
// before the next one.
const StartPercent = 400

func init() {
	// A higher GOGC, or GOGC=off, is the operator's and stays.
	if configured := ConfiguredPercent(); configured >= 0 && configured < StartPercent {
		debug.SetGCPercent(StartPercent)
	}
}

// Done sets the collector's target back to the one GOGC configures and
// returns what the start left free to the kernel: the start's heap peak
// (grown to five times the live heap under StartPercent, and the caches'
// initial listings decoded) is mostly garbage by now, and the runtime's
// scavenger would otherwise keep it resident up to the new heap goal.
// One forced collection, once per process. The pages of the binary that
// the start touched (init functions, every cell's constructor) are
// unmapped too (pkg/binpages); what the agent runs afterwards maps its own
// pages back. Neither can fail in a way the caller could act on: a
// process without /proc keeps its pages mapped.
func Done() {
	debug.SetGCPercent(ConfiguredPercent())
	debug.FreeOSMemory()
	_, _ = binpages.Release()
}

// ConfiguredPercent is the target the Go runtime reads from GOGC: -1 for
// "off", the number it holds (a 32-bit integer, without a plus sign), 100
// when unset or not such a number.
func ConfiguredPercent() int {
	v := os.Getenv("GOGC")
	if v == "off" {
		return -1
	}
	if n, err := strconv.ParseInt(v, 10, 32); err == nil && !strings.HasPrefix(v, "+") {
		return int(n)
	}
	return 100
}
