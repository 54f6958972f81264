// SPDX-License-Identifier: MIT
/*
 * FineMoE's expert-map prefetcher: semantic search for the first d layers
 * (the token's embedding when the engine gives one, else the previous
 * iteration's map), trajectory-prefix search for the rest, similarity-aware selection
 * (δ = 1 - score, at least top-k), priority p / (l - l_now). Predictions are
 * probabilities of use voted by many records (prefetch/emap.h), so only experts
 * worth a read are read (mp_prefetch_min_p()) and every expert gets an
 * eviction hint. Every finished iteration goes into the expert-map store.
 */
#include <stdlib.h>

#include "base/base.h"
#include "prefetch/policy.h"

struct finemoe {
	struct mp_emap *emap;
	float *sem_use;		/* [layers][experts]: the semantic vote (with sem_dim) */
};

/* A request's own state: its iteration's running similarity to the store's records. */
struct finemoe_req {
	struct mp_emap_query query;
};

static int finemoe_init(struct mp_prefetch *pf)
{
	struct mp_emap_config c = {
		.layers = pf->env.layers,
		.experts = pf->env.experts,
		.topk = pf->env.topk,
		/* Without a semantic vector the previous iteration's map is the context. */
		.sem_dim = pf->env.sem_dim ? pf->env.sem_dim : pf->env.layers * pf->env.experts,
		.sem_is_map = !pf->env.sem_dim,
		.capacity = pf->env.emap_capacity,
		.distance = pf->env.distance,
	};
	struct finemoe *f = calloc(1, sizeof(*f));
	int err;

	if (!f)
		return -ENOMEM;
	if (pf->env.sem_dim) {
		f->sem_use = calloc((size_t)c.layers * c.experts, sizeof(float));
		if (!f->sem_use) {
			free(f);
			return -ENOMEM;
		}
	}
	err = mp_emap_create(&c, &f->emap);
	if (err) {
		free(f->sem_use);
		free(f);
		return err;
	}
	pf->priv = f;
	return 0;
}

/*
 * Without semantic vectors a record's context is the map before it, so each
 * layer's learnt transition (mp_emap_predict_layer()) from the layer's last
 * row says how likely each of its experts is at the layer's next pass.
 * Returns 0 with use[] filled, or -EINVAL (geometry beyond the estimator).
 */
static int next_pass(struct mp_prefetch *pf, struct mp_emap_query *q, uint32_t layer,
		     const float *last_map, float *use)
{
	struct finemoe *f = pf->priv;
	const uint32_t J = pf->env.experts;

	return mp_emap_predict_layer(f->emap, q, layer, last_map + (size_t)layer * J, use);
}

/*
 * At an iteration's start the first d layers are planned, the others hinted
 * (the trajectory search refines them as the gates come).
 */
static void plan_or_hint(struct mp_prefetch *pf, uint32_t layer, const float *use, float score)
{
	if (layer < pf->env.distance)
		mp_prefetch_plan_use(pf, layer, use, score, -1);
	else
		mp_prefetch_hint(pf, layer, use);
}

/* With semantic vectors: the records nearest this iteration's vector vote for every layer. */
static void begin_semantic(struct mp_prefetch *pf)
{
	struct finemoe *f = pf->priv;
	struct finemoe_req *q = pf->it->priv;
	const uint32_t J = pf->env.experts;
	float score;

	/* No vector, or no record shares anything with it: nothing to go on, demand only. */
	if (mp_emap_predict_sem(f->emap, &q->query, pf->it->sem, f->sem_use, &score) ||
	    !(score > 0))
		return;
	for (uint32_t l = 0; l < pf->env.layers; l++)
		plan_or_hint(pf, l, f->sem_use + (size_t)l * J, score);
}

static void finemoe_begin(struct mp_prefetch *pf)
{
	struct finemoe *f = pf->priv;
	struct finemoe_req *q = pf->it->priv;
	float use[MP_MAX_EXPERTS], score;

	mp_emap_query_reset(&q->query);
	if (pf->env.sem_dim) {
		begin_semantic(pf);
		return;
	}
	/* Cold start (empty store) or no context yet: nothing to go on, demand only. */
	if (!pf->it->have_context ||
	    mp_emap_search_sem(f->emap, &q->query, pf->it->sem, &score) < 0)
		return;
	/* The closest context's score sets δ; the layer's transition, the set. */
	for (uint32_t l = 0; l < pf->env.layers; l++) {
		if (next_pass(pf, NULL, l, pf->it->context, use))
			return;
		plan_or_hint(pf, l, use, score);
	}
}

static void finemoe_gate(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids, uint32_t k,
			 const float *spec)
{
	struct finemoe *f = pf->priv;
	struct finemoe_req *q = pf->it->priv;
	uint32_t target = layer + pf->env.distance;
	float use[MP_MAX_EXPERTS], score;

	(void)ids;
	(void)k;
	(void)spec;
	/* The layer's next use is in the next iteration: hint how likely each expert is there. */
	if (!pf->env.sem_dim && !next_pass(pf, &q->query, layer, pf->it->traj, use))
		mp_prefetch_hint(pf, layer, use);
	if (target >= pf->env.layers)
		return;
	/* No record shares anything with this trajectory: nothing to go on. */
	if (!mp_emap_predict_traj(f->emap, &q->query, pf->it->traj, layer + 1, target, use,
				  &score) && score > 0)
		mp_prefetch_plan_use(pf, target, use, score, (int32_t)layer);
}

static void finemoe_end(struct mp_prefetch *pf)
{
	struct finemoe *f = pf->priv;

	struct finemoe_req *q = pf->it->priv;

	mp_emap_insert(f->emap, &q->query, pf->it->traj, pf->it->sem);
}

static void finemoe_fini(struct mp_prefetch *pf)
{
	struct finemoe *f = pf->priv;

	if (!f)
		return;
	mp_emap_destroy(f->emap);
	free(f->sem_use);
	free(f);
	pf->priv = NULL;
}

static void finemoe_iter_fini(struct mp_prefetch *pf, struct mp_prefetch_iter *it)
{
	struct finemoe_req *q = it->priv;

	(void)pf;
	mp_emap_query_fini(&q->query);
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
	.iter_size = sizeof(struct finemoe_req),
	.iter_fini = finemoe_iter_fini,
};
