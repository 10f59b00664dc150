/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: what every program and header needs: the kernel and
 * libbpf headers, the values shared with user space (enums.h), protocol
 * constants and small helpers. The layout of the header directory is in
 * docs/datapath.md. */
#ifndef TDR_COMMON_H
#define TDR_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "enums.h"

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define TC_ACT_REDIRECT 7

#define ETH_HLEN 14
#define ETH_ALEN 6
#define ETH_P_IP 0x0800
#define ETH_P_ARP 0x0806
#define ETH_P_IPV6 0x86DD

#define IPPROTO_ICMP_ 1
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define IPPROTO_ICMPV6_ 58
#define IPPROTO_SCTP_ 132

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

/* Reserved identities (see pkg/identity). */
#define ID_ANY 0
#define ID_HOST 1
#define ID_WORLD 2
#define ID_WORLD_IPV4 9
#define ID_WORLD_IPV6 10
/* Node-local identities (CIDR identities) carry this bit. */
#define ID_LOCAL_SCOPE (1U << 24)

#define NSEC_PER_SEC 1000000000ULL

/* barrier keeps clang from merging calls of two branches into one call
 * with the map chosen at run time: the verifier inlines a map lookup only
 * where the map is known, and calls the generic helper (an indirect call)
 * elsewhere. */
#define barrier() asm volatile("" ::: "memory")

static __always_inline __be16 be16_at(const __u8 *b)
{
	__be16 v;
	__builtin_memcpy(&v, b, 2);
	return v;
}

static __always_inline __u32 u32_at(const __u8 *b)
{
	__u32 v;
	__builtin_memcpy(&v, b, 4);
	return v;
}

#endif
