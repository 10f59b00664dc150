/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: what user space sees of the packets: the per-reason
 * counters (tdr_metrics_v2), the ring buffer events (tdr_events_v1) under
 * a per-CPU rate limit (tdr_ratelimit_v2) with the events lost counted
 * (tdr_events_lost_v1), drop reporting, and trace events of forwarded
 * packets, aggregated per connection. */
#ifndef TDR_EVENTS_H
#define TDR_EVENTS_H

#include "maps.h"
#include "pkt.h"
#include "ipcache.h"
#include "conntrack.h"

/* Events per CPU per second, and the burst a CPU may send at once; beyond
 * them events are dropped (counters are not), so a flood cannot starve
 * user space or the ring buffer. */
volatile const __u32 EVENTS_PER_SEC = 1000;
volatile const __u32 EVENTS_BURST = 1000;
/* Trace events of forwarded packets: off (0), or on (1). On, a flow is
 * reported per connection: its first packet through each endpoint, the
 * first reply, and each packet that brings a TCP flag among SYN, ACK, FIN
 * and RST the connection had not shown yet (SYN, SYN-ACK, FIN, RST), so an
 * established stream sends a bounded number; TRACE_EVERY_PACKET reports
 * every packet instead (within the rate limit). */
volatile const __u8 TRACE_EVENTS = 0;
volatile const __u8 TRACE_EVERY_PACKET = 0;
/* Unread event bytes from which a new event wakes the reader at once. */
#define EVENTS_WAKEUP_BYTES (64 * 1024)

/* count adds a packet of len bytes to the counter of (reason, dir). */
static __always_inline void count(__u8 reason, __u8 dir, __u32 len)
{
	__u32 k = ((__u32)reason << 1) | (dir & 1);
	struct metric_value *v = bpf_map_lookup_elem(&tdr_metrics_v2, &k);

	if (v) {
		v->packets++;
		v->bytes += len;
	}
}

/* lost counts an event that never reached the ring buffer. */
static __always_inline void lost(__u32 why)
{
	__u64 *n = bpf_map_lookup_elem(&tdr_events_lost_v1, &why);

	if (n)
		(*n)++;
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
		lost(EVENTS_LOST_RATE_LIMITED);
		return 0;
	}
	rl->credit = credit - cost;
	return 1;
}

/* emit reports a packet in a ring buffer event, within the rate limit. */
static __always_inline void emit(__u8 type, __u8 reason, __u8 dir, __u16 ep_id, const struct pkt *p,
				 __u32 src_id, __u32 dst_id, __u8 verdict, __u32 cookie, __u8 match)
{
	if (!event_allowed())
		return;
	struct event *e = bpf_ringbuf_reserve(&tdr_events_v1, sizeof(*e), 0);
	if (!e) {
		lost(EVENTS_LOST_RING_FULL);
		return;
	}
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
	e->tcp_flags = p->proto == IPPROTO_TCP_ ? p->tcp_flags : 0;
	/* The type tells the observation point: a trace event comes from the
	 * endpoint (egress) or goes to it (ingress). */
	e->obs = type == EVENT_TRACE ? (dir == DIR_EGRESS ? OBS_FROM_ENDPOINT : OBS_TO_ENDPOINT) : 0;
	e->match = match;
	e->pad = 0;
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

/* drop_out counts and reports a drop: out of line, so the rarely taken
 * drop paths do not sit in the hot path's instruction cache lines, and a
 * global function, which the verifier checks once on its own instead of at
 * every call site. what packs reason, dir and ep_id (a call takes five
 * arguments). Marked unused so that a program including this header
 * without dropping anything compiles under -Werror. */
__attribute__((noinline, unused)) int drop_out(const struct pkt *p, __u32 what, __u32 src_id, __u32 dst_id, __u32 cookie)
{
	__u8 reason = what & 0xff, dir = (what >> 8) & 0xff;
	__u16 ep_id = what >> 16;

	if (!p)
		return TC_ACT_SHOT;

	count(reason, dir, p->len);
	emit(EVENT_DROP, reason, dir, ep_id, p, src_id, dst_id, VERDICT_DENIED, cookie, 0);
	return TC_ACT_SHOT;
}

/* drop counts and reports a drop and returns the verdict that drops. */
static __always_inline int drop(__u8 reason, __u8 dir, __u16 ep_id, const struct pkt *p, __u32 src_id, __u32 dst_id,
				__u32 cookie)
{
	return drop_out(p, (__u32)reason | ((__u32)dir << 8) | ((__u32)ep_id << 16), src_id, dst_id, cookie);
}

/* trace_notable decides, before conntrack records this packet, whether
 * it is worth a trace event: e is the flow's entry (NULL: none yet), ct
 * how the endpoint classified it (CT_*). */
static __always_inline int trace_notable(const struct ct_entry *e, const struct pkt *p, int ct, __u8 reply)
{
	if (!TRACE_EVENTS || p->nonfirst_frag)
		return 0;
	if (TRACE_EVERY_PACKET || !e || ct == CT_NEW || p->icmp_error)
		return 1;
	if (reply && !(e->flags & CT_F_SEEN_REPLY))
		return 1;
	__u8 news = p->tcp_flags & ~e->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_FIN | TCP_FLAG_RST);
	return p->proto == IPPROTO_TCP_ && news;
}

/* trace_out reports a forwarded packet: out of line and global, as
 * drop_out (checked at every call site, the trace paths multiplied the
 * verifier's work on from_pod by 3.5 and the agent's start by 0.5 s).
 * what packs reason (the conntrack classification, CT_x = REASON_CT_x),
 * dir and ep_id; a 0 identity is the remote side's, looked up here, once
 * the event is sure to be sent. */
__attribute__((noinline, unused)) int trace_out(const struct pkt *p, __u32 what, __u32 src_id, __u32 dst_id)
{
	__u8 reason = what & 0xff, dir = (what >> 8) & 0xff;
	__u16 ep_id = what >> 16;

	if (!p)
		return 0;
	if (!src_id)
		src_id = identity_of(p->family, p->saddr);
	if (!dst_id)
		dst_id = identity_of(p->family, p->daddr);
	emit(EVENT_TRACE, reason, dir, ep_id, p, src_id, dst_id, VERDICT_ALLOWED, 0, 0);
	return 0;
}

/* trace reports a forwarded packet that trace_notable chose. */
static __always_inline void trace(__u8 ct, __u8 dir, __u16 ep_id, const struct pkt *p, __u32 src_id, __u32 dst_id)
{
	trace_out(p, (__u32)ct | ((__u32)dir << 8) | ((__u32)ep_id << 16), src_id, dst_id);
}

#endif
