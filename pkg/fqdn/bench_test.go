package fqdn

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/miekg/dns"

	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// benchName is the name every benchmark lookup asks for; both upstreams
// answer it with benchAddr.
const (
	benchName = "world.example."
	benchAddr = "198.51.100.1"
)

// coreDNSUpstream runs the lab's CoreDNS binary on loopback, answering
// benchName from its hosts plugin, until the benchmark ends.
func coreDNSUpstream(b *testing.B) netip.AddrPort {
	b.Helper()
	bin := lab.CoreDNSBinary()
	if _, err := os.Stat(bin); err != nil {
		b.Skipf("no CoreDNS binary at %s (hack/coredns.sh builds it): %v", bin, err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := netip.MustParseAddrPort(pc.LocalAddr().String())
	pc.Close()
	dir := b.TempDir()
	conf := filepath.Join(dir, "Corefile")
	corefile := fmt.Sprintf("example:%d {\n    bind 127.0.0.1\n    hosts {\n        %s %s\n        ttl 30\n    }\n}\n",
		addr.Port(), benchAddr, strings.TrimSuffix(benchName, "."))
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-conf", conf)
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := &dns.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, _, err := c.Exchange(new(dns.Msg).SetQuestion(benchName, dns.TypeA), addr.String())
		if err == nil && len(m.Answer) == 1 {
			return addr
		}
		if time.Now().After(deadline) {
			b.Fatalf("CoreDNS at %s does not answer %s: %v %v", addr, benchName, m, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// goUpstream is a miekg/dns server on loopback answering every name with
// benchAddr (in the process, so the upstream costs the same both ways).
func goUpstream(b *testing.B) netip.AddrPort {
	b.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg).SetReply(r)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP(benchAddr)}}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	b.Cleanup(func() { _ = srv.Shutdown() })
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// benchProxy serves the DNS proxy on loopback UDP, forwarding to up, with
// the agent's real cache behind Learned and flows built (and dropped).
func benchProxy(b *testing.B, up netip.AddrPort, cache *Cache) netip.AddrPort {
	b.Helper()
	rules := []api.PortRuleDNS{{MatchPattern: "*.example"}}
	p := NewProxy(ProxyConfig{
		Endpoint: func(netip.Addr) (Source, bool) { return Source{EndpointID: 1, Identity: 1000}, true },
		Rules:    func(uint16, netip.AddrPort) []api.PortRuleDNS { return rules },
		Learned: func(_ context.Context, src Source, name string, ips []netip.Addr, ttl uint32) error {
			cache.Add(src.EndpointID, name, ips, ttl)
			return nil
		},
		OrigDst: func(dns.ResponseWriter) netip.AddrPort { return up },
		Flow:    func(*flowpb.Flow) {},
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: p}
	go func() { _ = srv.ActivateAndServe() }()
	b.Cleanup(func() { _ = srv.Shutdown() })
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// lookups sends b.N lookups of name one after the other to server and
// reports their p50, p99 and the process's CPU time per lookup.
func lookups(b *testing.B, server netip.AddrPort, name func(i int) string) {
	b.Helper()
	c := &dns.Client{Timeout: 5 * time.Second}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	cpu0 := processCPU(b)
	for i := 0; i < b.N; i++ {
		start := time.Now()
		m, _, err := c.Exchange(new(dns.Msg).SetQuestion(name(i), dns.TypeA), server.String())
		if err != nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
			b.Fatalf("lookup %d of %s through %s: %v %v", i, name(i), server, m, err)
		}
		lat = append(lat, time.Since(start))
	}
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(cpu.Microseconds())/float64(len(lat)), "cpu-µs/lookup")
}

// processCPU is the CPU time (user and system) this process has used: the
// client and the proxy (and the miekg upstream), not CoreDNS. Per lookup
// it is steadier than wall time on a loaded machine.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDNSLookup: one client's lookups, one after the other, directly
// to the upstream and through the DNS proxy (rule check, forward, the
// answer into the FQDN cache, the L7 flow), in the same run: against the
// lab's CoreDNS binary and against a miekg/dns server in the process.
// Compare the p50-µs and p99-µs of direct and proxy of one upstream.
func BenchmarkDNSLookup(b *testing.B) {
	for _, u := range []struct {
		name string
		up   func(*testing.B) netip.AddrPort
	}{{"coredns", coreDNSUpstream}, {"miekg", goUpstream}} {
		b.Run(u.name, func(b *testing.B) {
			up := u.up(b)
			proxy := benchProxy(b, up, NewCache(time.Hour, nil))
			same := func(int) string { return benchName }
			b.Run("direct", func(b *testing.B) { lookups(b, up, same) })
			b.Run("proxy", func(b *testing.B) { lookups(b, proxy, same) })
		})
	}
}

// BenchmarkProxyMemory10kNames: the heap the DNS proxy and its FQDN cache
// hold once 10,000 distinct names (one address each) were looked up
// through the proxy and learned, measured after a GC against the heap
// before the first lookup (reported as heap-MiB and B/name).
func BenchmarkProxyMemory10kNames(b *testing.B) {
	const names = 10000
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		up := goUpstream(b)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b.StartTimer()
		cache := NewCache(time.Hour, nil)
		proxy := benchProxy(b, up, cache)
		c := &dns.Client{Timeout: 5 * time.Second}
		for n := 0; n < names; n++ {
			name := fmt.Sprintf("host-%d.example.", n)
			if _, _, err := c.Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), proxy.String()); err != nil {
				b.Fatalf("lookup %s: %v", name, err)
			}
		}
		b.StopTimer()
		if got := len(cache.Lookups(0, "")); got != names {
			b.Fatalf("the cache holds %d names, want %d", got, names)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(cache)
		grown := float64(after.HeapAlloc) - float64(before.HeapAlloc)
		b.ReportMetric(grown/(1<<20), "heap-MiB")
		b.ReportMetric(grown/names, "B/name")
		b.StartTimer()
	}
}
