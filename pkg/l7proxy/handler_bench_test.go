package l7proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// benchNode is what the observer knows in BenchmarkHandler: the client
// pod (endpoint 7) and the server pod, with labels, as the agent's flows
// name them.
type benchNode struct{ client, server netip.Addr }

func (benchNode) NodeName() string                              { return "node-a" }
func (benchNode) IdentityLabels(uint32) []string                { return nil }
func (benchNode) PolicyByCookie(uint32) (observer.Policy, bool) { return observer.Policy{}, false }
func (n benchNode) EndpointByID(id uint16) (observer.Endpoint, bool) {
	if id == 7 {
		return observer.Endpoint{ID: 7, Identity: 4242, Namespace: "shop", PodName: "web-7d9f",
			Labels: []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"}, WorkloadName: "web", WorkloadKind: "Deployment"}, true
	}
	return observer.Endpoint{}, false
}
func (n benchNode) EndpointByIP(ip netip.Addr) (observer.Endpoint, bool) {
	if ip == n.server {
		return observer.Endpoint{ID: 9, Identity: 5151, Namespace: "shop", PodName: "api-0",
			Labels: []string{"k8s:app=api", "k8s:io.kubernetes.pod.namespace=shop"}}, true
	}
	return observer.Endpoint{}, false
}

// benchAnswer is the upstream's answer in BenchmarkHandler.
const benchAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"

// rawUpstream answers every request of every connection with benchAnswer,
// parsing no more than the end of the headers: it costs next to nothing,
// so the process's CPU is the proxy's.
func rawUpstream(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(c)
			for {
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						return
					}
					if len(line) <= 2 {
						break
					}
				}
				if _, err := io.WriteString(c, benchAnswer); err != nil {
					return
				}
			}
		}()
	}
}

// rawGet sends GET /healthz on c and reads the answer (status 200, its
// Content-Length body) through br.
func rawGet(c net.Conn, br *bufio.Reader) error {
	const req = "GET /healthz HTTP/1.1\r\nHost: api.shop:80\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		return err
	}
	status, err := br.ReadSlice('\n')
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(status, []byte("HTTP/1.1 200 ")) {
		return fmt.Errorf("status line %q", status)
	}
	n := -1
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) <= 2 {
			break
		}
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			n, err = strconv.Atoi(string(bytes.TrimSpace(v)))
			if err != nil {
				return err
			}
		}
	}
	if n < 0 {
		return fmt.Errorf("no Content-Length")
	}
	_, err = br.Discard(n)
	return err
}

// BenchmarkHandler is the HTTP proxy's own cost per request: kept-alive
// GETs from 1 and 8 raw clients through ServeConn (three HTTP rules, the
// third allowing, over loopback TCP) to a raw upstream, every L7 flow
// published into a real observer (completed with the endpoints' pods and
// labels, kept in its ring). Clients and upstream parse next to nothing,
// so allocs/op and cpu-µs/req are the proxy's and the flow's. It fails
// when a request does not get its flow.
func BenchmarkHandler(b *testing.B) {
	for _, conc := range []int{1, 8} {
		b.Run(fmt.Sprintf("c%d", conc), func(b *testing.B) { benchHandler(b, conc) })
	}
}

func benchHandler(b *testing.B, conc int) {
	listen := func(serve func(net.Listener)) netip.AddrPort {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ln.Close() })
		go serve(ln)
		return netip.MustParseAddrPort(ln.Addr().String())
	}
	upAddr := listen(rawUpstream)
	obs := observer.New(observer.Config{}, benchNode{client: netip.MustParseAddr("127.0.0.1"), server: upAddr.Addr()}, nil)
	rules := []api.PortRuleHTTP{{Method: "POST", Path: "/api/v[0-9]+/.*"}, {Method: "GET", Path: "/metrics", Headers: []string{"X-Token: abc"}}, {Method: "GET", Path: "/healthz"}}
	p := NewHTTP(Config{
		Rules: func(Source, netip.AddrPort) []api.PortRuleHTTP { return rules },
		Flow:  obs.PublishL7,
	})
	var served sync.WaitGroup
	b.Cleanup(served.Wait)
	pxAddr := listen(func(ln net.Listener) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			served.Add(1)
			go func() {
				defer served.Done()
				p.ServeConn(c, Source{EndpointID: 7, Identity: 4242}, upAddr)
			}()
		}
	})
	conns := make([]net.Conn, conc)
	for i := range conns {
		c, err := net.Dial("tcp", pxAddr.String())
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c
		// One request first: the upstream connection is dialled then,
		// outside the measured requests.
		if err := rawGet(c, bufio.NewReader(c)); err != nil {
			b.Fatal(err)
		}
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	seen0 := obs.Ring().Seen()
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	for g, c := range conns {
		n := b.N / conc
		if g < b.N%conc {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			br := bufio.NewReader(c)
			for range n {
				if err := rawGet(c, br); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/req")
	// Every request's flow is in the ring (the flow of a request is
	// published before its answer is written).
	if got := obs.Ring().Seen() - seen0; got != uint64(b.N) {
		b.Fatalf("%d flows for %d requests", got, b.N)
	}
	_, next, _ := obs.Ring().Bounds()
	f, _ := obs.Ring().At(next - 1)
	h := f.GetL7().GetHttp()
	if h.GetMethod() != "GET" || h.GetCode() != 200 || h.GetUrl() != "http://api.shop:80/healthz" ||
		f.GetVerdict() != flowpb.Verdict_FORWARDED || f.GetSource().GetPodName() != "web-7d9f" ||
		f.GetDestination().GetPodName() != "api-0" || f.GetSummary() != "HTTP allowed by http rule 2 "+describe(rules[2]) {
		b.Fatalf("last flow: %v", f)
	}
}
