/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: masquerade (source NAT of pod traffic leaving the
 * node through a host device, and the reverse translation of its
 * replies), over tdr_nat4_v1 and tdr_nat6_v1 (natmaps.h). Used by
 * bpf_host.c. */
#ifndef TDR_NAT_H
#define TDR_NAT_H

#include "maps.h"
#include "pkt.h"
#include "endpoint.h"
#include "ipcache.h"
#include "conntrack.h"

/* The source ports (ICMP echo identifiers) masqueraded flows get, set at
 * load time from --masquerade-port-range. The default stays above Linux's
 * default ephemeral range (32768-60999), and the agent reserves the range
 * from the host's ephemeral ports (ip_local_reserved_ports), so the host's
 * own connections never pick them; a host socket bound there explicitly
 * is found by a socket lookup before a port is taken. */
volatile const __u16 MASQ_PORT_MIN = 61000;
volatile const __u16 MASQ_PORT_MAX = 65535;
/* Ports tried for a new mapping. A range no larger than this is searched
 * whole (from a random port, the next ones in turn), so its exhaustion is
 * exact; in a larger one each try is a random port (no clustering, as the
 * next-port probing would make), and a flow fails only when every try
 * hits a taken port: with a fraction f of the range taken, f^64 (3e-4 at
 * 88%, 4% at 95%). */
#define MASQ_PROBES 64
/* A mapping whose flow has no conntrack entry is free for the taking once
 * it is this old (its flow's first packet made both). */
#define MASQ_MIN_AGE (2ULL * NSEC_PER_SEC)

/* masq_ct_alive reports whether the flow of the pod's tuple (pod, pod
 * port) <-> (remote, remote port) has a live conntrack entry: the canonical
 * key of conntrack.h, built from the tuple. */
static __always_inline int masq_ct_alive(__u8 proto, const __u8 *pod, __be16 pport, const __u8 *remote, __be16 rport,
					 __u64 now)
{
	struct ct4_key k = {};
	__u32 a = bpf_ntohl(u32_at(pod)), b = bpf_ntohl(u32_at(remote));
	int pod_a = a < b || (a == b && bpf_ntohs(pport) <= bpf_ntohs(rport));

	k.proto = proto;
	if (pod_a) {
		__builtin_memcpy(k.addr_a, pod, 4);
		__builtin_memcpy(k.addr_b, remote, 4);
		k.port_a = pport, k.port_b = rport;
	} else {
		__builtin_memcpy(k.addr_a, remote, 4);
		__builtin_memcpy(k.addr_b, pod, 4);
		k.port_a = rport, k.port_b = pport;
	}
	struct ct_entry *e = bpf_map_lookup_elem(&tdr_ct4_v2, &k);
	return e && e->expires > now;
}

/* masq_host_socket reports whether a socket of the host would receive a
 * reply from (remote, rport) to (node, port): such a port is the host's. */
static __always_inline int masq_host_socket(struct __sk_buff *skb, __u8 proto, const __u8 *node, __be16 port,
					    const __u8 *remote, __be16 rport)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;

	if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_)
		return 0;
	t.ipv4.saddr = u32_at(remote);
	t.ipv4.daddr = u32_at(node);
	t.ipv4.sport = rport;
	t.ipv4.dport = port;
	if (proto == IPPROTO_TCP_)
		sk = bpf_skc_lookup_tcp(skb, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	else
		sk = bpf_sk_lookup_udp(skb, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	bpf_sk_release(sk);
	return 1;
}

/* A new mapping's request and result (one pointer argument: a global
 * function takes five at most). */
struct masq_alloc {
	struct nat4_key fwd; /* the pod's tuple */
	__u8 node[4];
	__u64 now;
	__be16 port; /* out: the node's port */
	__u8 flags;  /* NAT_F_* of the mapping */
	__u8 pad[5];
};

/* masq_claim makes the mapping of a->fwd through port: the reverse entry
 * is inserted only where none exists (BPF_NOEXIST: two CPUs never get the
 * same port), then the forward one. Returns 0, 1 when the port was taken
 * meanwhile, or minus a drop reason. */
static __always_inline int masq_claim(struct masq_alloc *a, struct nat4_key *rev, const struct nat4_entry *back,
				      struct nat4_entry *out, __be16 port)
{
	rev->port_l = port;
	long err = bpf_map_update_elem(&tdr_nat4_v1, rev, back, BPF_NOEXIST);
	if (err == -17) /* EEXIST */
		return 1;
	if (err)
		return -REASON_MASQ_TABLE_FULL;
	out->port = port;
	if (bpf_map_update_elem(&tdr_nat4_v1, &a->fwd, out, BPF_ANY)) {
		bpf_map_delete_elem(&tdr_nat4_v1, rev);
		return -REASON_MASQ_TABLE_FULL;
	}
	a->port = port;
	return 0;
}

/* The state of masq_alloc4's tries (bpf_loop's callback context). */
struct masq_tries {
	struct __sk_buff *skb;
	struct masq_alloc *a;
	struct nat4_key rev;
	struct nat4_entry back;
	struct nat4_entry out;
	__u32 min, size, off;
	/* 1 while trying; then 0 (claimed) or minus a drop reason. */
	int result;
	__be16 reuse, reuse_pod_port;
	__u8 reuse_pod[4];
};

/* masq_try is one try of masq_alloc4: returns 1 to stop (t->result says
 * how), 0 to try again. */
static long masq_try(__u32 i, void *data)
{
	struct masq_tries *t = data;
	struct masq_alloc *a = t->a;
	__u32 size = t->size;

	if (!a || size == 0)
		return 1;
	__u32 pick = size <= MASQ_PROBES ? (t->off + i) % size : bpf_get_prandom_u32() % size;
	__be16 port = bpf_htons((__u16)(t->min + pick));
	t->rev.port_l = port;
	struct nat4_entry *cur = bpf_map_lookup_elem(&tdr_nat4_v1, &t->rev);
	if (cur) {
		/* Taken; remember the first whose flow is gone. */
		if (!t->reuse && cur->created + MASQ_MIN_AGE <= a->now &&
		    !masq_ct_alive(t->rev.proto, cur->addr, cur->port, t->rev.addr_r, t->rev.port_r, a->now)) {
			t->reuse = port;
			__builtin_memcpy(t->reuse_pod, cur->addr, 4);
			t->reuse_pod_port = cur->port;
		}
		return 0;
	}
	if (masq_host_socket(t->skb, t->rev.proto, a->node, port, t->rev.addr_r, t->rev.port_r))
		return 0;
	int r = masq_claim(a, &t->rev, &t->back, &t->out, port);
	if (r == 1)
		return 0;
	t->result = r;
	return 1;
}

/* masq_alloc4 finds a port for the pod's tuple a->fwd and claims it. A
 * port never used (or whose mapping the GC removed) is preferred; only
 * when the tries find none is a port whose mapping's flow is gone (no
 * live conntrack entry) taken over: the remote end may still hold the
 * last connection through that port in TIME_WAIT (60 s on Linux), and a
 * new SYN meeting it can be refused (PAWS) and must be sent again. A port
 * a host socket would answer on is skipped. The tries run in bpf_loop, so
 * the verifier checks one try, not MASQ_PROBES of them. Returns 0, or
 * minus a drop reason. A global function: verified once, on its own. */
__attribute__((noinline)) int masq_alloc4(struct __sk_buff *skb, struct masq_alloc *a)
{
	if (!skb || !a)
		return -REASON_MASQ_FAILED;
	__u32 min = MASQ_PORT_MIN, max = MASQ_PORT_MAX;
	if (max < min)
		return -REASON_MASQ_NO_PORT;
	struct masq_tries t = {.skb = skb, .a = a, .min = min, .size = max - min + 1, .result = 1};

	t.off = bpf_get_prandom_u32() % t.size;
	__builtin_memcpy(t.rev.addr_l, a->node, 4);
	__builtin_memcpy(t.rev.addr_r, a->fwd.addr_r, 4);
	t.rev.port_r = a->fwd.port_r;
	t.rev.proto = a->fwd.proto;
	t.rev.dir = NAT_DIR_INGRESS;
	__builtin_memcpy(t.back.addr, a->fwd.addr_l, 4);
	t.back.port = a->fwd.port_l;
	t.back.created = a->now;
	t.back.flags = a->flags;
	__builtin_memcpy(t.out.addr, a->node, 4);
	t.out.created = a->now;
	t.out.flags = a->flags;

	bpf_loop(t.size < MASQ_PROBES ? t.size : MASQ_PROBES, masq_try, &t, 0);
	if (t.result <= 0)
		return t.result;
	__be16 reuse = t.reuse;
	if (!reuse || masq_host_socket(skb, t.rev.proto, a->node, reuse, t.rev.addr_r, t.rev.port_r))
		return -REASON_MASQ_NO_PORT;
	/* Take the dead mapping over: only the CPU whose delete of its
	 * reverse entry succeeds may, and its forward entry goes too. */
	t.rev.port_l = reuse;
	if (bpf_map_delete_elem(&tdr_nat4_v1, &t.rev))
		return -REASON_MASQ_NO_PORT;
	struct nat4_key old = {};
	__builtin_memcpy(old.addr_l, t.reuse_pod, 4);
	__builtin_memcpy(old.addr_r, t.rev.addr_r, 4);
	old.port_l = t.reuse_pod_port;
	old.port_r = t.rev.port_r;
	old.proto = t.rev.proto;
	old.dir = NAT_DIR_EGRESS;
	/* Unless the pod's tuple got a mapping of its own since. */
	struct nat4_entry *was = bpf_map_lookup_elem(&tdr_nat4_v1, &old);
	if (was && was->port == reuse && u32_at(was->addr) == u32_at(a->node))
		bpf_map_delete_elem(&tdr_nat4_v1, &old);
	int r = masq_claim(a, &t.rev, &t.back, &t.out, reuse);
	return r == 1 ? -REASON_MASQ_NO_PORT : r;
}

/* masq_rewrite sets the packet's source (egress) or destination (ingress)
 * address and port (ICMP echo: identifier) to addr and port, keeping the
 * IPv4 header checksum and the L4 checksum right (pseudo-header for TCP
 * and UDP; a UDP checksum of 0 stays 0; ICMP's covers the identifier
 * only). Returns 0, or -1 when the packet could not be written. */
static __always_inline int masq_rewrite(struct __sk_buff *skb, const struct pkt *p, int ingress, const __u8 *addr,
					__be16 port)
{
	__u32 old = u32_at(ingress ? p->daddr : p->saddr);
	__u32 new = u32_at(addr);
	__be16 old_port = ingress ? p->dport : p->sport;
	__u32 csum_off, port_off;
	__u64 l4_flags = 0;

	if (p->proto == IPPROTO_TCP_) {
		csum_off = p->l4_off + 16;
		port_off = p->l4_off + (ingress ? 2 : 0);
	} else if (p->proto == IPPROTO_UDP_) {
		csum_off = p->l4_off + 6;
		port_off = p->l4_off + (ingress ? 2 : 0);
		l4_flags = BPF_F_MARK_MANGLED_0;
	} else {
		csum_off = p->l4_off + 2;
		port_off = p->l4_off + 4;
	}
	if (p->proto != IPPROTO_ICMP_ &&
	    bpf_l4_csum_replace(skb, csum_off, old, new, l4_flags | BPF_F_PSEUDO_HDR | 4))
		return -1;
	if (bpf_l3_csum_replace(skb, ETH_HLEN + 10, old, new, 4))
		return -1;
	if (bpf_skb_store_bytes(skb, ETH_HLEN + (ingress ? 16 : 12), &new, 4, 0))
		return -1;
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, l4_flags | 2))
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &port, 2, 0))
			return -1;
	}
	return 0;
}

/* masq_rev_icmp_error gives an ICMP error about a masqueraded flow (a
 * router's "fragmentation needed", a remote's "port unreachable"), sent
 * to the node's address and quoting the packet as it left (node address
 * and port -> remote), back to the pod: the outer destination and the
 * quoted source become the pod's address and port. The IPv4 checksums of
 * both headers stay right and the ICMP checksum follows the quoted port
 * (the quoted header's address and checksum change by opposite amounts).
 * The quoted L4 checksum is left as it is: the pod's kernel finds the
 * socket by the quoted tuple and does not check it. Returns 0 when
 * translated, 1 when the error is about no mapping, -1 when the packet
 * could not be written. */
static __always_inline int masq_rev_icmp_error(struct __sk_buff *skb, struct pkt *p)
{
	struct nat4_key k = {};
	__builtin_memcpy(k.addr_l, p->in_saddr, 4);
	__builtin_memcpy(k.addr_r, p->in_daddr, 4);
	k.port_l = p->in_sport;
	k.port_r = p->in_dport;
	k.proto = p->in_proto;
	k.dir = NAT_DIR_INGRESS;
	if (u32_at(p->in_saddr) != u32_at(p->daddr))
		return 1;
	struct nat4_entry *m = bpf_map_lookup_elem(&tdr_nat4_v1, &k);
	if (!m)
		return 1;
	__u32 pod = u32_at(m->addr);
	__be16 pport = m->port;
	__u32 node = u32_at(p->daddr);
	__u32 in_ip = p->l4_off + 8;
	__u8 vihl;
	if (bpf_skb_load_bytes(skb, in_ip, &vihl, 1))
		return -1;
	__u32 in_l4 = in_ip + ((__u32)(vihl & 0xf)) * 4;
	__u32 port_off = in_l4 + (p->in_proto == IPPROTO_ICMP_ ? 4 : 0);
	/* The outer destination. */
	if (bpf_l3_csum_replace(skb, ETH_HLEN + 10, node, pod, 4) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + 16, &pod, 4, 0))
		return -1;
	/* The quoted source address, with the quoted header's checksum. */
	if (bpf_l3_csum_replace(skb, in_ip + 10, node, pod, 4) || bpf_skb_store_bytes(skb, in_ip + 12, &pod, 4, 0))
		return -1;
	/* The quoted source port (echo identifier), in the ICMP checksum. */
	if (p->in_sport != pport) {
		if (bpf_l4_csum_replace(skb, p->l4_off + 2, p->in_sport, pport, 2) ||
		    bpf_skb_store_bytes(skb, port_off, &pport, 2, 0))
			return -1;
	}
	__builtin_memcpy(p->daddr, m->addr, 4);
	return 0;
}

/* masq_l4 reports whether the packet is one masquerade translates: TCP,
 * UDP, or ICMP(v6) echo (request leaving, reply arriving); not a later
 * fragment (no ports), an ICMP error or neighbor discovery. */
static __always_inline int masq_l4(const struct pkt *p)
{
	if (p->nonfirst_frag || p->icmp_error || p->ndp)
		return 0;
	if (p->proto == IPPROTO_TCP_ || p->proto == IPPROTO_UDP_)
		return 1;
	/* ICMP: echo requests and replies only (pport is the type). */
	if (p->family == FAMILY_V4)
		return p->proto == IPPROTO_ICMP_ && (p->pport == bpf_htons(8) || p->pport == bpf_htons(0));
	return p->proto == IPPROTO_ICMPV6_ && (p->pport == bpf_htons(128) || p->pport == bpf_htons(129));
}

/* masq_needed reports whether a packet from a local endpoint to daddr
 * leaves with the node's address: not when the destination is a pod or a
 * node of the cluster (its identity says so) or in a non-masquerade CIDR. */
static __always_inline int masq_needed(const struct pkt *p)
{
	if (in_cluster_peer(identity_of(FAMILY_V4, p->daddr)))
		return 0;
	struct ipcache_key k = {.prefixlen = 32 + 32, .family = FAMILY_V4};
	__builtin_memcpy(k.addr, p->daddr, 4);
	return !bpf_map_lookup_elem(&tdr_nomasq_v1, &k);
}

/* IPv6: the same steps over tdr_nat6_v1. */

static __always_inline int masq_ct_alive6(__u8 proto, const __u8 *pod, __be16 pport, const __u8 *remote, __be16 rport,
					  __u64 now)
{
	struct ct6_key k = {};
	int pod_a = !lower6(remote, rport, pod, pport);

	k.proto = proto;
	if (pod_a) {
		__builtin_memcpy(k.addr_a, pod, 16);
		__builtin_memcpy(k.addr_b, remote, 16);
		k.port_a = pport, k.port_b = rport;
	} else {
		__builtin_memcpy(k.addr_a, remote, 16);
		__builtin_memcpy(k.addr_b, pod, 16);
		k.port_a = rport, k.port_b = pport;
	}
	struct ct_entry *e = bpf_map_lookup_elem(&tdr_ct6_v2, &k);
	return e && e->expires > now;
}

static __always_inline int masq_host_socket6(struct __sk_buff *skb, __u8 proto, const __u8 *node, __be16 port,
					     const __u8 *remote, __be16 rport)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;

	if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_)
		return 0;
	__builtin_memcpy(t.ipv6.saddr, remote, 16);
	__builtin_memcpy(t.ipv6.daddr, node, 16);
	t.ipv6.sport = rport;
	t.ipv6.dport = port;
	if (proto == IPPROTO_TCP_)
		sk = bpf_skc_lookup_tcp(skb, &t, sizeof(t.ipv6), BPF_F_CURRENT_NETNS, 0);
	else
		sk = bpf_sk_lookup_udp(skb, &t, sizeof(t.ipv6), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	bpf_sk_release(sk);
	return 1;
}

struct masq_alloc6 {
	struct nat6_key fwd;
	__u8 node[16];
	__u64 now;
	__be16 port;
	__u8 pad[6];
};

/* The IPv6 path's state lives in a per-CPU scratch entry, not on the
 * stack: the parsed packet, the request and the tries' frames together
 * would exceed the verifier's 512 bytes (the IPv4 path fits). A program
 * runs to its end on its CPU without another program of this object
 * between (tc runs with bottom halves off), so one entry per CPU holds. */
struct masq_scratch6 {
	struct masq_alloc6 a;
	struct nat6_key rev;
	struct nat6_key old;
	struct nat6_entry v;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct masq_scratch6);
	__uint(max_entries, 1);
} tdr_masq_scratch6 SEC(".maps");

static __always_inline struct masq_scratch6 *masq_scratch6(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&tdr_masq_scratch6, &zero);
}

/* masq_claim6 makes the mapping of s->a.fwd through port (masq_claim for
 * IPv6). */
static __always_inline int masq_claim6(struct masq_scratch6 *s, __be16 port)
{
	struct masq_alloc6 *a = &s->a;

	__builtin_memcpy(s->v.addr, a->fwd.addr_l, 16);
	s->v.port = a->fwd.port_l;
	s->v.created = a->now;
	s->rev.port_l = port;
	long err = bpf_map_update_elem(&tdr_nat6_v1, &s->rev, &s->v, BPF_NOEXIST);
	if (err == -17) /* EEXIST */
		return 1;
	if (err)
		return -REASON_MASQ_TABLE_FULL;
	__builtin_memcpy(s->v.addr, a->node, 16);
	s->v.port = port;
	if (bpf_map_update_elem(&tdr_nat6_v1, &a->fwd, &s->v, BPF_ANY)) {
		bpf_map_delete_elem(&tdr_nat6_v1, &s->rev);
		return -REASON_MASQ_TABLE_FULL;
	}
	a->port = port;
	return 0;
}

struct masq_tries6 {
	struct __sk_buff *skb;
	struct masq_scratch6 *s;
	__u32 min, size, off;
	int result;
	__be16 reuse;
};

static long masq_try6(__u32 i, void *data)
{
	struct masq_tries6 *t = data;
	struct masq_scratch6 *s = t->s;
	__u32 size = t->size;

	if (!s || size == 0)
		return 1;
	__u32 pick = size <= MASQ_PROBES ? (t->off + i) % size : bpf_get_prandom_u32() % size;
	__be16 port = bpf_htons((__u16)(t->min + pick));
	s->rev.port_l = port;
	struct nat6_entry *cur = bpf_map_lookup_elem(&tdr_nat6_v1, &s->rev);
	if (cur) {
		if (!t->reuse && cur->created + MASQ_MIN_AGE <= s->a.now &&
		    !masq_ct_alive6(s->rev.proto, cur->addr, cur->port, s->rev.addr_r, s->rev.port_r, s->a.now))
			t->reuse = port;
		return 0;
	}
	if (masq_host_socket6(t->skb, s->rev.proto, s->a.node, port, s->rev.addr_r, s->rev.port_r))
		return 0;
	int r = masq_claim6(s, port);
	if (r == 1)
		return 0;
	t->result = r;
	return 1;
}

/* masq_alloc6 is masq_alloc4 for IPv6, over the CPU's scratch entry
 * (s->a the request, s->a.port the result). A global function. */
__attribute__((noinline)) int masq_alloc6(struct __sk_buff *skb)
{
	if (!skb)
		return -REASON_MASQ_FAILED;
	struct masq_scratch6 *s = masq_scratch6();
	if (!s)
		return -REASON_MASQ_FAILED;
	__u32 min = MASQ_PORT_MIN, max = MASQ_PORT_MAX;
	if (max < min)
		return -REASON_MASQ_NO_PORT;
	struct masq_tries6 t = {.skb = skb, .s = s, .min = min, .size = max - min + 1, .result = 1};

	t.off = bpf_get_prandom_u32() % t.size;
	__builtin_memset(&s->rev, 0, sizeof(s->rev));
	__builtin_memcpy(s->rev.addr_l, s->a.node, 16);
	__builtin_memcpy(s->rev.addr_r, s->a.fwd.addr_r, 16);
	s->rev.port_r = s->a.fwd.port_r;
	s->rev.proto = s->a.fwd.proto;
	s->rev.dir = NAT_DIR_INGRESS;

	bpf_loop(t.size < MASQ_PROBES ? t.size : MASQ_PROBES, masq_try6, &t, 0);
	if (t.result <= 0)
		return t.result;
	__be16 reuse = t.reuse;
	if (!reuse || masq_host_socket6(skb, s->rev.proto, s->a.node, reuse, s->rev.addr_r, s->rev.port_r))
		return -REASON_MASQ_NO_PORT;
	/* Take the dead mapping over (as masq_alloc4). */
	s->rev.port_l = reuse;
	struct nat6_entry *dead = bpf_map_lookup_elem(&tdr_nat6_v1, &s->rev);
	if (!dead)
		return -REASON_MASQ_NO_PORT;
	__builtin_memset(&s->old, 0, sizeof(s->old));
	__builtin_memcpy(s->old.addr_l, dead->addr, 16);
	s->old.port_l = dead->port;
	if (bpf_map_delete_elem(&tdr_nat6_v1, &s->rev))
		return -REASON_MASQ_NO_PORT;
	__builtin_memcpy(s->old.addr_r, s->rev.addr_r, 16);
	s->old.port_r = s->rev.port_r;
	s->old.proto = s->rev.proto;
	s->old.dir = NAT_DIR_EGRESS;
	/* Unless the pod's tuple got a mapping of its own since. */
	struct nat6_entry *was = bpf_map_lookup_elem(&tdr_nat6_v1, &s->old);
	if (was && was->port == reuse && u32_at(was->addr) == u32_at(s->a.node) &&
	    u32_at(was->addr + 4) == u32_at(s->a.node + 4) && u32_at(was->addr + 8) == u32_at(s->a.node + 8) &&
	    u32_at(was->addr + 12) == u32_at(s->a.node + 12))
		bpf_map_delete_elem(&tdr_nat6_v1, &s->old);
	int r = masq_claim6(s, reuse);
	return r == 1 ? -REASON_MASQ_NO_PORT : r;
}

/* masq_rewrite6 is masq_rewrite for IPv6: no header checksum; the L4
 * checksum (ICMPv6's too) covers a pseudo-header with the addresses. */
static __always_inline int masq_rewrite6(struct __sk_buff *skb, const struct pkt *p, int ingress, const __u8 *addr,
					 __be16 port)
{
	__u32 old[4], new[4];
	__be16 old_port = ingress ? p->dport : p->sport;
	__u32 csum_off, port_off;
	__u64 l4_flags = 0;

	if (p->proto == IPPROTO_TCP_) {
		csum_off = p->l4_off + 16;
		port_off = p->l4_off + (ingress ? 2 : 0);
	} else if (p->proto == IPPROTO_UDP_) {
		csum_off = p->l4_off + 6;
		port_off = p->l4_off + (ingress ? 2 : 0);
		l4_flags = BPF_F_MARK_MANGLED_0;
	} else {
		csum_off = p->l4_off + 2;
		port_off = p->l4_off + 4;
	}
	__builtin_memcpy(old, ingress ? p->daddr : p->saddr, 16);
	__builtin_memcpy(new, addr, 16);
	__s64 diff = bpf_csum_diff(old, 16, new, 16, 0);
	if (diff < 0)
		return -1;
	if (bpf_l4_csum_replace(skb, csum_off, 0, diff, l4_flags | BPF_F_PSEUDO_HDR))
		return -1;
	if (bpf_skb_store_bytes(skb, ETH_HLEN + (ingress ? 24 : 8), new, 16, 0))
		return -1;
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, l4_flags | 2))
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &port, 2, 0))
			return -1;
	}
	return 0;
}

/* masq_needed6 is masq_needed for IPv6: a global function, so its keys
 * are not on the stack while the port is claimed. */
__attribute__((noinline)) int masq_needed6(const struct pkt *p)
{
	if (!p)
		return 0;
	if (in_cluster_peer(identity_of(FAMILY_V6, p->daddr)))
		return 0;
	struct ipcache_key k = {.prefixlen = 32 + 128, .family = FAMILY_V6};
	__builtin_memcpy(k.addr, p->daddr, 16);
	return !bpf_map_lookup_elem(&tdr_nomasq_v1, &k);
}

#endif
