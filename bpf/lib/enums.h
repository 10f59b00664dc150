/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the values user space reads from or writes into the
 * maps and events. They are defined here only: `make generate`
 * (hack/bpfenums) turns each group below into Go constants of package
 * pkg/datapath/maps (enums_gen.go).
 *
 * A group starts with a line `go:const <GoPrefix> <C_PREFIX> [type]
 * [describe]` in a comment of its own and ends at the next blank line. It
 * holds only #defines of integer literals and comments: a comment above a
 * #define is its Go doc comment, a comment after it its Go line comment,
 * or, in a describe group, its description (the group's Names() in Go). */
#ifndef TDR_ENUMS_H
#define TDR_ENUMS_H

/* go:const Family FAMILY_ */
#define FAMILY_V4 4
#define FAMILY_V6 6

/* Directions as seen from the endpoint.
 * go:const Dir DIR_ uint8 */
#define DIR_INGRESS 0 /* towards the pod */
#define DIR_EGRESS 1  /* from the pod */

/* Endpoint flags (endpoint_info.flags).
 * go:const Flag EP_ uint8 */
#define EP_ENFORCE_INGRESS 0x01
#define EP_ENFORCE_EGRESS 0x02
#define EP_HAS_IPV4 0x04
#define EP_HAS_IPV6 0x08
/* Packets from other local endpoints are delivered straight into this
 * endpoint's namespace (bpf_redirect_peer), its ingress policy checked
 * there: set when its MACs are known. */
#define EP_DELIVER_DIRECT 0x10
/* An audited policy selects the endpoint in that direction: a new flow
 * the audit view (enforced and audited rules together) would deny passes
 * (unless the enforced rules deny it) and is reported with an AUDIT
 * verdict and counted per rule. */
#define EP_AUDIT_INGRESS 0x20
#define EP_AUDIT_EGRESS 0x40
/* The endpoint's enforced ingress has entries naming the HTTP proxy: only
 * then does from_netdev look up a packet's flow from another node for the
 * ingress proxy (lib/l7ingress.h), so other pods' packets do not pay that
 * conntrack lookup. Set after the entries are written (a flow meeting the
 * entry before the flag goes to to_pod, which drops it: fail closed). */
#define EP_L7_INGRESS 0x80

/* More endpoint flags (endpoint_info.flags2).
 * go:const Flag2 EP2_ uint8 */
/* The endpoint's enforced egress has entries naming a proxy: only then do
 * from_netdev and a masquerade reply look up a packet's flow from another
 * node for the HTTP proxy's upstream connection, which keeps the pod's
 * address (lib/proxy.h), so other pods' packets do not pay that conntrack
 * lookup. */
#define EP2_L7_EGRESS 0x01

/* ipcache flags (ipcache_info.flags).
 * go:const IPCacheFlag IPCACHE_F_ uint8 */
#define IPCACHE_F_REMOTE_NODE 0x01 /* the prefix is a peer node's own address */

/* Conntrack entry flags (ct_entry.flags), by side of the key: side a is
 * the lower (address, port).
 * go:const CTFlag CT_F_ uint8 */
#define CT_F_SEEN_REPLY 0x01
#define CT_F_CLOSING 0x02 /* a TCP flow that saw FIN or RST */
#define CT_F_A_STARTED 0x04 /* side a sent the flow's first packet */
/* Side a (b) was not a local endpoint when from_pod created the entry:
 * established packets towards it go to the host without looking for a
 * local destination. (A pod that takes the address later gets them through
 * the host and its own to_pod, which checks them as new.) */
#define CT_F_A_NOT_LOCAL 0x08
#define CT_F_B_NOT_LOCAL 0x10

/* The node's transparent proxies a policy entry sends a flow to
 * (policy_entry.proxy, ct_entry.proxy): 0 none. The agent writes each
 * proxy's listening sockets into tdr_proxy_sockets_v1 at PROXY_SOCKET_KEY
 * (the proxy, the protocol), so an entry names the proxy, not its port.
 * go:const Proxy PROXY_ uint8 */
#define PROXY_NONE 0
#define PROXY_DNS 1 /* DNS rules (toPorts.rules.dns), UDP and TCP */
#define PROXY_HTTP 2 /* HTTP rules (toPorts.rules.http), TCP */
/* HTTP rules on the destination's ingress: a policy entry names
 * PROXY_HTTP in either direction; a flow redirected for its destination's
 * ingress entry records this one, whose listener (its own port in
 * tdr_proxy_ports_v1) applies the destination's ingress rules to the
 * source the conntrack entry names. */
#define PROXY_HTTP_INGRESS 3
#define PROXY_MAX 4
/* A flow whose source's egress entry and whose local destination's
 * ingress entry both name the HTTP proxy: it goes to the (egress) HTTP
 * proxy's listener, which applies both rule sets and reaches the
 * destination marked PROXY_MARK_UPSTREAM (docs/policy-l7.md, "Egress and
 * ingress rules on one flow"). Not a listener of its own (beyond
 * PROXY_MAX: proxy_redirect takes PROXY_HTTP's); it fits the three bits
 * ct_create keeps. */
#define PROXY_HTTP_BOTH 4

/* The mark from_pod gives a packet it assigned to a proxy's socket: the
 * agent's policy routing rule delivers packets with it locally (table
 * PROXY_MARK_TABLE holds "local default dev lo"), whatever their
 * destination, so they reach the socket with their destination intact.
 * go:const ProxyMark PROXY_MARK_ uint32 */
#define PROXY_MARK_VALUE 0x0200
/* The mark (SO_MARK) of the ingress HTTP proxy's own connections to the
 * pods it serves: to_pod admits their flows without the pod's ingress
 * policy (the proxy admitted each request for the original peer; the
 * policy would see the node). Only the node's root sets marks: a pod's
 * packets lose theirs crossing its veth. Not PROXY_MARK_VALUE, so not
 * delivered locally by the proxy's routing rule. */
#define PROXY_MARK_UPSTREAM 0x0300
/* The mark to_pod gives a packet of a source that is no local endpoint
 * (the node itself) for a port with ingress HTTP rules, as it redirects
 * the packet to the ingress of the hairpin device (tendril_host), whose
 * l7_hairpin program assigns it to the ingress HTTP proxy (to_pod runs at
 * tcx egress, where bpf_sk_assign cannot). The endpoint's ID rides in the
 * mark's upper 16 bits for the drop event. A packet that comes back to
 * to_pod with it (no program took it) is dropped: the port stays closed.
 * WireGuard's device mark (0x5457) has the same nibble: its datagrams
 * leave by the uplink and never meet to_pod or the hairpin device. */
#define PROXY_MARK_HAIRPIN 0x0400
/* The mark (SO_MARK) of the egress HTTP proxy's upstream connections,
 * which leave from the client pod's own address and port (lib/proxy.h):
 * a local destination's to_pod delivers their packets as packets of the
 * client's flow, which its ingress admitted for the client's identity,
 * without touching the flow's entry (the client's connection owns it).
 */
#define PROXY_MARK_EGRESS_UPSTREAM 0x0500
#define PROXY_MARK_MASK 0x0F00
#define PROXY_MARK_TABLE 2005

/* Conntrack entry revocations (ct_entry.revoked), by side of the key: the
 * agent revoked the side's endpoint's admission of the flow (a policy
 * change denies it, --policy-revoke-established). The endpoint is no
 * longer named on its side, so every packet of the flow it sees goes
 * through its policy as a new one, and it is never named again: a packet
 * its policy lets through (the other direction's, say) does not admit
 * the flow back.
 * go:const CTRevoked CT_REVOKED_ uint8 */
#define CT_REVOKED_A 0x01
#define CT_REVOKED_B 0x02

/* Reasons: packet outcomes counted in tdr_metrics_v2 and reported in drop
 * events. Below REASON_POLICY_DENIED the packet passed, and with
 * REASON_TO_OVERLAY (added after the drops). The comment after
 * each is its name in the CLI, events and metrics.
 * go:const Reason REASON_ uint8 describe */
#define REASON_FORWARDED 0 /* Forwarded */
#define REASON_CT_ESTABLISHED 1 /* Forwarded (established connection) */
#define REASON_CT_REPLY 2 /* Forwarded (reply) */
#define REASON_CT_RELATED 3 /* Forwarded (related ICMP error) */
#define REASON_DELIVERED_DIRECT 4 /* Delivered directly to a local endpoint */
#define REASON_MASQUERADED 5 /* Masqueraded to the node address */
#define REASON_MASQ_REPLY 6 /* Masquerade reply translated back to the pod */
#define REASON_NODEPORT 7 /* Service from outside translated to a backend */
#define REASON_NODEPORT_REPLY 8 /* Service reply translated back to an outside client */
#define REASON_NODEPORT_ICMP_ERROR 9 /* ICMP error about a service flow from outside translated */
#define REASON_POLICY_DENIED 10 /* Policy denied */
#define REASON_POLICY_DENY_RULE 11 /* Policy denied by deny rule */
#define REASON_TRUNCATED 12 /* Truncated packet */
#define REASON_MALFORMED 13 /* Malformed packet */
#define REASON_INVALID_SOURCE 14 /* Invalid source address */
#define REASON_UNKNOWN_L3 15 /* Unsupported L3 protocol */
#define REASON_NO_ENDPOINT 16 /* No local endpoint for destination */
#define REASON_FRAGMENT 17 /* Fragment without reassembly state under policy */
#define REASON_UNKNOWN_INTERFACE 18 /* Interface has no endpoint */
#define REASON_SVC_NO_BACKEND 19 /* Service has no backend */
#define REASON_NAT_FAILED 20 /* Service translation failed */
#define REASON_MASQ_NO_PORT 21 /* Masquerade port range exhausted */
#define REASON_MASQ_TABLE_FULL 22 /* Masquerade NAT table full */
#define REASON_MASQ_FAILED 23 /* Masquerade translation failed */
#define REASON_SVC_NO_LOCAL_BACKEND 24 /* Service has no local backend (externalTrafficPolicy Local) */
#define REASON_SOURCE_RANGE_DENIED 25 /* Client outside the load balancer's source ranges */
#define REASON_NODEPORT_NO_ROUTE 26 /* No route to the service backend */
#define REASON_DSR_MTU_EXCEEDED 27 /* DSR option would exceed the MTU */
#define REASON_TO_OVERLAY 28 /* Encapsulated to the node owning the destination */
#define REASON_NO_TUNNEL_KEY 29 /* Overlay packet without tunnel metadata */
#define REASON_TUNNEL_NOT_A_NODE 30 /* Overlay packet from an address of no known node */
/* WireGuard strict mode (lib/encrypt.h): a pod's packet for another
 * node's pod CIDR whose peer has no key, or whose route does not go to
 * the WireGuard device. */
#define REASON_UNENCRYPTED 31 /* Would leave the node unencrypted (WireGuard strict mode) */
/* The DNS fallback (lib/dnsfb.h): while no DNS proxy listens, a query
 * for a name the endpoint's DNS rules do not allow is answered REFUSED by
 * the datapath (IPv4 UDP) or dropped (IPv6, TCP). */
#define REASON_DNS_NAME_DENIED 32 /* DNS name denied (proxy down) */

/* Reasons are below REASON_MAX: tdr_metrics_v2 holds REASON_MAX * 2
 * counters.
 * go:const reason REASON_ */
#define REASON_MAX 33

/* Kinds of tdr_dns_fallback_v1's entries (dnsfb_key.kind, lib/dnsfb.h).
 * go:const DNSFallback DNSFB_KIND_ uint8 */
#define DNSFB_KIND_NAME 1   /* a name allowed exactly (hash of the name) */
#define DNSFB_KIND_SUFFIX 2 /* *.rest: any first label (hash of the rest) */
#define DNSFB_KIND_ALL 3    /* every name passes (hash 0): a rule the map cannot express */
#define DNSFB_KIND_FILTER 4 /* the endpoint's names are in: filter (hash 0) */

/* Encryption flags (encrypt_info.flags).
 * go:const EncryptFlag ENCRYPT_F_ uint32 */
#define ENCRYPT_F_STRICT 0x01 /* --wireguard-strict: drop what would leave unencrypted */
#define ENCRYPT_F_NODE 0x02   /* --wireguard-encrypt-node: a pod's packets to a peer's node address go to the device */

/* The values of tdr_encrypt_cidrs_v1 (bits).
 * go:const EncryptDst ENCRYPT_DST_ uint32 */
#define ENCRYPT_DST_PEER 0x01 /* the destination's node is a peer of the device (a valid key) */
#define ENCRYPT_DST_NODE 0x02 /* a node's own address (node encryption), not a pod CIDR */

/* encrypt_info.flags >> ENCRYPT_TUNNEL_PORT_SHIFT: the tunnel's UDP port
 * in the tunnel routing mode (0: native routing); strict mode then checks
 * where the encapsulated datagram would go.
 * go:const Encrypt ENCRYPT_ uint32 */
#define ENCRYPT_TUNNEL_PORT_SHIFT 16

/* Event types (event.type).
 * go:const Event EVENT_ uint8 */
#define EVENT_DROP 1
#define EVENT_POLICY_VERDICT 2
#define EVENT_TRACE 3 /* a forwarded packet (trace events, lib/events.h) */
/* A socket's connection to a service frontend translated to a backend at
 * connect (socket load-balancing): saddr/sport the frontend, daddr/dport
 * the backend, cookie the service's reverse NAT ID. */
#define EVENT_SOCK_XLATE 4

/* Observation points of trace events (event.obs): which program saw the
 * packet, as seen from the endpoint.
 * go:const Obs OBS_ uint8 */
#define OBS_FROM_ENDPOINT 1 /* from_pod: the pod sent it */
#define OBS_TO_ENDPOINT 2 /* to_pod: delivered to the pod */

/* What a policy entry's key matches (policy_entry.match, event.match of
 * verdicts), as Cilium's monitor numbers policy match types: the agent
 * writes it with the entry, the datapath copies it into the verdict.
 * go:const PolicyMatch POLICY_MATCH_ uint8 */
#define POLICY_MATCH_NONE 0 /* not known (an entry of an earlier agent) */
#define POLICY_MATCH_L3_ONLY 1 /* a peer identity, any protocol and port */
#define POLICY_MATCH_L3_L4 2 /* a peer identity and a protocol (and port) */
#define POLICY_MATCH_L4_ONLY 3 /* any identity, a protocol (and port) */
#define POLICY_MATCH_ALL 4 /* any identity, protocol and port */

/* Counters of events that never reached the ring buffer
 * (tdr_events_lost_v1, per CPU).
 * go:const EventsLost EVENTS_LOST_ */
#define EVENTS_LOST_RING_FULL 0 /* the ring buffer had no room */
#define EVENTS_LOST_RATE_LIMITED 1 /* over the per-CPU event rate */
#define EVENTS_LOST_MAX 2

/* Verdicts of policy verdict events (event.verdict).
 * go:const Verdict VERDICT_ uint8 */
#define VERDICT_DENIED 0
#define VERDICT_ALLOWED 1
/* An audited policy would have denied the flow; it passed. */
#define VERDICT_AUDIT 2

/* Policy entry flags (policy_entry.flags): an endpoint under audited
 * policy has one trie per kind holding both views, the enforced one (its
 * rules alone) and the audit one (with the audited rules): each entry says
 * what each view has at its key. An entry without flags is an enforced
 * entry the audit view shares.
 * go:const PolicyFlag POLICY_F_ uint8 */
/* The enforced view has no entry here (only the audit view has one). */
#define POLICY_F_E_NONE 0x01
/* The audit view denies here (a deny rule). */
#define POLICY_F_A_DENY 0x02
/* The audit view has no entry here. */
#define POLICY_F_A_NONE 0x04

/* The protocol of the key that holds an endpoint's audit cookie for a
 * direction (in its any-identity trie, port 0): the rule named when the
 * audit view denies a flow because no rule allows it.
 * go:const PolicyAudit POLICY_AUDIT_ uint8 */
#define POLICY_AUDIT_COOKIE_PROTO 255

/* Service flags (lb_service.flags).
 * go:const SvcFlag SVC_F_ uint8 */
/* ClientIP session affinity: a client keeps its backend while it uses
 * it within the service's affinity timeout. */
#define SVC_F_AFFINITY 0x01
/* Backends are chosen by the flow's hash through the service's Maglev
 * table (tdr_lb_maglev_v1) instead of at random. */
#define SVC_F_MAGLEV 0x02
/* internalTrafficPolicy: Local: the slots hold only this node's backends
 * (the reconciler's job; the datapath reports it). */
#define SVC_F_INTERNAL_LOCAL 0x04
/* The frontend is translated per packet only, not at the socket (the
 * socket hooks leave it alone). */
#define SVC_F_NO_SOCKET_LB 0x08
/* The frontend answers clients outside the cluster arriving at the node's
 * devices (bpf_host.c, nodeport.h): NodePort, externalIPs, LoadBalancer. */
#define SVC_F_EXTERNAL 0x10
/* externalTrafficPolicy: Local: outside clients go to this node's
 * backends only, slots count+1..count+local_count, with their address
 * kept (no source NAT); none: dropped. */
#define SVC_F_EXT_LOCAL 0x20
/* loadBalancerSourceRanges: only clients in the frontend's ranges
 * (tdr_lb4_srcrange_v1, tdr_lb6_srcrange_v1) are admitted from outside. */
#define SVC_F_SOURCE_RANGES 0x40
/* A local redirect with skipRedirectFromBackend: a client whose network
 * namespace has an entry for the frontend in tdr_lb4_skip_v1 /
 * tdr_lb6_skip_v1 (one of the policy's own backend pods) is not
 * redirected (the entry's value, LB_SKIP_*, says where it goes instead).
 * Redirects are internal, so local_count (otherwise externalTrafficPolicy
 * Local's) counts the original Service's backends, in slots
 * count+1..count+local_count. Socket LB (tdr_lb4/6_skip_v1) and per packet (tdr_lb_skipsrc_v1). */
#define SVC_F_SKIP_BACKEND 0x80

/* Where a skipped client of a local redirect goes (value of
 * tdr_lb4_skip_v1 / tdr_lb6_skip_v1).
 * go:const LBSkip LB_SKIP_ uint8 */
/* To the Service's own backends (serviceMatcher): slots
 * count+1..count+local_count; none: refused as a Service without
 * backends. */
#define LB_SKIP_ORIGINAL 1
/* To the address itself, untranslated (addressMatcher). */
#define LB_SKIP_PASS 2

/* Backend states (lb_backend.state). Only active backends are in a
 * service's slots and Maglev table; a terminating or quarantined one is
 * still found by its ID (affinity, existing flows) but an affinity entry
 * naming it is not followed. A removed one (no service lists it any more)
 * is kept only for the open TCP connections of per-packet flows: a UDP
 * flow naming it picks a live backend again (the stale DNS server case).
 * go:const BackendState BACKEND_ uint8 describe */
#define BACKEND_ACTIVE 0 /* active */
#define BACKEND_TERMINATING 1 /* terminating */
#define BACKEND_QUARANTINED 2 /* quarantined */
#define BACKEND_REMOVED 3 /* removed */

/* Kinds of session affinity keys (lb_affinity_key.kind): the client's
 * address as the packet shows it, or, at the socket, its network
 * namespace's cookie (a pod is a network namespace; the source address is
 * not chosen yet at connect).
 * go:const AffinityBy AFFINITY_BY_ uint8 */
#define AFFINITY_BY_NETNS 1
#define AFFINITY_BY_V4 4
#define AFFINITY_BY_V6 6

/* Or'ed into the kind: the affinity of a client a local redirect skips
 * (skipRedirectFromBackend) to the original Service's backends, apart
 * from the redirect's own.
 * go:const Affinity AFFINITY_ uint8 */
#define AFFINITY_ORIGINAL 0x80

/* Directions of NAT entries (nat4_key.dir): the pod's tuple as it leaves
 * (egress, giving the node's address and port) and the node's tuple as a
 * reply arrives (ingress, giving the pod's).
 * go:const NATDir NAT_DIR_ uint8 */
#define NAT_DIR_EGRESS 1
#define NAT_DIR_INGRESS 2

/* NAT entry flags (nat4_entry.flags, nat6_entry.flags).
 * go:const NATFlag NAT_F_ uint8 */
/* A NodePort mapping (nodeport.h): an outside client's flow to a backend
 * on another node, source-NATed to this node; its replies get the
 * service frontend back as source too. */
#define NAT_F_NODEPORT 0x01

/* Host device flags (hostdev_info.flags).
 * go:const HostDevFlag HOSTDEV_F_ uint8 */
#define HOSTDEV_F_MASQ_V4 0x01 /* masquerade IPv4 pod traffic leaving here to ipv4 */
#define HOSTDEV_F_MASQ_V6 0x02 /* masquerade IPv6 pod traffic leaving here to ipv6 */

/* Load-balancing sizes: Maglev table entries per service (a prime: the
 * datapath's table size M; changing it is a layout change of
 * tdr_lb_maglev_v1); service, reverse NAT and backend IDs are below
 * LB_MAX_IDS (0 is none): a flow's reverse NAT ID travels in the upper 24
 * bits of ct_create's flags argument (conntrack.h). LB_MAP_MAX and
 * LB_SLOTS_MAP_MAX are the default capacities of the service, backend,
 * reverse NAT and Maglev maps and of the slots map: 100,000 services of 10
 * backends fit. The agent sizes them by flag (--bpf-lb-map-max,
 * --bpf-lb-slots-map-max); a capacity is no layout: a pin of another
 * capacity is carried over into the new size at start.
 * go:const LB LB_ */
#define LB_MAGLEV_TABLE_SIZE 16381
#define LB_MAX_IDS 16777216
#define LB_MAP_MAX 131072
#define LB_SLOTS_MAP_MAX 1048576

/* Slots of an endpoint in tdr_policy_v2 (see policy_slot): one trie per
 * direction for entries of a given peer identity and one per direction for
 * entries of any identity.
 * go:const policy POLICY_ */
#define POLICY_SLOTS_PER_EP 4

#endif
