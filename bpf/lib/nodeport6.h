/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: services for clients outside the cluster over IPv6,
 * in the host device programs (bpf_host.c): the same steps as nodeport.h's
 * IPv4 path (read its comment first), over the IPv6 maps: frontends in
 * tdr_lb6_services_v1, known flows in tdr_lb6_flows_v1, source ranges in
 * tdr_lb6_srcrange_v1, a remote backend's mapping in tdr_nat6_v1 (flagged
 * NAT_F_NODEPORT, its port from masq_alloc6) and the FIB lookup of
 * AF_INET6. What does not depend on the family is nodeport.h's own
 * (nodeport_pick_local, nodeport_ct, nodeport_rev_out, lb_rev_snat).
 *
 * Why not the IPv4 functions with a family argument, as nat.h does: the
 * IPv4 functions are where DSR is being added, and each is a global
 * function verified once; a family argument would make each verify both
 * families' branches (their address sizes and maps differ at every step)
 * or be split into two globals anyway. The IPv6 path is thus its own set
 * of global functions, each verified once, which leaves the IPv4 path's
 * verification as it was. */
#ifndef TDR_NODEPORT6_H
#define TDR_NODEPORT6_H

#include "nodeport.h"

#define AF_INET6_ 10

/* nodeport_redirect6 is nodeport_redirect for IPv6: the packet goes out
 * of the device the FIB names for its destination, with the next hop's
 * MAC, or by the kernel's neighbour discovery when none is known yet.
 * Returns the verdict, or -1 when there is no route. */
__attribute__((noinline)) int nodeport_redirect6(struct __sk_buff *skb, const struct pkt *p)
{
	struct bpf_fib_lookup fib = {};

	if (!skb || !p)
		return -1;
	fib.family = AF_INET6_;
	fib.l4_protocol = p->proto;
	__builtin_memcpy(fib.ipv6_src, p->saddr, 16);
	__builtin_memcpy(fib.ipv6_dst, p->daddr, 16);
	fib.ifindex = skb->ifindex;
	long r = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (r == BPF_FIB_LKUP_RET_SUCCESS) {
		if (bpf_skb_store_bytes(skb, 0, fib.dmac, ETH_ALEN, 0) ||
		    bpf_skb_store_bytes(skb, ETH_ALEN, fib.smac, ETH_ALEN, 0))
			return -1;
		return bpf_redirect(fib.ifindex, 0);
	}
	if (r == BPF_FIB_LKUP_RET_NO_NEIGH) {
		/* The FIB gave the next hop (the gateway, or the destination
		 * when on-link) in ipv6_dst. */
		struct bpf_redir_neigh nh = {.nh_family = AF_INET6_};
		__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16);
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	return -1;
}

/* nodeport_source_allowed6 reports whether the client may use a frontend
 * with loadBalancerSourceRanges (rev_nat: the frontend's ID). */
static __always_inline int nodeport_source_allowed6(const struct pkt *p, __u32 rev_nat)
{
	struct lb6_srcrange_key k = {.prefixlen = 32 + 128, .rev_nat_id = bpf_htonl(rev_nat)};

	__builtin_memcpy(k.addr, p->saddr, 16);
	return bpf_map_lookup_elem(&tdr_lb6_srcrange_v1, &k) != NULL;
}

/* The translation of one IPv6 packet: what nodeport_in6's steps share. */
struct nodeport6_ctx {
	struct lb6_flow_key fk;
	__u32 backend_id;
	__u32 rev_nat;
};

/* nodeport_backend6 is nodeport_backend for IPv6: the backend of the
 * packet's known flow, or a new pick when the destination is an external
 * frontend. Returns the backend, NULL with *verdict -1 for a packet to no
 * external frontend, or NULL with *verdict set to minus a drop reason. */
static __always_inline const struct lb_backend *nodeport_backend6(const struct pkt *p, struct nodeport6_ctx *c,
								   int *verdict)
{
	const struct lb_backend *be = NULL;

	*verdict = -1;
	__builtin_memcpy(c->fk.saddr, p->saddr, 16);
	__builtin_memcpy(c->fk.daddr, p->daddr, 16);
	c->fk.sport = p->sport;
	c->fk.dport = p->dport;
	c->fk.proto = p->proto;
	struct lb_flow *fl = bpf_map_lookup_elem(&tdr_lb6_flows_v1, &c->fk);
	if (fl) {
		/* As IPv4: kept while the backend exists (a TCP connection
		 * drains on a removed one); UDP on a removed one picks again. */
		c->backend_id = fl->backend_id;
		c->rev_nat = fl->rev_nat_id;
		be = bpf_map_lookup_elem(&tdr_lb_backends_v1, &c->backend_id);
		if (be && (be->state != BACKEND_REMOVED || p->proto == IPPROTO_TCP_) && be->family == FAMILY_V6)
			return be;
	}
	const struct lb_service *svc = lb6_lookup(p->daddr, p->dport, p->proto);
	if (!svc || !(svc->flags & SVC_F_EXTERNAL))
		return NULL;
	c->rev_nat = svc->rev_nat_id & (LB_MAX_IDS - 1);
	if ((svc->flags & SVC_F_SOURCE_RANGES) && !nodeport_source_allowed6(p, c->rev_nat)) {
		*verdict = -REASON_SOURCE_RANGE_DENIED;
		return NULL;
	}
	__u32 bid = 0;
	if (svc->flags & SVC_F_EXT_LOCAL) {
		bid = nodeport_pick_local(svc);
		if (!bid) {
			*verdict = -REASON_SVC_NO_LOCAL_BACKEND;
			return NULL;
		}
		be = bpf_map_lookup_elem(&tdr_lb_backends_v1, &bid);
	} else {
		struct lb_affinity_key ak = {.kind = AFFINITY_BY_V6};
		__builtin_memcpy(ak.client, p->saddr, 16);
		be = lb_pick(svc, &ak, lb_hash_tuple(p), &bid);
	}
	if (!be || be->family != FAMILY_V6) {
		*verdict = -REASON_SVC_NO_BACKEND;
		return NULL;
	}
	c->backend_id = bid;
	struct lb_flow v = {.backend_id = bid, .rev_nat_id = c->rev_nat};
	bpf_map_update_elem(&tdr_lb6_flows_v1, &c->fk, &v, BPF_ANY);
	return be;
}

/* nodeport_in6 is nodeport_in for IPv6: translates a packet from outside
 * to an external frontend of this node. Returns the verdict,
 * NODEPORT_NEEDS_SNAT for a packet to another node's backend
 * (nodeport_snat6's), or -1 for a packet that is none of its business
 * (unchanged). */
__attribute__((noinline)) int nodeport_in6(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return -1;
	if (p->proto != IPPROTO_TCP_ && p->proto != IPPROTO_UDP_)
		return -1;
	struct nodeport6_ctx c = {};
	int verdict;
	const struct lb_backend *be = nodeport_backend6(p, &c, &verdict);
	if (!be) {
		if (verdict == -1)
			return -1;
		return drop((__u8)-verdict, DIR_INGRESS, 0, p, 0, 0, 0);
	}
	__u8 baddr[16] __attribute__((aligned(4)));
	__be16 bport = be->port;
	__builtin_memcpy(baddr, be->addr, 16);
	if (nat_rewrite(skb, p, 1, baddr, bport))
		return drop(REASON_NAT_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	__builtin_memcpy(p->daddr, baddr, 16);
	p->dport = bport;
	p->pport = bport;
	int local = endpoint_by_addr(FAMILY_V6, baddr) != NULL;
	nodeport_ct(p, c.rev_nat, local);
	count(REASON_NODEPORT, DIR_INGRESS, p->len);
	return local ? TC_ACT_OK : NODEPORT_NEEDS_SNAT;
}

/* nodeport_snat_family is nodeport_snat and nodeport_snat6 (family a
 * constant: each global function is its own copy). */
static __always_inline int nodeport_snat_family(struct __sk_buff *skb, struct pkt *p, const __u8 family)
{
	__u32 ifindex = skb->ifindex;
	const struct hostdev_info *dev = bpf_map_lookup_elem(&tdr_hostdev_v1, &ifindex);
	if (!dev || (family == FAMILY_V6 ? !(dev->flags & HOSTDEV_F_MASQ_V6) : !u32_at(dev->ipv4)))
		return drop(REASON_MASQ_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	struct masq_scratch *s = masq_request(p, family, family == FAMILY_V6 ? dev->ipv6 : dev->ipv4, NAT_F_NODEPORT);
	if (!s)
		return drop(REASON_MASQ_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	if (!masq_mapped(s, family)) {
		int r = family == FAMILY_V6 ? masq_alloc6(skb) : masq_alloc4(skb);
		if (r < 0)
			return drop((__u8)-r, DIR_INGRESS, 0, p, 0, 0, 0);
	}
	if (masq_rewrite(skb, p, family, 0, s->r.node, s->r.port))
		return drop(REASON_MASQ_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	if (family == FAMILY_V6)
		__builtin_memcpy(p->saddr, s->r.node, 16);
	else
		__builtin_memcpy(p->saddr, s->r.node, 4);
	p->sport = s->r.port;
	int ret = family == FAMILY_V6 ? nodeport_redirect6(skb, p) : nodeport_redirect(skb, p);
	if (ret < 0)
		return drop(REASON_NODEPORT_NO_ROUTE, DIR_INGRESS, 0, p, 0, 0, 0);
	return ret;
}

/* nodeport_snat sends a packet nodeport_in translated to another node's
 * backend (p: already DNATed) on with this node's address and a port of
 * the masquerade range as its source, so that the reply comes back through
 * here. A global function: its stack (and masq_alloc4's) is not added to
 * nodeport_in's. */
__attribute__((noinline)) int nodeport_snat(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	return nodeport_snat_family(skb, p, FAMILY_V4);
}

/* nodeport_snat6 is nodeport_snat for IPv6: the packet nodeport_in6
 * translated to another node's backend leaves with the node's IPv6
 * address and a port of the masquerade range (tdr_nat6_v1, flagged
 * NAT_F_NODEPORT), sent on by the FIB. */
__attribute__((noinline)) int nodeport_snat6(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	return nodeport_snat_family(skb, p, FAMILY_V6);
}

/* nodeport_reply_family is nodeport_reply and nodeport_reply6. */
static __always_inline int nodeport_reply_family(struct __sk_buff *skb, struct pkt *p, const __u8 family)
{
	struct flow f;
	flow_of(&f, p);
	struct ct_entry *e = ct_find(&f, p);
	if (!e || !e->rev_nat)
		return drop(REASON_NAT_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	ct_update(e, &f, p);
	int r = lb_rev_snat(skb, p, e->rev_nat);
	if (r < 0)
		return drop((__u8)-r, DIR_INGRESS, 0, p, 0, 0, 0);
	count(REASON_NODEPORT_REPLY, DIR_EGRESS, p->len);
	int ret = family == FAMILY_V6 ? nodeport_redirect6(skb, p) : nodeport_redirect(skb, p);
	if (ret < 0)
		return drop(REASON_NODEPORT_NO_ROUTE, DIR_INGRESS, 0, p, 0, 0, 0);
	return ret;
}

/* nodeport_reply finishes a remote backend's reply whose destination the
 * NAT table just gave back (the client's, in p): the frontend becomes
 * its source (the conntrack entry's reverse NAT ID) and it goes back out
 * to the client. A global function. */
__attribute__((noinline)) int nodeport_reply(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	return nodeport_reply_family(skb, p, FAMILY_V4);
}

/* nodeport_reply6 is nodeport_reply for IPv6: a remote backend's reply
 * whose destination the NAT table just gave back (the client's, in p) gets
 * the frontend as its source and goes back out to the client. */
__attribute__((noinline)) int nodeport_reply6(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	return nodeport_reply_family(skb, p, FAMILY_V6);
}

#endif
