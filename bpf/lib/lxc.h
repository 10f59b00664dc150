/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: delivery to a local endpoint, shared by the pod
 * programs (bpf_lxc.c) and the overlay's (bpf_overlay.c): a packet as the
 * pod programs see it, the endpoint's ingress verdict and commit
 * (to_pod_flow), and direct delivery into its namespace. */
#ifndef TDR_LXC_H
#define TDR_LXC_H

#include "maps.h"
#include "pkt.h"
#include "events.h"
#include "endpoint.h"
#include "conntrack.h"
#include "policy.h"
#include "lbnat.h"
#include "l7ingress.h"

/* deliver_direct rewrites the frame as the host would route it (MACs of
 * the destination's veth pair, TTL / hop limit down by one) and redirects
 * it into the destination pod's namespace. It returns -1 when the host
 * must handle the packet instead (TTL expiring: the host sends the ICMP
 * error). */
__attribute__((noinline)) int deliver_direct(struct __sk_buff *skb, const struct pkt *p, const struct endpoint_info *dst)
{
	if (!skb || !p || !dst)
		return -1;
	__u8 *eth;
	if (p->family == FAMILY_V4) {
		eth = hdr(skb, p, 0, ETH_HLEN + 20);
		if (!eth)
			return -1;
		__u8 *ip = eth + ETH_HLEN;
		if (ip[8] <= 1)
			return -1;
		ip[8]--;
		/* Incremental checksum for the TTL byte (RFC 1624), as the
		 * kernel's ip_decrease_ttl does. */
		__u16 *csum = (__u16 *)(ip + 10);
		__u32 c = *csum;
		c += bpf_htons(0x0100);
		*csum = (__u16)(c + (c >= 0xFFFF));
	} else {
		eth = hdr(skb, p, 0, ETH_HLEN + 40);
		if (!eth)
			return -1;
		__u8 *ip = eth + ETH_HLEN;
		if (ip[7] <= 1)
			return -1;
		ip[7]--;
	}
	__builtin_memcpy(eth, dst->mac, ETH_ALEN);
	__builtin_memcpy(eth + ETH_ALEN, dst->host_mac, ETH_ALEN);
	count(REASON_DELIVERED_DIRECT, DIR_INGRESS, p->len);
	return bpf_redirect_peer(dst->ifindex, 0);
}

/* A packet as from_pod has it when it comes to the flow's verdict: the
 * parsed packet, its flow's conntrack key, and the reverse NAT ID of the
 * service translation (0: none). On from_pod's stack, passed whole to
 * from_pod_flow. */
struct lxc_pkt {
	struct pkt p;
	struct flow f;
	__u32 nat;
};

/* to_pod_flow's answer, when its caller can hand the packet to a socket
 * (l7_here: a tc ingress hook, from_overlay), for a new flow the
 * endpoint's ingress admitted through the HTTP proxy: the caller sends it
 * there (l7ingress_admitted, lib/l7ingress.h). Not a TC verdict. */
#define TO_POD_L7INGRESS 1005

/* to_pod_flow decides a packet delivered to endpoint ep whose flow has
 * entry e (NULL: none): the endpoint's ingress policy of a new flow, the
 * entry's commit, the reverse NAT of a service's reply, the trace event.
 * peer_id is the source's identity, 0 to look it up in the ipcache (the
 * overlay's from_overlay passes the one the tunnel key carried). l7_here:
 * the caller can assign a socket (see TO_POD_L7INGRESS).
 * Returns the program's verdict, or TO_POD_L7INGRESS. Inlined: as a global function (verified
 * once, as from_pod_flow is) its call cost to_pod 8-10 ns per packet
 * (120 -> 130 ns, BenchmarkPrivilegedToPodEstablished); to_pod passes a
 * stack copy of its endpoint instead, which keeps the verifier's paths
 * few (11,730 instructions against 10,203 called; 14,394 at e3050e0). */
static __always_inline int to_pod_flow(struct __sk_buff *skb, struct lxc_pkt *c, const struct endpoint_info *ep,
				       struct ct_entry *e, __u32 peer_id, int l7_here)
{
	struct pkt *p = &c->p;
	const struct flow *f = &c->f;
	__u16 ep_id = ep->ep_id;
	__u8 is_a = ep_is_a(f, DIR_INGRESS, p);
	int ct = ct_classify(e, f, p, ep_id, is_a);
	/* A flow of the node that to_pod sent to the ingress HTTP proxy
	 * through the hairpin device: its later packets go there too. */
	if (!l7_here && ct == CT_ESTABLISHED && e && e->proxy == PROXY_HTTP_INGRESS) {
		int r = l7ingress_hairpin(skb, p, e, ep_id, ep->identity);
		if (r != L7INGRESS_PASS)
			return r;
	}
	/* The ingress HTTP proxy's own connection to this pod: the proxy
	 * admitted the request for its original source. */
	int from_proxy = ct == CT_NEW && (skb->mark & PROXY_MARK_MASK) == PROXY_MARK_UPSTREAM;
	if (!from_proxy && admit(ep, DIR_INGRESS, p, ct, peer_id))
		return TC_ACT_SHOT;
	/* HTTP rules on this port: the flow must go through the HTTP proxy,
	 * which needs a packet it can assign at a tc ingress hook (from_pod
	 * of a local source, from_netdev or from_overlay for another node's,
	 * lib/l7ingress.h). One that reaches to_pod passed none that could
	 * (the node itself, a device without the host programs): it goes to
	 * the proxy through the hairpin device (l7ingress_hairpin), or is
	 * dropped there (a local pod without direct delivery, a pod talking
	 * to itself, IPv6, no hairpin device): the port stays closed. */
	if (p->proxy == PROXY_HTTP_INGRESS) {
		if (l7_here)
			return TO_POD_L7INGRESS;
		return l7ingress_hairpin(skb, p, NULL, ep_id, ep->identity);
	}
	int notable = trace_notable(e, p, ct, e && ct_is_reply(e, f));
	if (!p->icmp_error && !p->nonfirst_frag) {
		if (!e) {
			ct_create(f, p, is_a ? ep_id : 0, is_a ? 0 : ep_id, 0);
		} else {
			if (ct == CT_NEW)
				ct_admit(e, is_a, ep_id);
			ct_update(e, f, p);
		}
	}
	/* The reply of a flow this pod sent to a service: its source becomes
	 * the frontend the pod addressed. */
	if (e && e->rev_nat && !p->icmp_error && ct_is_reply(e, f)) {
		int r = lb_rev_snat(skb, p, e->rev_nat);
		if (r < 0)
			return drop((__u8)-r, DIR_INGRESS, ep_id, p, 0, ep->identity, 0);
	}
	if (notable)
		trace(ct, DIR_INGRESS, ep_id, p, peer_id, ep->identity);
	return TC_ACT_OK;
}

#endif
