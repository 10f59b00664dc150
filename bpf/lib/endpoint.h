/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the local endpoints: by the host-side veth's ifindex,
 * by endpoint ID (the local peer a conntrack entry names) and by address,
 * and what an endpoint's flags say. */
#ifndef TDR_ENDPOINT_H
#define TDR_ENDPOINT_H

#include "maps.h"

/* endpoint_by_ifindex: the endpoint whose host-side veth is ifindex (the
 * interface a program runs on), or NULL. */
static __always_inline const struct endpoint_info *endpoint_by_ifindex(__u32 ifindex)
{
	if (ifindex < EP_IFINDEX_SLOTS) {
		const struct endpoint_info *ep = bpf_map_lookup_elem(&tdr_ep_ifindex_v1, &ifindex);
		if (ep && ep->ep_id)
			return ep;
	}
	return bpf_map_lookup_elem(&tdr_endpoints_v2, &ifindex);
}

/* endpoint_by_id: the local endpoint a conntrack entry names, or NULL. */
static __always_inline const struct endpoint_info *endpoint_by_id(__u16 id)
{
	__u32 k = id;
	const struct endpoint_info *ep = bpf_map_lookup_elem(&tdr_ep_id_v1, &k);

	if (!ep || !id || ep->ep_id != id)
		return NULL;
	return ep;
}

/* endpoint_by_addr: addr points into struct pkt, on the stack, which is a
 * valid key as it is. */
static __always_inline const struct endpoint_info *endpoint_by_addr(__u8 family, const __u8 *addr)
{
	const struct endpoint_info *ep;

	if (family == FAMILY_V4) {
		ep = bpf_map_lookup_elem(&tdr_endpoint_ip4_v1, addr);
		barrier();
	} else {
		ep = bpf_map_lookup_elem(&tdr_endpoint_ip6_v1, addr);
	}
	return ep;
}

/* aligned_word reads the 32-bit word at b, which is 4-byte aligned (a
 * type that may alias the bytes it reads). */
typedef __u32 __attribute__((may_alias, aligned(4))) tdr_word_t;

static __always_inline __u32 aligned_word(const __u8 *b)
{
	return *(const tdr_word_t *)b;
}

/* is_endpoint_addr: addr is one of the endpoint's own addresses. addr is
 * 4-byte aligned (an address of struct pkt), as are the endpoint's (map
 * values are 8-byte aligned, ipv4 and ipv6 at offsets 24 and 28): words
 * are compared instead of assembled from bytes. */
static __always_inline int is_endpoint_addr(const struct endpoint_info *ep, __u8 family, const __u8 *addr)
{
	if (family == FAMILY_V4)
		return (ep->flags & EP_HAS_IPV4) && aligned_word(ep->ipv4) == aligned_word(addr);
	return (ep->flags & EP_HAS_IPV6) && aligned_word(ep->ipv6) == aligned_word(addr) &&
	       aligned_word(ep->ipv6 + 4) == aligned_word(addr + 4) && aligned_word(ep->ipv6 + 8) == aligned_word(addr + 8) &&
	       aligned_word(ep->ipv6 + 12) == aligned_word(addr + 12);
}

/* enforced: the endpoint enforces policy in direction dir. */
static __always_inline __u8 enforced(const struct endpoint_info *ep, __u8 dir)
{
	return dir == DIR_INGRESS ? (ep->flags & EP_ENFORCE_INGRESS) : (ep->flags & EP_ENFORCE_EGRESS);
}

/* audited: an audited policy selects the endpoint in direction dir. */
static __always_inline __u8 audited(const struct endpoint_info *ep, __u8 dir)
{
	return dir == DIR_INGRESS ? (ep->flags & EP_AUDIT_INGRESS) : (ep->flags & EP_AUDIT_EGRESS);
}

#endif
