/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the host firewall: the node's own traffic at its
 * uplinks (bpf_host.c), checked against the host endpoint's policy.
 *
 * The host endpoint has endpoint ID 0, which no pod gets (IDs are 1..4095):
 * its policy is the endpoint-0 tries of tdr_policy_v2 (the host policy
 * map), its enforcement and audit flags are in slot 0 of tdr_ep_id_v1 (an
 * endpoint_info with identity ID_HOST; endpoint_by_id never returns slot
 * 0, so no pod path sees it). The agent writes both; they are pinned, so
 * the firewall keeps enforcing while the agent is down. Slot 0 with no
 * flags (the default, and --enable-host-firewall=false) checks nothing.
 *
 * Ingress: a packet to an address the ipcache gives ID_HOST, that is no
 * reply of a masqueraded or service flow (those are the pods', decided by
 * their own policy), before any service translation: a NodePort is a port
 * of the node. Egress: a packet from a node address, unless it belongs to
 * a NAT mapping (a service flow the node forwards with its address). Every
 * IP protocol is checked (TCP, UDP, SCTP and ICMP(v6) by port or type, the
 * others by their peer alone: an L3 rule admits them, a port rule does
 * not), so a policy that enforces a direction leaves no protocol open.
 * What passes unchecked (hostfw_exempt): ARP, ICMP errors (each quotes a
 * flow; without them path MTU discovery breaks), ICMPv6 neighbour
 * discovery and multicast listener messages (IPv6 does not work without
 * them), and later fragments (no ports to decide on; the first fragment
 * was decided, and the stack drops fragments it cannot reassemble).
 *
 * Both directions share conntrack (conntrack.h) with the marker
 * HOSTFW_CT_ID on the node's side of the key: a flow admitted one way has
 * its replies pass the other, whichever direction enforces. Every flow is
 * tracked once either direction is enforced or audited, so a connection
 * the node opens gets its replies in under an ingress-only policy. */
#ifndef TDR_HOSTFW_H
#define TDR_HOSTFW_H

#include "maps.h"
#include "pkt.h"
#include "events.h"
#include "ipcache.h"
#include "conntrack.h"
#include "policy.h"
#include "nat.h"

/* The host endpoint's ID in the policy map and its events. */
#define HOST_EP_ID 0
/* The host's side of a conntrack entry it admitted: no endpoint ID (those
 * end at EP_ID_SLOTS - 1), never 0 (a remote side). */
#define HOSTFW_CT_ID 0xffff

#define HOSTFW_FLAGS (EP_ENFORCE_INGRESS | EP_ENFORCE_EGRESS | EP_AUDIT_INGRESS | EP_AUDIT_EGRESS)

/* hostfw_ep is the host endpoint when the host firewall checks anything,
 * else NULL. */
static __always_inline const struct endpoint_info *hostfw_ep(void)
{
	__u32 k = HOST_EP_ID;
	const struct endpoint_info *h = bpf_map_lookup_elem(&tdr_ep_id_v1, &k);

	if (!h || h->identity != ID_HOST || !(h->flags & HOSTFW_FLAGS))
		return NULL;
	return h;
}

/* hostfw_nat_mapped reports whether the egress packet belongs to a NAT
 * mapping: the reply of its flow would be translated back (nodeport SNAT
 * of a service flow the node forwards). */
static __always_inline int hostfw_nat_mapped(const struct pkt *p)
{
	if (p->family == FAMILY_V4) {
		struct nat4_key k;
		nat_key(&k, FAMILY_V4, NAT_DIR_INGRESS, p->saddr, p->sport, p->daddr, p->dport, p->proto);
		return bpf_map_lookup_elem(&tdr_nat4_v1, &k) != NULL;
	}
	struct nat6_key k;
	nat_key(&k, FAMILY_V6, NAT_DIR_INGRESS, p->saddr, p->sport, p->daddr, p->dport, p->proto);
	return bpf_map_lookup_elem(&tdr_nat6_v1, &k) != NULL;
}

/* hostfw_exempt reports whether the packet passes the host firewall
 * unchecked (see the top of this file). */
static __always_inline int hostfw_exempt(const struct pkt *p)
{
	return p->nonfirst_frag || p->icmp_error || p->ndp || p->arp;
}

/* hostfw_unparsed decides a packet the parser refused with reason, at
 * an ingress the host firewall guards (an uplink, the WireGuard device):
 * an IP packet it could not read (REASON_MALFORMED: say an IPv6 packet
 * with more extension headers than the parser walks, its TCP header behind
 * them; REASON_TRUNCATED: say a first fragment too short to hold its L4
 * header) is dropped and counted with that reason while the host endpoint
 * enforces ingress, since no policy can be decided on it and the stack
 * would deliver it to the node's sockets; before, it passed unchecked.
 * Anything else passes as before: a frame of no IP family (the host's
 * business: LLDP, ...) and everything while ingress is not enforced. */
static __always_inline int hostfw_unparsed(int reason, const struct pkt *p)
{
	if (reason != REASON_MALFORMED && reason != REASON_TRUNCATED)
		return TC_ACT_OK;
	const struct endpoint_info *h = hostfw_ep();
	if (!h || !enforced(h, DIR_INGRESS))
		return TC_ACT_OK;
	count((__u8)reason, DIR_INGRESS, p->len);
	return TC_ACT_SHOT;
}

/* hostfw decides a packet at an uplink for the host endpoint, dir
 * DIR_INGRESS (arriving) or DIR_EGRESS (leaving): 0 to pass (not the
 * node's own traffic, a known flow, or admitted), -1 when its policy
 * drops it (counted and reported by policy()). A global function,
 * verified on its own. */
__attribute__((noinline)) int hostfw(__u32 dir, const struct pkt *p)
{
	if (!p)
		return 0;
	const struct endpoint_info *h = hostfw_ep();
	if (!h)
		return 0;
	if (identity_of(p->family, dir == DIR_INGRESS ? p->daddr : p->saddr) != ID_HOST)
		return 0;
	if (dir == DIR_EGRESS && hostfw_nat_mapped(p))
		return 0;
	struct flow f;
	flow_of(&f, p);
	__u8 is_a = ep_is_a(&f, dir, p);
	struct ct_entry *e = ct_find(&f, p);
	if (ct_classify(e, &f, p, HOSTFW_CT_ID, is_a) != CT_NEW) {
		ct_update(e, &f, p);
		return 0;
	}
	if ((enforced(h, dir) || audited(h, dir)) && policy(h, dir, p, 0))
		return -1;
	if (e) {
		ct_admit(e, is_a, HOSTFW_CT_ID);
		ct_update(e, &f, p);
		return 0;
	}
	/* The peer's side is not local: it is never a pod (those reach the
	 * node through their veth, not the uplink). */
	if (is_a)
		ct_create(&f, p, HOSTFW_CT_ID, 0, CT_F_B_NOT_LOCAL);
	else
		ct_create(&f, p, 0, HOSTFW_CT_ID, CT_F_A_NOT_LOCAL);
	return 0;
}

#endif
