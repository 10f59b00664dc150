// Package version holds the build's version, set at link time by the
// Makefile (-X github.com/tendril-net/tendril/pkg/version.Version=...).
package version

import (
	"fmt"
	"runtime"
)

// Version and Commit are set by the linker; they are never changed at run time.
var (
	Version = "0.1.0-dev"
	Commit  = "unknown"
)

// String is the one-line version used by every binary and by the API.
func String() string {
	return fmt.Sprintf("%s (%s, %s %s/%s)", Version, Commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
