package hostdev

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// Per-packet cost of the host device programs with BPF_PROG_TEST_RUN,
// repeated in the kernel (one syscall for b.N runs, its cost spread over
// them): a masqueraded flow's packet leaving, its reply arriving, a packet
// the programs leave alone, and the first packet of new flows (a port
// claimed each).

func benchRepeat(b *testing.B, prog *ebpf.Program, ifindex int, frame []byte) {
	b.Helper()
	ctx := skbContext{}
	ctx.Fields[10] = uint32(ifindex)
	b.ResetTimer()
	start := time.Now()
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: ctx, Repeat: uint32(b.N)})
	el := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	if ret != 0 {
		b.Fatalf("verdict %d", ret)
	}
	b.ReportMetric(float64(el.Nanoseconds())/float64(b.N), "ns/packet")
}

func BenchmarkPrivilegedMasqueradeEstablished(b *testing.B) {
	n := newMasqNode(b, 61000, 65535)
	f := frame(pod, world, protoTCP, 40000, 80, 0)
	n.fromPod(f)
	to, _ := n.h.ProgramsForTest()
	benchRepeat(b, to, n.uplink, f)
}

func BenchmarkPrivilegedMasqueradeReply(b *testing.B) {
	n := newMasqNode(b, 61000, 65535)
	f := frame(pod, world, protoTCP, 40000, 80, 0)
	n.fromPod(f)
	_, out := n.egress(f)
	src, _ := tuple(out)
	_, from := n.h.ProgramsForTest()
	benchRepeat(b, from, n.uplink, frame(world, node, protoTCP, 80, src.Port(), 0))
}

func BenchmarkPrivilegedHostDevicePassThrough(b *testing.B) {
	n := newMasqNode(b, 61000, 65535)
	to, _ := n.h.ProgramsForTest()
	benchRepeat(b, to, n.uplink, frame(node, world, protoTCP, 40000, 80, 0))
}

// BenchmarkPrivilegedMasqueradeNewFlow: b.N flows (at most 3,000: two
// thirds of the range's 4,536 ports), one test run each (the syscall's
// cost included).
func BenchmarkPrivilegedMasqueradeNewFlow(b *testing.B) {
	n := newMasqNode(b, 61000, 65535)
	to, _ := n.h.ProgramsForTest()
	frames := make([][]byte, min(b.N, 3000))
	for i := range frames {
		frames[i] = frame(pod, world, protoTCP, uint16(20000+i), 80, 0)
	}
	ctx := skbContext{}
	ctx.Fields[10] = uint32(n.uplink)
	b.ResetTimer()
	start := time.Now()
	for i := range frames {
		if ret, err := to.Run(&ebpf.RunOptions{Data: frames[i], Context: ctx}); err != nil || ret != 0 {
			b.Fatalf("flow %d: verdict %d, %v", i, ret, err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(len(frames)), "ns/flow")
}
