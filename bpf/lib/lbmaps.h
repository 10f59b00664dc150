/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the pinned maps of service load-balancing and the
 * layouts of their keys and values. maps.h includes this header, so every
 * object that shares the node's maps (the pod programs, the socket
 * programs of bpf_sock.c) declares these too and the loader's cleanup of
 * other layouts knows them. Versioned names, as in maps.h: change a layout
 * here and bump the version in the map's name.
 *
 * A service frontend (address, port, protocol) maps to a service: its ID,
 * the number of active backend slots, flags. A backend is chosen among
 * slots 1..count (tdr_lb_slots_v1: service ID and slot -> backend ID), or
 * through the service's Maglev table, then read by ID (tdr_lb_backends_v1).
 * Reverse NAT (tdr_lb_revnat_v1) turns a backend's replies back into the
 * frontend's; the socket hooks keep, per socket, which backend stands for
 * which frontend (tdr_lb_sock_revnat_v1). See docs/services.md. */
#ifndef TDR_LBMAPS_H
#define TDR_LBMAPS_H

#include "common.h"

/* Frontend keys. proto is the L4 protocol (IPPROTO_TCP, _UDP, _SCTP);
 * port in network byte order. */
struct lb4_key {
	__u8 addr[4];
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct lb6_key {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct lb_service {
	/* Service ID (1..LB_MAX_IDS-1): the key of its slots, Maglev table
	 * and affinity entries. */
	__u32 svc_id;
	/* Reverse NAT ID: the key of this frontend in tdr_lb_revnat_v1. */
	__u32 rev_nat_id;
	/* Active backends in slots 1..count; 0: no backend (drop). */
	__u16 count;
	__u8 flags; /* SVC_F_* (enums.h) */
	/* With SVC_F_EXT_LOCAL: this node's active backends, the outside
	 * clients' (externalTrafficPolicy Local) scope, in slots
	 * count+1..count+local_count (nodeport.h). */
	__u8 local_count;
	/* Session affinity timeout in seconds (SVC_F_AFFINITY). */
	__u32 affinity_timeout;
};

struct lb_slot_key {
	__u32 svc_id;
	__u32 slot; /* 1..count */
};

struct lb_backend {
	__u8 addr[16]; /* IPv4 in the first four bytes */
	__be16 port;
	__u8 family; /* FAMILY_V4 or FAMILY_V6 */
	__u8 state;  /* BACKEND_* */
};

/* A frontend, as reverse NAT restores it. */
struct lb_revnat {
	__u8 addr[16];
	__be16 port;
	__u8 family;
	__u8 pad;
};

struct lb_affinity_key {
	/* The client: its address (kind AFFINITY_BY_V4/V6; IPv4 in the
	 * first four bytes) or its network namespace cookie (kind
	 * AFFINITY_BY_NETNS, in the first eight bytes, host order). */
	__u8 client[16];
	__u32 svc_id;
	__u8 kind;
	__u8 pad[3];
};

struct lb_affinity {
	__u64 last_used; /* bpf_ktime_get_coarse_ns() */
	__u32 backend_id;
	__u32 pad;
};

/* The socket hooks' reverse NAT: the socket (its cookie) and the backend
 * it was sent to -> the frontend the application named. recvmsg and
 * getpeername find it by the peer the kernel reports. */
struct lb_sock_key {
	__u64 cookie;
	__u8 addr[16];
	__be16 port;
	__u8 family;
	__u8 pad[5];
};

struct lb_sock_revnat {
	__u8 addr[16];
	__be16 port;
	__u8 family;
	__u8 pad;
	__u32 rev_nat_id;
};

/* Per-packet translation: a flow as the client sent it (to the
 * frontend) -> its backend, so every packet of the flow goes to the same
 * backend. */
struct lb4_flow_key {
	__u8 saddr[4];
	__u8 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct lb6_flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct lb_flow {
	__u32 backend_id;
	__u32 rev_nat_id;
};

/* A service's Maglev lookup table: entry i is the backend ID for flows
 * whose hash is i modulo LB_MAGLEV_TABLE_SIZE (pkg/loadbalancer/maglev
 * computes it). The whole table is one value of a hash keyed by service
 * ID: user space replaces it in one update, so a lookup sees the old table
 * or the new one, never a mix; memory is allocated only for services that
 * have one (no preallocation). */
struct lb_maglev {
	__u32 backend_ids[LB_MAGLEV_TABLE_SIZE];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_key);
	__type(value, struct lb_service);
	__uint(max_entries, LB_MAP_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb4_services_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb6_key);
	__type(value, struct lb_service);
	__uint(max_entries, LB_MAP_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb6_services_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_slot_key);
	__type(value, __u32); /* backend ID */
	__uint(max_entries, LB_SLOTS_MAP_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb_slots_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* backend ID */
	__type(value, struct lb_backend);
	__uint(max_entries, LB_MAP_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb_backends_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* reverse NAT ID */
	__type(value, struct lb_revnat);
	__uint(max_entries, LB_MAP_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb_revnat_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_affinity_key);
	__type(value, struct lb_affinity);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb_affinity_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* service ID */
	__type(value, struct lb_maglev);
	__uint(max_entries, LB_MAP_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb_maglev_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_sock_key);
	__type(value, struct lb_sock_revnat);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb_sock_revnat_v1 SEC(".maps");

/* loadBalancerSourceRanges (SVC_F_SOURCE_RANGES): the clients a
 * frontend admits from outside, by its reverse NAT ID and a prefix of the
 * client's address (prefixlen counts the 32 bits of the ID too). */
struct lb4_srcrange_key {
	__u32 prefixlen;
	__u32 rev_nat_id; /* network byte order: part of the trie's prefix */
	__u8 addr[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb4_srcrange_key);
	__type(value, __u8);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb4_srcrange_v1 SEC(".maps");

/* The same for IPv6 clients (prefixlen counts the 32 bits of the ID). */
struct lb6_srcrange_key {
	__u32 prefixlen;
	__u32 rev_nat_id; /* network byte order */
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb6_srcrange_key);
	__type(value, __u8);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb6_srcrange_v1 SEC(".maps");

/* skipRedirectFromBackend (SVC_F_SKIP_BACKEND): a client (its network
 * namespace cookie, bpf_get_netns_cookie) and a redirected frontend ->
 * LB_SKIP_*: the policy's own backend pods are not redirected to
 * themselves. Written by the agent from the frontends table. */
struct lb4_skip_key {
	__u64 netns_cookie;
	__u8 addr[4];
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct lb6_skip_key {
	__u64 netns_cookie;
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 pad[5];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_skip_key);
	__type(value, __u8); /* LB_SKIP_* */
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb4_skip_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb6_skip_key);
	__type(value, __u8); /* LB_SKIP_* */
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb6_skip_v1 SEC(".maps");

/* The same for the per-packet translation (lbnat.h), where the client is
 * the packet's source address (the pod programs check it against the
 * endpoint): {client address, frontend address, port, proto, family} ->
 * LB_SKIP_*. Both families in one map (IPv4 in the first four bytes). */
struct lb_skipsrc_key {
	__u8 client[16];
	__u8 frontend[16];
	__be16 port;
	__u8 proto;
	__u8 family;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_skipsrc_key);
	__type(value, __u8); /* LB_SKIP_* */
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb_skipsrc_v1 SEC(".maps");

/* LRU: as conntrack, a full table evicts the least recently used flows. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_flow_key);
	__type(value, struct lb_flow);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb4_flows_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_flow_key);
	__type(value, struct lb_flow);
	__uint(max_entries, 131072);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_lb6_flows_v1 SEC(".maps");

#endif
