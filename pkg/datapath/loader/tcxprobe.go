package loader

import (
	"errors"
	"fmt"
	"math"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// ProbeTCX reports whether the kernel has TCX links (Linux 6.6+): it
// attaches a two-instruction program to an interface index no device
// has. A kernel with TCX refuses the index (ENODEV); one without refuses
// the attach type, which cilium/ebpf reports as ebpf.ErrNotSupported.
func ProbeTCX() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return fmt.Errorf("probe tcx: load a test program: %w", err)
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err == nil {
		l.Close() // no device has that index; never expected
		return nil
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return err
	}
	return nil
}

// ResolveAttachMode is the attach mode the agent runs with: the requested
// one, except that tcx on a kernel without TCX (probe returns
// ebpf.ErrNotSupported) falls back to tc filters, which every kernel with
// clsact has. note says what changed and what the node cannot do then
// ("" when nothing did); another probe error keeps tcx, whose attach then
// fails with its own error.
func ResolveAttachMode(requested AttachMode, probe func() error) (mode AttachMode, note string) {
	if requested != AttachTCX {
		return requested, ""
	}
	if err := probe(); errors.Is(err, ebpf.ErrNotSupported) {
		return AttachTC, "the kernel has no TCX links (Linux 6.6+): programs attach as tc filters, which are not owned (another tc user can replace them until the attachment check puts them back)"
	}
	return AttachTCX, ""
}
