/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the XDP prefilter's maps and its check (bpf_xdp.c).
 * The deny list is two LPM tries, one per family, written by the agent's
 * prefilter reconciler (pkg/prefilter) from the list the API manages
 * (PATCH/DELETE /v1/prefilter); a packet whose source falls in a listed
 * CIDR is dropped before the kernel builds an skb for it, and counted in a
 * per-CPU array. The maps are pinned by name under the node's BPF root, so
 * the list keeps dropping while the agent restarts. They are the
 * prefilter's own: no other object includes this header. */
#ifndef TDR_PREFILTER_H
#define TDR_PREFILTER_H

#include "common.h"

/* LPM keys: prefixlen counts the address bits (0..32, 0..128). */
struct prefilter4_key {
	__u32 prefixlen;
	__u8 addr[4];
};

struct prefilter6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* Drop counters, one slot per family. (Kept here, not in enums.h: the Go
 * side, pkg/datapath/prefilter, names the two slots, and its test run
 * checks them.) */
#define PREFILTER_STAT_IPV4 0
#define PREFILTER_STAT_IPV6 1
#define PREFILTER_STAT_MAX 2

struct prefilter_stat {
	__u64 packets;
	__u64 bytes;
};

#define PREFILTER_MAX_ENTRIES 16384

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct prefilter4_key);
	__type(value, __u8);
	__uint(max_entries, PREFILTER_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_prefilter4_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct prefilter6_key);
	__type(value, __u8);
	__uint(max_entries, PREFILTER_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_prefilter6_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct prefilter_stat);
	__uint(max_entries, PREFILTER_STAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_prefilter_stats_v1 SEC(".maps");

static __always_inline void prefilter_count(__u32 slot, __u64 len)
{
	struct prefilter_stat *s = bpf_map_lookup_elem(&tdr_prefilter_stats_v1, &slot);

	if (s) {
		s->packets++;
		s->bytes += len;
	}
}

/* prefilter_denied reports whether the frame between data and end (an
 * Ethernet frame) comes from a denied source, counting it if so. A frame
 * too short for its headers, or of another protocol, is not denied: the
 * stack judges it as it would without the prefilter. */
static __always_inline int prefilter_denied(void *data, void *end)
{
	__u8 *eth = data;
	__u64 len = (__u64)(end - data);

	if ((void *)(eth + ETH_HLEN) > end)
		return 0;
	__be16 proto = be16_at(eth + 12);
	if (proto == bpf_htons(ETH_P_IP)) {
		__u8 *ip = eth + ETH_HLEN;
		if ((void *)(ip + 20) > end)
			return 0;
		struct prefilter4_key k = {.prefixlen = 32};
		__builtin_memcpy(k.addr, ip + 12, 4);
		if (!bpf_map_lookup_elem(&tdr_prefilter4_v1, &k))
			return 0;
		prefilter_count(PREFILTER_STAT_IPV4, len);
		return 1;
	}
	if (proto == bpf_htons(ETH_P_IPV6)) {
		__u8 *ip = eth + ETH_HLEN;
		if ((void *)(ip + 40) > end)
			return 0;
		struct prefilter6_key k = {.prefixlen = 128};
		__builtin_memcpy(k.addr, ip + 8, 16);
		if (!bpf_map_lookup_elem(&tdr_prefilter6_v1, &k))
			return 0;
		prefilter_count(PREFILTER_STAT_IPV6, len);
		return 1;
	}
	return 0;
}

#endif
