package loader

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// AttachL7Hairpin loads the pod object's l7_hairpin program (bpf_lxc.c),
// attaches it at TCX ingress of interface ifindex (the node's
// tendril_host) and names the interface in tdr_l7_hairpin_v1: to_pod then
// sends the node's own flows to a port with ingress HTTP rules there,
// where the program hands them to the ingress HTTP proxy
// (docs/policy-l7.md, "The node as a source"). detach undoes it, the map
// entry first. The link is not pinned: it lives as long as the caller
// (the agent's proxies, which it serves); without it to_pod's redirect
// finds no program, the packet comes back to to_pod marked and is
// dropped, as without a hairpin device.
func (l *Loader) AttachL7Hairpin(ifindex int) (detach func() error, err error) {
	if ifindex <= 0 {
		return nil, fmt.Errorf("L7 hairpin: interface index %d", ifindex)
	}
	l.mu.Lock()
	spec, objs := l.spec, &l.objs
	l.mu.Unlock()
	if spec == nil || objs.TdrL7HairpinV1 == nil {
		return nil, errors.New("L7 hairpin: the datapath is not loaded")
	}
	var prog struct {
		P *ebpf.Program `ebpf:"l7_hairpin"`
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: l.cfg.BPFRoot}, MapReplacements: loadedMaps(&objs.LxcMaps)}
	if err := spec.Copy().LoadAndAssign(&prog, opts); err != nil {
		return nil, fmt.Errorf("L7 hairpin: load l7_hairpin: %w", err)
	}
	defer prog.P.Close()
	lk, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog.P, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return nil, fmt.Errorf("L7 hairpin: attach to interface %d: %w", ifindex, err)
	}
	if err := objs.TdrL7HairpinV1.Update(uint32(0), uint32(ifindex), ebpf.UpdateAny); err != nil {
		lk.Close()
		return nil, fmt.Errorf("L7 hairpin: name interface %d in the datapath: %w", ifindex, err)
	}
	l.log.Info("L7 hairpin attached", "ifindex", ifindex)
	return func() error {
		uerr := objs.TdrL7HairpinV1.Update(uint32(0), uint32(0), ebpf.UpdateAny)
		if uerr != nil {
			uerr = fmt.Errorf("L7 hairpin: clear the datapath's interface: %w", uerr)
		}
		return errors.Join(uerr, lk.Close())
	}, nil
}
