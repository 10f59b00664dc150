/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: Geneve built and stripped in eBPF, without a kernel
 * Geneve device (docs/routing.md, "Geneve in eBPF"). tdr_tunnel_v1's
 * TUNNEL_F_GENEVE_BPF turns it on.
 *
 * Sending (geneve_encap, from from_pod): the packet for another node's
 * pod gets outer Ethernet, IPv4, UDP (to 6081) and Geneve headers pushed
 * in front of its own Ethernet frame (bpf_skb_adjust_room with the
 * encapsulation flags, so the kernel's GSO segments an encapsulated TCP
 * super-packet as it would a UDP tunnel's), the source's identity in the
 * VNI, and leaves by a FIB lookup towards the owner node (its source the
 * FIB's for that route) out of the underlay device.
 *
 * Receiving (geneve_decap, from the host device's from_netdev): Geneve on
 * UDP 6081 (over IPv4 or IPv6) to an address of this node is stripped down to the inner IP
 * packet behind the outer Ethernet header, and handed by tail call to
 * the overlay program from_geneve (bpf_overlay.c), which runs what
 * from_overlay runs on a device's packet: the outer source must be a
 * known node, the inner source that node's, the identity the ipcache's,
 * the pod's ingress policy, delivery. The outer source and the VNI ride
 * in skb->cb, which a tail call keeps and nothing else can set for a
 * program only reached by one.
 *
 * Either underlay: the owner node's tunnel address (the ipcache's) picks
 * an outer IPv4 or IPv6 header (40 bytes: GENEVE_ENCAP6_LEN), the FIB
 * lookup's source of that family. The outer UDP checksum is 0 over both.
 * RFC 8200 wants one over IPv6, but RFC 6935/6936 let tunnels send 0;
 * geneve_decap, at tc ingress before the host's UDP, takes it, and a
 * kernel Geneve peer takes it with udp6zerocsumrx. A checksum is not an
 * option here anyway: a GSO packet is segmented after this program with
 * the one outer UDP header copied into every segment (SKB_GSO_UDP_TUNNEL,
 * what bpf_skb_adjust_room sets), and the inner checksum of a pod's
 * packet is mostly not filled in yet (CHECKSUM_PARTIAL), so a sum taken
 * now would be wrong (docs/routing.md, "IPv6 underlay"). Receiving, the
 * outer IPv6 source rides in four words of cb (GENEVE_CB_MAGIC6*).
 *
 * One option is known, the DSR option (GENEVE_OPT_CLASS_DSR,
 * GENEVE_OPT_TYPE_DSR, after Cilium's scheme: its class and type, one
 * type for both families told apart by the length): a NodePort request
 * sent on to another node's backend by direct server return carries the
 * service frontend (address and port) in it, IPv4 or IPv6, instead of an
 * IPv4 option in the inner packet (nodeport_dsr.h). It is critical: a
 * receiver that cannot honour it must drop the packet (RFC 8926), since
 * the backend's replies would leave with the wrong source. geneve_decap
 * walks the options (at most GENEVE_MAX_OPTS, each checked against the
 * options' length and the packet): a malformed one (its length past the
 * options' end or the packet's, a DSR option of another length), an
 * unknown critical one, or a critical bit over more options than it
 * walks drops the packet (REASON_MALFORMED; the tunnel is a node's, and
 * a node that sends a broken header sends nothing we can trust in it);
 * an unknown option without the critical bit is skipped. A DSR option
 * is left for from_geneve in tdr_geneve_dsr_v1 (a per-CPU scratch: the
 * tail call runs on the same CPU, before any other packet), flagged in
 * skb->cb[GENEVE_CB_DSR]. */
#ifndef TDR_GENEVE_H
#define TDR_GENEVE_H

#include "maps.h"
#include "pkt.h"
#include "events.h"
#include "ipcache.h"

#define GENEVE_PORT 6081
#define GENEVE_HLEN 8
#define GENEVE_PROTO_ETH 0x6558 /* Transparent Ethernet Bridging */
/* Outer IPv4 20, UDP 8, Geneve 8, inner Ethernet 14: what is pushed
 * after the outer Ethernet header (the overhead the pods' MTU leaves). */
#define GENEVE_ENCAP_LEN (20 + 8 + GENEVE_HLEN + ETH_HLEN)
/* The same over an IPv6 underlay: outer IPv6 40 instead of 20. */
#define GENEVE_ENCAP6_LEN (40 + 8 + GENEVE_HLEN + ETH_HLEN)
/* geneve_encap_with's return for an owner node on an IPv6 underlay:
 * geneve_encap6_with's packet. */
#define GENEVE_UNDERLAY6 (-4)
/* skb->cb[GENEVE_CB_MARK] holds this while a decapsulated packet is
 * handed to from_geneve. */
#define GENEVE_CB_OUTER 0
#define GENEVE_CB_VNI 1
#define GENEVE_CB_MARK 2
#define GENEVE_CB_MAGIC 0x47454e56U /* "GENV" */
/* skb->cb[GENEVE_CB_DSR] holds this when tdr_geneve_dsr_v1 holds the
 * DSR option of the packet handed to from_geneve. */
#define GENEVE_CB_DSR 3
#define GENEVE_CB_DSR_MAGIC 0x44535230U /* "DSR0" */
/* An IPv6 underlay's outer source takes four words: cb[GENEVE_CB_OUTER]
 * and these three, the mark one of the two below (without and with a
 * DSR option in tdr_geneve_dsr_v1). */
#define GENEVE_CB_OUTER6_1 1
#define GENEVE_CB_OUTER6_2 3
#define GENEVE_CB_OUTER6_3 4
#define GENEVE_CB_MAGIC6 0x47454e36U     /* "GEN6" */
#define GENEVE_CB_MAGIC6_DSR 0x47364453U /* "G6DS" */

/* geneve_cb_marked: cb's mark says a packet geneve_decap handed over. */
static __always_inline int geneve_cb_marked(const struct __sk_buff *skb)
{
	__u32 m = skb->cb[GENEVE_CB_MARK];
	return m == GENEVE_CB_MAGIC || m == GENEVE_CB_MAGIC6 || m == GENEVE_CB_MAGIC6_DSR;
}

/* geneve_cb_dsr: geneve_decap left a DSR option in tdr_geneve_dsr_v1. */
static __always_inline int geneve_cb_dsr(const struct __sk_buff *skb)
{
	__u32 m = skb->cb[GENEVE_CB_MARK];
	return (m == GENEVE_CB_MAGIC && skb->cb[GENEVE_CB_DSR] == GENEVE_CB_DSR_MAGIC) || m == GENEVE_CB_MAGIC6_DSR;
}

/* The DSR option: class 0x014b and type 0x81 (critical, 1) as Cilium's,
 * 4 bytes of option header, then the frontend's address (4 or 16 bytes),
 * its port and two bytes of padding, all in network byte order:
 * 12 bytes over IPv4 (length field 2), 24 over IPv6 (length field 5). */
#define GENEVE_OPT_CLASS_DSR 0x014b
#define GENEVE_OPT_TYPE_CRIT 0x80
#define GENEVE_OPT_TYPE_DSR (GENEVE_OPT_TYPE_CRIT | 0x01)
#define GENEVE_OPT_DSR4_LEN 12
#define GENEVE_OPT_DSR6_LEN 24 /* GENEVE_DSR_SCRATCH_LEN, maps.h */
/* The Geneve header's critical-options-present bit (its second byte). */
#define GENEVE_F_CRIT 0x40
/* How many options geneve_decap walks (a verifier bound): more than the
 * one a node of ours sends. */
#define GENEVE_MAX_OPTS 8

/* struct geneve_dsr_scratch and tdr_geneve_dsr_v1 are in maps.h (every
 * object shares the pinned maps). */
#define GENEVE_TTL 64

#ifndef AF_INET_
#define AF_INET_ 2
#endif
#ifndef AF_INET6_
#define AF_INET6_ 10
#endif
/* The decapsulation flags of bpf_skb_adjust_room (Linux 6.3), newer than
 * the uapi headers of the build machine: the inner packet's family, so
 * the kernel clears the skb's encapsulation state. */
#ifndef BPF_F_ADJ_ROOM_DECAP_L3_IPV4
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)
#endif
#ifndef TUNNEL_ID_MASK
#define TUNNEL_ID_MASK 0xffffffU /* a VNI's 24 bits (overlay.h) */
#endif

/* geneve_bpf: tdr_tunnel_v1 asks for Geneve in eBPF. */
static __always_inline int geneve_bpf(void)
{
	__u32 zero = 0;
	struct tunnel_info *t = bpf_map_lookup_elem(&tdr_tunnel_v1, &zero);
	return t && (t->flags & TUNNEL_F_GENEVE_BPF);
}

/* geneve_csum16 folds a bpf_csum_diff sum into the Internet checksum. */
static __always_inline __u16 geneve_csum16(__s64 sum)
{
	__u32 s = (__u32)sum;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* geneve_encap_with encapsulates p (sent by identity src_id) to the node
 * the ipcache names as the owner of its destination and sends it there,
 * with opt's DSR option when opt is given (its len not 0; NULL: no
 * option). Returns the verdict; -1 for a packet left untouched to the
 * host (no owner node, an IPv6 underlay, an identity the VNI cannot
 * carry, no route to the node); -3 for one untouched because, with the
 * option, it would not fit the route's MTU; -2 when the packet was
 * changed but not wholly (the caller drops it). Always inlined into two
 * global functions: geneve_encap (no option: opt a constant NULL, so its
 * code and stack are gone) under from_pod, whose call chain has no 32
 * bytes of stack to spare, and geneve_encap_dsr under from_netdev. */
static __always_inline int geneve_encap_with(struct __sk_buff *skb, const struct pkt *p, __u32 src_id,
					     const struct geneve_dsr_scratch *opt)
{
	/* Scoped blocks, so that the compiler can lay the lookup's key and
	 * the FIB request over the header buffer below: this function sits
	 * under from_pod and from_pod_flow, whose stacks with it must stay
	 * within the verifier's 512 bytes. */
	struct ipcache_info *info;
	{
		struct ipcache_key k = {};
		k.family = p->family;
		k.prefixlen = 32 + (p->family == FAMILY_V4 ? 32 : 128);
		__builtin_memcpy(k.addr, __builtin_assume_aligned(p->daddr, 4), 16);
		info = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
	}
	if (!info || (src_id & ~TUNNEL_ID_MASK))
		return -1;
	if (info->tunnel_family == FAMILY_V6)
		return GENEVE_UNDERLAY6; /* geneve_encap6_with's */
	if (info->tunnel_family != FAMILY_V4)
		return -1;
	__u32 remote;
	__builtin_memcpy(&remote, info->tunnel_ip, 4);
	__u32 olen = 0;
	if (opt && opt->len == GENEVE_OPT_DSR4_LEN)
		olen = GENEVE_OPT_DSR4_LEN;
	else if (opt && opt->len == GENEVE_OPT_DSR6_LEN)
		olen = GENEVE_OPT_DSR6_LEN;

	/* The underlay's route to the node: device, next hop, and the source
	 * address the node would use on it; the outer Ethernet header from
	 * its MACs. */
	__u32 saddr, ifindex, nexthop;
	int resolved;
	__u8 oeth[ETH_HLEN] = {};
	{
		struct bpf_fib_lookup fib = {};
		fib.family = AF_INET_;
		fib.l4_protocol = IPPROTO_UDP_;
		fib.ipv4_dst = remote;
		fib.ifindex = skb->ifindex;
		/* A packet with the DSR option (a SYN, a UDP datagram) must
		 * fit the route whole: the FIB checks the length against the
		 * route's MTU. Without it the length is not checked (the
		 * pods' MTU leaves room for the headers). */
		if (olen)
			fib.tot_len = skb->len - ETH_HLEN + GENEVE_ENCAP_LEN + olen;
		long r = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SRC);
		if (r == BPF_FIB_LKUP_RET_FRAG_NEEDED)
			return -3;
		if (r != BPF_FIB_LKUP_RET_SUCCESS && r != BPF_FIB_LKUP_RET_NO_NEIGH)
			return -1;
		resolved = r == BPF_FIB_LKUP_RET_SUCCESS;
		saddr = fib.ipv4_src;
		ifindex = fib.ifindex;
		nexthop = fib.ipv4_dst;
		__builtin_memcpy(&oeth[0], fib.dmac, ETH_ALEN);
		__builtin_memcpy(&oeth[ETH_ALEN], fib.smac, ETH_ALEN);
	}
	oeth[12] = 0x08;

	/* Outer IPv4, UDP, Geneve, inner Ethernet (the pod's header, read
	 * before the room is made), written at once behind the outer
	 * Ethernet header. */
	__u8 h[GENEVE_ENCAP_LEN] __attribute__((aligned(4))) = {};
	if (bpf_skb_load_bytes(skb, 0, &h[36], ETH_HLEN))
		return -1;
	__u32 inner_len = skb->len;
	/* The UDP source port from the inner flow's hash, so the underlay
	 * spreads flows (what the kernel's tunnel devices do). */
	__u16 sport = 49152 | (bpf_get_hash_recalc(skb) & 0x3fff);
	__u64 flags = BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
		      BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN);
	if (bpf_skb_adjust_room(skb, GENEVE_ENCAP_LEN + olen, BPF_ADJ_ROOM_MAC, flags))
		return -1;

	__u16 tot = inner_len - ETH_HLEN + GENEVE_ENCAP_LEN + olen;
	h[0] = 0x45;
	h[2] = tot >> 8;
	h[3] = tot & 0xff;
	h[8] = GENEVE_TTL;
	h[9] = IPPROTO_UDP_;
	__builtin_memcpy(&h[12], &saddr, 4);
	__builtin_memcpy(&h[16], &remote, 4);
	__u16 csum = geneve_csum16(bpf_csum_diff(NULL, 0, (__be32 *)h, 20, 0));
	__builtin_memcpy(&h[10], &csum, 2);
	__u8 *u = &h[20];
	u[0] = sport >> 8;
	u[1] = sport & 0xff;
	u[2] = GENEVE_PORT >> 8;
	u[3] = GENEVE_PORT & 0xff;
	u[4] = (tot - 20) >> 8;
	u[5] = (tot - 20) & 0xff;
	/* UDP checksum 0: allowed over IPv4, and what the kernel's tunnels
	 * send by default. */
	__u8 *g = &h[28];
	g[2] = GENEVE_PROTO_ETH >> 8;
	g[3] = GENEVE_PROTO_ETH & 0xff;
	g[4] = src_id >> 16;
	g[5] = src_id >> 8;
	g[6] = src_id;
	if (olen && opt) {
		/* The option (critical: the C bit) between the Geneve header
		 * and the inner Ethernet header: three stores. */
		g[0] = olen / 4;
		g[1] = GENEVE_F_CRIT;
		if (bpf_skb_store_bytes(skb, ETH_HLEN, h, 36, 0) ||
		    bpf_skb_store_bytes(skb, ETH_HLEN + 36 + olen, &h[36], ETH_HLEN, 0))
			return -2;
		if (olen == GENEVE_OPT_DSR6_LEN ? bpf_skb_store_bytes(skb, ETH_HLEN + 36, opt->opt, GENEVE_OPT_DSR6_LEN, 0)
						: bpf_skb_store_bytes(skb, ETH_HLEN + 36, opt->opt, GENEVE_OPT_DSR4_LEN, 0))
			return -2;
	} else if (bpf_skb_store_bytes(skb, ETH_HLEN, h, sizeof(h), 0)) {
		return -2;
	}
	if (bpf_skb_store_bytes(skb, 0, oeth, ETH_HLEN, 0))
		return -2;
	count(REASON_TO_OVERLAY, DIR_EGRESS, p->len);
	if (resolved)
		return bpf_redirect(ifindex, 0);
	struct bpf_redir_neigh nh = {.nh_family = AF_INET_, .ipv4_nh = nexthop};
	return bpf_redirect_neigh(ifindex, &nh, sizeof(nh), 0);
}

/* geneve_encap6_with is geneve_encap_with over an IPv6 underlay: the
 * owner node's tunnel address is IPv6, the outer header IPv6 (40 bytes,
 * GENEVE_ENCAP6_LEN), the FIB's IPv6 source. A function of its own, so
 * the IPv4 path is what it was (one comparison more) and the callers call
 * it beside geneve_encap, not under it: the stack of from_pod's chain
 * has room for one of the two, not for both. Same returns. */
static __always_inline int geneve_encap6_with(struct __sk_buff *skb, const struct pkt *p, __u32 src_id,
					      const struct geneve_dsr_scratch *opt)
{
	struct ipcache_info *info;
	{
		struct ipcache_key k = {};
		k.family = p->family;
		k.prefixlen = 32 + (p->family == FAMILY_V4 ? 32 : 128);
		__builtin_memcpy(k.addr, __builtin_assume_aligned(p->daddr, 4), 16);
		info = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
	}
	if (!info || info->tunnel_family != FAMILY_V6 || (src_id & ~TUNNEL_ID_MASK))
		return -1;
	__u32 olen = 0;
	if (opt && opt->len == GENEVE_OPT_DSR4_LEN)
		olen = GENEVE_OPT_DSR4_LEN;
	else if (opt && opt->len == GENEVE_OPT_DSR6_LEN)
		olen = GENEVE_OPT_DSR6_LEN;

	/* The FIB request stays whole to the end: its answer (source,
	 * next hop, MACs) is written into the packet from it, and no header
	 * buffer is built on a stack that has no room for one (the headers
	 * go into the packet by direct access). */
	struct bpf_fib_lookup fib = {};
	fib.family = AF_INET6_;
	fib.l4_protocol = IPPROTO_UDP_;
	__builtin_memcpy(fib.ipv6_dst, info->tunnel_ip, 16);
	fib.ifindex = skb->ifindex;
	if (olen)
		fib.tot_len = skb->len - ETH_HLEN + GENEVE_ENCAP6_LEN + olen;
	long r = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SRC);
	if (r == BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return -3;
	if (r != BPF_FIB_LKUP_RET_SUCCESS && r != BPF_FIB_LKUP_RET_NO_NEIGH)
		return -1;

	__u32 inner_len = skb->len;
	__u16 sport = 49152 | (bpf_get_hash_recalc(skb) & 0x3fff);
	__u64 flags = BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
		      BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN);
	if (bpf_skb_adjust_room(skb, GENEVE_ENCAP6_LEN + olen, BPF_ADJ_ROOM_MAC, flags))
		return -1;
	/* The room is behind the pod's Ethernet header, which stays at the
	 * front (BPF_ADJ_ROOM_MAC) and is in the linear part with it. */
	__u32 lin = ETH_HLEN + GENEVE_ENCAP6_LEN + GENEVE_OPT_DSR6_LEN;
	__u8 *d = (__u8 *)(long)skb->data;
	if (d + lin > (__u8 *)(long)skb->data_end) {
		if (bpf_skb_pull_data(skb, lin))
			return -2;
		d = (__u8 *)(long)skb->data;
		if (d + lin > (__u8 *)(long)skb->data_end)
			return -2;
	}
	/* The inner Ethernet header: the pod's, copied from the front to
	 * behind the Geneve header and its option. */
	__u8 *ie = d + ETH_HLEN + 56;
	if (olen == GENEVE_OPT_DSR6_LEN)
		ie += GENEVE_OPT_DSR6_LEN;
	else if (olen)
		ie += GENEVE_OPT_DSR4_LEN;
	__builtin_memcpy(ie, d, ETH_HLEN);
	/* Outer Ethernet. */
	__builtin_memcpy(d, fib.dmac, ETH_ALEN);
	__builtin_memcpy(d + ETH_ALEN, fib.smac, ETH_ALEN);
	d[12] = 0x86;
	d[13] = 0xdd;
	/* The payload (and UDP) length: UDP, Geneve, option, the inner
	 * frame. */
	__u16 ulen = inner_len + 8 + GENEVE_HLEN + olen;
	__u8 *ip = d + ETH_HLEN;
	ip[0] = 0x60;
	ip[1] = 0;
	ip[2] = 0;
	ip[3] = 0;
	ip[4] = ulen >> 8;
	ip[5] = ulen & 0xff;
	ip[6] = IPPROTO_UDP_;
	ip[7] = GENEVE_TTL;
	__builtin_memcpy(&ip[8], fib.ipv6_src, 16);
	__builtin_memcpy(&ip[24], info->tunnel_ip, 16);
	__u8 *u = ip + 40;
	u[0] = sport >> 8;
	u[1] = sport & 0xff;
	u[2] = GENEVE_PORT >> 8;
	u[3] = GENEVE_PORT & 0xff;
	u[4] = ulen >> 8;
	u[5] = ulen & 0xff;
	/* UDP checksum 0 (the top of this file says why). */
	u[6] = 0;
	u[7] = 0;
	__u8 *g = ip + 48;
	g[0] = olen / 4;
	g[1] = olen ? GENEVE_F_CRIT : 0;
	g[2] = GENEVE_PROTO_ETH >> 8;
	g[3] = GENEVE_PROTO_ETH & 0xff;
	g[4] = src_id >> 16;
	g[5] = src_id >> 8;
	g[6] = src_id;
	g[7] = 0;
	if (opt && olen == GENEVE_OPT_DSR6_LEN)
		__builtin_memcpy(g + GENEVE_HLEN, opt->opt, GENEVE_OPT_DSR6_LEN);
	else if (opt && olen)
		__builtin_memcpy(g + GENEVE_HLEN, opt->opt, GENEVE_OPT_DSR4_LEN);
	count(REASON_TO_OVERLAY, DIR_EGRESS, p->len);
	if (r == BPF_FIB_LKUP_RET_SUCCESS)
		return bpf_redirect(fib.ifindex, 0);
	struct bpf_redir_neigh nh = {.nh_family = AF_INET6_};
	__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16);
	return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
}

/* geneve_encap is geneve_encap_with without an option: the pods' and
 * the overlay's packets. A global function. */
__attribute__((noinline)) int geneve_encap(struct __sk_buff *skb, const struct pkt *p, __u32 src_id)
{
	if (!skb || !p)
		return -1;
	return geneve_encap_with(skb, p, src_id, NULL);
}

/* geneve_encap_dsr is geneve_encap_with with the DSR option opt (NULL or
 * empty: none), for nodeport_dsr_geneve. A global function. */
__attribute__((noinline)) int geneve_encap_dsr(struct __sk_buff *skb, const struct pkt *p, __u32 src_id,
					       const struct geneve_dsr_scratch *opt)
{
	if (!skb || !p)
		return -1;
	return geneve_encap_with(skb, p, src_id, opt);
}

/* geneve_encap6 and geneve_encap6_dsr are geneve_encap and
 * geneve_encap_dsr over an IPv6 underlay, called when those returned
 * GENEVE_UNDERLAY6 (geneve_encap_v: both in turn). Global functions. */
__attribute__((noinline)) int geneve_encap6(struct __sk_buff *skb, const struct pkt *p, __u32 src_id)
{
	if (!skb || !p)
		return -1;
	return geneve_encap6_with(skb, p, src_id, NULL);
}

__attribute__((noinline)) int geneve_encap6_dsr(struct __sk_buff *skb, const struct pkt *p, __u32 src_id,
						const struct geneve_dsr_scratch *opt)
{
	if (!skb || !p)
		return -1;
	return geneve_encap6_with(skb, p, src_id, opt);
}

/* geneve_encap_v encapsulates over the owner node's underlay, either
 * family: geneve_encap, then geneve_encap6 for an IPv6 one (siblings:
 * their stacks are not added up). geneve_encap's returns. */
static __always_inline int geneve_encap_v(struct __sk_buff *skb, const struct pkt *p, __u32 src_id)
{
	int r = geneve_encap(skb, p, src_id);
	if (r == GENEVE_UNDERLAY6)
		r = geneve_encap6(skb, p, src_id);
	return r;
}

/* geneve_opts walks the options of a Geneve header (olen bytes at off,
 * crit: the header's critical bit) and leaves a DSR option in
 * tdr_geneve_dsr_v1. Returns 1 when it did, 0 for none, -1 for options
 * the packet must be dropped for (see the top of this file). A global
 * function: the loop is verified once, off geneve_decap's stack. */
__attribute__((noinline)) int geneve_opts(struct __sk_buff *skb, __u32 off, __u32 olen, __u32 crit)
{
	__u32 zero = 0;
	__u32 o = 0;
	int found = 0;

	if (!skb || olen > 252)
		return -1;
	struct geneve_dsr_scratch *s = bpf_map_lookup_elem(&tdr_geneve_dsr_v1, &zero);
	if (!s)
		return -1;
	s->len = 0;
	for (int i = 0; i < GENEVE_MAX_OPTS; i++) {
		if (o >= olen)
			break;
		__u8 oh[4];
		if (bpf_skb_load_bytes(skb, off + o, oh, 4))
			return -1; /* past the packet's end */
		__u32 l = 4 + (__u32)(oh[3] & 0x1f) * 4;
		if (o + l > olen)
			return -1; /* past the options' end */
		if (oh[0] == (GENEVE_OPT_CLASS_DSR >> 8) && oh[1] == (GENEVE_OPT_CLASS_DSR & 0xff) &&
		    oh[2] == GENEVE_OPT_TYPE_DSR) {
			int r;
			if (l == GENEVE_OPT_DSR4_LEN)
				r = bpf_skb_load_bytes(skb, off + o, s->opt, GENEVE_OPT_DSR4_LEN);
			else if (l == GENEVE_OPT_DSR6_LEN)
				r = bpf_skb_load_bytes(skb, off + o, s->opt, GENEVE_OPT_DSR6_LEN);
			else
				return -1;
			if (r)
				return -1;
			s->len = l;
			found = 1;
		} else if (oh[2] & GENEVE_OPT_TYPE_CRIT) {
			return -1; /* a critical option this node does not know */
		}
		o += l;
	}
	/* Options left unread: one of them may be critical. */
	if (o < olen && crit)
		return -1;
	return found;
}

/* geneve_decap takes a packet p (outer IPv4 or IPv6, UDP to GENEVE_PORT) that
 * reached the host device: Geneve to an address of this node is stripped
 * and handed to from_geneve (tail call, tdr_overlay_calls_v1), which
 * decides it; anything else it leaves to the host (-1). Returns the
 * verdict or -1. A global function. */
__attribute__((noinline)) int geneve_decap(struct __sk_buff *skb, const struct pkt *p)
{
	if (!skb || !p)
		return -1;
	if (p->nonfirst_frag || identity_of(p->family, p->daddr) != ID_HOST)
		return -1;
	__u32 off = p->l4_off + 8;
	__u8 g[GENEVE_HLEN];
	if (off > 0xff || bpf_skb_load_bytes(skb, off, g, GENEVE_HLEN))
		return drop(REASON_NO_TUNNEL_KEY, DIR_INGRESS, 0, p, 0, 0, 0);
	/* Version 0, an Ethernet frame inside. */
	if ((g[0] >> 6) || g[2] != (GENEVE_PROTO_ETH >> 8) || g[3] != (GENEVE_PROTO_ETH & 0xff))
		return drop(REASON_NO_TUNNEL_KEY, DIR_INGRESS, 0, p, 0, 0, 0);
	__u32 olen = (g[0] & 0x3f) * 4;
	int dsr = 0;
	if (olen) {
		dsr = geneve_opts(skb, off + GENEVE_HLEN, olen, g[1] & GENEVE_F_CRIT);
		if (dsr < 0)
			return drop(REASON_MALFORMED, DIR_INGRESS, 0, p, 0, 0, 0);
	}
	__u32 inner = off + GENEVE_HLEN + olen; /* the inner Ethernet header */
	__u8 proto[2];
	if (bpf_skb_load_bytes(skb, inner + 12, proto, 2))
		return drop(REASON_NO_TUNNEL_KEY, DIR_INGRESS, 0, p, 0, 0, 0);
	__u64 flags;
	if (proto[0] == 0x08 && proto[1] == 0x00)
		flags = BPF_F_ADJ_ROOM_DECAP_L3_IPV4;
	else if (proto[0] == 0x86 && proto[1] == 0xdd)
		flags = BPF_F_ADJ_ROOM_DECAP_L3_IPV6;
	else
		return drop(REASON_NO_TUNNEL_KEY, DIR_INGRESS, 0, p, 0, 0, 0);
	__u32 vni = ((__u32)g[4] << 16) | ((__u32)g[5] << 8) | g[6];
	/* Everything between the outer Ethernet header and the inner IP
	 * packet goes; the outer Ethernet header stays, its type the
	 * inner's. */
	if (bpf_skb_adjust_room(skb, -(__s32)inner, BPF_ADJ_ROOM_MAC, flags))
		return drop(REASON_NO_TUNNEL_KEY, DIR_INGRESS, 0, p, 0, 0, 0);
	if (bpf_skb_store_bytes(skb, 12, proto, 2, 0))
		return drop(REASON_NO_TUNNEL_KEY, DIR_INGRESS, 0, p, 0, 0, 0);
	if (p->family == FAMILY_V6) {
		/* The outer IPv6 source in four words of cb, the DSR flag
		 * in the mark (the VNI is not kept: the receiver decides on
		 * its ipcache). */
		const __u32 *a = __builtin_assume_aligned(p->saddr, 4);
		skb->cb[GENEVE_CB_OUTER] = a[0];
		skb->cb[GENEVE_CB_OUTER6_1] = a[1];
		skb->cb[GENEVE_CB_OUTER6_2] = a[2];
		skb->cb[GENEVE_CB_OUTER6_3] = a[3];
		skb->cb[GENEVE_CB_MARK] = dsr ? GENEVE_CB_MAGIC6_DSR : GENEVE_CB_MAGIC6;
	} else {
		skb->cb[GENEVE_CB_OUTER] = u32_at(p->saddr);
		skb->cb[GENEVE_CB_VNI] = vni;
		skb->cb[GENEVE_CB_MARK] = GENEVE_CB_MAGIC;
		skb->cb[GENEVE_CB_DSR] = dsr ? GENEVE_CB_DSR_MAGIC : 0;
	}
	bpf_tail_call(skb, &tdr_overlay_calls_v1, 0);
	/* No overlay program (the agent has not put it there): fail closed. */
	skb->cb[GENEVE_CB_MARK] = 0;
	return drop(REASON_NO_TUNNEL_KEY, DIR_INGRESS, 0, p, 0, 0, 0);
}

#endif
