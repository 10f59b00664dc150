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
 * - a backend on another node, with direct server return
 *   (--bpf-lb-mode=dsr, LB_DSR): the client's source is kept and the
 *   frontend travels to the backend's node in an IPv4 option (see
 *   nodeport_dsr); that node records it (tdr_dsr4_v1) and gives the
 *   backend's replies the frontend as source as they leave its uplink,
 *   straight to the client: the replies never come back here.
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

/* LB_DSR: 1 with --bpf-lb-mode=dsr, set by the agent at load. Both sides
 * of direct server return follow it: a node in snat mode neither writes
 * the option nor honours one it receives (an outside sender could
 * otherwise choose the source of a pod's replies), so every node of a
 * cluster runs the same mode, as with Cilium's. */
volatile const __u8 LB_DSR = 0;

/* NODEPORT_OFF: 1 with --enable-node-port=false (the programs attached
 * for masquerade only): requests from outside are left to the host. */
volatile const __u8 NODEPORT_OFF = 0;

/* The IPv4 option that carries a DSR flow's frontend to the backend's
 * node: type 0x9a (the copied flag and number 26, the value Cilium's
 * datapath uses, so that captures read alike), length 8, the frontend's
 * port, then its address, both in network byte order. */
#define DSR_OPT_TYPE 0x9a
#define DSR_OPT_LEN 8
/* An IPv4 header is at most 60 bytes (IHL 15). */
#define IPV4_MAX_HLEN 60

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

/* nodeport_dsr_fits reports whether the packet, DSR_OPT_LEN bytes longer,
 * still fits the MTU of the route to its destination (the FIB's check of
 * tot_len against the route's or its device's MTU). A global function:
 * its lookup's stack is not added to nodeport_dsr's, which calls
 * nodeport_redirect (another) at the end of a chain of calls. */
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
 *   way instead (NODEPORT_NEEDS_SNAT): the client still gets its reply
 *   from the frontend, through this node;
 * - a TCP SYN (tens of bytes: only a link MTU below ~100 does this) is
 *   dropped with REASON_DSR_MTU_EXCEEDED; a flow's later segments carry
 *   no option, so a TCP flow must start as DSR or not at all.
 * Clients inside the cluster are sent the SNAT way (see below).
 * Returns the verdict or NODEPORT_NEEDS_SNAT. A global function. */
__attribute__((noinline)) int nodeport_dsr(struct __sk_buff *skb, struct pkt *p, __u32 fe_addr, __u32 fe_port)
{
	if (!skb || !p)
		return TC_ACT_OK;
	if (!nodeport_dsr_client(p))
		return NODEPORT_NEEDS_SNAT;
	int udp = p->proto == IPPROTO_UDP_;
	if (udp || (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
		int room = p->l4_off - ETH_HLEN + DSR_OPT_LEN <= IPV4_MAX_HLEN;
		if (!room || !nodeport_dsr_fits(skb, p)) {
			if (udp)
				return NODEPORT_NEEDS_SNAT;
			return drop(REASON_DSR_MTU_EXCEEDED, DIR_INGRESS, 0, p, 0, 0, 0);
		}
		int r = nodeport_dsr_opt(skb, p, fe_addr, (__be16)fe_port);
		if (r == 1 && udp)
			return NODEPORT_NEEDS_SNAT;
		if (r)
			return drop(REASON_NAT_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	}
	/* Counted as REASON_NODEPORT by nodeport_in; no NAT mapping tells
	 * DSR flows apart (the reasons below REASON_POLICY_DENIED are full). */
	int ret = nodeport_redirect(skb, p);
	if (ret < 0)
		return drop(REASON_NODEPORT_NO_ROUTE, DIR_INGRESS, 0, p, 0, 0, 0);
	return ret;
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
	if (!endpoint_by_addr(FAMILY_V4, p->daddr))
		return 0;
	struct dsr4_key k = {.client_port = p->sport, .backend_port = p->dport, .proto = p->proto};
	__builtin_memcpy(k.client, p->saddr, 4);
	__builtin_memcpy(k.backend, p->daddr, 4);
	/* Written when new or changed only: every UDP datagram carries it. */
	struct dsr4_entry *cur = bpf_map_lookup_elem(&tdr_dsr4_v1, &k);
	if (!cur || u32_at(cur->addr) != u32_at(v.addr) || cur->port != v.port)
		bpf_map_update_elem(&tdr_dsr4_v1, &k, &v, BPF_ANY);
	return 1;
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

/* nodeport_in translates a packet from outside to an external frontend
 * of this node (see above). Returns the verdict, NODEPORT_NEEDS_SNAT for
 * a packet to another node's backend (nodeport_snat's), or -1 for a
 * packet that is none of its business (unchanged). A global function: verified once,
 * on its own. */
__attribute__((noinline)) int nodeport_in(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p || NODEPORT_OFF)
		return -1;
	if (p->proto != IPPROTO_TCP_ && p->proto != IPPROTO_UDP_)
		return -1;
	/* Another node's DSR packet for a backend here: only packets with
	 * IPv4 options pay the look. */
	if (LB_DSR && p->l4_off > ETH_HLEN + 20 && nodeport_dsr_recv(skb, p))
		return TC_ACT_OK;
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
	if (local)
		return TC_ACT_OK;
	if (LB_DSR)
		return nodeport_dsr(skb, p, u32_at(c.fk.daddr), c.fk.dport);
	return NODEPORT_NEEDS_SNAT;
}

/* nodeport_snat and nodeport_reply, the remote backend's legs, are in
 * nodeport6.h with their IPv6 twins: one body for both families. */

/* nodeport_rev_out gives a local backend's reply to an outside client
 * (leaving through the device, p from a local endpoint) the frontend as
 * its source, before masquerade would translate it: a flow this node
 * translated (conntrack's reverse NAT ID), or another node's DSR flow.
 * Returns 1 when it did, 0 for a packet of no such flow, or minus a drop
 * reason. */
static __always_inline int nodeport_rev_out(struct __sk_buff *skb, struct pkt *p)
{
	if (p->proto != IPPROTO_TCP_ && p->proto != IPPROTO_UDP_)
		return 0;
	struct flow f;
	flow_of(&f, p);
	struct ct_entry *e = ct_find(&f, p);
	if (!e || !e->rev_nat || !ct_is_reply(e, &f))
		return LB_DSR ? nodeport_dsr_rev(skb, p) : 0;
	int r = lb_rev_snat(skb, p, e->rev_nat);
	if (r < 0)
		return r;
	count(REASON_NODEPORT_REPLY, DIR_EGRESS, p->len);
	return 1;
}

#endif
