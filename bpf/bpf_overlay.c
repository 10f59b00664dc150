// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Tendril's overlay programs (tunnel routing mode, docs/routing.md),
 * attached with TCX to the node's tunnel device (tendril_vxlan or
 * tendril_geneve, external mode: the kernel builds and strips the outer
 * headers, these programs read and write the tunnel key).
 *
 * from_overlay (tcx ingress: decapsulated packets from other nodes): a
 * packet whose outer source is no known node's address is dropped; the
 * source's identity is the tunnel ID the sending node set (lib/overlay.h);
 * a packet for a local endpoint goes through that endpoint's ingress
 * policy with that identity (no lookup of the source address), its flow's
 * conntrack entry and a service reply's reverse NAT, as to_pod would, and
 * is delivered into the pod's namespace; a packet for the node itself
 * goes to the host stack.
 *
 * to_overlay (tcx egress): a packet the host stack routed to the device
 * (a route to another node's pod CIDR: the node's own traffic to pods,
 * NodePort to a remote backend) has no tunnel key yet; it gets one from
 * the ipcache as from_pod's packets do, its identity the source's (a
 * local endpoint's, else the ipcache's: the host's). A packet from_pod
 * redirected has its key and passes. */
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

#define PACKET_HOST_ 0

/* tunnel_key_of reads the packet's tunnel key (IPv4 or IPv6 underlay)
 * into key: 0 for an IPv4 underlay, 1 for IPv6, -1 when the packet has
 * none. */
static __always_inline int tunnel_key_of(struct __sk_buff *skb, struct bpf_tunnel_key *key)
{
	if (bpf_skb_get_tunnel_key(skb, key, sizeof(*key), 0) == 0)
		return 0;
	if (bpf_skb_get_tunnel_key(skb, key, sizeof(*key), BPF_F_TUNINFO_IPV6) == 0)
		return 1;
	return -1;
}

/* overlay_source is the identity of a decapsulated packet's source: the
 * tunnel ID the sending node set, or -REASON_* to drop the packet: no
 * tunnel key, or an outer source (the key's remote) that is no known
 * node's address (the ipcache flags a peer's own addresses), since anyone
 * else who reaches the tunnel port could put any identity in the VNI. A
 * global function: its key is not on the stack of from_overlay's call
 * chain through policy, which is near the 512 bytes. */
__attribute__((noinline)) int overlay_source(struct __sk_buff *skb)
{
	struct bpf_tunnel_key key = {};
	struct ipcache_key k = {};

	if (!skb)
		return -REASON_NO_TUNNEL_KEY;
	int v6 = tunnel_key_of(skb, &key);
	if (v6 < 0)
		return -REASON_NO_TUNNEL_KEY;
	if (v6) {
		k.family = FAMILY_V6;
		k.prefixlen = 32 + 128;
		__builtin_memcpy(k.addr, key.remote_ipv6, 16);
	} else {
		__u32 a = bpf_htonl(key.remote_ipv4);
		k.family = FAMILY_V4;
		k.prefixlen = 32 + 32;
		__builtin_memcpy(k.addr, &a, 4);
	}
	struct ipcache_info *info = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
	if (!info || !(info->flags & IPCACHE_F_REMOTE_NODE))
		return -REASON_TUNNEL_NOT_A_NODE;
	return (int)(key.tunnel_id & TUNNEL_ID_MASK);
}

/* has_tunnel_key: the packet has a tunnel key (from_pod set it). A global
 * function, as overlay_source. */
__attribute__((noinline)) int has_tunnel_key(struct __sk_buff *skb)
{
	struct bpf_tunnel_key key = {};

	if (!skb)
		return 0;
	return tunnel_key_of(skb, &key) >= 0;
}

SEC("tcx/ingress")
int from_overlay(struct __sk_buff *skb)
{
	struct lxc_pkt c;
	struct pkt *p = &c.p;

	__builtin_memset(p, 0, sizeof(*p));
	int src = overlay_source(skb);
	if (src < 0)
		return drop((__u8)-src, DIR_INGRESS, 0, p, 0, 0, 0);
	__u32 src_id = (__u32)src;
	/* The sender's host is a remote node here; ID 0 (a sender that set
	 * none) is nobody the policy knows: the world. */
	if (src_id == ID_HOST)
		src_id = ID_REMOTE_NODE;
	else if (src_id == 0)
		src_id = ID_WORLD;
	int reason = parse(skb, p);
	if (reason)
		return drop(reason, DIR_INGRESS, 0, p, src_id, 0, 0);
	/* The inner frame carries the sending pod's MAC addresses: for the
	 * host's stack it is this node's. */
	bpf_skb_change_type(skb, PACKET_HOST_);
	if (p->arp || p->ndp)
		return TC_ACT_OK;
	const struct endpoint_info *ep = endpoint_by_addr(p->family, p->daddr);
	if (!ep)
		return TC_ACT_OK; /* the node's own: its stack, its programs */
	/* One copy on the stack, as to_pod's (one pointer for the verifier
	 * whatever map the endpoint came from). */
	struct endpoint_info me __attribute__((aligned(8)));
	__builtin_memcpy(&me, __builtin_assume_aligned(ep, 8), sizeof(me));
	c.nat = 0;
	flow_of(&c.f, p);
	struct ct_entry *e = p->nonfirst_frag ? NULL : ct_find(&c.f, p);
	int ret = to_pod_flow(skb, &c, &me, e, src_id);
	if (ret != TC_ACT_OK)
		return ret;
	/* The pod's to_pod does not run after this: its ingress was
	 * decided here, once. TTL expiring: the host answers it. */
	ret = deliver_direct(skb, p, &me);
	return ret >= 0 ? ret : TC_ACT_OK;
}

SEC("tcx/egress")
int to_overlay(struct __sk_buff *skb)
{
	struct pkt pk;

	if (has_tunnel_key(skb))
		return TC_ACT_OK; /* from_pod set it */
	__builtin_memset(&pk, 0, sizeof(pk));
	int reason = parse(skb, &pk);
	if (reason)
		return drop(reason, DIR_EGRESS, 0, &pk, 0, 0, 0);
	if (pk.arp || pk.ndp)
		return TC_ACT_SHOT; /* the overlay has no neighbours */
	const struct endpoint_info *ep = endpoint_by_addr(pk.family, pk.saddr);
	__u32 id = ep ? ep->identity : identity_of(pk.family, pk.saddr);
	if (tunnel_set_key(skb, &pk, id))
		return drop(REASON_NO_TUNNEL_KEY, DIR_EGRESS, 0, &pk, id, 0, 0);
	count(REASON_TO_OVERLAY, DIR_EGRESS, pk.len);
	return TC_ACT_OK;
}
