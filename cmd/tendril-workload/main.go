// Command tendril-workload is a lab pod's server: it answers every TCP
// connection and UDP datagram on its ports with the pod's name (package
// pkg/lab/workload). The lab's kubelet starts one per pod; it links only
// that package so that a pod's process starts in milliseconds and a few
// MiB, where `tendril lab workload` (the same server) pays for the whole
// CLI's initialisation on every pod.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tendril-net/tendril/pkg/lab/workload"
)

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if err := workload.RunCommand(ctx, "tendril-workload", os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tendril-workload:", err)
		os.Exit(1)
	}
}
