/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: direct server return for services from outside
 * (--bpf-lb-mode=dsr, LB_DSR). The frontend travels to the backend's node
 * in an IPv4 option of the packet, or, when the backend's node is reached
 * through Geneve in eBPF (geneve.h), in a Geneve option of either family:
 * IPv6 DSR exists only that way (IPv6 has no counterpart of the IPv4
 * option here; VXLAN has no options). Both sides are in this file:
 *
 * - the node the client's packet reaches (nodeport_in, nodeport.h, for a
 *   backend on another node): the client's source is kept and the
 *   frontend is written into the option (nodeport_dsr), and the packet is
 *   sent on by FIB lookup;
 * - the backend's node records the frontend of the flow (nodeport_dsr_recv,
 *   tdr_dsr4_v1) and gives the backend's replies the frontend as source as
 *   they leave its uplink (nodeport_dsr_rev, from nodeport_rev_out),
 *   straight to the client: the replies never come back through the first
 *   node. */
#ifndef TDR_NODEPORT_DSR_H
#define TDR_NODEPORT_DSR_H

#include "lbnat.h"
#include "nat.h"
#include "events.h"
#include "fib.h"
#include "geneve.h"

/* nodeport_dsr's answer for a packet DSR cannot carry: it goes the SNAT
 * way (nodeport.h's NODEPORT_NEEDS_SNAT is this value; not a TC verdict). */
#define DSR_NEEDS_SNAT 1000
/* nodeport_in's answer for a DSR packet to a backend reached through
 * Geneve in eBPF: nodeport_dsr_geneve must send it (not a TC verdict). */
#define DSR_NEEDS_GENEVE 1001

/* LB_DSR: 1 with --bpf-lb-mode=dsr, set by the agent at load. Both sides
 * of direct server return follow it: a node in snat mode neither writes
 * the option nor honours one it receives (an outside sender could
 * otherwise choose the source of a pod's replies), so every node of a
 * cluster runs the same mode, as with Cilium's. */
volatile const __u8 LB_DSR = 0;

/* The IPv4 option that carries a DSR flow's frontend to the backend's
 * node: type 0x9a (the copied flag and number 26, the value Cilium's
 * datapath uses, so that captures read alike), length 8, the frontend's
 * port, then its address, both in network byte order. */
#define DSR_OPT_TYPE 0x9a
#define DSR_OPT_LEN 8
/* An IPv4 header is at most 60 bytes (IHL 15). */
#define IPV4_MAX_HLEN 60

/* nodeport_dsr_fits reports whether the packet, DSR_OPT_LEN bytes longer,
 * still fits the MTU of the route to its destination (the FIB's check of
 * tot_len against the route's or its device's MTU). A global function:
 * its lookup's stack is not added to nodeport_dsr's, which calls
 * fib_redirect4 (another) at the end of a chain of calls. */
__attribute__((noinline)) int nodeport_dsr_fits(struct __sk_buff *skb, const struct pkt *p)
{
	struct bpf_fib_lookup fib = {};

	if (!skb || !p)
		return 0;
	fib.family = AF_INET_;
	fib.l4_protocol = p->proto;
	fib.ipv4_src = u32_at(p->saddr);
	fib.ipv4_dst = u32_at(p->daddr);
	fib.ifindex = skb->ifindex;
	fib.tot_len = p->l3_end - ETH_HLEN + DSR_OPT_LEN;
	return bpf_fib_lookup(skb, &fib, sizeof(fib), 0) != BPF_FIB_LKUP_RET_FRAG_NEEDED;
}

/* nodeport_dsr_client reports whether the packet's client may be served
 * by DSR: not one inside the cluster (a pod, a node: the ipcache knows
 * it), which goes the SNAT way, since the backend's reply to a client
 * beside it (a pod or the host of the backend's node) never leaves that
 * node through its uplink, where the frontend would be put back. A global
 * function: its ipcache key is not on nodeport_dsr's stack. */
__attribute__((noinline)) int nodeport_dsr_client(const struct pkt *p)
{
	if (!p)
		return 0;
	return !in_cluster_peer(identity_of(FAMILY_V4, p->saddr));
}

/* nodeport_dsr_opt inserts the DSR option (frontend fe_addr, a word in
 * network byte order, and fe_port) right after the fixed part of the
 * IPv4 header, where bpf_skb_adjust_room's network-layer room goes
 * (ahead of any option the packet had), and fixes the header length,
 * the total length and the header checksum. The L4 checksum covers none
 * of them: its pseudo-header has the L4 length. p follows the move.
 * Returns 0, 1 when the packet is unchanged (no room could be made: a
 * GSO UDP datagram, say), or -1 when it was not wholly rewritten. */
static __always_inline int nodeport_dsr_opt(struct __sk_buff *skb, struct pkt *p, __u32 fe_addr, __be16 fe_port)
{
	__u8 *h = hdr(skb, p, ETH_HLEN, 4);
	if (!h)
		return 1;
	__u32 old_w = u32_at(h);
	__u8 w[4] = {h[0] + DSR_OPT_LEN / 4, h[1]};
	__u16 tot = (((__u16)h[2] << 8) | h[3]) + DSR_OPT_LEN;
	w[2] = tot >> 8;
	w[3] = tot & 0xff;
	__u32 new_w = u32_at(w);
	__u32 opt[2];
	__u8 *o = (__u8 *)opt;
	o[0] = DSR_OPT_TYPE;
	o[1] = DSR_OPT_LEN;
	__builtin_memcpy(&o[2], &fe_port, 2);
	opt[1] = fe_addr;
	if (bpf_skb_adjust_room(skb, DSR_OPT_LEN, BPF_ADJ_ROOM_NET, 0))
		return 1;
	p->l3_end += DSR_OPT_LEN;
	p->l4_off += DSR_OPT_LEN;
	p->len += DSR_OPT_LEN;
	__s64 d = bpf_csum_diff(&old_w, 4, &new_w, 4, 0);
	if (d < 0)
		return -1;
	d = bpf_csum_diff(NULL, 0, opt, DSR_OPT_LEN, (__wsum)d);
	if (d < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, ETH_HLEN + 20, opt, DSR_OPT_LEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &new_w, 4, 0) || bpf_l3_csum_replace(skb, ETH_HLEN + 10, 0, d, 0))
		return -1;
	return 0;
}

/* nodeport_dsr sends a packet nodeport_in translated to another node's
 * backend (p: already DNATed; the client's source kept) to that node by
 * a FIB lookup, as nodeport_snat does. The frontend (fe_addr, fe_port)
 * rides in the DSR option on the packets that may start the flow at the
 * backend's node: a TCP SYN, and every UDP datagram (UDP has no start
 * the backend's node could tell, and a datagram's option refreshes the
 * record). The option must fit the path:
 * - a UDP datagram it would push over the MTU (or past the 60-byte
 *   header, or that has no room for it: a GSO datagram) goes the SNAT
 *   way instead (DSR_NEEDS_SNAT): the client still gets its reply from
 *   the frontend, through this node;
 * - a TCP SYN (tens of bytes: only a link MTU below ~100 does this) is
 *   dropped with REASON_DSR_MTU_EXCEEDED; a flow's later segments carry
 *   no option, so a TCP flow must start as DSR or not at all.
 * Clients inside the cluster are sent the SNAT way (see below).
 * Returns the verdict or DSR_NEEDS_SNAT. A global function. */
__attribute__((noinline)) int nodeport_dsr(struct __sk_buff *skb, struct pkt *p, __u32 fe_addr, __u32 fe_port)
{
	if (!skb || !p)
		return TC_ACT_OK;
	if (!nodeport_dsr_client(p))
		return DSR_NEEDS_SNAT;
	int udp = p->proto == IPPROTO_UDP_;
	if (udp || (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
		int room = p->l4_off - ETH_HLEN + DSR_OPT_LEN <= IPV4_MAX_HLEN;
		if (!room || !nodeport_dsr_fits(skb, p)) {
			if (udp)
				return DSR_NEEDS_SNAT;
			return drop(REASON_DSR_MTU_EXCEEDED, DIR_INGRESS, 0, p, 0, 0, 0);
		}
		int r = nodeport_dsr_opt(skb, p, fe_addr, (__be16)fe_port);
		if (r == 1 && udp)
			return DSR_NEEDS_SNAT;
		if (r)
			return drop(REASON_NAT_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	}
	/* Counted as REASON_NODEPORT by nodeport_in; no NAT mapping tells
	 * DSR flows apart (the reasons below REASON_POLICY_DENIED are full). */
	int ret = fib_redirect4(skb, p);
	if (ret < 0)
		return drop(REASON_NODEPORT_NO_ROUTE, DIR_INGRESS, 0, p, 0, 0, 0);
	return ret;
}

/* nodeport_dsr_record4 records the frontend v (its addr and port; created
 * set) of the DSR flow of p, when p's destination is a local endpoint.
 * Returns 1 when it did, else 0. */
static __always_inline int nodeport_dsr_record4(const struct pkt *p, const struct dsr4_entry *v)
{
	if (!endpoint_by_addr(FAMILY_V4, p->daddr))
		return 0;
	struct dsr4_key k = {.client_port = p->sport, .backend_port = p->dport, .proto = p->proto};
	__builtin_memcpy(k.client, p->saddr, 4);
	__builtin_memcpy(k.backend, p->daddr, 4);
	/* Written when new or changed only: every UDP datagram carries it. */
	struct dsr4_entry *cur = bpf_map_lookup_elem(&tdr_dsr4_v1, &k);
	if (!cur || u32_at(cur->addr) != u32_at(v->addr) || cur->port != v->port)
		bpf_map_update_elem(&tdr_dsr4_v1, &k, v, BPF_ANY);
	return 1;
}

/* nodeport_dsr_recv, on a backend's node, records the frontend a DSR
 * packet (one with the option first among its IPv4 options) carries for
 * its flow, when the destination is a local endpoint. The packet goes
 * on to the pod as it is: Linux passes an IPv4 option it does not know
 * on a received or forwarded packet, and the pod's to_pod sees the
 * client's own address. Returns 1 for a DSR packet, else 0. */
static __always_inline int nodeport_dsr_recv(struct __sk_buff *skb, const struct pkt *p)
{
	__u8 *o = hdr(skb, p, ETH_HLEN + 20, DSR_OPT_LEN);
	if (!o || o[0] != DSR_OPT_TYPE || o[1] != DSR_OPT_LEN)
		return 0;
	struct dsr4_entry v = {.created = p->now};
	__builtin_memcpy(&v.port, &o[2], 2);
	__builtin_memcpy(v.addr, &o[4], 4);
	return nodeport_dsr_record4(p, &v);
}

/* nodeport_dsr_record6 is nodeport_dsr_record4 for IPv6 (tdr_dsr6_v1),
 * the frontend fe (16 bytes) and fe_port. */
static __always_inline int nodeport_dsr_record6(const struct pkt *p, const __u8 *fe, __be16 fe_port)
{
	if (!endpoint_by_addr(FAMILY_V6, p->daddr))
		return 0;
	struct dsr6_entry v = {.created = p->now, .port = fe_port};
	__builtin_memcpy(v.addr, fe, 16);
	struct dsr6_key k = {.client_port = p->sport, .backend_port = p->dport, .proto = p->proto};
	__builtin_memcpy(k.client, p->saddr, 16);
	__builtin_memcpy(k.backend, p->daddr, 16);
	struct dsr6_entry *cur = bpf_map_lookup_elem(&tdr_dsr6_v1, &k);
	if (!cur || cur->port != v.port || u32_at(&cur->addr[0]) != u32_at(&v.addr[0]) ||
	    u32_at(&cur->addr[4]) != u32_at(&v.addr[4]) || u32_at(&cur->addr[8]) != u32_at(&v.addr[8]) ||
	    u32_at(&cur->addr[12]) != u32_at(&v.addr[12]))
		bpf_map_update_elem(&tdr_dsr6_v1, &k, &v, BPF_ANY);
	return 1;
}

/* geneve_dsr_recv, on a backend's node, records the frontend of the
 * Geneve DSR option geneve_decap left in tdr_geneve_dsr_v1 for the
 * decapsulated packet p (from_geneve, cb said so): the option's family
 * must be the packet's. Returns 1 when recorded, else 0. A global
 * function: its keys are not on overlay_in's stack. */
__attribute__((noinline)) int geneve_dsr_recv(const struct pkt *p)
{
	__u32 zero = 0;

	if (!p || (p->proto != IPPROTO_TCP_ && p->proto != IPPROTO_UDP_))
		return 0;
	struct geneve_dsr_scratch *s = bpf_map_lookup_elem(&tdr_geneve_dsr_v1, &zero);
	if (!s)
		return 0;
	/* opt: the option header (4), the address, the port. */
	if (s->len == GENEVE_OPT_DSR4_LEN && p->family == FAMILY_V4) {
		struct dsr4_entry v = {.created = p->now};
		__builtin_memcpy(v.addr, &s->opt[4], 4);
		__builtin_memcpy(&v.port, &s->opt[8], 2);
		return nodeport_dsr_record4(p, &v);
	}
	if (s->len == GENEVE_OPT_DSR6_LEN && p->family == FAMILY_V6) {
		__be16 port;
		__builtin_memcpy(&port, &s->opt[20], 2);
		return nodeport_dsr_record6(p, &s->opt[4], port);
	}
	return 0;
}

/* nodeport_dsr_rev gives a backend's reply to a DSR flow's client
 * (leaving through the device, p from a local endpoint) the frontend
 * recorded for the flow as its source. Returns 1 when it did, 0 for a
 * packet of no DSR flow, or minus a drop reason. */
static __always_inline int nodeport_dsr_rev(struct __sk_buff *skb, struct pkt *p)
{
	struct dsr4_key k = {.client_port = p->dport, .backend_port = p->sport, .proto = p->proto};
	__builtin_memcpy(k.client, p->daddr, 4);
	__builtin_memcpy(k.backend, p->saddr, 4);
	struct dsr4_entry *e = bpf_map_lookup_elem(&tdr_dsr4_v1, &k);
	if (!e)
		return 0;
	__u8 fe[16] = {};
	__builtin_memcpy(fe, e->addr, 4);
	__be16 port = e->port;
	if (nat_rewrite(skb, p, 0, fe, port))
		return -REASON_NAT_FAILED;
	__builtin_memcpy(p->saddr, fe, 4);
	p->sport = port;
	count(REASON_NODEPORT_REPLY, DIR_EGRESS, p->len);
	return 1;
}

/* nodeport_dsr_rev6 is nodeport_dsr_rev for IPv6 (tdr_dsr6_v1): a
 * global function, its key off to_netdev6's stack. */
__attribute__((noinline)) int nodeport_dsr_rev6(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return 0;
	struct dsr6_key k = {.client_port = p->dport, .backend_port = p->sport, .proto = p->proto};
	__builtin_memcpy(k.client, p->daddr, 16);
	__builtin_memcpy(k.backend, p->saddr, 16);
	struct dsr6_entry *e = bpf_map_lookup_elem(&tdr_dsr6_v1, &k);
	if (!e)
		return 0;
	__u8 fe[16] __attribute__((aligned(4)));
	__builtin_memcpy(fe, e->addr, 16);
	__be16 port = e->port;
	if (nat_rewrite(skb, p, 0, fe, port))
		return -REASON_NAT_FAILED;
	__builtin_memcpy(p->saddr, fe, 16);
	p->sport = port;
	count(REASON_NODEPORT_REPLY, DIR_EGRESS, p->len);
	return 1;
}

/* nodeport_dsr_geneve_prep decides, in nodeport_in for a packet it
 * translated to another node's backend (p: DNATed; fk4 or fk6, by p's
 * family, the flow key with the frontend as destination), whether DSR
 * goes through Geneve in eBPF: the backend's owner node is reached by it
 * (an IPv4 or IPv6 underlay) and the client is outside the cluster (as
 * nodeport_dsr_client). If so, it writes the DSR option into
 * tdr_geneve_dsr_v1 for nodeport_dsr_geneve, for a TCP SYN and every UDP
 * datagram (as the IPv4 option: the packets that may start the flow at
 * the backend's node), an empty one for the rest, and returns 1; else 0.
 * A global function: its ipcache key is not on nodeport_in's stack. */
__attribute__((noinline)) int nodeport_dsr_geneve_prep(const struct pkt *p, const struct lb4_flow_key *fk4,
						       const struct lb6_flow_key *fk6)
{
	__u32 zero = 0;

	if (!p || !geneve_bpf())
		return 0;
	if (in_cluster_peer(identity_of(p->family, p->saddr)))
		return 0;
	struct ipcache_key k = {};
	k.family = p->family;
	k.prefixlen = 32 + (p->family == FAMILY_V4 ? 32 : 128);
	__builtin_memcpy(k.addr, __builtin_assume_aligned(p->daddr, 4), 16);
	struct ipcache_info *info = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
	if (!info || (info->tunnel_family != FAMILY_V4 && info->tunnel_family != FAMILY_V6))
		return 0;
	struct geneve_dsr_scratch *s = bpf_map_lookup_elem(&tdr_geneve_dsr_v1, &zero);
	if (!s)
		return 0;
	s->len = 0;
	if (p->proto != IPPROTO_UDP_ && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
		return 1;
	s->opt[0] = GENEVE_OPT_CLASS_DSR >> 8;
	s->opt[1] = GENEVE_OPT_CLASS_DSR & 0xff;
	s->opt[2] = GENEVE_OPT_TYPE_DSR;
	if (p->family == FAMILY_V6) {
		if (!fk6)
			return 0;
		s->opt[3] = (GENEVE_OPT_DSR6_LEN - 4) / 4;
		__builtin_memcpy(&s->opt[4], fk6->daddr, 16);
		__builtin_memcpy(&s->opt[20], &fk6->dport, 2);
		s->opt[22] = 0;
		s->opt[23] = 0;
		s->len = GENEVE_OPT_DSR6_LEN;
		return 1;
	}
	if (!fk4)
		return 0;
	s->opt[3] = (GENEVE_OPT_DSR4_LEN - 4) / 4;
	__builtin_memcpy(&s->opt[4], fk4->daddr, 4);
	__builtin_memcpy(&s->opt[8], &fk4->dport, 2);
	s->opt[10] = 0;
	s->opt[11] = 0;
	s->len = GENEVE_OPT_DSR4_LEN;
	return 1;
}

/* nodeport_dsr_geneve sends a DSR packet nodeport_dsr_geneve_prep chose
 * (p: DNATed to another node's backend, the client's source kept) to the
 * backend's node in Geneve, with the option it prepared, the client's
 * identity (the world's) in the VNI. An option that would push a UDP
 * datagram over the route's MTU sends it the SNAT way instead
 * (DSR_NEEDS_SNAT), a TCP SYN is dropped (REASON_DSR_MTU_EXCEEDED), as
 * nodeport_dsr does with the IPv4 option. Returns the verdict or
 * DSR_NEEDS_SNAT. A global function, called by from_netdev itself: its
 * stack and geneve_encap_dsr's are not added to nodeport_in's. */
__attribute__((noinline)) int nodeport_dsr_geneve(struct __sk_buff *skb, struct pkt *p)
{
	__u32 zero = 0;

	if (!skb || !p)
		return TC_ACT_OK;
	struct geneve_dsr_scratch *s = bpf_map_lookup_elem(&tdr_geneve_dsr_v1, &zero);
	if (!s)
		return drop(REASON_NAT_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	__u32 id = identity_of(p->family, p->saddr);
	int r = geneve_encap_dsr(skb, p, id, s->len ? s : NULL);
	if (r == GENEVE_UNDERLAY6)
		r = geneve_encap6_dsr(skb, p, id, s->len ? s : NULL);
	if (r >= 0)
		return r;
	if (r == -3) {
		if (p->proto == IPPROTO_UDP_)
			return DSR_NEEDS_SNAT;
		return drop(REASON_DSR_MTU_EXCEEDED, DIR_INGRESS, 0, p, 0, 0, 0);
	}
	if (r == -1)
		return drop(REASON_NODEPORT_NO_ROUTE, DIR_INGRESS, 0, p, 0, 0, 0);
	return drop(REASON_NAT_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
}

#endif
