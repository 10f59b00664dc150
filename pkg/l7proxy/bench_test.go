package l7proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// serveL4 is the L4-only path the proxy is compared with: every accepted
// connection is spliced to dst byte for byte (what a connection allowed
// by an L4 rule gets, minus the kernel's forwarding), in the same process
// as the proxy would be.
func serveL4(ln net.Listener, dst netip.AddrPort) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			up, err := net.Dial("tcp", dst.String())
			if err != nil {
				return
			}
			defer up.Close()
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(up, c)
				up.(*net.TCPConn).CloseWrite()
				close(done)
			}()
			_, _ = io.Copy(c, up)
			<-done
		}()
	}
}

// serveL7 serves every accepted connection with the HTTP proxy.
func serveL7(ln net.Listener, p *HTTPProxy, dst netip.AddrPort) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go p.ServeConn(c, Source{EndpointID: 7, Identity: 4242}, dst)
	}
}

// run sends n GET requests from conc clients, each on its own kept-alive
// connection, and reports requests/s, p50, p99 and the process's CPU time
// per request.
func run(b *testing.B, base string, conc int) {
	b.Helper()
	tr := &http.Transport{MaxConnsPerHost: conc, MaxIdleConnsPerHost: conc}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	per := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	b.ResetTimer()
	cpu0 := processCPU(b)
	start := time.Now()
	for g := 0; g < conc; g++ {
		n := b.N / conc
		if g < b.N%conc {
			n++
		}
		wg.Add(1)
		go func(g, n int) {
			defer wg.Done()
			lat := make([]time.Duration, 0, n)
			for i := 0; i < n; i++ {
				t0 := time.Now()
				resp, err := client.Get(base + "/healthz")
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs <- fmt.Errorf("status %d", resp.StatusCode)
					return
				}
				lat = append(lat, time.Since(t0))
			}
			per[g] = lat
		}(g, n)
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	all := slices.Concat(per...)
	slices.Sort(all)
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(cpu.Microseconds())/float64(len(all)), "cpu-µs/req")
}

// processCPU is the CPU time (user and system) the process has used:
// clients, path under test and upstream together. Per request it is
// steadier than wall time on a loaded machine, and the difference
// between two paths is what the one costs more.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHTTP: GET requests with a small answer from 1 and 16 keep-alive
// clients, through the HTTP proxy enforcing an L7 rule (GET /healthz among
// three rules; an L7 flow built per request) against the same requests
// through an L4-only path (a TCP splice), to the same upstream in the same
// run. The goal is req/s through l7 at least half of l4's.
func BenchmarkHTTP(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	rules := []api.PortRuleHTTP{{Method: "POST", Path: "/api/v[0-9]+/.*"}, {Method: "GET", Path: "/metrics", Headers: []string{"X-Token: abc"}}, {Method: "GET", Path: "/healthz"}}
	p := NewHTTP(Config{
		Rules: func(Source, netip.AddrPort) []api.PortRuleHTTP { return rules },
		Flow:  func(*flowpb.Flow) {},
	})
	listen := func(serve func(net.Listener)) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ln.Close() })
		go serve(ln)
		return "http://" + ln.Addr().String()
	}
	l4 := listen(func(ln net.Listener) { serveL4(ln, upAddr) })
	l7 := listen(func(ln net.Listener) { serveL7(ln, p, upAddr) })
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("c%d/l4", conc), func(b *testing.B) { run(b, l4, conc) })
		b.Run(fmt.Sprintf("c%d/l7", conc), func(b *testing.B) { run(b, l7, conc) })
	}
}
