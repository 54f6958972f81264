// SPDX-License-Identifier: MIT
/* Page-fault side of the trajectory recorder: user faults in the range -> (layer, expert). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "maps.bpf.h"

/* Set through rodata before load: the verifier sees a constant. */
const volatile __u32 targ_tgid;

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct traj_thread_state);
} thread_state SEC(".maps");

struct find_ctx {
	__u64 addr;
	__u32 layer;
	__u32 expert;
	bool found;
};

/* bpf_for_each_map_elem callback: stops at the range holding c->addr. */
static long find_range(struct bpf_map *map, const __u64 *id, const struct traj_region *r,
		       struct find_ctx *c)
{
	__u64 slot;

	if (c->addr < r->base || !r->slot_bytes || !r->slots_per_layer)
		return 0;
	slot = (c->addr - r->base) / r->slot_bytes;
	if (slot >= (__u64)r->layers * r->slots_per_layer)
		return 0;
	c->layer = (__u32)(slot / r->slots_per_layer);
	c->expert = (__u32)(slot % r->slots_per_layer);
	c->found = true;
	return 1;
}

SEC("tp_btf/page_fault_user")
int BPF_PROG(page_fault_user, unsigned long address, struct pt_regs *regs,
	     unsigned long error_code)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid, layer, expert;
	struct find_ctx c = { .addr = address };
	struct traj_thread_state *last, now;
	struct traj_expert_stats *v;
	struct traj_trans_count *t;

	if ((__u32)(pid_tgid >> 32) != targ_tgid)
		return 0;
	/* A few ranges (one per open model): a walk is cheaper than any index. */
	bpf_for_each_map_elem(&regions, find_range, &c, 0);
	if (!c.found)
		return 0;
	layer = c.layer;
	expert = c.expert;

	v = expert_entry(layer, expert);
	if (v)
		__sync_fetch_and_add(&v->page_faults, 1);

	last = bpf_map_lookup_elem(&thread_state, &tid);
	if (last && last->layer + 1 == layer) {
		t = trans_entry(last->layer, last->expert, expert);
		if (t)
			__sync_fetch_and_add(&t->faulted, 1);
	}
	now.layer = layer;
	now.expert = expert;
	bpf_map_update_elem(&thread_state, &tid, &now, BPF_ANY);

	emit_small(TRAJ_PGFAULT, layer, expert, 0, 0, address);
	return 0;
}

/* GPL-compatible as the tracing helpers require; the source itself is MIT. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";
