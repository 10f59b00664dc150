package testutil

import "runtime"

// HeapAfterGC is the live heap in bytes right after a collection: what the
// memory benchmarks compare before and after filling a cache.
func HeapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
