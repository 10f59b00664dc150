package sockterm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/datapath/socklb"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// The sockets under test live in a child process of the test, started
// into a child cgroup (where the socket load-balancer is attached) and a
// network namespace of its own with only loopback up: the sweep must find
// that namespace through the cgroup, as the agent finds its pods'. The
// child talks over stdin/stdout: it connects its sockets, reports "ready",
// waits for "go" (the parent removes the backend and sweeps meanwhile),
// then reports what its sockets see.

const helperEnv = "TENDRIL_SOCKTERM_HELPER"

const cgroupRoot = "/sys/fs/cgroup/unified"

// addrSet is one family's frontends and backends (on the child's
// loopback).
type addrSet struct {
	udpFrontend, tcpFrontend, backend1, backend2 netip.AddrPort
}

// families are the address sets by the helper's family ("4" or "6").
var families = map[string]addrSet{
	"4": {netip.MustParseAddrPort("10.96.0.53:53"), netip.MustParseAddrPort("10.96.0.80:80"),
		netip.MustParseAddrPort("127.0.0.1:9001"), netip.MustParseAddrPort("127.0.0.1:9002")},
	"6": {netip.MustParseAddrPort("[fd00:96::53]:53"), netip.MustParseAddrPort("[fd00:96::80]:80"),
		netip.MustParseAddrPort("[::1]:9001"), netip.MustParseAddrPort("[::1]:9002")},
}

// ready is what the child's sockets saw before the sweep.
type ready struct {
	UDP, Direct, TCP string
	Err              string
}

// after is what they see after it.
type after struct {
	// UDPRecvErrno is the connected UDP socket's pending error (read
	// without waiting); UDPReconnect the reply after connecting it to the
	// frontend again.
	UDPRecvErrno int
	UDPReconnect string
	// Direct is the reply on the socket connected to backend 1's own
	// address (no translation: must be left alone).
	Direct string
	// TCPReadErrno is the client's error reading its connection;
	// ServerErr what the backend's side of it saw.
	TCPReadErrno int
	ServerErr    string
	Err          string
}

func TestMain(m *testing.M) {
	if fam := os.Getenv(helperEnv); fam != "" {
		if err := helper(families[fam]); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}

// udpConnect returns a UDP socket connected to dst with a receive timeout.
func udpConnect(dst netip.AddrPort) (int, error) {
	family := unix.AF_INET
	if dst.Addr().Is6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	tv := unix.Timeval{Sec: 2}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := unix.Connect(fd, sockaddr(dst)); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func udpPing(fd int) (string, error) {
	if _, err := unix.Write(fd, []byte("ping")); err != nil {
		return "", fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 64)
	n, err := testutil.RetryEINTR(func() (int, error) { return unix.Read(fd, buf) })
	if err != nil {
		return "", fmt.Errorf("receive: %w", err)
	}
	return string(buf[:n]), nil
}

func errnoOf(err error) int {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return int(errno)
	}
	return -1
}

func helper(set addrSet) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	var serverMu sync.Mutex
	serverErr := make(chan string, 4)
	for _, b := range []struct {
		addr netip.AddrPort
		name string
	}{{set.backend1, "b1"}, {set.backend2, "b2"}} {
		pc, err := net.ListenPacket("udp", b.addr.String())
		if err != nil {
			return err
		}
		go func(name string) {
			buf := make([]byte, 64)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo([]byte(name), from)
			}
		}(b.name)
		ln, err := net.Listen("tcp", b.addr.String())
		if err != nil {
			return err
		}
		// Each connection answers every message with the server's name
		// and reports how it ended.
		go func(name string) {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					buf := make([]byte, 64)
					for {
						if _, err := c.Read(buf); err != nil {
							serverMu.Lock()
							serverErr <- err.Error()
							serverMu.Unlock()
							return
						}
						_, _ = c.Write([]byte(name))
					}
				}()
			}
		}(b.name)
	}
	out := json.NewEncoder(os.Stdout)
	var r ready
	udpFd, err := udpConnect(set.udpFrontend)
	if err == nil {
		r.UDP, err = udpPing(udpFd)
	}
	directFd, err2 := udpConnect(set.backend1)
	if err2 == nil {
		r.Direct, err2 = udpPing(directFd)
	}
	tcp, err3 := net.Dial("tcp", set.tcpFrontend.String())
	if err3 == nil {
		_, err3 = tcp.Write([]byte("ping"))
		buf := make([]byte, 64)
		var n int
		if err3 == nil {
			n, err3 = tcp.Read(buf)
		}
		r.TCP = string(buf[:n])
	}
	if err := errors.Join(err, err2, err3); err != nil {
		r.Err = err.Error()
		return out.Encode(r)
	}
	if err := out.Encode(r); err != nil {
		return err
	}
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "go" {
		return fmt.Errorf("waiting for go: %q %v", line, err)
	}

	var a after
	buf := make([]byte, 64)
	_, _, rerr := unix.Recvfrom(udpFd, buf, unix.MSG_DONTWAIT)
	a.UDPRecvErrno = errnoOf(rerr)
	// The application's answer to the error: connect again.
	var errs []error
	if err := unix.Connect(udpFd, sockaddr(set.udpFrontend)); err != nil {
		errs = append(errs, fmt.Errorf("reconnect: %w", err))
	} else if a.UDPReconnect, err = udpPing(udpFd); err != nil {
		errs = append(errs, fmt.Errorf("after reconnect: %w", err))
	}
	if a.Direct, err = udpPing(directFd); err != nil {
		errs = append(errs, fmt.Errorf("direct: %w", err))
	}
	_ = tcp.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, terr := tcp.Read(buf)
	a.TCPReadErrno = errnoOf(terr)
	select {
	case a.ServerErr = <-serverErr:
	case <-time.After(5 * time.Second):
		a.ServerErr = "the backend's connection did not end"
	}
	if err := errors.Join(errs...); err != nil {
		a.Err = err.Error()
	}
	return out.Encode(a)
}

type testEnv struct {
	cgroup string
	lb     *maps.LBMaps
	term   *Terminator
}

func setup(t *testing.T) *testEnv {
	t.Helper()
	testutil.Privileged(t)
	if _, err := bpffs.EnsureMounted(); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	testutil.Require(t, unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC, cgroupRoot+" is not a cgroup v2 mount")
	root, err := os.MkdirTemp("/sys/fs/bpf", "tendril-sockterm-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	cg, err := os.MkdirTemp(cgroupRoot, "tendril-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cg); err != nil {
			t.Errorf("remove test cgroup %s: %v", cg, err)
		}
	})
	var lxc bpf.LxcObjects
	if err := bpf.LoadLxcObjects(&lxc, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: root}}); err != nil {
		t.Fatalf("load pod programs: %v", err)
	}
	t.Cleanup(func() { lxc.Close() })
	sock := socklb.New(socklb.Config{BPFRoot: root, CgroupPath: cg}, nil)
	if err := sock.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sock.Detach(); err != nil {
			t.Error(err)
		}
		sock.Close()
	})
	term := New(Config{BPFRoot: root, CgroupPath: cg}, nil)
	if err := term.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { term.Close() })
	return &testEnv{cgroup: cg, lb: maps.LBFromObjects(&lxc.LxcMaps), term: term}
}

// point makes frontend fe (service and reverse NAT ID id) send to the one
// backend b (backend ID bid).
func (e *testEnv) point(t *testing.T, fe netip.AddrPort, proto uint8, id uint32, bid uint32, b netip.AddrPort) {
	t.Helper()
	if err := e.lb.BackendMap().Upsert(bid, maps.Backend{Addr: b.Addr(), Port: b.Port()}); err != nil {
		t.Fatal(err)
	}
	f := maps.Frontend{Addr: fe.Addr(), Port: fe.Port(), Proto: proto}
	if err := e.lb.ApplyService(f, maps.Service{ID: id, RevNATID: id}, []uint32{bid}, 1); err != nil {
		t.Fatal(err)
	}
}

// TestPrivilegedTerminateRemovedBackend, IPv4 and IPv6: a connected UDP socket and a TCP
// connection that the socket load-balancer sent to backend 1 are destroyed
// once backend 1 leaves their services: the UDP socket reports
// ECONNABORTED and, connected again to the same frontend, reaches backend
// 2; the TCP client gets ECONNABORTED and the backend a reset. A sweep for
// another frontend's reverse NAT ID touches nothing, and a socket
// connected to backend 1's own address is never touched.
func TestPrivilegedTerminateRemovedBackend(t *testing.T) {
	for _, fam := range []string{"4", "6"} {
		t.Run("IPv"+fam, func(t *testing.T) { testTerminate(t, fam) })
	}
}

func testTerminate(t *testing.T, fam string) {
	a := families[fam]
	e := setup(t)
	const udpID, tcpID = 1, 2
	e.point(t, a.udpFrontend, maps.ProtoUDP, udpID, 1, a.backend1)
	e.point(t, a.tcpFrontend, maps.ProtoTCP, tcpID, 1, a.backend1)

	cg, err := os.Open(e.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+fam)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child exits on its own once it reported (or when its stdin
	// closes); a wedged one is killed so the cgroup can go.
	timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
		timer.Stop()
	}()
	dec := json.NewDecoder(stdout)
	var r ready
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("child's ready report: %v; stderr: %s", err, stderr.String())
	}
	if r.Err != "" || r.UDP != "b1" || r.TCP != "b1" || r.Direct != "b1" {
		t.Fatalf("before the removal every socket should reach b1: %+v", r)
	}

	// Another frontend's backend 1: nothing of these sockets matches.
	res, err := e.term.Terminate([]Target{{Backend: a.backend1, Proto: maps.ProtoUDP, RevNATID: 99}, {Backend: a.backend1, Proto: maps.ProtoTCP, RevNATID: 99}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Destroyed != 0 || res.Failed != 0 {
		t.Fatalf("a sweep for another frontend destroyed sockets: %+v", res)
	}
	if res.Namespaces < 2 {
		t.Fatalf("the sweep should have entered the child's namespace besides its own: %+v", res)
	}

	// Backend 1 leaves both services (backend 2 replaces it), then the
	// sweep the reconciler requests.
	e.point(t, a.udpFrontend, maps.ProtoUDP, udpID, 2, a.backend2)
	e.point(t, a.tcpFrontend, maps.ProtoTCP, tcpID, 2, a.backend2)
	// As the agent does it: requests to the job that sweeps.
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- e.term.Run(ctx) }()
	e.term.Request(Target{Backend: a.backend1, Proto: maps.ProtoUDP, RevNATID: udpID})
	e.term.Request(Target{Backend: a.backend1, Proto: maps.ProtoTCP, RevNATID: tcpID})
	deadline := time.Now().Add(10 * time.Second)
	for {
		tot, _ := e.term.Totals()
		if tot.Destroyed+tot.Failed >= 2 {
			if tot.Destroyed != 2 || tot.Failed != 0 {
				t.Fatalf("want the UDP socket and the TCP connection destroyed, got %+v", tot)
			}
			break
		}
		if time.Now().After(deadline) {
			_, sweeps := e.term.Totals()
			t.Fatalf("the requested sweeps did not destroy both sockets: %+v after %d sweeps", tot, sweeps)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	var got after
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("child's report: %v; stderr: %s", err, stderr.String())
	}
	t.Logf("after the sweep: %+v", got)
	if got.Err != "" {
		t.Fatal(got.Err)
	}
	if got.UDPRecvErrno != int(unix.ECONNABORTED) {
		t.Errorf("connected UDP socket: errno %d, want ECONNABORTED", got.UDPRecvErrno)
	}
	if got.UDPReconnect != "b2" {
		t.Errorf("reconnected UDP socket reached %q, want b2", got.UDPReconnect)
	}
	if got.Direct != "b1" {
		t.Errorf("socket connected to backend 1's own address got %q, want b1 (untouched)", got.Direct)
	}
	if got.TCPReadErrno != int(unix.ECONNABORTED) {
		t.Errorf("TCP client: errno %d, want ECONNABORTED", got.TCPReadErrno)
	}
	if !strings.Contains(got.ServerErr, "connection reset") {
		t.Errorf("backend's side of the TCP connection: %q, want a reset", got.ServerErr)
	}
}
