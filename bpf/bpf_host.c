// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Tendril's host device programs, attached at each uplink of the node (the
 * agent's --devices; by default the device of the default route), TCX
 * ingress and egress (or tc filters in --datapath-attach-mode=tc), pinned
 * like the pod programs so they keep working while the agent restarts.
 *
 * to_netdev (egress): a pod's packet leaving the node for a destination
 * outside the cluster and outside the non-masquerade CIDRs gets the
 * device's node address as its source, with a port of the masquerade
 * range (nat.h); its tuple's mapping is kept in tdr_nat4_v1 both ways.
 * from_netdev (ingress): a reply to a masqueraded flow gets the pod's
 * address and port back as its destination; the host then routes it to
 * the pod, whose to_pod sees it as the reply of the pod's flow.
 *
 * Services for clients outside the cluster (nodeport.h, nodeport_dsr.h):
 * from_netdev translates a packet to a NodePort, externalIP or
 * load-balancer frontend of this node to a backend (a remote one's source
 * NATed to the node and the packet sent on), and a remote backend's reply
 * back to the client; to_netdev gives a local backend's reply the
 * frontend as its source.
 *
 * An ICMP or ICMPv6 error about a masqueraded flow or a service flow from
 * outside is translated back the same way (icmperr.h: its outer addresses
 * and the packet it quotes).
 *
 * IPv4 and IPv6 alike.
 *
 * L2 announcements (arp.h): from_netdev answers the ARP requests for the
 * load-balancer and external addresses this node announces on the device.
 *
 * The host firewall (hostfw.h): with host policies, the node's own
 * traffic (to and from its addresses) is checked against the host
 * endpoint's policy, in both programs, before any service translation.
 *
 * A local pod's ingress HTTP rules (l7ingress.h): from_netdev hands a
 * flow from another node that the pod's ingress sends to the HTTP proxy
 * to the proxy's ingress listener, with the source's identity in its
 * conntrack entry.
 *
 * Everything else passes untouched: the host's own traffic without host
 * policy, pods' traffic within the cluster (docs/datapath.md,
 * docs/host-firewall.md).
 *
 * from_wireguard and to_wireguard (ingress and egress of the WireGuard
 * device, docs/encryption.md): with node encryption a remote backend's
 * reply to a NodePort client arrives decrypted on the device instead of
 * the underlay; it gets the same reverse translation as from_netdev gives
 * it there. The node's own traffic through the device meets the host
 * firewall, both ways, as on the underlay. */
#include "lib/common.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#include "lib/maps.h"
#include "lib/pkt.h"
#include "lib/events.h"
#include "lib/parse.h"
#include "lib/endpoint.h"
#include "lib/ipcache.h"
#include "lib/nat.h"
#include "lib/nodeport.h"
#include "lib/icmperr.h"
#include "lib/arp.h"
#include "lib/hostfw.h"
#include "lib/geneve.h"
#include "lib/l7ingress.h"

/* to_netdev6 and from_netdev6 are the IPv6 halves of the programs below,
 * global functions verified on their own. */
__attribute__((noinline)) int to_netdev6(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	const struct endpoint_info *ep = endpoint_by_addr(FAMILY_V6, p->saddr);
	if (!ep)
		return TC_ACT_OK;
	__u32 ifindex = skb->ifindex;
	const struct hostdev_info *dev = bpf_map_lookup_elem(&tdr_hostdev_v1, &ifindex);
	if (!dev)
		return TC_ACT_OK;
	/* A local backend's reply to an outside client: the frontend as
	 * source (as to_netdev4, also without IPv6 masquerade on the device:
	 * a DSR flow's reply through Geneve, say). */
	int rev;
	if (!(dev->flags & HOSTDEV_F_MASQ_V6) || !masq_needed6(p)) {
		rev = nodeport_rev_out(skb, p, FAMILY_V6);
		return rev < 0 ? drop((__u8)-rev, DIR_EGRESS, ep->ep_id, p, ep->identity, 0, 0) : TC_ACT_OK;
	}
	struct masq_scratch *s = masq_request(p, FAMILY_V6, dev->ipv6, 0);
	if (!s)
		return TC_ACT_OK;
	if (!masq_mapped(s, FAMILY_V6)) {
		rev = nodeport_rev_out(skb, p, FAMILY_V6);
		if (rev)
			return rev < 0 ? drop((__u8)-rev, DIR_EGRESS, ep->ep_id, p, ep->identity, 0, 0) : TC_ACT_OK;
		int r = masq_alloc6(skb);
		if (r < 0)
			return drop((__u8)-r, DIR_EGRESS, ep->ep_id, p, ep->identity, 0, 0);
	}
	if (masq_rewrite(skb, p, FAMILY_V6, 0, s->r.node, s->r.port))
		return drop(REASON_MASQ_FAILED, DIR_EGRESS, ep->ep_id, p, ep->identity, 0, 0);
	count(REASON_MASQUERADED, DIR_EGRESS, p->len);
	return TC_ACT_OK;
}

/* from_netdev6's answer for a packet that is no reply of a mapping: maybe
 * a flow from outside to a service frontend, which from_netdev gives to
 * nodeport_in6 (not a TC verdict). */
#define FROM_NETDEV6_NO_MAPPING 1002

/* from_netdev6 returns the verdict, or FROM_NETDEV6_NO_MAPPING. */
__attribute__((noinline)) int from_netdev6(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	struct nat6_key k;
	nat_key(&k, FAMILY_V6, NAT_DIR_INGRESS, p->daddr, p->dport, p->saddr, p->sport, p->proto);
	struct nat6_entry *m = bpf_map_lookup_elem(&tdr_nat6_v1, &k);
	if (!m)
		return FROM_NETDEV6_NO_MAPPING;
	__u8 pod[16] __attribute__((aligned(4)));
	__builtin_memcpy(pod, m->addr, 16);
	__be16 port = m->port;
	__u8 flags = m->flags;
	if (masq_rewrite(skb, p, FAMILY_V6, 1, pod, port))
		return drop(REASON_MASQ_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	if (flags & NAT_F_NODEPORT) {
		/* A remote backend's reply to an outside client. */
		__builtin_memcpy(p->daddr, pod, 16);
		p->dport = port;
		return nodeport_reply6(skb, p);
	}
	count(REASON_MASQ_REPLY, DIR_INGRESS, p->len);
	return TC_ACT_OK;
}

/* nat_reply4 translates an IPv4 reply of the NAT mapping m back (p: the
 * parsed packet): the pod's address and port as destination; a remote
 * backend's reply to an outside client goes on to nodeport_reply. The
 * verdict. from_netdev's and from_wireguard's. */
static __always_inline int nat_reply4(struct __sk_buff *skb, struct pkt *p, const struct nat4_entry *m)
{
	__u8 pod[4];
	__builtin_memcpy(pod, m->addr, 4);
	__be16 port = m->port;
	__u8 flags = m->flags;
	if (masq_rewrite(skb, p, FAMILY_V4, 1, pod, port))
		return drop(REASON_MASQ_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	if (flags & NAT_F_NODEPORT) {
		/* A remote backend's reply to an outside client. */
		__builtin_memcpy(p->daddr, pod, 4);
		p->dport = port;
		return nodeport_reply(skb, p);
	}
	count(REASON_MASQ_REPLY, DIR_INGRESS, p->len);
	/* A reply to the HTTP proxy's upstream connection that left with a
	 * pod's address, masqueraded like the pod's own (lib/proxy.h): to
	 * the proxy's socket, not the pod. */
	if (p->proto == IPPROTO_TCP_) {
		const struct endpoint_info *ep = endpoint_by_addr(FAMILY_V4, pod);
		if (ep) {
			__builtin_memcpy(p->daddr, pod, 4);
			p->dport = port;
			if (proxy_upstream_reply(skb, p, ep) >= 0)
				return TC_ACT_OK;
		}
	}
	return TC_ACT_OK;
}

/* to_netdev4 is the IPv4 half of to_netdev: a global function, so its
 * locals do not add to the stack of the IPv6 path's calls. */
__attribute__((noinline)) int to_netdev4(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	const struct endpoint_info *ep = endpoint_by_addr(FAMILY_V4, p->saddr);
	if (!ep)
		return TC_ACT_OK;
	__u32 ifindex = skb->ifindex;
	const struct hostdev_info *dev = bpf_map_lookup_elem(&tdr_hostdev_v1, &ifindex);
	if (!dev)
		return TC_ACT_OK;
	/* A local backend's reply to an outside client of a service: the
	 * client expects the frontend, not the pod (nor the node's
	 * masquerade address). Looked for only where no masquerade mapping
	 * exists: a masqueraded flow's packets pay no conntrack lookup.
	 * Without masquerade on the device (the programs run there for the
	 * services), every pod packet leaving is looked for. */
	int rev;
	if (!(dev->flags & HOSTDEV_F_MASQ_V4) || !masq_needed(p, FAMILY_V4)) {
		rev = nodeport_rev_out(skb, p, FAMILY_V4);
		return rev < 0 ? drop((__u8)-rev, DIR_EGRESS, ep->ep_id, p, ep->identity, 0, 0) : TC_ACT_OK;
	}
	/* An ICMP echo request's identifier is its "source port". */
	struct masq_scratch *s = masq_request(p, FAMILY_V4, dev->ipv4, 0);
	if (!s)
		return TC_ACT_OK;
	if (!masq_mapped(s, FAMILY_V4)) {
		rev = nodeport_rev_out(skb, p, FAMILY_V4);
		if (rev)
			return rev < 0 ? drop((__u8)-rev, DIR_EGRESS, ep->ep_id, p, ep->identity, 0, 0) : TC_ACT_OK;
		int r = masq_alloc4(skb);
		if (r < 0)
			return drop((__u8)-r, DIR_EGRESS, ep->ep_id, p, ep->identity, 0, 0);
	}
	if (masq_rewrite(skb, p, FAMILY_V4, 0, s->r.node, s->r.port))
		return drop(REASON_MASQ_FAILED, DIR_EGRESS, ep->ep_id, p, ep->identity, 0, 0);
	count(REASON_MASQUERADED, DIR_EGRESS, p->len);
	return TC_ACT_OK;
}

SEC("tcx/egress")
int to_netdev(struct __sk_buff *skb)
{
	struct pkt p = {};

	/* Unparseable packets are the host's business here, not ours. */
	if (parse(skb, &p) || p.arp)
		return TC_ACT_OK;
	/* A local backend's ICMP error to an outside client (icmperr.h). */
	if (p.icmp_error && !p.nonfirst_frag) {
		if (p.family == FAMILY_V6)
			return p.proto == IPPROTO_ICMPV6_ ? icmp_error_out6(skb, &p) : TC_ACT_OK;
		return p.proto == IPPROTO_ICMP_ ? icmp_error_out4(skb, &p) : TC_ACT_OK;
	}
	if (!masq_l4(&p))
		/* Not translated by anything here, but the node's own
		 * packets of any protocol meet its egress policy. */
		return !hostfw_exempt(&p) && hostfw(DIR_EGRESS, &p) ? TC_ACT_SHOT : TC_ACT_OK;
	/* The node's own packets leaving: its egress policy. */
	if (hostfw(DIR_EGRESS, &p))
		return TC_ACT_SHOT;
	if (p.family == FAMILY_V6)
		return to_netdev6(skb, &p);
	return to_netdev4(skb, &p);
}

SEC("tcx/ingress")
int from_netdev(struct __sk_buff *skb)
{
	struct pkt p = {};
	int unparsed = parse(skb, &p);

	if (unparsed)
		return hostfw_unparsed(unparsed, &p);
	if (p.arp)
		return arp_respond(skb);
	/* Geneve in eBPF (lib/geneve.h): the overlay's packets from other
	 * nodes (an IPv4 or IPv6 underlay), before any translation or host policy (the overlay's
	 * checks and the pod's policy decide them). */
	if (p.proto == IPPROTO_UDP_ && p.dport == bpf_htons(GENEVE_PORT) && geneve_bpf()) {
		int r = geneve_decap(skb, &p);
		if (r >= 0)
			return r;
	}
	if (p.family == FAMILY_V6) {
		if (p.icmp_error && p.proto == IPPROTO_ICMPV6_ && !p.nonfirst_frag) {
			int r = icmp_error_in6(skb, &p);
			return r == ICMP_ERR_NEEDS_REDIRECT ? icmp_err_redirect(skb, &p) : r;
		}
		if (!masq_l4(&p))
			return !hostfw_exempt(&p) && hostfw(DIR_INGRESS, &p) ? TC_ACT_SHOT : TC_ACT_OK;
		/* nodeport_in6 and nodeport_snat6 are called from here, not
		 * from from_netdev6: from_netdev -> from_netdev6 ->
		 * nodeport_in6 came to 576 bytes of stack, over the 512. */
		int r = from_netdev6(skb, &p);
		if (r != FROM_NETDEV6_NO_MAPPING)
			return r;
		/* A local pod's ingress HTTP rules for a flow from another
		 * node, as for IPv4 below (lib/l7ingress.h). */
		if (p.proto == IPPROTO_TCP_) {
			r = l7ingress_remote(skb, &p, 0);
			if (r != L7INGRESS_PASS)
				return r;
		}
		/* No reply of a NAT mapping: to the node, its ingress policy
		 * decides first (a NodePort is a port of the node). */
		if (hostfw(DIR_INGRESS, &p))
			return TC_ACT_SHOT;
		/* Not a reply: maybe a flow from outside to a service
		 * frontend (nodeport.h). */
		r = nodeport_in6(skb, &p);
		if (r == NODEPORT_DSR_GENEVE)
			r = nodeport_dsr_geneve(skb, &p);
		if (r == NODEPORT_NEEDS_SNAT)
			return nodeport_snat6(skb, &p);
		return r >= 0 ? r : TC_ACT_OK;
	}
	if (p.icmp_error && p.proto == IPPROTO_ICMP_ && !p.nonfirst_frag) {
		int r = icmp_error_in4(skb, &p);
		return r == ICMP_ERR_NEEDS_REDIRECT ? icmp_err_redirect(skb, &p) : r;
	}
	if (!masq_l4(&p))
		/* No translation applies; to the node, any protocol meets
		 * its ingress policy. */
		return !hostfw_exempt(&p) && hostfw(DIR_INGRESS, &p) ? TC_ACT_SHOT : TC_ACT_OK;
	struct nat4_key k;
	nat_key(&k, FAMILY_V4, NAT_DIR_INGRESS, p.daddr, p.dport, p.saddr, p.sport, p.proto);
	struct nat4_entry *m = bpf_map_lookup_elem(&tdr_nat4_v1, &k);
	if (!m) {
		/* A local pod's ingress HTTP rules for a flow from another
		 * node (native routing): only here, at tc ingress, can the
		 * flow be handed to the proxy's socket (lib/l7ingress.h). */
		if (p.proto == IPPROTO_TCP_) {
			int l7 = l7ingress_remote(skb, &p, 0);
			if (l7 != L7INGRESS_PASS)
				return l7;
		}
		/* Not a reply: to the node, its ingress policy decides first
		 * (a NodePort is a port of the node); then maybe a new or
		 * known flow from outside to a service frontend. */
		if (hostfw(DIR_INGRESS, &p))
			return TC_ACT_SHOT;
		int np = nodeport_in(skb, &p);
		if (np == NODEPORT_DSR_GENEVE)
			np = nodeport_dsr_geneve(skb, &p);
		if (np == NODEPORT_NEEDS_SNAT)
			return nodeport_snat(skb, &p);
		return np >= 0 ? np : TC_ACT_OK;
	}
	return nat_reply4(skb, &p, m);
}

/* wg_push_eth puts an Ethernet header in front of a packet the WireGuard
 * device delivered (an IP packet of family p->family without link-layer
 * header; bpf_skb_change_head is the helper made for an L3 packet bound
 * for an L2 device), with the packet's type, and parses it again into p:
 * the shared translation code, whose every header offset counts an
 * Ethernet header first, then runs on it as on the underlay's, and the
 * redirect to the underlay writes the next hop's addresses into it. Only
 * for a packet that leaves by that redirect (or is dropped): the device's
 * stack takes no link-layer header. 0, or -1 when it failed. */
static __always_inline int wg_push_eth(struct __sk_buff *skb, struct pkt *p)
{
	__be16 proto = bpf_htons(p->family == FAMILY_V6 ? ETH_P_IPV6 : ETH_P_IP);

	if (bpf_skb_change_head(skb, ETH_HLEN, 0) || bpf_skb_store_bytes(skb, 12, &proto, 2, 0))
		return -1;
	*p = (struct pkt){};
	return parse(skb, p) ? -1 : 0;
}

/* wg_nat_reply gives a reply of a NAT mapping that arrived through the
 * WireGuard device the reverse translation of from_netdev (wg_push_eth
 * first). */
static __always_inline int wg_nat_reply(struct __sk_buff *skb, struct pkt *p)
{
	if (wg_push_eth(skb, p) || !masq_l4(p))
		return TC_ACT_SHOT;
	if (p->family == FAMILY_V6) {
		int r = from_netdev6(skb, p);
		/* Gone since the look (the GC): nothing to send it to. */
		return r == FROM_NETDEV6_NO_MAPPING ? TC_ACT_SHOT : r;
	}
	struct nat4_key k;
	nat_key(&k, FAMILY_V4, NAT_DIR_INGRESS, p->daddr, p->dport, p->saddr, p->sport, p->proto);
	struct nat4_entry *m = bpf_map_lookup_elem(&tdr_nat4_v1, &k);
	if (!m)
		return TC_ACT_SHOT;
	return nat_reply4(skb, p, m);
}

/* wg_icmp_err_nodeport reports whether the parsed packet is an ICMP(v6)
 * error about a service flow this node sent on to a remote backend: sent
 * to the address the quoted packet left with, which one of this node's
 * NAT mappings of a NodePort flow names (what the backend's node says
 * when the backend's port is closed, or a router between the nodes when
 * the packet does not fit). A global function, as wg_mapped. */
__attribute__((noinline)) int wg_icmp_err_nodeport(const struct pkt *p)
{
	if (!p || !p->icmp_error || p->nonfirst_frag)
		return 0;
	if (p->family == FAMILY_V6) {
		if (p->proto != IPPROTO_ICMPV6_ || !addr_eq(p->in_saddr, p->daddr, FAMILY_V6))
			return 0;
		struct nat6_key k;
		nat_key(&k, FAMILY_V6, NAT_DIR_INGRESS, p->in_saddr, p->in_sport, p->in_daddr, p->in_dport, p->in_proto);
		const struct nat6_entry *m = bpf_map_lookup_elem(&tdr_nat6_v1, &k);
		return m && (m->flags & NAT_F_NODEPORT);
	}
	if (p->proto != IPPROTO_ICMP_ || !addr_eq(p->in_saddr, p->daddr, FAMILY_V4))
		return 0;
	struct nat4_key k;
	nat_key(&k, FAMILY_V4, NAT_DIR_INGRESS, p->in_saddr, p->in_sport, p->in_daddr, p->in_dport, p->in_proto);
	const struct nat4_entry *m = bpf_map_lookup_elem(&tdr_nat4_v1, &k);
	return m && (m->flags & NAT_F_NODEPORT);
}

/* wg_icmp_error translates an ICMP(v6) error wg_icmp_err_nodeport
 * accepted as from_netdev does on the underlay (icmperr.h): sent back to
 * the client, from the frontend, quoting the client's packet. */
static __always_inline int wg_icmp_error(struct __sk_buff *skb, struct pkt *p)
{
	if (wg_push_eth(skb, p) || !p->icmp_error)
		return TC_ACT_SHOT;
	int r = p->family == FAMILY_V6 ? icmp_error_in6(skb, p) : icmp_error_in4(skb, p);
	if (r == ICMP_ERR_NEEDS_REDIRECT)
		return icmp_err_redirect(skb, p);
	/* Not sent on (the flow's conntrack entry went since the look):
	 * with the header pushed the device's stack cannot take it, and no
	 * socket of this node waits for an error about a service flow. */
	return r == TC_ACT_OK ? TC_ACT_SHOT : r;
}

/* wg_mapped reports whether the parsed packet is the reply of a NAT
 * mapping (the look from_netdev makes first). A global function: its key
 * is off from_wireguard's stack, which the translation's call chain needs
 * whole. */
__attribute__((noinline)) int wg_mapped(const struct pkt *p)
{
	if (!p)
		return 0;
	if (p->family == FAMILY_V6) {
		struct nat6_key k;
		nat_key(&k, FAMILY_V6, NAT_DIR_INGRESS, p->daddr, p->dport, p->saddr, p->sport, p->proto);
		return bpf_map_lookup_elem(&tdr_nat6_v1, &k) != NULL;
	}
	struct nat4_key k;
	nat_key(&k, FAMILY_V4, NAT_DIR_INGRESS, p->daddr, p->dport, p->saddr, p->sport, p->proto);
	return bpf_map_lookup_elem(&tdr_nat4_v1, &k) != NULL;
}

/* from_wireguard, at the WireGuard device's ingress: what from_netdev
 * does on the underlay, for what arrives through the device decrypted
 * (docs/encryption.md). The device is an L3 device: its packets start
 * with the IP header (parse_l3).
 *
 * - The replies of NAT mappings: with node encryption (lib/encrypt.h) a
 *   backend on another node answers a NodePort client this node
 *   masqueraded to its own address through that node's WireGuard device;
 *   the answer arrives here, where from_netdev never sees it. It gets the
 *   client back as destination and the frontend as source, and goes out
 *   to the client as from_netdev sends it (wg_nat_reply). An ICMP error
 *   about such a flow (the backend's port closed, a router between the
 *   nodes) goes back to the client the same way (wg_icmp_error).
 * - The host firewall (hostfw.h): another node's or its pods' packet to
 *   this node's own addresses (node encryption sends those through the
 *   device) meets the host endpoint's ingress policy as it would in the
 *   clear on the underlay: same conntrack, drop reason and events, the
 *   source's identity from the ipcache. Without this an encrypting
 *   cluster's nodes were less protected than a clear one's.
 *
 * Everything else passes unchanged: every pod-bound packet the device
 * delivers (the pod's own policy decides it at to_pod), the node's
 * traffic without host policy. No service frontend: a pod's service
 * flow is translated at its source, before it is encrypted. */
SEC("tcx/ingress")
int from_wireguard(struct __sk_buff *skb)
{
	struct pkt p = {};
	int unparsed = parse_l3(skb, &p);

	if (unparsed)
		return hostfw_unparsed(unparsed, &p);
	if (masq_l4(&p) && wg_mapped(&p))
		return wg_nat_reply(skb, &p);
	if (p.icmp_error && wg_icmp_err_nodeport(&p))
		return wg_icmp_error(skb, &p);
	return !hostfw_exempt(&p) && hostfw(DIR_INGRESS, &p) ? TC_ACT_SHOT : TC_ACT_OK;
}

/* to_wireguard, at the WireGuard device's egress: the host firewall's
 * egress half for what the node itself sends through the device (node
 * encryption: its traffic to the other nodes' addresses), as to_netdev
 * checks it on the underlay, where only the encrypted datagrams are seen
 * now. It also writes the conntrack entries of the node's own connections
 * through the device, so that their replies pass from_wireguard's ingress
 * policy. The pods' packets are no host's: hostfw passes them. */
SEC("tcx/egress")
int to_wireguard(struct __sk_buff *skb)
{
	struct pkt p = {};

	if (parse_l3(skb, &p) || hostfw_exempt(&p))
		return TC_ACT_OK;
	return hostfw(DIR_EGRESS, &p) ? TC_ACT_SHOT : TC_ACT_OK;
}
