/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: map layouts and constants shared by the programs.
 * The Go side (pkg/datapath/maps) mirrors these structs through bpf2go's
 * generated types. A map's pinned name carries its layout version
 * (tdr_ct4_v1): change a struct, bump the version in the map's name, so a
 * pinned map of the old layout is replaced instead of misread. */
#ifndef TDR_COMMON_H
#define TDR_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define TC_ACT_REDIRECT 7

#define ETH_HLEN 14
#define ETH_ALEN 6
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
#define EP_ENFORCE_INGRESS 0x01
#define EP_ENFORCE_EGRESS 0x02
#define EP_HAS_IPV4 0x04
#define EP_HAS_IPV6 0x08
/* Packets from other local endpoints are delivered straight into this
 * endpoint's namespace (bpf_redirect_peer): set when its MACs are known. */
#define EP_DELIVER_DIRECT 0x10

/* Reasons: packet outcomes counted in tdr_metrics_v2 and reported in drop
 * events. Keep in sync with pkg/datapath/maps/metrics.go. */
#define REASON_FORWARDED 0
#define REASON_CT_ESTABLISHED 1
#define REASON_CT_REPLY 2
#define REASON_CT_RELATED 3
#define REASON_DELIVERED_DIRECT 4
#define REASON_POLICY_DENIED 10
#define REASON_POLICY_DENY_RULE 11
#define REASON_TRUNCATED 12
#define REASON_MALFORMED 13
#define REASON_INVALID_SOURCE 14
#define REASON_UNKNOWN_L3 15
#define REASON_NO_ENDPOINT 16
#define REASON_FRAGMENT 17
#define REASON_UNKNOWN_INTERFACE 18
#define REASON_MAX 32

/* Event types. */
#define EVENT_DROP 1
#define EVENT_POLICY_VERDICT 2

/* Local endpoints: the same value in five maps. Two arrays, whose lookups
 * the verifier inlines (no hashing, no call): by the host-side veth's
 * ifindex (what a program running on that veth looks up first; ifindexes
 * from EP_IFINDEX_SLOTS up fall back to a hash by ifindex) and by endpoint
 * ID (the local peer a conntrack entry names). Two hashes by IPv4 and IPv6
 * address answer "is this destination a local endpoint?" for a packet of
 * no known flow. An array slot with ep_id 0 is empty. */
#define EP_IFINDEX_SLOTS 16384
#define EP_ID_SLOTS 4096 /* endpoint IDs are 1..4095 */

struct endpoint_info {
	__u32 ifindex; /* host-side veth */
	__u32 identity;
	__u16 ep_id;
	__u8 flags;
	__u8 pad;
	__u8 mac[ETH_ALEN];      /* the pod's interface */
	__u8 host_mac[ETH_ALEN]; /* the host-side veth */
	__u8 ipv4[4];
	__u8 ipv6[16];
};

/* LPM key: prefixlen counts the bits after it: 32 bits of family+pad, then
 * the address bits. */
struct ipcache_key {
	__u32 prefixlen;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

/* ipcache flags. */
#define IPCACHE_F_REMOTE_NODE 0x01 /* the prefix is a peer node's own address */

struct ipcache_info {
	__u32 identity;
	__u8 flags;
	/* Owner node of the prefix (0: this node or unknown): where a tunnel
	 * mode (VXLAN) will encapsulate to; native routing leaves it to the
	 * host's routes. */
	__u8 tunnel_family;
	__u8 pad[2];
	__u8 tunnel_ip[16];
};

/* Policy: every endpoint has up to four small LPM tries of its own, one
 * per direction for entries of a given peer identity and one per direction
 * for entries of any identity (the "any" trie exists only when such
 * entries do), reached through tdr_policy_v2, an array of maps indexed by
 * policy_slot(). A lookup walks only the tries of the endpoint deciding,
 * whatever the size of the node's policy, and skips the "any identity"
 * lookup when the endpoint has none.
 *
 * LPM key: the identity is always matched whole (32 bits); proto adds 16
 * bits (with its pad), dport up to 16 more, so a prefix expresses "any
 * protocol", "any port of a protocol" and port ranges. */
struct policy_key {
	__u32 prefixlen;
	__u32 identity;
	__u8 proto;
	__u8 pad;
	__be16 dport;
};

#define POLICY_FULL_PREFIX 64
#define POLICY_SLOTS_PER_EP 4

static __always_inline __u32 policy_slot(__u16 ep_id, __u8 dir, __u8 any)
{
	return ((__u32)ep_id * POLICY_SLOTS_PER_EP) | ((__u32)(dir & 1) << 1) | (any & 1);
}

struct policy_entry {
	__u8 deny;
	__u8 pad[3];
	/* Rule cookie reported in verdict events (the policy engine's rule). */
	__u32 cookie;
};

/* Conntrack: one entry per flow on the node, shared by both directions of
 * the flow and by its local endpoints (one, or two between local pods).
 * The key holds the flow's two sides (address, port) in a canonical order:
 * side a is the lower one, comparing addresses and then ports as
 * big-endian numbers. Every packet of the flow and every reply builds the
 * same key, so one lookup serves a packet whatever its direction and
 * however many local endpoints it concerns. */
struct ct4_key {
	__u8 addr_a[4];
	__u8 addr_b[4];
	__be16 port_a;
	__be16 port_b;
	__u8 proto;
	__u8 pad[3];
};

struct ct6_key {
	__u8 addr_a[16];
	__u8 addr_b[16];
	__be16 port_a;
	__be16 port_b;
	__u8 proto;
	__u8 pad[3];
};

/* ct_entry flags. */
#define CT_F_SEEN_REPLY 0x01
#define CT_F_CLOSING 0x02
#define CT_F_A_STARTED 0x04 /* side a sent the flow's first packet */
/* Side a (b) was not a local endpoint when from_pod created the entry:
 * established packets towards it go to the host without looking for a
 * local destination. (A pod that takes the address later gets them through
 * the host and its own to_pod, which checks them as new.) */
#define CT_F_A_NOT_LOCAL 0x08
#define CT_F_B_NOT_LOCAL 0x10

struct ct_entry {
	__u64 expires; /* bpf_ktime_get_coarse_ns() (CLOCK_MONOTONIC_COARSE) deadline */
	/* The local endpoint owning side a's (b's) address, once its policy
	 * admitted the flow; 0 for a remote side. An endpoint that is not
	 * named treats the flow as new, so a flow admitted by one endpoint
	 * is still checked by the other, and a pod that gets an address of a
	 * deleted pod does not inherit its flows. */
	__u16 ep_a;
	__u16 ep_b;
	__u8 flags;
	__u8 tcp_flags; /* every TCP flag seen, ORed */
	__u8 pad[2];
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

/* Per-CPU token bucket of events: credit in ns of event budget. */
struct ratelimit {
	__u64 last;
	__u64 credit;
};

#endif
