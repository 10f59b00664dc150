/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: the L2 announcements' responder map (arp.h answers
 * from it in the host device programs). Declared with every object's maps
 * (maps.h includes it) so that the pod datapath's loader creates and pins
 * it and user space (pkg/datapath/maps, pkg/agent/l2announcer)
 * writes it while no host program is loaded yet. */
#ifndef TDR_L2MAPS_H
#define TDR_L2MAPS_H

#include "common.h"

/* An address this node announces on one device: the ARP requests for it
 * arriving at that device are answered. */
struct l2_responder_v4_key {
	__u8 addr[4];   /* IPv4 address, network byte order */
	__u32 ifindex;  /* the device the requests arrive at */
};

struct l2_responder_entry {
	__u8 mac[ETH_ALEN]; /* the device's MAC: the answer's sender */
	__u8 pad[2];
	/* CLOCK_MONOTONIC ns (bpf_ktime_get_ns) after which the entry is no
	 * longer answered: the agent writes its lease's end and renews it
	 * while it holds the lease, so a node whose agent died stops
	 * answering once another node may have taken the address over. */
	__u64 expires;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct l2_responder_v4_key);
	__type(value, struct l2_responder_entry);
	__uint(max_entries, 4096);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tdr_l2_responder_v4 SEC(".maps");

#endif
