// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Tendril's per-endpoint datapath, attached with TCX on the host side of
 * each pod's veth: from_pod on tcx ingress (packets the pod sends), to_pod
 * on tcx egress (packets delivered to the pod). One object is loaded per
 * node; per-endpoint facts live in maps, so no compile happens at run time.
 *
 * Path: parse (truncated/malformed → drop) → conntrack (established,
 * replies and related ICMP errors pass) → policy by peer identity from the
 * ipcache (deny wins) → create conntrack → hand to the stack. */
#include "lib/common.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define MAX_ENDPOINTS 4096

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct endpoint_key);
	__type(value, struct endpoint_info);
	__uint(max_entries, MAX_ENDPOINTS * 2);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_endpoints_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_info);
	__uint(max_entries, 512000);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_ipcache_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct policy_key);
	__type(value, struct policy_entry);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_policy_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_ct_v1 SEC(".maps");

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
} tdr_ratelimit_v1 SEC(".maps");

/* Keeps struct event in BTF so bpf2go generates its Go type. */
const struct event *unused_event_type __attribute__((unused));

/* Events per CPU per second; beyond it events are dropped (counters are
 * not), so a flood cannot starve user space. */
volatile const __u32 EVENTS_PER_SEC = 1000;
/* Policy verdict events for allowed new flows cost a ring buffer write per
 * connection; the loader turns them on when asked (drops always report). */
volatile const __u8 POLICY_VERDICT_EVENTS = 0;

#define NSEC_PER_SEC 1000000000ULL
#define CT_LIFETIME_TCP_SYN (60ULL * NSEC_PER_SEC)
#define CT_LIFETIME_TCP (21600ULL * NSEC_PER_SEC)
#define CT_LIFETIME_TCP_CLOSE (10ULL * NSEC_PER_SEC)
#define CT_LIFETIME_NONTCP (60ULL * NSEC_PER_SEC)

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

#define IPPROTO_ICMP_ 1
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define IPPROTO_ICMPV6_ 58
#define IPPROTO_SCTP_ 132

/* The parsed facts of one packet. */
struct pkt {
	__u8 family;
	__u8 proto;
	__u8 tcp_flags;
	__u8 nonfirst_frag;
	__u8 icmp_type;
	__u8 icmp_error; /* carries an inner header of another flow */
	__u8 icmp_reply; /* echo reply: its flow is the request's reverse */
	__u8 ndp;        /* neighbor discovery / MLD: always passes */
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	/* The port policy sees: the destination port, or the ICMP type. */
	__be16 pport;
	/* Inner tuple of an ICMP error (as the original packet had it). */
	__u8 in_saddr[16];
	__u8 in_daddr[16];
	__be16 in_sport;
	__be16 in_dport;
	__u8 in_proto;
	__u32 len;
	/* End of the IP packet: Ethernet padding after it is not header. */
	__u32 l3_end;
};

/* load reads n bytes at off, refusing bytes past the IP packet's end. */
#define LOAD(skb, p, off, buf)                                                  \
	(((off) + sizeof(buf) > (p)->l3_end) ? -1 : bpf_skb_load_bytes(skb, off, buf, sizeof(buf)))

static __always_inline void count(__u8 reason, __u8 dir, __u32 len)
{
	__u32 k = ((__u32)reason << 1) | (dir & 1);
	struct metric_value *v = bpf_map_lookup_elem(&tdr_metrics_v2, &k);

	if (v) {
		v->packets++;
		v->bytes += len;
	}
}

static __always_inline int event_allowed(void)
{
	__u32 zero = 0;
	struct ratelimit *rl = bpf_map_lookup_elem(&tdr_ratelimit_v1, &zero);
	__u64 now = bpf_ktime_get_ns();

	if (!rl)
		return 0;
	if (now - rl->window_start >= NSEC_PER_SEC) {
		rl->window_start = now;
		rl->tokens = EVENTS_PER_SEC;
	}
	if (rl->tokens == 0)
		return 0;
	rl->tokens--;
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
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int drop(__u8 reason, __u8 dir, __u16 ep_id, const struct pkt *p, __u32 src_id, __u32 dst_id)
{
	count(reason, dir, p->len);
	emit(EVENT_DROP, reason, dir, ep_id, p, src_id, dst_id, 0, 0);
	return TC_ACT_SHOT;
}

/* parse_l4 reads ports (or ICMP type/id) at off. Returns a reason on error,
 * REASON_FORWARDED when fine. */
static __always_inline int parse_l4(struct __sk_buff *skb, __u32 off, struct pkt *p)
{
	if (p->nonfirst_frag)
		return REASON_FORWARDED;
	switch (p->proto) {
	case IPPROTO_TCP_: {
		__u8 h[14];
		if (LOAD(skb, p, off, h))
			return REASON_TRUNCATED;
		__builtin_memcpy(&p->sport, &h[0], 2);
		__builtin_memcpy(&p->dport, &h[2], 2);
		p->tcp_flags = h[13];
		p->pport = p->dport;
		if ((h[12] >> 4) < 5)
			return REASON_MALFORMED;
		return REASON_FORWARDED;
	}
	case IPPROTO_UDP_:
	case IPPROTO_SCTP_: {
		__u8 h[8];
		if (LOAD(skb, p, off, h))
			return REASON_TRUNCATED;
		__builtin_memcpy(&p->sport, &h[0], 2);
		__builtin_memcpy(&p->dport, &h[2], 2);
		p->pport = p->dport;
		return REASON_FORWARDED;
	}
	case IPPROTO_ICMP_:
	case IPPROTO_ICMPV6_: {
		__u8 h[8];
		if (LOAD(skb, p, off, h))
			return REASON_TRUNCATED;
		__u8 type = h[0];
		p->icmp_type = type;
		/* Policy sees the ICMP type as the port, as Cilium does. */
		p->pport = bpf_htons(type);
		p->dport = p->pport;
		__be16 id;
		__builtin_memcpy(&id, &h[4], 2);
		int v6 = p->proto == IPPROTO_ICMPV6_;
		if ((!v6 && type == 8) || (v6 && type == 128)) { /* echo request */
			p->sport = id;
			p->dport = 0;
			return REASON_FORWARDED;
		}
		if ((!v6 && type == 0) || (v6 && type == 129)) { /* echo reply */
			p->icmp_reply = 1;
			p->sport = 0;
			p->dport = id;
			return REASON_FORWARDED;
		}
		if (v6 && ((type >= 130 && type <= 137) || type == 143)) {
			p->ndp = 1;
			return REASON_FORWARDED;
		}
		int err = (!v6 && (type == 3 || type == 11 || type == 12)) || (v6 && type >= 1 && type <= 4);
		if (!err)
			return REASON_FORWARDED;
		p->icmp_error = 1;
		__u32 in = off + 8;
		if (!v6) {
			__u8 ih[20];
			if (LOAD(skb, p, in, ih))
				return REASON_TRUNCATED;
			__u8 ihl = ih[0] & 0xf;
			if ((ih[0] >> 4) != 4 || ihl < 5)
				return REASON_MALFORMED;
			p->in_proto = ih[9];
			__builtin_memset(p->in_saddr, 0, 16);
			__builtin_memset(p->in_daddr, 0, 16);
			__builtin_memcpy(p->in_saddr, &ih[12], 4);
			__builtin_memcpy(p->in_daddr, &ih[16], 4);
			in += ihl * 4;
		} else {
			__u8 ih[40];
			if (LOAD(skb, p, in, ih))
				return REASON_TRUNCATED;
			if ((ih[0] >> 4) != 6)
				return REASON_MALFORMED;
			p->in_proto = ih[6];
			__builtin_memcpy(p->in_saddr, &ih[8], 16);
			__builtin_memcpy(p->in_daddr, &ih[24], 16);
			in += 40;
		}
		__u8 ports[4];
		if (LOAD(skb, p, in, ports))
			return REASON_TRUNCATED;
		if (p->in_proto == IPPROTO_ICMP_ || p->in_proto == IPPROTO_ICMPV6_) {
			/* An error about an echo request: its tuple is (id, 0). */
			__u8 ic[8];
			if (LOAD(skb, p, in, ic))
				return REASON_TRUNCATED;
			__builtin_memcpy(&p->in_sport, &ic[4], 2);
			p->in_dport = 0;
		} else {
			__builtin_memcpy(&p->in_sport, &ports[0], 2);
			__builtin_memcpy(&p->in_dport, &ports[2], 2);
		}
		return REASON_FORWARDED;
	}
	}
	return REASON_FORWARDED;
}

/* parse fills p from the packet; it returns REASON_FORWARDED, or a reason
 * to drop. *pass is set for packets that are not IP (ARP) and pass as is. */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p, int *pass)
{
	__be16 eth_proto;

	p->len = skb->len;
	if (bpf_skb_load_bytes(skb, 12, &eth_proto, sizeof(eth_proto)))
		return REASON_TRUNCATED;
	if (eth_proto == bpf_htons(ETH_P_ARP)) {
		*pass = 1;
		return REASON_FORWARDED;
	}
	if (eth_proto == bpf_htons(ETH_P_IP)) {
		__u8 h[20];
		if (bpf_skb_load_bytes(skb, ETH_HLEN, h, sizeof(h)))
			return REASON_TRUNCATED;
		__u8 ihl = h[0] & 0xf;
		if ((h[0] >> 4) != 4 || ihl < 5)
			return REASON_MALFORMED;
		__u16 tot = ((__u16)h[2] << 8) | h[3];
		if (tot < ihl * 4 || ETH_HLEN + tot > skb->len)
			return REASON_TRUNCATED;
		p->family = FAMILY_V4;
		p->l3_end = ETH_HLEN + tot;
		p->proto = h[9];
		__u16 frag = (((__u16)h[6] << 8) | h[7]) & 0x1fff;
		p->nonfirst_frag = frag != 0;
		__builtin_memcpy(p->saddr, &h[12], 4);
		__builtin_memcpy(p->daddr, &h[16], 4);
		return parse_l4(skb, ETH_HLEN + ihl * 4, p);
	}
	if (eth_proto == bpf_htons(ETH_P_IPV6)) {
		__u8 h[40];
		if (bpf_skb_load_bytes(skb, ETH_HLEN, h, sizeof(h)))
			return REASON_TRUNCATED;
		if ((h[0] >> 4) != 6)
			return REASON_MALFORMED;
		__u16 plen = ((__u16)h[4] << 8) | h[5];
		if (ETH_HLEN + 40 + plen > skb->len)
			return REASON_TRUNCATED;
		p->family = FAMILY_V6;
		p->l3_end = ETH_HLEN + 40 + plen;
		__builtin_memcpy(p->saddr, &h[8], 16);
		__builtin_memcpy(p->daddr, &h[24], 16);
		__u8 next = h[6];
		__u32 off = ETH_HLEN + 40;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			if (next == 0 || next == 43 || next == 60) { /* hop-by-hop, routing, destination */
				__u8 x[2];
				if (LOAD(skb, p, off, x))
					return REASON_TRUNCATED;
				next = x[0];
				off += ((__u32)x[1] + 1) * 8;
			} else if (next == 44) { /* fragment */
				__u8 x[4];
				if (LOAD(skb, p, off, x))
					return REASON_TRUNCATED;
				next = x[0];
				p->nonfirst_frag = ((((__u16)x[2] << 8) | x[3]) & 0xfff8) != 0;
				off += 8;
			} else {
				break;
			}
		}
		if (next == 0 || next == 43 || next == 60 || next == 44)
			return REASON_MALFORMED; /* longer extension chains than we parse */
		p->proto = next;
		return parse_l4(skb, off, p);
	}
	return REASON_UNKNOWN_L3;
}

static __always_inline void endpoint_key_of(struct endpoint_key *k, __u8 family, const __u8 *addr)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->family = family;
	if (family == FAMILY_V4)
		__builtin_memcpy(k->addr, addr, 4);
	else
		__builtin_memcpy(k->addr, addr, 16);
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
	struct ipcache_info *info = bpf_map_lookup_elem(&tdr_ipcache_v1, &k);
	if (!info)
		return ID_WORLD;
	return info->identity;
}

/* policy_lookup: 0 allowed, REASON_POLICY_DENIED (no rule allows),
 * REASON_POLICY_DENY_RULE (a deny rule matched). Deny wins over allow. */
static __always_inline int policy_lookup(__u16 ep_id, __u8 dir, __u32 identity, const struct pkt *p, __u32 *cookie)
{
	struct policy_key k = {};
	k.prefixlen = POLICY_FULL_PREFIX;
	k.ep_id = ep_id;
	k.dir = dir;
	k.identity = identity;
	k.proto = p->proto;
	k.dport = p->pport;
	struct policy_entry *exact = bpf_map_lookup_elem(&tdr_policy_v1, &k);
	k.identity = ID_ANY;
	struct policy_entry *any = bpf_map_lookup_elem(&tdr_policy_v1, &k);
	if ((exact && exact->deny) || (any && any->deny)) {
		*cookie = (exact && exact->deny) ? exact->cookie : (any ? any->cookie : 0);
		return REASON_POLICY_DENY_RULE;
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

static __always_inline void ct_key_of(struct ct_key *k, __u16 ep_id, __u8 dir, __u8 family, __u8 proto,
				      const __u8 *s, const __u8 *d, __be16 sport, __be16 dport)
{
	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(k->saddr, s, 16);
	__builtin_memcpy(k->daddr, d, 16);
	k->sport = sport;
	k->dport = dport;
	k->proto = proto;
	k->family = family;
	k->dir = dir;
	k->ep_id = ep_id;
}

static __always_inline __u64 ct_lifetime(const struct pkt *p, struct ct_entry *e)
{
	if (p->proto != IPPROTO_TCP_)
		return CT_LIFETIME_NONTCP;
	if (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) {
		if (e)
			e->closing = 1;
		return CT_LIFETIME_TCP_CLOSE;
	}
	if (e && e->closing)
		return CT_LIFETIME_TCP_CLOSE;
	if (!e || !e->seen_reply)
		return CT_LIFETIME_TCP_SYN;
	return CT_LIFETIME_TCP;
}

/* ct_lookup: 1 for an established flow, 2 for a reply, 3 for a related
 * ICMP error, 0 for a new flow. */
static __always_inline int ct_lookup(__u16 ep_id, __u8 dir, const struct pkt *p)
{
	__u8 other = dir == DIR_INGRESS ? DIR_EGRESS : DIR_INGRESS;
	struct ct_key k;
	__u64 now = bpf_ktime_get_ns();

	if (p->icmp_error) {
		/* The inner header is a packet this side's peer sent us earlier:
		 * related when the flow it belongs to exists in the other
		 * direction's table. */
		ct_key_of(&k, ep_id, other, p->family, p->in_proto, p->in_daddr, p->in_saddr, p->in_dport, p->in_sport);
		struct ct_entry *e = bpf_map_lookup_elem(&tdr_ct_v1, &k);
		if (!e) {
			/* The original packet came from this endpoint (it is what
			 * the error is about). */
			ct_key_of(&k, ep_id, other, p->family, p->in_proto, p->in_saddr, p->in_daddr, p->in_sport, p->in_dport);
			e = bpf_map_lookup_elem(&tdr_ct_v1, &k);
		}
		if (e && e->expires > now)
			return 3;
		return 0;
	}
	/* One lookup of the packet's own tuple finds both the flow it started
	 * and, through the reply entry made with the flow, the flow it answers. */
	ct_key_of(&k, ep_id, dir, p->family, p->proto, p->saddr, p->daddr, p->sport, p->dport);
	struct ct_entry *e = bpf_map_lookup_elem(&tdr_ct_v1, &k);
	if (e && e->expires > now) {
		e->packets++;
		e->bytes += p->len;
		if (!e->is_reply) {
			e->expires = now + ct_lifetime(p, e);
			return 1;
		}
		if (!e->seen_reply) {
			/* First reply: tell the flow's own entry, once. */
			ct_key_of(&k, ep_id, other, p->family, p->proto, p->daddr, p->saddr, p->dport, p->sport);
			struct ct_entry *fwd = bpf_map_lookup_elem(&tdr_ct_v1, &k);
			if (fwd)
				fwd->seen_reply = 1;
			e->seen_reply = 1;
		}
		e->expires = now + ct_lifetime(p, e);
		return 2;
	}
	/* Flows created before reply entries existed, and echo replies whose
	 * request made no reply entry, are found the long way. */
	ct_key_of(&k, ep_id, other, p->family, p->proto, p->daddr, p->saddr, p->dport, p->sport);
	e = bpf_map_lookup_elem(&tdr_ct_v1, &k);
	if (e && e->expires > now && !e->is_reply) {
		e->seen_reply = 1;
		e->expires = now + ct_lifetime(p, e);
		return 2;
	}
	return 0;
}

static __always_inline void ct_create(__u16 ep_id, __u8 dir, const struct pkt *p)
{
	struct ct_key k;
	struct ct_entry e = {};

	ct_key_of(&k, ep_id, dir, p->family, p->proto, p->saddr, p->daddr, p->sport, p->dport);
	e.expires = bpf_ktime_get_ns() + ct_lifetime(p, 0);
	e.packets = 1;
	e.bytes = p->len;
	bpf_map_update_elem(&tdr_ct_v1, &k, &e, BPF_ANY);
	/* The reply direction's entry: the answer's own tuple. */
	__u8 other = dir == DIR_INGRESS ? DIR_EGRESS : DIR_INGRESS;
	ct_key_of(&k, ep_id, other, p->family, p->proto, p->daddr, p->saddr, p->dport, p->sport);
	e.packets = 0;
	e.bytes = 0;
	e.is_reply = 1;
	bpf_map_update_elem(&tdr_ct_v1, &k, &e, BPF_ANY);
}

/* handle runs the shared path; ep is the local endpoint the veth belongs
 * to, dir the direction seen from it, peer the other side's address. */
static __always_inline int handle(struct pkt *p, const struct endpoint_info *ep, __u8 dir)
{
	if (p->ndp)
		goto pass;
	if (p->nonfirst_frag) {
		/* Fragments after the first carry no ports: without reassembly
		 * state they cannot be matched, so they pass only where no
		 * policy is enforced in this direction. */
		__u8 enforce = dir == DIR_INGRESS ? (ep->flags & EP_ENFORCE_INGRESS) : (ep->flags & EP_ENFORCE_EGRESS);
		if (enforce)
			return drop(REASON_FRAGMENT, dir, ep->ep_id, p, 0, 0);
		goto pass;
	}
	int ct = ct_lookup(ep->ep_id, dir, p);
	if (ct) {
		count(ct == 1 ? REASON_CT_ESTABLISHED : (ct == 2 ? REASON_CT_REPLY : REASON_CT_RELATED), dir, p->len);
		return TC_ACT_OK;
	}
	__u32 peer_id = dir == DIR_INGRESS ? identity_of(p->family, p->saddr) : identity_of(p->family, p->daddr);
	__u32 src_id = dir == DIR_INGRESS ? peer_id : ep->identity;
	__u32 dst_id = dir == DIR_INGRESS ? ep->identity : peer_id;
	__u8 enforce = dir == DIR_INGRESS ? (ep->flags & EP_ENFORCE_INGRESS) : (ep->flags & EP_ENFORCE_EGRESS);
	if (enforce) {
		__u32 cookie = 0;
		int verdict = policy_lookup(ep->ep_id, dir, peer_id, p, &cookie);
		if (verdict) {
			count(verdict, dir, p->len);
			emit(EVENT_DROP, verdict, dir, ep->ep_id, p, src_id, dst_id, 0, cookie);
			return TC_ACT_SHOT;
		}
		if (POLICY_VERDICT_EVENTS)
			emit(EVENT_POLICY_VERDICT, REASON_FORWARDED, dir, ep->ep_id, p, src_id, dst_id, 1, cookie);
	}
	/* ICMP errors are not flows of their own. */
	if (!p->icmp_error)
		ct_create(ep->ep_id, dir, p);
pass:
	count(REASON_FORWARDED, dir, p->len);
	return TC_ACT_OK;
}

SEC("tcx/ingress")
int from_pod(struct __sk_buff *skb)
{
	struct pkt p = {};
	int pass = 0;
	int reason = parse(skb, &p, &pass);

	if (reason)
		return drop(reason, DIR_EGRESS, 0, &p, 0, 0);
	/* Neighbor discovery and MLD are link-scoped (their sources include ::
	 * during duplicate address detection) and carry no policy. */
	if (pass || p.ndp)
		return TC_ACT_OK;

	struct endpoint_key k;
	endpoint_key_of(&k, p.family, p.saddr);
	struct endpoint_info *ep = bpf_map_lookup_elem(&tdr_endpoints_v1, &k);
	if (!ep || ep->ifindex != skb->ifindex)
		return drop(REASON_INVALID_SOURCE, DIR_EGRESS, ep ? ep->ep_id : 0, &p, 0, 0);
	return handle(&p, ep, DIR_EGRESS);
}

SEC("tcx/egress")
int to_pod(struct __sk_buff *skb)
{
	struct pkt p = {};
	int pass = 0;
	int reason = parse(skb, &p, &pass);

	if (reason)
		return drop(reason, DIR_INGRESS, 0, &p, 0, 0);
	if (pass)
		return TC_ACT_OK;
	if (p.ndp)
		return TC_ACT_OK;

	struct endpoint_key k;
	endpoint_key_of(&k, p.family, p.daddr);
	struct endpoint_info *ep = bpf_map_lookup_elem(&tdr_endpoints_v1, &k);
	if (!ep || ep->ifindex != skb->ifindex)
		return drop(REASON_NO_ENDPOINT, DIR_INGRESS, ep ? ep->ep_id : 0, &p, 0, 0);
	return handle(&p, ep, DIR_INGRESS);
}
