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

// Overhead is what WireGuard adds to an IPv4 packet: outer IPv4 20, UDP
// 8, the data message's header 16 and its authentication tag 16.
const Overhead = 60

// ServeSubcommand is the agent's hidden subcommand that runs Serve.
const ServeSubcommand = "wireguard-device"

// Serve runs the userspace WireGuard device name in this process until
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
// with a new key-less device the agent configures again. Deleting the link
// (Stop) still ends the process and the device.
func Serve(name string, mtu int, log *slog.Logger) error {
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
	go func() {
		for {
			c, err := uapi.Accept()
			if err != nil {
				return
			}
			go dev.IpcHandle(c)
		}
	}()
	log.Info("WireGuard device serving", "device", name, "mtu", mtu, "pid", os.Getpid())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sigs:
		log.Info("WireGuard device stopping", "device", name, "signal", s.String())
	case <-dev.Wait():
		log.Info("WireGuard device closed", "device", name)
	}
	return nil
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
