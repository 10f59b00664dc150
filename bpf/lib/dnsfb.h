/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the DNS fallback, a name filter for the time no DNS
 * proxy listens (the agent killed or starting; docs/policy-l7.md, "No
 * proxy listening"). A UDP query of a flow sent to PROXY_DNS that finds no
 * proxy socket is parsed here (header, one question, its QNAME in wire
 * format) and its name looked up in tdr_dns_fallback_v1 (lib/maps.h),
 * which the agent writes from the endpoint's DNS rules and which, pinned,
 * outlives the agent. An allowed name passes as the port's L4 allow says;
 * a denied one is answered REFUSED from here (IPv4) or dropped (IPv6),
 * counted and reported with REASON_DNS_NAME_DENIED. The names are hashed
 * (64-bit FNV-1a of the lowercased wire-format name, pkg/fqdn/dnsfallback
 * computes the same in Go): a hash map lookup per candidate instead of
 * strings in the map. */
#ifndef TDR_DNSFB_H
#define TDR_DNSFB_H

#include "common.h"
#include "pkt.h"
#include "maps.h"
#include "events.h"
#include "endpoint.h"

#define DNS_HDR_LEN 12
/* A name in wire format is at most 255 bytes (RFC 1035 3.1). */
#define DNSFB_NAME_MAX 255
/* The shortest query read: header, a one-byte name, QTYPE, QCLASS. */
#define DNSFB_MIN (DNS_HDR_LEN + 1 + 4)
_Static_assert(DNSFB_BUF - DNSFB_MIN == 0xff, "dns_fallback's read length is DNSFB_MIN + a byte");

#define DNSFB_FNV_OFFSET 0xcbf29ce484222325ULL
#define DNSFB_FNV_PRIME 0x100000001b3ULL

static __always_inline int dnsfb_has(__u16 ep_id, __u8 kind, __u64 hash)
{
	struct dnsfb_key k = {};
	k.ep_id = ep_id;
	k.kind = kind;
	k.hash = hash;
	return bpf_map_lookup_elem(&tdr_dns_fallback_v1, &k) != NULL;
}

/* dnsfb_walk is the state of the walk over a query's name: the
 * message (n bytes of it read), the hashes so far, where the rest after
 * the first label begins, the next length octet, and the offset after the
 * name's final zero (0 until found). */
struct dnsfb_walk {
	struct dnsfb_buf *s;
	__u64 h;
	__u64 hs;
	__u32 n;
	__u32 sfx;
	__u32 next;
	__u32 end;
};

/* dnsfb_step hashes byte i of the name (bpf_loop's callback: verified
 * once, where an open loop's branches multiplied the verifier's states
 * past its limit). Letters are lowercased; the length octets (at most 63)
 * are no letters. Returns 1 to stop: at the final zero (end set), at a
 * compression pointer or the end of what was read (end left 0). */
static long dnsfb_step(__u64 i, void *ctx)
{
	struct dnsfb_walk *w = ctx;
	__u64 j = DNS_HDR_LEN + i;
	if (j >= w->n || j >= DNSFB_BUF || !w->s)
		return 1;
	__u8 b = w->s->b[j];
	int len_octet = j == w->next;
	if (len_octet) {
		if (b > 63)
			return 1;
		w->next = (__u32)j + 1 + b;
	} else if (b >= 'A' && b <= 'Z') {
		b |= 0x20;
	}
	w->h = (w->h ^ b) * DNSFB_FNV_PRIME;
	if (j >= w->sfx)
		w->hs = (w->hs ^ b) * DNSFB_FNV_PRIME;
	if (len_octet && b == 0) {
		w->end = (__u32)j + 1;
		return 1;
	}
	return 0;
}

/* dnsfb_refuse turns the IPv4 UDP query in skb (its DNS message's
 * question ends qend bytes into the UDP payload) into its REFUSED answer
 * in place and sends it back into the pod: the message trimmed after the
 * question, QR set, RCODE 5, the other counts 0; addresses and ports
 * swapped; the frame from the pod's host-side veth to the pod. The UDP
 * checksum is 0 (none: allowed for IPv4 UDP), the IP header's is
 * recomputed. Returns the redirect verdict, or -1 when the packet cannot
 * be rewritten (the caller drops it). */
static __always_inline int dnsfb_refuse(struct __sk_buff *skb, const struct pkt *p, const struct endpoint_info *ep, __u32 qend)
{
	if (p->l4_off != ETH_HLEN + 20)
		return -1; /* IP options: rare, not rewritten */
	__u32 len = ETH_HLEN + 20 + 8 + qend;
	if (bpf_skb_change_tail(skb, len, 0))
		return -1;
	struct pkt q = {};
	q.l3_end = len;
	__u8 *eth = hdr(skb, &q, 0, ETH_HLEN + 20 + 8 + DNS_HDR_LEN);
	if (!eth)
		return -1;
	__u8 *ip = eth + ETH_HLEN;
	__u8 *udp = ip + 20;
	__u8 *dns = udp + 8;
	__builtin_memcpy(eth, ep->mac, ETH_ALEN);
	__builtin_memcpy(eth + ETH_ALEN, ep->host_mac, ETH_ALEN);
	__u32 a;
	__builtin_memcpy(&a, ip + 12, 4);
	__builtin_memcpy(ip + 12, ip + 16, 4);
	__builtin_memcpy(ip + 16, &a, 4);
	__u16 tot = bpf_htons((__u16)(20 + 8 + qend));
	__builtin_memcpy(ip + 2, &tot, 2);
	ip[8] = 64;
	ip[10] = 0;
	ip[11] = 0;
	__u32 sum = 0;
	for (int i = 0; i < 20; i += 2)
		sum += ((__u32)ip[i] << 8) | ip[i + 1];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	__u16 csum = bpf_htons((__u16)~sum);
	__builtin_memcpy(ip + 10, &csum, 2);
	__u16 port;
	__builtin_memcpy(&port, udp, 2);
	__builtin_memcpy(udp, udp + 2, 2);
	__builtin_memcpy(udp + 2, &port, 2);
	__u16 ulen = bpf_htons((__u16)(8 + qend));
	__builtin_memcpy(udp + 4, &ulen, 2);
	udp[6] = 0;
	udp[7] = 0;
	/* QR, the query's opcode and RD kept; AA, TC off. RA, Z, AD, CD
	 * off, RCODE REFUSED. One question, no other record. */
	dns[2] = 0x80 | (dns[2] & 0x79);
	dns[3] = 5;
	__builtin_memset(dns + 6, 0, 6);
	return bpf_redirect_peer(ep->ifindex, 0);
}

/* dns_fallback decides endpoint ep's packet p of a flow sent to
 * PROXY_DNS when no DNS proxy socket took it (to_proxy, bpf_lxc.c);
 * dst_id is the destination's identity for the drop event (0: not a
 * local endpoint). Returns -1 when it passes as the port's L4 allow says
 * (the endpoint has no filter, DNSFB_KIND_ALL, or an allowed name), else
 * the verdict (the REFUSED answer's redirect, or a drop). A packet that
 * is no plain query (QR set, another opcode, not one question, a
 * malformed or compressed name) is denied too: the proxy refuses those.
 * TCP is dropped while the endpoint filters: its first segment may not
 * hold a whole query, and a connection carries many (docs/policy-l7.md).
 * A global function, verified once. */
__attribute__((noinline)) int dns_fallback(struct __sk_buff *skb, const struct pkt *p, const struct endpoint_info *ep, __u32 dst_id)
{
	if (!skb || !p || !ep)
		return -1;
	__u16 ep_id = ep->ep_id;
	/* Order (the agent's, pkg/agent/agentpolicy): the names go in
	 * before DNSFB_KIND_FILTER and out after it; no filter marker
	 * (an endpoint without DNS rules, or an agent that never wrote
	 * them) passes as before. */
	if (dnsfb_has(ep_id, DNSFB_KIND_ALL, 0) || !dnsfb_has(ep_id, DNSFB_KIND_FILTER, 0))
		return -1;
	__u32 what = REASON_DNS_NAME_DENIED | ((__u32)DIR_EGRESS << 8) | ((__u32)ep_id << 16);
	if (p->proto != IPPROTO_UDP_ || p->icmp_error || p->nonfirst_frag)
		return drop_out(p, what, ep->identity, dst_id, 0);
	__u32 off = p->l4_off + 8;
	if (off > MAX_HDR_OFFSET || p->l3_end < off + DNSFB_MIN)
		return drop_out(p, what, ep->identity, dst_id, 0);
	__u32 n = p->l3_end - off;
	if (n > DNSFB_BUF)
		n = DNSFB_BUF;
	__u32 zero = 0;
	struct dnsfb_buf *s = bpf_map_lookup_elem(&tdr_dnsfb_scratch, &zero);
	if (!s || n < DNSFB_MIN)
		return drop_out(p, what, ep->identity, dst_id, 0);
	/* n is DNSFB_MIN + m, m at most 255: the mask (a no-op) puts the
	 * bounds where the verifier sees them. */
	__u32 m = n - DNSFB_MIN;
	asm volatile("%0 &= 0xff" : "+r"(m));
	n = DNSFB_MIN + m;
	if (bpf_skb_load_bytes(skb, off, s->b, n))
		return drop_out(p, what, ep->identity, dst_id, 0);
	/* A query (QR 0, opcode QUERY) of one question. */
	if ((s->b[2] & 0xf8) != 0 || s->b[4] != 0 || s->b[5] != 1)
		return drop_out(p, what, ep->identity, dst_id, 0);
	/* One pass over the name (dnsfb_step): its hash, and from the
	 * second label on the hash of the rest (for *.rest). */
	struct dnsfb_walk w = {};
	w.s = s;
	w.n = n;
	w.h = DNSFB_FNV_OFFSET;
	w.hs = DNSFB_FNV_OFFSET;
	__u32 first = s->b[DNS_HDR_LEN];
	w.sfx = DNS_HDR_LEN + 1 + first;
	w.next = DNS_HDR_LEN;
	bpf_loop(DNSFB_NAME_MAX, dnsfb_step, &w, 0);
	__u32 end = w.end;
	__u64 h = w.h, hs = w.hs;
	__u32 sfx = w.sfx;
	/* The root name (first label empty) is no name a rule allows. */
	if (!end || first == 0 || end + 4 > n)
		return drop_out(p, what, ep->identity, dst_id, 0);
	if (dnsfb_has(ep_id, DNSFB_KIND_NAME, h))
		return -1;
	/* *.rest needs a rest of one label at least (sfx < end - 1). */
	if (sfx + 1 < end && dnsfb_has(ep_id, DNSFB_KIND_SUFFIX, hs))
		return -1;
	drop_out(p, what, ep->identity, dst_id, 0);
	if (p->family == FAMILY_V4) {
		int r = dnsfb_refuse(skb, p, ep, end + 4);
		if (r >= 0)
			return r;
	}
	return TC_ACT_SHOT;
}

#endif
