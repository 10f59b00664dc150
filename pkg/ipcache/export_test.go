package ipcache

// StartForTest and SyncedForTest serve the package's external tests
// (the benchmarks over the real BPF map).
var (
	StartForTest  = startCache
	SyncedForTest = synced
)
