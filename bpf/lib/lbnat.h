/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: per-packet service translation in the pod programs,
 * for what the socket hooks do not see (or when they are off): a packet a
 * pod sends to a service frontend is DNATed to a backend (lb_dnat), the
 * flow's conntrack entry records the reverse NAT ID, and the replies get
 * the frontend back as their source (lb_rev_snat). Backend selection is
 * lb.h's; a flow keeps its backend through tdr_lb4_flows_v1 /
 * tdr_lb6_flows_v1 (client tuple and frontend -> backend). */
#ifndef TDR_LBNAT_H
#define TDR_LBNAT_H

#include "lb.h"
#include "pkt.h"

/* lb_hash_tuple is the hash of a packet's flow (Maglev): source and
 * destination addresses, the two ports as one word, the protocol. */
static __always_inline __u32 lb_hash_tuple(const struct pkt *p)
{
	__u32 h = LB_HASH_SEED;
	int words = p->family == FAMILY_V4 ? 1 : 4;

#pragma unroll
	for (int i = 0; i < 4; i++) {
		if (i < words)
			h = lb_hash_word(h, u32_at(&p->saddr[i * 4]));
	}
#pragma unroll
	for (int i = 0; i < 4; i++) {
		if (i < words)
			h = lb_hash_word(h, u32_at(&p->daddr[i * 4]));
	}
	h = lb_hash_word(h, ((__u32)p->sport << 16) | p->dport);
	return lb_hash_word(h, p->proto);
}

/* nat_rewrite sets the packet's destination (dst) or source address and
 * port to addr and port, fixing the IPv4 header checksum and the TCP/UDP
 * checksum (pseudo-header included; a UDP checksum of 0 stays 0). Returns
 * 0, or -1 when the packet could not be written. */
static __always_inline int nat_rewrite(struct __sk_buff *skb, const struct pkt *p, int dst, const __u8 *addr,
				       __be16 port)
{
	__u32 csum_off = p->l4_off + (p->proto == IPPROTO_TCP_ ? 16 : 6);
	__u64 l4_flags = p->proto == IPPROTO_UDP_ ? BPF_F_MARK_MANGLED_0 : 0;
	__be16 old_port = dst ? p->dport : p->sport;

	if (p->family == FAMILY_V4) {
		__u32 old = u32_at(dst ? p->daddr : p->saddr);
		__u32 new = u32_at(addr);
		if (bpf_l4_csum_replace(skb, csum_off, old, new, l4_flags | BPF_F_PSEUDO_HDR | 4))
			return -1;
		if (bpf_l3_csum_replace(skb, ETH_HLEN + 10, old, new, 4))
			return -1;
		if (bpf_skb_store_bytes(skb, ETH_HLEN + (dst ? 16 : 12), &new, 4, 0))
			return -1;
	} else {
		__u32 old[4], new[4];
		__builtin_memcpy(old, dst ? p->daddr : p->saddr, 16);
		__builtin_memcpy(new, addr, 16);
		__s64 diff = bpf_csum_diff(old, 16, new, 16, 0);
		if (diff < 0)
			return -1;
		if (bpf_l4_csum_replace(skb, csum_off, 0, diff, l4_flags | BPF_F_PSEUDO_HDR))
			return -1;
		if (bpf_skb_store_bytes(skb, ETH_HLEN + (dst ? 24 : 8), new, 16, 0))
			return -1;
	}
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, l4_flags | 2))
			return -1;
		if (bpf_skb_store_bytes(skb, p->l4_off + (dst ? 2 : 0), &port, 2, 0))
			return -1;
	}
	return 0;
}

/* lb_dnat translates a packet the pod sends to a service frontend: it
 * keeps the flow's backend (tdr_lb*_flows_v1) or picks one (lb_pick: the
 * client's affinity, Maglev by lb_hash_tuple, or random), rewrites the
 * destination to it and updates p (so conntrack, the local destination and
 * policy see the backend, never the service address). Returns the reverse
 * NAT ID (> 0) of a translated packet, 0 for a packet to no service, or
 * minus a drop reason. A global function: verified once, on its own. */
__attribute__((noinline)) int lb_dnat(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return 0;
	if (p->icmp_error || p->nonfirst_frag || (p->proto != IPPROTO_TCP_ && p->proto != IPPROTO_UDP_))
		return 0;
	const struct lb_service *svc;
	union {
		struct lb4_flow_key k4;
		struct lb6_flow_key k6;
	} fk;
	struct lb_flow *fl;

	__builtin_memset(&fk, 0, sizeof(fk));
	if (p->family == FAMILY_V4) {
		svc = lb4_lookup(p->daddr, p->dport, p->proto);
		if (!svc)
			return 0;
		__builtin_memcpy(fk.k4.saddr, p->saddr, 4);
		__builtin_memcpy(fk.k4.daddr, p->daddr, 4);
		fk.k4.sport = p->sport;
		fk.k4.dport = p->dport;
		fk.k4.proto = p->proto;
		fl = bpf_map_lookup_elem(&tdr_lb4_flows_v1, &fk.k4);
		barrier();
	} else {
		svc = lb6_lookup(p->daddr, p->dport, p->proto);
		if (!svc)
			return 0;
		__builtin_memcpy(fk.k6.saddr, p->saddr, 16);
		__builtin_memcpy(fk.k6.daddr, p->daddr, 16);
		fk.k6.sport = p->sport;
		fk.k6.dport = p->dport;
		fk.k6.proto = p->proto;
		fl = bpf_map_lookup_elem(&tdr_lb6_flows_v1, &fk.k6);
	}

	/* skipRedirectFromBackend: the redirect's own backend pods go to
	 * the address itself (LB_SKIP_PASS) or the Service's own backends
	 * (LB_SKIP_ORIGINAL). */
	__u8 skip = 0;
	if (svc->flags & SVC_F_SKIP_BACKEND) {
		struct lb_skipsrc_key sk = {.port = p->dport, .proto = p->proto, .family = p->family};
		__builtin_memcpy(sk.client, p->saddr, 16);
		__builtin_memcpy(sk.frontend, p->daddr, 16);
		const __u8 *mode = bpf_map_lookup_elem(&tdr_lb_skipsrc_v1, &sk);
		if (mode)
			skip = *mode;
		if (skip == LB_SKIP_PASS)
			return 0;
	}

	const struct lb_backend *be = NULL;
	__u32 bid = 0;
	/* A known flow keeps its backend while the backend exists, even
	 * terminating (its connections drain); a deleted one is replaced,
	 * and so is a removed one for anything but TCP (a UDP "flow" is only
	 * a reused source port: it goes to a live backend). */
	if (fl && fl->rev_nat_id == svc->rev_nat_id) {
		bid = fl->backend_id;
		be = bpf_map_lookup_elem(&tdr_lb_backends_v1, &bid);
		if (be && be->state == BACKEND_REMOVED && p->proto != IPPROTO_TCP_)
			be = NULL;
	}
	if (!be) {
		struct lb_affinity_key ak = {.kind = p->family == FAMILY_V4 ? AFFINITY_BY_V4 : AFFINITY_BY_V6};
		__builtin_memcpy(ak.client, p->saddr, 16);
		if (skip == LB_SKIP_ORIGINAL)
			be = lb_pick_original(svc, &ak, &bid);
		else
			be = lb_pick(svc, &ak, lb_hash_tuple(p), &bid);
		if (!be || be->family != p->family)
			return -REASON_SVC_NO_BACKEND;
		struct lb_flow v = {.backend_id = bid, .rev_nat_id = svc->rev_nat_id};
		if (p->family == FAMILY_V4) {
			bpf_map_update_elem(&tdr_lb4_flows_v1, &fk.k4, &v, BPF_ANY);
			barrier();
		} else {
			bpf_map_update_elem(&tdr_lb6_flows_v1, &fk.k6, &v, BPF_ANY);
		}
	}
	if (nat_rewrite(skb, p, 1, be->addr, be->port))
		return -REASON_NAT_FAILED;
	__builtin_memcpy(p->daddr, be->addr, 16);
	p->dport = be->port;
	p->pport = be->port;
	/* IDs are below LB_MAX_IDS (2^24): positive as an int. */
	return (int)(svc->rev_nat_id & (LB_MAX_IDS - 1));
}

/* Hairpin: a pod reaching itself through a service. Its packet, DNATed to
 * its own address, would arrive in the pod from its own address (the
 * pod's kernel drops that as a martian) and its reply would never leave
 * the pod. So the packet's source becomes the hairpin address and it is
 * delivered back into the pod; the pod's reply to that address comes out
 * again, gets its own address back as destination and the frontend as
 * source (reverse NAT), and is delivered back in. The conntrack entry of
 * the flow (hairpin address <-> backend) carries the reverse NAT ID as for
 * any translated flow. The hairpin addresses are no pod's and are routed
 * through the pod's default gateway (its veth, where from_pod sees the
 * reply): IPv4 169.254.42.1 (link-local), IPv6 100::a9fe:2a01 (in
 * 100::/64, RFC 6666's discard-only prefix; a link-local address would
 * be on-link for the pod, which would look for it by neighbour
 * discovery instead of sending the reply to its gateway). */
#define LB_HAIRPIN_V4_0 169
#define LB_HAIRPIN_V4_1 254
#define LB_HAIRPIN_V4_2 42
#define LB_HAIRPIN_V4_3 1

/* The IPv6 hairpin address as four words in network byte order
 * (0100:0000:0000:0000:0000:0000:a9fe:2a01). */
#define LB_HAIRPIN_V6_W0 bpf_htonl(0x01000000)
#define LB_HAIRPIN_V6_W3 bpf_htonl(0xa9fe2a01)

static __always_inline int lb_is_hairpin_addr(const struct pkt *p, const __u8 *a)
{
	if (p->family == FAMILY_V4)
		return a[0] == LB_HAIRPIN_V4_0 && a[1] == LB_HAIRPIN_V4_1 && a[2] == LB_HAIRPIN_V4_2 && a[3] == LB_HAIRPIN_V4_3;
	return u32_at(a) == LB_HAIRPIN_V6_W0 && u32_at(a + 4) == 0 && u32_at(a + 8) == 0 && u32_at(a + 12) == LB_HAIRPIN_V6_W3;
}

static __always_inline int lb_same_addr(const struct pkt *p)
{
	if (p->family == FAMILY_V4)
		return u32_at(p->saddr) == u32_at(p->daddr);
	return u32_at(p->saddr) == u32_at(p->daddr) && u32_at(p->saddr + 4) == u32_at(p->daddr + 4) &&
	       u32_at(p->saddr + 8) == u32_at(p->daddr + 8) && u32_at(p->saddr + 12) == u32_at(p->daddr + 12);
}

/* lb_hairpin_snat gives a translated packet whose backend is its own
 * sender the hairpin address as source. Returns 1 when it did, 0 when the
 * packet is no hairpin, or minus a drop reason. */
static __always_inline int lb_hairpin_snat(struct __sk_buff *skb, struct pkt *p)
{
	if (!lb_same_addr(p))
		return 0;
	__u8 h[16] = {};
	if (p->family == FAMILY_V4) {
		h[0] = LB_HAIRPIN_V4_0;
		h[1] = LB_HAIRPIN_V4_1;
		h[2] = LB_HAIRPIN_V4_2;
		h[3] = LB_HAIRPIN_V4_3;
	} else {
		__u32 w0 = LB_HAIRPIN_V6_W0, w3 = LB_HAIRPIN_V6_W3;
		__builtin_memcpy(h, &w0, 4);
		__builtin_memcpy(h + 12, &w3, 4);
	}
	if (nat_rewrite(skb, p, 0, h, p->sport))
		return -REASON_NAT_FAILED;
	__builtin_memcpy(p->saddr, h, 16);
	return 1;
}

/* lb_hairpin_rev gives a pod's reply to the hairpin address the pod's own
 * address (its source) as destination. Returns 0, or minus a drop reason. */
static __always_inline int lb_hairpin_rev(struct __sk_buff *skb, struct pkt *p)
{
	if (nat_rewrite(skb, p, 1, p->saddr, p->dport))
		return -REASON_NAT_FAILED;
	__builtin_memcpy(p->daddr, p->saddr, 16);
	return 0;
}

/* lb_rev_snat gives a reply of a translated flow (its source is the
 * backend) the frontend of reverse NAT entry rev_nat as its source, and
 * updates p. Returns 0, or minus a drop reason. A global function. */
__attribute__((noinline)) int lb_rev_snat(struct __sk_buff *skb, struct pkt *p, __u32 rev_nat)
{
	if (!skb || !p)
		return 0;
	const struct lb_revnat *rv = bpf_map_lookup_elem(&tdr_lb_revnat_v1, &rev_nat);
	if (!rv || rv->family != p->family)
		return -REASON_NAT_FAILED;
	if (nat_rewrite(skb, p, 0, rv->addr, rv->port))
		return -REASON_NAT_FAILED;
	__builtin_memcpy(p->saddr, rv->addr, 16);
	p->sport = rv->port;
	return 0;
}

#endif
