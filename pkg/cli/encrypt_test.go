package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/api/v1/ext"
)

func TestEncryptStatus(t *testing.T) {
	st := &ext.StatusResponse{Tendril: &ext.Status{Sections: []ext.Section{
		{Title: "Kubernetes"},
		{Title: "Encryption", Lines: []ext.Line{{Key: "Device", Value: "tendril_wg, UDP port 51871"},
			{Key: "node2", Value: "endpoint 172.30.0.12:51871, last handshake 3s ago"}}},
	}}}
	sec, on := encryptionOf(st)
	if !on || len(sec.Lines) != 2 {
		t.Fatalf("section %+v %v", sec, on)
	}
	var b bytes.Buffer
	printEncryption(&b, sec, on)
	if !strings.Contains(b.String(), "node2:") || !strings.Contains(b.String(), "172.30.0.12:51871") {
		t.Fatalf("printed %q", b.String())
	}
	st.Tendril.Sections = st.Tendril.Sections[:1]
	sec, on = encryptionOf(st)
	b.Reset()
	printEncryption(&b, sec, on)
	if on || !strings.Contains(b.String(), "off") {
		t.Fatalf("without the section: %v %q", on, b.String())
	}
}
