package lab

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBundleSpec reads what the lab needs of a CRI container's OCI
// bundle: the sandbox's network namespace as a /proc path and the source
// of its resolv.conf; a host-network container, a namespace of its own, a
// path only the node's mount namespace has and a missing bundle are
// errors that say so.
func TestBundleSpec(t *testing.T) {
	dir := t.TempDir()
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	b, err := readBundleSpec(write("pod.json", `{"mounts":[{"destination":"/etc/hosts","source":"/h"},{"destination":"/etc/resolv.conf","source":"/r/resolv.conf"}],
		"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/proc/4382/ns/net"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := b.netnsPath(); err != nil || p != "/proc/4382/ns/net" {
		t.Errorf("netns %q, %v", p, err)
	}
	if got := b.mountSource("/etc/resolv.conf"); got != "/r/resolv.conf" {
		t.Errorf("resolv.conf source %q", got)
	}
	for name, tc := range map[string]struct{ doc, want string }{
		"host network": {`{"linux":{"namespaces":[{"type":"pid"}]}}`, "host network"},
		"own netns":    {`{"linux":{"namespaces":[{"type":"network"}]}}`, "of its own"},
		"node path":    {`{"linux":{"namespaces":[{"type":"network","path":"/var/run/netns/cni-1"}]}}`, "/proc/<pid>/ns/net"},
	} {
		b, err := readBundleSpec(write(strings.ReplaceAll(name, " ", "-")+".json", tc.doc))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.netnsPath(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", name, err, tc.want)
		}
	}
	if _, err := readBundleSpec(filepath.Join(dir, "missing.json")); !errors.Is(err, ErrNoPod) {
		t.Errorf("missing bundle: %v, want ErrNoPod", err)
	}
	if _, err := readBundleSpec(write("bad.json", `{"linux":`)); err == nil {
		t.Error("a truncated bundle was read")
	}
}
