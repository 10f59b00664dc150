// Package wgkey is a node's WireGuard keys (docs/encryption.md): its
// private key, kept in the agent's state directory, and the check of the
// public keys other nodes publish. It is apart from the device's package
// so that the readers of TendrilNodes check keys without linking the
// device.
package wgkey

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// KeyFile is the private key's file name in the agent's state directory.
const KeyFile = "wireguard.key"

// LoadOrCreateKey reads the node's private key from path, or generates
// one and writes it there (mode 0600) when there is none: the key, and so
// the public key the other nodes know this node by, outlives restarts. A
// file that is readable by others, or does not hold a key, is an error,
// not a reason to make a new key: a key another user could read is no
// longer private, and silently replacing a damaged one would cut the node
// off from its peers until they learn the new one.
func LoadOrCreateKey(path string) (wgtypes.Key, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return createKey(path)
	}
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("read wireguard key: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("stat wireguard key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return wgtypes.Key{}, fmt.Errorf("wireguard key %s: mode %v lets others read it (want 0600)", path, st.Mode().Perm())
	}
	k, err := wgtypes.ParseKey(string(bytes.TrimSpace(b)))
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard key %s: %w", path, err)
	}
	return k, nil
}

// RotateKey replaces the key at path with a new one (written to a
// temporary file and renamed: a crash leaves the old key or the new).
func RotateKey(path string) (wgtypes.Key, error) { return createKey(path) }

func createKey(path string) (wgtypes.Key, error) {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("generate wireguard key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard key directory: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".wireguard-key-*")
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("write wireguard key: %w", err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file 0600; said again, as the guarantee.
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return wgtypes.Key{}, fmt.Errorf("write wireguard key: %w", err)
	}
	if _, err := tmp.WriteString(k.String() + "\n"); err != nil {
		tmp.Close()
		return wgtypes.Key{}, fmt.Errorf("write wireguard key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return wgtypes.Key{}, fmt.Errorf("write wireguard key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return wgtypes.Key{}, fmt.Errorf("write wireguard key: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return wgtypes.Key{}, fmt.Errorf("write wireguard key: %w", err)
	}
	return k, nil
}

// ParsePublicKey checks a public key another node published: standard
// base64 of exactly 32 bytes, in canonical form (the same key has one
// spelling, so two spellings cannot name one peer twice), and not the
// all-zero key (the point every small-order public key maps to: a
// handshake with it gives a shared secret an attacker knows).
func ParsePublicKey(s string) (wgtypes.Key, error) {
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard public key %q: not base64: %w", s, err)
	}
	if len(b) != wgtypes.KeyLen {
		return wgtypes.Key{}, fmt.Errorf("wireguard public key %q: %d bytes, want %d", s, len(b), wgtypes.KeyLen)
	}
	var k wgtypes.Key
	copy(k[:], b)
	if k == (wgtypes.Key{}) {
		return wgtypes.Key{}, fmt.Errorf("wireguard public key %q: the zero key", s)
	}
	if k.String() != s {
		return wgtypes.Key{}, fmt.Errorf("wireguard public key %q: not in canonical form", s)
	}
	return k, nil
}
