// SPDX-License-Identifier: MIT
/* The model pool: whole models in memory under one budget, and the victims that make room. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "coe/exec.h"
#include "coe/pool.h"

int coe_pool_init(struct coe_pool *pl, struct mp_coe *c, struct mp_pager *p,
		  enum mp_coe_evict policy, uint64_t budget)
{
	uint32_t n = c->n_models;

	memset(pl, 0, sizeof(*pl));
	pl->c = c;
	pl->p = p;
	pl->policy = policy;
	pl->budget = budget;
	pl->refs = calloc(n, sizeof(*pl->refs));
	pl->in_use = calloc(n, sizeof(*pl->in_use));
	pl->resident = calloc(n, sizeof(*pl->resident));
	pl->last_use = calloc(n, sizeof(*pl->last_use));
	pl->loaded_at = calloc(n, sizeof(*pl->loaded_at));
	pl->loaded_once = calloc(n, sizeof(*pl->loaded_once));
	pl->list = calloc(n, sizeof(*pl->list));
	if (!pl->refs || !pl->in_use || !pl->resident || !pl->last_use || !pl->loaded_at ||
	    !pl->loaded_once || !pl->list) {
		coe_pool_fini(pl);
		return mp_err(-ENOMEM, "coe pool: out of memory");
	}
	return 0;
}

void coe_pool_fini(struct coe_pool *pl)
{
	free(pl->refs);
	free(pl->in_use);
	free(pl->resident);
	free(pl->last_use);
	free(pl->loaded_at);
	free(pl->loaded_once);
	free(pl->list);
	memset(pl, 0, sizeof(*pl));
}

/* The oldest by the given ticks among resident models not in use. */
static int oldest(const struct coe_pool *pl, const uint64_t *ticks)
{
	int best = -ENOENT;

	for (uint32_t i = 0; i < pl->n_list; i++) {
		uint32_t m = pl->list[i];

		if (!pl->in_use[m] && (best < 0 || ticks[m] < ticks[best]))
			best = (int)m;
	}
	return best;
}

static int pick_victim(const struct coe_pool *pl)
{
	switch (pl->policy) {
	case MP_COE_EVICT_FIFO:
		return oldest(pl, pl->loaded_at);
	case MP_COE_EVICT_TWO_STAGE:
		return coe_evict_pick(pl->c, pl->list, pl->in_use, pl->n_list, pl->resident,
				      pl->wanted);
	default:
		return oldest(pl, pl->last_use);
	}
}

static void evict(struct coe_pool *pl, uint32_t m)
{
	uint64_t t0;
	uint32_t busy;

	for (uint32_t i = 0; i < pl->n_list; i++) {
		if (pl->list[i] == m) {
			pl->list[i] = pl->list[--pl->n_list];
			break;
		}
	}
	pl->resident[m] = false;
	pl->used -= coe_model_bytes(pl->c, m);
	pl->evictions++;
	t0 = mp_now_ns();
	busy = coe_model_evict(pl->c, pl->p, m, false);
	pl->manage_ns += mp_now_ns() - t0;
	/* Pinned pages, or a transition wedged for a second: left to the pager's own budget. */
	if (busy)
		mp_debug("coe pool: model %s: %u experts busy, not evicted", pl->c->models[m].name,
			 busy);
}

/*
 * Evicts until model m fits. -ENOSPC when the models in use leave no room
 * now, or, for a prefetch, the next victim is wanted or at least as used as
 * m (§4.3: the pool keeps the most used; only a waiting batch overrides it).
 */
static int make_room(struct coe_pool *pl, uint32_t m, bool demand)
{
	uint64_t bytes = coe_model_bytes(pl->c, m);

	while (pl->used + bytes > pl->budget) {
		int v = pick_victim(pl);

		if (v < 0 || (!demand && !coe_prefetch_may_evict(pl->c, (uint32_t)v, m, pl->wanted)))
			return -ENOSPC;
		evict(pl, (uint32_t)v);
	}
	return 0;
}

static int load(struct coe_pool *pl, uint32_t m, bool demand)
{
	uint64_t bytes = coe_model_bytes(pl->c, m), t0;
	bool host;
	int err;

	err = make_room(pl, m, demand);
	if (err)
		return err;
	host = coe_model_host(pl->c, pl->p, m);
	t0 = mp_now_ns();
	err = coe_model_load(pl->c, pl->p, m, demand);
	pl->manage_ns += mp_now_ns() - t0;
	if (err)
		return err;
	pl->resident[m] = true;
	pl->list[pl->n_list++] = m;
	pl->used += bytes;
	pl->loaded_at[m] = ++pl->tick;
	pl->loads++;
	pl->prefetched += !demand;
	pl->distinct += !pl->loaded_once[m];
	pl->loaded_once[m] = true;
	pl->loads_host += host;
	pl->loads_file += !host;
	pl->bytes_loaded += bytes;
	return 1;
}

int coe_pool_acquire(struct coe_pool *pl, uint32_t m, bool demand)
{
	int loaded = 0;

	if (!pl->resident[m]) {
		loaded = load(pl, m, demand);
		if (loaded < 0)
			return loaded;
	}
	if (!pl->refs[m]++)
		pl->in_use_bytes += coe_model_bytes(pl->c, m);
	pl->in_use[m] = true;
	pl->last_use[m] = ++pl->tick;
	return loaded;
}

void coe_pool_release(struct coe_pool *pl, uint32_t m)
{
	if (pl->refs[m] && !--pl->refs[m]) {
		pl->in_use[m] = false;
		pl->in_use_bytes -= coe_model_bytes(pl->c, m);
	}
	pl->last_use[m] = ++pl->tick;
}

static int cmp_usage(const void *a, const void *b, void *arg)
{
	const struct mp_coe *c = arg;
	double x = c->models[*(const uint32_t *)a].usage, y = c->models[*(const uint32_t *)b].usage;

	return x > y ? -1 : x < y;
}

int coe_pool_pin(struct coe_pool *pl)
{
	for (uint32_t m = 0; m < pl->c->n_models; m++) {
		int err;

		if (!pl->c->models[m].pinned)
			continue;
		/* A reference never released: the model counts as in use for good. */
		err = coe_pool_acquire(pl, m, false);
		if (err < 0)
			return mp_err(err, "coe pool: pinned model %s does not fit the budget",
				      pl->c->models[m].name);
	}
	return 0;
}

uint32_t coe_pool_warm(struct coe_pool *pl)
{
	uint32_t *order = malloc(pl->c->n_models * sizeof(*order)), n = 0;

	if (!order)
		return 0;
	for (uint32_t m = 0; m < pl->c->n_models; m++)
		order[m] = m;
	qsort_r(order, pl->c->n_models, sizeof(*order), cmp_usage, pl->c);
	/* Least used first in the recency order: LRU's first victims are the least used. */
	for (uint32_t i = 0; i < pl->c->n_models; i++) {
		uint32_t m = order[i];

		if (pl->resident[m])
			continue;
		if (pl->used + coe_model_bytes(pl->c, m) > pl->budget)
			break;
		if (load(pl, m, false) < 0)
			break;
		pl->last_use[m] = pl->loaded_at[m] = pl->c->n_models - i;
		n++;
	}
	pl->tick = pl->c->n_models + 1;
	free(order);
	return n;
}
