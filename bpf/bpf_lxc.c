// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Tendril's per-endpoint datapath, attached with TCX on the host side of
 * each pod's veth: from_pod on tcx ingress (packets the pod sends), to_pod
 * on tcx egress (packets delivered to the pod). One object is loaded per
 * node; per-endpoint facts live in maps, so no compile happens at run time.
 *
 * from_pod: endpoint of the interface → parse (truncated/malformed → drop)
 * → anti-spoofing → the flow's conntrack entry (one per flow, shared by
 * both directions and both local endpoints) → egress policy of a new flow
 * by the destination's identity → when the destination is a local
 * endpoint that takes direct delivery: its ingress policy of a new flow,
 * then bpf_redirect_peer into its namespace (its to_pod does not run, so
 * its ingress is enforced exactly once, here); otherwise hand to the host
 * stack.
 * to_pod: endpoint of the interface → parse → conntrack → ingress policy
 * of a new flow by the source's identity (ipcache; unknown is world) →
 * deliver. In tunnel mode, from_pod sends a packet for another node's pod
 * through the overlay (lib/overlay.h, bpf_overlay.c receives it).
 *
 * The shared parts (map definitions, parser, conntrack, policy, events)
 * live in lib/ (see docs/datapath.md), delivery to a local endpoint in
 * lib/lxc.h (the overlay's program delivers too); this file keeps what
 * only the pod programs do: the hairpin and the two entry points. */
#include "lib/common.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#include "lib/maps.h"
#include "lib/pkt.h"
#include "lib/events.h"
#include "lib/parse.h"
#include "lib/endpoint.h"
#include "lib/ipcache.h"
#include "lib/conntrack.h"
#include "lib/policy.h"
#include "lib/lbnat.h"
#include "lib/lxc.h"
#include "lib/overlay.h"
#include "lib/encrypt.h"
#include "lib/proxy.h"
#include "lib/dnsfb.h"
#include "lib/l7ingress.h"

/* hairpin_from_pod handles a pod's packet to itself through a service
 * (nat: its reverse NAT ID, the packet already DNATed to the pod's own
 * address) and the pod's reply to the hairpin address (nat 0): both go
 * back into the pod from here (lbnat.h), under the flow's conntrack entry,
 * without policy (a pod's traffic with itself is not its policy's
 * business). Returns the verdict, or -1 when the packet is no hairpin (it
 * is then unchanged). A global function: the main path's verification
 * does not multiply with the hairpin's branches. */
__attribute__((noinline)) int hairpin_from_pod(struct __sk_buff *skb, struct pkt *p, const struct endpoint_info *ep, __u32 nat)
{
	if (!skb || !p || !ep)
		return -1;
	if (p->icmp_error || p->nonfirst_frag)
		return -1;
	__u16 ep_id = ep->ep_id;
	if (nat) {
		/* Translated, to the sender's own address? */
		int r = lb_hairpin_snat(skb, p);
		if (r <= 0)
			return r < 0 ? drop((__u8)-r, DIR_EGRESS, ep_id, p, ep->identity, 0, 0) : -1;
	} else if (!lb_is_hairpin_addr(p, p->daddr)) {
		return -1;
	}
	struct flow f;
	flow_of(&f, p);
	struct ct_entry *e = ct_find(&f, p);
	/* A packet to the hairpin address is a hairpin reply only as the
	 * reply of a translated flow. */
	if (!nat && !(e && e->rev_nat && ct_is_reply(e, &f)))
		return -1;
	__u8 src_a = ep_is_a(&f, DIR_EGRESS, p);
	int ct = ct_classify(e, &f, p, ep_id, src_a);
	int notable = trace_notable(e, p, ct, e && ct_is_reply(e, &f));
	if (!e) {
		ct_create(&f, p, ep_id, ep_id, nat << CT_REV_NAT_SHIFT);
	} else {
		if (ct == CT_NEW) {
			ct_admit(e, src_a, ep_id);
			ct_admit(e, !src_a, ep_id);
		}
		if (nat && e->rev_nat != nat)
			e->rev_nat = nat;
		ct_update(e, &f, p);
		if (!nat) {
			int r = lb_hairpin_rev(skb, p);
			if (r == 0)
				r = lb_rev_snat(skb, p, e->rev_nat);
			if (r < 0)
				return drop((__u8)-r, DIR_EGRESS, ep_id, p, ep->identity, 0, 0);
		}
	}
	if (notable)
		trace(ct, DIR_EGRESS, ep_id, p, ep->identity, ep->identity);
	int ret = deliver_direct(skb, p, ep);
	/* TTL expiring: the host answers it. */
	return ret >= 0 ? ret : TC_ACT_OK;
}

/* to_proxy sends a packet of endpoint ep (to the local endpoint dst, or
 * NULL) to the proxy p->proxy names: the verdict, or -1 when it passes
 * as its L4 allow says. When no proxy listens (the agent is down or
 * starting), a DNS query meets the DNS fallback (lib/dnsfb.h): an
 * allowed name passes as its port's L4 allow says, so pods keep resolving
 * (nothing is learned, so no new address becomes allowed), a denied one
 * is answered REFUSED or dropped; any other L7 port is closed until its
 * proxy enforces it. A global function: its stack is not on
 * from_pod_flow's, which the policy's call chain has no room for. */
__attribute__((noinline)) int to_proxy(struct __sk_buff *skb, const struct pkt *p, const struct endpoint_info *ep,
				       const struct endpoint_info *dst)
{
	if (!skb || !p || !ep)
		return TC_ACT_SHOT;
	if (proxy_redirect(skb, p, p->proxy) >= 0)
		return TC_ACT_OK;
	if (p->proxy == PROXY_DNS)
		return dns_fallback(skb, p, ep, dst ? dst->identity : 0);
	if (p->proxy == PROXY_HTTP_INGRESS && dst)
		return drop(REASON_POLICY_DENIED, DIR_INGRESS, dst->ep_id, p, ep->identity, dst->identity, 0);
	return drop(REASON_POLICY_DENIED, DIR_EGRESS, ep->ep_id, p, ep->identity, dst ? dst->identity : 0, 0);
}

/* to_remote sends endpoint ep's packet c->p for no local endpoint on its way off the node: in tunnel mode to
 * the owner node through the overlay when the ipcache names one; with
 * node encryption to a peer's own address through the WireGuard device
 * (or nowhere, in strict mode, when it would leave in the clear). The
 * verdict, or -1 to leave it to the host stack. A global function: its
 * stack is not on from_pod_flow's, which has no room left. */
__attribute__((noinline)) int to_remote(struct __sk_buff *skb, const struct lxc_pkt *c, const struct endpoint_info *ep)
{
	if (!skb || !c || !ep)
		return -1;
	int r = tunnel_encap(skb, &c->p, ep->identity);
	if (r >= 0)
		return r;
	return encrypt_node(skb, &c->p, ep->ep_id, ep->identity);
}

/* from_pod_flow decides a packet of endpoint ep whose flow has entry e
 * (NULL: none) and whose destination is the local endpoint dst (NULL: not
 * local): policy of a new flow for both endpoints, the entry's commit,
 * trace events, then delivery. Returns the program's verdict.
 *
 * A global function, for the verifier: ep, dst and e each come from one
 * of several maps (the ifindex array or hash; the ID array or an address
 * hash; the IPv4 or IPv6 conntrack table) or are NULL, and a pointer into
 * one map never matches a pointer into another when the verifier compares
 * states, so inlined, all of this was walked once per combination of the
 * three (and of the conntrack outcomes on top): from_pod's own code was
 * 125,000 of its verified instructions. As arguments they are checked
 * once, as memory of their type's size. */
__attribute__((noinline)) int from_pod_flow(struct __sk_buff *skb, struct lxc_pkt *c, const struct endpoint_info *ep,
					    const struct endpoint_info *dst, struct ct_entry *e)
{
	if (!skb || !c || !ep)
		return TC_ACT_SHOT;
	struct pkt *p = &c->p;
	const struct flow *f = &c->f;
	__u32 nat = c->nat;
	__u16 ep_id = ep->ep_id;
	__u8 src_a = ep_is_a(f, DIR_EGRESS, p);
	/* A local destination that takes direct delivery gets the packet
	 * from here, its ingress checked here; otherwise the host routes the
	 * packet and the destination's to_pod checks it. */
	int direct = dst && (dst->flags & EP_DELIVER_DIRECT) && dst->ifindex != ep->ifindex;
	int ct_out = ct_classify(e, f, p, ep_id, src_a);
	if (admit(ep, DIR_EGRESS, p, ct_out, dst ? dst->identity : 0))
		return TC_ACT_SHOT;
	/* The proxy this flow goes to (p->proxy): the one its allowing entry
	 * names when new (policy wrote it), the one its entry remembers
	 * after; the replies (and ICMP errors, fragments) go their way. A
	 * local destination's ingress policy still decides below, for the
	 * pod's identity: the proxy's own connection reaches it as the
	 * host's. When that ingress entry names the HTTP proxy (and the
	 * egress none), the flow goes to the proxy's ingress listener
	 * (PROXY_HTTP_INGRESS): this is the tc ingress hook where a packet
	 * to a local pod can be assigned to a socket, and the flow's entry
	 * names this endpoint as its source for the proxy. */
	if (ct_out != CT_NEW)
		p->proxy = ct_out == CT_ESTABLISHED && e ? e->proxy : 0;
	if (p->icmp_error || p->nonfirst_frag)
		p->proxy = 0;
	/* WireGuard strict mode: a packet for another node's pod (or, with
	 * node encryption, another node's address) that would not go
	 * through the WireGuard device (or to a node without a key) goes
	 * nowhere; before the flow's entry records it. */
	if (!dst && encrypt_strict_drop(skb, p, ep_id, ep->identity))
		return TC_ACT_SHOT;
	int ct_in = CT_ESTABLISHED;
	if (direct) {
		ct_in = ct_classify(e, f, p, dst->ep_id, !src_a);
		if (admit(dst, DIR_INGRESS, p, ct_in, ep->identity))
			return TC_ACT_SHOT;
	}
	/* Whether this packet is worth a trace event is decided before its
	 * entry records it (a new flag, a first reply). */
	p->reply = e && ct_is_reply(e, f);
	/* This pod's reply to a local client's flow that the client's egress
	 * sent to the HTTP proxy: the proxy's upstream connection holds the
	 * client's tuple (lib/proxy.h), so the reply goes to its socket in
	 * the host, not to the client; before the entry's update, which is
	 * the client's connection's (the upstream's FIN would close it). */
	if (e && e->proxy == PROXY_HTTP && p->reply) {
		int r = proxy_upstream_sk(skb, p);
		if (r >= 0)
			return r;
	}
	int notable = trace_notable(e, p, ct_out, p->reply);
	/* The flow's entry changes only once every check passed. ICMP errors
	 * and fragments are not flows of their own. */
	if (!p->icmp_error && !p->nonfirst_frag) {
		if (!e) {
			__u16 other = direct ? dst->ep_id : 0;
			__u8 remote = dst ? 0 : (src_a ? CT_F_B_NOT_LOCAL : CT_F_A_NOT_LOCAL);
			ct_create(f, p, src_a ? ep_id : other, src_a ? other : ep_id,
				  remote | (nat << CT_REV_NAT_SHIFT) | ((__u32)p->proxy << CT_PROXY_SHIFT));
		} else {
			if (ct_out == CT_NEW) {
				ct_admit(e, src_a, ep_id);
				e->proxy = p->proxy;
			}
			if (direct && ct_in == CT_NEW)
				ct_admit(e, !src_a, dst->ep_id);
			if (nat && e->rev_nat != nat)
				e->rev_nat = nat;
			ct_update(e, f, p);
		}
	}
	if (notable)
		trace(ct_out, DIR_EGRESS, ep_id, p, ep->identity, dst ? dst->identity : 0);
	if (p->proxy) {
		int r = to_proxy(skb, p, ep, dst);
		if (r >= 0)
			return r;
	}
	if (!direct) {
		/* Not a local endpoint's: in tunnel mode, to the owner node
		 * through the overlay when the ipcache names one. */
		if (!dst) {
			int r = to_remote(skb, c, ep);
			if (r >= 0)
				return r;
		}
		return TC_ACT_OK;
	}
	/* Delivered directly, the destination's to_pod does not run: its
	 * to-endpoint trace is reported here (with its own conntrack view). */
	if (notable)
		trace(ct_in, DIR_INGRESS, dst->ep_id, p, ep->identity, dst->identity);
	/* A backend's reply to a local client that takes it directly: the
	 * client's to_pod does not run, so the source becomes the frontend
	 * here. */
	if (e && e->rev_nat && !p->icmp_error && ct_is_reply(e, f)) {
		int r = lb_rev_snat(skb, p, e->rev_nat);
		if (r < 0)
			return drop((__u8)-r, DIR_EGRESS, ep_id, p, ep->identity, 0, 0);
	}
	int ret = deliver_direct(skb, p, dst);
	return ret >= 0 ? ret : TC_ACT_OK;
}

SEC("tcx/ingress")
int from_pod(struct __sk_buff *skb)
{
	struct lxc_pkt c;
	struct pkt *p = &c.p;
	const struct endpoint_info *ep = endpoint_by_ifindex(skb->ifindex);
	__u16 ep_id = ep ? ep->ep_id : 0;

	__builtin_memset(p, 0, sizeof(*p));
	int reason = parse(skb, p);
	if (reason)
		return drop(reason, DIR_EGRESS, ep_id, p, 0, 0, 0);
	/* ARP, neighbor discovery and MLD are link-scoped (their sources
	 * include :: during duplicate address detection) and carry no
	 * policy. */
	if (p->arp || p->ndp)
		return TC_ACT_OK;
	if (!ep)
		return drop(REASON_UNKNOWN_INTERFACE, DIR_EGRESS, 0, p, 0, 0, 0);
	if (!is_endpoint_addr(ep, p->family, p->saddr))
		return drop(REASON_INVALID_SOURCE, DIR_EGRESS, ep_id, p, ep->identity, 0, 0);
	/* A packet to a service frontend goes to a backend from here on:
	 * conntrack, the local destination and policy see the backend. */
	int nat = lb_dnat(skb, p);
	if (nat < 0)
		return drop((__u8)-nat, DIR_EGRESS, ep_id, p, ep->identity, 0, 0);
	c.nat = (__u32)nat;
	/* A pod reaching itself through a service, or its reply to the
	 * hairpin address. */
	if (nat || lb_is_hairpin_addr(p, p->daddr)) {
		int hp = hairpin_from_pod(skb, p, ep, c.nat);
		if (hp >= 0)
			return hp;
	}

	flow_of(&c.f, p);
	struct ct_entry *e = p->nonfirst_frag ? NULL : ct_find(&c.f, p);
	/* The local destination, if any: for a known flow the entry names it
	 * (an array lookup) or says there is none; otherwise, or when the
	 * named endpoint no longer holds the address, look the address up. */
	const struct endpoint_info *dst = NULL;
	int looked_up = 0;
	if (e) {
		__u8 src_a = ep_is_a(&c.f, DIR_EGRESS, p);
		__u16 other = src_a ? e->ep_b : e->ep_a;
		if (other) {
			dst = endpoint_by_id(other);
			if (dst && !is_endpoint_addr(dst, p->family, p->daddr))
				dst = NULL;
		}
		looked_up = dst || (e->flags & (src_a ? CT_F_B_NOT_LOCAL : CT_F_A_NOT_LOCAL));
	}
	if (!looked_up)
		dst = endpoint_by_addr(p->family, p->daddr);
	return from_pod_flow(skb, &c, ep, dst, e);
}

SEC("tcx/egress")
int to_pod(struct __sk_buff *skb)
{
	struct lxc_pkt c;
	struct pkt *p = &c.p;
	const struct endpoint_info *ep = endpoint_by_ifindex(skb->ifindex);
	__u16 ep_id = ep ? ep->ep_id : 0;

	__builtin_memset(p, 0, sizeof(*p));
	int reason = parse(skb, p);
	if (reason)
		return drop(reason, DIR_INGRESS, ep_id, p, 0, 0, 0);
	if (p->arp || p->ndp)
		return TC_ACT_OK;
	if (!ep)
		return drop(REASON_UNKNOWN_INTERFACE, DIR_INGRESS, 0, p, 0, 0, 0);
	if (!is_endpoint_addr(ep, p->family, p->daddr))
		return drop(REASON_NO_ENDPOINT, DIR_INGRESS, ep_id, p, 0, ep->identity, 0);

	/* The endpoint comes from the ifindex array or, beyond it, the hash:
	 * two pointers the verifier never finds equal, so everything below
	 * would be walked twice. A copy on the stack (map values are 8-byte
	 * aligned: six moves) is one. */
	struct endpoint_info me __attribute__((aligned(8)));
	__builtin_memcpy(&me, __builtin_assume_aligned(ep, 8), sizeof(me));
	/* The egress HTTP proxy's upstream connection for a local client's
	 * flow, from the client's own tuple (lib/proxy.h). */
	if ((skb->mark & PROXY_MARK_MASK) == PROXY_MARK_EGRESS_UPSTREAM) {
		int r = proxy_upstream_to_pod(p, &me);
		if (r >= 0)
			return r;
	}
	c.nat = 0;
	flow_of(&c.f, p);
	struct ct_entry *e = p->nonfirst_frag ? NULL : ct_find(&c.f, p);
	return to_pod_flow(skb, &c, &me, e, 0, 0);
}

/* l7_hairpin runs at tcx ingress of the hairpin device (tendril_host):
 * to_pod redirects there the packets of a flow of the node itself to a
 * port with ingress HTTP rules (l7ingress_hairpin, lib/l7ingress.h),
 * marked PROXY_MARK_HAIRPIN with the endpoint's ID; this is a tc ingress
 * hook, where they can be assigned to the ingress HTTP proxy's socket.
 * Nothing else that arrives here is touched. With no proxy listening the
 * packet is dropped (HTTP has no L4 fallback). */
SEC("tcx/ingress")
int l7_hairpin(struct __sk_buff *skb)
{
	struct pkt p;
	__u32 mark = skb->mark;

	if ((mark & PROXY_MARK_MASK) != PROXY_MARK_HAIRPIN)
		return TC_ACT_OK;
	__u16 ep_id = (__u16)(mark >> 16);
	__builtin_memset(&p, 0, sizeof(p));
	int reason = parse(skb, &p);
	if (reason)
		return drop(reason, DIR_INGRESS, ep_id, &p, 0, 0, 0);
	/* The frame still carries the pod's MAC: the stack would take it as
	 * another host's and drop it (PACKET_OTHERHOST). */
	bpf_skb_change_type(skb, 0 /* PACKET_HOST */);
	if (proxy_redirect(skb, &p, PROXY_HTTP_INGRESS) < 0)
		return drop(REASON_POLICY_DENIED, DIR_INGRESS, ep_id, &p, 0, 0, 0);
	return TC_ACT_OK;
}
