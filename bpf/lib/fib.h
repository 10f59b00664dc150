/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: sending a packet on by a FIB lookup, from the host
 * device programs (nodeport.h, nodeport_dsr.h, icmperr.h): a packet the
 * host would drop (its source is a local address, or it is a reply the
 * host has no socket for) leaves through the device the FIB names for its
 * destination. Both families written once, as nat.h: the global function
 * of each family is its own copy. */
#ifndef TDR_FIB_H
#define TDR_FIB_H

#include "pkt.h"

#define AF_INET_ 2
#define AF_INET6_ 10

/* fib_redirect sends p out of the device the FIB names for its
 * destination, with the next hop's MAC, or by the kernel's neighbour
 * resolution (ARP, neighbour discovery) when none is known yet. Returns
 * the verdict, or -1 when there is no route. */
static __always_inline int fib_redirect(struct __sk_buff *skb, const struct pkt *p, const __u8 family)
{
	struct bpf_fib_lookup fib = {};

	fib.family = family == FAMILY_V6 ? AF_INET6_ : AF_INET_;
	fib.l4_protocol = p->proto;
	if (family == FAMILY_V6) {
		__builtin_memcpy(fib.ipv6_src, p->saddr, 16);
		__builtin_memcpy(fib.ipv6_dst, p->daddr, 16);
	} else {
		fib.ipv4_src = u32_at(p->saddr);
		fib.ipv4_dst = u32_at(p->daddr);
	}
	fib.ifindex = skb->ifindex;
	long r = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (r == BPF_FIB_LKUP_RET_SUCCESS) {
		if (bpf_skb_store_bytes(skb, 0, fib.dmac, ETH_ALEN, 0) ||
		    bpf_skb_store_bytes(skb, ETH_ALEN, fib.smac, ETH_ALEN, 0))
			return -1;
		return bpf_redirect(fib.ifindex, 0);
	}
	if (r == BPF_FIB_LKUP_RET_NO_NEIGH) {
		/* The FIB gave the next hop (the gateway, or the destination
		 * when on-link) in the destination's place. */
		if (family == FAMILY_V6) {
			struct bpf_redir_neigh nh = {.nh_family = AF_INET6_};
			__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16);
			return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
		}
		struct bpf_redir_neigh nh = {.nh_family = AF_INET_, .ipv4_nh = fib.ipv4_dst};
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	return -1;
}

/* fib_redirect4 and fib_redirect6 are fib_redirect of each family: global
 * functions, so the lookup's stack is not added to their callers'. */
__attribute__((noinline)) int fib_redirect4(struct __sk_buff *skb, const struct pkt *p)
{
	if (!skb || !p)
		return -1;
	return fib_redirect(skb, p, FAMILY_V4);
}

__attribute__((noinline)) int fib_redirect6(struct __sk_buff *skb, const struct pkt *p)
{
	if (!skb || !p)
		return -1;
	return fib_redirect(skb, p, FAMILY_V6);
}

#endif
