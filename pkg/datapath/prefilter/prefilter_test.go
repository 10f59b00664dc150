package prefilter

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// udpFrame is an Ethernet frame of a small UDP datagram from src to dst.
func udpFrame(src, dst netip.Addr) []byte {
	eth := make([]byte, 14)
	copy(eth, []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2})
	udp := make([]byte, 8+18)
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], 53)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	var ip []byte
	if src.Is4() {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		ip = make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, 17
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
		s, d := src.As4(), dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
	} else {
		binary.BigEndian.PutUint16(eth[12:], 0x86DD)
		ip = make([]byte, 40)
		ip[0], ip[6], ip[7] = 0x60, 17, 64
		binary.BigEndian.PutUint16(ip[4:], uint16(len(udp)))
		s, d := src.As16(), dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
	}
	return append(append(eth, ip...), udp...)
}

// openTest opens the prefilter under a fresh BPF root.
func openTest(tb testing.TB) (*Datapath, string) {
	tb.Helper()
	testutil.Privileged(tb)
	if _, err := bpffs.EnsureMounted(); err != nil {
		tb.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	root := filepath.Join("/sys/fs/bpf", "tendril-prefilter-"+hex.EncodeToString(b))
	tb.Cleanup(func() { _ = os.RemoveAll(root) })
	d, err := Open(root, slog.Default())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(d.Close)
	return d, root
}

const (
	xdpDrop = 1
	xdpPass = 2
	tcShot  = 2
)

// TestPrivilegedPrefilterVerdicts runs the XDP program on crafted frames:
// a source inside a denied prefix (IPv4 and IPv6, the longest match
// irrelevant: any covering prefix denies) is dropped and counted per
// family with its bytes; one outside, a destination inside (only sources
// are filtered), a truncated header and a non-IP frame pass uncounted.
// The maps are pinned: a second Open under the same root sees the list.
func TestPrivilegedPrefilterVerdicts(t *testing.T) {
	d, root := openTest(t)
	for _, p := range []string{"198.51.100.0/24", "2001:db8:bad::/48", "203.0.113.7/32"} {
		if err := d.Put(netip.MustParsePrefix(p)); err != nil {
			t.Fatal(err)
		}
	}
	host4, host6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	cases := []struct {
		name  string
		frame []byte
		want  uint32
	}{
		{"denied v4 /24", udpFrame(netip.MustParseAddr("198.51.100.77"), host4), xdpDrop},
		{"denied v4 /32", udpFrame(netip.MustParseAddr("203.0.113.7"), host4), xdpDrop},
		{"denied v6", udpFrame(netip.MustParseAddr("2001:db8:bad:1::9"), host6), xdpDrop},
		{"allowed v4", udpFrame(netip.MustParseAddr("198.51.101.1"), host4), xdpPass},
		{"allowed v4 next to /32", udpFrame(netip.MustParseAddr("203.0.113.8"), host4), xdpPass},
		{"allowed v6", udpFrame(netip.MustParseAddr("2001:db8:bad0::1"), host6), xdpPass},
		{"denied prefix as destination", udpFrame(host4, netip.MustParseAddr("198.51.100.77")), xdpPass},
		{"truncated v4", udpFrame(netip.MustParseAddr("198.51.100.77"), host4)[:14+16], xdpPass},
		{"ARP", append(slices.Clone(udpFrame(host4, host4)[:12]), 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), xdpPass},
	}
	for _, c := range cases {
		ret, err := d.XDP().Run(&ebpf.RunOptions{Data: c.frame})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if ret != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, ret, c.want)
		}
	}
	got, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	v4len := uint64(len(udpFrame(host4, host4)))
	v6len := uint64(len(udpFrame(host6, host6)))
	if got.IPv4Packets != 2 || got.IPv6Packets != 1 || got.IPv4Bytes != 2*v4len || got.IPv6Bytes != v6len {
		t.Errorf("counters %+v, want 2 IPv4 packets (%d bytes) and 1 IPv6 (%d bytes)", got, 2*v4len, v6len)
	}

	// The same list through a second Open (a restarted agent).
	d2, err := Open(root, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	ps, err := d2.Prefixes()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	want := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.7/32"), netip.MustParsePrefix("2001:db8:bad::/48")}
	if !slices.Equal(ps, want) {
		t.Errorf("prefixes after reopen %v, want %v", ps, want)
	}
	if err := d2.Delete(netip.MustParsePrefix("198.51.100.0/24")); err != nil {
		t.Fatal(err)
	}
	if err := d2.Delete(netip.MustParsePrefix("198.51.100.0/24")); err != nil {
		t.Fatalf("deleting an absent prefix: %v", err)
	}
	if ret, _ := d.XDP().Run(&ebpf.RunOptions{Data: udpFrame(netip.MustParseAddr("198.51.100.77"), host4)}); ret != xdpPass {
		t.Errorf("after delete: verdict %d, want pass", ret)
	}
}

// BenchmarkPrefilterDrop: the same denied frames dropped by the XDP
// program and by the same check as a tc program (the host programs'
// layer), through BPF_PROG_TEST_RUN, 1000 prefixes per family in the
// list. The test run gives the tc program a ready skb, so the difference
// measured is the program's context, not the skb the kernel builds for a
// real packet before tc (bench/prefilter.sh measures that with real
// traffic).
func BenchmarkPrefilterDrop(b *testing.B) {
	d, _ := openTest(b)
	for i := range 1000 {
		_ = d.Put(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))
		_ = d.Put(netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(i >> 8), byte(i)}), 48))
	}
	frame := udpFrame(netip.MustParseAddr("10.3.7.9"), netip.MustParseAddr("192.0.2.1"))
	for _, c := range []struct {
		name string
		prog *ebpf.Program
		want uint32
	}{{"xdp", d.XDP(), xdpDrop}, {"tc", d.TC(), tcShot}} {
		b.Run(c.name, func(b *testing.B) {
			const repeat = 1000
			for b.Loop() {
				ret, err := c.prog.Run(&ebpf.RunOptions{Data: frame, Repeat: repeat})
				if err != nil || ret != c.want {
					b.Fatalf("ret %d, err %v", ret, err)
				}
			}
			b.ReportMetric(float64(b.N*repeat)/b.Elapsed().Seconds(), "pkts/s")
		})
	}
}
