/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the redirect of a pod's flow to one of the node's
 * transparent proxies (the DNS proxy, the HTTP proxy), for flows whose
 * egress policy entry names one (policy_entry.proxy, remembered in the
 * flow's ct_entry.proxy). The packet keeps its addresses and ports: it is
 * assigned to the proxy's socket (bpf_sk_assign) and marked so that the
 * agent's routing rule delivers it locally, and the proxy reads the
 * original destination from the socket (IP_TRANSPARENT: the accepted
 * connection's local address, a datagram's IP_ORIGDSTADDR or
 * IPV6_ORIGDSTADDR). IPv4 and IPv6. */
#ifndef TDR_PROXY_H
#define TDR_PROXY_H

#include "common.h"
#include "pkt.h"
#include "maps.h"
#include "events.h"
#include "endpoint.h"
#include "conntrack.h"

/* PROXY_SOCKET_KEY is the slot of proxy's socket for a protocol: TCP at
 * even keys, UDP at odd ones. */
#define PROXY_SOCKET_KEY(proxy, proto) ((__u32)(proxy) * 2 + ((proto) == IPPROTO_UDP_ ? 1 : 0))

/* PROXY_AF_INET6: AF_INET6, as struct bpf_sock's family has it. */
#define PROXY_AF_INET6 10

/* proxy_redirect hands a packet of a flow sent to proxy to that proxy's
 * socket: a TCP packet of a connection the proxy already holds (or is
 * accepting) is only marked, the stack finds its socket; a TCP packet
 * opening one is assigned to the proxy's listener, a UDP packet to its
 * socket. Either family: the agent's sockets are dual-stack (bound to
 * [::] without IPV6_V6ONLY), so one listener per port takes both, and an
 * IPv4 packet assigned to one is received as by a socket lookup (the
 * kernel's own lookup hands IPv4 flows to such sockets too). An IPv6
 * packet never goes to an IPv4-only socket (an agent on a node without
 * IPv6): bpf_sk_assign does not check the family, the IPv6 receive path
 * would take it. It returns TC_ACT_OK, or -1 when no proxy socket can
 * take the packet (the caller decides: the proxy is not running). A
 * global function, verified once. */
__attribute__((noinline)) int proxy_redirect(struct __sk_buff *skb, const struct pkt *p, __u32 proxy)
{
	if (!skb || !p)
		return -1;
	int v6 = p->family == FAMILY_V6;
	if (!v6 && p->family != FAMILY_V4)
		return -1;
	/* Both sides' HTTP rules: the egress HTTP proxy applies them. */
	if (proxy == PROXY_HTTP_BOTH)
		proxy = PROXY_HTTP;
	struct bpf_sock *sk;
	if (p->proto == IPPROTO_TCP_) {
		struct bpf_sock_tuple t = {};
		__u32 len;
		if (v6) {
			__builtin_memcpy(t.ipv6.saddr, p->saddr, 16);
			__builtin_memcpy(t.ipv6.daddr, p->daddr, 16);
			t.ipv6.sport = p->sport;
			t.ipv6.dport = p->dport;
			len = sizeof(t.ipv6);
		} else {
			__builtin_memcpy(&t.ipv4.saddr, p->saddr, 4);
			__builtin_memcpy(&t.ipv4.daddr, p->daddr, 4);
			t.ipv4.sport = p->sport;
			t.ipv4.dport = p->dport;
			len = sizeof(t.ipv4);
		}
		sk = bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
		if (sk) {
			/* A listener matched by port alone is some host
			 * service's, not the proxy's connection. */
			int held = sk->state != BPF_TCP_LISTEN;
			bpf_sk_release(sk);
			if (held) {
				skb->mark = PROXY_MARK_VALUE;
				return TC_ACT_OK;
			}
		}
		__u32 *port = bpf_map_lookup_elem(&tdr_proxy_ports_v1, &proxy);
		if (!port || !*port || *port > 0xffff)
			return -1;
		if (v6)
			t.ipv6.dport = bpf_htons((__u16)*port);
		else
			t.ipv4.dport = bpf_htons((__u16)*port);
		sk = bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
		if (!sk)
			return -1;
		if (sk->state != BPF_TCP_LISTEN) {
			bpf_sk_release(sk);
			return -1;
		}
	} else if (p->proto == IPPROTO_UDP_) {
		__u32 key = PROXY_SOCKET_KEY(proxy, IPPROTO_UDP_);
		sk = bpf_map_lookup_elem(&tdr_proxy_sockets_v1, &key);
		if (!sk)
			return -1;
		if (v6 && sk->family != PROXY_AF_INET6) {
			bpf_sk_release(sk);
			return -1;
		}
	} else {
		return -1;
	}
	long r = bpf_sk_assign(skb, sk, 0);
	bpf_sk_release(sk);
	if (r)
		return -1;
	skb->mark = PROXY_MARK_VALUE;
	return TC_ACT_OK;
}

/* The pod's source address upstream (docs/policy-l7.md, "The pod's
 * identity upstream"). The HTTP proxy's upstream connection for a pod's
 * redirected connection leaves from the pod's own address and port
 * (IP_TRANSPARENT, pkg/l7redirect): the same tuple as the pod's flow, so
 * the destination's node sees the pod (its ipcache, the tunnel key
 * to_overlay sets from the local endpoint) and the flow's conntrack entry
 * is the pod's (ct_entry.proxy PROXY_HTTP). The destination's replies are
 * then addressed to the pod, and would be delivered to it: the hooks that
 * see them first (from_netdev, from_overlay, a local destination's
 * from_pod) hand a reply of such a flow to the host stack instead, whose
 * socket table finds the proxy's upstream socket (its local side is the
 * pod's address and port). The accepted socket of the pod's own
 * connection has the tuple reversed (local: the destination), so the two
 * coexist in the node's table and each direction finds its own. */

/* proxy_upstream_sk hands an IPv4 TCP packet to the host stack when a
 * connection socket of the node holds its tuple as the packet addresses
 * it (a proxy's upstream connection bound to a pod's address): marked,
 * the proxy's routing rule delivers it locally. TC_ACT_OK, or -1 when no
 * such socket exists (the packet goes its usual way: a DNS flow passed
 * by the fallback, a proxy gone). A listener matched by port alone is no
 * upstream connection. A global function. */
__attribute__((noinline)) int proxy_upstream_sk(struct __sk_buff *skb, const struct pkt *p)
{
	if (!skb || !p)
		return -1;
	if (p->family != FAMILY_V4 || p->proto != IPPROTO_TCP_ || p->icmp_error || p->nonfirst_frag)
		return -1;
	struct bpf_sock_tuple t = {};
	__builtin_memcpy(&t.ipv4.saddr, p->saddr, 4);
	__builtin_memcpy(&t.ipv4.daddr, p->daddr, 4);
	t.ipv4.sport = p->sport;
	t.ipv4.dport = p->dport;
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return -1;
	int held = sk->state != BPF_TCP_LISTEN;
	bpf_sk_release(sk);
	if (!held)
		return -1;
	skb->mark = PROXY_MARK_VALUE;
	count(REASON_CT_REPLY, DIR_INGRESS, p->len);
	return TC_ACT_OK;
}

/* proxy_upstream_reply: proxy_upstream_sk for a packet to a local
 * endpoint ep arriving from another node (from_netdev, after a
 * masquerade mapping's reverse translation too) when it is a reply of a
 * flow the endpoint's egress sent to the HTTP proxy. Only an endpoint the
 * agent flagged EP2_L7_EGRESS (its enforced egress names a proxy) pays
 * the conntrack lookup; the others' packets pay a flag test. TC_ACT_OK or
 * -1 (the caller's usual path). A global function. */
__attribute__((noinline)) int proxy_upstream_reply(struct __sk_buff *skb, const struct pkt *p, const struct endpoint_info *ep)
{
	struct flow f;

	if (!skb || !p || !ep)
		return -1;
	if (!(ep->flags2 & EP2_L7_EGRESS) || !enforced(ep, DIR_EGRESS) || p->family != FAMILY_V4 || p->proto != IPPROTO_TCP_ || p->icmp_error ||
	    p->nonfirst_frag)
		return -1;
	flow_of(&f, p);
	struct ct_entry *e = ct_find(&f, p);
	if (!e || e->proxy != PROXY_HTTP || !ct_is_reply(e, &f))
		return -1;
	return proxy_upstream_sk(skb, p);
}

#endif
