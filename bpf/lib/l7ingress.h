/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: a local pod's ingress HTTP rules for flows that come
 * from another node (docs/policy-l7.md, "Ingress").
 *
 * Such a flow must reach the HTTP proxy's ingress listener before the
 * pod: the proxy applies the pod's HTTP rules, then opens its own
 * connection to it. Handing a packet to a socket (bpf_sk_assign) works
 * only at a tc *ingress* hook: bpf_sk_assign answers -EOPNOTSUPP unless
 * skb_at_tc_ingress (net/core/filter.c; the assigned socket is stolen on
 * the receive path), and -ENETUNREACH for a socket of another namespace
 * than the device's. The pod's own to_pod runs at tcx egress of its veth,
 * so it cannot; the node-level hooks that see the packet first are tc ingress
 * hooks: from_netdev on the node's device (native routing; the host would
 * route the packet on to the pod's veth) and from_overlay on the tunnel
 * device (tunnel mode; it delivers to the pod itself). from_netdev calls
 * l7ingress_remote below (the pod's to_pod would decide the flow later:
 * it looks at the policy first); from_overlay decides the pod's ingress
 * itself (to_pod_flow) and calls l7ingress_known and l7ingress_admitted.
 * The source's identity is the datapath's (the ipcache's for the inner
 * source; from_overlay checks it against the node the tunnel came from)
 * and goes into the flow's conntrack entry (ct_entry.src_identity): the
 * proxy takes the peer's identity from there, never from the address
 * alone. IPv4 and IPv6, as the egress redirect. */
#ifndef TDR_L7INGRESS_H
#define TDR_L7INGRESS_H

#include "maps.h"
#include "pkt.h"
#include "events.h"
#include "endpoint.h"
#include "ipcache.h"
#include "conntrack.h"
#include "policy.h"
#include "proxy.h"

/* l7ingress_remote's answer for a packet it leaves to the caller's usual
 * path (not a TC verdict). */
#define L7INGRESS_PASS 1003

/* l7ingress_peer is the identity of the source of a new flow to local
 * endpoint ep (src_id, or the ipcache's for its address when 0) when the
 * endpoint's enforced ingress view allows it at the packet's port through
 * the HTTP proxy (for that identity, else for the prefix a rule names that
 * holds the source), else 0. A look at the policy without events: the
 * verdict itself is policy()'s, in l7ingress_remote, or to_pod's when the
 * flow does not go to the proxy. A global function: its keys and verdicts
 * are off the stack of l7ingress_remote's call of policy(). */
__attribute__((noinline)) int l7ingress_peer(const struct endpoint_info *ep, const struct pkt *p, __u32 src_id)
{
	struct verdicts v = {};
	struct ipcache_key k = {};

	if (!ep || !p)
		return 0;
	__u32 what = (__u32)ep->ep_id << 16 | (__u32)DIR_INGRESS << 8;
	peer_key(&k, p, DIR_INGRESS);
	if (!src_id) {
		struct ipcache_info *info = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
		src_id = info ? info->identity : ID_WORLD;
	}
	policy_lookup(what, src_id, p, &v);
	if (!v.e && VERDICT_PROXY(v.e_match) == PROXY_HTTP)
		return (int)src_id;
	if (v.e == REASON_POLICY_DENY_RULE || !in_cluster_peer(src_id))
		return 0;
	__u32 *cidr = bpf_map_lookup_elem(&tdr_policy_cidr_v1, &k);
	if (!cidr || !*cidr)
		return 0;
	__builtin_memset(&v, 0, sizeof(v));
	policy_lookup(what, *cidr, p, &v);
	return !v.e && VERDICT_PROXY(v.e_match) == PROXY_HTTP ? (int)src_id : 0;
}

/* proxy_upstream_to_pod delivers a packet of the egress HTTP proxy's
 * upstream connection (PROXY_MARK_EGRESS_UPSTREAM, lib/proxy.h) to local
 * endpoint ep when the flow's entry (the client pod's, same tuple) names
 * the HTTP proxy and the endpoint admitted the flow: TC_ACT_OK, else -1
 * (the usual path: the endpoint's ingress policy for the source's
 * identity, the client's by its address). A connection the endpoint's
 * ingress admits only through the HTTP proxy (its own HTTP rules for the
 * client) is dropped: the egress proxy does not apply them (not built),
 * and from_pod admitted the flow for the ingress proxy, which the egress
 * one took instead. Only a SYN pays that policy look. The entry is read as it is, not updated: the
 * upstream connection's FIN or RST must not close the client's flow, nor
 * its SYN (a new connection after the server closed the kept-alive one)
 * replace the entry of a closing flow, as ct_find would have it; either
 * would leave the replies without the entry that steers them. A global
 * function. */
__attribute__((noinline)) int proxy_upstream_to_pod(const struct pkt *p, const struct endpoint_info *ep)
{
	struct flow f;

	if (!p || !ep || p->family != FAMILY_V4 || p->proto != IPPROTO_TCP_ || p->icmp_error || p->nonfirst_frag)
		return -1;
	__u16 ep_id = ep->ep_id;
	if ((p->tcp_flags & TCP_FLAG_SYN) && enforced(ep, DIR_INGRESS) && l7ingress_peer(ep, p, 0))
		return drop(REASON_POLICY_DENIED, DIR_INGRESS, ep_id, p, 0, ep->identity, 0);
	flow_of(&f, p);
	struct ct_entry *e = bpf_map_lookup_elem(&tdr_ct4_v2, &f.k4);
	if (!e || e->expires <= p->now || e->proxy != PROXY_HTTP)
		return -1;
	if (ct_classify(e, &f, p, ep_id, ep_is_a(&f, DIR_INGRESS, p)) != CT_ESTABLISHED)
		return -1;
	count(REASON_CT_ESTABLISHED, DIR_INGRESS, p->len);
	return TC_ACT_OK;
}

/* l7ingress_remote's answer from l7ingress_known for a packet of no flow
 * the endpoint admitted. */
#define L7INGRESS_NEW 1004

/* ct_create_l7ingress makes the entry of a new flow from a remote source
 * of identity src_id that local endpoint ep_id admitted through the
 * ingress HTTP proxy: the endpoint named on its side, the other side not
 * local, the proxy, and the source's identity for the proxy to read. A
 * global function with its own flow key (ct_create takes five arguments
 * and has no room for the identity). */
__attribute__((noinline)) int ct_create_l7ingress(const struct pkt *p, __u32 ep_id, __u32 src_id)
{
	struct flow f;
	struct ct_entry e = {};

	if (!p)
		return 0;
	flow_of(&f, p);
	if (ep_is_a(&f, DIR_INGRESS, p)) {
		e.ep_a = (__u16)ep_id;
		e.flags = CT_F_B_NOT_LOCAL;
	} else {
		e.ep_b = (__u16)ep_id;
		e.flags = CT_F_A_NOT_LOCAL;
	}
	if (f.src_is_a)
		e.flags |= CT_F_A_STARTED;
	if (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST))
		e.flags |= CT_F_CLOSING;
	e.tcp_flags = p->tcp_flags;
	e.proxy = PROXY_HTTP_INGRESS;
	e.src_identity = src_id;
	e.expires = p->now + ct_lifetime(p, e.flags);
	if (p->family == FAMILY_V4)
		return bpf_map_update_elem(&tdr_ct4_v2, &f.k4, &e, BPF_ANY);
	return bpf_map_update_elem(&tdr_ct6_v2, &f.k6, &e, BPF_ANY);
}

/* l7ingress_known decides a packet to local endpoint ep_id (identity
 * ep_identity) by its flow's entry: L7INGRESS_NEW when the endpoint has
 * not admitted the flow; for an established flow sent to the ingress
 * proxy, the packet goes to the proxy's socket again (dropped when none
 * holds it); anything else is L7INGRESS_PASS. A global function: its flow
 * key is off the stack of l7ingress_remote's call of policy(). */
__attribute__((noinline)) int l7ingress_known(struct __sk_buff *skb, const struct pkt *p, __u32 ep_id, __u32 ep_identity)
{
	struct flow f;

	if (!skb || !p)
		return L7INGRESS_PASS;
	flow_of(&f, p);
	struct ct_entry *e = ct_find(&f, p);
	int ct = ct_classify(e, &f, p, (__u16)ep_id, ep_is_a(&f, DIR_INGRESS, p));
	if (ct == CT_NEW)
		return L7INGRESS_NEW;
	if (ct != CT_ESTABLISHED || !e || e->proxy != PROXY_HTTP_INGRESS)
		return L7INGRESS_PASS;
	__u32 peer = e->src_identity;
	ct_update(e, &f, p);
	if (proxy_redirect(skb, p, PROXY_HTTP_INGRESS) >= 0) {
		count(CT_ESTABLISHED, DIR_INGRESS, p->len); /* CT_x equals REASON_CT_x */
		return TC_ACT_OK;
	}
	return drop(REASON_POLICY_DENIED, DIR_INGRESS, (__u16)ep_id, p, peer, ep_identity, 0);
}

/* l7ingress_admitted sends the first packet of a new flow local endpoint
 * ep_id (identity ep_identity) admitted from src_id through the HTTP proxy
 * to the proxy's ingress listener, and records the flow; with no listener
 * (the agent is down) the packet is dropped: HTTP has no L4 fallback. A
 * global function. */
__attribute__((noinline)) int l7ingress_admitted(struct __sk_buff *skb, const struct pkt *p, __u32 ep_id, __u32 ep_identity,
						 __u32 src_id)
{
	if (!skb || !p)
		return TC_ACT_SHOT;
	if (proxy_redirect(skb, p, PROXY_HTTP_INGRESS) < 0)
		return drop(REASON_POLICY_DENIED, DIR_INGRESS, (__u16)ep_id, p, src_id, ep_identity, 0);
	ct_create_l7ingress(p, ep_id, src_id);
	return TC_ACT_OK;
}

/* l7ingress_hairpin sends a packet to local endpoint ep_id (identity
 * ep_identity) whose ingress sent its flow to the HTTP proxy from to_pod,
 * which runs at tcx egress of the pod's veth and cannot assign it to a
 * socket: the packet is marked PROXY_MARK_HAIRPIN (with ep_id) and
 * redirected to the ingress of the hairpin device (tdr_l7_hairpin_v1),
 * where l7_hairpin (bpf_lxc.c) assigns it to the ingress listener, as
 * Cilium's to-container sends such packets to cilium_host. The source
 * is the node itself (or a remote source that came through a device
 * without the host programs): no local endpoint may own its address (a
 * local pod's flows go to the proxy from its from_pod, whose entry this
 * one must not replace).
 *
 * e: the flow's entry when the flow is established (NULL: a new flow the
 * endpoint's ingress just allowed through the HTTP proxy, whose entry is
 * made here with the source's identity, the ipcache's, for the proxy to
 * read). An established packet against the flow (a reply: the proxy
 * answers from its own socket, these never come here) is left to the
 * caller (L7INGRESS_PASS). Without a hairpin device, for a packet that
 * came back from it untaken (no l7_hairpin program), or anything but IPv4
 * TCP, the packet is dropped: the port stays closed. A global function:
 * to_pod's verification pays a call. */
__attribute__((noinline)) int l7ingress_hairpin(struct __sk_buff *skb, const struct pkt *p, struct ct_entry *e, __u32 ep_id,
						__u32 ep_identity)
{
	struct flow f;
	__u32 peer = 0;

	if (!skb || !p)
		return TC_ACT_SHOT;
	flow_of(&f, p);
	if (e) {
		if (ct_is_reply(e, &f))
			return L7INGRESS_PASS;
		peer = e->src_identity;
	} else {
		struct ipcache_key k = {};
		peer_key(&k, p, DIR_INGRESS);
		struct ipcache_info *info = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
		peer = info ? info->identity : ID_WORLD;
	}
	if ((skb->mark & PROXY_MARK_MASK) == PROXY_MARK_HAIRPIN)
		goto closed;
	if (p->family != FAMILY_V4 || p->proto != IPPROTO_TCP_ || p->icmp_error || p->nonfirst_frag)
		goto closed;
	__u32 zero = 0;
	__u32 *ifindex = bpf_map_lookup_elem(&tdr_l7_hairpin_v1, &zero);
	if (!ifindex || !*ifindex)
		goto closed;
	__u32 dev = *ifindex;
	if (e) {
		ct_update(e, &f, p);
		count(CT_ESTABLISHED, DIR_INGRESS, p->len); /* CT_x equals REASON_CT_x */
	} else {
		if (endpoint_by_addr(FAMILY_V4, p->saddr))
			goto closed;
		if (ct_create_l7ingress(p, ep_id, peer))
			goto closed;
	}
	skb->mark = PROXY_MARK_HAIRPIN | ep_id << 16;
	return bpf_redirect(dev, BPF_F_INGRESS);
closed:
	return drop(REASON_POLICY_DENIED, DIR_INGRESS, (__u16)ep_id, p, peer, ep_identity, 0);
}

/* l7ingress_remote decides a TCP packet (IPv4 or IPv6) from another node to a local
 * endpoint whose ingress sends it to the HTTP proxy, at a tc ingress hook.
 * src_id is the source's identity (0: the ipcache's for its address).
 *
 * - A packet of a flow it sent to the proxy (the entry names the
 *   endpoint, PROXY_HTTP_INGRESS, and the packet goes the flow's way) goes
 *   to the proxy's socket again; with no proxy it is dropped.
 * - A new flow the endpoint's enforced ingress allows only through the
 *   HTTP proxy: the policy decides it here (events included: to_pod never
 *   sees it), the SYN is assigned to the ingress listener, and the entry
 *   records the endpoint, the proxy and src_id. No listener (the agent is
 *   down): dropped, the port stays closed (HTTP has no L4 fallback).
 *
 * Anything else is L7INGRESS_PASS: the caller's usual path, where the
 * endpoint's to_pod_flow decides it. A global function, verified once;
 * its frame holds no key (from_netdev -> l7ingress_remote -> policy ->
 * policy_lookup must fit in 512 bytes). */
__attribute__((noinline)) int l7ingress_remote(struct __sk_buff *skb, struct pkt *p, __u32 src_id)
{
	if (!skb || !p)
		return L7INGRESS_PASS;
	if ((p->family != FAMILY_V4 && p->family != FAMILY_V6) || p->proto != IPPROTO_TCP_ || p->icmp_error ||
	    p->nonfirst_frag)
		return L7INGRESS_PASS;
	const struct endpoint_info *ep = endpoint_by_addr(p->family, p->daddr);
	if (!ep)
		return L7INGRESS_PASS;
	/* A reply to the HTTP proxy's upstream connection that left with the
	 * pod's address (lib/proxy.h): to the proxy's socket, not the pod. */
	if (proxy_upstream_reply(skb, p, ep) >= 0)
		return TC_ACT_OK;
	/* Only an endpoint enforcing ingress with entries naming the proxy
	 * (EP_L7_INGRESS, set by the agent) sends flows there: the others'
	 * packets pay no conntrack lookup here. */
	if (!(ep->flags & EP_L7_INGRESS) || !enforced(ep, DIR_INGRESS))
		return L7INGRESS_PASS;
	__u16 ep_id = ep->ep_id;
	int r = l7ingress_known(skb, p, ep_id, ep->identity);
	if (r != L7INGRESS_NEW)
		return r;
	src_id = (__u32)l7ingress_peer(ep, p, src_id);
	if (!src_id)
		return L7INGRESS_PASS;
	p->proxy = 0;
	if (policy(ep, DIR_INGRESS, p, src_id))
		return TC_ACT_SHOT;
	if (p->proxy != PROXY_HTTP_INGRESS)
		/* An audited view passed it (policy() then names no proxy):
		 * to_pod decides it as before. */
		return L7INGRESS_PASS;
	count(REASON_FORWARDED, DIR_INGRESS, p->len);
	return l7ingress_admitted(skb, p, ep_id, ep->identity, src_id);
}

#endif
