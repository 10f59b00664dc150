// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Tendril's socket-level service load-balancing, attached to a cgroup
 * (v2): a connection or datagram a process sends to a service frontend is
 * sent to a chosen backend instead, before any packet exists, and what the
 * process reads back names the frontend again.
 *
 * connect4/6 (TCP and connected UDP) and sendmsg4/6 (unconnected UDP):
 * frontend -> backend (lb.h: random among the active slots, Maglev by the
 * socket's hash, ClientIP affinity by the network namespace), recording
 * (socket cookie, backend) -> frontend in tdr_lb_sock_revnat_v1; a
 * frontend without backend fails with ECONNREFUSED (as a REJECT would) and
 * counts REASON_SVC_NO_BACKEND.
 * recvmsg4/6 (UDP: the source of a datagram) and getpeername4/6: backend ->
 * frontend, by that record.
 *
 * The maps are the node's pinned ones (lib/maps.h includes lib/lbmaps.h):
 * loaded with the same pin path as the pod programs, this object shares
 * them (pkg/datapath/socklb). */
#include "lib/common.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#include "lib/maps.h"
#include "lib/events.h"
#include "lib/lb.h"

#define ECONNREFUSED_ 111

/* Verdicts of cgroup sock_addr programs. */
#define SYS_REJECT 0
#define SYS_PROCEED 1

static __always_inline int sock_proto_ok(const struct bpf_sock_addr *ctx)
{
	return ctx->protocol == IPPROTO_TCP_ || ctx->protocol == IPPROTO_UDP_;
}

static __always_inline int sock_no_backend(void)
{
	count(REASON_SVC_NO_BACKEND, DIR_EGRESS, 0);
	/* A frontend without backends refuses connections, as kube-proxy's
	 * REJECT rule does (ICMP port unreachable: ECONNREFUSED), instead of
	 * the EPERM a bare rejection gives. */
	bpf_set_retval(-ECONNREFUSED_);
	return SYS_REJECT;
}

/* sock_client fills the affinity key of the socket's client: its network
 * namespace (at connect, the source address is not chosen yet). */
static __always_inline void sock_client(struct bpf_sock_addr *ctx, struct lb_affinity_key *ak)
{
	__u64 nc = bpf_get_netns_cookie(ctx);

	__builtin_memset(ak, 0, sizeof(*ak));
	__builtin_memcpy(ak->client, &nc, 8);
	ak->kind = AFFINITY_BY_NETNS;
}

/* sock_xlate_event reports a connection translated at connect (within the
 * trace events' switch and the rate limit): the frontend as the event's
 * source, the backend as its destination. Datagrams of unconnected UDP
 * sockets (sendmsg) are translated one by one and not reported. The
 * socket hook knows no identity, so the event's two identity fields carry
 * the client's cgroup ID instead (low 32 bits as the source's, high as
 * the destination's): the agent names the client's pod from it. */
static __always_inline void sock_xlate_event(__u8 family, __u8 proto, const __u8 *frontend, __be16 fport, const __u8 *backend,
					     __be16 bport, __u32 rev_nat_id)
{
	if (!TRACE_EVENTS)
		return;
	struct pkt p = {};
	p.family = family;
	p.proto = proto;
	__builtin_memcpy(p.saddr, frontend, 16);
	__builtin_memcpy(p.daddr, backend, 16);
	p.sport = fport;
	p.dport = bport;
	__u64 cgroup = bpf_get_current_cgroup_id();
	emit(EVENT_SOCK_XLATE, REASON_FORWARDED, DIR_EGRESS, 0, &p, (__u32)cgroup, (__u32)(cgroup >> 32), VERDICT_ALLOWED, rev_nat_id, 0);
}

/* sock_skip_mode is the LB_SKIP_* of the client (its network namespace)
 * for a frontend with SVC_F_SKIP_BACKEND (one of the redirect's own
 * backend pods), 0 when the client is redirected as any other. */
static __always_inline __u8 sock4_skip_mode(struct bpf_sock_addr *ctx, const struct lb_service *svc, __u32 daddr, __be16 dport)
{
	if (!(svc->flags & SVC_F_SKIP_BACKEND))
		return 0;
	struct lb4_skip_key k = {.netns_cookie = bpf_get_netns_cookie(ctx), .port = dport, .proto = ctx->protocol};
	__builtin_memcpy(k.addr, &daddr, 4);
	const __u8 *mode = bpf_map_lookup_elem(&tdr_lb4_skip_v1, &k);
	return mode ? *mode : 0;
}

static __always_inline __u8 sock6_skip_mode(struct bpf_sock_addr *ctx, const struct lb_service *svc, const __u32 *daddr, __be16 dport)
{
	if (!(svc->flags & SVC_F_SKIP_BACKEND))
		return 0;
	struct lb6_skip_key k = {.netns_cookie = bpf_get_netns_cookie(ctx), .port = dport, .proto = ctx->protocol};
	__builtin_memcpy(k.addr, daddr, 16);
	const __u8 *mode = bpf_map_lookup_elem(&tdr_lb6_skip_v1, &k);
	return mode ? *mode : 0;
}

static __always_inline int sock4_xlate_fwd(struct bpf_sock_addr *ctx, __u8 connect)
{
	if (!sock_proto_ok(ctx))
		return SYS_PROCEED;
	__u32 daddr = ctx->user_ip4;
	__be16 dport = (__be16)ctx->user_port;
	const struct lb_service *svc = lb4_lookup((const __u8 *)&daddr, dport, ctx->protocol);
	if (!svc || (svc->flags & SVC_F_NO_SOCKET_LB))
		return SYS_PROCEED;

	__u8 skip = sock4_skip_mode(ctx, svc, daddr, dport);
	if (skip == LB_SKIP_PASS)
		return SYS_PROCEED;

	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct lb_affinity_key ak;
	sock_client(ctx, &ak);
	__u32 bid = 0;
	const struct lb_backend *be;
	if (skip == LB_SKIP_ORIGINAL)
		be = lb_pick_original(svc, &ak, &bid);
	else
		be = lb_pick(svc, &ak, lb_hash_cookie(cookie), &bid);
	if (!be || be->family != FAMILY_V4)
		return sock_no_backend();

	struct lb_sock_key sk = {.cookie = cookie, .port = be->port, .family = FAMILY_V4};
	__builtin_memcpy(sk.addr, be->addr, 4);
	struct lb_sock_revnat rv = {.port = dport, .family = FAMILY_V4, .rev_nat_id = svc->rev_nat_id};
	__builtin_memcpy(rv.addr, &daddr, 4);
	bpf_map_update_elem(&tdr_lb_sock_revnat_v1, &sk, &rv, BPF_ANY);

	ctx->user_ip4 = u32_at(be->addr);
	ctx->user_port = (__u32)be->port;
	if (connect) {
		__u8 fe[16] = {}, ba[16] = {};
		__builtin_memcpy(fe, &daddr, 4);
		__builtin_memcpy(ba, be->addr, 4);
		sock_xlate_event(FAMILY_V4, ctx->protocol, fe, dport, ba, be->port, svc->rev_nat_id);
	}
	return SYS_PROCEED;
}

static __always_inline int sock6_xlate_fwd(struct bpf_sock_addr *ctx, __u8 connect)
{
	if (!sock_proto_ok(ctx))
		return SYS_PROCEED;
	__u32 daddr[4];
	daddr[0] = ctx->user_ip6[0];
	daddr[1] = ctx->user_ip6[1];
	daddr[2] = ctx->user_ip6[2];
	daddr[3] = ctx->user_ip6[3];
	__be16 dport = (__be16)ctx->user_port;
	const struct lb_service *svc = lb6_lookup((const __u8 *)daddr, dport, ctx->protocol);
	if (!svc || (svc->flags & SVC_F_NO_SOCKET_LB))
		return SYS_PROCEED;

	__u8 skip = sock6_skip_mode(ctx, svc, daddr, dport);
	if (skip == LB_SKIP_PASS)
		return SYS_PROCEED;

	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct lb_affinity_key ak;
	sock_client(ctx, &ak);
	__u32 bid = 0;
	const struct lb_backend *be;
	if (skip == LB_SKIP_ORIGINAL)
		be = lb_pick_original(svc, &ak, &bid);
	else
		be = lb_pick(svc, &ak, lb_hash_cookie(cookie), &bid);
	if (!be || be->family != FAMILY_V6)
		return sock_no_backend();

	struct lb_sock_key sk = {.cookie = cookie, .port = be->port, .family = FAMILY_V6};
	__builtin_memcpy(sk.addr, be->addr, 16);
	struct lb_sock_revnat rv = {.port = dport, .family = FAMILY_V6, .rev_nat_id = svc->rev_nat_id};
	__builtin_memcpy(rv.addr, daddr, 16);
	bpf_map_update_elem(&tdr_lb_sock_revnat_v1, &sk, &rv, BPF_ANY);

	ctx->user_ip6[0] = u32_at(&be->addr[0]);
	ctx->user_ip6[1] = u32_at(&be->addr[4]);
	ctx->user_ip6[2] = u32_at(&be->addr[8]);
	ctx->user_ip6[3] = u32_at(&be->addr[12]);
	ctx->user_port = (__u32)be->port;
	if (connect)
		sock_xlate_event(FAMILY_V6, ctx->protocol, (const __u8 *)daddr, dport, be->addr, be->port, svc->rev_nat_id);
	return SYS_PROCEED;
}

/* sock4_xlate_rev names the frontend instead of the backend the socket
 * was sent to (a datagram's source, the connected peer). */
static __always_inline int sock4_xlate_rev(struct bpf_sock_addr *ctx)
{
	struct lb_sock_key sk = {.cookie = bpf_get_socket_cookie(ctx), .port = (__be16)ctx->user_port, .family = FAMILY_V4};
	__u32 addr = ctx->user_ip4;

	__builtin_memcpy(sk.addr, &addr, 4);
	const struct lb_sock_revnat *rv = bpf_map_lookup_elem(&tdr_lb_sock_revnat_v1, &sk);
	if (rv && rv->family == FAMILY_V4) {
		ctx->user_ip4 = u32_at(rv->addr);
		ctx->user_port = (__u32)rv->port;
	}
	return SYS_PROCEED;
}

static __always_inline int sock6_xlate_rev(struct bpf_sock_addr *ctx)
{
	struct lb_sock_key sk = {.cookie = bpf_get_socket_cookie(ctx), .port = (__be16)ctx->user_port, .family = FAMILY_V6};
	__u32 addr[4];

	addr[0] = ctx->user_ip6[0];
	addr[1] = ctx->user_ip6[1];
	addr[2] = ctx->user_ip6[2];
	addr[3] = ctx->user_ip6[3];
	__builtin_memcpy(sk.addr, addr, 16);
	const struct lb_sock_revnat *rv = bpf_map_lookup_elem(&tdr_lb_sock_revnat_v1, &sk);
	if (rv && rv->family == FAMILY_V6) {
		ctx->user_ip6[0] = u32_at(&rv->addr[0]);
		ctx->user_ip6[1] = u32_at(&rv->addr[4]);
		ctx->user_ip6[2] = u32_at(&rv->addr[8]);
		ctx->user_ip6[3] = u32_at(&rv->addr[12]);
		ctx->user_port = (__u32)rv->port;
	}
	return SYS_PROCEED;
}

SEC("cgroup/connect4")
int sock_connect4(struct bpf_sock_addr *ctx)
{
	return sock4_xlate_fwd(ctx, 1);
}

SEC("cgroup/sendmsg4")
int sock_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock4_xlate_fwd(ctx, 0);
}

SEC("cgroup/recvmsg4")
int sock_recvmsg4(struct bpf_sock_addr *ctx)
{
	return sock4_xlate_rev(ctx);
}

SEC("cgroup/getpeername4")
int sock_getpeername4(struct bpf_sock_addr *ctx)
{
	return sock4_xlate_rev(ctx);
}

SEC("cgroup/connect6")
int sock_connect6(struct bpf_sock_addr *ctx)
{
	return sock6_xlate_fwd(ctx, 1);
}

SEC("cgroup/sendmsg6")
int sock_sendmsg6(struct bpf_sock_addr *ctx)
{
	return sock6_xlate_fwd(ctx, 0);
}

SEC("cgroup/recvmsg6")
int sock_recvmsg6(struct bpf_sock_addr *ctx)
{
	return sock6_xlate_rev(ctx);
}

SEC("cgroup/getpeername6")
int sock_getpeername6(struct bpf_sock_addr *ctx)
{
	return sock6_xlate_rev(ctx);
}
