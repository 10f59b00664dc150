// Package wireguard is the kernel side of the transparent encryption
// between nodes (docs/encryption.md): the WireGuard device (the userspace
// implementation, golang.zx2c4.com/wireguard, in a process of its own on
// a TUN device, where the kernel has no WireGuard module) and its
// configuration through wgctrl, which drives a kernel device the same
// way. The keys are in wgkey.
package wireguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl"
)

// DefaultDevice is the device's name, DefaultPort its UDP port (Cilium's).
const (
	DefaultDevice = "tendril_wg"
	DefaultPort   = 51871
)

// Overhead is what WireGuard adds to a packet, for an outer header of
// either family: outer IPv6 40 (IPv4's 20), UDP 8, the data message's
// header 16 and its authentication tag 16. The larger one because a
// node's peers may be reached over either family (a peer's endpoint is
// an address of its first pod CIDR's family): with IPv4's 60 a full-sized
// packet to a peer over IPv6 is 20 bytes too long for the link, and the
// device's datagrams are not fragmented (TestPrivilegedEncryptedIPv6 saw
// a TCP stream stall). Cilium reserves the same 80.
const Overhead = 80

// ServeSubcommand is the agent's hidden subcommand that runs Serve.
const ServeSubcommand = "wireguard-device"

// Serve runs the WireGuard device name: the kernel's where it has the
// module (CreateKernel; then it only waits for SIGTERM/SIGINT, the device
// needing no process), else the userspace device, in this process until
// the device is closed (over its UAPI socket) or SIGTERM/SIGINT: it
// creates the TUN device with mtu, brings it up, and answers the UAPI
// socket /var/run/wireguard/<name>.sock, which wgctrl (the agent) speaks.
// It is meant to run in a process of its own, detached from the agent's
// (Spawn): the device, its keys and peers outlive the agent, as the pinned
// datapath does, so pod traffic stays encrypted and flowing while the
// agent restarts.
//
// The TUN device is made persistent (TUNSETPERSIST): when this process
// dies (a container runtime kills every process of the agent's container
// when it restarts it) the link stays, with its ifindex and the routes
// to it, and the kernel drops what is routed to it while no process reads
// it, rather than the routes going with the link and the pods' packets
// following the underlay's routes in the clear. The next Serve of the same
// name attaches to that link (TUNSETIFF on an existing persistent device)
// with the configuration the last process saved (StatePath: key, port,
// peers), so traffic flows again before the agent has configured it.
// Deleting the link (Stop) still ends the process and the device.
func Serve(name string, mtu int, log *slog.Logger) error {
	if kernel, err := CreateKernel(name, mtu); err != nil {
		return err
	} else if kernel {
		// Nothing to serve: the kernel holds the device. Wait for the
		// end as a userspace device would (the device stays: deleting
		// the link is Stop's).
		log.Info("WireGuard device made in the kernel (no userspace device to run)", "device", name, "mtu", mtu)
		<-stopSignals()
		return nil
	}
	uapiFile, err := ipc.UAPIOpen(name)
	if err != nil {
		// Another process serves the device already (or the directory is
		// not writable): two would fight over one name.
		return fmt.Errorf("wireguard device %s: UAPI socket: %w", name, err)
	}
	tdev, err := tun.CreateTUN(name, mtu)
	if err != nil {
		uapiFile.Close()
		return fmt.Errorf("wireguard device %s: create TUN: %w", name, err)
	}
	if err := setPersist(tdev.File()); err != nil {
		uapiFile.Close()
		tdev.Close()
		return fmt.Errorf("wireguard device %s: %w", name, err)
	}
	dev := device.NewDevice(tdev, conn.NewDefaultBind(), &device.Logger{
		Verbosef: func(string, ...any) {},
		Errorf:   func(f string, a ...any) { log.Error(fmt.Sprintf(f, a...), "device", name) },
	})
	defer dev.Close()
	uapi, err := ipc.UAPIListen(name, uapiFile)
	if err != nil {
		return fmt.Errorf("wireguard device %s: UAPI listen: %w", name, err)
	}
	defer uapi.Close()
	if err := linkUp(name); err != nil {
		return err
	}
	st := &deviceState{path: StatePath(name), dev: dev, log: log}
	st.restore()
	go func() {
		for {
			c, err := uapi.Accept()
			if err != nil {
				return
			}
			go func() {
				dev.IpcHandle(c)
				st.save()
			}()
		}
	}()
	log.Info("WireGuard device serving", "device", name, "mtu", mtu, "pid", os.Getpid())
	select {
	case s := <-stopSignals():
		log.Info("WireGuard device stopping", "device", name, "signal", s.String())
	case <-dev.Wait():
		log.Info("WireGuard device closed", "device", name)
	}
	return nil
}

// StateDir is where the userspace devices keep their UAPI sockets and
// their saved configuration (golang.zx2c4.com/wireguard/ipc's directory).
const StateDir = "/var/run/wireguard"

// StatePath is where the device name's process saves its configuration:
// its private key, port, mark and peers, readable by root alone (the key
// is as secret as the agent's key file).
func StatePath(name string) string { return filepath.Join(StateDir, name+".conf") }

// deviceState saves a device's configuration after each UAPI exchange
// and restores it when a process starts on the same name: a device
// process that ends (its container restarted, the agent's pod replaced in
// an upgrade) comes back with its key and peers, and pod traffic between
// the nodes flows again before any agent has configured it; the agent's
// reconciler then finds nothing to change (Configure diffs). The agent
// still owns the configuration: what it sets is what is saved.
type deviceState struct {
	path string
	dev  *device.Device
	log  *slog.Logger

	mu   sync.Mutex
	last string
}

// settable reports whether a UAPI get key is one a set takes back (the
// counters and handshake times are the device's own).
func settable(key string) bool {
	switch key {
	case "private_key", "listen_port", "fwmark", "public_key", "preshared_key", "endpoint",
		"persistent_keepalive_interval", "allowed_ip", "protocol_version":
		return true
	}
	return false
}

func (s *deviceState) save() {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg, err := s.dev.IpcGet()
	if err != nil {
		s.log.Warn("Cannot read the WireGuard device's configuration to save it", "path", s.path, "error", err)
		return
	}
	var b strings.Builder
	for line := range strings.Lines(cfg) {
		if k, _, ok := strings.Cut(line, "="); ok && settable(k) {
			b.WriteString(line)
		}
	}
	if b.String() == s.last {
		return
	}
	if err := writeFileAtomic(s.path, []byte(b.String()), 0o600); err != nil {
		s.log.Warn("Cannot save the WireGuard device's configuration", "path", s.path, "error", err)
		return
	}
	s.last = b.String()
}

func (s *deviceState) restore() {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) || len(b) == 0 {
		return
	}
	if err != nil {
		s.log.Warn("Cannot read the WireGuard device's saved configuration", "path", s.path, "error", err)
		return
	}
	if err := s.dev.IpcSet(string(b)); err != nil {
		// The agent configures the device anyway: a start without the
		// saved state costs a gap, not correctness.
		s.log.Warn("Cannot restore the WireGuard device's saved configuration", "path", s.path, "error", err)
		return
	}
	s.last = string(b)
	s.log.Info("WireGuard device configuration restored", "path", s.path)
}

// writeFileAtomic writes data to path through a temporary file renamed
// over it, so a reader never sees half a configuration.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// stopSignals delivers SIGTERM or SIGINT: the end of a device process,
// whichever kind of device it keeps.
func stopSignals() <-chan os.Signal {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	return sigs
}

// setPersist marks the TUN device of f persistent. Through the raw
// connection: File.Fd would switch the descriptor to blocking mode under
// the device's poller.
func setPersist(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("TUN descriptor: %w", err)
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) { ioErr = unix.IoctlSetInt(int(fd), unix.TUNSETPERSIST, 1) }); err != nil {
		return fmt.Errorf("TUN descriptor: %w", err)
	}
	if ioErr != nil {
		return fmt.Errorf("TUNSETPERSIST: %w", ioErr)
	}
	return nil
}

func linkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("wireguard device %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("wireguard device %s: set up: %w", name, err)
	}
	return nil
}

// Running reports whether a WireGuard device name answers wgctrl (a kernel
// device, or a userspace one serving its UAPI socket) and its link is in
// this network namespace.
func Running(client *wgctrl.Client, name string) bool {
	if _, err := client.Device(name); err != nil {
		return false
	}
	_, err := netlink.LinkByName(name)
	return err == nil
}

// Spawn starts argv (the agent's own binary with ServeSubcommand, or any
// command that runs Serve) as a process of its own session, so that a
// signal to the agent's process group or the agent's death does not reach
// it, and waits until the device answers wgctrl. Its output goes to
// logPath. The process is not waited for: it outlives the caller.
func Spawn(ctx context.Context, client *wgctrl.Client, name string, argv []string, logPath string) (pid int, err error) {
	if len(argv) == 0 {
		return 0, errors.New("wireguard device: no command")
	}
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("wireguard device log: %w", err)
	}
	defer out.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start wireguard device %s: %w", name, err)
	}
	pid = cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if Running(client, name) {
			// Reap it if it ever exits while we live; it is not ours to
			// stop.
			return pid, nil
		}
		select {
		case err := <-exited:
			return 0, fmt.Errorf("wireguard device %s exited at start (%v): see %s", name, err, logPath)
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			return 0, fmt.Errorf("wireguard device %s: not ready: %w", name, ctx.Err())
		case <-tick.C:
		}
	}
}

// CreateKernel makes name a kernel WireGuard device (link kind
// "wireguard") with mtu and brings it up, where the kernel has the
// module: such a device has no process, outlives the agent by itself and
// is configured by the same wgctrl calls (generic netlink). It returns
// false, and no error, when the kernel has no WireGuard (EOPNOTSUPP: the
// link kind is unknown, as on this project's test machine) or the name is
// taken (a userspace device's persistent TUN link from an earlier run,
// which the userspace device attaches to): the caller runs the userspace
// implementation then. A kernel device of that name already there (an
// earlier run's) counts as made.
func CreateKernel(name string, mtu int) (bool, error) {
	err := netlink.LinkAdd(&netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu}})
	if errors.Is(err, unix.EEXIST) {
		// A kernel device from an earlier run is ours again; a TUN link
		// is the userspace device's.
		if l, lerr := netlink.LinkByName(name); lerr == nil && l.Type() == "wireguard" {
			err = nil
		}
	}
	switch {
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EEXIST):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("kernel wireguard device %s: %w", name, err)
	}
	if err := linkUp(name); err != nil {
		return true, err
	}
	return true, nil
}

// WaitRunning waits until the device name answers wgctrl and its link
// is in this network namespace (a device another process serves, such as
// the chart's wireguard-device container).
func WaitRunning(ctx context.Context, client *wgctrl.Client, name string) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !Running(client, name) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wireguard device %s: no process serves it: %w", name, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// SetMTU sets the device's link MTU when it differs (the userspace
// device follows its link's MTU changes).
func SetMTU(name string, mtu int) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("wireguard device %s: %w", name, err)
	}
	if l.Attrs().MTU == mtu {
		return nil
	}
	if err := netlink.LinkSetMTU(l, mtu); err != nil {
		return fmt.Errorf("wireguard device %s: set MTU %d: %w", name, mtu, err)
	}
	return nil
}

// Stop closes the device name: a userspace device's process ends when its
// UAPI socket's device is closed, which deleting the TUN link does.
func Stop(name string) error {
	// The saved configuration holds the private key: it goes with the
	// device, also when the link is gone already.
	if err := os.Remove(StatePath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("wireguard device %s: %w", name, err)
	}
	l, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("wireguard device %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete wireguard device %s: %w", name, err)
	}
	return nil
}
