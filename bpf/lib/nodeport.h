/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: services for clients outside the cluster, in the host
 * device programs (bpf_host.c), IPv4 and IPv6. A packet arriving at a
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
 *   and the packet is sent on by a FIB lookup (fib.h; the host would drop
 *   it: its source is a local address). The backend's reply comes back
 *   here, gets the client as destination (NAT table) and the frontend as
 *   source (conntrack's reverse NAT ID), and goes back out the same way.
 * - a backend on another node, with direct server return
 *   (--bpf-lb-mode=dsr, LB_DSR): the client's source is kept and the
 *   frontend travels to the backend's node in an IPv4 option, or in a
 *   Geneve option when Geneve in eBPF reaches that node (either family),
 *   or over IPv6 in a Destination Options extension header (nodeport_dsr.h).
 *
 * The conntrack entry of client <-> backend is what the agent's GC keeps
 * the NAT mapping by (pkg/datapath/maps CollectNAT). A known flow finds
 * its backend in the family's flows map (tdr_lb4_flows_v1,
 * tdr_lb6_flows_v1) first: no service lookup.
 *
 * Both families take the same steps, written once as nat.h's are: a
 * function with a family argument is always inlined where the family is
 * a constant, and each global function (nodeport_in and nodeport_in6,
 * nodeport_snat and nodeport_snat6, nodeport_reply and nodeport_reply6)
 * is one family's copy, verified once with only its family's branches and
 * maps: frontends in tdr_lb4_services_v1 or tdr_lb6_services_v1, source
 * ranges in tdr_lb4_srcrange_v1 or tdr_lb6_srcrange_v1, a remote
 * backend's mapping in tdr_nat4_v1 or tdr_nat6_v1. */
#ifndef TDR_NODEPORT_H
#define TDR_NODEPORT_H

#include "lbnat.h"
#include "conntrack.h"
#include "nat.h"
#include "events.h"
#include "fib.h"
#include "nodeport_dsr.h"

/* nodeport_in's answer for a packet translated to another node's
 * backend: nodeport_snat must send it on (not a TC verdict). The value
 * of nodeport_dsr's, which nodeport_in passes on. */
#define NODEPORT_NEEDS_SNAT DSR_NEEDS_SNAT
/* nodeport_in's answer for a DSR packet to a backend reached through
 * Geneve in eBPF: nodeport_dsr_geneve must send it. */
#define NODEPORT_DSR_GENEVE DSR_NEEDS_GENEVE
/* nodeport_in6's answer for a DSR packet to another node's backend over
 * IPv6 (not through Geneve): nodeport_dsr6 must send it, the frontend in
 * p->in_daddr and p->in_dport. */
#define NODEPORT_DSR6 DSR_NEEDS_EXT6

/* NODEPORT_OFF: 1 with --enable-node-port=false (the programs attached
 * for masquerade only): requests from outside are left to the host, over
 * either family (the services tables keep their external frontends). */
volatile const __u8 NODEPORT_OFF = 0;

/* The flows map of a family. A macro, so that every map call names its
 * map itself (as nat.h's NAT_MAP). */
#define NODEPORT_FLOWS(family) ((family) == FAMILY_V6 ? (void *)&tdr_lb6_flows_v1 : (void *)&tdr_lb4_flows_v1)

/* nodeport_source_allowed reports whether the client may use a frontend
 * with loadBalancerSourceRanges (rev_nat: the frontend's ID). */
static __always_inline int nodeport_source_allowed(const struct pkt *p, __u32 rev_nat, const __u8 family)
{
	if (family == FAMILY_V6) {
		struct lb6_srcrange_key k = {.prefixlen = 32 + 128, .rev_nat_id = bpf_htonl(rev_nat)};
		__builtin_memcpy(k.addr, p->saddr, 16);
		return bpf_map_lookup_elem(&tdr_lb6_srcrange_v1, &k) != NULL;
	}
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

/* The translation of one packet: what nodeport_in's helpers share, but
 * its flow key (a struct lb4_flow_key or lb6_flow_key, by family), which
 * nodeport_in_family keeps apart: a union of the two would put the IPv6
 * key's size on IPv4's stack too, and from_netdev -> nodeport_in ->
 * nodeport_dsr -> nodeport_dsr_fits has no 16 bytes to spare of the 512. */
struct nodeport_ctx {
	__u32 backend_id;
	__u32 rev_nat;
};

/* nodeport_flow_key fills the flow key fk with the packet's tuple. */
static __always_inline void nodeport_flow_key(void *fk, const struct pkt *p, const __u8 family)
{
	if (family == FAMILY_V6) {
		struct lb6_flow_key *k = fk;
		__builtin_memcpy(k->saddr, p->saddr, 16);
		__builtin_memcpy(k->daddr, p->daddr, 16);
		k->sport = p->sport, k->dport = p->dport, k->proto = p->proto;
	} else {
		struct lb4_flow_key *k = fk;
		__builtin_memcpy(k->saddr, p->saddr, 4);
		__builtin_memcpy(k->daddr, p->daddr, 4);
		k->sport = p->sport, k->dport = p->dport, k->proto = p->proto;
	}
}

/* nodeport_backend finds the backend of the packet's flow: its known
 * flow's (the flows map, by fk: nodeport_flow_key), or a new pick when the
 * destination is an external frontend. Returns the backend, NULL with
 * *verdict -1 for a packet to no external frontend, or NULL with *verdict
 * set to minus a drop reason. */
static __always_inline const struct lb_backend *nodeport_backend(const struct pkt *p, void *fk,
								  struct nodeport_ctx *c, int *verdict,
								  const __u8 family)
{
	const struct lb_backend *be = NULL;

	*verdict = -1;
	nodeport_flow_key(fk, p, family);
	struct lb_flow *fl = bpf_map_lookup_elem(NODEPORT_FLOWS(family), fk);
	if (fl) {
		/* Kept while the backend exists (a TCP connection drains on a
		 * removed one); a UDP "flow" on a removed one picks again. */
		c->backend_id = fl->backend_id;
		c->rev_nat = fl->rev_nat_id;
		be = bpf_map_lookup_elem(&tdr_lb_backends_v1, &c->backend_id);
		if (be && (be->state != BACKEND_REMOVED || p->proto == IPPROTO_TCP_) && be->family == family)
			return be;
	}
	const struct lb_service *svc = family == FAMILY_V6 ? lb6_lookup(p->daddr, p->dport, p->proto)
							   : lb4_lookup(p->daddr, p->dport, p->proto);
	if (!svc || !(svc->flags & SVC_F_EXTERNAL))
		return NULL;
	c->rev_nat = svc->rev_nat_id & (LB_MAX_IDS - 1);
	if ((svc->flags & SVC_F_SOURCE_RANGES) && !nodeport_source_allowed(p, c->rev_nat, family)) {
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
		struct lb_affinity_key ak = {.kind = family == FAMILY_V6 ? AFFINITY_BY_V6 : AFFINITY_BY_V4};
		if (family == FAMILY_V6)
			__builtin_memcpy(ak.client, p->saddr, 16);
		else
			__builtin_memcpy(ak.client, p->saddr, 4);
		be = lb_pick(svc, &ak, lb_hash_tuple(p), &bid);
	}
	if (!be || be->family != family) {
		*verdict = -REASON_SVC_NO_BACKEND;
		return NULL;
	}
	c->backend_id = bid;
	struct lb_flow v = {.backend_id = bid, .rev_nat_id = c->rev_nat};
	bpf_map_update_elem(NODEPORT_FLOWS(family), fk, &v, BPF_ANY);
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

/* nodeport_in_family translates a packet from outside to an external
 * frontend of this node (see above): nodeport_in and nodeport_in6. */
static __always_inline int nodeport_in_family(struct __sk_buff *skb, struct pkt *p, const __u8 family)
{
	if (NODEPORT_OFF)
		return -1;
	if (p->proto != IPPROTO_TCP_ && p->proto != IPPROTO_UDP_)
		return -1;
	/* Another node's DSR packet for a backend here: only packets with
	 * IPv4 options pay the look. */
	if (family == FAMILY_V4 && LB_DSR && p->l4_off > ETH_HLEN + 20 && nodeport_dsr_recv(skb, p))
		return TC_ACT_OK;
	/* Over IPv6, in the DSR extension header: only packets with
	 * extension headers pay the look. */
	if (family == FAMILY_V6 && LB_DSR && p->l4_off > ETH_HLEN + DSR6_IPV6_HLEN && nodeport_dsr6_recv(skb, p))
		return TC_ACT_OK;
	/* Each family's key and backend address, sized for it; the other
	 * family's go unused, and the compiler drops them. */
	struct lb4_flow_key fk4 = {};
	struct lb6_flow_key fk6 = {};
	void *fk = family == FAMILY_V6 ? (void *)&fk6 : (void *)&fk4;
	struct nodeport_ctx c = {};
	int verdict;
	const struct lb_backend *be = nodeport_backend(p, fk, &c, &verdict, family);
	if (!be) {
		if (verdict == -1)
			return -1;
		return drop((__u8)-verdict, DIR_INGRESS, 0, p, 0, 0, 0);
	}
	__u8 baddr4[4] __attribute__((aligned(4)));
	__u8 baddr6[16] __attribute__((aligned(4)));
	__u8 *baddr = family == FAMILY_V6 ? baddr6 : baddr4;
	__be16 bport = be->port;
	addr_copy(baddr, be->addr, family);
	if (nat_rewrite(skb, p, 1, baddr, bport))
		return drop(REASON_NAT_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	addr_copy(p->daddr, baddr, family);
	p->dport = bport;
	p->pport = bport;
	int local = endpoint_by_addr(family, baddr) != NULL;
	nodeport_ct(p, c.rev_nat, local);
	count(REASON_NODEPORT, DIR_INGRESS, p->len);
	if (local)
		return TC_ACT_OK;
	/* DSR through Geneve in eBPF, either family: the frontend in a
	 * Geneve option (nodeport_dsr_geneve_prep, nodeport_dsr_geneve). */
	if (LB_DSR && nodeport_dsr_geneve_prep(p, family == FAMILY_V4 ? &fk4 : NULL, family == FAMILY_V6 ? &fk6 : NULL))
		return NODEPORT_DSR_GENEVE;
	if (family == FAMILY_V4 && LB_DSR)
		return nodeport_dsr(skb, p, u32_at(fk4.daddr), fk4.dport);
	if (family == FAMILY_V6 && LB_DSR) {
		/* nodeport_dsr6 runs from from_netdev: its chain (the Packet
		 * Too Big's) on top of this one's is over the 512 bytes. The
		 * frontend goes with p, in the fields of the tuple as the
		 * client sent it (those of an ICMP error's quote, none here). */
		__builtin_memcpy(p->in_daddr, fk6.daddr, 16);
		p->in_dport = fk6.dport;
		return NODEPORT_DSR6;
	}
	return NODEPORT_NEEDS_SNAT;
}

/* nodeport_in and nodeport_in6 return the verdict, NODEPORT_NEEDS_SNAT
 * for a packet to another node's backend (nodeport_snat's),
 * NODEPORT_DSR_GENEVE or NODEPORT_DSR6 (DSR), or -1 for a
 * packet that is none of their business (unchanged). Global functions:
 * verified once, on their own. */
__attribute__((noinline)) int nodeport_in(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return -1;
	return nodeport_in_family(skb, p, FAMILY_V4);
}

__attribute__((noinline)) int nodeport_in6(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return -1;
	return nodeport_in_family(skb, p, FAMILY_V6);
}

/* nodeport_snat_family sends a packet nodeport_in translated to another
 * node's backend (p: already DNATed) on with this node's address and a
 * port of the masquerade range as its source (the family's NAT table,
 * the mapping flagged NAT_F_NODEPORT), so that the reply comes back
 * through here. */
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
	addr_copy(p->saddr, s->r.node, family);
	p->sport = s->r.port;
	int ret = family == FAMILY_V6 ? fib_redirect6(skb, p) : fib_redirect4(skb, p);
	if (ret < 0)
		return drop(REASON_NODEPORT_NO_ROUTE, DIR_INGRESS, 0, p, 0, 0, 0);
	return ret;
}

/* nodeport_snat and nodeport_snat6 are nodeport_snat_family of each
 * family: global functions, so their stack (and masq_alloc's) is not
 * added to nodeport_in's; from_netdev calls them itself. */
__attribute__((noinline)) int nodeport_snat(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	return nodeport_snat_family(skb, p, FAMILY_V4);
}

__attribute__((noinline)) int nodeport_snat6(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	return nodeport_snat_family(skb, p, FAMILY_V6);
}

/* nodeport_reply_family finishes a remote backend's reply whose
 * destination the NAT table just gave back (the client's, in p): the
 * frontend becomes its source (the conntrack entry's reverse NAT ID) and
 * it goes back out to the client. */
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
	int ret = family == FAMILY_V6 ? fib_redirect6(skb, p) : fib_redirect4(skb, p);
	if (ret < 0)
		return drop(REASON_NODEPORT_NO_ROUTE, DIR_INGRESS, 0, p, 0, 0, 0);
	return ret;
}

/* nodeport_reply and nodeport_reply6 are nodeport_reply_family of each
 * family: global functions. */
__attribute__((noinline)) int nodeport_reply(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	return nodeport_reply_family(skb, p, FAMILY_V4);
}

__attribute__((noinline)) int nodeport_reply6(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	return nodeport_reply_family(skb, p, FAMILY_V6);
}

/* nodeport_rev_out gives a local backend's reply to an outside client
 * (leaving through the device, p from a local endpoint) the frontend as
 * its source, before masquerade would translate it: a flow this node
 * translated (conntrack's reverse NAT ID), or another node's DSR flow
 * (tdr_dsr4_v1, tdr_dsr6_v1). Returns 1 when it did, 0 for a packet of no
 * such flow, or minus a drop reason. */
static __always_inline int nodeport_rev_out(struct __sk_buff *skb, struct pkt *p, const __u8 family)
{
	if (p->proto != IPPROTO_TCP_ && p->proto != IPPROTO_UDP_)
		return 0;
	struct flow f;
	flow_of(&f, p);
	struct ct_entry *e = ct_find(&f, p);
	if (!e || !e->rev_nat || !ct_is_reply(e, &f))
		return !LB_DSR ? 0 : family == FAMILY_V4 ? nodeport_dsr_rev(skb, p) : nodeport_dsr_rev6(skb, p);
	int r = lb_rev_snat(skb, p, e->rev_nat);
	if (r < 0)
		return r;
	count(REASON_NODEPORT_REPLY, DIR_EGRESS, p->len);
	return 1;
}

#endif
