/* SPDX-License-Identifier: MIT */
/*
 * Prefetch policies: a small vtable fed the engine's routing as it happens
 * (iteration start, each layer's gate), answering with the experts to bring
 * in ahead of use and their priorities. One file per policy; pure logic: the
 * driver (prefetch/driver.c) or the simulator (sim/sim.c) issues the reads.
 * docs/prefetch.md describes each policy.
 */
#ifndef MP_PREFETCH_H
#define MP_PREFETCH_H

#include <stdbool.h>
#include <stdint.h>

#include <moepager/trace.h>

#include "prefetch/emap.h"

struct mp_prefetch_env {
	uint32_t layers;
	uint32_t experts;
	uint32_t topk;
	/* Prefetch distance d in layers (finemoe, eam, dependency, oracle); 0: 3. */
	uint32_t distance;
	/*
	 * Semantic vector length the driver passes to begin(); 0: none, and
	 * the previous iteration's expert map serves as the context instead
	 * (docs/prefetch.md, "Semantic context").
	 */
	uint32_t sem_dim;
	/* Expert-map store capacity (finemoe); 0: 1024. */
	uint32_t emap_capacity;
	/* The replayed trace (oracle only; borrowed). */
	const struct mp_trace *trace;
	/* Requests followed at once, each with its own trajectory; 0: 1. */
	uint32_t requests;
};

/* One expert to bring in: higher prio first. */
struct mp_prefetch_item {
	uint32_t layer;
	uint32_t expert;
	float p;	/* predicted probability of use */
	float prio;
};

struct mp_prefetch;

/*
 * One request's iteration state. A policy learns from every request (its
 * priv) but follows each request's trajectory on its own: the driver keeps
 * an iter per request being decoded (env.requests of them) and switches pf
 * to the request an event is about (mp_prefetch_switch()).
 */
struct mp_prefetch_iter {
	uint32_t request;
	/* The request's model (mp_prefetch_set_model()); 0 when there is one. */
	uint32_t model;
	uint32_t token;
	const float *sem;	/* semantic vector (sem_dim floats), or the context map */
	uint32_t sem_len;
	float *traj;		/* [layers][experts]: this iteration's gates so far */
	float *context;		/* [layers][experts]: the previous iteration's map */
	bool have_context;
	bool in_iter;
	bool used;		/* ever given to a request */
	uint32_t gates;		/* gates seen in this iteration */
	/*
	 * Eviction hints: the policy's latest probability of use per key
	 * (layer * experts + expert) for this request, -1 when it has none.
	 */
	float *hint_p;
	float *sem_buf;		/* [sem_dim]: a copy of the iteration's semantic vector */
	void *priv;		/* the policy's per-request state (ops->iter_size bytes) */
	uint64_t last_use;	/* for reuse: the least recently used iter goes first */
};

struct mp_prefetch_ops {
	const char *name;
	const char *description;
	/* Sets pf->priv. Returns 0 or -errno (with a message). */
	int (*init)(struct mp_prefetch *pf);
	/* An iteration (token step) starts: pf->it's request/token/sem are set, its traj is empty. */
	void (*begin)(struct mp_prefetch *pf);
	/*
	 * The gate of `layer` chose ids/weights; pf->it->traj row `layer` holds
	 * the layer's distribution (the full softmax when given, else the top-k
	 * weights); spec, when not NULL, holds pf->spec_rows rows of experts
	 * floats: row i is layer + 1 + i's router applied to this layer's
	 * hidden state, a softmax (rows past the last layer are not set).
	 */
	void (*gate)(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids, uint32_t k,
		     const float *spec);
	/*
	 * gate() uses spec: the driver reads the routers and speculates, the
	 * simulator asks its mp_spec_source. With deep_input, the routers of
	 * the next `distance` layers (spec_rows = distance), else the next
	 * layer's only.
	 */
	bool layer_input;
	bool deep_input;
	/*
	 * Handling a gate costs less than waking a thread (no prediction, a
	 * little bookkeeping): the driver runs it on the thread that reports
	 * the gate and starts no thread of its own (docs/region.md, session 33).
	 */
	bool inline_gates;
	/*
	 * How many layers before layer's use the policy first predicts it (an
	 * iteration's begin counts as layer 0's start), or a negative value
	 * when it never does; NULL: never (mp_prefetch_miss_weights()).
	 */
	float (*lead)(const struct mp_prefetch *pf, uint32_t layer);
	/* The iteration is over: pf->it->traj is its complete map. */
	void (*end)(struct mp_prefetch *pf);
	void (*fini)(struct mp_prefetch *pf);
	/*
	 * Per-request state: iter_size zeroed bytes at it->priv for each iter;
	 * iter_init fills them (may be NULL), iter_fini frees what they hold.
	 */
	size_t iter_size;
	int (*iter_init)(struct mp_prefetch *pf, struct mp_prefetch_iter *it);
	void (*iter_fini)(struct mp_prefetch *pf, struct mp_prefetch_iter *it);
};

struct mp_prefetch {
	const struct mp_prefetch_ops *ops;
	struct mp_prefetch_env env;
	void *priv;
	/* The request being worked on (read-only for policies), one of iters[]. */
	struct mp_prefetch_iter *it;
	struct mp_prefetch_iter *iters;
	uint32_t niters;
	uint64_t uses;
	/* Output of the last call: experts to prefetch, in no particular order. */
	struct mp_prefetch_item *items;
	uint32_t n;
	uint32_t cap;
	/* hint_dirty[layer]: the last call changed it->hint_p's row of that layer. */
	uint8_t *hint_dirty;
	/*
	 * One expert read over one layer's compute (not its stalls), as the
	 * driver or simulator measures it; 0: unknown. mp_prefetch_min_p().
	 */
	float load_ratio;
	/* Rows of a gate's spec (see ops->gate): 0 for a policy without layer_input. */
	uint32_t spec_rows;
	/*
	 * The rows of the next gate's spec the policy will read (bit i: row
	 * i; rows from 32 on always): the driver and the simulator compute
	 * only those and leave the others unset (mp_prefetch_spec_wanted()).
	 * All at init; a policy may clear bits in its gate() for the next one
	 * (a router that predicts worse than what it is combined with costs
	 * the most CPU for the least).
	 */
	uint32_t spec_want;
	uint64_t iterations;
	uint64_t emitted;
};

/* Whether the next gate's spec row `row` is computed (pf->spec_want). */
static inline bool mp_prefetch_spec_wanted(const struct mp_prefetch *pf, uint32_t row)
{
	return row >= 32 || (pf->spec_want >> row & 1u);
}

extern const struct mp_prefetch_ops mp_prefetch_none;
extern const struct mp_prefetch_ops mp_prefetch_nextlayer;
extern const struct mp_prefetch_ops mp_prefetch_eam;
extern const struct mp_prefetch_ops mp_prefetch_finemoe;
extern const struct mp_prefetch_ops mp_prefetch_finemoe_nextlayer;
extern const struct mp_prefetch_ops mp_prefetch_dependency;
extern const struct mp_prefetch_ops mp_prefetch_oracle;

/*
 * finemoe's (or finemoe+nextlayer's) expert-map store (NULL for another
 * policy), and replacing it (taken over).
 */
struct mp_emap *mp_prefetch_finemoe_emap(struct mp_prefetch *pf);
void mp_prefetch_finemoe_set_emap(struct mp_prefetch *pf, struct mp_emap *m);
/*
 * The memory finemoe holds (0 for another policy): every model's store, and
 * each request's query once it has searched (mp_prefetcher_stats().emap_bytes).
 */
uint64_t mp_prefetch_finemoe_bytes(struct mp_prefetch *pf);

/*
 * The calling thread's CPU time in ns: what a policy's work costs, however
 * busy the machine is with other work.
 */
uint64_t mp_prefetch_cpu_ns(void);

/* The policy called name, or NULL. */
const struct mp_prefetch_ops *mp_prefetch_find(const char *name);
/* "none, nextlayer, ...", for messages. */
const char *mp_prefetch_names(void);

/* Returns 0, -EINVAL (bad env, a policy's requirement unmet) or -ENOMEM. */
int mp_prefetch_init(struct mp_prefetch *pf, const struct mp_prefetch_ops *ops,
		     const struct mp_prefetch_env *env);
void mp_prefetch_fini(struct mp_prefetch *pf);

/*
 * Makes request's iter the current one (pf->it): its own when it has one,
 * else a fresh one, else the least recently used, whose open iteration is
 * ended first. With one iter (env.requests 0 or 1) it is always the same,
 * carrying its map over from request to request. Returns its index.
 */
uint32_t mp_prefetch_switch(struct mp_prefetch *pf, uint32_t request);

/* Models a prefetcher tells apart (mp_prefetch_set_model()), at most. */
#define MP_PREFETCH_MAX_MODELS 8u

/*
 * The current iter's request is model's (< MP_PREFETCH_MAX_MODELS): a
 * policy with a store per model (finemoe) learns its iterations into that
 * model's store and predicts them from it only. A change ends the open
 * iteration (in the old model's store) and drops the iter's context, the
 * map of another model's request.
 */
void mp_prefetch_set_model(struct mp_prefetch *pf, uint32_t model);

/*
 * Driver calls, on the current iter. Each clears pf->items/n and the dirty
 * flags, then lets the policy fill them. begin() ends an iteration left
 * open. sem may be NULL (zeros). gate(): probs is the full distribution (experts floats) or NULL,
 * weights the top-k gate weights or NULL (then 1/k each), spec see ops.
 */
void mp_prefetch_begin(struct mp_prefetch *pf, uint32_t request, uint32_t token,
		       const float *sem);
int mp_prefetch_gate(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids,
		     const float *weights, uint32_t k, const float *probs, const float *spec);
void mp_prefetch_end(struct mp_prefetch *pf);

/*
 * For policies
 */

/* Adds an item with priority p / (layer - l_now) (l_now = -1 before the first gate). */
void mp_prefetch_emit(struct mp_prefetch *pf, uint32_t layer, uint32_t expert, float p,
		      int32_t l_now);

/*
 * FineMoE's similarity-aware selection (Eq. 6-8): the smallest set of the
 * most probable experts whose probabilities sum to at least
 * delta = clamp(1 - score, 0, 1), with at least k members (capped at n, and
 * never adding an expert with p = 0 beyond the first k). Writes the ids in
 * decreasing p (ties: lower id) to out, which needs n slots (it is used as
 * scratch), and returns how many.
 */
uint32_t mp_prefetch_select(const float *p, uint32_t n, uint32_t k, float score, uint32_t *out);

/* Records P as layer's eviction hints without prefetching anything. */
void mp_prefetch_hint(struct mp_prefetch *pf, uint32_t layer, const float *P);

/* select() on layer's distribution P, emits the set, and records P as the layer's hints. */
void mp_prefetch_plan(struct mp_prefetch *pf, uint32_t layer, const float *P, float score,
		      int32_t l_now);

/*
 * The least probability of use worth a read for a layer dist layers ahead.
 * When reads are the bottleneck, a wrong prefetch costs a whole read of
 * channel time, c = load_ratio layer-times, while a right one only hides the
 * compute of the layers before its use, dist layer-times at most: worth it
 * when p * dist > (1 - p) * c, i.e. p > c / (c + dist). With fast reads c is
 * small and nearly everything predicted is worth it. 0 when c is unknown.
 */
float mp_prefetch_min_p(const struct mp_prefetch *pf, int32_t dist);

/* What a miss costs in a layer no prefetch brings back in time, against one that does. */
#define MP_PREFETCH_MISS_W 2.0f

/*
 * The eviction hints' miss weights (struct mp_evict_hints.miss_w, layers
 * floats): MP_PREFETCH_MISS_W for each layer the policy predicts less than
 * a read's time (load_ratio layers) before its use, or never, 1 for the
 * others. All 1 while load_ratio is unknown or when every layer is alike.
 */
void mp_prefetch_miss_weights(const struct mp_prefetch *pf, float *w);

/*
 * Like mp_prefetch_plan() for probabilities of use (summing to topk, e.g.
 * from mp_emap_predict_*()): δ-selection on use / topk, then only the
 * members at or above mp_prefetch_min_p(); the hints are `use`.
 */
void mp_prefetch_plan_use(struct mp_prefetch *pf, uint32_t layer, const float *use, float score,
			  int32_t l_now);

#endif /* MP_PREFETCH_H */
