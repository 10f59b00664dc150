package kvalloc

import (
	"strconv"
	"testing"
)

// FuzzParseID: an identity value key of any content (every node writes
// them) is a cluster identity that prints back as it was read, or an
// error.
func FuzzParseID(f *testing.F) {
	for _, s := range []string{"256", "65535", "0", "1", "-5", "99999999999", "0x100", " 300", "300\n", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := parseID(b)
		if err != nil {
			return
		}
		if !id.IsCluster() {
			t.Fatalf("%q parsed as %d, not a cluster identity", b, id)
		}
		if n, _ := strconv.ParseUint(string(b), 10, 32); uint64(id) != n {
			t.Fatalf("%q parsed as %d", b, id)
		}
	})
}
