// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Tendril's termination of sockets that the socket load-balancer sent to a
 * backend that is gone: BPF socket iterators (iter/udp, iter/tcp) walk the
 * sockets of one network namespace and destroy, with the bpf_sock_destroy
 * kfunc (Linux 6.5+), every connected socket whose peer is a backend listed
 * in tdr_lb_term_targets for the reverse NAT ID the socket was translated
 * with (tdr_lb_sock_revnat_v1, written by bpf_sock.c at connect).
 *
 * A connected UDP socket then fails its next call with ECONNABORTED, and the
 * application's reconnect goes through connect4/6 again, to a live backend
 * (the stale DNS server case); a TCP socket is aborted with a reset to the
 * peer instead of hanging on a backend that no longer answers.
 *
 * Only sockets the socket load-balancer translated are touched: a socket
 * that connected to the backend's address directly has no reverse NAT
 * record of its cookie and is left alone.
 *
 * User space (pkg/datapath/sockterm) fills the target map, opens the
 * iterators from inside each network namespace to sweep (an iterator
 * walks the namespace of the thread that opens it) and reads one record
 * per destroyed socket. */
#include "lib/common.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#include "lib/lbmaps.h"

/* The kernel's socket types, only the fields read here; CO-RE relocates
 * them against the running kernel's BTF (the ___tdr flavour keeps the
 * names apart from any header's). */
struct in6_addr___tdr {
	union {
		__u8 u6_addr8[16];
		__u32 u6_addr32[4];
	} in6_u;
} __attribute__((preserve_access_index));

struct sock_common___tdr {
	__u32 skc_daddr;
	__u16 skc_dport;
	unsigned short skc_family;
	unsigned char skc_state;
	struct in6_addr___tdr skc_v6_daddr;
} __attribute__((preserve_access_index));

/* The iterators' contexts (include/linux/bpf.h: bpf_iter__udp,
 * bpf_iter__tcp); only the first two pointers are read. */
struct seq_file;
struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));
struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	void *udp_sk;
};
struct bpf_iter__tcp {
	struct bpf_iter_meta *meta;
	void *sk_common;
};

extern int bpf_sock_destroy(struct sock_common___tdr *sk) __ksym;

#define AF_INET_ 2
#define AF_INET6_ 10

/* TCP states of a client's connection (include/net/tcp_states.h):
 * established, SYN sent, closing ones that still hold the connection. */
#define TCP_ESTABLISHED_ 1
#define TCP_SYN_SENT_ 2
#define TCP_FIN_WAIT1_ 4
#define TCP_FIN_WAIT2_ 5
#define TCP_CLOSE_WAIT_ 8
#define TCP_LAST_ACK_ 9
#define TCP_CLOSING_ 11

/* A backend to move sockets off: its address and port as the socket sees
 * them, and the reverse NAT ID (the service frontend) it left. */
struct lb_term_key {
	__u8 addr[16]; /* IPv4 in the first four bytes */
	__be16 port;
	__u8 family; /* FAMILY_V4 or FAMILY_V6 */
	__u8 proto;  /* IPPROTO_TCP or IPPROTO_UDP */
	__u32 rev_nat_id;
};

/* What a sweep reports per socket it destroyed (bpf_seq_write). */
struct lb_term_record {
	__u64 cookie;
	__s32 ret; /* bpf_sock_destroy's result: 0 or -errno */
	__u8 proto;
	__u8 family;
	__u8 pad[2];
};

/* Filled by user space for one sweep; not pinned: only this object's
 * owner uses it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_term_key);
	__type(value, __u8);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} tdr_lb_term_targets SEC(".maps");

static __always_inline void term_sock(struct seq_file *seq, struct sock_common___tdr *sk, __u8 proto)
{
	struct lb_sock_key sk_key = {};
	struct lb_term_key tk = {};
	unsigned short family = sk->skc_family;

	if (family == AF_INET_) {
		__u32 daddr = sk->skc_daddr;
		if (daddr == 0)
			return; /* not connected */
		__builtin_memcpy(sk_key.addr, &daddr, 4);
		sk_key.family = FAMILY_V4;
	} else if (family == AF_INET6_) {
		__u32 a[4];
		a[0] = sk->skc_v6_daddr.in6_u.u6_addr32[0];
		a[1] = sk->skc_v6_daddr.in6_u.u6_addr32[1];
		a[2] = sk->skc_v6_daddr.in6_u.u6_addr32[2];
		a[3] = sk->skc_v6_daddr.in6_u.u6_addr32[3];
		if ((a[0] | a[1] | a[2] | a[3]) == 0)
			return;
		__builtin_memcpy(sk_key.addr, a, 16);
		sk_key.family = FAMILY_V6;
	} else {
		return;
	}
	sk_key.port = sk->skc_dport;
	sk_key.cookie = bpf_get_socket_cookie(sk);

	/* Translated by the socket load-balancer, and for which frontend? */
	const struct lb_sock_revnat *rv = bpf_map_lookup_elem(&tdr_lb_sock_revnat_v1, &sk_key);
	if (!rv)
		return;
	__builtin_memcpy(tk.addr, sk_key.addr, 16);
	tk.port = sk_key.port;
	tk.family = sk_key.family;
	tk.proto = proto;
	tk.rev_nat_id = rv->rev_nat_id;
	if (!bpf_map_lookup_elem(&tdr_lb_term_targets, &tk))
		return;

	struct lb_term_record rec = {.cookie = sk_key.cookie, .proto = proto, .family = sk_key.family};
	rec.ret = bpf_sock_destroy(sk);
	bpf_seq_write(seq, &rec, sizeof(rec));
}

SEC("iter/udp")
int sock_term_udp(struct bpf_iter__udp *ctx)
{
	struct sock_common___tdr *sk = ctx->udp_sk;

	if (!sk)
		return 0;
	/* A connected UDP socket is TCP_ESTABLISHED in the kernel's terms. */
	if (sk->skc_state != TCP_ESTABLISHED_)
		return 0;
	term_sock(ctx->meta->seq, sk, IPPROTO_UDP_);
	return 0;
}

SEC("iter/tcp")
int sock_term_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common___tdr *sk = ctx->sk_common;

	if (!sk)
		return 0;
	switch (sk->skc_state) {
	case TCP_ESTABLISHED_:
	case TCP_SYN_SENT_:
	case TCP_FIN_WAIT1_:
	case TCP_FIN_WAIT2_:
	case TCP_CLOSE_WAIT_:
	case TCP_LAST_ACK_:
	case TCP_CLOSING_:
		break;
	default:
		/* Listening, time-wait and request sockets are no client's
		 * connection. */
		return 0;
	}
	term_sock(ctx->meta->seq, sk, IPPROTO_TCP_);
	return 0;
}
