/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the parsed facts of one packet (struct pkt, which
 * parse.h fills and every later step reads) and access to its headers in
 * the socket buffer. */
#ifndef TDR_PKT_H
#define TDR_PKT_H

#include "common.h"

/* Headers are read in place; deeper than this is not parsed. */
#define MAX_HDR_OFFSET 512

/* The parsed facts of one packet. */
struct pkt {
	__u8 family;
	__u8 proto;
	__u8 tcp_flags;
	__u8 nonfirst_frag;
	__u8 icmp_error; /* carries an inner header of another flow */
	__u8 ndp;        /* neighbor discovery / MLD: always passes */
	__u8 arp;
	__u8 in_proto;
	/* The four addresses start at offsets 8, 24, 40 and 56, so they are
	 * 4-byte aligned (the struct holds a __u64): conntrack and the
	 * endpoint checks read them by words (see flow_of). */
	__u8 saddr[16];
	__u8 daddr[16];
	/* Inner tuple of an ICMP error (as the original packet had it). */
	__u8 in_saddr[16];
	__u8 in_daddr[16];
	__be16 in_sport;
	__be16 in_dport;
	__be16 sport;
	__be16 dport;
	/* The port policy sees: the destination port, or the ICMP type. */
	__be16 pport;
	/* PROXY_* from_pod sends the packet to (bpf_lxc.c). In what was
	 * padding: kept in the caller's frame, not in from_pod_flow's,
	 * whose stack the policy's call chain has no room for. */
	__u8 proxy;
	/* from_pod_flow: the packet goes against its flow's first one (a
	 * reply), for its trace decision. In what was padding, as proxy. */
	__u8 reply;
	__u32 len;
	/* End of the IP packet: Ethernet padding after it is not header. */
	__u32 l3_end;
	/* Offset of the L4 header (service translation rewrites it). */
	__u32 l4_off;
	/* bpf_ktime_get_coarse_ns() when the packet was parsed: one clock
	 * read serves every conntrack step. */
	__u64 now;
};

_Static_assert(__builtin_offsetof(struct pkt, saddr) % 4 == 0 && __builtin_offsetof(struct pkt, daddr) % 4 == 0 &&
		       __builtin_offsetof(struct pkt, in_saddr) % 4 == 0 &&
		       __builtin_offsetof(struct pkt, in_daddr) % 4 == 0,
	       "struct pkt's addresses must be 4-byte aligned");
_Static_assert(sizeof(struct pkt) == 104, "struct pkt grew: the pod programs' stack has no room");

/* skb_data and skb_data_end load the packet pointers with the context
 * register and a constant offset in one instruction. Written in C, clang
 * may keep the field's address (ctx + 80) in a register across a helper
 * call and load through it later, which the verifier refuses. */
static __always_inline void *skb_data(struct __sk_buff *skb)
{
	void *p;
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(p) : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data)));
	return p;
}

static __always_inline void *skb_data_end(struct __sk_buff *skb)
{
	void *p;
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(p) : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data_end)));
	return p;
}

/* hdr returns a pointer to len bytes at off in the packet, pulling them
 * into the linear area when they are not there yet, or NULL when the IP
 * packet (p->l3_end) or the frame is shorter. Every call may move the
 * packet: pointers from earlier calls are dead after it. */
static __always_inline void *hdr(struct __sk_buff *skb, const struct pkt *p, __u32 off, const __u32 len)
{
	if (off > MAX_HDR_OFFSET || off + len > p->l3_end)
		return NULL;
	void *data = skb_data(skb);
	void *end = skb_data_end(skb);
	if (data + off + len <= end)
		return data + off;
	if (bpf_skb_pull_data(skb, off + len))
		return NULL;
	data = skb_data(skb);
	end = skb_data_end(skb);
	if (off > MAX_HDR_OFFSET || data + off + len > end)
		return NULL;
	return data + off;
}

#endif
