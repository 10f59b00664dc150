package wgkey

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state", KeyFile)
	k1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", st.Mode().Perm())
	}
	k2, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if k1 != k2 {
		t.Fatal("the key changed across a restart")
	}
	k3, err := RotateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if k3 == k1 {
		t.Fatal("rotation kept the key")
	}
	if k4, _ := LoadOrCreateKey(path); k4 != k3 {
		t.Fatal("the rotated key was not kept")
	}
	// Readable by others: refused, not replaced.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); err == nil {
		t.Fatal("a key file readable by others was accepted")
	}
	// Damaged: refused, not replaced.
	if err := os.WriteFile(path, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); err == nil {
		t.Fatal("a damaged key file was accepted")
	}
	if b, _ := os.ReadFile(path); string(b) != "garbage\n" {
		t.Fatal("a damaged key file was overwritten")
	}
}

func TestParsePublicKey(t *testing.T) {
	priv, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	good := priv.PublicKey().String()
	if k, err := ParsePublicKey(good); err != nil || k != priv.PublicKey() {
		t.Fatalf("ParsePublicKey(%q) = %v, %v", good, k, err)
	}
	// The last base64 character of a 32-byte key carries 2 padding bits:
	// another spelling of the same bytes.
	alt := []byte(good)
	if alt[42] == 'A' {
		alt[42] = 'B'
	} else {
		alt[42] = 'A'
	}
	for name, s := range map[string]string{
		"empty":        "",
		"not base64":   "!!!!" + good[4:],
		"short":        good[:40],
		"31 bytes":     "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==",
		"zero key":     "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
		"url alphabet": "_-" + good[2:],
		"space":        " " + good,
		"non-canonical": func() string {
			b, _ := ParsePublicKey(good)
			s := b.String()
			// flip a padding bit: decodes leniently to the same bytes
			r := []byte(s)
			const al = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
			i := bytes.IndexByte([]byte(al), r[42])
			r[42] = al[i^1]
			return string(r)
		}(),
	} {
		if _, err := ParsePublicKey(s); err == nil {
			t.Errorf("%s: %q accepted", name, s)
		}
	}
}
