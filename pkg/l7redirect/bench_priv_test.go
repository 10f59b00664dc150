package l7redirect

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// BenchmarkPrivilegedHTTPThroughRedirect measures kept-alive HTTP GETs from
// pod a to pod b on one node under the real datapath, three ways in the
// same run, so the HTTP proxy's cost can be told from the floor any proxy
// in the path has:
//
//   - l4: a's port 81 allowed at L4, straight to b's server;
//   - splice: port 80's entry names the HTTP proxy, but the datapath's
//     proxy port names a bare transparent splice (accept, dial the
//     original destination, copy both ways): the redirect and one
//     user-space hop, no HTTP;
//   - proxy: the same entry through Tendril's HTTP proxy (an L7 rule
//     allowing GET, a flow per request, the upstream from a's address).
//
// Each runs with 1 and 8 client connections; b.N requests in all, so
// ns/op is per request and req/s the rate.
func BenchmarkPrivilegedHTTPThroughRedirect(b *testing.B) {
	node, l, root, pods := redirectNode(b, "tdrl7b", "a", "b")
	pa, pb := pods[0], pods[1]
	m := l.Maps()
	const idA, idB = 3201, 3202
	for p, id := range map[netip.Addr]uint32{pa.IPv4: idA, pb.IPv4: idB} {
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(p, 32), maps.IPCacheEntry{Identity: id}); err != nil {
			b.Fatal(err)
		}
	}
	for _, ep := range []loader.EndpointInfo{
		{ID: 1, IfIndex: pa.HostIfIndex, IfName: pa.HostIf, Addresses: []netip.Addr{pa.IPv4}, MAC: pa.MAC, HostMAC: pa.HostMAC, Identity: idA, EnforceEgress: true},
		{ID: 2, IfIndex: pb.HostIfIndex, IfName: pb.HostIf, Addresses: []netip.Addr{pb.IPv4}, MAC: pb.MAC, HostMAC: pb.HostMAC, Identity: idB},
	} {
		if err := l.AttachEndpoint(ep); err != nil {
			b.Fatal(err)
		}
	}
	for port, proxy := range map[uint16]uint8{80: maps.ProxyHttp, 81: 0} {
		k := maps.PolicyKey{EndpointID: 1, Direction: maps.DirEgress, Identity: idB, Proto: 6, Port: port, PortPrefixLen: 16}
		if err := m.PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 9, Proxy: proxy}); err != nil {
			b.Fatal(err)
		}
	}

	// b's server on both ports.
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "hello from b")
	})}
	for _, port := range []int{80, 81} {
		var ln net.Listener
		if err := pb.Do(func() (err error) {
			ln, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", pb.IPv4, port))
			return err
		}); err != nil {
			b.Fatal(err)
		}
		go func() { _ = srv.Serve(ln) }()
	}
	b.Cleanup(func() { _ = srv.Close() })

	var flows atomic.Int64
	cfg := Config{
		BPFRoot: root,
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Endpoint: func(addr netip.Addr) (Sender, bool) {
			if addr == pa.IPv4 {
				return Sender{EndpointID: 1, Identity: idA}, true
			}
			return Sender{}, false
		},
		Rules: func(ep uint16, dst netip.AddrPort, _ uint8) *policy.L7Rules {
			if ep == 1 && dst.Port() == 80 {
				return &policy.L7Rules{HTTP: []api.PortRuleHTTP{{Method: "GET", Path: "/ok.*"}}}
			}
			return nil
		},
		DNS:      fqdnConfig(new(sync.Mutex), new([]string), new([]*flow.Flow)),
		HTTPFlow: func(*flow.Flow) { flows.Add(1) },
		InNodeNS: func(fn func() error) error { return linux.InNetNS(node.NS, fn) },
	}
	r, err := Start(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Close() })
	_, proxyPort := r.Ports()

	// The splice: a transparent listener of its own in the node's
	// namespace, named as the HTTP proxy's port while "splice" runs.
	var spliceLn net.Listener
	if err := linux.InNetNS(node.NS, func() (err error) {
		lc := net.ListenConfig{Control: transparent("tcp", false)}
		spliceLn, err = lc.Listen(context.Background(), "tcp", ":0")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = spliceLn.Close() })
	go serveSplice(spliceLn, node.NS)
	splicePort := uint16(spliceLn.Addr().(*net.TCPAddr).Port)
	ports, err := ebpf.LoadPinnedMap(filepath.Join(root, bpf.LxcMapTdrProxyPortsV1), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ports.Close() })
	setPort := func(port uint16) {
		if err := ports.Put(uint32(maps.ProxyHttp), uint32(port)); err != nil {
			b.Fatal(err)
		}
	}

	for _, c := range []struct {
		name string
		port int
		via  uint16 // the datapath's HTTP proxy port while it runs
	}{{"l4", 81, proxyPort}, {"splice", 80, splicePort}, {"proxy", 80, proxyPort}} {
		for _, conns := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/conns=%d", c.name, conns), func(b *testing.B) {
				setPort(c.via)
				defer setPort(proxyPort)
				url := fmt.Sprintf("http://%s:%d/ok", pb.IPv4, c.port)
				tr := &http.Transport{MaxIdleConnsPerHost: conns, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
					var conn net.Conn
					err := pa.Do(func() (err error) {
						conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
						return err
					})
					return conn, err
				}}
				defer tr.CloseIdleConnections()
				client := &http.Client{Transport: tr}
				get := func() error {
					resp, err := client.Get(url)
					if err != nil {
						return err
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						return fmt.Errorf("status %d", resp.StatusCode)
					}
					return nil
				}
				// Warm the connections (and check the path answers).
				for range conns {
					if err := get(); err != nil {
						b.Fatalf("%s: %v", c.name, err)
					}
				}
				b.ResetTimer()
				cpu0 := processCPU(b)
				var wg sync.WaitGroup
				errs := make(chan error, conns)
				for i := range conns {
					n := b.N / conns
					if i < b.N%conns {
						n++
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range n {
							if err := get(); err != nil {
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
					b.Fatalf("%s: %v", c.name, err)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
				// The process's CPU (clients, proxy or splice, server) a
				// request: steadier than the rate on a shared machine.
				b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/req")
			})
		}
	}
	if flows.Load() == 0 {
		b.Fatal("the HTTP proxy gave no flow: the proxy sub-benchmark did not go through it")
	}
}

// serveSplice is the benchmark's bare proxy: each connection the datapath
// assigned to it goes on to its original destination (the accepted
// socket's local address) from the node, both ways copied.
func serveSplice(ln net.Listener, ns netns.NsHandle) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			dst := addrPort(c.LocalAddr())
			var up net.Conn
			if err := linux.InNetNS(ns, func() (err error) {
				up, err = net.Dial("tcp4", netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()).String())
				return err
			}); err != nil {
				return
			}
			defer up.Close()
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(up, c)
				if tc, ok := up.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				close(done)
			}()
			_, _ = io.Copy(c, up)
			<-done
		}()
	}
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
