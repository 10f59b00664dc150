// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Tendril's overlay programs (tunnel routing mode, docs/routing.md),
 * attached with TCX to the node's tunnel device (tendril_vxlan or
 * tendril_geneve, external mode: the kernel builds and strips the outer
 * headers, these programs read and write the tunnel key).
 *
 * from_overlay (tcx ingress: decapsulated packets from other nodes): a
 * packet whose outer source is no known node's address is dropped, and so
 * is one whose inner source the ipcache names as another node's (a node
 * may send only for its own pods); the source's identity is the ipcache's
 * for the inner source, as in native routing, not the tunnel ID the
 * sending node set (overlay_source says why); a packet for a local
 * endpoint goes through that endpoint's ingress policy with it, its flow's
 * conntrack entry and a service reply's reverse NAT, as to_pod would, and
 * is delivered into the pod's namespace (a flow the endpoint's ingress
 * sends to the HTTP proxy goes to the proxy's ingress listener instead,
 * lib/l7ingress.h, with the identity decided here); a packet for the node itself
 * goes to the host stack. With --bpf-lb-mode=dsr (LB_DSR), a request
 * another node sent on to a local backend by direct server return has its
 * frontend recorded from the IPv4 option (nodeport_dsr_recv, as
 * from_netdev does in native routing) or, through Geneve in eBPF, from
 * the Geneve DSR option (geneve_dsr_recv, IPv4 and IPv6), so the
 * backend's reply leaves this node's uplink with the frontend as its
 * source, straight to the client.
 *
 * to_overlay (tcx egress): a packet the host stack routed to the device
 * (a route to another node's pod CIDR: the node's own traffic to pods,
 * NodePort to a remote backend) has no tunnel key yet; it gets one from
 * the ipcache as from_pod's packets do, its identity the source's (a
 * local endpoint's, else the ipcache's: the host's). A packet from_pod
 * redirected has its key and passes. With Geneve in eBPF
 * (TUNNEL_F_GENEVE_BPF) the device is an ifb carrier with no tunnel of
 * its own, and to_overlay pushes the Geneve headers itself (geneve_encap,
 * lib/geneve.h) and redirects the packet out of the underlay. */
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
#include "lib/nodeport_dsr.h"
#include "lib/overlay.h"
#include "lib/l7ingress.h"

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

/* overlay_source is the identity of a decapsulated packet's inner source
 * p->saddr, or -REASON_* to drop the packet; the tunnel key is read once
 * for both of its checks.
 *
 * The outer source (the key's remote) must be a known node's address (the
 * ipcache flags a peer's own addresses): anyone else who reaches the
 * tunnel port could send as a node (REASON_TUNNEL_NOT_A_NODE; no key:
 * REASON_NO_TUNNEL_KEY).
 *
 * The inner source is judged by the ipcache, not by the tunnel ID: a node
 * the ipcache trusts could otherwise put any identity in the VNI, a
 * database's for a pod of its own, or any pod's for a source address of
 * another node's pod. So: when the ipcache names an owner node for the
 * inner source (a remote pod's entry), the outer source must be that node
 * (else REASON_INVALID_SOURCE), and the identity is the entry's, which the
 * agent admitted only for an endpoint the owner node may claim
 * (pkg/nodemanager's claims); an address the ipcache gives no owner (the
 * world, a node's own address, a pod not learnt yet) has the identity the
 * ipcache gives it, as native routing would; this node's own pods and
 * addresses (no owner either) are REASON_INVALID_SOURCE. The VNI differs
 * from the entry only while an identity change travels, when native
 * routing too decides on the ipcache's. ARP and NDP have no inner source
 * to judge (0). A global function: its keys are not on the stack of
 * from_overlay's call chain through policy, which is near the 512 bytes. */
__attribute__((noinline)) int overlay_source(struct __sk_buff *skb, const struct pkt *p)
{
	struct bpf_tunnel_key key = {};
	struct ipcache_key k = {};

	if (!skb || !p)
		return -REASON_NO_TUNNEL_KEY;
	int v6;
	__u32 mark = skb->cb[GENEVE_CB_MARK];
	if (mark == GENEVE_CB_MAGIC) {
		/* From from_netdev's Geneve decapsulation (lib/geneve.h):
		 * the outer source in cb, an IPv4 underlay. */
		v6 = 0;
		key.remote_ipv4 = bpf_ntohl(skb->cb[GENEVE_CB_OUTER]);
	} else if (mark == GENEVE_CB_MAGIC6 || mark == GENEVE_CB_MAGIC6_DSR) {
		/* The same over an IPv6 underlay: four words of cb. */
		v6 = 1;
		key.remote_ipv6[0] = skb->cb[GENEVE_CB_OUTER];
		key.remote_ipv6[1] = skb->cb[GENEVE_CB_OUTER6_1];
		key.remote_ipv6[2] = skb->cb[GENEVE_CB_OUTER6_2];
		key.remote_ipv6[3] = skb->cb[GENEVE_CB_OUTER6_3];
	} else {
		v6 = tunnel_key_of(skb, &key);
		if (v6 < 0)
			return -REASON_NO_TUNNEL_KEY;
	}
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
	struct ipcache_info *node = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
	if (!node || !(node->flags & IPCACHE_F_REMOTE_NODE))
		return -REASON_TUNNEL_NOT_A_NODE;
	if (p->arp || p->ndp)
		return 0;

	/* This node's own pods and addresses never come from the overlay. */
	if (endpoint_by_addr(p->family, p->saddr))
		return -REASON_INVALID_SOURCE;
	__builtin_memset(&k, 0, sizeof(k));
	k.family = p->family;
	k.prefixlen = 32 + (p->family == FAMILY_V4 ? 32 : 128);
	__builtin_memcpy(k.addr, __builtin_assume_aligned(p->saddr, 4), 16);
	struct ipcache_info *info = bpf_map_lookup_elem(&tdr_ipcache_v2, &k);
	if (!info)
		return ID_WORLD;
	if (info->identity == ID_HOST)
		return -REASON_INVALID_SOURCE;
	if (!info->tunnel_family)
		return (int)info->identity;
	if (v6) {
		__u32 owner6[4];
		__builtin_memcpy(owner6, info->tunnel_ip, 16);
		if (info->tunnel_family != FAMILY_V6 || owner6[0] != key.remote_ipv6[0] || owner6[1] != key.remote_ipv6[1] ||
		    owner6[2] != key.remote_ipv6[2] || owner6[3] != key.remote_ipv6[3])
			return -REASON_INVALID_SOURCE;
	} else {
		__u32 outer = bpf_htonl(key.remote_ipv4), owner;
		__builtin_memcpy(&owner, info->tunnel_ip, 4);
		if (info->tunnel_family != FAMILY_V4 || owner != outer)
			return -REASON_INVALID_SOURCE;
	}
	return (int)info->identity;
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

/* overlay_in decides a decapsulated packet (from_overlay, from_geneve). */
static __always_inline int overlay_in(struct __sk_buff *skb)
{
	struct lxc_pkt c;
	struct pkt *p = &c.p;

	__builtin_memset(p, 0, sizeof(*p));
	int reason = parse(skb, p);
	if (reason)
		return drop(reason, DIR_INGRESS, 0, p, 0, 0, 0);
	int src = overlay_source(skb, p);
	if (src < 0)
		return drop((__u8)-src, DIR_INGRESS, 0, p, 0, 0, 0);
	__u32 src_id = (__u32)src;
	/* The inner frame carries the sending pod's MAC addresses: for the
	 * host's stack it is this node's. */
	bpf_skb_change_type(skb, PACKET_HOST_);
	if (p->arp || p->ndp)
		return TC_ACT_OK;
	/* A DSR request for a backend here (the option rides inside the
	 * overlay): only packets with IPv4 options pay the look. */
	if (LB_DSR && p->family == FAMILY_V4 && p->l4_off > ETH_HLEN + 20 && (p->proto == IPPROTO_TCP_ || p->proto == IPPROTO_UDP_))
		nodeport_dsr_recv(skb, p);
	/* Or in the Geneve DSR option, either family (lib/geneve.h). */
	if (LB_DSR && geneve_cb_dsr(skb))
		geneve_dsr_recv(p);
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
	/* A flow the pod's ingress sent to the HTTP proxy: its packets go
	 * to the proxy's socket again (lib/l7ingress.h); other established
	 * packets pay nothing more. */
	if (e && e->proxy == PROXY_HTTP_INGRESS && p->proto == IPPROTO_TCP_) {
		int l7 = l7ingress_known(skb, p, me.ep_id, me.identity);
		if (l7 != L7INGRESS_PASS && l7 != L7INGRESS_NEW)
			return l7;
	}
	/* A new flow the pod's ingress admits through the HTTP proxy goes
	 * to its ingress listener, from here: a tc ingress hook, where
	 * bpf_sk_assign works (to_pod's tcx egress is not), with src_id,
	 * decided above, recorded for the proxy. */
	/* The reply to a flow the pod's egress sent to the HTTP proxy, whose
	 * upstream connection left with the pod's address (lib/proxy.h):
	 * to the proxy's socket in the host. */
	if (e && e->proxy == PROXY_HTTP && ct_is_reply(e, &c.f)) {
		int r = proxy_upstream_sk(skb, p);
		if (r >= 0)
			return r;
	}
	int ret = to_pod_flow(skb, &c, &me, e, src_id, 1);
	if (ret == TO_POD_L7INGRESS)
		return l7ingress_admitted(skb, p, me.ep_id, me.identity, src_id);
	if (ret != TC_ACT_OK)
		return ret;
	/* The pod's to_pod does not run after this: its ingress was
	 * decided here, once. TTL expiring: the host answers it. */
	ret = deliver_direct(skb, p, &me);
	return ret >= 0 ? ret : TC_ACT_OK;
}

SEC("tcx/ingress")
int from_overlay(struct __sk_buff *skb)
{
	/* A device's packet: its tunnel key, not cb, names the outer
	 * source (cb may hold anything here). */
	skb->cb[GENEVE_CB_MARK] = 0;
	return overlay_in(skb);
}

/* from_geneve: a packet from_netdev decapsulated from Geneve (lib/geneve.h),
 * reached only by its tail call (tdr_overlay_calls_v1), never attached:
 * the outer source and the VNI are in cb, set by geneve_decap. */
SEC("tcx/ingress") /* the host's from_netdev's type: a tail call needs it */
int from_geneve(struct __sk_buff *skb)
{
	if (!geneve_cb_marked(skb))
		return TC_ACT_SHOT;
	return overlay_in(skb);
}

SEC("tcx/egress")
int to_overlay(struct __sk_buff *skb)
{
	struct pkt pk;
	int geneve = geneve_bpf();

	if (!geneve && has_tunnel_key(skb))
		return TC_ACT_OK; /* from_pod set it */
	__builtin_memset(&pk, 0, sizeof(pk));
	int reason = parse(skb, &pk);
	if (reason)
		return drop(reason, DIR_EGRESS, 0, &pk, 0, 0, 0);
	if (pk.arp || pk.ndp)
		return TC_ACT_SHOT; /* the overlay has no neighbours */
	const struct endpoint_info *ep = endpoint_by_addr(pk.family, pk.saddr);
	__u32 id = ep ? ep->identity : identity_of(pk.family, pk.saddr);
	if (geneve) {
		/* Geneve in eBPF: the device is a carrier without a tunnel of
		 * its own (pkg/datapath/tunnel's EnsureCarrier); the headers
		 * are pushed here and the packet leaves by the underlay. What
		 * cannot be encapsulated (no owner node, no route to it) is
		 * dropped: the carrier would drop it anyway. */
		int r = geneve_encap_v(skb, &pk, id);
		if (r < 0)
			return drop(REASON_NO_TUNNEL_KEY, DIR_EGRESS, 0, &pk, id, 0, 0);
		return r;
	}
	if (tunnel_set_key(skb, &pk, id))
		return drop(REASON_NO_TUNNEL_KEY, DIR_EGRESS, 0, &pk, id, 0, 0);
	count(REASON_TO_OVERLAY, DIR_EGRESS, pk.len);
	return TC_ACT_OK;
}
