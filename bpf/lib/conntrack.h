/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: conntrack: one entry per flow on the node in
 * tdr_ct4_v2 / tdr_ct6_v2, keyed by the flow's two sides in a canonical
 * order (see struct ct4_key), shared by both directions and by the flow's
 * local endpoints, each of which admits the flow once. */
#ifndef TDR_CONNTRACK_H
#define TDR_CONNTRACK_H

#include "maps.h"
#include "pkt.h"

#define CT_LIFETIME_TCP_SYN (60ULL * NSEC_PER_SEC)
#define CT_LIFETIME_TCP (21600ULL * NSEC_PER_SEC)
#define CT_LIFETIME_TCP_CLOSE (10ULL * NSEC_PER_SEC)
#define CT_LIFETIME_NONTCP (60ULL * NSEC_PER_SEC)
/* An entry's deadline is rewritten at most this often on a busy flow: a
 * write per packet would bounce the entry's cache line between CPUs. */
#define CT_REFRESH_INTERVAL (1ULL * NSEC_PER_SEC)

/* Conntrack outcomes. */
#define CT_NEW 0
#define CT_ESTABLISHED 1
#define CT_REPLY 2
#define CT_RELATED 3
/* admit counts a packet of a known flow under its outcome's reason. */
_Static_assert(CT_ESTABLISHED == REASON_CT_ESTABLISHED && CT_REPLY == REASON_CT_REPLY &&
		       CT_RELATED == REASON_CT_RELATED,
	       "conntrack outcomes must equal their reasons");

/* flow is the conntrack key of a packet (of the packet an ICMP error
 * quotes, for errors) and the side of it the packet's source is. */
struct flow {
	/* 4-byte aligned: flow_of copies addresses into it by words. */
	union {
		struct ct4_key k4;
		struct ct6_key k6;
	} __attribute__((aligned(4)));
	__u8 src_is_a;
};

/* lower4 and lower6 report whether (x, xp) orders strictly before (y, yp):
 * addresses, then ports, as big-endian numbers. */
static __always_inline int lower4(const __u8 *x, __be16 xp, const __u8 *y, __be16 yp)
{
	__u32 a = bpf_ntohl(u32_at(x)), b = bpf_ntohl(u32_at(y));

	if (a != b)
		return a < b;
	return bpf_ntohs(xp) < bpf_ntohs(yp);
}

static __always_inline int lower6(const __u8 *x, __be16 xp, const __u8 *y, __be16 yp)
{
#pragma unroll
	for (int i = 0; i < 16; i += 4) {
		__u32 a = bpf_ntohl(u32_at(x + i)), b = bpf_ntohl(u32_at(y + i));
		if (a != b)
			return a < b;
	}
	return bpf_ntohs(xp) < bpf_ntohs(yp);
}

/* ct_key fills k (a struct ct4_key or ct6_key, by family) with the
 * canonical key of the flow between (s, sp) and (d, dp) of protocol
 * proto, and returns whether s is side a. k must be zeroed. */
static __always_inline __u8 ct_key(void *k, __u8 family, __u8 proto, const __u8 *s, __be16 sp, const __u8 *d,
				   __be16 dp)
{
	__u8 s_is_a;

	if (family == FAMILY_V4) {
		struct ct4_key *k4 = k;
		s_is_a = !lower4(d, dp, s, sp);
		k4->proto = proto;
		if (s_is_a) {
			__builtin_memcpy(k4->addr_a, s, 4);
			__builtin_memcpy(k4->addr_b, d, 4);
			k4->port_a = sp, k4->port_b = dp;
		} else {
			__builtin_memcpy(k4->addr_a, d, 4);
			__builtin_memcpy(k4->addr_b, s, 4);
			k4->port_a = dp, k4->port_b = sp;
		}
	} else {
		struct ct6_key *k6 = k;
		s_is_a = !lower6(d, dp, s, sp);
		k6->proto = proto;
		if (s_is_a) {
			__builtin_memcpy(k6->addr_a, s, 16);
			__builtin_memcpy(k6->addr_b, d, 16);
			k6->port_a = sp, k6->port_b = dp;
		} else {
			__builtin_memcpy(k6->addr_a, d, 16);
			__builtin_memcpy(k6->addr_b, s, 16);
			k6->port_a = dp, k6->port_b = sp;
		}
	}
	return s_is_a;
}

/* flow_of builds the canonical key of the packet, or of the packet an ICMP
 * error quotes. */
static __always_inline void flow_of(struct flow *f, const struct pkt *p)
{
	const __u8 *s = p->saddr, *d = p->daddr;
	__be16 sp = p->sport, dp = p->dport;
	__u8 proto = p->proto;

	if (p->icmp_error) {
		s = p->in_saddr, d = p->in_daddr, sp = p->in_sport, dp = p->in_dport, proto = p->in_proto;
	}
	__builtin_memset(f, 0, sizeof(*f));
	/* struct pkt's addresses are 4-byte aligned: said so, the compiler
	 * reads, compares and copies them by words instead of bytes (on
	 * every packet). */
	f->src_is_a = ct_key(f, p->family, proto, __builtin_assume_aligned(s, 4), sp, __builtin_assume_aligned(d, 4), dp);
}

/* ep_is_a reports whether the endpoint that sees the packet in direction
 * dir owns side a of the flow: a pod sends (egress) from its own address
 * and receives (ingress) at it; an ICMP error is about a packet going the
 * other way. */
static __always_inline __u8 ep_is_a(const struct flow *f, __u8 dir, const struct pkt *p)
{
	return ((dir == DIR_EGRESS) ^ p->icmp_error) ? f->src_is_a : !f->src_is_a;
}

/* ct_find returns the flow's live entry, or NULL when there is none, it
 * expired, or a fresh SYN reuses the tuple of a closing TCP flow (a new
 * connection, which goes through policy again). */
static __always_inline struct ct_entry *ct_find(const struct flow *f, const struct pkt *p)
{
	struct ct_entry *e;

	if (p->family == FAMILY_V4) {
		e = bpf_map_lookup_elem(&tdr_ct4_v2, &f->k4);
		barrier();
	} else {
		e = bpf_map_lookup_elem(&tdr_ct6_v2, &f->k6);
	}
	if (!e || e->expires <= p->now)
		return NULL;
	if (!p->icmp_error && p->proto == IPPROTO_TCP_ && (e->flags & CT_F_CLOSING) &&
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return NULL;
	return e;
}

/* ct_classify is the flow as endpoint ep_id (owning side a when is_a)
 * sees the packet: CT_NEW unless the endpoint admitted the flow, then
 * CT_RELATED for an ICMP error, CT_ESTABLISHED for the direction of the
 * flow's first packet, CT_REPLY for the other. */
static __always_inline int ct_classify(const struct ct_entry *e, const struct flow *f, const struct pkt *p, __u16 ep_id,
				       __u8 is_a)
{
	if (!e || (is_a ? e->ep_a : e->ep_b) != ep_id)
		return CT_NEW;
	if (p->icmp_error)
		return CT_RELATED;
	return f->src_is_a == !!(e->flags & CT_F_A_STARTED) ? CT_ESTABLISHED : CT_REPLY;
}

static __always_inline __u64 ct_lifetime(const struct pkt *p, __u8 flags)
{
	if (p->proto != IPPROTO_TCP_)
		return CT_LIFETIME_NONTCP;
	if (flags & CT_F_CLOSING)
		return CT_LIFETIME_TCP_CLOSE;
	if (!(flags & CT_F_SEEN_REPLY))
		return CT_LIFETIME_TCP_SYN;
	return CT_LIFETIME_TCP;
}

/* ct_admit names endpoint ep_id on its side of an existing entry, unless
 * the agent revoked that side's admission: the endpoint's policy then
 * checks every packet of the flow as new. */
static __always_inline void ct_admit(struct ct_entry *e, __u8 is_a, __u16 ep_id)
{
	if (e->revoked & (is_a ? CT_REVOKED_A : CT_REVOKED_B))
		return;
	if (is_a)
		e->ep_a = ep_id;
	else
		e->ep_b = ep_id;
}

/* ct_update keeps an existing entry's state and deadline with a packet
 * that passed. */
static __always_inline void ct_update(struct ct_entry *e, const struct flow *f, const struct pkt *p)
{
	__u8 flags = e->flags;

	if (p->proto == IPPROTO_TCP_) {
		__u8 tf = p->tcp_flags;
		if (tf & (TCP_FLAG_FIN | TCP_FLAG_RST))
			flags |= CT_F_CLOSING;
		if ((e->tcp_flags | tf) != e->tcp_flags)
			e->tcp_flags |= tf;
	}
	if (f->src_is_a != !!(flags & CT_F_A_STARTED))
		flags |= CT_F_SEEN_REPLY;
	__u64 deadline = p->now + ct_lifetime(p, flags);
	if (flags != e->flags) {
		e->flags = flags;
		e->expires = deadline;
	} else if (deadline > e->expires + CT_REFRESH_INTERVAL) {
		/* A busy flow rewrites its deadline at most this often: a
		 * write per packet would bounce the entry's cache line
		 * between CPUs. */
		e->expires = deadline;
	}
}

/* ct_is_reply reports whether the packet goes against the direction of
 * the flow's first packet. */
static __always_inline int ct_is_reply(const struct ct_entry *e, const struct flow *f)
{
	return f->src_is_a != !!(e->flags & CT_F_A_STARTED);
}

/* CT_REV_NAT_SHIFT: ct_create's not_local carries the flow's reverse NAT
 * ID above this bit (24 bits: IDs below LB_MAX_IDS). */
#define CT_REV_NAT_SHIFT 8
/* CT_PROXY_SHIFT: ct_create's not_local carries the flow's PROXY_* in
 * bits 5-7 (below PROXY_MAX * 2). */
#define CT_PROXY_SHIFT 5

/* ct_create makes the entry of a new flow, naming the local endpoints
 * that admitted it on sides a and b. not_local holds the CT_F_*_NOT_LOCAL
 * flags in its low byte and the flow's reverse NAT ID (lbnat.h; 0: none)
 * in its upper 24 bits, from CT_REV_NAT_SHIFT (a call takes five
 * arguments). A global function,
 * verified on its own (see parse in parse.h); not on the path of an
 * established packet. */
__attribute__((noinline)) int ct_create(const struct flow *f, const struct pkt *p, __u32 ep_a, __u32 ep_b,
					__u32 not_local)
{
	struct ct_entry e = {};

	if (!f || !p)
		return 0;
	e.ep_a = ep_a;
	e.ep_b = ep_b;
	e.tcp_flags = p->tcp_flags;
	e.flags = not_local & (CT_F_A_NOT_LOCAL | CT_F_B_NOT_LOCAL);
	e.rev_nat = not_local >> CT_REV_NAT_SHIFT;
	e.proxy = (not_local >> CT_PROXY_SHIFT) & 7;
	if (f->src_is_a)
		e.flags |= CT_F_A_STARTED;
	if (p->proto == IPPROTO_TCP_ && (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
		e.flags |= CT_F_CLOSING;
	e.expires = p->now + ct_lifetime(p, e.flags);
	if (p->family == FAMILY_V4)
		return bpf_map_update_elem(&tdr_ct4_v2, &f->k4, &e, BPF_ANY);
	return bpf_map_update_elem(&tdr_ct6_v2, &f->k6, &e, BPF_ANY);
}

#endif
