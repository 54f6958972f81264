// SPDX-License-Identifier: MIT
/*
 * FineMoE's expert-map prefetcher: semantic search for the first d layers,
 * trajectory-prefix search for the rest, similarity-aware selection
 * (δ = 1 - score, at least top-k), priority p / (l - l_now). Every finished
 * iteration goes into the expert-map store.
 */
#include <stdlib.h>

#include "internal.h"
#include "prefetch.h"

struct finemoe {
	struct mp_emap *emap;
};

static int finemoe_init(struct mp_prefetch *pf)
{
	struct mp_emap_config c = {
		.layers = pf->env.layers,
		.experts = pf->env.experts,
		/* Without a semantic vector the previous iteration's map is the context. */
		.sem_dim = pf->env.sem_dim ? pf->env.sem_dim : pf->env.layers * pf->env.experts,
		.capacity = pf->env.emap_capacity,
		.distance = pf->env.distance,
	};
	struct finemoe *f = calloc(1, sizeof(*f));
	int err;

	if (!f)
		return -ENOMEM;
	err = mp_emap_create(&c, &f->emap);
	if (err) {
		free(f);
		return err;
	}
	pf->priv = f;
	return 0;
}

static void finemoe_begin(struct mp_prefetch *pf)
{
	struct finemoe *f = pf->priv;
	float score;
	int y;

	/* Cold start (empty store) or no context yet: nothing to go on, demand only. */
	if (!pf->env.sem_dim && !pf->have_context)
		return;
	y = mp_emap_search_sem(f->emap, pf->sem, &score);
	if (y < 0)
		return;
	for (uint32_t l = 0; l < pf->env.distance; l++)
		mp_prefetch_plan(pf, l, mp_emap_layer(f->emap, (uint32_t)y, l), score, -1);
	/*
	 * The match also says how likely every later layer's experts are this
	 * iteration: eviction hints only (the trajectory search refines them).
	 */
	for (uint32_t l = pf->env.distance; l < pf->env.layers; l++)
		mp_prefetch_hint(pf, l, mp_emap_layer(f->emap, (uint32_t)y, l));
}

static void finemoe_gate(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids, uint32_t k,
			 const float *spec)
{
	struct finemoe *f = pf->priv;
	uint32_t target = layer + pf->env.distance;
	float score;
	int y;

	(void)ids;
	(void)k;
	(void)spec;
	/*
	 * Without semantic vectors a record's context is the map before it, so
	 * the record whose context best matches this iteration's trajectory so
	 * far predicts the next iteration: eviction hints for the layers already
	 * run (their next use is there).
	 */
	if (!pf->env.sem_dim) {
		y = mp_emap_search_sem_prefix(f->emap, pf->traj, (layer + 1) * pf->env.experts,
					      &score);
		for (uint32_t l = 0; y >= 0 && l <= layer; l++)
			mp_prefetch_hint(pf, l, mp_emap_layer(f->emap, (uint32_t)y, l));
	}
	if (target >= pf->env.layers)
		return;
	y = mp_emap_search_traj(f->emap, pf->traj, layer + 1, &score);
	if (y < 0)
		return;
	mp_prefetch_plan(pf, target, mp_emap_layer(f->emap, (uint32_t)y, target), score,
			 (int32_t)layer);
}

static void finemoe_end(struct mp_prefetch *pf)
{
	struct finemoe *f = pf->priv;

	mp_emap_insert(f->emap, pf->traj, pf->sem);
}

static void finemoe_fini(struct mp_prefetch *pf)
{
	struct finemoe *f = pf->priv;

	if (!f)
		return;
	mp_emap_destroy(f->emap);
	free(f);
	pf->priv = NULL;
}

/* The policy's store (to save, load or report), or NULL for another policy. */
struct mp_emap *mp_prefetch_finemoe_emap(struct mp_prefetch *pf)
{
	if (pf->ops != &mp_prefetch_finemoe)
		return NULL;
	return ((struct finemoe *)pf->priv)->emap;
}

/* Replaces the policy's store by m (taking it over), e.g. one loaded from a file. */
void mp_prefetch_finemoe_set_emap(struct mp_prefetch *pf, struct mp_emap *m)
{
	struct finemoe *f = pf->priv;

	if (pf->ops != &mp_prefetch_finemoe || !m)
		return;
	mp_emap_destroy(f->emap);
	f->emap = m;
}

const struct mp_prefetch_ops mp_prefetch_finemoe = {
	.name = "finemoe",
	.description = "expert-map search (semantic for the first d layers, trajectory after), "
		       "similarity-aware selection, priority p/(l - l_now)",
	.init = finemoe_init,
	.begin = finemoe_begin,
	.gate = finemoe_gate,
	.end = finemoe_end,
	.fini = finemoe_fini,
};
