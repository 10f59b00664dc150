/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the masquerade maps: the NAT tables (IPv4, IPv6), the
 * destinations never masqueraded, and what the host programs know of
 * each device they run on. Included by maps.h, so every object declares
 * them and the loader keeps their pins (see docs/datapath.md, Masquerade). */
#ifndef TDR_NATMAPS_H
#define TDR_NATMAPS_H

/* maps.h includes this header at its end; including it here lets the
 * header compile on its own (struct ipcache_key). */
#include "maps.h"

/* One masqueraded flow is two entries: its tuple as the pod sends it
 * (dir NAT_DIR_EGRESS: local = the pod, value = the node's address and
 * port) and as the reply arrives (dir NAT_DIR_INGRESS: local = the node's
 * address and port, value = the pod's). For ICMP echo the local "port" is
 * the identifier and the remote one 0. */
struct nat4_key {
	__u8 addr_l[4];
	__u8 addr_r[4];
	__be16 port_l;
	__be16 port_r;
	__u8 proto;
	__u8 dir; /* NAT_DIR_* (enums.h) */
	__u8 pad[2];
};

struct nat4_entry {
	__u8 addr[4];
	__be16 port;
	__u8 flags; /* NAT_F_* (enums.h) */
	__u8 pad;
	/* bpf_ktime_get_coarse_ns() when the mapping was made: the GC leaves
	 * a mapping younger than its conntrack entry's first lifetime. */
	__u64 created;
};

/* A plain hash, not an LRU: a live mapping is never evicted (its flow
 * would break, and its port would look free). Entries go with their
 * conntrack entries (the agent's CT GC), or are taken over by a new flow
 * once their flow's conntrack entry is gone (nat.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct nat4_key);
	__type(value, struct nat4_entry);
	__uint(max_entries, 131072);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_nat4_v1 SEC(".maps");

/* IPv6: the same, with IPv6 addresses. */
struct nat6_key {
	__u8 addr_l[16];
	__u8 addr_r[16];
	__be16 port_l;
	__be16 port_r;
	__u8 proto;
	__u8 dir; /* NAT_DIR_* (enums.h) */
	__u8 pad[2];
};

struct nat6_entry {
	__u8 addr[16];
	__be16 port;
	/* NAT_F_* (enums.h): a byte of what was padding, so a table pinned
	 * before keeps its layout (its entries read 0: masquerade). */
	__u8 flags;
	__u8 pad[5];
	__u64 created;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct nat6_key);
	__type(value, struct nat6_entry);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_nat6_v1 SEC(".maps");

/* Destinations pod traffic keeps its address to (ipcache_key layout,
 * value unused): the cluster's pod CIDRs and --non-masquerade-cidrs.
 * Pods' and nodes' own addresses need no entry: their identity says they
 * are in the cluster. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, __u8);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_nomasq_v1 SEC(".maps");

/* What the host programs know of a device they are attached to, by
 * ifindex: the addresses masqueraded traffic leaves with. */
struct hostdev_info {
	__u8 flags; /* HOSTDEV_F_* (enums.h) */
	__u8 pad[3];
	__u8 ipv4[4];
	__u8 ipv6[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* ifindex */
	__type(value, struct hostdev_info);
	__uint(max_entries, 64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_hostdev_v1 SEC(".maps");

/* Direct server return (nodeport.h): on a backend's node, the service
 * frontend an outside client's flow was sent to, read from the IPv4
 * option the forwarding node wrote, by the flow's tuple as it arrives
 * (client -> backend). The backend's replies leave with the frontend as
 * their source. An entry goes with its flow's conntrack entry (the
 * agent's CT GC, once older than `created` allows: the record is written
 * before the pod's to_pod makes the conntrack entry); an LRU besides, so
 * that a full table evicts the least recently used instead of refusing a
 * new flow (no port rests on an entry: eviction costs only an idle
 * flow's replies). */
struct dsr4_key {
	__u8 client[4];
	__u8 backend[4];
	__be16 client_port;
	__be16 backend_port;
	__u8 proto;
	__u8 pad[3];
};

struct dsr4_entry {
	__u8 addr[4];
	__be16 port;
	__u8 pad[2];
	/* bpf_ktime_get_coarse_ns() when recorded. */
	__u64 created;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct dsr4_key);
	__type(value, struct dsr4_entry);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_dsr4_v1 SEC(".maps");

/* The IPv6 record of direct server return, read from the IPv6 DSR
 * extension header (nodeport_dsr.h) or the Geneve DSR option (geneve.h).
 * Kept as tdr_dsr4_v1. */
struct dsr6_key {
	__u8 client[16];
	__u8 backend[16];
	__be16 client_port;
	__be16 backend_port;
	__u8 proto;
	__u8 pad[3];
};

struct dsr6_entry {
	__u8 addr[16];
	__be16 port;
	__u8 pad[6];
	__u64 created;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct dsr6_key);
	__type(value, struct dsr6_entry);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_dsr6_v1 SEC(".maps");

#endif
