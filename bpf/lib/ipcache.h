/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the ipcache: the security identity of an address. */
#ifndef TDR_IPCACHE_H
#define TDR_IPCACHE_H

#include "maps.h"

/* identity_of: the identity of the longest prefix holding addr; an address
 * the ipcache does not know is the world's. */
static __always_inline __u32 identity_of(__u8 family, const __u8 *addr)
{
	struct ipcache_key k = {};
	k.family = family;
	if (family == FAMILY_V4) {
		k.prefixlen = 32 + 32;
		__builtin_memcpy(k.addr, addr, 4);
	} else {
		k.prefixlen = 32 + 128;
		__builtin_memcpy(k.addr, addr, 16);
	}
	struct ipcache_info *info = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
	if (!info)
		return ID_WORLD;
	return info->identity;
}

/* in_cluster_peer: the identity is a pod's or a node's (the ipcache gave
 * the address an identity of its own), not the world's or a CIDR's. */
static __always_inline int in_cluster_peer(__u32 id)
{
	return !(id & ID_LOCAL_SCOPE) && id != ID_WORLD && id != ID_WORLD_IPV4 && id != ID_WORLD_IPV6;
}

#endif
