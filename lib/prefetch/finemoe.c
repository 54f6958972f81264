// SPDX-License-Identifier: MIT
/*
 * FineMoE's expert-map prefetcher: semantic search for the first d layers
 * (the token's embedding when the engine gives one, else the previous
 * iteration's map), trajectory-prefix search for the rest, similarity-aware selection
 * (δ = 1 - score, at least top-k), priority p / (l - l_now). Predictions are
 * probabilities of use voted by many records (prefetch/emap.h), so only experts
 * worth a read are read (mp_prefetch_min_p()) and every expert gets an
 * eviction hint. Every finished iteration goes into the expert-map store.
 *
 * finemoe+nextlayer adds the router's lookahead when the engine gives the
 * layer inputs: layer l + 1's router on layer l's input predicts l + 1, the
 * set read at once when a read lands within a layer (docs/prefetch.md).
 */
#include <stdlib.h>

#include "base/base.h"
#include "prefetch/policy.h"

struct finemoe {
	struct mp_emap *emap;
	float *sem_use;		/* [layers][experts]: the semantic vote (with sem_dim) */
	/* finemoe+nextlayer: how often the speculative top-k was routed, for its p */
	double spec_hits, spec_total;
};

/* A request's own state: its iteration's running similarity to the store's records. */
struct finemoe_req {
	struct mp_emap_query query;
	/* finemoe+nextlayer: the speculative top-k of spec_layer, to score when it routes */
	uint32_t spec_top[MP_MAX_TOPK];
	uint32_t spec_layer;
	bool spec_open;
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

/* Scores the last speculation against the experts layer routed to (when it was about layer). */
static void score_spec(struct finemoe *f, struct finemoe_req *q, uint32_t layer,
		       const uint32_t *ids, uint32_t k)
{
	if (!q->spec_open || q->spec_layer != layer)
		return;
	for (uint32_t i = 0; i < k; i++)
		for (uint32_t t = 0; t < k; t++)
			f->spec_hits += q->spec_top[t] == ids[i];
	f->spec_total += k;
	q->spec_open = false;
}

/*
 * The router's lookahead as probabilities of use: its top-k each as likely
 * as a speculative top-k member has turned out to be routed (r, counted as
 * gates come, 1/2 before any), the rest of k shared by the speculative
 * probabilities. Read only when a read lands within the layer of compute
 * before its use (load ratio at most 1): a later one only takes the
 * bandwidth of reads that can be on time.
 */
static void lookahead(struct mp_prefetch *pf, uint32_t layer, const float *spec)
{
	struct finemoe *f = pf->priv;
	struct finemoe_req *q = pf->it->priv;
	const uint32_t J = pf->env.experts, K = pf->env.topk;
	float use[MP_MAX_EXPERTS], r = (float)((f->spec_hits + 1) / (f->spec_total + 2));
	uint32_t top[MP_MAX_EXPERTS];
	bool in[MP_MAX_EXPERTS] = { 0 };
	double rest = 0;

	mp_prefetch_select(spec, J, K, 1.0f, top);
	for (uint32_t t = 0; t < K; t++) {
		in[top[t]] = true;
		q->spec_top[t] = top[t];
	}
	q->spec_layer = layer + 1;
	q->spec_open = true;
	if (!(pf->load_ratio > 0 && pf->load_ratio <= 1))
		return;
	for (uint32_t j = 0; j < J; j++)
		rest += in[j] ? 0 : spec[j];
	for (uint32_t j = 0; j < J; j++)
		use[j] = in[j] ? r : rest > 0 ? (float)(K * (1 - r) * spec[j] / rest) : 0.0f;
	mp_prefetch_plan_use(pf, layer + 1, use, r, (int32_t)layer);
}

static void finemoe_la_gate(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids,
			    uint32_t k, const float *spec)
{
	score_spec(pf->priv, pf->it->priv, layer, ids, k);
	finemoe_gate(pf, layer, ids, k, spec);
	if (spec && layer + 1 < pf->env.layers)
		lookahead(pf, layer, spec);
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

static bool is_finemoe(const struct mp_prefetch *pf)
{
	return pf->ops == &mp_prefetch_finemoe || pf->ops == &mp_prefetch_finemoe_nextlayer;
}

/* The policy's store (to save, load or report), or NULL for another policy. */
struct mp_emap *mp_prefetch_finemoe_emap(struct mp_prefetch *pf)
{
	if (!is_finemoe(pf))
		return NULL;
	return ((struct finemoe *)pf->priv)->emap;
}

/* Replaces the policy's store by m (taking it over), e.g. one loaded from a file. */
void mp_prefetch_finemoe_set_emap(struct mp_prefetch *pf, struct mp_emap *m)
{
	struct finemoe *f = pf->priv;

	if (!is_finemoe(pf) || !m)
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

const struct mp_prefetch_ops mp_prefetch_finemoe_nextlayer = {
	.name = "finemoe+nextlayer",
	.description = "finemoe, and layer l+1's router on layer l's input for l+1 when reads "
		       "land within a layer",
	.init = finemoe_init,
	.begin = finemoe_begin,
	.gate = finemoe_la_gate,
	.end = finemoe_end,
	.fini = finemoe_fini,
	.layer_input = true,
	.iter_size = sizeof(struct finemoe_req),
	.iter_fini = finemoe_iter_fini,
};
