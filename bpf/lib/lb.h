/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Tendril datapath: service load-balancing: frontend lookup, backend
 * selection (random among the active slots, or through the service's
 * Maglev table by the flow's hash; ClientIP session affinity over either)
 * and reverse NAT lookups. Used by the socket hooks (bpf_sock.c) and the
 * per-packet translation of the pod programs. The maps are in lbmaps.h. */
#ifndef TDR_LB_H
#define TDR_LB_H

#include "maps.h"

/* The flow hash: each 32-bit word (read in host byte order from the
 * bytes the datapath holds) is folded in with the murmur3 finalizer.
 * pkg/datapath/maps computes the same (LBHash), so a test or a tool can
 * tell which Maglev entry a flow uses. */
#define LB_HASH_SEED 0x7d5b3c1fU

static __always_inline __u32 lb_mix(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6bU;
	h ^= h >> 13;
	h *= 0xc2b2ae35U;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 lb_hash_word(__u32 h, __u32 w)
{
	return lb_mix(h ^ w);
}

/* lb_hash_cookie is the hash of a socket, by its cookie (the socket hooks:
 * the source port is not chosen yet at connect). */
static __always_inline __u32 lb_hash_cookie(__u64 cookie)
{
	__u32 h = lb_hash_word(LB_HASH_SEED, (__u32)cookie);
	return lb_hash_word(h, (__u32)(cookie >> 32));
}

static __always_inline const struct lb_service *lb4_lookup(const __u8 *addr, __be16 port, __u8 proto)
{
	struct lb4_key k = {.port = port, .proto = proto};

	__builtin_memcpy(k.addr, addr, 4);
	return bpf_map_lookup_elem(&tdr_lb4_services_v1, &k);
}

static __always_inline const struct lb_service *lb6_lookup(const __u8 *addr, __be16 port, __u8 proto)
{
	struct lb6_key k = {.port = port, .proto = proto};

	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&tdr_lb6_services_v1, &k);
}

/* lb_select_id chooses a backend ID for a new flow of svc: with
 * SVC_F_MAGLEV the entry of the flow's hash in the service's Maglev table
 * (a service without its table yet falls back to random), otherwise a
 * random slot among 1..count. 0: none. */
static __always_inline __u32 lb_select_id(const struct lb_service *svc, __u32 hash)
{
	__u32 count = svc->count;

	if (!count)
		return 0;
	if (svc->flags & SVC_F_MAGLEV) {
		__u32 sid = svc->svc_id;
		const struct lb_maglev *t = bpf_map_lookup_elem(&tdr_lb_maglev_v1, &sid);
		if (t) {
			__u32 i = hash % LB_MAGLEV_TABLE_SIZE;
			/* clang knows i is in range and drops the check; the
			 * verifier does not track the modulo (it sees div, mul,
			 * sub) and needs it: hide i from clang. */
			asm volatile("" : "+r"(i));
			if (i < LB_MAGLEV_TABLE_SIZE)
				return t->backend_ids[i];
			return 0;
		}
	}
	struct lb_slot_key k = {.svc_id = svc->svc_id, .slot = bpf_get_prandom_u32() % count + 1};
	__u32 *id = bpf_map_lookup_elem(&tdr_lb_slots_v1, &k);
	return id ? *id : 0;
}

/* lb_original_id is a random one of the original Service's backends of a
 * local redirect (SVC_F_SKIP_BACKEND: slots count+1..count+local_count),
 * for a client the redirect skips. 0: none. Maglev is not applied to
 * them: a skipped client is a pod of the node, and Maglev's consistency
 * across nodes is for clients from outside. */
static __always_inline __u32 lb_original_id(const struct lb_service *svc)
{
	__u32 n = svc->local_count;

	if (!n)
		return 0;
	struct lb_slot_key k = {.svc_id = svc->svc_id, .slot = svc->count + bpf_get_prandom_u32() % n + 1};
	__u32 *bid = bpf_map_lookup_elem(&tdr_lb_slots_v1, &k);
	return bid ? *bid : 0;
}

/* lb_pick_in chooses the backend of a new flow of svc from a client (ak,
 * its service ID filled in here): the client's affinity backend when the
 * service has affinity, the client used it within the timeout and it is
 * still active; otherwise lb_select_id's (original: lb_original_id's),
 * recorded as the client's affinity. A skipped client's affinity is kept
 * apart from the redirected clients' (AFFINITY_ORIGINAL in the key's
 * kind): a pod that stops being one of the redirect's backends must not
 * follow an affinity to the original Service's backends, nor the other
 * way round to itself. Returns the backend and its ID in *id, or NULL
 * when there is no backend (no slot, or a slot or table entry naming a
 * backend that does not exist). */
static __always_inline const struct lb_backend *lb_pick_in(const struct lb_service *svc, struct lb_affinity_key *ak,
							    __u32 hash, __u32 *id, const __u8 original)
{
	const struct lb_backend *be = NULL;
	__u8 affinity = svc->flags & SVC_F_AFFINITY;
	__u64 now = 0;
	__u32 bid = 0;

	if (original ? !svc->local_count : !svc->count)
		return NULL;
	if (affinity) {
		now = bpf_ktime_get_coarse_ns();
		ak->svc_id = svc->svc_id;
		if (original)
			ak->kind |= AFFINITY_ORIGINAL;
		struct lb_affinity *a = bpf_map_lookup_elem(&tdr_lb_affinity_v1, ak);
		if (a && now - a->last_used <= (__u64)svc->affinity_timeout * NSEC_PER_SEC) {
			bid = a->backend_id;
			be = bpf_map_lookup_elem(&tdr_lb_backends_v1, &bid);
			if (be && be->state != BACKEND_ACTIVE)
				be = NULL;
		}
	}
	if (!be) {
		bid = original ? lb_original_id(svc) : lb_select_id(svc, hash);
		if (!bid)
			return NULL;
		be = bpf_map_lookup_elem(&tdr_lb_backends_v1, &bid);
		if (!be)
			return NULL;
	}
	if (affinity) {
		struct lb_affinity v = {.last_used = now, .backend_id = bid};
		bpf_map_update_elem(&tdr_lb_affinity_v1, ak, &v, BPF_ANY);
	}
	*id = bid;
	return be;
}

/* lb_pick is lb_pick_in for a client the frontend's backends serve. */
static __always_inline const struct lb_backend *lb_pick(const struct lb_service *svc, struct lb_affinity_key *ak,
							 __u32 hash, __u32 *id)
{
	return lb_pick_in(svc, ak, hash, id, 0);
}

/* lb_pick_original is lb_pick_in for a client a local redirect skips
 * (LB_SKIP_ORIGINAL): the original Service's backends, with its session
 * affinity. */
static __always_inline const struct lb_backend *lb_pick_original(const struct lb_service *svc, struct lb_affinity_key *ak,
								  __u32 *id)
{
	return lb_pick_in(svc, ak, 0, id, 1);
}

#endif
