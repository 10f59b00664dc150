package testutil

import (
	"encoding/binary"
	"net/netip"
)

// IPv4Header is a 20-byte IPv4 header from src to dst of proto with
// l4len bytes after it and the given TTL, its checksum set: what the
// packet-level tests put after an Ethernet header.
func IPv4Header(src, dst netip.Addr, proto, ttl uint8, l4len int) []byte {
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+l4len))
	ip[8], ip[9] = ttl, proto
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	return ip
}
