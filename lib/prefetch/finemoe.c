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
 * layer inputs: the routers of layers l + 1 .. l + d on layer l's input,
 * each combined with the trajectory vote for its layer (docs/prefetch.md,
 * "Router lookahead").
 *
 * An expert a request routed at a layer on each of its last HOT_RUN tokens
 * or more is hinted at least as likely as such runs have turned out to go
 * on (measured): the votes of other records cannot rank it below experts
 * the request does not use, which eviction and prefetch admission go by
 * (docs/prefetch.md, "Hot experts", session 34).
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "prefetch/policy.h"

/* finemoe+nextlayer's two predictors of a layer d layers ahead. */
enum { SRC_ROUTER = 0, SRC_TRAJ, NSRC };

/*
 * finemoe+nextlayer asks for a depth's router lookahead at every gate
 * while it predicts at least as well as the trajectory vote there, else at
 * one gate in SPEC_SAMPLE (all depths), which keeps its precision measured.
 */
#define SPEC_SAMPLE 8u

/* Tokens in a row an expert is routed at a layer before its hint is held up. */
#define HOT_RUN 3u

struct finemoe {
	struct mp_emap *emap;	/* model 0's store (the only one without models) */
	/* The other models' stores (mp_prefetch_set_model()), made at their first use. */
	struct mp_emap *more[MP_PREFETCH_MAX_MODELS - 1];
	struct mp_emap_config cfg;
	float *sem_use;		/* [layers][experts]: the semantic vote (with sem_dim) */
	/*
	 * finemoe+nextlayer: [NSRC][distance], how many of each predictor's
	 * top-k d + 1 layers ahead were routed, of how many: its precision.
	 */
	double *hits, *total;
	float *traj_use;	/* [distance][experts] scratch: the trajectory votes */
	uint64_t gates;		/* finemoe+nextlayer's gates, for SPEC_SAMPLE */
	/* Of the runs of HOT_RUN or more, how many went on at the next pass: their rate. */
	uint64_t run_trials, run_hits;
};

/* A request's own state: its iteration's running similarity to the store's records. */
struct finemoe_req {
	struct mp_emap_query query;
	/*
	 * finemoe+nextlayer: each predictor's top-k for layer m made d + 1
	 * layers before it, [layers][distance][NSRC][topk], scored when m
	 * routes; made[] flags which were made this iteration.
	 */
	uint16_t *top;
	uint8_t *made;		/* [layers][distance]: bit s for predictor s */
	/* [layers][experts]: the request's tokens in a row each expert was routed (to 255) */
	uint8_t *run;
	uint32_t run_request, run_model;	/* whose runs they are */
};

static void finemoe_fini(struct mp_prefetch *pf);

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
	f->cfg = c;
	pf->priv = f;
	if (pf->spec_rows) {
		f->hits = calloc((size_t)NSRC * pf->env.distance, sizeof(double));
		f->total = calloc((size_t)NSRC * pf->env.distance, sizeof(double));
		f->traj_use = calloc((size_t)pf->env.distance * c.experts, sizeof(float));
		if (!f->hits || !f->total || !f->traj_use) {
			finemoe_fini(pf);
			return -ENOMEM;
		}
	}
	return 0;
}

/*
 * The store of the current request's model: a prediction for one model is
 * never made from another's trajectories. NULL when it cannot be made.
 */
static struct mp_emap *emap_of(struct mp_prefetch *pf)
{
	struct finemoe *f = pf->priv;
	uint32_t x = pf->it->model;

	if (!x)
		return f->emap;
	if (x >= MP_PREFETCH_MAX_MODELS)
		return NULL;
	/* Out of memory: this model's requests are paged on demand, and retried. */
	if (!f->more[x - 1] && mp_emap_create(&f->cfg, &f->more[x - 1]))
		return NULL;
	return f->more[x - 1];
}

/*
 * Request q's runs: started over when its iter was given to another
 * request or model (mp_prefetch_switch(), mp_prefetch_set_model()).
 */
static uint8_t *runs_of(struct mp_prefetch *pf, struct finemoe_req *q)
{
	const struct mp_prefetch_iter *it = pf->it;

	if (it->request != q->run_request || it->model != q->run_model) {
		memset(q->run, 0, (size_t)pf->env.layers * pf->env.experts);
		q->run_request = it->request;
		q->run_model = it->model;
	}
	return q->run;
}

/* Layer's gate routed ids: each run of HOT_RUN or more went on or ended; the runs move. */
static void note_runs(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids, uint32_t k)
{
	struct finemoe *f = pf->priv;
	const uint32_t J = pf->env.experts;
	uint8_t *run = runs_of(pf, pf->it->priv) + (size_t)layer * J;
	bool routed[MP_MAX_EXPERTS] = { 0 };

	for (uint32_t i = 0; i < k; i++)
		if (ids[i] < J)
			routed[ids[i]] = true;
	for (uint32_t j = 0; j < J; j++) {
		if (run[j] >= HOT_RUN) {
			f->run_trials++;
			f->run_hits += routed[j];
		}
		run[j] = routed[j] ? (uint8_t)MP_MIN(run[j] + 1u, 255u) : 0;
	}
}

/*
 * Layer's hints: each expert on a run of HOT_RUN or more held at least at
 * the rate such runs went on ((hits + 1) / (trials + 2)), whatever the
 * votes said. A layer without hints gets them for those experts only.
 */
static void hold_hot(struct mp_prefetch *pf, uint32_t layer)
{
	struct finemoe *f = pf->priv;
	const uint32_t J = pf->env.experts;
	const uint8_t *run;
	float *hint, p = (float)((f->run_hits + 1.0) / (f->run_trials + 2.0));

	if (layer >= pf->env.layers)
		return;
	run = runs_of(pf, pf->it->priv) + (size_t)layer * J;
	hint = pf->it->hint_p + (size_t)layer * J;
	for (uint32_t j = 0; j < J; j++)
		if (run[j] >= HOT_RUN && !(hint[j] >= p)) {
			hint[j] = p;
			pf->hint_dirty[layer] = 1;
		}
}

/* mp_prefetch_hint() and mp_prefetch_plan_use() with the layer's hot experts held. */
static void hint_layer(struct mp_prefetch *pf, uint32_t layer, const float *use)
{
	mp_prefetch_hint(pf, layer, use);
	hold_hot(pf, layer);
}

static void plan_layer(struct mp_prefetch *pf, uint32_t layer, const float *use, float score,
		       int32_t l_now)
{
	mp_prefetch_plan_use(pf, layer, use, score, l_now);
	hold_hot(pf, layer);
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
	struct mp_emap *m = emap_of(pf);
	const uint32_t J = pf->env.experts;

	if (!m)
		return -ENOMEM;
	return mp_emap_predict_layer(m, q, layer, last_map + (size_t)layer * J, use);
}

/*
 * At an iteration's start the first d layers are planned (the first 2d with
 * wide), the others hinted (the trajectory search refines them as the gates
 * come).
 */
static void plan_or_hint(struct mp_prefetch *pf, uint32_t layer, const float *use, float score,
			 bool wide)
{
	if (layer < pf->env.distance * (wide ? 2 : 1))
		plan_layer(pf, layer, use, score, -1);
	else
		hint_layer(pf, layer, use);
}

/*
 * With semantic vectors: the records nearest this iteration's vector vote
 * for every layer. finemoe+nextlayer also plans layers d .. 2d - 1 from
 * that vote: their reads then start with the step, l layers before use,
 * where the plan made at gate l - d lands late once a read takes about d
 * layers (tiny-real on this machine); the worth-a-read rule at that lead
 * keeps it to confident votes, and the gates plan them again. Layers
 * further on are reached by gates d layers ahead (docs/prefetch.md, "Later
 * layers planned at the step's start").
 */
static void begin_semantic(struct mp_prefetch *pf)
{
	struct finemoe *f = pf->priv;
	struct mp_emap *m = emap_of(pf);
	struct finemoe_req *q = pf->it->priv;
	const uint32_t J = pf->env.experts;
	bool wide = pf->ops == &mp_prefetch_finemoe_nextlayer;
	float score;

	/* No vector, or no record shares anything with it: nothing to go on, demand only. */
	if (!m || mp_emap_predict_sem(m, &q->query, pf->it->sem, f->sem_use, &score) ||
	    !(score > 0))
		return;
	for (uint32_t l = 0; l < pf->env.layers; l++)
		plan_or_hint(pf, l, f->sem_use + (size_t)l * J, score, wide);
}

static void finemoe_begin(struct mp_prefetch *pf)
{
	struct mp_emap *m = emap_of(pf);
	struct finemoe_req *q = pf->it->priv;
	float use[MP_MAX_EXPERTS], score;

	mp_emap_query_reset(&q->query);
	if (pf->env.sem_dim) {
		begin_semantic(pf);
		return;
	}
	/* Cold start (empty store) or no context yet: nothing to go on, demand only. */
	if (!pf->it->have_context || !m ||
	    mp_emap_search_sem(m, &q->query, pf->it->sem, &score) < 0)
		return;
	/* The closest context's score sets δ; the layer's transition, the set. */
	for (uint32_t l = 0; l < pf->env.layers; l++) {
		if (next_pass(pf, NULL, l, pf->it->context, use))
			return;
		plan_or_hint(pf, l, use, score, false);
	}
}

static void finemoe_gate(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids, uint32_t k,
			 const float *spec)
{
	struct mp_emap *m = emap_of(pf);
	struct finemoe_req *q = pf->it->priv;
	uint32_t target = layer + pf->env.distance;
	float use[MP_MAX_EXPERTS], score;

	(void)spec;
	note_runs(pf, layer, ids, k);
	/* The layer's next use is in the next iteration: hint how likely each expert is there. */
	if (!pf->env.sem_dim && !next_pass(pf, &q->query, layer, pf->it->traj, use))
		mp_prefetch_hint(pf, layer, use);
	hold_hot(pf, layer);
	if (target >= pf->env.layers || !m)
		return;
	/* No record shares anything with this trajectory: nothing to go on. */
	if (!mp_emap_predict_traj(m, &q->query, pf->it->traj, layer + 1, target, use,
				  &score) && score > 0)
		plan_layer(pf, target, use, score, (int32_t)layer);
}

/* The top-k of p into out, in decreasing p. */
static void top_of(const float *p, uint32_t J, uint32_t K, uint16_t *out)
{
	uint32_t ids[MP_MAX_EXPERTS];

	mp_prefetch_select(p, J, K, 1.0f, ids);
	for (uint32_t t = 0; t < K; t++)
		out[t] = (uint16_t)ids[t];
}

/* Where request q keeps predictor src's top-k for layer m, made dist layers before it. */
static uint16_t *top_at(const struct mp_prefetch *pf, struct finemoe_req *q, uint32_t m,
			uint32_t dist, uint32_t src)
{
	const uint32_t D = pf->env.distance, K = pf->env.topk;

	return q->top + ((((size_t)m * D + dist - 1) * NSRC) + src) * K;
}

/* Scores every prediction made for layer against the experts it routed to. */
static void score_layer(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids, uint32_t k)
{
	struct finemoe *f = pf->priv;
	struct finemoe_req *q = pf->it->priv;
	const uint32_t D = pf->env.distance, K = pf->env.topk;

	for (uint32_t dist = 1; dist <= D; dist++) {
		uint8_t *made = &q->made[(size_t)layer * D + dist - 1];

		for (uint32_t src = 0; src < NSRC; src++) {
			const uint16_t *top = top_at(pf, q, layer, dist, src);

			if (!(*made & (1u << src)))
				continue;
			for (uint32_t t = 0; t < K; t++)
				for (uint32_t i = 0; i < k; i++)
					f->hits[src * D + dist - 1] += top[t] == ids[i];
			f->total[src * D + dist - 1] += K;
		}
		*made = 0;
	}
}

/* Predictor src's precision dist layers ahead: (hits + 1) / (total + 2), 1/2 before any. */
static float precision(const struct finemoe *f, uint32_t D, uint32_t src, uint32_t dist)
{
	return (float)((f->hits[src * D + dist - 1] + 1) / (f->total[src * D + dist - 1] + 2));
}

/*
 * The router's lookahead as probabilities of use: its top-k each as likely
 * as its top-k this far ahead has turned out to be routed (r), the rest of
 * k shared by the speculative probabilities.
 */
static void router_use(const float *spec, uint32_t J, uint32_t K, const uint16_t *top, float r,
		       float *use)
{
	bool in[MP_MAX_EXPERTS] = { 0 };
	double rest = 0;

	for (uint32_t t = 0; t < K; t++)
		in[top[t]] = true;
	for (uint32_t j = 0; j < J; j++)
		rest += in[j] ? 0 : spec[j];
	for (uint32_t j = 0; j < J; j++)
		use[j] = in[j] ? r : rest > 0 ? (float)(K * (1 - r) * spec[j] / rest) : 0.0f;
}

/*
 * Layer m = layer + dist: the router's lookahead (spec, NULL: not computed)
 * and the trajectory vote (traj, NULL: none), each weighted by its measured
 * precision this far ahead, as one probability of use; planned
 * (worth-a-read rule) when the layer is within the prefetch distance, and
 * its hints either way.
 */
static void plan_ahead(struct mp_prefetch *pf, uint32_t layer, uint32_t dist, const float *spec,
		       const float *traj, float score)
{
	struct finemoe *f = pf->priv;
	struct finemoe_req *q = pf->it->priv;
	const uint32_t J = pf->env.experts, K = pf->env.topk, D = pf->env.distance;
	const uint32_t m = layer + dist;
	uint16_t *rtop = top_at(pf, q, m, dist, SRC_ROUTER);
	float use[MP_MAX_EXPERTS], r = 0, e;

	if (spec) {
		r = precision(f, D, SRC_ROUTER, dist);
		top_of(spec, J, K, rtop);
		q->made[(size_t)m * D + dist - 1] |= 1u << SRC_ROUTER;
		router_use(spec, J, K, rtop, r, use);
	}
	if (!traj) {
		if (spec)
			plan_layer(pf, m, use, r, (int32_t)layer);
		return;
	}
	top_of(traj, J, K, top_at(pf, q, m, dist, SRC_TRAJ));
	q->made[(size_t)m * D + dist - 1] |= 1u << SRC_TRAJ;
	e = precision(f, D, SRC_TRAJ, dist);
	for (uint32_t j = 0; j < J; j++)
		use[j] = ((spec ? r * use[j] : 0) + e * traj[j]) / (r + e);
	plan_layer(pf, m, use, MP_MAX(r, MP_MIN(score, e)), (int32_t)layer);
}

/*
 * The depths whose router lookahead the next gate computes: those where it
 * has predicted at least as well as the trajectory vote (or there was no
 * vote), and all of them at one gate in SPEC_SAMPLE. On a model whose
 * routers say little about later layers (random weights, or depths past a
 * real one's reach) that saves most of the routers' CPU while their
 * precision stays measured.
 */
static uint32_t spec_want(struct finemoe *f, uint32_t D, bool traj)
{
	uint32_t want = 0;

	if (!traj || ++f->gates % SPEC_SAMPLE == 0)
		return UINT32_MAX;
	for (uint32_t dist = 1; dist <= D && dist <= 32; dist++)
		if (precision(f, D, SRC_ROUTER, dist) >= precision(f, D, SRC_TRAJ, dist))
			want |= 1u << (dist - 1);
	return want;
}

/*
 * After gate l: the trajectory's votes for layers l + 1 .. l + d (one
 * search), each combined with the router's lookahead for it, replace what
 * was planned for them before.
 */
static void finemoe_la_gate(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids,
			    uint32_t k, const float *spec)
{
	struct finemoe *f = pf->priv;
	struct mp_emap *m = emap_of(pf);
	struct finemoe_req *q = pf->it->priv;
	const uint32_t J = pf->env.experts, L = pf->env.layers;
	uint32_t n = MP_MIN(pf->spec_rows, L - 1 - layer);
	float use[MP_MAX_EXPERTS], score = 0;
	bool traj;

	score_layer(pf, layer, ids, k);
	if (!spec || !n) {
		finemoe_gate(pf, layer, ids, k, spec);
		return;
	}
	note_runs(pf, layer, ids, k);
	if (!pf->env.sem_dim && !next_pass(pf, &q->query, layer, pf->it->traj, use))
		mp_prefetch_hint(pf, layer, use);
	hold_hot(pf, layer);
	traj = m && !mp_emap_predict_traj_n(m, &q->query, pf->it->traj, layer + 1, layer + 1, n,
				       f->traj_use, &score) && score > 0;
	for (uint32_t i = 0; i < n; i++)
		plan_ahead(pf, layer, i + 1,
			   mp_prefetch_spec_wanted(pf, i) ? spec + (size_t)i * J : NULL,
			   traj ? f->traj_use + (size_t)i * J : NULL, score);
	pf->spec_want = spec_want(f, pf->env.distance, traj);
}

/*
 * The first d layers are predicted at the iteration's begin: with semantic
 * vectors when the step starts, without them right after the previous
 * iteration's last layer (about a layer earlier); the others d layers ahead.
 */
static float finemoe_lead(const struct mp_prefetch *pf, uint32_t layer)
{
	if (layer >= pf->env.distance)
		return (float)pf->env.distance;
	return (float)layer + (pf->env.sem_dim ? 0.0f : 1.0f);
}

static void finemoe_end(struct mp_prefetch *pf)
{
	struct mp_emap *m = emap_of(pf);
	struct finemoe_req *q = pf->it->priv;

	if (m)
		mp_emap_insert(m, &q->query, pf->it->traj, pf->it->sem);
}

static void finemoe_fini(struct mp_prefetch *pf)
{
	struct finemoe *f = pf->priv;

	if (!f)
		return;
	mp_emap_destroy(f->emap);
	for (uint32_t x = 0; x < MP_PREFETCH_MAX_MODELS - 1; x++)
		mp_emap_destroy(f->more[x]);
	free(f->sem_use);
	free(f->hits);
	free(f->total);
	free(f->traj_use);
	free(f);
	pf->priv = NULL;
}

static void finemoe_iter_fini(struct mp_prefetch *pf, struct mp_prefetch_iter *it)
{
	struct finemoe_req *q = it->priv;

	(void)pf;
	mp_emap_query_fini(&q->query);
	free(q->top);
	free(q->made);
	free(q->run);
}

/* A request's runs of routed experts. */
static int finemoe_iter_init(struct mp_prefetch *pf, struct mp_prefetch_iter *it)
{
	struct finemoe_req *q = it->priv;

	q->run = calloc((size_t)pf->env.layers * pf->env.experts, 1);
	q->run_request = it->request;
	q->run_model = it->model;
	return q->run ? 0 : -ENOMEM;
}

/* finemoe+nextlayer's per-request record of its predictions, to score them, and its runs. */
static int finemoe_la_iter_init(struct mp_prefetch *pf, struct mp_prefetch_iter *it)
{
	struct finemoe_req *q = it->priv;
	size_t n = (size_t)pf->env.layers * pf->env.distance;

	q->top = calloc(n * NSRC * pf->env.topk, sizeof(*q->top));
	q->made = calloc(n, 1);
	return q->top && q->made ? finemoe_iter_init(pf, it) : -ENOMEM;
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

/*
 * The memory the policy holds for its predictions: every model's store (with
 * its own query), and each request's query and, with nextlayer, its record
 * of predictions to score; the requests' arrays once they are allocated
 * (a query at its request's first search). 0 for another policy.
 */
uint64_t mp_prefetch_finemoe_bytes(struct mp_prefetch *pf)
{
	struct finemoe *f = pf->priv;
	struct mp_emap_stats es;
	uint64_t b;

	if (!is_finemoe(pf))
		return 0;
	mp_emap_stats(f->emap, &es);
	b = sizeof(*f) + es.bytes;
	for (uint32_t x = 0; x < MP_PREFETCH_MAX_MODELS - 1; x++) {
		if (!f->more[x])
			continue;
		mp_emap_stats(f->more[x], &es);
		b += es.bytes;
	}
	if (f->sem_use)
		b += (uint64_t)f->cfg.layers * f->cfg.experts * sizeof(float);
	if (f->hits)
		b += (uint64_t)pf->env.distance * (2 * NSRC * sizeof(double) +
						   f->cfg.experts * sizeof(float));
	for (uint32_t i = 0; i < pf->niters; i++) {
		const struct finemoe_req *q = pf->iters[i].priv;
		const uint64_t n = (uint64_t)pf->env.layers * pf->env.distance;

		if (!q)
			continue;
		/* Every store has f->cfg's geometry: any sizes a request's query. */
		b += sizeof(*q) + mp_emap_query_bytes(f->emap, &q->query);
		if (q->top)
			b += n * NSRC * pf->env.topk * sizeof(*q->top) + n;
		if (q->run)
			b += (uint64_t)pf->env.layers * pf->env.experts;
	}
	return b;
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
	.lead = finemoe_lead,
	.end = finemoe_end,
	.fini = finemoe_fini,
	.iter_size = sizeof(struct finemoe_req),
	.iter_init = finemoe_iter_init,
	.iter_fini = finemoe_iter_fini,
};

const struct mp_prefetch_ops mp_prefetch_finemoe_nextlayer = {
	.name = "finemoe+nextlayer",
	.description = "finemoe, with the routers of layers l+1..l+d on layer l's input "
		       "combined with the trajectory vote for each",
	.init = finemoe_init,
	.begin = finemoe_begin,
	.gate = finemoe_la_gate,
	.lead = finemoe_lead,
	.end = finemoe_end,
	.fini = finemoe_fini,
	.layer_input = true,
	.deep_input = true,
	.iter_size = sizeof(struct finemoe_req),
	.iter_init = finemoe_la_iter_init,
	.iter_fini = finemoe_iter_fini,
};
