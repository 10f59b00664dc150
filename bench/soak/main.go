// Command soak churns pods on a running lab and counts what the churn
// leaked (package lab/soak); run.sh brings a lab up for it. It prints
// Markdown and exits 1 when anything leaked or the churn failed.
//
//	go run ./bench/soak -lab sk -duration 10m
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/soak"
)

func main() {
	cfg := soak.DefaultConfig()
	name := flag.String("lab", lab.DefaultName, "The running lab to churn (tendril lab up --name)")
	flag.StringVar(&cfg.Namespace, "namespace", cfg.Namespace, "Namespace of the soak's pods (created; must hold no pods)")
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "How long to churn")
	flag.Float64Var(&cfg.Rate, "rate", cfg.Rate, "Pods created (and deleted) per second, spread over the nodes")
	flag.IntVar(&cfg.Probes, "probes", cfg.Probes, "Connections each pod makes to the server on another node")
	flag.DurationVar(&cfg.SampleEvery, "sample-every", cfg.SampleEvery, "Agent RSS sampling interval")
	flag.DurationVar(&cfg.Settle, "settle", cfg.Settle, "How long after the last pod is gone the counts may take to reach zero")
	flag.IntVar(&cfg.MaxInFlight, "max-in-flight", cfg.MaxInFlight, "Most pods alive at once")
	flag.IntVar(&cfg.Allow.Goroutines, "allow-goroutines", cfg.Allow.Goroutines, "Agent goroutines allowed above the start")
	flag.IntVar(&cfg.Allow.FDs, "allow-fds", cfg.Allow.FDs, "Agent file descriptors allowed above the start")
	heapEvery := flag.Duration("heap-every", 5*time.Minute, "Interval of the agents' live-heap readings (pprof after a forced GC; 0: none)")
	heapDir := flag.String("heap-profiles", "", "Directory for a heap profile of each agent at each live-heap reading (compare two with go tool pprof -base)")
	flag.Parse()
	if err := run(*name, cfg, *heapEvery, *heapDir); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(name string, cfg soak.Config, heapEvery time.Duration, heapDir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	st, err := lab.LoadState(name)
	if err != nil {
		return err
	}
	rc, err := controlplane.RESTConfig(st.Kubeconfig)
	if err != nil {
		return err
	}
	cl, err := k8s.NewClientsForConfig(rc)
	if err != nil {
		return err
	}
	cfg.Lab, cfg.Clients = st, cl
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	if heapDir != "" {
		if err := os.MkdirAll(heapDir, 0o755); err != nil {
			return err
		}
	}
	var heaps *heapSampler
	hctx, stopHeaps := context.WithCancel(ctx)
	heapsDone := make(chan struct{})
	if heapEvery > 0 {
		heaps = &heapSampler{st: st, every: heapEvery, dir: heapDir, samples: map[string][]heapSample{}, errs: map[string]error{}}
		go func() { defer close(heapsDone); heaps.run(hctx) }()
	} else {
		close(heapsDone)
	}
	res, err := soak.Run(ctx, cfg)
	stopHeaps()
	<-heapsDone
	if res != nil {
		res.Markdown(os.Stdout)
	}
	if heaps != nil {
		fmt.Println()
		heaps.markdown(os.Stdout, cfg.Duration)
	}
	if err != nil {
		return err
	}
	if !res.Passed() {
		return fmt.Errorf("leaks or churn failures (see the tables)")
	}
	return nil
}
