/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the packet parser: Ethernet (or no link-layer header
 * at all: parse_l3), IPv4, IPv6 with its extension headers, the L4 ports
 * or ICMP type, and the packet an ICMP error quotes. */
#ifndef TDR_PARSE_H
#define TDR_PARSE_H

#include "pkt.h"

/* parse_icmp_inner reads the packet an ICMP error quotes, at off. A
 * global function: inlined, the verifier walked it once for every state
 * the outer headers' parse reaches it with (each IPv6 extension chain
 * length, each ICMP type test), a fifth of parse's verified instructions;
 * called, it is checked once, and only ICMP errors pay the call. */
__attribute__((noinline)) int parse_icmp_inner(struct __sk_buff *skb, __u64 off, struct pkt *p)
{
	/* The verifier knows nothing of an argument's upper bits: off is a
	 * 64-bit value, bounded here before it is an offset. */
	if (!skb || !p || off > MAX_HDR_OFFSET)
		return REASON_MALFORMED;
	__u32 in = off;

	if (p->family == FAMILY_V4) {
		__u8 *ih = hdr(skb, p, in, 20);
		if (!ih)
			return REASON_TRUNCATED;
		__u8 ihl = ih[0] & 0xf;
		if ((ih[0] >> 4) != 4 || ihl < 5)
			return REASON_MALFORMED;
		p->in_proto = ih[9];
		__builtin_memcpy(p->in_saddr, &ih[12], 4);
		__builtin_memcpy(p->in_daddr, &ih[16], 4);
		in += (__u32)ihl * 4;
	} else {
		__u8 *ih = hdr(skb, p, in, 40);
		if (!ih)
			return REASON_TRUNCATED;
		if ((ih[0] >> 4) != 6)
			return REASON_MALFORMED;
		p->in_proto = ih[6];
		__builtin_memcpy(p->in_saddr, &ih[8], 16);
		__builtin_memcpy(p->in_daddr, &ih[24], 16);
		in += 40;
	}
	if (p->in_proto == IPPROTO_ICMP_ || p->in_proto == IPPROTO_ICMPV6_) {
		/* An error about an echo request: its tuple is (id, 0). */
		__u8 *ic = hdr(skb, p, in, 8);
		if (!ic)
			return REASON_TRUNCATED;
		p->in_sport = be16_at(&ic[4]);
		p->in_dport = 0;
		return REASON_FORWARDED;
	}
	__u8 *ports = hdr(skb, p, in, 4);
	if (!ports)
		return REASON_TRUNCATED;
	p->in_sport = be16_at(&ports[0]);
	p->in_dport = be16_at(&ports[2]);
	return REASON_FORWARDED;
}

/* parse_l4 reads ports (or ICMP type/id) at off. Returns a reason on error,
 * REASON_FORWARDED when fine. */
static __always_inline int parse_l4(struct __sk_buff *skb, __u32 off, struct pkt *p)
{
	if (p->nonfirst_frag)
		return REASON_FORWARDED;
	p->l4_off = off;
	switch (p->proto) {
	case IPPROTO_TCP_: {
		__u8 *h = hdr(skb, p, off, 20);
		if (!h)
			return REASON_TRUNCATED;
		p->sport = be16_at(&h[0]);
		p->dport = be16_at(&h[2]);
		p->tcp_flags = h[13];
		p->pport = p->dport;
		if ((h[12] >> 4) < 5)
			return REASON_MALFORMED;
		return REASON_FORWARDED;
	}
	case IPPROTO_UDP_:
	case IPPROTO_SCTP_: {
		__u8 *h = hdr(skb, p, off, 8);
		if (!h)
			return REASON_TRUNCATED;
		p->sport = be16_at(&h[0]);
		p->dport = be16_at(&h[2]);
		p->pport = p->dport;
		return REASON_FORWARDED;
	}
	case IPPROTO_ICMP_:
	case IPPROTO_ICMPV6_: {
		__u8 *h = hdr(skb, p, off, 8);
		if (!h)
			return REASON_TRUNCATED;
		__u8 type = h[0];
		__be16 id = be16_at(&h[4]);
		/* Policy sees the ICMP type as the port, as Cilium does. */
		p->pport = bpf_htons(type);
		int v6 = p->proto == IPPROTO_ICMPV6_;
		if ((!v6 && type == 8) || (v6 && type == 128)) { /* echo request */
			p->sport = id;
			p->dport = 0;
			return REASON_FORWARDED;
		}
		if ((!v6 && type == 0) || (v6 && type == 129)) { /* echo reply */
			p->sport = 0;
			p->dport = id;
			return REASON_FORWARDED;
		}
		p->dport = p->pport;
		if (v6 && ((type >= 130 && type <= 137) || type == 143)) {
			p->ndp = 1;
			return REASON_FORWARDED;
		}
		int err = (!v6 && (type == 3 || type == 11 || type == 12)) || (v6 && type >= 1 && type <= 4);
		if (!err)
			return REASON_FORWARDED;
		p->icmp_error = 1;
		return parse_icmp_inner(skb, off + 8, p);
	}
	}
	return REASON_FORWARDED;
}

/* parse_ip reads the IP packet at offset l2 (the link-layer header's
 * length, a constant at each caller: the compiler folds it into the
 * offsets, so the Ethernet parse costs what it did before the device
 * without one came) of family eth_proto (an Ethernet type). */
static __always_inline int parse_ip(struct __sk_buff *skb, struct pkt *p, const __u32 l2, __be16 eth_proto)
{
	if (eth_proto == bpf_htons(ETH_P_IP)) {
		__u8 *h = hdr(skb, p, l2, 20);
		if (!h)
			return REASON_TRUNCATED;
		__u8 ihl = h[0] & 0xf;
		if ((h[0] >> 4) != 4 || ihl < 5)
			return REASON_MALFORMED;
		__u16 tot = ((__u16)h[2] << 8) | h[3];
		if (tot < (__u16)ihl * 4 || l2 + (__u32)tot > skb->len)
			return REASON_TRUNCATED;
		p->family = FAMILY_V4;
		p->l3_end = l2 + tot;
		p->proto = h[9];
		p->nonfirst_frag = ((((__u16)h[6] << 8) | h[7]) & 0x1fff) != 0;
		__builtin_memcpy(p->saddr, &h[12], 4);
		__builtin_memcpy(p->daddr, &h[16], 4);
		return parse_l4(skb, l2 + (__u32)ihl * 4, p);
	}
	if (eth_proto == bpf_htons(ETH_P_IPV6)) {
		__u8 *h = hdr(skb, p, l2, 40);
		if (!h)
			return REASON_TRUNCATED;
		if ((h[0] >> 4) != 6)
			return REASON_MALFORMED;
		__u16 plen = ((__u16)h[4] << 8) | h[5];
		if (l2 + 40 + (__u32)plen > skb->len)
			return REASON_TRUNCATED;
		p->family = FAMILY_V6;
		p->l3_end = l2 + 40 + plen;
		__builtin_memcpy(p->saddr, &h[8], 16);
		__builtin_memcpy(p->daddr, &h[24], 16);
		__u8 next = h[6];
		__u32 off = l2 + 40;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			if (off > MAX_HDR_OFFSET)
				return REASON_MALFORMED;
			if (next == 0 || next == 43 || next == 60) { /* hop-by-hop, routing, destination */
				__u8 *x = hdr(skb, p, off, 2);
				if (!x)
					return REASON_TRUNCATED;
				next = x[0];
				off += ((__u32)x[1] + 1) * 8;
			} else if (next == 44) { /* fragment */
				__u8 *x = hdr(skb, p, off, 4);
				if (!x)
					return REASON_TRUNCATED;
				next = x[0];
				p->nonfirst_frag = ((((__u16)x[2] << 8) | x[3]) & 0xfff8) != 0;
				off += 8;
			} else {
				break;
			}
		}
		/* Longer extension chains, or deeper headers, than we parse. */
		if (next == 0 || next == 43 || next == 60 || next == 44 || off > MAX_HDR_OFFSET)
			return REASON_MALFORMED;
		p->proto = next;
		return parse_l4(skb, off, p);
	}
	return REASON_UNKNOWN_L3;
}

/* parse fills p from the packet; it returns REASON_FORWARDED, or a reason
 * to drop. ARP sets p->arp and passes as is.
 *
 * parse, ct_create (conntrack.h), policy (policy.h) and deliver_direct
 * (bpf_lxc.c) are global functions: the verifier checks each once, on its
 * own, instead of every path through the header parser times every path
 * through two endpoints' checks, which exceeds its budget when everything
 * is inlined. After a call the caller knows nothing of what the callee
 * wrote into struct pkt, which also keeps the caller's states few. The
 * calls cost a few ns. */
__attribute__((noinline)) int parse(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return REASON_MALFORMED;
	p->now = bpf_ktime_get_coarse_ns();
	p->len = skb->len;
	p->l3_end = skb->len;
	__u8 *eth = hdr(skb, p, 0, ETH_HLEN);
	if (!eth)
		return REASON_TRUNCATED;
	__be16 eth_proto = be16_at(&eth[12]);
	if (eth_proto == bpf_htons(ETH_P_ARP)) {
		p->arp = 1;
		return REASON_FORWARDED;
	}
	return parse_ip(skb, p, ETH_HLEN, eth_proto);
}

/* parse_l3 is parse for a device without link-layer header (the
 * userspace WireGuard's TUN device): the IP header at offset 0, so every
 * offset in p (l4_off, l3_end) counts from it. The family is the IP
 * header's version: what the TUN driver itself sets skb->protocol from
 * (IFF_NO_PI), and unlike skb->protocol also right in BPF_PROG_TEST_RUN,
 * which takes every frame for Ethernet. Only readers of p may follow it:
 * the rewriting code (nat.h, nodeport.h) writes at Ethernet offsets. */
__attribute__((noinline)) int parse_l3(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return REASON_MALFORMED;
	p->now = bpf_ktime_get_coarse_ns();
	p->len = skb->len;
	p->l3_end = skb->len;
	__u8 *v = hdr(skb, p, 0, 1);
	if (!v)
		return REASON_TRUNCATED;
	__u8 version = v[0] >> 4;
	if (version == 4)
		return parse_ip(skb, p, 0, bpf_htons(ETH_P_IP));
	if (version == 6)
		return parse_ip(skb, p, 0, bpf_htons(ETH_P_IPV6));
	return REASON_UNKNOWN_L3;
}

#endif
