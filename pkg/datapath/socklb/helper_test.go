package socklb

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// The sockets under test live in a child process of the test: started
// straight into a child cgroup (clone3 with CLONE_INTO_CGROUP) and into a
// network namespace of its own with only loopback up, so the hooks see
// only its sockets, and a packet that the hooks failed to translate has
// nowhere to go (no route) instead of reaching the machine's network.
// The child runs the backends' servers on loopback and the clients, and
// reports what its sockets saw as JSON. TestMain runs the child's part when
// the test binary is started with helperEnv set.

const helperEnv = "TENDRIL_SOCKLB_HELPER"

// helperRequest is what the child does: start servers (each answers with
// its name: TCP on accept, UDP to every datagram), then run the probes.
type helperRequest struct {
	TCPServers []helperServer `json:"tcp_servers"`
	UDPServers []helperServer `json:"udp_servers"`
	Probes     []helperProbe  `json:"probes"`
	// LoAddrs are addresses put on loopback first (an address a probe
	// reaches untranslated).
	LoAddrs []string `json:"lo_addrs,omitempty"`
}

type helperServer struct {
	Addr string `json:"addr"`
	Name string `json:"name"`
}

// helperProbe: Kind "tcp" connects and reads the server's name; "udp"
// connects a UDP socket, sends, and receives with recvfrom; "udp-unconnected"
// sends with sendto and receives with recvfrom. Each is repeated Count times
// (on a new socket each time).
type helperProbe struct {
	Kind  string `json:"kind"`
	Dst   string `json:"dst"`
	Count int    `json:"count"`
	// Spread > 0: each repetition goes to Dst's address plus a random
	// offset below Spread (IPv4); Floor, when set, is probed right after
	// each repetition too (results alternate).
	Spread int    `json:"spread,omitempty"`
	Floor  string `json:"floor,omitempty"`
}

// helperResult is what one socket saw.
type helperResult struct {
	Errno  int    `json:"errno,omitempty"`
	Err    string `json:"err,omitempty"`
	Cookie uint64 `json:"cookie"`
	// Peer is getpeername's answer (connected sockets).
	Peer string `json:"peer,omitempty"`
	// From is the source recvfrom reported (UDP).
	From string `json:"from,omitempty"`
	// Reply is the name of the server that answered.
	Reply string `json:"reply,omitempty"`
	// ConnectNanos is how long connect took (kind "tcp-connect").
	ConnectNanos int64 `json:"connect_ns,omitempty"`
}

func TestMain(m *testing.M) {
	if req := os.Getenv(helperEnv); req != "" {
		os.Exit(helperMain(req))
	}
	os.Exit(m.Run())
}

func helperMain(reqJSON string) int {
	var req helperRequest
	if err := json.Unmarshal([]byte(reqJSON), &req); err != nil {
		fmt.Fprintln(os.Stderr, "helper request:", err)
		return 2
	}
	if err := helper(req, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	return 0
}

func helper(req helperRequest, out io.Writer) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	for _, a := range req.LoAddrs {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("address %s: %w", a, err)
		}
		// A namespace the helper ran in before has it already.
		if err := netlink.AddrAdd(lo, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add %s to lo: %w", a, err)
		}
	}
	for _, s := range req.TCPServers {
		ln, err := net.Listen("tcp", s.Addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", s.Addr, err)
		}
		go func(name string) {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = c.Write([]byte(name))
				c.Close()
			}
		}(s.Name)
	}
	for _, s := range req.UDPServers {
		pc, err := net.ListenPacket("udp", s.Addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", s.Addr, err)
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
		}(s.Name)
	}
	results := make([][]helperResult, len(req.Probes))
	for i, p := range req.Probes {
		dst, err := netip.ParseAddrPort(p.Dst)
		if err != nil {
			return err
		}
		rng := rand.New(rand.NewPCG(uint64(p.Spread), 7))
		for n := 0; n < max(p.Count, 1); n++ {
			d := dst
			if p.Spread > 0 {
				a := dst.Addr().As4()
				v := binary.BigEndian.Uint32(a[:]) + uint32(rng.IntN(p.Spread))
				binary.BigEndian.PutUint32(a[:], v)
				d = netip.AddrPortFrom(netip.AddrFrom4(a), dst.Port())
			}
			results[i] = append(results[i], probe(p.Kind, d))
			if p.Floor != "" {
				results[i] = append(results[i], probe(p.Kind, netip.MustParseAddrPort(p.Floor)))
			}
		}
	}
	return json.NewEncoder(out).Encode(results)
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}

func addrPort(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	}
	return fmt.Sprintf("%v", sa)
}

// probe runs one socket with raw system calls, so that exactly the calls
// the hooks translate are made (connect, sendto, recvfrom, getpeername).
func probe(kind string, dst netip.AddrPort) (r helperResult) {
	fail := func(what string, err error) helperResult {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			r.Errno = int(errno)
		}
		r.Err = fmt.Sprintf("%s: %v", what, err)
		return r
	}
	family := unix.AF_INET
	if dst.Addr().Is6() {
		family = unix.AF_INET6
	}
	typ := unix.SOCK_STREAM
	if kind != "tcp" && kind != "tcp-connect" {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail("socket", err)
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 2}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if r.Cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
		return fail("SO_COOKIE", err)
	}
	if kind == "tcp-connect" {
		// Only the connect, timed; closed with a reset (no TIME_WAIT).
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		sa := sockaddr(dst)
		t0 := time.Now()
		if err := unix.Connect(fd, sa); err != nil {
			return fail("connect", err)
		}
		r.ConnectNanos = time.Since(t0).Nanoseconds()
		return r
	}
	if kind != "udp-unconnected" {
		if err := unix.Connect(fd, sockaddr(dst)); err != nil {
			return fail("connect", err)
		}
		sa, err := unix.Getpeername(fd)
		if err != nil {
			return fail("getpeername", err)
		}
		r.Peer = addrPort(sa)
	}
	buf := make([]byte, 64)
	switch kind {
	case "tcp":
		n, err := testutil.RetryEINTR(func() (int, error) { return unix.Read(fd, buf) })
		if err != nil {
			return fail("read", err)
		}
		r.Reply = string(buf[:n])
		return r
	case "udp":
		if _, err := unix.Write(fd, []byte("ping")); err != nil {
			return fail("send", err)
		}
	case "udp-unconnected":
		if err := unix.Sendto(fd, []byte("ping"), 0, sockaddr(dst)); err != nil {
			return fail("sendto", err)
		}
	default:
		return fail("probe", fmt.Errorf("unknown kind %q", kind))
	}
	var from unix.Sockaddr
	n, err := testutil.RetryEINTR(func() (int, error) {
		n, sa, err := unix.Recvfrom(fd, buf, 0)
		from = sa
		return n, err
	})
	if err != nil {
		return fail("recvfrom", err)
	}
	r.Reply = string(buf[:n])
	r.From = addrPort(from)
	return r
}

// runHelper runs req in a child process placed into cgroup (a cgroup v2
// directory) and a new network namespace, and returns its results.
func runHelper(t testing.TB, cgroup string, req helperRequest) [][]helperResult {
	t.Helper()
	return runHelperIn(t, cgroup, "", req)
}

// runHelperIn is runHelper in the network namespace at netnsPath (entered
// with nsenter, a namespace the test made and knows the cookie of) instead
// of a new one; "": a new one.
func runHelperIn(t testing.TB, cgroup, netnsPath string, req helperRequest) [][]helperResult {
	t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWNET,
		UseCgroupFD: true,
		CgroupFD:    int(cg.Fd()),
	}
	if netnsPath != "" {
		// nsenter starts in the cgroup and executes the helper there.
		cmd = exec.Command("nsenter", "--net="+netnsPath, os.Args[0], "-test.run=^$")
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	}
	cmd.Env = append(os.Environ(), helperEnv+"="+string(b))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	done := make(chan struct{})
	var stdout []byte
	go func() {
		defer close(done)
		stdout, err = cmd.Output()
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("helper timed out; stderr: %s", stderr.String())
	}
	if err != nil {
		t.Fatalf("helper: %v; stderr: %s", err, stderr.String())
	}
	var res [][]helperResult
	if err := json.Unmarshal(stdout, &res); err != nil {
		t.Fatalf("helper output %q: %v", stdout, err)
	}
	return res
}
