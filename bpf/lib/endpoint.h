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

/* is_endpoint_addr: addr is one of the endpoint's own addresses. */
static __always_inline int is_endpoint_addr(const struct endpoint_info *ep, __u8 family, const __u8 *addr)
{
	if (family == FAMILY_V4)
		return (ep->flags & EP_HAS_IPV4) && u32_at(ep->ipv4) == u32_at(addr);
	return (ep->flags & EP_HAS_IPV6) && u32_at(ep->ipv6) == u32_at(addr) && u32_at(ep->ipv6 + 4) == u32_at(addr + 4) &&
	       u32_at(ep->ipv6 + 8) == u32_at(addr + 8) && u32_at(ep->ipv6 + 12) == u32_at(addr + 12);
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
