/* SPDX-License-Identifier: MIT */
/* The CoE layer's state and the calls its files make on each other; never seen outside lib/coe/. */
#ifndef MP_COE_PRIV_H
#define MP_COE_PRIV_H

#include <stdbool.h>
#include <stdint.h>

#include <moepager/coe.h>

struct coe_arch {
	char *name;
	char *trunk_path;
	struct mp_store *trunk;		/* NULL when parsed with no_stores */
	struct mp_geometry g;
	uint32_t slots;
};

struct coe_model {
	char *name;
	uint32_t arch;
	uint32_t first_slot;
	uint64_t seed;
	double p_first;
	double usage;
	bool pinned;			/* always in memory, never evicted */
	uint32_t n_pre, n_next;
	uint32_t *pre;			/* preliminary models */
	uint32_t first_edge;		/* its out-edges: edges[first_edge .. + n_next), by from */
};

struct mp_coe {
	char *dir;
	char *container_path;
	struct mp_store *container;
	uint32_t c_experts;		/* container experts per layer */
	uint64_t slot_bytes;		/* container expert bytes */
	struct coe_arch *archs;
	uint32_t n_archs;
	struct coe_model *models;
	uint32_t n_models;
	struct mp_coe_edge *edges;	/* sorted by from */
	uint32_t n_edges;
	uint64_t total_bytes;
};

/* A model's bytes: its slots times the container's expert bytes. */
static inline uint64_t coe_model_bytes(const struct mp_coe *c, uint32_t m)
{
	return (uint64_t)c->archs[c->models[m].arch].slots * c->slot_bytes;
}

/*
 * graph.c: checks the graph (cycles, probabilities) and fills usage, pre,
 * first_edge; what names the manifest in messages.
 */
int coe_graph_build(struct mp_coe *c, const char *what);

/* Least squares y = k x + b; -EINVAL with fewer than two distinct x. */
int coe_fit_line(const double *x, const double *y, uint32_t n, double *k, double *b, double *r2);
/*
 * With lat[i] the latency of a batch of i + 1: the smallest batch after
 * which the per-request latency falls by less than gain at every larger one.
 */
uint32_t coe_max_batch(const double *lat, uint32_t n, double gain);

/*
 * Two-stage eviction (CoServe §4.3) over models: the next victim among the
 * n resident models that in_use does not protect. Stage 1: subsequent
 * models none of whose preliminaries is resident (resident_mask, by model),
 * largest first; stage 2: the lowest usage. Models requests want (wanted,
 * by model, coe_want_next(); NULL: none) go only when no other may: the
 * assigner counted no load for them. -ENOENT when none may go.
 */
int coe_evict_pick(const struct mp_coe *c, const uint32_t *resident, const bool *in_use,
		   uint32_t n, const bool *resident_mask, const uint32_t *wanted);
/*
 * Whether a prefetch of model m may evict v: no request wants v, and v is
 * less used than m (§4.3: the pool keeps the most used; only a batch
 * waiting for its model overrides that).
 */
bool coe_prefetch_may_evict(const struct mp_coe *c, uint32_t v, uint32_t m,
			    const uint32_t *wanted);
/*
 * A request of model m starts waiting (d = 1) or is done with m (d = -1):
 * counts it in wanted[] for m's subsequent models, which its output may
 * lead to (the requests queued for a model itself the queues count).
 */
void coe_want_next(const struct mp_coe *c, uint32_t *wanted, uint32_t m, int d);

/*
 * Request assigning (CoServe §4.2, Fig. 8): with T[i] the predicted finish
 * time of queue i and add[i] what the request would add to it, the queue
 * that keeps the longest finish time lowest; ties go to the least added.
 */
uint32_t coe_assign_pick(const double *T, const double *add, uint32_t n);

/*
 * Prefetch timing: with work[i] the predicted compute of the queue's i-th
 * coming group and load[i] its model's load latency, and `ahead` the
 * compute before the first (the batch starting), how many of the first
 * groups must start their loads now: group i is due while the compute ahead
 * of it is no longer than its load (a later one can start at a later batch
 * and still be in time). Stops at the first not due.
 */
uint32_t coe_prefetch_due(const double *work, const double *load, uint32_t n, double ahead);

/* 64-bit mix of two values (splitmix64's finaliser), for draws that must not depend on order. */
uint64_t coe_mix(uint64_t a, uint64_t b);

#endif /* MP_COE_PRIV_H */
