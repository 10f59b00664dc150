package loader

import (
	"encoding/binary"
	"net/netip"
)

// Crafted packets for BPF_PROG_TEST_RUN: Ethernet + IPv4/IPv6 + L4, built
// by hand. The datapath checks no checksum; the IPv4 header's is right so
// that the direct delivery's TTL rewrite can be checked.

type l4 struct {
	proto        uint8
	sport, dport uint16
	tcpFlags     uint8
	icmpType     uint8
	icmpID       uint16
	payload      []byte
}

func ethernet(etherType uint16) []byte {
	b := make([]byte, 14)
	copy(b[0:6], []byte{0x02, 0, 0, 0, 0, 1})
	copy(b[6:12], []byte{0x02, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(b[12:], etherType)
	return b
}

func l4bytes(t l4) []byte {
	switch t.proto {
	case 6:
		h := make([]byte, 20)
		binary.BigEndian.PutUint16(h[0:], t.sport)
		binary.BigEndian.PutUint16(h[2:], t.dport)
		h[12] = 5 << 4
		h[13] = t.tcpFlags
		return append(h, t.payload...)
	case 17, 132:
		h := make([]byte, 8)
		binary.BigEndian.PutUint16(h[0:], t.sport)
		binary.BigEndian.PutUint16(h[2:], t.dport)
		binary.BigEndian.PutUint16(h[4:], uint16(8+len(t.payload)))
		return append(h, t.payload...)
	case 1, 58:
		h := make([]byte, 8)
		h[0] = t.icmpType
		binary.BigEndian.PutUint16(h[4:], t.icmpID)
		return append(h, t.payload...)
	}
	return t.payload
}

func ipv4Header(src, dst netip.Addr, proto uint8, payloadLen int) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+payloadLen))
	h[8] = 64
	h[9] = proto
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint16(h[10:], ipv4Checksum(h))
	return h
}

// ipv4Checksum is the header checksum of h (whose checksum field is
// counted as it is: zero when computing, the stored value when verifying,
// where a valid header sums to zero).
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func ipv6Header(src, dst netip.Addr, next uint8, payloadLen int) []byte {
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(payloadLen))
	h[6] = next
	h[7] = 64
	s, d := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return h
}

// packet builds a whole frame; the family follows the addresses.
func packet(src, dst netip.Addr, t l4) []byte {
	body := l4bytes(t)
	if src.Is4() {
		p := append(ethernet(0x0800), ipv4Header(src, dst, t.proto, len(body))...)
		return pad(append(p, body...))
	}
	p := append(ethernet(0x86DD), ipv6Header(src, dst, t.proto, len(body))...)
	return pad(append(p, body...))
}

// pad keeps frames at the Ethernet minimum, as the kernel's test run wants
// at least 14 bytes and real frames have 60.
func pad(b []byte) []byte {
	for len(b) < 60 {
		b = append(b, 0)
	}
	return b
}

// icmpError builds an ICMP(v6) error from src to dst quoting inner.
func icmpError(src, dst netip.Addr, inner []byte) []byte {
	quoted := inner[14:] // the IP packet the error is about
	if len(quoted) > 48 {
		quoted = quoted[:48]
	}
	typ, proto := uint8(3), uint8(1) // destination unreachable
	if src.Is6() {
		typ, proto = 1, 58
	}
	return packet(src, dst, l4{proto: proto, icmpType: typ, payload: quoted})
}
