// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Tendril's per-endpoint datapath, attached with TCX on the host side of
 * each pod's veth: from_pod on tcx ingress (packets the pod sends), to_pod
 * on tcx egress (packets delivered to the pod). One object is loaded per
 * node; per-endpoint facts live in maps, so no compile happens at run time.
 *
 * from_pod: endpoint of the interface → parse (truncated/malformed → drop)
 * → anti-spoofing → the flow's conntrack entry (one per flow, shared by
 * both directions and both local endpoints) → egress policy of a new flow
 * by the destination's identity → when the destination is a local
 * endpoint that takes direct delivery: its ingress policy of a new flow,
 * then bpf_redirect_peer into its namespace (its to_pod does not run, so
 * its ingress is enforced exactly once, here); otherwise hand to the host
 * stack.
 * to_pod: endpoint of the interface → parse → conntrack → ingress policy
 * of a new flow by the source's identity (ipcache; unknown is world) →
 * deliver. */
#include "lib/common.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define MAX_ENDPOINTS 4096

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32); /* ifindex of the host-side veth, below EP_IFINDEX_SLOTS */
	__type(value, struct endpoint_info);
	__uint(max_entries, EP_IFINDEX_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_ep_ifindex_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* ifindex of the host-side veth (every endpoint) */
	__type(value, struct endpoint_info);
	__uint(max_entries, MAX_ENDPOINTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_endpoints_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32); /* endpoint ID */
	__type(value, struct endpoint_info);
	__uint(max_entries, EP_ID_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_ep_id_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* IPv4 address, network byte order */
	__type(value, struct endpoint_info);
	__uint(max_entries, MAX_ENDPOINTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_endpoint_ip4_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u8[16]); /* IPv6 address */
	__type(value, struct endpoint_info);
	__uint(max_entries, MAX_ENDPOINTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_endpoint_ip6_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_info);
	__uint(max_entries, 512000);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_ipcache_v2 SEC(".maps");

/* One endpoint's policy entries of one direction, for one peer identity
 * kind (see policy_slot). The agent creates these as endpoints get
 * policy; the outer map holds them, so they live while the agent is down. */
struct policy_trie {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	/* Sizes, not types: clang's BTF has only a forward declaration of a
	 * type behind the inner map's pointers. */
	__uint(key_size, sizeof(struct policy_key));
	__uint(value_size, sizeof(struct policy_entry));
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__type(key, __u32);
	__uint(max_entries, EP_ID_SLOTS * POLICY_SLOTS_PER_EP);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct policy_trie);
} tdr_policy_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_ct4_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct6_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 131072);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_ct6_v1 SEC(".maps");

/* Index: reason * 2 + direction. A per-CPU array: the counter update on
 * every packet is a direct, lock-free access. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct metric_value);
	__uint(max_entries, REASON_MAX * 2);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_metrics_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_events_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ratelimit);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_ratelimit_v2 SEC(".maps");

/* Keep struct event and the policy key and entry in BTF so bpf2go generates
 * their Go types (the inner policy maps name only their sizes). */
const struct event *unused_event_type __attribute__((unused));
const struct policy_entry *unused_policy_entry_type __attribute__((unused));
const struct policy_key *unused_policy_key_type __attribute__((unused));

/* Events per CPU per second, and the burst a CPU may send at once; beyond
 * them events are dropped (counters are not), so a flood cannot starve
 * user space or the ring buffer. */
volatile const __u32 EVENTS_PER_SEC = 1000;
volatile const __u32 EVENTS_BURST = 1000;
/* Unread event bytes from which a new event wakes the reader at once. */
#define EVENTS_WAKEUP_BYTES (64 * 1024)
/* Policy verdict events for allowed new flows cost a ring buffer write per
 * connection; the loader turns them on when asked (drops always report). */
volatile const __u8 POLICY_VERDICT_EVENTS = 0;

#define NSEC_PER_SEC 1000000000ULL
#define CT_LIFETIME_TCP_SYN (60ULL * NSEC_PER_SEC)
#define CT_LIFETIME_TCP (21600ULL * NSEC_PER_SEC)
#define CT_LIFETIME_TCP_CLOSE (10ULL * NSEC_PER_SEC)
#define CT_LIFETIME_NONTCP (60ULL * NSEC_PER_SEC)
/* An entry's deadline is rewritten at most this often on a busy flow: a
 * write per packet would bounce the entry's cache line between CPUs. */
#define CT_REFRESH_INTERVAL (1ULL * NSEC_PER_SEC)

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

#define IPPROTO_ICMP_ 1
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define IPPROTO_ICMPV6_ 58
#define IPPROTO_SCTP_ 132

/* Headers are read in place; deeper than this is not parsed. */
#define MAX_HDR_OFFSET 512

/* Conntrack outcomes. */
#define CT_NEW 0
#define CT_ESTABLISHED 1
#define CT_REPLY 2
#define CT_RELATED 3

/* The parsed facts of one packet. */
struct pkt {
	__u8 family;
	__u8 proto;
	__u8 tcp_flags;
	__u8 nonfirst_frag;
	__u8 icmp_error; /* carries an inner header of another flow */
	__u8 ndp;        /* neighbor discovery / MLD: always passes */
	__u8 arp;
	__u8 in_proto;
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	/* The port policy sees: the destination port, or the ICMP type. */
	__be16 pport;
	/* Inner tuple of an ICMP error (as the original packet had it). */
	__be16 in_sport;
	__be16 in_dport;
	__u8 in_saddr[16];
	__u8 in_daddr[16];
	__u32 len;
	/* End of the IP packet: Ethernet padding after it is not header. */
	__u32 l3_end;
	/* bpf_ktime_get_coarse_ns() when the packet was parsed: one clock
	 * read serves every conntrack step. */
	__u64 now;
};

/* skb_data and skb_data_end load the packet pointers with the context
 * register and a constant offset in one instruction. Written in C, clang
 * may keep the field's address (ctx + 80) in a register across a helper
 * call and load through it later, which the verifier refuses. */
static __always_inline void *skb_data(struct __sk_buff *skb)
{
	void *p;
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(p) : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data)));
	return p;
}

static __always_inline void *skb_data_end(struct __sk_buff *skb)
{
	void *p;
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(p) : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data_end)));
	return p;
}

/* hdr returns a pointer to len bytes at off in the packet, pulling them
 * into the linear area when they are not there yet, or NULL when the IP
 * packet (p->l3_end) or the frame is shorter. Every call may move the
 * packet: pointers from earlier calls are dead after it. */
static __always_inline void *hdr(struct __sk_buff *skb, const struct pkt *p, __u32 off, const __u32 len)
{
	if (off > MAX_HDR_OFFSET || off + len > p->l3_end)
		return NULL;
	void *data = skb_data(skb);
	void *end = skb_data_end(skb);
	if (data + off + len <= end)
		return data + off;
	if (bpf_skb_pull_data(skb, off + len))
		return NULL;
	data = skb_data(skb);
	end = skb_data_end(skb);
	if (off > MAX_HDR_OFFSET || data + off + len > end)
		return NULL;
	return data + off;
}

static __always_inline void count(__u8 reason, __u8 dir, __u32 len)
{
	__u32 k = ((__u32)reason << 1) | (dir & 1);
	struct metric_value *v = bpf_map_lookup_elem(&tdr_metrics_v2, &k);

	if (v) {
		v->packets++;
		v->bytes += len;
	}
}

/* event_allowed takes one event's worth of credit from this CPU's bucket,
 * which refills at EVENTS_PER_SEC up to EVENTS_BURST events. */
static __always_inline int event_allowed(void)
{
	__u32 zero = 0;
	struct ratelimit *rl = bpf_map_lookup_elem(&tdr_ratelimit_v2, &zero);

	if (!rl || EVENTS_PER_SEC == 0)
		return 0;
	__u64 cost = NSEC_PER_SEC / EVENTS_PER_SEC;
	__u64 cap = cost * EVENTS_BURST;
	__u64 now = bpf_ktime_get_coarse_ns();
	__u64 credit = rl->credit + (now - rl->last);
	if (rl->last == 0 || credit > cap)
		credit = cap;
	rl->last = now;
	if (credit < cost) {
		rl->credit = credit;
		return 0;
	}
	rl->credit = credit - cost;
	return 1;
}

static __always_inline void emit(__u8 type, __u8 reason, __u8 dir, __u16 ep_id, const struct pkt *p,
				 __u32 src_id, __u32 dst_id, __u8 verdict, __u32 cookie)
{
	if (!event_allowed())
		return;
	struct event *e = bpf_ringbuf_reserve(&tdr_events_v1, sizeof(*e), 0);
	if (!e)
		return;
	e->ts = bpf_ktime_get_ns();
	e->type = type;
	e->reason = reason;
	e->dir = dir;
	e->family = p->family;
	e->ep_id = ep_id;
	e->proto = p->proto;
	e->verdict = verdict;
	e->src_identity = src_id;
	e->dst_identity = dst_id;
	e->cookie = cookie;
	__builtin_memcpy(e->saddr, p->saddr, 16);
	__builtin_memcpy(e->daddr, p->daddr, 16);
	e->sport = p->sport;
	e->dport = p->dport;
	e->len = p->len;
	/* Waking the reader for every event (an irq_work, a self-IPI, then a
	 * thread wakeup) would cost more than writing it: the reader polls
	 * on a short timer instead, and the event whose record makes the
	 * unread backlog cross EVENTS_WAKEUP_BYTES wakes it at once (one
	 * wakeup per crossing, none while a reader lags far behind). The
	 * backlog counts this record (reserved) with its 8-byte header. */
	__u64 avail = bpf_ringbuf_query(&tdr_events_v1, BPF_RB_AVAIL_DATA);
	__u64 rec = sizeof(*e) + 8;
	bpf_ringbuf_submit(e, avail >= EVENTS_WAKEUP_BYTES && avail < EVENTS_WAKEUP_BYTES + rec ? BPF_RB_FORCE_WAKEUP
												: BPF_RB_NO_WAKEUP);
}

/* drop_out counts and reports a drop: out of line (a static subprogram),
 * so the rarely taken drop paths do not sit in the hot path's
 * instruction cache lines. what packs reason, dir and ep_id (a call
 * takes five arguments). */
static __attribute__((noinline)) int drop_out(const struct pkt *p, __u32 what, __u32 src_id, __u32 dst_id, __u32 cookie)
{
	__u8 reason = what & 0xff, dir = (what >> 8) & 0xff;
	__u16 ep_id = what >> 16;

	count(reason, dir, p->len);
	emit(EVENT_DROP, reason, dir, ep_id, p, src_id, dst_id, 0, cookie);
	return TC_ACT_SHOT;
}

static __always_inline int drop(__u8 reason, __u8 dir, __u16 ep_id, const struct pkt *p, __u32 src_id, __u32 dst_id,
				__u32 cookie)
{
	return drop_out(p, (__u32)reason | ((__u32)dir << 8) | ((__u32)ep_id << 16), src_id, dst_id, cookie);
}

static __always_inline __be16 be16_at(const __u8 *b)
{
	__be16 v;
	__builtin_memcpy(&v, b, 2);
	return v;
}

/* parse_icmp_inner reads the packet an ICMP error quotes, at off. */
static __always_inline int parse_icmp_inner(struct __sk_buff *skb, __u32 off, struct pkt *p)
{
	__u32 in = off;

	if (p->family == FAMILY_V4) {
		__u8 *ih = hdr(skb, p, in, 20);
		if (!ih)
			return REASON_TRUNCATED;
		__u8 ihl = ih[0] & 0xf;
		if ((ih[0] >> 4) != 4 || ihl < 5)
			return REASON_MALFORMED;
		p->in_proto = ih[9];
		__builtin_memcpy(p->in_saddr, &ih[12], 4);
		__builtin_memcpy(p->in_daddr, &ih[16], 4);
		in += (__u32)ihl * 4;
	} else {
		__u8 *ih = hdr(skb, p, in, 40);
		if (!ih)
			return REASON_TRUNCATED;
		if ((ih[0] >> 4) != 6)
			return REASON_MALFORMED;
		p->in_proto = ih[6];
		__builtin_memcpy(p->in_saddr, &ih[8], 16);
		__builtin_memcpy(p->in_daddr, &ih[24], 16);
		in += 40;
	}
	if (p->in_proto == IPPROTO_ICMP_ || p->in_proto == IPPROTO_ICMPV6_) {
		/* An error about an echo request: its tuple is (id, 0). */
		__u8 *ic = hdr(skb, p, in, 8);
		if (!ic)
			return REASON_TRUNCATED;
		p->in_sport = be16_at(&ic[4]);
		p->in_dport = 0;
		return REASON_FORWARDED;
	}
	__u8 *ports = hdr(skb, p, in, 4);
	if (!ports)
		return REASON_TRUNCATED;
	p->in_sport = be16_at(&ports[0]);
	p->in_dport = be16_at(&ports[2]);
	return REASON_FORWARDED;
}

/* parse_l4 reads ports (or ICMP type/id) at off. Returns a reason on error,
 * REASON_FORWARDED when fine. */
static __always_inline int parse_l4(struct __sk_buff *skb, __u32 off, struct pkt *p)
{
	if (p->nonfirst_frag)
		return REASON_FORWARDED;
	switch (p->proto) {
	case IPPROTO_TCP_: {
		__u8 *h = hdr(skb, p, off, 20);
		if (!h)
			return REASON_TRUNCATED;
		p->sport = be16_at(&h[0]);
		p->dport = be16_at(&h[2]);
		p->tcp_flags = h[13];
		p->pport = p->dport;
		if ((h[12] >> 4) < 5)
			return REASON_MALFORMED;
		return REASON_FORWARDED;
	}
	case IPPROTO_UDP_:
	case IPPROTO_SCTP_: {
		__u8 *h = hdr(skb, p, off, 8);
		if (!h)
			return REASON_TRUNCATED;
		p->sport = be16_at(&h[0]);
		p->dport = be16_at(&h[2]);
		p->pport = p->dport;
		return REASON_FORWARDED;
	}
	case IPPROTO_ICMP_:
	case IPPROTO_ICMPV6_: {
		__u8 *h = hdr(skb, p, off, 8);
		if (!h)
			return REASON_TRUNCATED;
		__u8 type = h[0];
		__be16 id = be16_at(&h[4]);
		/* Policy sees the ICMP type as the port, as Cilium does. */
		p->pport = bpf_htons(type);
		int v6 = p->proto == IPPROTO_ICMPV6_;
		if ((!v6 && type == 8) || (v6 && type == 128)) { /* echo request */
			p->sport = id;
			p->dport = 0;
			return REASON_FORWARDED;
		}
		if ((!v6 && type == 0) || (v6 && type == 129)) { /* echo reply */
			p->sport = 0;
			p->dport = id;
			return REASON_FORWARDED;
		}
		p->dport = p->pport;
		if (v6 && ((type >= 130 && type <= 137) || type == 143)) {
			p->ndp = 1;
			return REASON_FORWARDED;
		}
		int err = (!v6 && (type == 3 || type == 11 || type == 12)) || (v6 && type >= 1 && type <= 4);
		if (!err)
			return REASON_FORWARDED;
		p->icmp_error = 1;
		return parse_icmp_inner(skb, off + 8, p);
	}
	}
	return REASON_FORWARDED;
}

/* parse fills p from the packet; it returns REASON_FORWARDED, or a reason
 * to drop. ARP sets p->arp and passes as is.
 *
 * parse, check, ct_create and deliver_direct are global functions: the
 * verifier checks each once, on its own, instead of every path through
 * the header parser times every path through two endpoints' checks, which
 * exceeds its budget when everything is inlined. After a call the caller
 * knows nothing of what the callee wrote into struct pkt, which also keeps
 * the caller's states few. The calls cost a few ns. */
__attribute__((noinline)) int parse(struct __sk_buff *skb, struct pkt *p)
{
	if (!skb || !p)
		return REASON_MALFORMED;
	p->now = bpf_ktime_get_coarse_ns();
	p->len = skb->len;
	p->l3_end = skb->len;
	__u8 *eth = hdr(skb, p, 0, ETH_HLEN);
	if (!eth)
		return REASON_TRUNCATED;
	__be16 eth_proto = be16_at(&eth[12]);
	if (eth_proto == bpf_htons(ETH_P_ARP)) {
		p->arp = 1;
		return REASON_FORWARDED;
	}
	if (eth_proto == bpf_htons(ETH_P_IP)) {
		__u8 *h = hdr(skb, p, ETH_HLEN, 20);
		if (!h)
			return REASON_TRUNCATED;
		__u8 ihl = h[0] & 0xf;
		if ((h[0] >> 4) != 4 || ihl < 5)
			return REASON_MALFORMED;
		__u16 tot = ((__u16)h[2] << 8) | h[3];
		if (tot < (__u16)ihl * 4 || ETH_HLEN + (__u32)tot > skb->len)
			return REASON_TRUNCATED;
		p->family = FAMILY_V4;
		p->l3_end = ETH_HLEN + tot;
		p->proto = h[9];
		p->nonfirst_frag = ((((__u16)h[6] << 8) | h[7]) & 0x1fff) != 0;
		__builtin_memcpy(p->saddr, &h[12], 4);
		__builtin_memcpy(p->daddr, &h[16], 4);
		return parse_l4(skb, ETH_HLEN + (__u32)ihl * 4, p);
	}
	if (eth_proto == bpf_htons(ETH_P_IPV6)) {
		__u8 *h = hdr(skb, p, ETH_HLEN, 40);
		if (!h)
			return REASON_TRUNCATED;
		if ((h[0] >> 4) != 6)
			return REASON_MALFORMED;
		__u16 plen = ((__u16)h[4] << 8) | h[5];
		if (ETH_HLEN + 40 + (__u32)plen > skb->len)
			return REASON_TRUNCATED;
		p->family = FAMILY_V6;
		p->l3_end = ETH_HLEN + 40 + plen;
		__builtin_memcpy(p->saddr, &h[8], 16);
		__builtin_memcpy(p->daddr, &h[24], 16);
		__u8 next = h[6];
		__u32 off = ETH_HLEN + 40;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			if (off > MAX_HDR_OFFSET)
				return REASON_MALFORMED;
			if (next == 0 || next == 43 || next == 60) { /* hop-by-hop, routing, destination */
				__u8 *x = hdr(skb, p, off, 2);
				if (!x)
					return REASON_TRUNCATED;
				next = x[0];
				off += ((__u32)x[1] + 1) * 8;
			} else if (next == 44) { /* fragment */
				__u8 *x = hdr(skb, p, off, 4);
				if (!x)
					return REASON_TRUNCATED;
				next = x[0];
				p->nonfirst_frag = ((((__u16)x[2] << 8) | x[3]) & 0xfff8) != 0;
				off += 8;
			} else {
				break;
			}
		}
		/* Longer extension chains, or deeper headers, than we parse. */
		if (next == 0 || next == 43 || next == 60 || next == 44 || off > MAX_HDR_OFFSET)
			return REASON_MALFORMED;
		p->proto = next;
		return parse_l4(skb, off, p);
	}
	return REASON_UNKNOWN_L3;
}

static __always_inline const struct endpoint_info *endpoint_by_ifindex(__u32 ifindex)
{
	if (ifindex < EP_IFINDEX_SLOTS) {
		const struct endpoint_info *ep = bpf_map_lookup_elem(&tdr_ep_ifindex_v1, &ifindex);
		if (ep && ep->ep_id)
			return ep;
	}
	return bpf_map_lookup_elem(&tdr_endpoints_v2, &ifindex);
}

/* endpoint_by_id: the local endpoint a conntrack entry names, or NULL. */
static __always_inline const struct endpoint_info *endpoint_by_id(__u16 id)
{
	__u32 k = id;
	const struct endpoint_info *ep = bpf_map_lookup_elem(&tdr_ep_id_v1, &k);

	if (!ep || !id || ep->ep_id != id)
		return NULL;
	return ep;
}

/* barrier keeps clang from merging calls of two branches into one call
 * with the map chosen at run time: the verifier inlines a map lookup only
 * where the map is known, and calls the generic helper (an indirect call)
 * elsewhere. */
#define barrier() asm volatile("" ::: "memory")

/* endpoint_by_addr: addr points into struct pkt, on the stack, which is a
 * valid key as it is. */
static __always_inline const struct endpoint_info *endpoint_by_addr(__u8 family, const __u8 *addr)
{
	const struct endpoint_info *ep;

	if (family == FAMILY_V4) {
		ep = bpf_map_lookup_elem(&tdr_endpoint_ip4_v1, addr);
		barrier();
	} else {
		ep = bpf_map_lookup_elem(&tdr_endpoint_ip6_v1, addr);
	}
	return ep;
}

static __always_inline __u32 u32_at(const __u8 *b)
{
	__u32 v;
	__builtin_memcpy(&v, b, 4);
	return v;
}

/* is_endpoint_addr: addr is one of the endpoint's own addresses. */
static __always_inline int is_endpoint_addr(const struct endpoint_info *ep, __u8 family, const __u8 *addr)
{
	if (family == FAMILY_V4)
		return (ep->flags & EP_HAS_IPV4) && u32_at(ep->ipv4) == u32_at(addr);
	return (ep->flags & EP_HAS_IPV6) && u32_at(ep->ipv6) == u32_at(addr) && u32_at(ep->ipv6 + 4) == u32_at(addr + 4) &&
	       u32_at(ep->ipv6 + 8) == u32_at(addr + 8) && u32_at(ep->ipv6 + 12) == u32_at(addr + 12);
}

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

/* policy_lookup: 0 allowed, REASON_POLICY_DENIED (no rule allows),
 * REASON_POLICY_DENY_RULE (a deny rule matched). Deny wins over allow. The
 * endpoint's "any identity" trie is looked up only when it has one. */
static __always_inline int policy_lookup(__u16 ep_id, __u8 dir, __u32 identity, const struct pkt *p, __u32 *cookie)
{
	struct policy_key k = {};
	struct policy_entry *exact = NULL, *any = NULL;
	__u32 slot = policy_slot(ep_id, dir, 0);
	void *trie = bpf_map_lookup_elem(&tdr_policy_v2, &slot);

	k.prefixlen = POLICY_FULL_PREFIX;
	k.identity = identity;
	k.proto = p->proto;
	k.dport = p->pport;
	if (trie) {
		exact = bpf_map_lookup_elem(trie, &k);
		if (exact && exact->deny) {
			*cookie = exact->cookie;
			return REASON_POLICY_DENY_RULE;
		}
	}
	slot = policy_slot(ep_id, dir, 1);
	trie = bpf_map_lookup_elem(&tdr_policy_v2, &slot);
	if (trie) {
		k.identity = ID_ANY;
		any = bpf_map_lookup_elem(trie, &k);
		if (any && any->deny) {
			*cookie = any->cookie;
			return REASON_POLICY_DENY_RULE;
		}
	}
	if (exact) {
		*cookie = exact->cookie;
		return 0;
	}
	if (any) {
		*cookie = any->cookie;
		return 0;
	}
	return REASON_POLICY_DENIED;
}

/* flow is the conntrack key of a packet (of the packet an ICMP error
 * quotes, for errors) and the side of it the packet's source is. */
struct flow {
	union {
		struct ct4_key k4;
		struct ct6_key k6;
	};
	__u8 src_is_a;
};

/* lower4 and lower6 report whether (x, xp) orders strictly before (y, yp):
 * addresses, then ports, as big-endian numbers. */
static __always_inline int lower4(const __u8 *x, __be16 xp, const __u8 *y, __be16 yp)
{
	__u32 a = bpf_ntohl(u32_at(x)), b = bpf_ntohl(u32_at(y));

	if (a != b)
		return a < b;
	return bpf_ntohs(xp) < bpf_ntohs(yp);
}

static __always_inline int lower6(const __u8 *x, __be16 xp, const __u8 *y, __be16 yp)
{
#pragma unroll
	for (int i = 0; i < 16; i += 4) {
		__u32 a = bpf_ntohl(u32_at(x + i)), b = bpf_ntohl(u32_at(y + i));
		if (a != b)
			return a < b;
	}
	return bpf_ntohs(xp) < bpf_ntohs(yp);
}

/* flow_of builds the canonical key of the packet, or of the packet an ICMP
 * error quotes. */
static __always_inline void flow_of(struct flow *f, const struct pkt *p)
{
	const __u8 *s = p->saddr, *d = p->daddr;
	__be16 sp = p->sport, dp = p->dport;
	__u8 proto = p->proto;

	if (p->icmp_error) {
		s = p->in_saddr, d = p->in_daddr, sp = p->in_sport, dp = p->in_dport, proto = p->in_proto;
	}
	__builtin_memset(f, 0, sizeof(*f));
	if (p->family == FAMILY_V4) {
		f->src_is_a = !lower4(d, dp, s, sp);
		f->k4.proto = proto;
		if (f->src_is_a) {
			__builtin_memcpy(f->k4.addr_a, s, 4);
			__builtin_memcpy(f->k4.addr_b, d, 4);
			f->k4.port_a = sp, f->k4.port_b = dp;
		} else {
			__builtin_memcpy(f->k4.addr_a, d, 4);
			__builtin_memcpy(f->k4.addr_b, s, 4);
			f->k4.port_a = dp, f->k4.port_b = sp;
		}
	} else {
		f->src_is_a = !lower6(d, dp, s, sp);
		f->k6.proto = proto;
		if (f->src_is_a) {
			__builtin_memcpy(f->k6.addr_a, s, 16);
			__builtin_memcpy(f->k6.addr_b, d, 16);
			f->k6.port_a = sp, f->k6.port_b = dp;
		} else {
			__builtin_memcpy(f->k6.addr_a, d, 16);
			__builtin_memcpy(f->k6.addr_b, s, 16);
			f->k6.port_a = dp, f->k6.port_b = sp;
		}
	}
}

/* ep_is_a reports whether the endpoint that sees the packet in direction
 * dir owns side a of the flow: a pod sends (egress) from its own address
 * and receives (ingress) at it; an ICMP error is about a packet going the
 * other way. */
static __always_inline __u8 ep_is_a(const struct flow *f, __u8 dir, const struct pkt *p)
{
	return ((dir == DIR_EGRESS) ^ p->icmp_error) ? f->src_is_a : !f->src_is_a;
}

/* ct_find returns the flow's live entry, or NULL when there is none, it
 * expired, or a fresh SYN reuses the tuple of a closing TCP flow (a new
 * connection, which goes through policy again). */
static __always_inline struct ct_entry *ct_find(const struct flow *f, const struct pkt *p)
{
	struct ct_entry *e;

	if (p->family == FAMILY_V4) {
		e = bpf_map_lookup_elem(&tdr_ct4_v1, &f->k4);
		barrier();
	} else {
		e = bpf_map_lookup_elem(&tdr_ct6_v1, &f->k6);
	}
	if (!e || e->expires <= p->now)
		return NULL;
	if (!p->icmp_error && p->proto == IPPROTO_TCP_ && (e->flags & CT_F_CLOSING) &&
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return NULL;
	return e;
}

/* ct_classify is the flow as endpoint ep_id (owning side a when is_a)
 * sees the packet: CT_NEW unless the endpoint admitted the flow, then
 * CT_RELATED for an ICMP error, CT_ESTABLISHED for the direction of the
 * flow's first packet, CT_REPLY for the other. */
static __always_inline int ct_classify(const struct ct_entry *e, const struct flow *f, const struct pkt *p, __u16 ep_id,
				       __u8 is_a)
{
	if (!e || (is_a ? e->ep_a : e->ep_b) != ep_id)
		return CT_NEW;
	if (p->icmp_error)
		return CT_RELATED;
	return f->src_is_a == !!(e->flags & CT_F_A_STARTED) ? CT_ESTABLISHED : CT_REPLY;
}

static __always_inline __u64 ct_lifetime(const struct pkt *p, __u8 flags)
{
	if (p->proto != IPPROTO_TCP_)
		return CT_LIFETIME_NONTCP;
	if (flags & CT_F_CLOSING)
		return CT_LIFETIME_TCP_CLOSE;
	if (!(flags & CT_F_SEEN_REPLY))
		return CT_LIFETIME_TCP_SYN;
	return CT_LIFETIME_TCP;
}

/* ct_admit names endpoint ep_id on its side of an existing entry. */
static __always_inline void ct_admit(struct ct_entry *e, __u8 is_a, __u16 ep_id)
{
	if (is_a)
		e->ep_a = ep_id;
	else
		e->ep_b = ep_id;
}

/* ct_update keeps an existing entry's state and deadline with a packet
 * that passed. */
static __always_inline void ct_update(struct ct_entry *e, const struct flow *f, const struct pkt *p)
{
	__u8 flags = e->flags;

	if (p->proto == IPPROTO_TCP_) {
		__u8 tf = p->tcp_flags;
		if (tf & (TCP_FLAG_FIN | TCP_FLAG_RST))
			flags |= CT_F_CLOSING;
		if ((e->tcp_flags | tf) != e->tcp_flags)
			e->tcp_flags |= tf;
	}
	if (f->src_is_a != !!(flags & CT_F_A_STARTED))
		flags |= CT_F_SEEN_REPLY;
	__u64 deadline = p->now + ct_lifetime(p, flags);
	if (flags != e->flags) {
		e->flags = flags;
		e->expires = deadline;
	} else if (deadline > e->expires + CT_REFRESH_INTERVAL) {
		/* A busy flow rewrites its deadline at most this often: a
		 * write per packet would bounce the entry's cache line
		 * between CPUs. */
		e->expires = deadline;
	}
}

/* ct_create makes the entry of a new flow, naming the local endpoints
 * that admitted it on sides a and b.
 *
 * parse, policy, ct_create and deliver_direct are global functions: the
 * verifier checks each once, on its own, instead of every path through
 * them times every path of the program, which exceeds its budget when
 * everything is inlined. After a call the caller knows nothing of what
 * the callee wrote into its stack, which also keeps the caller's states
 * few. None of them runs on the path of an established packet but
 * deliver_direct. */
__attribute__((noinline)) int ct_create(const struct flow *f, const struct pkt *p, __u32 ep_a, __u32 ep_b,
					__u32 not_local)
{
	struct ct_entry e = {};

	if (!f || !p)
		return 0;
	e.ep_a = ep_a;
	e.ep_b = ep_b;
	e.tcp_flags = p->tcp_flags;
	e.flags = not_local & (CT_F_A_NOT_LOCAL | CT_F_B_NOT_LOCAL);
	if (f->src_is_a)
		e.flags |= CT_F_A_STARTED;
	if (p->proto == IPPROTO_TCP_ && (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
		e.flags |= CT_F_CLOSING;
	e.expires = p->now + ct_lifetime(p, e.flags);
	if (p->family == FAMILY_V4)
		return bpf_map_update_elem(&tdr_ct4_v1, &f->k4, &e, BPF_ANY);
	return bpf_map_update_elem(&tdr_ct6_v1, &f->k6, &e, BPF_ANY);
}

static __always_inline __u8 enforced(const struct endpoint_info *ep, __u8 dir)
{
	return dir == DIR_INGRESS ? (ep->flags & EP_ENFORCE_INGRESS) : (ep->flags & EP_ENFORCE_EGRESS);
}

/* policy decides a new flow for endpoint ep, which enforces direction dir:
 * 0 to pass, -1 when denied (counted and reported). peer_id is the
 * identity of the other side, or 0 to look it up in the ipcache. */
__attribute__((noinline)) int policy(const struct endpoint_info *ep, __u32 dir, const struct pkt *p, __u32 peer_id)
{
	if (!ep || !p)
		return -1;
	__u16 ep_id = ep->ep_id;
	if (!peer_id)
		peer_id = identity_of(p->family, dir == DIR_INGRESS ? p->saddr : p->daddr);
	__u32 src_id = dir == DIR_INGRESS ? peer_id : ep->identity;
	__u32 dst_id = dir == DIR_INGRESS ? ep->identity : peer_id;
	__u32 cookie = 0;
	int reason = policy_lookup(ep_id, dir, peer_id, p, &cookie);
	if (reason) {
		drop(reason, dir, ep_id, p, src_id, dst_id, cookie);
		return -1;
	}
	if (POLICY_VERDICT_EVENTS)
		emit(EVENT_POLICY_VERDICT, REASON_FORWARDED, dir, ep_id, p, src_id, dst_id, 1, cookie);
	return 0;
}

/* admit is one endpoint's verdict on a packet given its conntrack view ct:
 * a new flow goes through policy where the endpoint enforces the
 * direction. Fragments after the first carry no ports: without reassembly
 * state they cannot be matched, so they pass only where no policy is
 * enforced. It returns 0 to pass (counted), -1 when dropped (counted and
 * reported). */
static __always_inline int admit(const struct endpoint_info *ep, __u8 dir, const struct pkt *p, int ct, __u32 peer_id)
{
	if (p->nonfirst_frag) {
		if (enforced(ep, dir)) {
			drop(REASON_FRAGMENT, dir, ep->ep_id, p, 0, 0, 0);
			return -1;
		}
		count(REASON_FORWARDED, dir, p->len);
		return 0;
	}
	if (ct == CT_NEW) {
		if (enforced(ep, dir) && policy(ep, dir, p, peer_id))
			return -1;
		count(REASON_FORWARDED, dir, p->len);
		return 0;
	}
	count(ct, dir, p->len); /* CT_x equals REASON_CT_x */
	return 0;
}

/* deliver_direct rewrites the frame as the host would route it (MACs of
 * the destination's veth pair, TTL / hop limit down by one) and redirects
 * it into the destination pod's namespace. It returns -1 when the host
 * must handle the packet instead (TTL expiring: the host sends the ICMP
 * error). */
__attribute__((noinline)) int deliver_direct(struct __sk_buff *skb, const struct pkt *p, const struct endpoint_info *dst)
{
	if (!skb || !p || !dst)
		return -1;
	__u8 *eth;
	if (p->family == FAMILY_V4) {
		eth = hdr(skb, p, 0, ETH_HLEN + 20);
		if (!eth)
			return -1;
		__u8 *ip = eth + ETH_HLEN;
		if (ip[8] <= 1)
			return -1;
		ip[8]--;
		/* Incremental checksum for the TTL byte (RFC 1624), as the
		 * kernel's ip_decrease_ttl does. */
		__u16 *csum = (__u16 *)(ip + 10);
		__u32 c = *csum;
		c += bpf_htons(0x0100);
		*csum = (__u16)(c + (c >= 0xFFFF));
	} else {
		eth = hdr(skb, p, 0, ETH_HLEN + 40);
		if (!eth)
			return -1;
		__u8 *ip = eth + ETH_HLEN;
		if (ip[7] <= 1)
			return -1;
		ip[7]--;
	}
	__builtin_memcpy(eth, dst->mac, ETH_ALEN);
	__builtin_memcpy(eth + ETH_ALEN, dst->host_mac, ETH_ALEN);
	count(REASON_DELIVERED_DIRECT, DIR_INGRESS, p->len);
	return bpf_redirect_peer(dst->ifindex, 0);
}

SEC("tcx/ingress")
int from_pod(struct __sk_buff *skb)
{
	struct pkt p = {};
	const struct endpoint_info *ep = endpoint_by_ifindex(skb->ifindex);
	__u16 ep_id = ep ? ep->ep_id : 0;
	int reason = parse(skb, &p);

	if (reason)
		return drop(reason, DIR_EGRESS, ep_id, &p, 0, 0, 0);
	/* ARP, neighbor discovery and MLD are link-scoped (their sources
	 * include :: during duplicate address detection) and carry no
	 * policy. */
	if (p.arp || p.ndp)
		return TC_ACT_OK;
	if (!ep)
		return drop(REASON_UNKNOWN_INTERFACE, DIR_EGRESS, 0, &p, 0, 0, 0);
	if (!is_endpoint_addr(ep, p.family, p.saddr))
		return drop(REASON_INVALID_SOURCE, DIR_EGRESS, ep_id, &p, ep->identity, 0, 0);

	struct flow f;
	flow_of(&f, &p);
	struct ct_entry *e = p.nonfirst_frag ? NULL : ct_find(&f, &p);
	__u8 src_a = ep_is_a(&f, DIR_EGRESS, &p);
	/* The local destination, if any: for a known flow the entry names it
	 * (an array lookup) or says there is none; otherwise, or when the
	 * named endpoint no longer holds the address, look the address up. */
	const struct endpoint_info *dst = NULL;
	int looked_up = 0;
	if (e) {
		__u16 other = src_a ? e->ep_b : e->ep_a;
		if (other) {
			dst = endpoint_by_id(other);
			if (dst && !is_endpoint_addr(dst, p.family, p.daddr))
				dst = NULL;
		}
		looked_up = dst || (e->flags & (src_a ? CT_F_B_NOT_LOCAL : CT_F_A_NOT_LOCAL));
	}
	if (!looked_up)
		dst = endpoint_by_addr(p.family, p.daddr);
	/* A local destination that takes direct delivery gets the packet
	 * from here, its ingress checked here; otherwise the host routes the
	 * packet and the destination's to_pod checks it. */
	int direct = dst && (dst->flags & EP_DELIVER_DIRECT) && dst->ifindex != ep->ifindex;
	int ct_out = ct_classify(e, &f, &p, ep_id, src_a);
	if (admit(ep, DIR_EGRESS, &p, ct_out, dst ? dst->identity : 0))
		return TC_ACT_SHOT;
	int ct_in = CT_ESTABLISHED;
	if (direct) {
		ct_in = ct_classify(e, &f, &p, dst->ep_id, !src_a);
		if (admit(dst, DIR_INGRESS, &p, ct_in, ep->identity))
			return TC_ACT_SHOT;
	}
	/* The flow's entry changes only once every check passed. ICMP errors
	 * and fragments are not flows of their own. */
	if (!p.icmp_error && !p.nonfirst_frag) {
		if (!e) {
			__u16 other = direct ? dst->ep_id : 0;
			__u8 remote = dst ? 0 : (src_a ? CT_F_B_NOT_LOCAL : CT_F_A_NOT_LOCAL);
			ct_create(&f, &p, src_a ? ep_id : other, src_a ? other : ep_id, remote);
		} else {
			if (ct_out == CT_NEW)
				ct_admit(e, src_a, ep_id);
			if (direct && ct_in == CT_NEW)
				ct_admit(e, !src_a, dst->ep_id);
			ct_update(e, &f, &p);
		}
	}
	if (direct) {
		int ret = deliver_direct(skb, &p, dst);
		if (ret >= 0)
			return ret;
	}
	return TC_ACT_OK;
}

SEC("tcx/egress")
int to_pod(struct __sk_buff *skb)
{
	struct pkt p = {};
	const struct endpoint_info *ep = endpoint_by_ifindex(skb->ifindex);
	__u16 ep_id = ep ? ep->ep_id : 0;
	int reason = parse(skb, &p);

	if (reason)
		return drop(reason, DIR_INGRESS, ep_id, &p, 0, 0, 0);
	if (p.arp || p.ndp)
		return TC_ACT_OK;
	if (!ep)
		return drop(REASON_UNKNOWN_INTERFACE, DIR_INGRESS, 0, &p, 0, 0, 0);
	if (!is_endpoint_addr(ep, p.family, p.daddr))
		return drop(REASON_NO_ENDPOINT, DIR_INGRESS, ep_id, &p, 0, ep->identity, 0);

	struct flow f;
	flow_of(&f, &p);
	struct ct_entry *e = p.nonfirst_frag ? NULL : ct_find(&f, &p);
	__u8 is_a = ep_is_a(&f, DIR_INGRESS, &p);
	int ct = ct_classify(e, &f, &p, ep_id, is_a);
	if (admit(ep, DIR_INGRESS, &p, ct, 0))
		return TC_ACT_SHOT;
	if (!p.icmp_error && !p.nonfirst_frag) {
		if (!e) {
			ct_create(&f, &p, is_a ? ep_id : 0, is_a ? 0 : ep_id, 0);
		} else {
			if (ct == CT_NEW)
				ct_admit(e, is_a, ep_id);
			ct_update(e, &f, &p);
		}
	}
	return TC_ACT_OK;
}
