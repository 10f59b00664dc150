// Command connrate opens TCP connections to a server one after the other
// (each: connect, send a line, read the answer, close) and reports how
// many were answered per second, and where the first failure came: run
// inside a lab pod against the world server by bench/nat/run.sh, it
// measures new connections per second through masquerade until the port
// range is exhausted.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"time"
)

func main() {
	addr := flag.String("addr", "198.51.100.1:80", "server HOST:PORT")
	n := flag.Int("n", 500, "connections to open")
	timeout := flag.Duration("timeout", 500*time.Millisecond, "how long one connection may take")
	stopAfter := flag.Int("stop-after-failures", 20, "stop after this many failures in a row")
	flag.Parse()
	var ok, failed, inARow int
	firstFailure := -1
	var okTime time.Duration
	begin := time.Now()
	for i := 0; i < *n; i++ {
		start := time.Now()
		if err := once(*addr, *timeout); err != nil {
			failed++
			inARow++
			if firstFailure < 0 {
				firstFailure = i
				fmt.Fprintf(os.Stderr, "connection %d failed: %v\n", i, err)
			}
			if inARow >= *stopAfter {
				break
			}
			continue
		}
		inARow = 0
		ok++
		if firstFailure < 0 {
			okTime += time.Since(start)
		}
	}
	beforeFailure := ok
	if firstFailure >= 0 {
		beforeFailure = firstFailure
	}
	rate := 0.0
	if okTime > 0 {
		rate = float64(beforeFailure) / okTime.Seconds()
	}
	fmt.Printf("answered=%d failed=%d first_failure=%d conn_per_sec_before_failure=%.0f elapsed=%s\n",
		ok, failed, firstFailure, rate, time.Since(begin).Round(time.Millisecond))
}

func once(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("tendril-probe\n")); err != nil {
		return err
	}
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		return err
	}
	return nil
}
