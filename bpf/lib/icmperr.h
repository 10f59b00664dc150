/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: ICMP and ICMPv6 errors about translated flows,
 * arriving at a host device (from_netdev), IPv4 and IPv6 written once (a
 * constant family argument, inlined, as nat.h). An error quotes the packet
 * it is about as that packet left the node, so it is sent to the address
 * the packet left with and quotes that address as its source:
 *
 * - a pod's masqueraded flow (a router's "fragmentation needed" / "packet
 *   too big", the remote's "port unreachable"): quoted node address and
 *   port -> remote. The NAT table's reverse entry gives the pod: the outer
 *   destination and the quoted source become the pod's address and port,
 *   and the host routes the error to the pod.
 * - an outside client's flow to a backend on another node (NAT_F_NODEPORT,
 *   nodeport.h): quoted node address and port -> backend. The mapping
 *   gives the client, the flow's conntrack entry the frontend (its reverse
 *   NAT ID): the error gets the client's tuple and the frontend quoted,
 *   the client as destination and the frontend as source (as Linux's NAT
 *   makes a related error look like a reply of its flow), and is sent back
 *   out to the client by FIB lookup.
 * - a backend's reply to an outside client (a local backend's turned into
 *   the frontend by to_netdev, a remote one's by nodeport_reply): quoted
 *   frontend -> client. The flow's entry in the flows map (client,
 *   frontend -> backend) gives the backend, whose path MTU discovery needs
 *   the error. A local one: the outer destination and the quoted source
 *   become the backend's address and port, and the host routes the error
 *   to the pod. A remote one: the NAT mapping's forward half gives the
 *   node's address and port the backend sees; the error quotes the reply
 *   as the backend sent it (backend -> node address and port), comes from
 *   the node to the backend, and is sent on by FIB lookup.
 *
 * And leaving (to_netdev): an ICMP error a local backend sends to an
 * outside client about the client's packet (quoted: client -> backend)
 * gets the frontend as its source and quoted destination, so the client
 * finds its socket (a UDP node port's "port unreachable").
 *
 * Checksums: IPv4's outer and quoted header checksums and the ICMP
 * checksum (which covers the quoted header: an address change there is
 * offset by its header checksum's, so only the ports change it); ICMPv6's
 * checksum over its pseudo-header (the outer addresses) and the quoted
 * addresses and ports. The quoted L4 checksum is left as it is: the
 * receiver finds its socket by the quoted tuple and does not check it. */
#ifndef TDR_ICMPERR_H
#define TDR_ICMPERR_H

#include "nat.h"
#include "nodeport.h"

/* icmp_error_in's answer for an error translated for an outside client:
 * icmp_err_redirect must send it (not a TC verdict). */
#define ICMP_ERR_NEEDS_REDIRECT 1001

/* icmp_err_redirect sends an error translated for an outside client (p:
 * its new addresses) back out by FIB lookup. A global function called by
 * from_netdev itself, not by icmp_error_in: on that chain the FIB lookup's
 * frame came to 544 bytes of stack, over the 512. */
__attribute__((noinline)) int icmp_err_redirect(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	int ret = p->family == FAMILY_V6 ? fib_redirect6(skb, p) : fib_redirect4(skb, p);
	if (ret < 0)
		return drop(REASON_NODEPORT_NO_ROUTE, DIR_INGRESS, 0, p, 0, 0, 0);
	return ret;
}

/* icmp_err_outer sets the error's outer source (src) or destination from
 * old to addr. */
static __always_inline int icmp_err_outer(struct __sk_buff *skb, const struct pkt *p, const __u8 family, int src,
					  const __u8 *old, const __u8 *addr)
{
	if (family == FAMILY_V6) {
		__u32 o[4], n[4];
		__builtin_memcpy(o, old, 16);
		__builtin_memcpy(n, addr, 16);
		__s64 diff = bpf_csum_diff(o, 16, n, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, p->l4_off + 2, 0, diff, BPF_F_PSEUDO_HDR))
			return -1;
		return bpf_skb_store_bytes(skb, ETH_HLEN + (src ? 8 : 24), n, 16, 0) ? -1 : 0;
	}
	__u32 o = u32_at(old), n = u32_at(addr);
	if (bpf_l3_csum_replace(skb, ETH_HLEN + 10, o, n, 4))
		return -1;
	return bpf_skb_store_bytes(skb, ETH_HLEN + (src ? 12 : 16), &n, 4, 0) ? -1 : 0;
}

/* icmp_err_inner sets the quoted packet's source (src) or destination
 * address and port from old, old_port to addr, port (an echo's port is its
 * identifier); in_ip and in_l4 are the quoted headers' offsets. */
static __always_inline int icmp_err_inner(struct __sk_buff *skb, const struct pkt *p, const __u8 family, __u32 in_ip,
					  __u32 in_l4, int src, const __u8 *old, const __u8 *addr, __be16 old_port,
					  __be16 port)
{
	__u32 csum = p->l4_off + 2;

	if (family == FAMILY_V6) {
		__u32 o[4], n[4];
		__builtin_memcpy(o, old, 16);
		__builtin_memcpy(n, addr, 16);
		__s64 diff = bpf_csum_diff(o, 16, n, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, csum, 0, diff, 0))
			return -1;
		if (bpf_skb_store_bytes(skb, in_ip + (src ? 8 : 24), n, 16, 0))
			return -1;
	} else {
		__u32 o = u32_at(old), n = u32_at(addr);
		if (bpf_l3_csum_replace(skb, in_ip + 10, o, n, 4) || bpf_skb_store_bytes(skb, in_ip + (src ? 12 : 16), &n, 4, 0))
			return -1;
	}
	if (old_port == port)
		return 0;
	__u32 off = in_l4 + (src ? 0 : 2);
	if (p->in_proto == IPPROTO_ICMP_ || p->in_proto == IPPROTO_ICMPV6_)
		off = in_l4 + 4;
	if (bpf_l4_csum_replace(skb, csum, old_port, port, 2) || bpf_skb_store_bytes(skb, off, &port, 2, 0))
		return -1;
	return 0;
}

/* The quoted tuple, copied from struct pkt to 4-byte aligned storage
 * (pkt's in_saddr and in_daddr are not: nat_key and ct_key want it). */
struct icmp_err_tuple {
	__u8 s[16] __attribute__((aligned(4)));
	__u8 d[16] __attribute__((aligned(4)));
	__u8 addr[16] __attribute__((aligned(4))); /* the translation's: pod, client or backend */
	__u8 fe[16] __attribute__((aligned(4)));   /* the frontend */
};

/* icmp_err_quoted copies the quoted packet's addresses to q. */
static __always_inline void icmp_err_quoted(struct icmp_err_tuple *q, const struct pkt *p, const __u8 family)
{
	if (family == FAMILY_V6) {
		__builtin_memcpy(q->s, p->in_saddr, 16);
		__builtin_memcpy(q->d, p->in_daddr, 16);
	} else {
		__builtin_memcpy(q->s, p->in_saddr, 4);
		__builtin_memcpy(q->d, p->in_daddr, 4);
	}
}

/* icmp_err_quoted_l4 sets *in_l4 to the offset of the quoted packet's L4
 * header (in_ip: its IP header's); -1 when the IPv4 header is unreadable. */
static __always_inline int icmp_err_quoted_l4(struct __sk_buff *skb, const __u8 family, __u32 in_ip, __u32 *in_l4)
{
	*in_l4 = in_ip + 40;
	if (family == FAMILY_V4) {
		__u8 vihl;
		if (bpf_skb_load_bytes(skb, in_ip, &vihl, 1))
			return -1;
		*in_l4 = in_ip + ((__u32)(vihl & 0xf)) * 4;
	}
	return 0;
}

/* icmp_err_both sets the error about q->s -> q->d (ports in_sport and
 * in_dport) to one about q->addr:port_a -> q->fe:port_fe, sent from q->fe
 * to q->addr, and leaves it for icmp_err_redirect; returns
 * ICMP_ERR_NEEDS_REDIRECT, or a drop. */
static __always_inline int icmp_err_both(struct __sk_buff *skb, struct pkt *p, const __u8 family,
					 const struct icmp_err_tuple *q, __u32 in_ip, __u32 in_l4, __be16 port_a,
					 __be16 port_fe)
{
	if (icmp_err_inner(skb, p, family, in_ip, in_l4, 1, q->s, q->addr, p->in_sport, port_a) ||
	    icmp_err_inner(skb, p, family, in_ip, in_l4, 0, q->d, q->fe, p->in_dport, port_fe) ||
	    icmp_err_outer(skb, p, family, 0, p->daddr, q->addr) || icmp_err_outer(skb, p, family, 1, p->saddr, q->fe))
		return drop(REASON_NAT_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	addr_copy(p->saddr, q->fe, family);
	addr_copy(p->daddr, q->addr, family);
	count(REASON_NODEPORT_ICMP_ERROR, DIR_INGRESS, p->len);
	return ICMP_ERR_NEEDS_REDIRECT;
}

/* icmp_err_nodeport_remote translates an error about an outside client's
 * flow to a backend on another node (m: its NAT mapping's reverse half;
 * q->addr already the client) and sends it back to the client. */
static __always_inline int icmp_err_nodeport_remote(struct __sk_buff *skb, struct pkt *p, const __u8 family,
						    struct icmp_err_tuple *q, __be16 cport, __u32 in_ip, __u32 in_l4)
{
	struct ct_entry *e;

	if (family == FAMILY_V6) {
		struct ct6_key k = {};
		ct_key(&k, family, p->in_proto, q->addr, cport, q->d, p->in_dport);
		e = bpf_map_lookup_elem(&tdr_ct6_v2, &k);
	} else {
		struct ct4_key k = {};
		ct_key(&k, family, p->in_proto, q->addr, cport, q->d, p->in_dport);
		e = bpf_map_lookup_elem(&tdr_ct4_v2, &k);
	}
	if (!e || !e->rev_nat)
		return TC_ACT_OK;
	__u32 rev_nat = e->rev_nat;
	const struct lb_revnat *rv = bpf_map_lookup_elem(&tdr_lb_revnat_v1, &rev_nat);
	if (!rv || rv->family != family)
		return TC_ACT_OK;
	__be16 fport = rv->port;
	addr_copy(q->fe, rv->addr, family);
	return icmp_err_both(skb, p, family, q, in_ip, in_l4, cport, fport);
}

/* icmp_err_nodeport_reply translates an error about a backend's reply to
 * an outside client (quoted: frontend -> client) back to the backend: a
 * local one gets it as its own reply's error; a remote one's reply left
 * this node translated from (backend -> node address and masquerade port),
 * so the error is made about that packet (quoting it, from the node's
 * address) and sent to the backend. Returns the verdict, or
 * ICMP_ERR_NEEDS_REDIRECT; k is scratch for a NAT key. */
static __always_inline int icmp_err_nodeport_reply(struct __sk_buff *skb, struct pkt *p, const __u8 family,
						   struct icmp_err_tuple *q, union nat_key *k, __u32 in_ip,
						   __u32 in_l4)
{
	struct lb_flow *fl;

	/* The flow as the client sent it: client -> frontend. */
	if (family == FAMILY_V6) {
		struct lb6_flow_key k = {.sport = p->in_dport, .dport = p->in_sport, .proto = p->in_proto};
		__builtin_memcpy(k.saddr, q->d, 16);
		__builtin_memcpy(k.daddr, q->s, 16);
		fl = bpf_map_lookup_elem(&tdr_lb6_flows_v1, &k);
	} else {
		struct lb4_flow_key k = {.sport = p->in_dport, .dport = p->in_sport, .proto = p->in_proto};
		__builtin_memcpy(k.saddr, q->d, 4);
		__builtin_memcpy(k.daddr, q->s, 4);
		fl = bpf_map_lookup_elem(&tdr_lb4_flows_v1, &k);
	}
	if (!fl)
		return TC_ACT_OK;
	__u32 bid = fl->backend_id;
	const struct lb_backend *be = bpf_map_lookup_elem(&tdr_lb_backends_v1, &bid);
	if (!be || be->family != family)
		return TC_ACT_OK;
	__be16 bport = be->port;
	addr_copy(q->addr, be->addr, family);
	if (!endpoint_by_addr(family, q->addr)) {
		/* The flow's mapping as the client's packets leave for the
		 * backend: the node's address and port the backend sees. */
		nat_key(k, family, NAT_DIR_EGRESS, q->d, p->in_dport, q->addr, bport, p->in_proto);
		const void *m = bpf_map_lookup_elem(NAT_MAP(family), k);
		if (!m)
			return TC_ACT_OK;
		__be16 nport = nat_port(m, family);
		addr_copy(q->fe, nat_addr(m, family), family);
		return icmp_err_both(skb, p, family, q, in_ip, in_l4, bport, nport);
	}
	if (icmp_err_inner(skb, p, family, in_ip, in_l4, 1, q->s, q->addr, p->in_sport, bport) ||
	    icmp_err_outer(skb, p, family, 0, p->daddr, q->addr))
		return drop(REASON_NAT_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	addr_copy(p->daddr, q->addr, family);
	count(REASON_NODEPORT_ICMP_ERROR, DIR_INGRESS, p->len);
	return TC_ACT_OK;
}

/* icmp_error_in translates an ICMP(v6) error arriving at the device about
 * a translated flow (see above). Returns the verdict: TC_ACT_OK (the
 * host delivers it, translated or left alone) or a drop, or
 * ICMP_ERR_NEEDS_REDIRECT (icmp_err_redirect's to do). */
static __always_inline int icmp_error_in(struct __sk_buff *skb, struct pkt *p, const __u8 family)
{
	struct icmp_err_tuple q;
	__u8 proto = p->in_proto;

	icmp_err_quoted(&q, p, family);
	/* Sent to the address the quoted packet left with. */
	if (!addr_eq(q.s, p->daddr, family))
		return TC_ACT_OK;
	__u32 in_ip = p->l4_off + 8, in_l4;
	if (icmp_err_quoted_l4(skb, family, in_ip, &in_l4))
		return TC_ACT_OK;
	union nat_key k;
	nat_key(&k, family, NAT_DIR_INGRESS, q.s, p->in_sport, q.d, p->in_dport, proto);
	const void *m = bpf_map_lookup_elem(NAT_MAP(family), &k);
	if (!m) {
		if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_)
			return TC_ACT_OK;
		return icmp_err_nodeport_reply(skb, p, family, &q, &k, in_ip, in_l4);
	}
	__be16 port = nat_port(m, family);
	__u8 flags = family == FAMILY_V6 ? ((const struct nat6_entry *)m)->flags : ((const struct nat4_entry *)m)->flags;
	addr_copy(q.addr, nat_addr(m, family), family);
	if (flags & NAT_F_NODEPORT)
		return icmp_err_nodeport_remote(skb, p, family, &q, port, in_ip, in_l4);
	/* A pod's masqueraded flow. */
	if (icmp_err_outer(skb, p, family, 0, p->daddr, q.addr) ||
	    icmp_err_inner(skb, p, family, in_ip, in_l4, 1, q.s, q.addr, p->in_sport, port))
		return drop(REASON_MASQ_FAILED, DIR_INGRESS, 0, p, 0, 0, 0);
	addr_copy(p->daddr, q.addr, family);
	count(REASON_MASQ_REPLY, DIR_INGRESS, p->len);
	return TC_ACT_OK;
}

/* icmp_error_out gives an ICMP(v6) error a local backend sends to an
 * outside client (leaving through the device; a UDP port unreachable,
 * say), about the client's packet as the backend received it (client ->
 * backend), the frontend instead of the backend: as its outer source and
 * as the quoted destination, with the frontend's port. The flow's
 * conntrack entry names the frontend (its reverse NAT ID, set only where
 * this node translated the flow). Returns 0 when it did, 1 for an error
 * of no such flow, or minus a drop reason. */
static __always_inline int icmp_error_out(struct __sk_buff *skb, struct pkt *p, const __u8 family)
{
	struct icmp_err_tuple q;

	if (p->in_proto != IPPROTO_TCP_ && p->in_proto != IPPROTO_UDP_)
		return 1;
	icmp_err_quoted(&q, p, family);
	/* From the address the quoted packet was sent to. */
	if (!addr_eq(q.d, p->saddr, family) || !endpoint_by_addr(family, q.d))
		return 1;
	struct flow f;
	flow_of(&f, p);
	struct ct_entry *e = ct_find(&f, p);
	/* The quoted packet went the flow's way: the client started it. */
	if (!e || !e->rev_nat || ct_is_reply(e, &f))
		return 1;
	__u32 rev_nat = e->rev_nat;
	const struct lb_revnat *rv = bpf_map_lookup_elem(&tdr_lb_revnat_v1, &rev_nat);
	if (!rv || rv->family != family)
		return 1;
	__be16 fport = rv->port;
	addr_copy(q.fe, rv->addr, family);
	__u32 in_ip = p->l4_off + 8, in_l4;
	if (icmp_err_quoted_l4(skb, family, in_ip, &in_l4))
		return -REASON_NAT_FAILED;
	if (icmp_err_inner(skb, p, family, in_ip, in_l4, 0, q.d, q.fe, p->in_dport, fport) ||
	    icmp_err_outer(skb, p, family, 1, p->saddr, q.fe))
		return -REASON_NAT_FAILED;
	count(REASON_NODEPORT_ICMP_ERROR, DIR_EGRESS, p->len);
	return 0;
}

/* icmp_error_out4 and icmp_error_out6 are icmp_error_out of each family,
 * global functions; they return the verdict. */
__attribute__((noinline)) int icmp_error_out4(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	int r = icmp_error_out(skb, p, FAMILY_V4);
	return r < 0 ? drop((__u8)-r, DIR_EGRESS, 0, p, 0, 0, 0) : TC_ACT_OK;
}

__attribute__((noinline)) int icmp_error_out6(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	int r = icmp_error_out(skb, p, FAMILY_V6);
	return r < 0 ? drop((__u8)-r, DIR_EGRESS, 0, p, 0, 0, 0) : TC_ACT_OK;
}

/* icmp_error_in4 and icmp_error_in6 are icmp_error_in of each family:
 * global functions, verified once, on their own. */
__attribute__((noinline)) int icmp_error_in4(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	return icmp_error_in(skb, p, FAMILY_V4);
}

__attribute__((noinline)) int icmp_error_in6(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return TC_ACT_OK;
	return icmp_error_in(skb, p, FAMILY_V6);
}

#endif
