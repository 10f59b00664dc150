// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* A second datapath object, built only for the tests of pkg/datapath/bpf:
 * it includes the shared headers as the next programs (socket
 * load-balancing) will, and the test checks that loading it next to
 * bpf_lxc.c under the same BPF root gives it the same kernel maps. */
#include "lib/common.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#include "lib/maps.h"
#include "lib/pkt.h"
#include "lib/parse.h"
#include "lib/ipcache.h"

/* dst_identity returns the ipcache identity of the packet's destination
 * (a parse failure returns 0). */
SEC("tc")
int dst_identity(struct __sk_buff *skb)
{
	struct pkt p = {};

	if (parse(skb, &p) || p.arp)
		return 0;
	return identity_of(p.family, p.daddr);
}

/* connect4 looks the destination up as a socket hook would; it allows the
 * connection unless the destination has identity 0. It exists so that the
 * verifier checks the headers in a cgroup/connect4 program. */
SEC("cgroup/connect4")
int connect4(struct bpf_sock_addr *ctx)
{
	__u32 ip = ctx->user_ip4;
	__u32 id = identity_of(FAMILY_V4, (const __u8 *)&ip);

	return id != ID_ANY;
}
