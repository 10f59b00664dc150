package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedCorefileAnswersWorldName runs the lab's CoreDNS binary
// with the lab's Corefile, as rendered, in a network namespace of its own
// (the Corefile's ports are fixed): WorldName is answered with the world
// server's address and WorldNameTTL, over UDP and TCP; another name of
// WorldZone gets no address (SERVFAIL: the hosts plugin has no SOA to
// answer NXDOMAIN with). The kubernetes plugin's API server is
// unreachable here: CoreDNS serves once its wait for it ends.
func TestPrivilegedCorefileAnswersWorldName(t *testing.T) {
	testutil.Privileged(t)
	bin := CoreDNSBinary()
	_, err := os.Stat(bin)
	testutil.Require(t, err == nil, fmt.Sprintf("no CoreDNS binary (hack/coredns.sh builds it): %v", err))

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(conf, []byte(Corefile(kubeconfig)), 0o644); err != nil {
		t.Fatal(err)
	}

	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("tdrcoredns%d", os.Getpid())
	ns, err := netns.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = netns.Set(orig)
		ns.Close()
		orig.Close()
		_ = netns.DeleteNamed(name)
		runtime.UnlockOSThread()
	})
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+name, bin, "-conf", conf)
	cmd.Dir = dir
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("CoreDNS:\n%s", out.String())
		}
	})

	// Queried from this thread, inside the namespace.
	ask := func(netw, name string) (*dns.Msg, error) {
		c := &dns.Client{Net: netw, Timeout: 2 * time.Second}
		m, _, err := c.Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), "127.0.0.1:53")
		return m, err
	}
	var m *dns.Msg
	deadline := time.Now().Add(60 * time.Second)
	for {
		m, err = ask("udp", WorldName+".")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CoreDNS never answered %s: %v", WorldName, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, netw := range []string{"udp", "tcp"} {
		if netw == "tcp" {
			if m, err = ask("tcp", WorldName+"."); err != nil {
				t.Fatal(err)
			}
		}
		if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
			t.Fatalf("%s over %s: %v", WorldName, netw, m)
		}
		a, ok := m.Answer[0].(*dns.A)
		if !ok || a.A.String() != WorldServerIP || a.Hdr.Ttl != WorldNameTTL {
			t.Fatalf("%s over %s: %v, want A %s TTL %d", WorldName, netw, m.Answer[0], WorldServerIP, WorldNameTTL)
		}
	}
	if m, err := ask("udp", "nothing."+WorldZone+"."); err != nil || m.Rcode != dns.RcodeServerFailure || len(m.Answer) != 0 {
		t.Fatalf("nothing.%s: %v %v, want SERVFAIL", WorldZone, m, err)
	}
}
