/* SPDX-License-Identifier: MIT */
/* Records, map keys and values shared by the BPF programs and their loader (fixed-width only). */
#ifndef MP_BPF_TRAJ_H
#define MP_BPF_TRAJ_H

/* Same value as MP_MAX_TOPK and MP_TRAJ_MAX_K: a route record holds any valid top-k. */
#define TRAJ_MAX_K		64
/* log2(ns) slots: slot s counts latencies in [2^s, 2^(s+1)) ns; the last slot is open-ended. */
#define TRAJ_HIST_SLOTS		40
/* request/token of a record that has none (page faults, pager events). */
#define TRAJ_NONE		0xffffffffu

enum traj_kind {
	TRAJ_ROUTE = 1,
	TRAJ_PGFAULT = 2,
	TRAJ_FAULT_BEGIN = 3,
	TRAJ_FAULT_DONE = 4,
	TRAJ_PREFETCH_ISSUE = 5,
	TRAJ_PREFETCH_DONE = 6,
	TRAJ_EVICT = 7,
	TRAJ_PREFILL = 8,
};

/* traj_event.flags */
#define TRAJ_F_WEIGHTS		0x1	/* route: weights[] is valid */

/*
 * One ring-buffer record. Only route records carry ids[] and weights[];
 * the others are TRAJ_EVENT_HDR_BYTES long in the ring.
 */
struct traj_event {
	__u64 ts_ns;		/* CLOCK_MONOTONIC */
	/*
	 * pgfault/fault_begin: address; *_done: latency ns; evict: bytes;
	 * prefill: number of prompt positions from token.
	 */
	__u64 value;
	__u32 kind;		/* enum traj_kind */
	__u32 tid;
	__u32 request;
	__u32 token;
	__u32 layer;
	__u32 expert;		/* TRAJ_NONE for route records */
	__u32 tier;
	__s32 err;
	__u32 k;		/* route: number of ids */
	__u32 flags;
	__u32 ids[TRAJ_MAX_K];
	float weights[TRAJ_MAX_K];
};

#define TRAJ_EVENT_HDR_BYTES	56

/* Pinned as expert_stats. */
struct traj_expert_key {
	__u32 layer;
	__u32 expert;
};

struct traj_expert_stats {
	__u64 routed;		/* route probes naming this expert */
	__u64 page_faults;	/* user page faults inside its slot (pgfault program) */
	__u64 demand_faults;	/* fault_done probes */
	__u64 prefetches;	/* prefetch_done probes */
	__u64 evictions;	/* evict probes */
};

/* Pinned as transitions: expert `from` at `layer` followed by expert `to` at layer + 1. */
struct traj_trans_key {
	__u32 layer;
	__u32 from;
	__u32 to;
};

struct traj_trans_count {
	__u64 routed;	/* same generated (request, token): every pair of the top-ks */
	__u64 faulted;	/* same thread: last fault at layer, first fault at layer + 1 */
};

/* Pinned as fault_latency: one log2 histogram per tier, from fault_done. */
struct traj_hist_key {
	__u32 tier;
};

struct traj_hist {
	__u64 slots[TRAJ_HIST_SLOTS];
	__u64 count;
	__u64 sum_ns;
};

/* Last routed layer of a (request, token), to count transitions. */
struct traj_token_key {
	__u32 request;
	__u32 token;
};

struct traj_token_state {
	__u32 layer;
	__u32 k;
	__u32 ids[TRAJ_MAX_K];
};

/* Last faulting (layer, expert) of a thread. */
struct traj_thread_state {
	__u32 layer;
	__u32 expert;
};

/*
 * An expert range the page-fault program attributes, keyed by the pager's
 * range id (moepager:region, the target's mp_pager_ranges list); id 0 is an
 * explicit range given by the recorder's user.
 */
#define TRAJ_MAX_REGIONS	64
#define TRAJ_REGION_EXPLICIT	0

struct traj_region {
	__u64 base;
	__u64 slot_bytes;
	__u32 slots_per_layer;
	__u32 layers;
	__u32 experts;
	__u32 pad;
};

/* Counters in .bss, read by the loader. */
struct traj_counters {
	__u64 events;		/* records submitted to the ring */
	__u64 dropped;		/* records lost because the ring was full */
	__u64 bad_args;		/* route probes with k out of range or unreadable ids */
	__u64 regions;		/* region probes seen (ranges opened while attached) */
	__u64 regions_full;	/* region probes lost: TRAJ_MAX_REGIONS ranges already known */
};

#endif /* MP_BPF_TRAJ_H */
