/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the ARP responder of L2 announcements, run by the host
 * device programs' ingress (from_netdev): an ARP request for an address
 * this node announces on the device it arrived at (tdr_l2_responder_v4,
 * l2maps.h) is turned into the reply, in place, and sent back out of the
 * same device. Any other frame is left to the host. */
#ifndef TDR_ARP_H
#define TDR_ARP_H

#include "common.h"
#include "pkt.h"
#include "l2maps.h"

#define ARP_HLEN 28 /* Ethernet/IPv4 ARP */
#define ARPHRD_ETHER_ 1
#define ARPOP_REQUEST_ 1
#define ARPOP_REPLY_ 2

/* Offsets in the frame: the ARP header follows Ethernet. */
#define ARP_OFF_OP (ETH_HLEN + 6)
#define ARP_OFF_SHA (ETH_HLEN + 8)
#define ARP_OFF_SPA (ETH_HLEN + 14)
#define ARP_OFF_THA (ETH_HLEN + 18)
#define ARP_OFF_TPA (ETH_HLEN + 24)

/* arp_respond answers the frame when it is an ARP request for an announced
 * address of this device: TC_ACT_REDIRECT (the reply goes out of the
 * device), or TC_ACT_OK when the frame is not ours to answer. */
static __always_inline int arp_respond(struct __sk_buff *skb)
{
	void *data = skb_data(skb);
	void *end = skb_data_end(skb);
	if (data + ETH_HLEN + ARP_HLEN > end) {
		if (skb->len < ETH_HLEN + ARP_HLEN || bpf_skb_pull_data(skb, ETH_HLEN + ARP_HLEN))
			return TC_ACT_OK;
		data = skb_data(skb);
		end = skb_data_end(skb);
		if (data + ETH_HLEN + ARP_HLEN > end)
			return TC_ACT_OK;
	}
	__u8 *f = data;
	/* Ethernet hardware, IPv4 protocol, 6- and 4-byte addresses, a
	 * request: anything else (replies, other kinds) is the host's. */
	if (be16_at(&f[ETH_HLEN]) != bpf_htons(ARPHRD_ETHER_) || be16_at(&f[ETH_HLEN + 2]) != bpf_htons(ETH_P_IP) ||
	    f[ETH_HLEN + 4] != ETH_ALEN || f[ETH_HLEN + 5] != 4 || be16_at(&f[ARP_OFF_OP]) != bpf_htons(ARPOP_REQUEST_))
		return TC_ACT_OK;
	struct l2_responder_v4_key k = {.ifindex = skb->ifindex};
	__builtin_memcpy(k.addr, &f[ARP_OFF_TPA], 4);
	/* A gratuitous request (sender == target) announces the sender's
	 * own address: another host's claim, not a question to answer. */
	if (u32_at(&f[ARP_OFF_SPA]) == u32_at(k.addr))
		return TC_ACT_OK;
	const struct l2_responder_entry *e = bpf_map_lookup_elem(&tdr_l2_responder_v4, &k);
	if (!e || bpf_ktime_get_ns() > e->expires)
		return TC_ACT_OK;
	__u8 mac[ETH_ALEN];
	__builtin_memcpy(mac, e->mac, ETH_ALEN);

	/* The reply: to the asker, from the device, with the asked address
	 * as sender. The request's sender fields become the target's. */
	__u8 sha[ETH_ALEN];
	__u8 spa[4];
	__builtin_memcpy(sha, &f[ARP_OFF_SHA], ETH_ALEN);
	__builtin_memcpy(spa, &f[ARP_OFF_SPA], 4);
	__builtin_memcpy(&f[0], sha, ETH_ALEN);
	__builtin_memcpy(&f[ETH_ALEN], mac, ETH_ALEN);
	f[ARP_OFF_OP] = 0;
	f[ARP_OFF_OP + 1] = ARPOP_REPLY_;
	__builtin_memcpy(&f[ARP_OFF_SHA], mac, ETH_ALEN);
	__builtin_memcpy(&f[ARP_OFF_SPA], k.addr, 4);
	__builtin_memcpy(&f[ARP_OFF_THA], sha, ETH_ALEN);
	__builtin_memcpy(&f[ARP_OFF_TPA], spa, 4);
	return bpf_redirect(skb->ifindex, 0);
}

#endif
