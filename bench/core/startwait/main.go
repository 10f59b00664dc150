// Command startwait runs a command (an agent) and reports the time from
// its exec until its API answers GET /v1/healthz with 200 on a unix
// socket, polled every 200 µs in-process. bench/core/run.sh used a shell
// loop of curl processes, whose own start (≈ 5 ms each) quantized the
// result: the agents' starts differ by less than that.
//
//	startwait -socket S -- agent args...   # prints milliseconds, 0.1 ms resolution
//	startwait -cpu -socket S -- agent ...  # and the agent's CPU time to that moment
//
// The CPU time (-cpu, in ms) is what the agent's threads ran on a CPU
// until it answered, from /proc/<pid>/task/*/schedstat (nanoseconds, where
// /proc/<pid>/stat counts 10 ms ticks). On a loaded machine the wall
// clock also counts the time the agent waited for a CPU; its own CPU
// time moves much less.
//
// The command keeps running after the report until startwait is
// signalled; it is then stopped with SIGTERM (and its exit awaited).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	socket := flag.String("socket", "", "the agent's API socket")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after")
	cpu := flag.Bool("cpu", false, "also print the command's CPU time until it answered")
	flag.Parse()
	if *socket == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: startwait -socket S -- command args...")
		os.Exit(2)
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", *socket)
		},
		DisableKeepAlives: true,
	}}
	cmd := exec.Command(flag.Arg(0), flag.Args()[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	begin := time.Now()
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "startwait:", err)
		os.Exit(1)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	}
	for {
		select {
		case err := <-exited:
			fmt.Fprintln(os.Stderr, "startwait: the command exited before it was ready:", err)
			os.Exit(1)
		default:
		}
		if time.Since(begin) > *timeout {
			stop()
			fmt.Fprintln(os.Stderr, "startwait: not ready after", *timeout)
			os.Exit(1)
		}
		resp, err := client.Get("http://agent/v1/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		time.Sleep(200 * time.Microsecond)
	}
	elapsed := time.Since(begin)
	if *cpu {
		ns, err := cpuTime(cmd.Process.Pid)
		if err != nil {
			stop()
			fmt.Fprintln(os.Stderr, "startwait:", err)
			os.Exit(1)
		}
		fmt.Printf("%.1f %.1f\n", float64(elapsed.Microseconds())/1000, float64(ns)/1e6)
	} else {
		fmt.Printf("%.1f\n", float64(elapsed.Microseconds())/1000)
	}
	stop()
}

// cpuTime is the nanoseconds pid's threads have run, the first field of
// each thread's schedstat.
func cpuTime(pid int) (int64, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("threads of %d: %v", pid, err)
	}
	var total int64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // a thread that exited since the glob
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, fmt.Errorf("%s: empty", t)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", t, err)
		}
		total += ns
	}
	return total, nil
}
