// SPDX-License-Identifier: MIT
/* USDT side of the trajectory recorder: route and pager probes -> ring records, pinned counts. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

#include "maps.bpf.h"

/* Tokens whose last routed layer is remembered; more in flight than this lose transitions. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct traj_token_key);
	__type(value, struct traj_token_state);
} token_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct traj_hist_key);
	__type(value, struct traj_hist);
} fault_latency SEC(".maps");

/* Per-CPU scratch: a route record is too big for the 512-byte BPF stack. */
struct route_scratch {
	struct traj_event ev;
	struct traj_token_state st;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct route_scratch);
} scratch SEC(".maps");

static const struct traj_hist zero_hist;


/*
 * Masks n so the verifier sees its bound: the compiler drops a range check
 * it has already proven and may reuse the untruncated register.
 */
static __always_inline __u32 verifier_bound(__u32 n, __u32 mask)
{
	asm volatile("" : "+r"(n));
	return n & mask;
}

struct count_ctx {
	struct route_scratch *s;
	struct traj_token_state *prev;
};

static long count_expert(__u32 i, void *arg)
{
	struct count_ctx *c = arg;
	struct traj_expert_stats *v;

	if (i >= TRAJ_MAX_K)
		return 1;
	v = expert_entry(c->s->ev.layer, c->s->ev.ids[verifier_bound(i, TRAJ_MAX_K - 1)]);
	if (v)
		__sync_fetch_and_add(&v->routed, 1);
	return 0;
}

/* Pair n of the previous layer's k x this layer's k. */
static long count_transition(__u32 n, void *arg)
{
	struct count_ctx *c = arg;
	__u32 k = c->s->ev.k, i, j;
	struct traj_trans_count *v;

	if (!k)
		return 1;
	i = n / k;
	j = n % k;
	if (i >= TRAJ_MAX_K || j >= TRAJ_MAX_K)
		return 1;
	i = verifier_bound(i, TRAJ_MAX_K - 1);
	j = verifier_bound(j, TRAJ_MAX_K - 1);
	v = trans_entry(c->prev->layer, c->prev->ids[i], c->s->ev.ids[j]);
	if (v)
		__sync_fetch_and_add(&v->routed, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(route, __u32 request, __u32 token, __u32 layer, __u32 k, const __u32 *ids,
	     const float *weights)
{
	struct traj_token_key tk = { .request = request, .token = token };
	struct count_ctx c = {};
	struct route_scratch *s;
	__u32 zero = 0;

	s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s)
		return 0;
	if (k == 0 || k > TRAJ_MAX_K ||
	    bpf_probe_read_user(s->ev.ids, verifier_bound(k, 2 * TRAJ_MAX_K - 1) * sizeof(__u32),
				ids)) {
		__sync_fetch_and_add(&counters.bad_args, 1);
		return 0;
	}
	s->ev.flags = 0;
	if (weights && !bpf_probe_read_user(s->ev.weights, verifier_bound(k, TRAJ_MAX_K * 2 - 1) *
					    sizeof(float), weights))
		s->ev.flags = TRAJ_F_WEIGHTS;
	s->ev.ts_ns = bpf_ktime_get_ns();
	s->ev.value = 0;
	s->ev.kind = TRAJ_ROUTE;
	s->ev.tid = (__u32)bpf_get_current_pid_tgid();
	s->ev.request = request;
	s->ev.token = token;
	s->ev.layer = layer;
	s->ev.expert = TRAJ_NONE;
	s->ev.tier = 0;
	s->ev.err = 0;
	s->ev.k = k;

	c.s = s;
	bpf_loop(k, count_expert, &c, 0);

	/* Prompt tokens of a batch share the token id TRAJ_NONE: no per-token transitions. */
	if (token == TRAJ_NONE)
		goto emit;
	c.prev = bpf_map_lookup_elem(&token_state, &tk);
	if (c.prev && c.prev->layer + 1 == layer && c.prev->k <= TRAJ_MAX_K)
		bpf_loop(c.prev->k * k, count_transition, &c, 0);

	s->st.layer = layer;
	s->st.k = k;
	__builtin_memcpy(s->st.ids, s->ev.ids, sizeof(s->st.ids));
	bpf_map_update_elem(&token_state, &tk, &s->st, BPF_ANY);
emit:
	/* Counts above stay exact when the ring is full; only the record is lost. */
	if (bpf_ringbuf_output(&events, &s->ev, sizeof(s->ev), 0))
		__sync_fetch_and_add(&counters.dropped, 1);
	else
		__sync_fetch_and_add(&counters.events, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(prefill, __u32 request, __u32 first, __u32 n)
{
	emit_small_req(TRAJ_PREFILL, request, first, TRAJ_NONE, TRAJ_NONE, 0, 0, n);
	return 0;
}

SEC("usdt")
int BPF_USDT(fault_begin, __u32 layer, __u32 expert, __u32 tier, __u64 addr)
{
	emit_small(TRAJ_FAULT_BEGIN, layer, expert, tier, 0, addr);
	return 0;
}

/* floor(log2(v)) by halving: clang 14's BPF backend has no count-leading-zeros. */
static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0, shift;

	shift = (v > 0xffffffffull) << 5;
	v >>= shift;
	r |= shift;
	shift = (v > 0xffff) << 4;
	v >>= shift;
	r |= shift;
	shift = (v > 0xff) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xf) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	return r | (__u32)(v >> 1);
}

static __always_inline void hist_add(__u32 tier, __u64 ns)
{
	struct traj_hist_key key = { .tier = tier };
	struct traj_hist *h;
	__u32 slot;

	h = bpf_map_lookup_elem(&fault_latency, &key);
	if (!h) {
		bpf_map_update_elem(&fault_latency, &key, &zero_hist, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&fault_latency, &key);
		if (!h)
			return;
	}
	slot = log2_u64(ns);
	if (slot >= TRAJ_HIST_SLOTS)
		slot = TRAJ_HIST_SLOTS - 1;
	__sync_fetch_and_add(&h->slots[slot], 1);
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, ns);
}

SEC("usdt")
int BPF_USDT(fault_done, __u32 layer, __u32 expert, __u32 tier, __u64 latency_ns, __s32 err)
{
	struct traj_expert_stats *v = expert_entry(layer, expert);

	if (v)
		__sync_fetch_and_add(&v->demand_faults, 1);
	hist_add(tier, latency_ns);
	emit_small(TRAJ_FAULT_DONE, layer, expert, tier, err, latency_ns);
	return 0;
}

SEC("usdt")
int BPF_USDT(prefetch_issue, __u32 layer, __u32 expert, __u32 tier)
{
	emit_small(TRAJ_PREFETCH_ISSUE, layer, expert, tier, 0, 0);
	return 0;
}

SEC("usdt")
int BPF_USDT(prefetch_done, __u32 layer, __u32 expert, __u32 tier, __u64 latency_ns, __s32 err)
{
	struct traj_expert_stats *v = expert_entry(layer, expert);

	if (v && !err)
		__sync_fetch_and_add(&v->prefetches, 1);
	emit_small(TRAJ_PREFETCH_DONE, layer, expert, tier, err, latency_ns);
	return 0;
}

SEC("usdt")
int BPF_USDT(evict, __u32 layer, __u32 expert, __u64 bytes)
{
	struct traj_expert_stats *v = expert_entry(layer, expert);

	if (v)
		__sync_fetch_and_add(&v->evictions, 1);
	emit_small(TRAJ_EVICT, layer, expert, 0, 0, bytes);
	return 0;
}

/* A pager opened an expert range: its page faults are attributed from now on. */
SEC("usdt")
int BPF_USDT(region, __u64 id, __u64 base, __u64 slot_bytes, __u32 slots_per_layer,
	     __u32 layers, __u32 experts)
{
	struct traj_region r = {
		.base = base, .slot_bytes = slot_bytes, .slots_per_layer = slots_per_layer,
		.layers = layers, .experts = experts,
	};

	if (id == TRAJ_REGION_EXPLICIT || !slot_bytes || !slots_per_layer || !layers) {
		__sync_fetch_and_add(&counters.bad_args, 1);
		return 0;
	}
	if (bpf_map_update_elem(&regions, &id, &r, BPF_ANY))
		__sync_fetch_and_add(&counters.regions_full, 1);
	else
		__sync_fetch_and_add(&counters.regions, 1);
	return 0;
}

/* ... and closed it: the addresses may be reused by anything. */
SEC("usdt")
int BPF_USDT(region_close, __u64 id, __u64 base)
{
	if (id != TRAJ_REGION_EXPLICIT)
		bpf_map_delete_elem(&regions, &id);
	return 0;
}

/* GPL-compatible so the kernel allows bpf_probe_read_user(); the source itself is MIT. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";
