/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the pinned maps and the layouts of their keys and
 * values, the contract between the programs and user space (the Go side,
 * pkg/datapath/maps, reads them through bpf2go's generated types) and
 * between programs: every object that includes this header declares the
 * same maps, and the loader, pinning by name under the node's BPF root,
 * gives them all the same kernel maps.
 *
 * A map's pinned name carries its layout version (tdr_ct4_v1): change a
 * struct, a key or value type, a type or a size here, and bump the version
 * in the map's name, so a pinned map of the old layout is replaced instead
 * of misread (pkg/datapath/loader/upgrade_test.go checks the layout of
 * every name). */
#ifndef TDR_MAPS_H
#define TDR_MAPS_H

#include "common.h"

#define MAX_ENDPOINTS 4096

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
	__u8 flags; /* EP_* (enums.h) */
	/* EP2_* (enums.h): EP_* has no bit left. Was padding: an earlier
	 * agent's entries read 0. */
	__u8 flags2;
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

struct ipcache_info {
	__u32 identity;
	__u8 flags;
	/* Owner node of the prefix (0: this node or unknown): where the
	 * tunnel routing mode encapsulates to (lib/overlay.h); native routing
	 * leaves it to the host's routes. */
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

static __always_inline __u32 policy_slot(__u16 ep_id, __u8 dir, __u8 any)
{
	return ((__u32)ep_id * POLICY_SLOTS_PER_EP) | ((__u32)(dir & 1) << 1) | (any & 1);
}

struct policy_entry {
	__u8 deny;
	/* POLICY_MATCH_* of the entry's key in the low nibble, written by
	 * the agent (0 in entries of earlier agents: none), reported in
	 * verdict events; in the high nibble, for an allow whose port has L7
	 * rules, the PROXY_* (enums.h) the flow goes to (egress only; 0:
	 * none). One byte with the match: the policy lookup copies it whole
	 * (its stack is on the pod programs' deepest call chain). */
	__u8 match;
	__u8 flags; /* POLICY_F_* (enums.h); 0 without audited policy */
	__u8 pad;
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

struct ct_entry {
	__u64 expires; /* bpf_ktime_get_coarse_ns() (CLOCK_MONOTONIC_COARSE) deadline */
	/* The local endpoint owning side a's (b's) address, once its policy
	 * admitted the flow; 0 for a remote side. An endpoint that is not
	 * named treats the flow as new, so a flow admitted by one endpoint
	 * is still checked by the other, and a pod that gets an address of a
	 * deleted pod does not inherit its flows. */
	__u16 ep_a;
	__u16 ep_b;
	__u8 flags;     /* CT_F_* (enums.h) */
	__u8 tcp_flags; /* every TCP flag seen, ORed */
	__u8 revoked;   /* CT_REVOKED_* (enums.h), written by the agent */
	/* PROXY_* (enums.h) the flow's initiator's egress policy sent it
	 * to, when from_pod admitted it: its later packets go there too. */
	__u8 proxy;
	/* Reverse NAT ID of a flow the pod programs translated to a service
	 * backend (lbnat.h): its replies get the frontend back as their
	 * source. 0: none. Layout v1 (tdr_ct4_v1) held it in 16 bits, which
	 * capped a node at 65,535 frontends; v2 widens it (IDs below
	 * LB_MAX_IDS) and the agent carries v1 entries over at start. */
	__u32 rev_nat;
	/* The identity of a remote source as the datapath gave it, for a
	 * flow from another node that a local endpoint's ingress sent to the
	 * HTTP proxy (proxy PROXY_HTTP_INGRESS, lib/l7ingress.h): the proxy
	 * applies the endpoint's rules for it. 0 otherwise. Padding before:
	 * an earlier agent's entries read 0. */
	__u32 src_identity;
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
	__u8 verdict; /* VERDICT_ALLOWED or VERDICT_DENIED (verdict events) */
	__u32 src_identity;
	__u32 dst_identity;
	__u32 cookie;
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 len;
	/* These four bytes were the struct's tail padding (always 0): an
	 * event of the earlier layout has the same size and reads as "no
	 * flags, no observation point". */
	__u8 tcp_flags; /* the packet's TCP flags (TCP only) */
	__u8 obs;       /* OBS_* of trace events, 0 otherwise */
	__u8 match;     /* POLICY_MATCH_* of policy verdict events, 0 otherwise */
	__u8 pad;
};

/* Per-CPU token bucket of events: credit in ns of event budget. */
struct ratelimit {
	__u64 last;
	__u64 credit;
};

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

/* The prefixes policy rules name (CIDRs and their exceptions), each with
 * the node-local identity an address inside it carries for those rules
 * when the address belongs to a pod or a node: the ipcache gives such an
 * address its own identity (the longest prefix wins), yet an ipBlock
 * selects every address in its block. Looked up by address for a new
 * flow's peer that is in the cluster (see policy in policy.h); empty when
 * no rule names a prefix. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, __u32);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_policy_cidr_v1 SEC(".maps");

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

/* Connections audited policies would have denied, per rule cookie and
 * CPU: the datapath counts each audit decision (one per new flow), so the
 * per-rule counts stay exact whatever the event rate limit drops. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, __u32);   /* rule cookie */
	__type(value, __u64); /* connections */
	__uint(max_entries, 16384);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_audit_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_ct4_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct6_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 131072);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_ct6_v2 SEC(".maps");

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

/* Events that never reached the ring buffer, by EVENTS_LOST_* (enums.h):
 * user space reports them, so a lost event is never silent. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, EVENTS_LOST_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_events_lost_v1 SEC(".maps");

/* The overlay (tunnel routing mode, docs/routing.md): the device a pod's
 * packet for another node's pod is redirected to, its tunnel key naming
 * that node (the ipcache entry's tunnel_ip) and carrying the source's
 * identity as the VNI. One entry, written by the agent's tunnel cell;
 * ifindex 0 (native routing, or no agent yet) leaves every such packet to
 * the host's routes. */
struct tunnel_info {
	__u32 ifindex; /* the overlay device (tendril_vxlan), 0: native */
	__u32 flags;   /* TUNNEL_F_* */
};

/* TUNNEL_F_GENEVE_BPF: Geneve built and stripped in eBPF (lib/geneve.h),
 * no device: from_pod encapsulates itself (ifindex unused), from_netdev
 * decapsulates. */
#define TUNNEL_F_GENEVE_BPF 1

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct tunnel_info);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_tunnel_v1 SEC(".maps");

/* The overlay's programs the host device programs tail-call: slot 0 is
 * from_geneve (bpf_overlay.c), which decides a packet from_netdev
 * decapsulated from Geneve (lib/geneve.h). Written by the agent's tunnel
 * cell; empty, the packet is dropped. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_overlay_calls_v1 SEC(".maps");

/* The longest Geneve DSR option (IPv6). */
#define GENEVE_DSR_SCRATCH_LEN 24

/* geneve_dsr_scratch is one packet's Geneve DSR option (lib/geneve.h) in
 * its wire format (len bytes of opt: 0, 12 over IPv4 or 24 over IPv6), in
 * a per-CPU slot between two steps of one program run: nodeport_in's
 * choice and the encapsulation (nodeport_dsr_geneve), or geneve_decap
 * and the overlay program it tail-calls. Never read across packets: the
 * writer of a run is its reader's only source (cb says so on receipt). */
struct geneve_dsr_scratch {
	__u8 len;
	__u8 pad[3];
	__u8 opt[GENEVE_DSR_SCRATCH_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct geneve_dsr_scratch);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_geneve_dsr_v1 SEC(".maps");

/* WireGuard strict mode and node encryption (docs/encryption.md,
 * lib/encrypt.h). One entry, written by the agent's wireguard cell: the
 * WireGuard device's ifindex, ENCRYPT_F_STRICT and ENCRYPT_F_NODE.
 * Without a flag (both off, encryption off, no agent yet) from_pod does
 * not look further. */
struct encrypt_info {
	__u32 ifindex; /* the WireGuard device, 0: none (yet) */
	__u32 flags;   /* ENCRYPT_F_* */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct encrypt_info);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_encrypt_v1 SEC(".maps");

/* The destinations that must leave encrypted: every other node's pod
 * CIDRs (the nodes table's), each with ENCRYPT_DST_PEER when that node is
 * a peer of the device (a valid key of its own) and without when it is
 * not (no key, a malformed or duplicate one): under strict mode nothing
 * reaches a node that is no peer. With node encryption also the peers'
 * own addresses (full-length prefixes, ENCRYPT_DST_NODE). Written by the
 * wireguard cell. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, __u32);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_encrypt_cidrs_v1 SEC(".maps");

/* The DNS fallback's allowed names (lib/dnsfb.h), written by the agent
 * from each endpoint's DNS rules: while no DNS proxy listens, a UDP query
 * of a PROXY_DNS flow passes only when its name (or the name after its
 * first label) is here for the endpoint. hash is the 64-bit FNV-1a of the
 * lowercased wire-format name (length octets and the final zero
 * included); hash 0 with DNSFB_KIND_FILTER or DNSFB_KIND_ALL is the
 * endpoint's marker. Pinned: it filters while the agent is down. */
struct dnsfb_key {
	__u16 ep_id;
	__u8 kind; /* DNSFB_KIND_* */
	__u8 pad[5];
	__u64 hash;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct dnsfb_key);
	__type(value, __u8);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_dns_fallback_v1 SEC(".maps");

/* The DNS fallback's copy of a query's DNS message up to its question
 * (the header, the longest name and QTYPE/QCLASS, rounded up to 8): a
 * per-CPU buffer, since from_pod's call chain has no stack room for it.
 * Declared here, not pinned, so that every object that takes the pod
 * programs' maps by name (the host programs) has it. */
#define DNSFB_BUF 272

struct dnsfb_buf {
	__u8 b[DNSFB_BUF];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct dnsfb_buf);
	__uint(max_entries, 1);
} tdr_dnsfb_scratch SEC(".maps");

/* The L7 proxies' sockets and ports (see lib/proxy.h). */
/* The proxies' UDP sockets, written by the agent (a socket leaves the map
 * when it closes: while no proxy listens there is none). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__type(key, __u32);   /* PROXY_SOCKET_KEY */
	__type(value, __u64); /* the socket (its cookie when read) */
	__uint(max_entries, PROXY_MAX * 2);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_proxy_sockets_v1 SEC(".maps");

/* The proxies' TCP listening ports (host byte order; 0: none), by
 * PROXY_*, written by the agent: the listener is looked up by its port in
 * the node's namespace (this kernel refuses TCP listeners in a sockmap
 * from user space), and taken only when it is listening. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, PROXY_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_proxy_ports_v1 SEC(".maps");

/* The ifindex of the hairpin device (key 0; 0: none), written by the
 * agent once the l7_hairpin program is attached to it: to_pod sends a
 * flow of the node itself to a port with ingress HTTP rules there, where
 * a tc ingress hook can assign it to the ingress HTTP proxy
 * (lib/l7ingress.h, l7ingress_hairpin). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_l7_hairpin_v1 SEC(".maps");

/* Keep struct event and the policy key and entry in BTF so bpf2go generates
 * their Go types (the inner policy maps name only their sizes). */
const struct event *unused_event_type __attribute__((unused));
const struct policy_entry *unused_policy_entry_type __attribute__((unused));
const struct policy_key *unused_policy_key_type __attribute__((unused));

/* Service load-balancing: its maps are shared by every object as the
 * others are. */
#include "lbmaps.h"
/* Masquerade (the host device programs), likewise. */
#include "natmaps.h"
/* L2 announcements' ARP responder (the host device programs). */
#include "l2maps.h"

#endif
