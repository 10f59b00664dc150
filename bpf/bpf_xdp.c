// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Tendril's XDP prefilter, attached to the node's host devices (the
 * agent's --devices, or the default routes' devices) with
 * --enable-xdp-prefilter: a frame whose IPv4 or IPv6 source is in the
 * deny list (lib/prefilter.h, managed with PATCH/DELETE /v1/prefilter) is
 * dropped before the stack allocates an skb for it, so neither the host
 * device programs (bpf_host.c, tc) nor the host stack ever see it; every
 * drop is counted per CPU. Everything else passes untouched. Its links are
 * pinned, so the list keeps dropping while the agent restarts.
 *
 * tc_prefilter is the same check as a tc program: not attached by the
 * agent, it is the baseline of the prefilter's benchmark (the same drop one
 * layer later, bench/ and pkg/datapath/prefilter). */
#include "lib/common.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#include "lib/prefilter.h"

SEC("xdp")
int xdp_prefilter(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;

	if (prefilter_denied(data, end))
		return XDP_DROP;
	return XDP_PASS;
}

SEC("tc")
int tc_prefilter(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;

	if (prefilter_denied(data, end))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

/* Keep the key and counter types in BTF for bpf2go. */
const struct prefilter4_key *unused_prefilter4_key __attribute__((unused));
const struct prefilter6_key *unused_prefilter6_key __attribute__((unused));
const struct prefilter_stat *unused_prefilter_stat __attribute__((unused));
