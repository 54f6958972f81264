/* SPDX-License-Identifier: MIT */
/* Maps and helpers both BPF objects define alike; the loader makes pgfault reuse traj's maps. */
#ifndef MP_BPF_MAPS_BPF_H
#define MP_BPF_MAPS_BPF_H

#include "traj.h"

/* Sizes are defaults; the loader resizes before load. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct traj_expert_key);
	__type(value, struct traj_expert_stats);
} expert_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, struct traj_trans_key);
	__type(value, struct traj_trans_count);
} transitions SEC(".maps");

/* Expert ranges of the target: written by the region probes and the loader, read per fault. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TRAJ_MAX_REGIONS);
	__type(key, __u64);
	__type(value, struct traj_region);
} regions SEC(".maps");

struct traj_counters counters;

static const struct traj_expert_stats zero_stats;
static const struct traj_trans_count zero_trans;

/* The entry for key, created zeroed when missing (NULL only when the map is full). */
static __always_inline struct traj_expert_stats *expert_entry(__u32 layer, __u32 expert)
{
	struct traj_expert_key key = { .layer = layer, .expert = expert };
	struct traj_expert_stats *v;

	v = bpf_map_lookup_elem(&expert_stats, &key);
	if (v)
		return v;
	bpf_map_update_elem(&expert_stats, &key, &zero_stats, BPF_NOEXIST);
	return bpf_map_lookup_elem(&expert_stats, &key);
}

static __always_inline struct traj_trans_count *trans_entry(__u32 layer, __u32 from, __u32 to)
{
	struct traj_trans_key key = { .layer = layer, .from = from, .to = to };
	struct traj_trans_count *v;

	v = bpf_map_lookup_elem(&transitions, &key);
	if (v)
		return v;
	bpf_map_update_elem(&transitions, &key, &zero_trans, BPF_NOEXIST);
	return bpf_map_lookup_elem(&transitions, &key);
}

/* Submits a header-only record; counts it, or counts the drop when the ring is full. */
static __always_inline void emit_small_req(__u32 kind, __u32 request, __u32 token, __u32 layer,
					   __u32 expert, __u32 tier, __s32 err, __u64 value)
{
	struct traj_event *e;

	e = bpf_ringbuf_reserve(&events, TRAJ_EVENT_HDR_BYTES, 0);
	if (!e) {
		__sync_fetch_and_add(&counters.dropped, 1);
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->value = value;
	e->kind = kind;
	e->tid = (__u32)bpf_get_current_pid_tgid();
	e->request = request;
	e->token = token;
	e->layer = layer;
	e->expert = expert;
	e->tier = tier;
	e->err = err;
	e->k = 0;
	e->flags = 0;
	bpf_ringbuf_submit(e, 0);
	__sync_fetch_and_add(&counters.events, 1);
}

static __always_inline void emit_small(__u32 kind, __u32 layer, __u32 expert, __u32 tier,
				       __s32 err, __u64 value)
{
	emit_small_req(kind, TRAJ_NONE, TRAJ_NONE, layer, expert, tier, err, value);
}

#endif /* MP_BPF_MAPS_BPF_H */
