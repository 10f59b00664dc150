/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: policy: an endpoint's verdict on a new flow, looked
 * up in its own tries (tdr_policy_v2), reported as a drop or, when asked,
 * as a policy verdict event; and admit, one endpoint's verdict on any
 * packet given what conntrack knows of its flow. */
#ifndef TDR_POLICY_H
#define TDR_POLICY_H

#include "maps.h"
#include "pkt.h"
#include "events.h"
#include "endpoint.h"
#include "ipcache.h"
#include "conntrack.h"

/* Policy verdict events for allowed new flows cost a ring buffer write per
 * connection; the loader turns them on when asked (drops always report). */
volatile const __u8 POLICY_VERDICT_EVENTS = 0;

/* policy_lookup: 0 allowed, REASON_POLICY_DENIED (no rule allows),
 * REASON_POLICY_DENY_RULE (a deny rule matched). Deny wins over allow. The
 * endpoint's "any identity" trie is looked up only when it has one. */
static __always_inline int policy_lookup(__u16 ep_id, __u8 dir, __u32 identity, const struct pkt *p, __u32 *cookie,
					 __u8 *match)
{
	struct policy_key k = {};
	struct policy_entry *exact = NULL, *any = NULL;
	__u32 slot = policy_slot(ep_id, dir, 0);
	void *trie = bpf_map_lookup_elem(&tdr_policy_v2, &slot);

	k.prefixlen = POLICY_FULL_PREFIX;
	k.identity = identity;
	k.proto = p->proto;
	k.dport = p->pport;
	if (trie) {
		exact = bpf_map_lookup_elem(trie, &k);
		if (exact && exact->deny) {
			*cookie = exact->cookie;
			return REASON_POLICY_DENY_RULE;
		}
	}
	slot = policy_slot(ep_id, dir, 1);
	trie = bpf_map_lookup_elem(&tdr_policy_v2, &slot);
	if (trie) {
		k.identity = ID_ANY;
		any = bpf_map_lookup_elem(trie, &k);
		if (any && any->deny) {
			*cookie = any->cookie;
			return REASON_POLICY_DENY_RULE;
		}
	}
	if (exact) {
		*cookie = exact->cookie;
		*match = exact->match;
		return 0;
	}
	if (any) {
		*cookie = any->cookie;
		*match = any->match;
		return 0;
	}
	return REASON_POLICY_DENIED;
}

/* policy decides a new flow for endpoint ep, which enforces direction dir:
 * 0 to pass, -1 when denied (counted and reported). peer_id is the
 * identity of the other side, or 0 to look it up in the ipcache. A global
 * function, verified on its own (see parse in parse.h). */
__attribute__((noinline)) int policy(const struct endpoint_info *ep, __u32 dir, const struct pkt *p, __u32 peer_id)
{
	if (!ep || !p)
		return -1;
	__u16 ep_id = ep->ep_id;
	if (!peer_id)
		peer_id = identity_of(p->family, dir == DIR_INGRESS ? p->saddr : p->daddr);
	__u32 src_id = dir == DIR_INGRESS ? peer_id : ep->identity;
	__u32 dst_id = dir == DIR_INGRESS ? ep->identity : peer_id;
	__u32 cookie = 0;
	__u8 match = 0;
	int reason = policy_lookup(ep_id, dir, peer_id, p, &cookie, &match);
	/* A rule's CIDR selects every address in its block, a pod's or a
	 * node's too (Kubernetes' ipBlock): the peer's address is looked up in
	 * the prefixes rules name, and its entries decide beside the peer's
	 * identity. A deny in either wins, else an allow in either. */
	if (reason != REASON_POLICY_DENY_RULE && in_cluster_peer(peer_id)) {
		__u32 cidr_id = policy_cidr_of(p->family, dir == DIR_INGRESS ? p->saddr : p->daddr);
		if (cidr_id) {
			__u32 cidr_cookie = 0;
			__u8 cidr_match = 0;
			int r = policy_lookup(ep_id, dir, cidr_id, p, &cidr_cookie, &cidr_match);
			if (r == REASON_POLICY_DENY_RULE || (r == 0 && reason)) {
				reason = r;
				cookie = cidr_cookie;
				match = cidr_match;
			}
		}
	}
	if (reason) {
		drop(reason, dir, ep_id, p, src_id, dst_id, cookie);
		return -1;
	}
	if (POLICY_VERDICT_EVENTS)
		emit(EVENT_POLICY_VERDICT, REASON_FORWARDED, dir, ep_id, p, src_id, dst_id, VERDICT_ALLOWED, cookie, match);
	return 0;
}

/* admit is one endpoint's verdict on a packet given its conntrack view ct:
 * a new flow goes through policy where the endpoint enforces the
 * direction. Fragments after the first carry no ports: without reassembly
 * state they cannot be matched, so they pass only where no policy is
 * enforced. It returns 0 to pass (counted), -1 when dropped (counted and
 * reported). */
static __always_inline int admit(const struct endpoint_info *ep, __u8 dir, const struct pkt *p, int ct, __u32 peer_id)
{
	if (p->nonfirst_frag) {
		if (enforced(ep, dir)) {
			drop(REASON_FRAGMENT, dir, ep->ep_id, p, 0, 0, 0);
			return -1;
		}
		count(REASON_FORWARDED, dir, p->len);
		return 0;
	}
	if (ct == CT_NEW) {
		if (enforced(ep, dir) && policy(ep, dir, p, peer_id))
			return -1;
		count(REASON_FORWARDED, dir, p->len);
		return 0;
	}
	count(ct, dir, p->len); /* CT_x equals REASON_CT_x */
	return 0;
}

#endif
