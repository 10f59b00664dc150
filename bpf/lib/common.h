/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: map layouts and constants shared by the programs.
 * The Go side (pkg/datapath/maps) mirrors these structs through bpf2go's
 * generated types; change both together and bump TDR_LAYOUT_VERSION. */
#ifndef TDR_COMMON_H
#define TDR_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2

#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_ARP 0x0806
#define ETH_P_IPV6 0x86DD

#define FAMILY_V4 4
#define FAMILY_V6 6

#define DIR_INGRESS 0 /* towards the pod */
#define DIR_EGRESS 1  /* from the pod */

/* Reserved identities (see pkg/identity). */
#define ID_ANY 0
#define ID_WORLD 2

/* Endpoint flags. */
#define EP_ENFORCE_INGRESS 1
#define EP_ENFORCE_EGRESS 2

/* Reasons: packet outcomes counted in tdr_metrics and reported in drop
 * events. Keep in sync with pkg/datapath/maps/reasons.go. */
#define REASON_FORWARDED 0
#define REASON_CT_ESTABLISHED 1
#define REASON_CT_REPLY 2
#define REASON_CT_RELATED 3
#define REASON_POLICY_DENIED 10
#define REASON_POLICY_DENY_RULE 11
#define REASON_TRUNCATED 12
#define REASON_MALFORMED 13
#define REASON_INVALID_SOURCE 14
#define REASON_UNKNOWN_L3 15
#define REASON_NO_ENDPOINT 16
#define REASON_FRAGMENT 17
#define REASON_MAX 32

/* Event types. */
#define EVENT_DROP 1
#define EVENT_POLICY_VERDICT 2

struct endpoint_key {
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct endpoint_info {
	__u32 ifindex;
	__u32 identity;
	__u16 ep_id;
	__u8 flags;
	__u8 pad;
	__u8 mac[6];
	__u8 host_mac[6];
};

/* LPM key: prefixlen counts the bits after it: 32 bits of family+pad, then
 * the address bits. */
struct ipcache_key {
	__u32 prefixlen;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct ipcache_info {
	__u32 identity;
	/* Owner node (tunnel endpoint for a future VXLAN mode), IPv4. */
	__u32 tunnel_ip4;
	__u8 flags;
	__u8 pad[3];
};

/* LPM key: ep_id, dir and identity are always matched whole (64 bits);
 * proto adds 16 bits (with its pad), dport up to 16 more, so a prefix
 * expresses "any protocol", "any port of a protocol" and port ranges. */
struct policy_key {
	__u32 prefixlen;
	__u16 ep_id;
	__u8 dir;
	__u8 pad;
	__u32 identity;
	__u8 proto;
	__u8 pad2;
	__be16 dport;
};

#define POLICY_FULL_PREFIX 96

struct policy_entry {
	__u8 deny;
	__u8 pad[3];
	/* Rule cookie reported in verdict events (the policy engine's rule). */
	__u32 cookie;
};

struct ct_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 family;
	__u8 dir;
	__u8 pad;
	__u16 ep_id;
	__u16 pad2;
};

struct ct_entry {
	__u64 expires; /* bpf_ktime_get_ns() deadline */
	__u64 packets;
	__u64 bytes;
	__u8 seen_reply;
	__u8 closing;
	/* Set on the entry created for the reply direction of a flow, so a
	 * reply finds its flow with one lookup of its own tuple. */
	__u8 is_reply;
	__u8 pad[5];
};


struct metric_value {
	__u64 packets;
	__u64 bytes;
};

struct event {
	__u64 ts;
	__u8 type;
	__u8 reason;
	__u8 dir;
	__u8 family;
	__u16 ep_id;
	__u8 proto;
	__u8 verdict; /* 1 allowed, 0 denied (verdict events) */
	__u32 src_identity;
	__u32 dst_identity;
	__u32 cookie;
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 len;
};

struct ratelimit {
	__u64 window_start;
	__u32 tokens;
	__u32 pad;
};

#endif
