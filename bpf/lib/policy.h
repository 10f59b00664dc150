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

/* The verdicts of the two views on a new flow: the enforced one (its
 * rules alone) and, for an endpoint under audited policy, the audit one
 * (with the audited rules). Each is 0 allowed, REASON_POLICY_DENIED (no
 * entry allows) or REASON_POLICY_DENY_RULE (a deny rule matched), with the
 * deciding entry's cookie. */
struct verdicts {
	int e, a;
	__u32 e_cookie, a_cookie;
	/* The enforced view's allowing entry's match byte: its
	 * POLICY_MATCH_* and PROXY_* (policy_entry.match). */
	__u8 e_match;
};

#define VERDICT_MATCH(m) ((m) & 0x0f)
#define VERDICT_PROXY(m) ((m) >> 4)

/* a_denies: the audit view denies at entry pe (an entry without flags is
 * an enforced one the audit view shares). */
static __always_inline int a_denies(const struct policy_entry *pe)
{
	return (pe->flags & POLICY_F_A_DENY) || (!pe->flags && pe->deny);
}

/* view_verdict is one view's verdict from its exact and any entries, each
 * taken when x_in (y_in) is set. Deny wins over allow. */
static __always_inline void view_verdict(const struct policy_entry *x, const struct policy_entry *y, int x_in, int y_in,
					 int x_deny, int y_deny, int *r, __u32 *cookie, __u8 *match)
{
	if (x_in && x_deny) {
		*r = REASON_POLICY_DENY_RULE;
		*cookie = x->cookie;
	} else if (y_in && y_deny) {
		*r = REASON_POLICY_DENY_RULE;
		*cookie = y->cookie;
	} else if (x_in) {
		*r = 0;
		*cookie = x->cookie;
		*match = x->match;
	} else if (y_in) {
		*r = 0;
		*cookie = y->cookie;
		*match = y->match;
	} else {
		*r = REASON_POLICY_DENIED;
		*cookie = 0;
	}
}

/* policy_lookup fills v for one peer identity from the endpoint's tries:
 * the "any identity" trie is looked up only when the endpoint has one;
 * the audit view only when audit is set. what packs audit (bit 0), dir
 * (bits 8-15) and the endpoint ID (from bit 16).
 *
 * A global function, and the entries are copied out of the tries at once:
 * inlined and reading through the entry pointers, the verifier walked
 * every later step (the second identity's lookup, combine, the drop and
 * event paths) once per combination of "which entry was found" and
 * "which verdict each view got", three values each, for both views and
 * both identities: 130,000 of the pod programs' verified instructions
 * each. Called, it is verified once with its inputs unknown, and the
 * caller knows nothing of the verdicts it wrote, so its states after the
 * call prune. */
__attribute__((noinline)) int policy_lookup(__u32 what, __u32 identity, const struct pkt *p, struct verdicts *v)
{
	__u16 ep_id = what >> 16;
	__u8 dir = (what >> 8) & 0xff, audit = what & 1;
	struct policy_key k = {};
	struct policy_entry x = {}, y = {};
	int has_x = 0, has_y = 0;

	if (!p || !v)
		return 0;
	__u32 slot = policy_slot(ep_id, dir, 0);
	void *trie = bpf_map_lookup_elem(&tdr_policy_v2, &slot);
	k.prefixlen = POLICY_FULL_PREFIX;
	k.identity = identity;
	k.proto = p->proto;
	k.dport = p->pport;
	if (trie) {
		struct policy_entry *pe = bpf_map_lookup_elem(trie, &k);
		if (pe) {
			x = *pe;
			has_x = 1;
		}
	}
	slot = policy_slot(ep_id, dir, 1);
	trie = bpf_map_lookup_elem(&tdr_policy_v2, &slot);
	if (trie) {
		k.identity = ID_ANY;
		struct policy_entry *pe = bpf_map_lookup_elem(trie, &k);
		if (pe) {
			y = *pe;
			has_y = 1;
		}
	}
	int ex = has_x && !(x.flags & POLICY_F_E_NONE), ey = has_y && !(y.flags & POLICY_F_E_NONE);
	view_verdict(&x, &y, ex, ey, x.deny, y.deny, &v->e, &v->e_cookie, &v->e_match);
	if (!audit) {
		v->a = v->e;
		v->a_cookie = v->e_cookie;
		return 0;
	}
	int ax = has_x && !(x.flags & POLICY_F_A_NONE), ay = has_y && !(y.flags & POLICY_F_A_NONE);
	__u8 a_match = 0;
	view_verdict(&x, &y, ax, ay, a_denies(&x), a_denies(&y), &v->a, &v->a_cookie, &a_match);
	return 0;
}

/* combine folds another identity's verdict (r2, c2) into one view's: a
 * deny in either wins, else an allow in either. */
static __always_inline int combine(int *r, __u32 *c, int r2, __u32 c2)
{
	if (*r == REASON_POLICY_DENY_RULE)
		return 0;
	if (r2 == REASON_POLICY_DENY_RULE || (r2 == 0 && *r)) {
		*r = r2;
		*c = c2;
		return 1;
	}
	return 0;
}

/* audit_cookie is the rule an endpoint's audit view names for direction
 * dir when no rule allows a flow: an entry of its any-identity trie under
 * a protocol no packet is matched with. */
static __always_inline __u32 audit_cookie(__u16 ep_id, __u8 dir)
{
	__u32 slot = policy_slot(ep_id, dir, 1);
	void *trie = bpf_map_lookup_elem(&tdr_policy_v2, &slot);
	if (!trie)
		return 0;
	struct policy_key k = {};
	k.prefixlen = POLICY_FULL_PREFIX;
	k.identity = ID_ANY;
	k.proto = POLICY_AUDIT_COOKIE_PROTO;
	struct policy_entry *pe = bpf_map_lookup_elem(trie, &k);
	return pe ? pe->cookie : 0;
}

/* audit_pass counts a flow an audited policy would have denied under the
 * rule's cookie and reports it with an AUDIT verdict; the flow passes. A
 * global function, verified once (see drop_out). */
__attribute__((noinline)) int audit_pass(const struct pkt *p, __u32 what, __u32 src_id, __u32 dst_id, __u32 cookie)
{
	__u8 dir = (what >> 8) & 0xff;
	__u16 ep_id = what >> 16;
	__u64 one = 1, *n = bpf_map_lookup_elem(&tdr_audit_v1, &cookie);

	if (!p)
		return 0;
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&tdr_audit_v1, &cookie, &one, BPF_NOEXIST);
	emit(EVENT_POLICY_VERDICT, REASON_FORWARDED, dir, ep_id, p, src_id, dst_id, VERDICT_AUDIT, cookie, 0);
	return 0;
}

/* peer_key fills k with the ipcache key of the packet's peer address as
 * endpoint direction dir sees it (the source for ingress). All 16 bytes
 * are copied whatever the family: an IPv4 key's prefix length ends the
 * trie's comparison after its 4 address bytes. The addresses sit at
 * offsets 8 and 24 of struct pkt, which holds a __u64: 4-byte aligned,
 * so the copy is four word moves instead of sixteen byte moves. */
static __always_inline void peer_key(struct ipcache_key *k, const struct pkt *p, __u32 dir)
{
	const __u8 *a = dir == DIR_INGRESS ? p->saddr : p->daddr;

	k->prefixlen = 32 + (p->family == FAMILY_V4 ? 32 : 128);
	k->family = p->family;
	__builtin_memcpy(k->addr, __builtin_assume_aligned(a, 4), 16);
}

/* policy decides a new flow for endpoint ep, which enforces direction dir
 * or audits it (or both): 0 to pass, -1 when denied (counted and
 * reported). On egress, the PROXY_* the enforced view's allowing entry
 * names goes into p->proxy (0: none). peer_id is the identity of the other side, or 0 to look it up in the
 * ipcache. A global function, verified on its own (see parse in
 * parse.h). */
__attribute__((noinline)) int policy(const struct endpoint_info *ep, __u32 dir, const struct pkt *p, __u32 peer_id)
{
	if (!ep || !p)
		return -1;
	__u16 ep_id = ep->ep_id;
	__u8 enf = enforced(ep, dir), aud = audited(ep, dir);
	/* A rule's CIDR selects every address in its block, a pod's or a
	 * node's too (Kubernetes' ipBlock): the peer's address is looked up in
	 * the prefixes rules name, and its entries decide beside the peer's
	 * identity. One key serves both lookups; its scope ends before the
	 * verdicts' starts, so that they share stack (the pod programs' call
	 * chain, from_pod -> from_pod_flow -> policy -> policy_lookup, must fit
	 * in 512 bytes). */
	__u32 cidr_id = 0;
	{
		struct ipcache_key k = {};
		peer_key(&k, p, dir);
		if (!peer_id) {
			struct ipcache_info *info = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
			peer_id = info ? info->identity : ID_WORLD;
		}
		if (in_cluster_peer(peer_id)) {
			__u32 *id = bpf_map_lookup_elem(&tdr_policy_cidr_v1, &k);
			cidr_id = id ? *id : 0;
		}
	}
	__u32 src_id = dir == DIR_INGRESS ? peer_id : ep->identity;
	__u32 dst_id = dir == DIR_INGRESS ? ep->identity : peer_id;
	__u32 what = (__u32)ep_id << 16 | (__u32)dir << 8 | (aud ? 1 : 0);
	struct verdicts v = {};
	policy_lookup(what, peer_id, p, &v);
	/* A deny in either wins, else an allow in either; an enforced deny
	 * rule decides alone. */
	if (cidr_id && !(enf && v.e == REASON_POLICY_DENY_RULE)) {
		struct verdicts w = {};
		policy_lookup(what, cidr_id, p, &w);
		if (combine(&v.e, &v.e_cookie, w.e, w.e_cookie))
			v.e_match = w.e_match;
		combine(&v.a, &v.a_cookie, w.a, w.a_cookie);
	}
	if (enf && v.e) {
		drop(v.e, dir, ep_id, p, src_id, dst_id, v.e_cookie);
		return -1;
	}
	if (aud && v.a) {
		__u32 cookie = v.a == REASON_POLICY_DENY_RULE ? v.a_cookie : audit_cookie(ep_id, dir);
		audit_pass(p, (__u32)dir << 8 | (__u32)ep_id << 16, src_id, dst_id, cookie);
		goto out;
	}
	if (enf && POLICY_VERDICT_EVENTS)
		emit(EVENT_POLICY_VERDICT, REASON_FORWARDED, dir, ep_id, p, src_id, dst_id, VERDICT_ALLOWED, v.e_cookie, VERDICT_MATCH(v.e_match));
out:
	/* The pod programs' redirect reads it from the packet. An ingress
	 * entry's HTTP proxy is PROXY_HTTP_INGRESS, unless the source's
	 * egress already sends the flow to a proxy: when that is the HTTP
	 * proxy, it applies the destination's ingress HTTP rules as well
	 * (PROXY_HTTP_BOTH, docs/policy-l7.md "Egress and ingress rules on
	 * one flow"); the DNS proxy's flows keep their proxy. */
	if (enf && dir == DIR_EGRESS)
		((struct pkt *)p)->proxy = VERDICT_PROXY(v.e_match);
	else if (enf && VERDICT_PROXY(v.e_match) == PROXY_HTTP && !p->proxy)
		((struct pkt *)p)->proxy = PROXY_HTTP_INGRESS;
	else if (enf && VERDICT_PROXY(v.e_match) == PROXY_HTTP && p->proxy == PROXY_HTTP)
		((struct pkt *)p)->proxy = PROXY_HTTP_BOTH;
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
		if ((enforced(ep, dir) || audited(ep, dir)) && policy(ep, dir, p, peer_id))
			return -1;
		count(REASON_FORWARDED, dir, p->len);
		return 0;
	}
	count(ct, dir, p->len); /* CT_x equals REASON_CT_x */
	return 0;
}

#endif
