/* SPDX-License-Identifier: MIT */
/*
 * The prefetcher: learns from the routing the engine reports (expert maps,
 * transition counts, activation matrices) and brings experts into a pager
 * before the engine touches them, from a thread of its own. The
 * trace-driven cache simulator has its own header, <moepager/sim.h>.
 * docs/prefetch.md describes the policies, the map store and its file.
 */
#ifndef MOEPAGER_PREFETCH_H
#define MOEPAGER_PREFETCH_H

#include <moepager/common.h>
#include <moepager/pager.h>
#include <moepager/trace.h>
#include <moepager/traj.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "none, nextlayer, eam, finemoe, dependency, oracle". */
MP_API const char *mp_prefetch_policy_names(void);
/* "lru, fifo, lfu, finemoe, coserve, belady". */
MP_API const char *mp_eviction_policy_names(void);
/*
 * Checks policy names (either may be NULL). Returns 0, or -EINVAL with a
 * message naming the unknown one and the known ones.
 */
MP_API int mp_prefetch_check_names(const char *prefetch, const char *eviction);

/*
 * Replay splits
 */

/* A run of tokens [begin, end) of one request of a trace. */
struct mp_replay_seg {
	uint32_t request;
	uint32_t begin;
	uint32_t end;
};

/*
 * Semantic vectors: FineMoE's context for the first d layers, one per
 * iteration, e.g. the model's embedding of the iteration's input token
 * (docs/prefetch.md, "Semantic context"). fn writes the dim floats of trace
 * token `token` of `request` to out and returns 0 or a negative errno, which
 * fails the training or simulation that asked. dim = 0: none, and the
 * previous iteration's expert map is the context instead.
 */
struct mp_sem_source {
	uint32_t dim;
	int (*fn)(void *arg, uint32_t request, uint32_t token, float *out);
	void *arg;
};

/*
 * The prefetcher
 */

struct mp_prefetcher;

/* Requests a prefetcher follows at once, at most (mp_prefetcher_config.requests). */
#define MP_PREFETCH_MAX_REQUESTS 256u

struct mp_prefetcher_config {
	/* Prefetch policy; NULL: $MOEPAGER_PREFETCH, else "none". */
	const char *policy;
	/* Prefetch distance d in layers; 0: 3. */
	uint32_t distance;
	/* Expert-map store records (finemoe); 0: 1024. */
	uint32_t emap_capacity;
	/*
	 * Expert-map file (finemoe): loaded at open when it exists, written at
	 * close, so a restarted engine keeps what it learned. May be NULL.
	 */
	const char *emap_path;
	/*
	 * The trace being replayed (borrowed): oracle reads its future, and the
	 * belady eviction its next uses (with mp_prefetcher_set_future()).
	 */
	const struct mp_trace *trace;
	/* Routing events queued between the engine and the thread (a power of two); 0: 1024. */
	uint32_t queue_events;
	/* Issue prefetches even when they would evict an expert predicted to be needed sooner. */
	bool no_admit;
	/*
	 * Semantic vectors (finemoe): sem.dim floats per iteration, given by
	 * mp_prefetcher_begin() (or by the runner through
	 * mp_prefetcher_source_ops(): the token's embedding, so sem.dim must be
	 * the model's hidden size); sem.fn gives them for trace tokens in
	 * mp_prefetcher_train(). sem.dim = 0: none. The queue keeps one vector
	 * per event slot: queue_events x sem.dim floats.
	 */
	struct mp_sem_source sem;
	/*
	 * Requests followed at once, each with its own trajectory (the
	 * sequences of a batch); routing of more requests takes over the least
	 * recently seen one's. Eviction hints combine them: an expert's hint is
	 * the probability that any of them uses it. 0: 1.
	 */
	uint32_t requests;
	uint32_t reserved32;		/* zero */
	MP_RESERVED(7);
};

/*
 * Starts a prefetcher over a pager (borrowed; it must outlive the
 * prefetcher): the policy, its thread, and the hints the pager's eviction
 * policy reads (finemoe's p, belady's next use). Returns 0 and sets *out, or
 * -EINVAL (unknown policy, oracle without a trace, a map file of another
 * geometry: the message says which), -ENOMEM, or the map file's read error.
 */
MP_API int mp_prefetcher_open(struct mp_pager *p, const struct mp_prefetcher_config *cfg,
			      struct mp_prefetcher **out);

/* Stops the thread, saves the map store when configured, frees. NULL is allowed. */
MP_API void mp_prefetcher_close(struct mp_prefetcher *pf);

/*
 * Starts iteration (request, token) with its semantic vector (sem.dim
 * floats, copied): finemoe predicts the first d layers from it before any
 * gate. Without it an iteration starts at its first gate. Never blocks, like
 * mp_prefetcher_gate(). Returns 0, -ENOSPC (dropped) or -EINVAL (no vector,
 * or the prefetcher was opened without sem.dim).
 */
MP_API int mp_prefetcher_begin(struct mp_prefetcher *pf, uint32_t request, uint32_t token,
			       const float *sem);

/*
 * Reports a layer's gate for (request, token): the k chosen ids and their
 * weights (may be NULL), the full softmax over the layer's experts when
 * known (probs, may be NULL), and the layer's normalised FFN input (x,
 * model-width floats, may be NULL: nextlayer speculates from it). Never
 * blocks: the event is queued for the thread, or dropped and counted when
 * the queue is full. Returns 0, -ENOSPC (dropped) or -EINVAL.
 */
MP_API int mp_prefetcher_gate(struct mp_prefetcher *pf, uint32_t request, uint32_t token,
			      uint32_t layer, const uint32_t *ids, const float *weights,
			      uint32_t k, const float *probs, const float *x);

/*
 * The trajectory feed as a source of gate events: an mp_traj_fn (arg = the
 * prefetcher) for mp_traj_poll(), so a thread polling an in-process
 * recorder or this process's BPF ring buffer drives the prefetcher. Route
 * records become gate events (prompt tokens, MP_TRAJ_NONE, are skipped);
 * other records are ignored. Always returns 0 (a dropped event is counted).
 */
MP_API int mp_prefetcher_traj_fn(const struct mp_traj_rec *r, void *arg);

/*
 * Warms the policy on trace tokens [begin, end) of request (no prefetch is
 * issued): FineMoE fills its map store this way, with the tokens' semantic
 * vectors from cfg->sem.fn when sem.dim is set. Runs on the caller's
 * thread; waits for queued events first. Returns 0, -EINVAL, or the error of
 * sem.fn.
 */
MP_API int mp_prefetcher_train(struct mp_prefetcher *pf, const struct mp_trace *t,
			       uint32_t request, uint32_t begin, uint32_t end);

/*
 * The order in which (request, token) pairs of cfg->trace will be replayed,
 * so the oracle and belady know the future across requests. n segments.
 * Returns 0, -EINVAL or -ENOMEM.
 */
MP_API int mp_prefetcher_set_future(struct mp_prefetcher *pf, const struct mp_replay_seg *segs,
				    uint32_t n);

/* mp_prefetcher_set_models(): one trajectory store for every model. */
#define MP_PREFETCH_ONE_STORE 1u

/*
 * Several models served over one pager (Multi-MoE, <moepager/multi.h>):
 * requests whose routed-id map (source op seq_map) is maps[x] are model
 * x's. Then:
 * - finemoe keeps a store per model, so a model's requests are predicted
 *   from its own trajectories only (the emap file and stats are model 0's
 *   store); with MP_PREFETCH_ONE_STORE in flags, one store learns them all;
 * - a request's eviction hints stay on its model's rows after it closes;
 * - the rows of the models with no request open get the hint p = 0, so a
 *   hint-reading eviction (finemoe) drops them before the running ones'.
 * maps are borrowed: they must outlive the prefetcher, or a call with
 * n = 0. Returns 0 or -EINVAL (n above 8, a NULL map, unknown flags).
 */
MP_API int mp_prefetcher_set_models(struct mp_prefetcher *pf,
				    const uint32_t *const *const *maps, uint32_t n,
				    unsigned flags);

/* Waits until every queued event is handled, or timeout_ms passes. Returns 0 or -ETIMEDOUT. */
MP_API int mp_prefetcher_flush(struct mp_prefetcher *pf, uint32_t timeout_ms);

/*
 * The runner's expert source for a prefetcher (ctx = the struct
 * mp_prefetcher *): the pager's, with every decode step's routing report
 * also fed to the prefetcher as a gate event, with the router's softmax and
 * input when the runner exports them (its gate op).
 */
MP_API const struct mp_expert_source_ops *mp_prefetcher_source_ops(void);

struct mp_prefetcher_stats {
	uint64_t events;		/* gate events handled */
	uint64_t dropped;		/* events lost to a full queue */
	uint64_t iterations;		/* token steps seen */
	uint64_t predicted;		/* experts the policy asked for */
	uint64_t issued;		/* of which queued by the pager (not resident or queued) */
	uint64_t expired;		/* queued prefetches dropped: their layer ran before */
	uint64_t policy_ns;		/* CPU time the thread spent in the policy and issuing */
	uint32_t emap_records;		/* finemoe: records in the map store */
	/*
	 * finemoe: the memory of its map stores (one per model) and of each
	 * followed request's query (rows and products, about L x J x 4 + C x 36 bytes
	 * or so each, allocated at the request's first search).
	 */
	uint64_t emap_bytes;
	/*
	 * One expert read over one layer's compute, as measured (0: not yet):
	 * finemoe prefetches an expert only when worth a read (docs/prefetch.md).
	 */
	float load_ratio;
	/*
	 * Of predicted and issued: rows past the model's experts (adapter rows,
	 * reached through a request's routed-id map, source op seq_map).
	 */
	uint64_t row_predicted, row_issued;
	/*
	 * Layer hints computed from a request with no routed-id map while
	 * the prefetcher serves mapped requests (a diagnostic).
	 */
	uint64_t hint_unmapped;
	MP_RESERVED(5);
};

MP_API void mp_prefetcher_stats(struct mp_prefetcher *pf, struct mp_prefetcher_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_PREFETCH_H */
