/* SPDX-License-Identifier: MIT */
/*
 * The trace-driven cache simulator behind `moepager bench --simulate`, and
 * FineMoE's train/evaluate split of a trace. Benchmark tools use these; an
 * engine does not, so <moepager.h> does not include this header.
 */
#ifndef MOEPAGER_SIM_H
#define MOEPAGER_SIM_H

#include <moepager/common.h>
#include <moepager/prefetch.h>
#include <moepager/trace.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * FineMoE's split: the first round(fraction x requests) requests (at least
 * one, and at least one left) warm the policies, the others are evaluated;
 * a one-request trace is split by tokens. train and eval need requests + 1
 * entries each. Returns 0, or -EINVAL (fraction not in (0, 1), a trace of
 * one token).
 */
MP_API int mp_replay_split(const struct mp_trace *t, double fraction, struct mp_replay_seg *train,
			   uint32_t *ntrain, struct mp_replay_seg *eval, uint32_t *neval);

/*
 * The speculative gates of a trace position, for policies that use the
 * router's lookahead (nextlayer, finemoe+nextlayer): layer `target`'s
 * router (target > layer) applied to layer's FFN input as the model
 * computed it at that position, through target's FFN norm, a softmax over
 * the experts (what the prefetcher computes from the runner's gate op).
 * fn writes `experts` floats to out and returns 0, or -errno (the
 * simulation fails with it).
 */
struct mp_spec_source {
	int (*fn)(void *arg, uint32_t request, uint32_t token, uint32_t layer, uint32_t target,
		  float *out);
	void *arg;
};

/*
 * The simulator: a trace replayed against a cache of `capacity` experts on
 * a time model (loads on I/O channels, one unit of compute per expert FFN),
 * with a prefetch and an eviction policy. The first train_fraction of the
 * trace warms the policies; the rest is measured.
 */
struct mp_sim_config {
	const struct mp_trace *trace;
	double train_fraction;		/* 0: 0.7 */
	uint32_t capacity;		/* experts the cache holds (> topk) */
	const char *prefetch;		/* prefetch policy */
	const char *evict;		/* eviction policy */
	uint32_t distance;		/* 0: 3 */
	uint32_t emap_capacity;		/* 0: 1024 */
	double load_cost;		/* one expert load, in expert-FFN times; 0: 1 */
	double dense_cost;		/* non-expert work per layer, same unit; 0: 0.5 */
	uint32_t io_channels;		/* loads in flight; prefetches use all but one; 0: 1 */
	uint32_t max_tokens;		/* tokens evaluated per request at most; 0: all */
	bool no_admit;
	struct mp_sem_source sem;	/* semantic vectors of the trace's tokens; dim 0: none */
	/* Speculative gates of the evaluated positions; fn NULL: none (nextlayer does nothing). */
	struct mp_spec_source spec;
	MP_RESERVED(6);
};

struct mp_sim_result {
	uint64_t tokens;		/* evaluated */
	uint64_t uses;			/* routed experts touched */
	uint64_t hits;			/* resident when touched */
	uint64_t late;			/* prefetch still in flight when touched (a miss) */
	uint64_t demand_loads;
	uint64_t prefetch_emitted;	/* experts the policy asked for */
	uint64_t prefetch_loads;	/* prefetches that started a read */
	uint64_t prefetch_used;		/* of which used before eviction */
	uint64_t prefetch_wasted;	/* of which evicted unused */
	uint64_t prefetch_refused;	/* not issued: the victim was needed sooner */
	double time;			/* model time */
	double stall;			/* of which waiting for loads */
	uint64_t policy_ns;		/* CPU time in the prefetch policy while evaluating */
	/*
	 * Misses other than late ones: the expert's prefetch still queued
	 * (not started); predicted for this pass (its next use) and not
	 * queued: refused room, not issued, or evicted since; of those, ones
	 * whose prefetch was read and evicted unused since the expert's last
	 * use. The rest (uses - hits - late - both) were not predicted for
	 * their pass. Trace-truth runs count only the queued.
	 */
	uint64_t miss_queued, miss_predicted, miss_predicted_wasted;
	MP_RESERVED(4);
};

/* Returns 0, or -EINVAL (unknown policy, bad capacity or split) or -ENOMEM. */
MP_API int mp_prefetch_simulate(const struct mp_sim_config *cfg, struct mp_sim_result *out);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_SIM_H */
