package l2announcer

import (
	"context"
	"encoding/binary"
	"fmt"
	"iter"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/reconcile"
)

// Responder is the kernel side the reconciler writes: the responder map.
type Responder interface {
	Set(maps.L2ResponderKey, maps.L2ResponderEntry) error
	Delete(maps.L2ResponderKey) error
	List() (map[maps.L2ResponderKey]maps.L2ResponderEntry, error)
}

// ops writes the announcements into the responder map. An entry is
// answered until now + the lease duration; the reconciler's refresh
// rewrites it every retry period while this node holds the lease, so a
// node whose agent stopped stops answering about when another node may
// have taken the lease over.
type ops struct {
	resp  Responder
	ttl   time.Duration
	garp  func(ifindex int, mac net.HardwareAddr, addr netip.Addr) error
	clock func() (uint64, error)
	log   *slog.Logger
}

func (o *ops) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, a *Announcement) error {
	now, err := o.clock()
	if err != nil {
		return err
	}
	if err := o.resp.Set(maps.L2ResponderKey{Addr: a.Addr, IfIndex: a.IfIndex},
		maps.L2ResponderEntry{MAC: a.MAC, Expires: now + uint64(o.ttl)}); err != nil {
		return err
	}
	if a.Status.Kind == reconciler.StatusKindRefreshing {
		return nil
	}
	// Taken over (or written again after an error): neighbours that
	// cached another node's MAC for the address move to this one.
	if err := o.garp(a.IfIndex, a.MAC, a.Addr); err != nil {
		return fmt.Errorf("gratuitous ARP for %s on %s: %w", a.Addr, a.Device, err)
	}
	o.log.Info("L2 announcement written, gratuitous ARP sent", "address", a.Addr, "device", a.Device, "service", a.Service)
	return nil
}

func (o *ops) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, a *Announcement) error {
	return o.resp.Delete(maps.L2ResponderKey{Addr: a.Addr, IfIndex: a.IfIndex})
}

// Prune removes map entries no announcement backs: those of a former run
// whose services this run does not lead.
func (o *ops) Prune(_ context.Context, _ statedb.ReadTxn, objs iter.Seq2[*Announcement, statedb.Revision]) error {
	keep := map[maps.L2ResponderKey]struct{}{}
	for a := range objs {
		keep[maps.L2ResponderKey{Addr: a.Addr, IfIndex: a.IfIndex}] = struct{}{}
	}
	have, err := o.resp.List()
	if err != nil {
		return err
	}
	keys := make([]maps.L2ResponderKey, 0, len(have))
	for k := range have {
		keys = append(keys, k)
	}
	_, err = reconcile.PruneStale(keys, keep, o.resp.Delete)
	return err
}

// monotonicNow is CLOCK_MONOTONIC in ns: bpf_ktime_get_ns's clock.
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read CLOCK_MONOTONIC: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// GARPFrame is a gratuitous ARP request for addr from mac: broadcast,
// sender and target address both addr, which a Linux neighbour updates
// its cached entry of addr with.
func GARPFrame(mac net.HardwareAddr, addr netip.Addr) []byte { return ARPRequest(mac, addr, addr) }

// ARPRequest is a broadcast Ethernet ARP request from mac and sender for
// target (IPv4 addresses).
func ARPRequest(mac net.HardwareAddr, sender, target netip.Addr) []byte {
	f := make([]byte, 42)
	for i := range 6 {
		f[i] = 0xff
	}
	copy(f[6:12], mac)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_ARP)
	binary.BigEndian.PutUint16(f[14:], 1) // Ethernet
	binary.BigEndian.PutUint16(f[16:], unix.ETH_P_IP)
	f[18], f[19] = 6, 4
	binary.BigEndian.PutUint16(f[20:], 1) // request
	copy(f[22:28], mac)
	s, t := sender.As4(), target.As4()
	copy(f[28:32], s[:])
	copy(f[38:42], t[:])
	return f
}

// sendGARP sends the gratuitous ARP out of the device with a packet
// socket (in the caller's network namespace).
func sendGARP(ifindex int, mac net.HardwareAddr, addr netip.Addr) error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(maps.Htons(unix.ETH_P_ARP)))
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	sa := &unix.SockaddrLinklayer{Protocol: maps.Htons(unix.ETH_P_ARP), Ifindex: ifindex, Halen: 6}
	copy(sa.Addr[:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	if err := unix.Sendto(fd, GARPFrame(mac, addr), 0, sa); err != nil {
		return fmt.Errorf("send on ifindex %d: %w", ifindex, err)
	}
	return nil
}
