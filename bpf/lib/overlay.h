/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the overlay of the tunnel routing mode
 * (docs/routing.md). The node keeps one kernel tunnel device in external
 * (collect_md) mode, tendril_vxlan (or tendril_geneve); a program sets
 * each packet's tunnel key and the device builds the outer headers. The
 * key names the node that owns the destination (its ipcache entry's
 * tunnel_ip) and carries the source's security identity as the tunnel ID
 * (the VXLAN VNI, Geneve's VNI), so the receiving node enforces policy on
 * the identity the sender vouched for, without looking up the source
 * address. */
#ifndef TDR_OVERLAY_H
#define TDR_OVERLAY_H

#include "maps.h"
#include "pkt.h"
#include "events.h"

/* A VNI is 24 bits: identities of the cluster scope fit; local-scope
 * ones (CIDR identities, ID_LOCAL_SCOPE and up) are never a pod's. */
#define TUNNEL_ID_MASK 0xffffffU

#include "geneve.h"
#define TUNNEL_TTL 64


/* tunnel_device: the overlay device's ifindex, 0 in native routing. */
static __always_inline __u32 tunnel_device(void)
{
	__u32 zero = 0;
	struct tunnel_info *t = bpf_map_lookup_elem(&tdr_tunnel_v1, &zero);
	return t ? t->ifindex : 0;
}

/* tunnel_set_key sets the tunnel key of packet p, sent by identity
 * src_id: the remote is the node the ipcache names as the owner of the
 * destination's longest prefix. Returns 0 when set, 1 when the destination
 * has no owner node (this node's, the world's: not the overlay's
 * business), or -1 when the key cannot carry src_id or the kernel refused
 * it. A global function: from_pod's paths do not multiply with it. */
__attribute__((noinline)) int tunnel_set_key(struct __sk_buff *skb, const struct pkt *p, __u32 src_id)
{
	if (!skb || !p)
		return -1;
	struct ipcache_key k = {};
	k.family = p->family;
	k.prefixlen = 32 + (p->family == FAMILY_V4 ? 32 : 128);
	__builtin_memcpy(k.addr, __builtin_assume_aligned(p->daddr, 4), 16);
	struct ipcache_info *info = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
	if (!info || !info->tunnel_family)
		return 1;
	if (src_id & ~TUNNEL_ID_MASK)
		return -1;
	struct bpf_tunnel_key key = {};
	__u64 flags = 0;
	key.tunnel_id = src_id;
	key.tunnel_ttl = TUNNEL_TTL;
	if (info->tunnel_family == FAMILY_V4) {
		__u32 ip;
		__builtin_memcpy(&ip, info->tunnel_ip, 4);
		key.remote_ipv4 = bpf_ntohl(ip); /* the helper takes host order */
	} else {
		__builtin_memcpy(key.remote_ipv6, info->tunnel_ip, 16);
		flags = BPF_F_TUNINFO_IPV6;
	}
	if (bpf_skb_set_tunnel_key(skb, &key, sizeof(key), flags) < 0)
		return -1;
	return 0;
}

/* tunnel_encap sends a pod's packet for another node's pod through the
 * overlay: its key set, redirected to the device. Returns the verdict, or
 * -1 to leave the packet to the host stack (native routing, no owner
 * node, an identity the key cannot carry). With TUNNEL_F_GENEVE_BPF the
 * headers are pushed here (geneve_encap) and no device is involved. */
static __always_inline int tunnel_encap(struct __sk_buff *skb, const struct pkt *p, __u32 src_id)
{
	if (geneve_bpf()) {
		int r = geneve_encap_v(skb, p, src_id);
		if (r == -2)
			return drop(REASON_NO_TUNNEL_KEY, DIR_EGRESS, 0, p, src_id, 0, 0);
		return r;
	}
	__u32 ifindex = tunnel_device();
	if (!ifindex)
		return -1;
	if (tunnel_set_key(skb, p, src_id))
		return -1;
	count(REASON_TO_OVERLAY, DIR_EGRESS, p->len);
	return bpf_redirect(ifindex, 0);
}

#endif
