/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: WireGuard strict mode (--wireguard-strict) and the
 * pods' part of node encryption (--wireguard-encrypt-node),
 * docs/encryption.md. The agent routes the other nodes' pod CIDRs to
 * the WireGuard device; strict mode makes sure that what a pod sends
 * there does not leave the node another way (the route missing or
 * replaced, the device gone, the peer without a key): from_pod drops it
 * with REASON_UNENCRYPTED instead of handing it to the host stack. With
 * node encryption a pod's packets to a peer's own address are redirected
 * to the device (the node routes serve only what the host itself sends:
 * their rule is "iif lo"). */
#ifndef TDR_ENCRYPT_H
#define TDR_ENCRYPT_H

#include "maps.h"
#include "pkt.h"
#include "events.h"
#include "ipcache.h"

#define ENC_AF_INET 2
#define ENC_AF_INET6 10
/* lo: a FIB lookup "from" it is one for what the host itself sends. */
#define ENC_LOOPBACK_IFINDEX 1

/* encrypt_strict_check decides a pod's packet p for no local endpoint:
 * 0 when it may go on (strict mode off, a destination in no other node's
 * pod CIDR, or the FIB sends it to the WireGuard device of a peer with a
 * key), REASON_UNENCRYPTED otherwise. In the tunnel routing mode (a
 * tunnel port in the flags) the pod's packet leaves encapsulated, as a
 * UDP datagram the host itself sends to the owner node's address (the
 * ipcache's tunnel endpoint, the one the tunnel key will name): the FIB
 * is asked about that datagram, as from lo (the tunnel's rule is "iif lo
 * ipproto udp dport <port>"), so a missing rule or route, which would
 * send it in the clear, drops the pod's packet instead. */
static __always_inline int encrypt_strict_check(struct __sk_buff *skb, const struct pkt *p)
{
	__u32 zero = 0;
	struct encrypt_info *cfg = bpf_map_lookup_elem(&tdr_encrypt_v1, &zero);
	if (!cfg || !(cfg->flags & ENCRYPT_F_STRICT))
		return 0;
	struct ipcache_key k = {};
	k.family = p->family;
	k.prefixlen = 32 + (p->family == FAMILY_V4 ? 32 : 128);
	__builtin_memcpy(k.addr, __builtin_assume_aligned(p->daddr, 4), 16);
	__u32 *peer = bpf_map_lookup_elem(&tdr_encrypt_cidrs_v1, &k);
	if (!peer)
		return 0;
	__u32 dev = cfg->ifindex;
	/* A node's own address (node encryption): encrypt_node redirects
	 * every packet to a peer's address to the device, replies too, so
	 * what cannot go there (a node without a key, no device known)
	 * would leave in the clear. Decided here, before the flow's entry is
	 * written, as for the pod CIDRs; without node encryption a node's
	 * address is none of strict mode's business. */
	if (*peer & ENCRYPT_DST_NODE) {
		if (!(cfg->flags & ENCRYPT_F_NODE))
			return 0;
		return (*peer & ENCRYPT_DST_PEER) && dev ? 0 : REASON_UNENCRYPTED;
	}
	if (!(*peer & ENCRYPT_DST_PEER) || !dev)
		return REASON_UNENCRYPTED;
	/* Where the host would send it: the same FIB the stack consults
	 * after TC_ACT_OK. No neighbour is needed (the device has none), so
	 * a missing one or a too-big packet still names the device. */
	struct bpf_fib_lookup fib = {};
	__u16 tport = cfg->flags >> ENCRYPT_TUNNEL_PORT_SHIFT;
	if (tport) {
		struct ipcache_info *info = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
		if (!info || !info->tunnel_family)
			return REASON_UNENCRYPTED;
		fib.l4_protocol = IPPROTO_UDP_;
		fib.dport = bpf_htons(tport);
		if (info->tunnel_family == FAMILY_V6) {
			fib.family = ENC_AF_INET6;
			__builtin_memcpy(fib.ipv6_dst, info->tunnel_ip, 16);
		} else {
			fib.family = ENC_AF_INET;
			__builtin_memcpy(&fib.ipv4_dst, info->tunnel_ip, 4);
		}
		fib.ifindex = ENC_LOOPBACK_IFINDEX;
	} else if (p->family == FAMILY_V6) {
		fib.family = ENC_AF_INET6;
		__builtin_memcpy(fib.ipv6_src, p->saddr, 16);
		__builtin_memcpy(fib.ipv6_dst, p->daddr, 16);
	} else {
		fib.family = ENC_AF_INET;
		fib.ipv4_src = u32_at(p->saddr);
		fib.ipv4_dst = u32_at(p->daddr);
	}
	if (!tport) {
		fib.l4_protocol = p->proto;
		fib.ifindex = skb->ifindex;
	}
	long r = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if ((r == BPF_FIB_LKUP_RET_SUCCESS || r == BPF_FIB_LKUP_RET_NO_NEIGH || r == BPF_FIB_LKUP_RET_FRAG_NEEDED) &&
	    fib.ifindex == dev)
		return 0;
	return REASON_UNENCRYPTED;
}

/* encrypt_strict_drop is encrypt_strict_check for endpoint ep_id (of
 * identity src_id), the drop reported (counted, an event: a flow) when it
 * says so. Returns 1 when dropped. A global function: from_pod's paths do
 * not multiply with it, and the FIB lookup's and the event's stack is its
 * own, not added to from_pod's deepest call chain (policy's). */
__attribute__((noinline)) int encrypt_strict_drop(struct __sk_buff *skb, const struct pkt *p, __u16 ep_id, __u32 src_id)
{
	if (!skb || !p)
		return 0;
	int r = encrypt_strict_check(skb, p);
	if (!r)
		return 0;
	drop((__u8)r, DIR_EGRESS, ep_id, p, src_id, identity_of(p->family, p->daddr), 0);
	return 1;
}

/* encrypt_node decides a pod's packet p for no local endpoint (of
 * endpoint ep_id, identity src_id) with node encryption: when its
 * destination is the own address of a node that is a peer, it goes to
 * the WireGuard device (bpf_redirect: the verdict). The device encrypts
 * it for the peer whose allowed IPs hold that address (the agent writes
 * the address only when the nodes table judged it that node's own,
 * nodemanager.Rules.OwnAddresses), and the peer accepts the pod's
 * address as inner source (its pod CIDR). Replies go the same way: a
 * backend's answer to a NodePort client that the other node masqueraded
 * to its own address arrives there on the WireGuard device, whose
 * from_wireguard (bpf_host.c) translates it back as from_netdev does on
 * the underlay; the answer to a connection the other node's host opened
 * reaches its socket from the device. With strict mode, a packet to a
 * node that is no peer, or with no device known, was dropped by
 * encrypt_strict_check already; dropped here as REASON_UNENCRYPTED
 * (TC_ACT_SHOT) too should the maps have changed in between. -1 leaves
 * it to the host stack: node encryption off, no node's address. A global
 * function: off from_pod_flow's stack. */
__attribute__((noinline)) int encrypt_node(struct __sk_buff *skb, const struct pkt *p, __u16 ep_id, __u32 src_id)
{
	if (!skb || !p)
		return -1;
	__u32 zero = 0;
	struct encrypt_info *cfg = bpf_map_lookup_elem(&tdr_encrypt_v1, &zero);
	if (!cfg || !(cfg->flags & ENCRYPT_F_NODE))
		return -1;
	struct ipcache_key k = {};
	k.family = p->family;
	k.prefixlen = 32 + (p->family == FAMILY_V4 ? 32 : 128);
	__builtin_memcpy(k.addr, __builtin_assume_aligned(p->daddr, 4), 16);
	__u32 *dst = bpf_map_lookup_elem(&tdr_encrypt_cidrs_v1, &k);
	if (!dst || !(*dst & ENCRYPT_DST_NODE))
		return -1;
	__u32 dev = cfg->ifindex;
	if ((*dst & ENCRYPT_DST_PEER) && dev)
		return bpf_redirect(dev, 0);
	if (!(cfg->flags & ENCRYPT_F_STRICT))
		return -1;
	drop(REASON_UNENCRYPTED, DIR_EGRESS, ep_id, p, src_id, identity_of(p->family, p->daddr), 0);
	return TC_ACT_SHOT;
}

#endif
