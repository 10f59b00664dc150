package l7redirect

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cmsg is one control message as the kernel lays it out (native byte
// order header, data padded to the alignment).
func cmsg(level, typ int32, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

// origDst reads the original destination of an IPv4 datagram
// (IP_ORIGDSTADDR, a sockaddr_in) and of an IPv6 one (IPV6_ORIGDSTADDR, a
// sockaddr_in6), whichever control message comes, and nothing else.
func TestOrigDst(t *testing.T) {
	in4 := make([]byte, unix.SizeofSockaddrInet4)
	binary.NativeEndian.PutUint16(in4[0:], unix.AF_INET)
	binary.BigEndian.PutUint16(in4[2:], 53)
	copy(in4[4:], []byte{10, 77, 0, 11})
	in6 := make([]byte, unix.SizeofSockaddrInet6)
	binary.NativeEndian.PutUint16(in6[0:], unix.AF_INET6)
	binary.BigEndian.PutUint16(in6[2:], 5353)
	a6 := netip.MustParseAddr("fd00:77::11").As16()
	copy(in6[8:], a6[:])
	other := cmsg(unix.SOL_IP, unix.IP_TTL, []byte{64, 0, 0, 0})
	for _, c := range []struct {
		name string
		oob  []byte
		want string
	}{
		{"IPv4", cmsg(unix.SOL_IP, unix.IP_ORIGDSTADDR, in4), "10.77.0.11:53"},
		{"IPv6", cmsg(unix.SOL_IPV6, unix.IPV6_ORIGDSTADDR, in6), "[fd00:77::11]:5353"},
		{"IPv6 after another message", append(append([]byte{}, other...), cmsg(unix.SOL_IPV6, unix.IPV6_ORIGDSTADDR, in6)...), "[fd00:77::11]:5353"},
		{"none", other, ""},
		{"IPv6 cut short", cmsg(unix.SOL_IPV6, unix.IPV6_ORIGDSTADDR, in6[:20]), ""},
	} {
		got, ok := origDst(c.oob)
		if c.want == "" {
			if ok {
				t.Errorf("%s: %s, want none", c.name, got)
			}
			continue
		}
		if !ok || got.String() != c.want {
			t.Errorf("%s: %s (%v), want %s", c.name, got, ok, c.want)
		}
	}
}
