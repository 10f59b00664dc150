/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: services for clients outside the cluster (IPv4),
 * in the host device programs (bpf_host.c). A packet arriving at a
 * node's uplink for a frontend marked SVC_F_EXTERNAL (a NodePort on this
 * node's address, an externalIP, a load-balancer address) is DNATed to a
 * backend chosen as the pod programs choose (lb.h: affinity, Maglev or
 * random; externalTrafficPolicy Local: among this node's backends only):
 *
 * - a backend on this node: only the destination changes; the host routes
 *   the packet to the pod, whose to_pod applies its ingress policy to the
 *   client's own address (world identity). The flow's conntrack entry
 *   (client <-> backend) carries the reverse NAT ID, so the pod's reply
 *   gets the frontend back as source when it leaves (nodeport_rev_out, in
 *   to_netdev).
 * - a backend on another node: the source becomes this node's address
 *   and a port of the masquerade range, from the masquerade NAT table and
 *   its port allocation (nat.h; the mapping is flagged NAT_F_NODEPORT),
 *   and the packet is sent on by a FIB lookup (the host would drop it: its
 *   source is a local address). The backend's reply comes back here, gets
 *   the client as destination (NAT table) and the frontend as source
 *   (conntrack's reverse NAT ID), and goes back out the same way.
 *
 * The conntrack entry of client <-> backend is what the agent's GC keeps
 * the NAT mapping by (pkg/datapath/maps CollectNAT). A known flow finds
 * its backend in tdr_lb4_flows_v1 first: no service lookup. */
#ifndef TDR_NODEPORT_H
#define TDR_NODEPORT_H

#include "lbnat.h"
#include "conntrack.h"
#include "nat.h"
#include "events.h"

#define AF_INET_ 2

/* nodeport_in's answer for a packet translated to another node's
 * backend: nodeport_snat must send it on (not a TC verdict). */
#define NODEPORT_NEEDS_SNAT 1000

/* nodeport_redirect sends a packet out of the device the FIB names for
 * its destination, with the next hop's MAC (or the kernel's neighbour
 * resolution when none is known yet). Returns the verdict, or -1 when
 * there is no route. A global function: its lookup's stack is not added
 * to its callers'. */
__attribute__((noinline)) int nodeport_redirect(struct __sk_buff *skb, const struct pkt *p)
{
	struct bpf_fib_lookup fib = {};

	if (!skb || !p)
		return -1;
	fib.family = AF_INET_;
	fib.l4_protocol = p->proto;
	fib.ipv4_src = u32_at(p->saddr);
	fib.ipv4_dst = u32_at(p->daddr);
	fib.ifindex = skb->ifindex;
	long r = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (r == BPF_FIB_LKUP_RET_SUCCESS) {
		if (bpf_skb_store_bytes(skb, 0, fib.dmac, ETH_ALEN, 0) ||
		    bpf_skb_store_bytes(skb, ETH_ALEN, fib.smac, ETH_ALEN, 0))
			return -1;
		return bpf_redirect(fib.ifindex, 0);
	}
	if (r == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = {.nh_family = AF_INET_, .ipv4_nh = fib.ipv4_dst};
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	return -1;
}

/* nodeport_source_allowed reports whether the client may use a frontend
 * with loadBalancerSourceRanges (rev_nat: the frontend's ID). */
static __always_inline int nodeport_source_allowed(const struct pkt *p, __u32 rev_nat)
{
	struct lb4_srcrange_key k = {.prefixlen = 32 + 32, .rev_nat_id = bpf_htonl(rev_nat)};

	__builtin_memcpy(k.addr, p->saddr, 4);
	return bpf_map_lookup_elem(&tdr_lb4_srcrange_v1, &k) != NULL;
}

/* nodeport_pick_local chooses, at random, one of this node's backends
 * (the external scope of an externalTrafficPolicy Local service: slots
 * count+1..count+local_count). 0: none. */
static __always_inline __u32 nodeport_pick_local(const struct lb_service *svc)
{
	__u32 n = svc->local_count;

	if (!n)
		return 0;
	struct lb_slot_key k = {.svc_id = svc->svc_id, .slot = svc->count + bpf_get_prandom_u32() % n + 1};
	__u32 *id = bpf_map_lookup_elem(&tdr_lb_slots_v1, &k);
	return id ? *id : 0;
}

/* The translation of one packet: what nodeport_in's helpers share. */
struct nodeport_ctx {
	struct lb4_flow_key fk;
	__u32 backend_id;
	__u32 rev_nat;
	__u8 svc_flags;
	__u8 pad[3];
};

/* nodeport_backend finds the backend of the packet's flow: its known
 * flow's (tdr_lb4_flows_v1, no service lookup), or a new pick when the
 * destination is an external frontend. Returns the backend, NULL with
 * *verdict -1 for a packet to no external frontend, or NULL with *verdict
 * set to minus a drop reason. */
static __always_inline const struct lb_backend *nodeport_backend(const struct pkt *p, struct nodeport_ctx *c, int *verdict)
{
	const struct lb_backend *be = NULL;

	*verdict = -1;
	__builtin_memcpy(c->fk.saddr, p->saddr, 4);
	__builtin_memcpy(c->fk.daddr, p->daddr, 4);
	c->fk.sport = p->sport;
	c->fk.dport = p->dport;
	c->fk.proto = p->proto;
	struct lb_flow *fl = bpf_map_lookup_elem(&tdr_lb4_flows_v1, &c->fk);
	if (fl) {
		/* Kept while the backend exists (a TCP connection drains on a
		 * removed one); a UDP "flow" on a removed one picks again. */
		c->backend_id = fl->backend_id;
		c->rev_nat = fl->rev_nat_id;
		be = bpf_map_lookup_elem(&tdr_lb_backends_v1, &c->backend_id);
		if (be && (be->state != BACKEND_REMOVED || p->proto == IPPROTO_TCP_) && be->family == FAMILY_V4)
			return be;
	}
	const struct lb_service *svc = lb4_lookup(p->daddr, p->dport, p->proto);
	if (!svc || !(svc->flags & SVC_F_EXTERNAL))
		return NULL;
	c->svc_flags = svc->flags;
	c->rev_nat = svc->rev_nat_id & (LB_MAX_IDS - 1);
	if ((svc->flags & SVC_F_SOURCE_RANGES) && !nodeport_source_allowed(p, c->rev_nat)) {
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
		struct lb_affinity_key ak = {.kind = AFFINITY_BY_V4};
		__builtin_memcpy(ak.client, p->saddr, 4);
		be = lb_pick(svc, &ak, lb_hash_tuple(p), &bid);
	}
	if (!be || be->family != FAMILY_V4) {
		*verdict = -REASON_SVC_NO_BACKEND;
		return NULL;
	}
	c->backend_id = bid;
	struct lb_flow v = {.backend_id = bid, .rev_nat_id = c->rev_nat};
	bpf_map_update_elem(&tdr_lb4_flows_v1, &c->fk, &v, BPF_ANY);
	return be;
}

/* nodeport_ct keeps the conntrack entry of client <-> backend (p already
 * DNATed) with the frontend's reverse NAT ID; local_backend: the backend's
 * side is this node's (its to_pod admits the flow and names itself). */
static __always_inline void nodeport_ct(const struct pkt *p, __u32 rev_nat, int local_backend)
{
	struct flow f;

	flow_of(&f, p);
	struct ct_entry *e = ct_find(&f, p);
	if (e) {
		if (e->rev_nat != rev_nat)
			e->rev_nat = rev_nat;
		ct_update(e, &f, p);
		return;
	}
	/* The client (the packet's source) is never local. */
	__u32 not_local = f.src_is_a ? CT_F_A_NOT_LOCAL : CT_F_B_NOT_LOCAL;
	if (!local_backend)
		not_local = CT_F_A_NOT_LOCAL | CT_F_B_NOT_LOCAL;
	ct_create(&f, p, 0, 0, not_local | (rev_nat << CT_REV_NAT_SHIFT));
}

/* nodeport_in translates a packet from outside to an external frontend
 * of this node (see above). Returns the verdict, NODEPORT_NEEDS_SNAT for
 * a packet to another node's backend (nodeport_snat's), or -1 for a
 * packet that is none of its business (unchanged). A global function: verified once,
 * on its own. */
__attribute__((noinline)) int nodeport_in(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return -1;
	if (p->proto != IPPROTO_TCP_ && p->proto != IPPROTO_UDP_)
		return -1;
	struct nodeport_ctx c = {};
	int verdict;
	const struct lb_backend *be = nodeport_backend(p, &c, &verdict);
	if (!be) {
		if (verdict == -1)
			return -1;
		return drop((__u8)-verdict, DIR_INGRESS, 0, p, 0, 0, 0);
	}
	__u8 baddr[4];
	__be16 bport = be->port;
	__builtin_memcpy(baddr, be->addr, 4);
	if (nat_rewrite(skb, p, 1, baddr, bport))
		return drop(REASON_NAT_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	__builtin_memcpy(p->daddr, baddr, 4);
	p->dport = bport;
	p->pport = bport;
	int local = endpoint_by_addr(FAMILY_V4, baddr) != NULL;
	nodeport_ct(p, c.rev_nat, local);
	count(REASON_NODEPORT, DIR_INGRESS, p->len);
	return local ? TC_ACT_OK : NODEPORT_NEEDS_SNAT;
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
	__u32 ifindex = skb->ifindex;
	const struct hostdev_info *dev = bpf_map_lookup_elem(&tdr_hostdev_v1, &ifindex);
	if (!dev || !u32_at(dev->ipv4))
		return drop(REASON_MASQ_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	struct masq_scratch *s = masq_request(p, FAMILY_V4, dev->ipv4, NAT_F_NODEPORT);
	if (!s)
		return drop(REASON_MASQ_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	if (!masq_mapped(s, FAMILY_V4)) {
		int r = masq_alloc4(skb);
		if (r < 0)
			return drop((__u8)-r, DIR_INGRESS, 0, p, 0, 0, 0);
	}
	if (masq_rewrite(skb, p, FAMILY_V4, 0, s->r.node, s->r.port))
		return drop(REASON_MASQ_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	__builtin_memcpy(p->saddr, s->r.node, 4);
	p->sport = s->r.port;
	int ret = nodeport_redirect(skb, p);
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
	int ret = nodeport_redirect(skb, p);
	if (ret < 0)
		return drop(REASON_NODEPORT_NO_ROUTE, DIR_INGRESS, 0, p, 0, 0, 0);
	return ret;
}

/* nodeport_rev_out gives a local backend's reply to an outside client
 * (leaving through the device, p from a local endpoint) the frontend as
 * its source, before masquerade would translate it. Returns 1 when it
 * did, 0 for a packet of no such flow, or minus a drop reason. */
static __always_inline int nodeport_rev_out(struct __sk_buff *skb, struct pkt *p)
{
	if (p->proto != IPPROTO_TCP_ && p->proto != IPPROTO_UDP_)
		return 0;
	struct flow f;
	flow_of(&f, p);
	struct ct_entry *e = ct_find(&f, p);
	if (!e || !e->rev_nat || !ct_is_reply(e, &f))
		return 0;
	int r = lb_rev_snat(skb, p, e->rev_nat);
	if (r < 0)
		return r;
	count(REASON_NODEPORT_REPLY, DIR_EGRESS, p->len);
	return 1;
}

#endif
