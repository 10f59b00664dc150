/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: masquerade (source NAT of pod traffic leaving the
 * node through a host device, and the reverse translation of its
 * replies), over tdr_nat4_v1 and tdr_nat6_v1 (natmaps.h). Used by
 * bpf_host.c.
 *
 * Both families take the same steps, written once: a function with a
 * family argument is always inlined where the family is a constant, so
 * each copy the compiler makes keeps only its family's branch (and its
 * family's map: the verifier sees a known map at every map call). The
 * port claim's state is in a per-CPU scratch entry, not on the stack. */
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

/* The NAT table of a family. A macro, so that every map call names its
 * map itself. */
#define NAT_MAP(family) ((family) == FAMILY_V6 ? (void *)&tdr_nat6_v1 : (void *)&tdr_nat4_v1)

/* A key or an entry of either table. */
union nat_key {
	struct nat4_key k4;
	struct nat6_key k6;
};

union nat_entry {
	struct nat4_entry e4;
	struct nat6_entry e6;
};

/* Addresses are copied and compared a 32-bit word at a time, which the
 * compiler cannot see is possible through a byte pointer (it moves them a
 * byte at a time, and spilled the bytes of one copy to the stack): every
 * address given to these and to nat_key and nat_entry must be at a 4-byte
 * aligned offset of an aligned struct, as struct pkt's saddr and daddr,
 * the maps' keys and values and the scratch entry's are (not pkt's
 * in_saddr and in_daddr). The verifier refuses a misaligned access to the
 * stack. */
static __always_inline void addr_copy(__u8 *dst, const __u8 *src, const __u8 family)
{
	if (family == FAMILY_V6)
		__builtin_memcpy(__builtin_assume_aligned(dst, 4), __builtin_assume_aligned(src, 4), 16);
	else
		__builtin_memcpy(__builtin_assume_aligned(dst, 4), __builtin_assume_aligned(src, 4), 4);
}

static __always_inline __u32 addr_word(const __u8 *a, int i)
{
	__u32 v;
	__builtin_memcpy(&v, (const __u8 *)__builtin_assume_aligned(a, 4) + i, 4);
	return v;
}

static __always_inline int addr_eq(const __u8 *a, const __u8 *b, const __u8 family)
{
	if (family == FAMILY_V4)
		return addr_word(a, 0) == addr_word(b, 0);
	return addr_word(a, 0) == addr_word(b, 0) && addr_word(a, 4) == addr_word(b, 4) &&
	       addr_word(a, 8) == addr_word(b, 8) && addr_word(a, 12) == addr_word(b, 12);
}

/* nat_key fills k (a struct nat4_key or nat6_key, by family) and returns
 * it: local is the pod's side (NAT_DIR_EGRESS) or the node's
 * (NAT_DIR_INGRESS), see natmaps.h. */
static __always_inline void *nat_key(void *k, const __u8 family, __u8 dir, const __u8 *addr_l, __be16 port_l,
				     const __u8 *addr_r, __be16 port_r, __u8 proto)
{
	if (family == FAMILY_V6) {
		struct nat6_key *k6 = k;
		__builtin_memset(k6, 0, sizeof(*k6));
		addr_copy(k6->addr_l, addr_l, family);
		addr_copy(k6->addr_r, addr_r, family);
		k6->port_l = port_l, k6->port_r = port_r, k6->proto = proto, k6->dir = dir;
	} else {
		struct nat4_key *k4 = k;
		__builtin_memset(k4, 0, sizeof(*k4));
		addr_copy(k4->addr_l, addr_l, family);
		addr_copy(k4->addr_r, addr_r, family);
		k4->port_l = port_l, k4->port_r = port_r, k4->proto = proto, k4->dir = dir;
	}
	return k;
}

static __always_inline void nat_key_set_port(void *k, const __u8 family, __be16 port_l)
{
	if (family == FAMILY_V6)
		((struct nat6_key *)k)->port_l = port_l;
	else
		((struct nat4_key *)k)->port_l = port_l;
}

/* nat_entry fills e (a struct nat4_entry or nat6_entry, by family). */
static __always_inline void *nat_entry(void *e, const __u8 family, const __u8 *addr, __be16 port, __u8 flags,
				       __u64 created)
{
	if (family == FAMILY_V6) {
		struct nat6_entry *e6 = e;
		__builtin_memset(e6, 0, sizeof(*e6));
		addr_copy(e6->addr, addr, family);
		e6->port = port, e6->flags = flags, e6->created = created;
	} else {
		struct nat4_entry *e4 = e;
		__builtin_memset(e4, 0, sizeof(*e4));
		addr_copy(e4->addr, addr, family);
		e4->port = port, e4->flags = flags, e4->created = created;
	}
	return e;
}

/* The fields of an entry of either table. */
static __always_inline const __u8 *nat_addr(const void *e, const __u8 family)
{
	return family == FAMILY_V6 ? ((const struct nat6_entry *)e)->addr : ((const struct nat4_entry *)e)->addr;
}

static __always_inline __be16 nat_port(const void *e, const __u8 family)
{
	return family == FAMILY_V6 ? ((const struct nat6_entry *)e)->port : ((const struct nat4_entry *)e)->port;
}

static __always_inline __u64 nat_created(const void *e, const __u8 family)
{
	return family == FAMILY_V6 ? ((const struct nat6_entry *)e)->created : ((const struct nat4_entry *)e)->created;
}

/* masq_ct_alive reports whether the flow of the pod's tuple (pod, pod
 * port) <-> (remote, remote port) has a live conntrack entry: the canonical
 * key of conntrack.h, built from the tuple. */
static __always_inline int masq_ct_alive(const __u8 family, __u8 proto, const __u8 *pod, __be16 pport,
					 const __u8 *remote, __be16 rport, __u64 now)
{
	struct ct_entry *e;

	if (family == FAMILY_V6) {
		struct ct6_key k = {};
		ct_key(&k, family, proto, pod, pport, remote, rport);
		e = bpf_map_lookup_elem(&tdr_ct6_v2, &k);
	} else {
		struct ct4_key k = {};
		ct_key(&k, family, proto, pod, pport, remote, rport);
		e = bpf_map_lookup_elem(&tdr_ct4_v2, &k);
	}
	return e && e->expires > now;
}

/* masq_host_socket reports whether a socket of the host would receive a
 * reply from (remote, rport) to (node, port): such a port is the host's. */
static __always_inline int masq_host_socket(struct __sk_buff *skb, const __u8 family, __u8 proto, const __u8 *node,
					    __be16 port, const __u8 *remote, __be16 rport)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 size;

	if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_)
		return 0;
	if (family == FAMILY_V6) {
		__builtin_memcpy(t.ipv6.saddr, remote, 16);
		__builtin_memcpy(t.ipv6.daddr, node, 16);
		t.ipv6.sport = rport;
		t.ipv6.dport = port;
		size = sizeof(t.ipv6);
	} else {
		t.ipv4.saddr = u32_at(remote);
		t.ipv4.daddr = u32_at(node);
		t.ipv4.sport = rport;
		t.ipv4.dport = port;
		size = sizeof(t.ipv4);
	}
	if (proto == IPPROTO_TCP_)
		sk = bpf_skc_lookup_tcp(skb, &t, size, BPF_F_CURRENT_NETNS, 0);
	else
		sk = bpf_sk_lookup_udp(skb, &t, size, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	bpf_sk_release(sk);
	return 1;
}

/* A mapping's request and result: the pod's tuple (IPv4 addresses in the
 * first 4 bytes), the node's address it leaves with. */
struct masq_req {
	__u8 pod[16] __attribute__((aligned(4)));
	__u8 remote[16] __attribute__((aligned(4)));
	__u8 node[16] __attribute__((aligned(4)));
	__be16 pod_port;
	__be16 remote_port;
	__u8 proto;
	__u8 flags;  /* NAT_F_* of a new mapping */
	__be16 port; /* out: the node's port */
	__u64 now;
};

/* The masquerade of one packet, in a per-CPU scratch entry rather than on
 * the stack: for IPv6 the parsed packet, the request and the frames of the
 * port claim and its tries came to 552-656 bytes, over the verifier's 512;
 * IPv4 uses it too (its claim also runs under nodeport_snat, deeper). A
 * program runs to its end on its CPU without another program of this
 * object between (tc runs with bottom halves off, and no helper called
 * between masq_request and the rewrite runs a program), so one entry per
 * CPU holds. */
struct masq_scratch {
	struct masq_req r;
	union nat_key fwd; /* the flow as the pod sends it */
	union nat_key rev; /* as its reply would arrive, through the port tried */
	union nat_key old; /* the forward key of a mapping taken over */
	union nat_entry val;
	/* The first port the tries found held by a mapping whose flow is
	 * gone, and that mapping's pod side and creation as seen then. */
	__be16 reuse;
	__be16 reuse_pod_port;
	__u8 reuse_pod[16] __attribute__((aligned(4)));
	__u64 reuse_created;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct masq_scratch);
	__uint(max_entries, 1);
} tdr_masq_scratch SEC(".maps");

/* masq_request starts the masquerade of p (a pod's packet, or a packet
 * nodeport_in translated) through the node's address node: the CPU's
 * scratch entry gets the request and the flow's forward key. Returns the
 * entry, or NULL. */
static __always_inline struct masq_scratch *masq_request(const struct pkt *p, const __u8 family, const __u8 *node,
							 __u8 flags)
{
	__u32 zero = 0;
	struct masq_scratch *s = bpf_map_lookup_elem(&tdr_masq_scratch, &zero);
	if (!s)
		return NULL;
	addr_copy(s->r.pod, p->saddr, family);
	addr_copy(s->r.remote, p->daddr, family);
	addr_copy(s->r.node, node, family);
	s->r.pod_port = p->sport;
	s->r.remote_port = p->dport;
	s->r.proto = p->proto;
	s->r.flags = flags;
	s->r.port = 0;
	s->r.now = p->now;
	nat_key(&s->fwd, family, NAT_DIR_EGRESS, p->saddr, p->sport, p->daddr, p->dport, p->proto);
	return s;
}

/* masq_mapped reports whether the request's flow has a mapping through
 * the node's address, its port then in s->r.port. A mapping through
 * another address (the node's changed) is made anew; its old reverse
 * entry goes with the GC. */
static __always_inline int masq_mapped(struct masq_scratch *s, const __u8 family)
{
	const void *m = bpf_map_lookup_elem(NAT_MAP(family), &s->fwd);
	if (!m || !addr_eq(nat_addr(m, family), s->r.node, family))
		return 0;
	s->r.port = nat_port(m, family);
	return 1;
}

/* masq_claim makes the request's mapping through port: the reverse entry
 * is inserted only where none exists (BPF_NOEXIST: two CPUs never get the
 * same port), then the forward one. Returns 0, 1 when the port was taken
 * meanwhile, or minus a drop reason. */
static __always_inline int masq_claim(struct masq_scratch *s, const __u8 family, __be16 port)
{
	nat_key_set_port(&s->rev, family, port);
	nat_entry(&s->val, family, s->r.pod, s->r.pod_port, s->r.flags, s->r.now);
	long err = bpf_map_update_elem(NAT_MAP(family), &s->rev, &s->val, BPF_NOEXIST);
	if (err == -17) /* EEXIST */
		return 1;
	if (err)
		return -REASON_MASQ_TABLE_FULL;
	nat_entry(&s->val, family, s->r.node, port, s->r.flags, s->r.now);
	if (bpf_map_update_elem(NAT_MAP(family), &s->fwd, &s->val, BPF_ANY)) {
		bpf_map_delete_elem(NAT_MAP(family), &s->rev);
		return -REASON_MASQ_TABLE_FULL;
	}
	s->r.port = port;
	return 0;
}

/* The state of masq_alloc's tries (bpf_loop's callback context). */
struct masq_tries {
	struct __sk_buff *skb;
	struct masq_scratch *s;
	__u32 min, size, off;
	/* 1 while trying; then 0 (claimed) or minus a drop reason. */
	int result;
};

/* masq_try is one try of masq_alloc: returns 1 to stop (t->result says
 * how), 0 to try again. */
static __always_inline long masq_try(__u32 i, struct masq_tries *t, const __u8 family)
{
	struct masq_scratch *s = t->s;
	__u32 size = t->size;

	if (!s || size == 0)
		return 1;
	__u32 pick = size <= MASQ_PROBES ? (t->off + i) % size : bpf_get_prandom_u32() % size;
	__be16 port = bpf_htons((__u16)(t->min + pick));
	nat_key_set_port(&s->rev, family, port);
	const void *cur = bpf_map_lookup_elem(NAT_MAP(family), &s->rev);
	if (cur) {
		/* Taken; remember the first whose flow is gone. */
		if (!s->reuse && nat_created(cur, family) + MASQ_MIN_AGE <= s->r.now &&
		    !masq_ct_alive(family, s->r.proto, nat_addr(cur, family), nat_port(cur, family), s->r.remote,
				   s->r.remote_port, s->r.now)) {
			s->reuse = port;
			s->reuse_pod_port = nat_port(cur, family);
			s->reuse_created = nat_created(cur, family);
			addr_copy(s->reuse_pod, nat_addr(cur, family), family);
		}
		return 0;
	}
	if (masq_host_socket(t->skb, family, s->r.proto, s->r.node, port, s->r.remote, s->r.remote_port))
		return 0;
	int r = masq_claim(s, family, port);
	if (r == 1)
		return 0;
	t->result = r;
	return 1;
}

static long masq_try4(__u32 i, void *data)
{
	return masq_try(i, data, FAMILY_V4);
}

static long masq_try6(__u32 i, void *data)
{
	return masq_try(i, data, FAMILY_V6);
}

/* masq_alloc finds a port for the request in the CPU's scratch entry
 * (masq_request) and claims it, the port then in s->r.port. A port never
 * used (or whose mapping the GC removed) is preferred; only when the tries
 * find none is a port whose mapping's flow is gone (no live conntrack
 * entry) taken over: the remote end may still hold the last connection
 * through that port in TIME_WAIT (60 s on Linux), and a new SYN meeting it
 * can be refused (PAWS) and must be sent again. A port a host socket would
 * answer on is skipped. The tries run in bpf_loop, so the verifier checks
 * one try, not MASQ_PROBES of them. Returns 0, or minus a drop reason. */
static __always_inline int masq_alloc(struct __sk_buff *skb, const __u8 family)
{
	__u32 zero = 0;
	struct masq_scratch *s = bpf_map_lookup_elem(&tdr_masq_scratch, &zero);
	if (!skb || !s)
		return -REASON_MASQ_FAILED;
	__u32 min = MASQ_PORT_MIN, max = MASQ_PORT_MAX;
	if (max < min)
		return -REASON_MASQ_NO_PORT;
	struct masq_tries t = {.skb = skb, .s = s, .min = min, .size = max - min + 1, .result = 1};

	t.off = bpf_get_prandom_u32() % t.size;
	s->reuse = 0;
	nat_key(&s->rev, family, NAT_DIR_INGRESS, s->r.node, 0, s->r.remote, s->r.remote_port, s->r.proto);
	bpf_loop(t.size < MASQ_PROBES ? t.size : MASQ_PROBES, family == FAMILY_V6 ? masq_try6 : masq_try4, &t, 0);
	if (t.result <= 0)
		return t.result;
	__be16 reuse = s->reuse;
	if (!reuse ||
	    masq_host_socket(skb, family, s->r.proto, s->r.node, reuse, s->r.remote, s->r.remote_port))
		return -REASON_MASQ_NO_PORT;
	/* Take the dead mapping over: only while its reverse entry is the one
	 * the tries saw (another CPU may have taken the port over since), and
	 * only the CPU whose delete of it succeeds may. Its forward entry goes
	 * too, unless the pod's tuple got a mapping of its own since. */
	nat_key_set_port(&s->rev, family, reuse);
	const void *dead = bpf_map_lookup_elem(NAT_MAP(family), &s->rev);
	if (!dead || nat_created(dead, family) != s->reuse_created || nat_port(dead, family) != s->reuse_pod_port ||
	    !addr_eq(nat_addr(dead, family), s->reuse_pod, family))
		return -REASON_MASQ_NO_PORT;
	if (bpf_map_delete_elem(NAT_MAP(family), &s->rev))
		return -REASON_MASQ_NO_PORT;
	nat_key(&s->old, family, NAT_DIR_EGRESS, s->reuse_pod, s->reuse_pod_port, s->r.remote, s->r.remote_port,
		s->r.proto);
	const void *was = bpf_map_lookup_elem(NAT_MAP(family), &s->old);
	if (was && nat_port(was, family) == reuse && addr_eq(nat_addr(was, family), s->r.node, family))
		bpf_map_delete_elem(NAT_MAP(family), &s->old);
	int r = masq_claim(s, family, reuse);
	return r == 1 ? -REASON_MASQ_NO_PORT : r;
}

/* masq_alloc4 and masq_alloc6 are masq_alloc of each family: global
 * functions, verified once, on their own. */
__attribute__((noinline)) int masq_alloc4(struct __sk_buff *skb)
{
	return masq_alloc(skb, FAMILY_V4);
}

__attribute__((noinline)) int masq_alloc6(struct __sk_buff *skb)
{
	return masq_alloc(skb, FAMILY_V6);
}

/* masq_rewrite sets the packet's source (egress) or destination (ingress)
 * address and port (ICMP echo: identifier) to addr and port, keeping the
 * checksums right: IPv4's header checksum, and the L4 checksum with its
 * pseudo-header (TCP and UDP; ICMPv6's too; a UDP checksum of 0 stays 0;
 * ICMP's covers the identifier only). Returns 0, or -1 when the packet
 * could not be written. */
static __always_inline int masq_rewrite(struct __sk_buff *skb, const struct pkt *p, const __u8 family, int ingress,
					const __u8 *addr, __be16 port)
{
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
	if (family == FAMILY_V6) {
		__u32 old[4], new[4];
		__builtin_memcpy(old, ingress ? p->daddr : p->saddr, 16);
		__builtin_memcpy(new, addr, 16);
		__s64 diff = bpf_csum_diff(old, 16, new, 16, 0);
		if (diff < 0)
			return -1;
		if (bpf_l4_csum_replace(skb, csum_off, 0, diff, l4_flags | BPF_F_PSEUDO_HDR))
			return -1;
		if (bpf_skb_store_bytes(skb, ETH_HLEN + (ingress ? 24 : 8), new, 16, 0))
			return -1;
	} else {
		__u32 old = u32_at(ingress ? p->daddr : p->saddr);
		__u32 new = u32_at(addr);
		if (p->proto != IPPROTO_ICMP_ &&
		    bpf_l4_csum_replace(skb, csum_off, old, new, l4_flags | BPF_F_PSEUDO_HDR | 4))
			return -1;
		if (bpf_l3_csum_replace(skb, ETH_HLEN + 10, old, new, 4))
			return -1;
		if (bpf_skb_store_bytes(skb, ETH_HLEN + (ingress ? 16 : 12), &new, 4, 0))
			return -1;
	}
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, l4_flags | 2))
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &port, 2, 0))
			return -1;
	}
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
static __always_inline int masq_needed(const struct pkt *p, const __u8 family)
{
	if (in_cluster_peer(identity_of(family, p->daddr)))
		return 0;
	struct ipcache_key k = {.prefixlen = 32 + (family == FAMILY_V6 ? 128 : 32), .family = family};
	addr_copy(k.addr, p->daddr, family);
	return !bpf_map_lookup_elem(&tdr_nomasq_v1, &k);
}

/* masq_needed6 is masq_needed for IPv6 as a global function, so its keys
 * are not on the stack of to_netdev6's other calls. */
__attribute__((noinline)) int masq_needed6(const struct pkt *p)
{
	if (!p)
		return 0;
	return masq_needed(p, FAMILY_V6);
}

#endif
