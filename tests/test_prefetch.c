// SPDX-License-Identifier: MIT
/* Prefetch policies on hand-made traces: δ-selection, finemoe, oracle, dependency, eam, driver. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "pager/pager_priv.h"
#include "prefetch/policy.h"

/*
 * Hand-made traces
 */

struct mk {
	uint32_t layers, experts, topk, requests, tokens;
	/* expert chosen at (request, token, layer, i) */
	uint32_t (*pick)(uint32_t r, uint32_t t, uint32_t l, uint32_t i, uint32_t experts);
};

static struct mp_trace *make_trace(const struct mk *m)
{
	size_t cap = 1u << 22, len = 0;
	char *buf = malloc(cap);
	struct mp_trace *t = NULL;

	assert_non_null(buf);
	len += (size_t)snprintf(buf + len, cap - len, "# moe-trace v1\n# layers=%u\n# experts=%u\n"
				"# topk=%u\nrequest,token,layer", m->layers, m->experts, m->topk);
	for (uint32_t i = 0; i < m->topk; i++)
		len += (size_t)snprintf(buf + len, cap - len, ",e%u", i);
	for (uint32_t i = 0; i < m->topk; i++)
		len += (size_t)snprintf(buf + len, cap - len, ",w%u", i);
	len += (size_t)snprintf(buf + len, cap - len, "\n");
	for (uint32_t r = 0; r < m->requests; r++)
		for (uint32_t t = 0; t < m->tokens; t++)
			for (uint32_t l = 0; l < m->layers; l++) {
				len += (size_t)snprintf(buf + len, cap - len, "%u,%u,%u", r, t, l);
				for (uint32_t i = 0; i < m->topk; i++)
					len += (size_t)snprintf(buf + len, cap - len, ",%u",
								m->pick(r, t, l, i, m->experts));
				for (uint32_t i = 0; i < m->topk; i++)
					len += (size_t)snprintf(buf + len, cap - len, ",%.3f",
								i ? 0.4 : 0.6);
				len += (size_t)snprintf(buf + len, cap - len, "\n");
				assert_true(len < cap - 256);
			}
	assert_int_equal(mp_trace_parse(buf, len, "handmade", &t), 0);
	free(buf);
	return t;
}

/* Token t of every request follows one of 3 fixed trajectories, chosen by t % 3. */
static uint32_t pick_cycle3(uint32_t r, uint32_t t, uint32_t l, uint32_t i, uint32_t experts)
{
	uint32_t path = t % 3;

	(void)r;
	return (path * 5 + l * (path + 1) + i * 3) % experts;
}

/* As pick_cycle3, but the trajectory is a hash of (request, token): no token predicts the next. */
static uint32_t path_of(uint32_t r, uint32_t t)
{
	return (((r + 1) * 2654435761u) ^ (t * 40503u)) / 7u % 3u;
}

static uint32_t pick_hashed3(uint32_t r, uint32_t t, uint32_t l, uint32_t i, uint32_t experts)
{
	uint32_t path = path_of(r, t);

	return (path * 5 + l * (path + 1) + i * 3) % experts;
}

/* The semantic vector of a token of pick_hashed3: which trajectory it takes, one-hot. */
static int sem_of(void *arg, uint32_t r, uint32_t t, float *out)
{
	(void)arg;
	for (uint32_t i = 0; i < 3; i++)
		out[i] = i == path_of(r, t) ? 1.0f : 0.0f;
	return 0;
}

static void collect(const struct mp_prefetch *pf, uint32_t layer, uint32_t *ids, uint32_t *n)
{
	*n = 0;
	for (uint32_t i = 0; i < pf->n; i++)
		if (pf->items[i].layer == layer)
			ids[(*n)++] = pf->items[i].expert;
}

static bool same_set(const uint32_t *a, uint32_t na, const uint32_t *b, uint32_t nb)
{
	if (na != nb)
		return false;
	for (uint32_t i = 0; i < na; i++) {
		bool found = false;

		for (uint32_t j = 0; j < nb && !found; j++)
			found = a[i] == b[j];
		if (!found)
			return false;
	}
	return true;
}

/*
 * δ-selection
 */

static void score_one_selects_exactly_topk(void **state)
{
	const float p[6] = { 0.05f, 0.4f, 0.1f, 0.3f, 0.1f, 0.05f };
	uint32_t out[6];

	(void)state;
	assert_int_equal(mp_prefetch_select(p, 6, 2, 1.0f, out), 2);
	assert_int_equal(out[0], 1);
	assert_int_equal(out[1], 3);
	/* A score above 1 (rounding) or NaN trusts the map too. */
	assert_int_equal(mp_prefetch_select(p, 6, 2, 1.0001f, out), 2);
	assert_int_equal(mp_prefetch_select(p, 6, 2, NAN, out), 2);
}

static void score_zero_selects_every_nonzero_expert(void **state)
{
	const float p[6] = { 0.0f, 0.5f, 0.25f, 0.0f, 0.25f, 0.0f };
	uint32_t out[6];

	(void)state;
	assert_int_equal(mp_prefetch_select(p, 6, 2, 0.0f, out), 3);
	assert_int_equal(mp_prefetch_select(p, 6, 2, -0.7f, out), 3);
	assert_int_equal(out[0], 1);
}

static void partial_score_stops_at_the_cumulative_threshold(void **state)
{
	const float p[5] = { 0.1f, 0.4f, 0.2f, 0.25f, 0.05f };
	uint32_t out[5];

	(void)state;
	/* δ = 0.75: 0.4 + 0.25 = 0.65 < 0.75, + 0.2 = 0.85. */
	assert_int_equal(mp_prefetch_select(p, 5, 2, 0.25f, out), 3);
	assert_int_equal(out[2], 2);
	/* δ = 0.6 is met by the top 2 already: the minimum k decides. */
	assert_int_equal(mp_prefetch_select(p, 5, 2, 0.4f, out), 2);
}

static void delta_one_with_rounded_sums_is_capped(void **state)
{
	/* Sums to 0.99999 in float: δ = 1 can never be met exactly; the set stops at n. */
	const float p[3] = { 0.33333f, 0.33333f, 0.33333f };
	uint32_t out[3];

	(void)state;
	assert_int_equal(mp_prefetch_select(p, 3, 1, 0.0f, out), 3);
}

static void fewer_nonzero_than_k_still_gives_k(void **state)
{
	const float p[4] = { 0.0f, 0.0f, 1.0f, 0.0f };
	uint32_t out[4];

	(void)state;
	assert_int_equal(mp_prefetch_select(p, 4, 2, 0.0f, out), 2);
	assert_int_equal(out[0], 2);
}

/* p as selection ranks it: NaN and negatives are 0. */
static float ranked(float p)
{
	return p > 0 ? p : 0;
}

/*
 * The selection of 64 values with ties, zeros, a NaN and a negative, at
 * scores from 1 (top-k) to 0 (every non-zero): always the shortest prefix,
 * in decreasing p then increasing id, that a plain sort of all 64 gives,
 * however far past its first few members the set reaches.
 */
static void selection_is_the_prefix_of_the_whole_ranking(void **state)
{
	enum { N = 64 };
	float p[N];
	uint32_t out[N], ref[N];

	(void)state;
	for (uint32_t j = 0; j < N; j++)
		p[j] = (float)((j * 37) % 11) / 400.0f;	/* many ties, several zeros */
	p[5] = NAN;
	p[9] = -0.5f;
	for (uint32_t j = 0; j < N; j++)
		ref[j] = j;
	/* The ranking by selection: decreasing p, then increasing id. */
	for (uint32_t i = 0; i < N; i++)
		for (uint32_t j = i + 1; j < N; j++) {
			float a = ranked(p[ref[i]]), b = ranked(p[ref[j]]);

			if (b > a || (b == a && ref[j] < ref[i])) {
				uint32_t t = ref[i];

				ref[i] = ref[j];
				ref[j] = t;
			}
		}
	for (float score = 1.0f; score >= -0.01f; score -= 0.05f) {
		uint32_t m = mp_prefetch_select(p, N, 3, score, out), want = 0;
		double sum = 0;

		while (want < N && !(want >= 3 && (sum >= 1.0 - score - 1e-6 ||
						   !(ranked(p[ref[want]]) > 0))))
			sum += ranked(p[ref[want++]]);
		assert_int_equal(m, want);
		assert_memory_equal(out, ref, m * sizeof(*out));
	}
	/* Past the first 2k + 2 at low scores. */
	assert_true(mp_prefetch_select(p, N, 3, 0.0f, out) > 8);
}

static void priority_is_p_over_layer_distance(void **state)
{
	struct mp_prefetch_env env = { .layers = 8, .experts = 4, .topk = 1 };
	struct mp_prefetch pf;

	(void)state;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_none, &env), 0);
	mp_prefetch_emit(&pf, 5, 1, 0.6f, 2);
	mp_prefetch_emit(&pf, 0, 2, 0.5f, -1);
	mp_prefetch_emit(&pf, 3, 3, 0.4f, 3);	/* l == l_now: guarded */
	assert_int_equal(pf.n, 3);
	assert_true(fabsf(pf.items[0].prio - 0.2f) < 1e-6f);
	assert_true(fabsf(pf.items[1].prio - 0.5f) < 1e-6f);
	assert_true(fabsf(pf.items[2].prio - 0.4f) < 1e-6f);
	mp_prefetch_fini(&pf);
}

/* p > c / (c + dist): c = load_ratio; no gate while c is unknown. */
static void plan_use_reads_only_what_is_worth_a_read(void **state)
{
	struct mp_prefetch_env env = { .layers = 8, .experts = 4, .topk = 2 };
	const float use[4] = { 0.9f, 0.6f, 0.3f, 0.2f };
	struct mp_prefetch pf;

	(void)state;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_none, &env), 0);
	assert_float_equal(mp_prefetch_min_p(&pf, 3), 0.0, 0);
	pf.load_ratio = 4.0f;
	assert_float_equal(mp_prefetch_min_p(&pf, 3), 4.0 / 7.0, 1e-6);
	assert_float_equal(mp_prefetch_min_p(&pf, 0), 4.0 / 5.0, 1e-6);	/* as dist 1 */
	/* Score 0: δ = 1 takes all four; at distance 3 only p >= 4/7 is read. */
	mp_prefetch_plan_use(&pf, 5, use, 0.0f, 2);
	assert_int_equal(pf.n, 2);
	assert_int_equal(pf.items[0].expert, 0);
	assert_int_equal(pf.items[1].expert, 1);
	/* The hints keep all four, read or not. */
	for (uint32_t j = 0; j < 4; j++)
		assert_float_equal(pf.it->hint_p[5 * 4 + j], use[j], 0);
	assert_int_equal(pf.hint_dirty[5], 1);
	/* One layer ahead the bar is 4/5: only the first. */
	pf.n = 0;
	mp_prefetch_plan_use(&pf, 3, use, 0.0f, 2);
	assert_int_equal(pf.n, 1);
	/* Cheap reads (c = 0.1): everything δ selects. */
	pf.n = 0;
	pf.load_ratio = 0.1f;
	mp_prefetch_plan_use(&pf, 3, use, 0.0f, 2);
	assert_int_equal(pf.n, 4);
	mp_prefetch_fini(&pf);
}

/*
 * Policies
 */

static void run_token(struct mp_prefetch *pf, const struct mp_trace *t, uint32_t r, uint32_t tok,
		      uint32_t check_from, uint32_t *exact, uint32_t *checked)
{
	uint32_t L = mp_trace_layers(t), K = mp_trace_topk(t), d = pf->env.distance;

	mp_prefetch_begin(pf, r, tok, NULL);
	for (uint32_t l = 0; l < L; l++) {
		const uint32_t *ids, *truth;
		const float *w, *tw;
		uint32_t got[64], n;

		assert_int_equal(mp_trace_route(t, r, tok, l, &ids, &w), 0);
		assert_int_equal(mp_prefetch_gate(pf, l, ids, w, K, NULL, NULL), 0);
		if (l + d >= L || l < check_from)
			continue;
		assert_int_equal(mp_trace_route(t, r, tok, l + d, &truth, &tw), 0);
		collect(pf, l + d, got, &n);
		(*checked)++;
		*exact += same_set(got, n, truth, K);
	}
	mp_prefetch_end(pf);
}

/* finemoe (d = 3) over 12 x 16 top-2 that has learnt request 0 of three cycling trajectories. */
static struct mp_trace *finemoe_learnt(struct mp_prefetch *pf)
{
	struct mk m = { 12, 16, 2, 2, 30, pick_cycle3 };
	struct mp_trace *t = make_trace(&m);
	struct mp_prefetch_env env = { .layers = 12, .experts = 16, .topk = 2, .distance = 3 };
	uint32_t exact = 0, checked = 0;

	assert_int_equal(mp_prefetch_init(pf, &mp_prefetch_finemoe, &env), 0);
	for (uint32_t tok = 0; tok < 30; tok++)
		run_token(pf, t, 0, tok, UINT32_MAX, &exact, &checked);
	assert_int_equal(checked, 0);
	return t;
}

static void finemoe_predicts_a_seen_trajectory_exactly(void **state)
{
	struct mp_prefetch pf;
	struct mp_trace *t = finemoe_learnt(&pf);
	uint32_t exact = 0, checked = 0;

	(void)state;
	/* Request 1 replays request 0's three trajectories. */
	for (uint32_t tok = 0; tok < 30; tok++)
		run_token(&pf, t, 1, tok, 0, &exact, &checked);
	/* Score 1 on every prefix: exactly the true top-2 at every predicted layer. */
	assert_int_equal(checked, 30 * (12 - 3));
	assert_int_equal(exact, checked);
	mp_prefetch_fini(&pf);
	mp_trace_close(t);
}

/*
 * Models served together (mp_prefetch_set_model()): finemoe learns each in
 * its own store, so model 1's request is never predicted from model 0's
 * trajectories, even the very same one; model 0's still is, exactly.
 */
static void finemoe_predicts_a_model_from_its_own_trajectories_only(void **state)
{
	struct mp_prefetch pf;
	struct mp_trace *t = finemoe_learnt(&pf);
	uint32_t exact = 0, checked = 0;

	(void)state;
	mp_prefetch_set_model(&pf, 1);
	assert_int_equal(pf.it->model, 1);
	assert_false(pf.it->have_context);
	/* Model 1's store is empty: nothing predicted (it learns from here on). */
	run_token(&pf, t, 1, 0, 0, &exact, &checked);
	assert_int_equal(checked, 12 - 3);
	assert_int_equal(exact, 0);
	/* Model 0 again: its store predicts the trajectory it learnt exactly. */
	mp_prefetch_set_model(&pf, 0);
	exact = checked = 0;
	for (uint32_t tok = 0; tok < 30; tok++)
		run_token(&pf, t, 1, tok, 0, &exact, &checked);
	assert_int_equal(checked, 30 * (12 - 3));
	assert_int_equal(exact, checked);
	/* Past the models a prefetcher tells apart: ignored. */
	mp_prefetch_set_model(&pf, MP_PREFETCH_MAX_MODELS);
	assert_int_equal(pf.it->model, 0);
	mp_prefetch_fini(&pf);
	mp_trace_close(t);
}

/*
 * Two requests decoded in one batch report layer by layer, interleaved. Each
 * keeps its own trajectory (the iter mp_prefetch_switch() selects): at the
 * end of a token each holds every layer of its own routing, and the
 * predictions d layers ahead are exact for both, as for a request alone.
 */
static uint32_t interleaved_exact(uint32_t requests, bool *whole_maps)
{
	struct mk m = { 8, 16, 2, 3, 30, pick_hashed3 };
	struct mp_trace *t = make_trace(&m);
	struct mp_prefetch_env env = { .layers = 8, .experts = 16, .topk = 2, .distance = 2,
				       .requests = requests };
	struct mp_prefetch pf;
	uint32_t exact = 0, checked = 0;

	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_finemoe, &env), 0);
	for (uint32_t tok = 0; tok < 30; tok++)
		run_token(&pf, t, 0, tok, UINT32_MAX, &exact, &checked);
	*whole_maps = true;
	for (uint32_t tok = 0; tok < 30; tok++) {
		for (uint32_t r = 1; r <= 2; r++) {
			mp_prefetch_switch(&pf, r);
			mp_prefetch_begin(&pf, r, tok, NULL);
		}
		for (uint32_t l = 0; l < 8; l++) {
			for (uint32_t r = 1; r <= 2; r++) {
				const uint32_t *ids, *truth;
				const float *w, *tw;
				uint32_t got[16], n;

				mp_prefetch_switch(&pf, r);
				assert_int_equal(mp_trace_route(t, r, tok, l, &ids, &w), 0);
				assert_int_equal(mp_prefetch_gate(&pf, l, ids, w, 2, NULL, NULL), 0);
				if (l + 2 >= 8)
					continue;
				assert_int_equal(mp_trace_route(t, r, tok, l + 2, &truth, &tw), 0);
				collect(&pf, l + 2, got, &n);
				checked++;
				exact += same_set(got, n, truth, 2);
			}
		}
		for (uint32_t r = 1; r <= 2; r++) {
			mp_prefetch_switch(&pf, r);
			for (uint32_t l = 0; l < 8; l++) {
				const uint32_t *ids;
				const float *w;

				assert_int_equal(mp_trace_route(t, r, tok, l, &ids, &w), 0);
				*whole_maps &= pf.it->traj[l * 16 + ids[0]] > 0 &&
					       pf.it->traj[l * 16 + ids[1]] > 0;
			}
			mp_prefetch_end(&pf);
		}
	}
	assert_int_equal(checked, 30 * 2 * (8 - 2));
	mp_prefetch_fini(&pf);
	mp_trace_close(t);
	return exact;
}

static void interleaved_requests_keep_their_own_trajectories(void **state)
{
	bool whole;

	(void)state;
	/* One iter for both: each switch ends the other's iteration, its map is lost. */
	interleaved_exact(1, &whole);
	assert_false(whole);
	assert_int_equal(interleaved_exact(3, &whole), 30 * 2 * (8 - 2));
	assert_true(whole);
}

/*
 * Whether what ops planned or hinted for layer l at the begin matches the
 * truth: the first d = 3 planned exactly; with late, layers d .. 2d - 1
 * planned exactly and none beyond, else the later layers' true pair has
 * the two highest hints (with semantic vectors).
 */
static bool begin_layer_ok(const struct mp_prefetch *pf, uint32_t l, const uint32_t *truth,
			   bool sem, bool late)
{
	uint32_t got[16], n, hi = 0;

	collect(pf, l, got, &n);
	if (l < 3)
		return same_set(got, n, truth, 2);
	if (late)
		return l < 6 ? same_set(got, n, truth, 2) : !n;
	for (uint32_t j = 0; j < 16; j++)
		hi += pf->it->hint_p[l * 16 + j] > fmaxf(pf->it->hint_p[l * 16 + truth[0]],
							   pf->it->hint_p[l * 16 + truth[1]]);
	return !sem || hi == 0;
}

/*
 * Tokens whose trajectory nothing before them predicts, but their semantic
 * vector does: with it finemoe plans the first d layers exactly before any
 * gate, and hints the later ones; without it (the previous map as context)
 * it cannot. Counts request 1's tokens whose every layer begin_layer_ok().
 */
static uint32_t begin_exact_of(const struct mp_prefetch_ops *ops, uint32_t sem_dim, bool late)
{
	struct mk m = { 8, 16, 2, 2, 40, pick_hashed3 };
	struct mp_trace *t = make_trace(&m);
	struct mp_prefetch_env env = { .layers = 8, .experts = 16, .topk = 2, .distance = 3,
				       .sem_dim = sem_dim };
	struct mp_prefetch pf;
	uint32_t exact = 0;
	float sem[3];

	assert_int_equal(mp_prefetch_init(&pf, ops, &env), 0);
	for (uint32_t r = 0; r < 2; r++) {
		for (uint32_t tok = 0; tok < 40; tok++) {
			bool all = true;

			sem_of(NULL, r, tok, sem);
			mp_prefetch_begin(&pf, r, tok, sem_dim ? sem : NULL);
			for (uint32_t l = 0; r == 1 && l < 8; l++) {
				const uint32_t *truth;
				const float *tw;

				assert_int_equal(mp_trace_route(t, r, tok, l, &truth, &tw), 0);
				all &= begin_layer_ok(&pf, l, truth, sem_dim, late);
			}
			exact += r == 1 && all;
			for (uint32_t l = 0; l < 8; l++) {
				const uint32_t *ids;
				const float *w;

				assert_int_equal(mp_trace_route(t, r, tok, l, &ids, &w), 0);
				assert_int_equal(mp_prefetch_gate(&pf, l, ids, w, 2, NULL, NULL), 0);
			}
			mp_prefetch_end(&pf);
		}
	}
	mp_prefetch_fini(&pf);
	mp_trace_close(t);
	return exact;
}

static void finemoe_plans_the_first_layers_from_the_semantic_vector(void **state)
{
	(void)state;
	assert_int_equal(begin_exact_of(&mp_prefetch_finemoe, 3, false), 40);
	assert_true(begin_exact_of(&mp_prefetch_finemoe, 0, false) < 40);
}

/* finemoe+nextlayer plans layers d .. 2d - 1 at the begin too; finemoe hints them. */
static void finemoe_nextlayer_plans_later_layers_from_the_semantic_vector(void **state)
{
	(void)state;
	assert_int_equal(begin_exact_of(&mp_prefetch_finemoe_nextlayer, 3, true), 40);
	assert_int_equal(begin_exact_of(&mp_prefetch_finemoe, 3, true), 0);
}

static void finemoe_with_an_empty_store_stays_on_demand(void **state)
{
	struct mk m = { 6, 8, 2, 1, 2, pick_cycle3 };
	struct mp_trace *t = make_trace(&m);
	struct mp_prefetch_env env = { .layers = 6, .experts = 8, .topk = 2, .distance = 2 };
	struct mp_prefetch pf;
	const uint32_t *ids;
	const float *w;

	(void)state;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_finemoe, &env), 0);
	mp_prefetch_begin(&pf, 0, 0, NULL);
	assert_int_equal(pf.n, 0);
	assert_int_equal(mp_trace_route(t, 0, 0, 0, &ids, &w), 0);
	assert_int_equal(mp_prefetch_gate(&pf, 0, ids, w, 2, NULL, NULL), 0);
	assert_int_equal(pf.n, 0);
	mp_prefetch_end(&pf);
	/* One map stored: the next iteration's first layers come from it. */
	assert_non_null(mp_prefetch_finemoe_emap(&pf));
	mp_prefetch_begin(&pf, 0, 1, NULL);
	assert_true(pf.n >= 2 * 2);
	mp_prefetch_fini(&pf);
	mp_trace_close(t);
}

/*
 * The lowest hint of experts lo..hi-1 and the highest of the others, over
 * every layer with hints (for the check below).
 */
static void hint_split(const struct mp_prefetch *pf, uint32_t lo, uint32_t hi, float *in,
		       float *out)
{
	const uint32_t L = pf->env.layers, J = pf->env.experts;

	*in = 2;
	*out = -2;
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t j = 0; j < J; j++) {
			float p = pf->it->hint_p[(size_t)l * J + j];

			if (j >= lo && j < hi)
				*in = fminf(*in, p);
			else
				*out = fmaxf(*out, p);
		}
}

/*
 * Request 0 routes experts 2 and 3 at every layer; request 1, with the same
 * semantic vector, 0 and 1. The semantic vote (request 0's records) hints 2
 * and 3 for request 1, where they are not used: once request 1 has routed 0
 * and 1 on its last 3 tokens (session 34's HOT_RUN), their hints rank above
 * every other expert's, at the begin and after every gate, with or without
 * semantic vectors (a run of the policy that does not use them), so
 * eviction and prefetch admission keep them.
 */
static void finemoe_hints_an_expert_every_recent_token_routes_above_the_rest(void **state)
{
	const float sem[4] = { 1, 0, 0, 0 };

	(void)state;
	for (uint32_t dim = 0; dim <= 4; dim += 4) {
		struct mp_prefetch_env env = { .layers = 4, .experts = 8, .topk = 2,
					       .distance = 1, .sem_dim = dim, .requests = 2 };
		struct mp_prefetch pf;
		uint32_t checked = 0;
		float in, out;

		assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_finemoe, &env), 0);
		for (uint32_t r = 0; r < 2; r++)
			for (uint32_t tok = 0; tok < (r ? 8 : 24); tok++) {
				const uint32_t ids[2] = { r ? 0 : 2, r ? 1 : 3 };

				mp_prefetch_switch(&pf, r);
				mp_prefetch_begin(&pf, r, tok, dim ? sem : NULL);
				for (uint32_t l = 0; l <= 4; l++) {
					if (l)
						assert_int_equal(mp_prefetch_gate(&pf, l - 1, ids, NULL,
										  2, NULL, NULL), 0);
					if (!r || tok < 3)
						continue;
					hint_split(&pf, 0, 2, &in, &out);
					assert_true(in > out);
					checked++;
				}
				mp_prefetch_end(&pf);
			}
		assert_int_equal(checked, 5 * 5);
		/* What it corrects: the vote alone ranks request 0's experts first. */
		if (dim) {
			float use[4 * 8], score;
			struct mp_emap_query q = { 0 };

			assert_int_equal(mp_emap_predict_sem(mp_prefetch_finemoe_emap(&pf), &q, sem,
							     use, &score), 0);
			assert_true(use[2] > use[0]);
			mp_emap_query_fini(&q);
		}
		mp_prefetch_fini(&pf);
	}
}

static void an_iteration_without_gates_teaches_nothing(void **state)
{
	struct mp_prefetch_env env = { .layers = 4, .experts = 8, .topk = 2, .distance = 1 };
	const uint32_t ids[2] = { 1, 2 };
	struct mp_emap_stats st;
	struct mp_prefetch pf;

	(void)state;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_finemoe, &env), 0);
	mp_prefetch_begin(&pf, 0, 0, NULL);
	for (uint32_t l = 0; l < 4; l++)
		assert_int_equal(mp_prefetch_gate(&pf, l, ids, NULL, 2, NULL, NULL), 0);
	mp_prefetch_end(&pf);
	/* A begin on a wrong guess of the next token, abandoned by the real next one. */
	mp_prefetch_begin(&pf, 0, 7, NULL);
	mp_prefetch_begin(&pf, 1, 0, NULL);
	mp_prefetch_end(&pf);
	mp_emap_stats(mp_prefetch_finemoe_emap(&pf), &st);
	assert_int_equal(st.count, 1);
	assert_int_equal(pf.iterations, 1);
	mp_prefetch_fini(&pf);
}

static void oracle_emits_the_true_future(void **state)
{
	struct mk m = { 10, 8, 2, 1, 7, pick_cycle3 };
	struct mp_trace *t = make_trace(&m);
	struct mp_prefetch_env env = { .layers = 10, .experts = 8, .topk = 2, .distance = 4,
				       .trace = t };
	struct mp_prefetch pf;
	uint32_t exact = 0, checked = 0;

	(void)state;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_oracle, &env), 0);
	for (uint32_t tok = 0; tok < 7; tok++)
		run_token(&pf, t, 0, tok, 0, &exact, &checked);
	assert_int_equal(checked, 7 * 6);
	assert_int_equal(exact, checked);
	/* A guessed next token past the request's end: no future, no error. */
	t_log_capture();
	t_log_reset();
	mp_prefetch_begin(&pf, 0, 7, NULL);
	assert_int_equal(pf.n, 0);
	mp_prefetch_begin(&pf, 5, 0, NULL);
	assert_int_equal(pf.n, 0);
	assert_false(t_log_contains("outside the trace"));
	mp_prefetch_fini(&pf);
	/* Without a trace the oracle cannot exist. */
	env.trace = NULL;
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_oracle, &env), -EINVAL);
	assert_true(t_log_contains("needs the replayed trace"));
	mp_trace_close(t);
}

/* Layer l + 1 always follows from layer l: expert (e * 3 + 1) % experts, one chain per token. */
static uint32_t pick_chain(uint32_t r, uint32_t t, uint32_t l, uint32_t i, uint32_t experts)
{
	uint32_t e = (r * 7 + t * 5) % experts;

	(void)i;
	for (uint32_t j = 0; j < l; j++)
		e = (e * 3 + 1) % experts;
	return e;
}

static void dependency_follows_recorded_transitions(void **state)
{
	struct mk m = { 8, 16, 1, 2, 40, pick_chain };
	struct mp_trace *t = make_trace(&m);
	struct mp_prefetch_env env = { .layers = 8, .experts = 16, .topk = 1, .distance = 1 };
	struct mp_prefetch pf;
	uint32_t exact = 0, checked = 0;

	(void)state;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_dependency, &env), 0);
	for (uint32_t tok = 0; tok < 40; tok++)
		run_token(&pf, t, 0, tok, UINT32_MAX, &exact, &checked);
	/* Every transition is deterministic and was seen (16 starts cover the chains). */
	for (uint32_t tok = 0; tok < 40; tok++)
		run_token(&pf, t, 1, tok, 0, &exact, &checked);
	assert_int_equal(checked, 40 * 7);
	assert_int_equal(exact, checked);
	mp_prefetch_fini(&pf);
	mp_trace_close(t);
}

/* Requests 0 and 2 use low experts, 1 and 3 high ones. */
static uint32_t pick_halves(uint32_t r, uint32_t t, uint32_t l, uint32_t i, uint32_t experts)
{
	uint32_t half = experts / 2;

	return (r % 2) * half + (t + l + i) % 2 + (i ? 2 : 0);
}

static void eam_matches_the_request_with_the_same_activation(void **state)
{
	struct mk m = { 4, 8, 2, 4, 6, pick_halves };
	struct mp_trace *t = make_trace(&m);
	struct mp_prefetch_env env = { .layers = 4, .experts = 8, .topk = 2, .distance = 1 };
	struct mp_prefetch pf;
	uint32_t exact = 0, checked = 0;

	(void)state;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_eam, &env), 0);
	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t tok = 0; tok < 6; tok++)
			run_token(&pf, t, r, tok, UINT32_MAX, &exact, &checked);
	/* Request 3 resembles request 1: every prediction falls in the high half. */
	for (uint32_t tok = 0; tok < 6; tok++) {
		mp_prefetch_begin(&pf, 3, tok, NULL);
		for (uint32_t l = 0; l < 4; l++) {
			const uint32_t *ids;
			const float *w;

			assert_int_equal(mp_trace_route(t, 3, tok, l, &ids, &w), 0);
			assert_int_equal(mp_prefetch_gate(&pf, l, ids, w, 2, NULL, NULL), 0);
			for (uint32_t i = 0; i < pf.n; i++) {
				assert_true(pf.items[i].expert >= 4);
				checked++;
			}
		}
		mp_prefetch_end(&pf);
	}
	assert_true(checked >= 6 * 3 * 2);
	mp_prefetch_fini(&pf);
	mp_trace_close(t);
}

static void nextlayer_speculates_from_the_next_router(void **state)
{
	struct mp_prefetch_env env = { .layers = 4, .experts = 6, .topk = 2 };
	const float spec[6] = { 0.05f, 0.1f, 0.5f, 0.05f, 0.25f, 0.05f };
	const uint32_t ids[2] = { 0, 1 };
	struct mp_prefetch pf;
	uint32_t got[6], n;

	(void)state;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_nextlayer, &env), 0);
	mp_prefetch_begin(&pf, 0, 0, NULL);
	assert_int_equal(mp_prefetch_gate(&pf, 1, ids, NULL, 2, NULL, spec), 0);
	collect(&pf, 2, got, &n);
	assert_int_equal(n, 2);
	assert_int_equal(got[0], 2);
	assert_int_equal(got[1], 4);
	/* No hidden state: nothing to speculate on. */
	assert_int_equal(mp_prefetch_gate(&pf, 2, ids, NULL, 2, NULL, NULL), 0);
	assert_int_equal(pf.n, 0);
	mp_prefetch_fini(&pf);
}

/* The p finemoe+nextlayer gave layer's experts in its last output (-1: none). */
static float item_p(const struct mp_prefetch *pf, uint32_t layer, uint32_t expert)
{
	for (uint32_t i = 0; i < pf->n; i++)
		if (pf->items[i].layer == layer && pf->items[i].expert == expert)
			return pf->items[i].p;
	return -1.0f;
}

/*
 * finemoe+nextlayer takes the routers of the next d layers (spec_rows = d)
 * and plans each of those layers from its lookahead: its top-k each as
 * likely as the router's top-k that far ahead has turned out to be routed
 * (1/2 before any check, counted per distance as the layers route), the
 * rest of k shared by the other experts' speculative probabilities; read
 * when worth a read (mp_prefetch_min_p()), hinted either way. With an empty
 * store there is no trajectory vote to combine it with.
 */
static void finemoe_nextlayer_plans_every_layer_within_reach(void **state)
{
	struct mp_prefetch_env env = { .layers = 6, .experts = 6, .topk = 2, .distance = 2 };
	const float spec[12] = { 0.05f, 0.1f, 0.5f, 0.05f, 0.25f, 0.05f,	/* layer + 1 */
				 0.4f, 0.3f, 0.1f, 0.1f, 0.05f, 0.05f };	/* layer + 2 */
	const uint32_t ids[2] = { 2, 4 }, far[2] = { 0, 1 }, other[2] = { 3, 5 }, mid[2] = { 2, 3 };
	struct mp_prefetch pf;
	uint32_t got[6], n;

	(void)state;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_finemoe_nextlayer, &env), 0);
	assert_true(pf.ops->layer_input);
	assert_int_equal(pf.spec_rows, 2);
	assert_ptr_equal(mp_prefetch_find("finemoe+nextlayer"), &mp_prefetch_finemoe_nextlayer);
	assert_non_null(mp_prefetch_finemoe_emap(&pf));
	mp_prefetch_begin(&pf, 0, 0, NULL);
	pf.load_ratio = 0.5f;
	/* Both rows' top-2, each 1/2 likely. */
	assert_int_equal(mp_prefetch_gate(&pf, 0, ids, NULL, 2, NULL, spec), 0);
	collect(&pf, 1, got, &n);
	assert_true(same_set(got, n, ids, 2));
	collect(&pf, 2, got, &n);
	assert_true(same_set(got, n, far, 2));
	assert_float_equal(item_p(&pf, 2, 0), 0.5, 1e-6);
	/* Layer 1 routed as speculated one layer ahead: 2 of 2, p = (2 + 1) / (2 + 2). */
	assert_int_equal(mp_prefetch_gate(&pf, 1, ids, NULL, 2, NULL, spec), 0);
	collect(&pf, 2, got, &n);
	assert_true(same_set(got, n, ids, 2));
	assert_float_equal(item_p(&pf, 2, 2), 0.75, 1e-6);
	assert_float_equal(item_p(&pf, 3, 0), 0.5, 1e-6);
	/* Layer 2 routes elsewhere: 2 of 4 one layer ahead, 0 of 2 two layers ahead. */
	assert_int_equal(mp_prefetch_gate(&pf, 2, other, NULL, 2, NULL, spec), 0);
	assert_float_equal(item_p(&pf, 3, 2), 0.5, 1e-6);
	/*
	 * Reads two layers of compute long. Layer 3 routes as speculated one
	 * layer ahead (4 of 6: p = 5/8, below 2/3: not worth it, but hinted),
	 * not two (0 of 4: p = 1/6, and the other four share 5/3 by their
	 * speculative probabilities: 5/9 for experts 2 and 3, worth it at 1/2).
	 */
	pf.load_ratio = 2.0f;
	assert_int_equal(mp_prefetch_gate(&pf, 3, ids, NULL, 2, NULL, spec), 0);
	collect(&pf, 4, got, &n);
	assert_int_equal(n, 0);
	assert_float_equal(pf.it->hint_p[4 * 6 + 2], 0.625, 1e-6);
	collect(&pf, 5, got, &n);
	assert_true(same_set(got, n, mid, 2));
	assert_float_equal(item_p(&pf, 5, 2), 5.0 / 9, 1e-6);
	mp_prefetch_fini(&pf);
}

/*
 * One iteration of finemoe+nextlayer routing every layer to ids, with the
 * same speculative gates at each; the spec_want it left after each gate
 * goes into wants[layer] (wants may be NULL).
 */
static void la_iteration(struct mp_prefetch *pf, uint32_t tok, const uint32_t *ids,
			 const float *spec, uint32_t *wants)
{
	mp_prefetch_begin(pf, 0, tok, NULL);
	for (uint32_t l = 0; l < pf->env.layers; l++) {
		assert_int_equal(mp_prefetch_gate(pf, l, ids, NULL, 2, NULL, spec), 0);
		if (wants)
			wants[l] = pf->spec_want;
	}
	mp_prefetch_end(pf);
}

/*
 * finemoe+nextlayer asks for a depth's router lookahead (pf.spec_want) only
 * while it predicts that depth at least as well as the trajectory vote, and
 * for every depth at one gate in 8 (its precision stays measured); a row
 * it did not ask for is not read. Without a trajectory vote (empty store)
 * it asks for all. A router that is right keeps being asked.
 */
static void finemoe_nextlayer_asks_for_the_router_only_where_it_beats_the_trajectory(void **state)
{
	struct mp_prefetch_env env = { .layers = 6, .experts = 6, .topk = 2, .distance = 2 };
	/* Both rows speculate experts 4 and 5; every layer routes to 0 and 1. */
	const float wrong[12] = { 0.02f, 0.02f, 0.03f, 0.03f, 0.5f, 0.4f,
				  0.02f, 0.02f, 0.03f, 0.03f, 0.5f, 0.4f };
	const float right[12] = { 0.5f, 0.4f, 0.03f, 0.03f, 0.02f, 0.02f,
				  0.5f, 0.4f, 0.03f, 0.03f, 0.02f, 0.02f };
	const uint32_t ids[2] = { 0, 1 };
	struct mp_prefetch pf;
	uint32_t wants[6], got[6], n, gates = 0;

	(void)state;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_finemoe_nextlayer, &env), 0);
	assert_int_equal(pf.spec_want, UINT32_MAX);
	assert_true(mp_prefetch_spec_wanted(&pf, 0) && mp_prefetch_spec_wanted(&pf, 1));
	pf.load_ratio = 0.5f;
	/* Empty store: the router is all there is, asked at every gate (and 0 of 2 right). */
	la_iteration(&pf, 0, ids, wrong, wants);
	for (uint32_t l = 0; l < 5; l++)
		assert_int_equal(wants[l], UINT32_MAX);
	/*
	 * Now the trajectory vote (1/2 before any check) beats the router
	 * (0 of 10 right one layer ahead: 1/12; 0 of 8 two ahead: 1/10):
	 * no row asked for, but at every 8th gate that had a vote (gates
	 * 0..4 of each iteration have a layer ahead; layer 5's plans nothing).
	 */
	for (uint32_t tok = 1; tok < 5; tok++) {
		mp_prefetch_begin(&pf, 0, tok, NULL);
		for (uint32_t l = 0; l < 6; l++) {
			bool asked = mp_prefetch_spec_wanted(&pf, 0);

			assert_int_equal(mp_prefetch_gate(&pf, l, ids, NULL, 2, NULL, wrong), 0);
			/* The unread rows' experts 4 and 5 are never planned. */
			if (!asked && l < 4) {
				collect(&pf, l + 2, got, &n);
				assert_true(same_set(got, n, ids, 2));
			}
			if (l == 5)
				continue;
			gates++;
			assert_int_equal(pf.spec_want, gates % 8 ? 0 : UINT32_MAX);
		}
		mp_prefetch_end(&pf);
	}
	mp_prefetch_fini(&pf);

	/* A router that is right beats the trajectory vote's 1/2: asked at both depths. */
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_finemoe_nextlayer, &env), 0);
	pf.load_ratio = 0.5f;
	la_iteration(&pf, 0, ids, right, NULL);
	la_iteration(&pf, 1, ids, right, wants);
	for (uint32_t l = 0; l < 5; l++)
		assert_int_equal(wants[l] & 3u, 3u);
	mp_prefetch_fini(&pf);
}

/*
 * The eviction hints' miss weights: a layer finemoe predicts less than a
 * read's time before its use costs MP_PREFETCH_MISS_W; without semantic
 * vectors its first layers are predicted a layer earlier. Nothing before
 * the load ratio is known, or when every layer is alike; none never
 * predicts, so its layers are all alike.
 */
static void miss_weights_mark_the_layers_no_prefetch_reaches_in_time(void **state)
{
	struct mp_prefetch_env env = { .layers = 6, .experts = 6, .topk = 2, .distance = 3,
				       .sem_dim = 4 };
	const float W = MP_PREFETCH_MISS_W;
	struct mp_prefetch pf;
	float w[6];

	(void)state;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_finemoe, &env), 0);
	mp_prefetch_miss_weights(&pf, w);
	for (uint32_t l = 0; l < 6; l++)
		assert_float_equal(w[l], 1.0, 0);
	/* Leads 0, 1, 2, 3, 3, 3 layers: a read of 1.5 layers is late for layers 0 and 1. */
	pf.load_ratio = 1.5f;
	mp_prefetch_miss_weights(&pf, w);
	for (uint32_t l = 0; l < 6; l++)
		assert_float_equal(w[l], l < 2 ? W : 1.0, 0);
	/* Slower than every lead: all alike. */
	pf.load_ratio = 4.0f;
	mp_prefetch_miss_weights(&pf, w);
	for (uint32_t l = 0; l < 6; l++)
		assert_float_equal(w[l], 1.0, 0);
	mp_prefetch_fini(&pf);
	env.sem_dim = 0;
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_finemoe, &env), 0);
	pf.load_ratio = 1.5f;
	mp_prefetch_miss_weights(&pf, w);
	for (uint32_t l = 0; l < 6; l++)
		assert_float_equal(w[l], l < 1 ? W : 1.0, 0);
	mp_prefetch_fini(&pf);
	assert_int_equal(mp_prefetch_init(&pf, &mp_prefetch_none, &env), 0);
	pf.load_ratio = 1.5f;
	mp_prefetch_miss_weights(&pf, w);
	for (uint32_t l = 0; l < 6; l++)
		assert_float_equal(w[l], 1.0, 0);
	mp_prefetch_fini(&pf);
}

static void names_are_checked(void **state)
{
	(void)state;
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_prefetch_check_names("finemoe", "coserve"), 0);
	assert_int_equal(mp_prefetch_check_names("fastest", NULL), -EINVAL);
	assert_true(t_log_contains("unknown prefetch policy 'fastest'"));
	assert_int_equal(mp_prefetch_check_names(NULL, "random"), -EINVAL);
	assert_true(t_log_contains("belady"));
}

/*
 * The driver over a real pager: predictions become prefetches, off the calling thread.
 */

/* The tiny bf16 model generated at t_path(name) with seed, opened. */
static struct mp_store *tiny_store(const char *name, uint64_t seed)
{
	struct mp_store *s;

	assert_int_equal(t_gen_tiny(t_path(name), MP_DTYPE_BF16, seed), 0);
	assert_int_equal(mp_store_open(t_path(name), &s), 0);
	return s;
}

/* mp_pager_open(); skips the test (closing s) when userfaultfd is refused outside CI. */
static struct mp_pager *open_or_skip(struct mp_store *s, const struct mp_pager_config *pc)
{
	struct mp_pager *p;
	int err = mp_pager_open(s, pc, &p);

	if (err == -EPERM && !t_require_all()) {
		mp_store_close(s);
		skip();
	}
	assert_int_equal(err, 0);
	return p;
}

/* A pager over a new tiny store with budget ("100%": nothing is evicted; NULL: the default). */
static struct mp_pager *open_tiny(const char *name, uint64_t seed, const char *budget,
				  struct mp_store **s)
{
	struct mp_pager_config pc;

	*s = tiny_store(name, seed);
	mp_pager_config_init(&pc);
	pc.budget = budget;
	return open_or_skip(*s, &pc);
}

static void driver_prefetches_what_the_policy_predicts(void **state)
{
	struct mp_prefetcher_config fc = { .policy = "oracle", .distance = 1 };
	struct mp_prefetcher_stats st;
	struct mp_prefetcher *pf;
	struct mp_store *s;
	struct mp_pager *p;
	const struct mp_geometry *g;
	struct mp_trace *t;

	(void)state;
	p = open_tiny("tiny.mpk", 3, "100%", &s);
	g = mp_store_geometry(s);
	struct mk m = { g->layers, g->experts, g->topk, 1, 3, pick_cycle3 };
	t = make_trace(&m);
	fc.trace = t;
	assert_int_equal(mp_prefetcher_open(p, &fc, &pf), 0);
	/* Layer 0 of token 0: the oracle asks for layer 1's experts. */
	const uint32_t *ids, *next;
	const float *w;

	assert_int_equal(mp_trace_route(t, 0, 0, 0, &ids, &w), 0);
	assert_int_equal(mp_prefetcher_gate(pf, 0, 0, 0, ids, w, g->topk, NULL, NULL), 0);
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_trace_route(t, 0, 0, 1, &next, &w), 0);
	for (uint32_t i = 0; i < g->topk; i++)
		assert_int_equal(mp_pager_residency(p, 1, next[i]), MP_RES_MAPPED);
	mp_prefetcher_stats(pf, &st);
	assert_int_equal(st.events, 1);
	assert_int_equal(st.dropped, 0);
	assert_true(st.issued >= g->topk);
	/* Bad input is an error, never a crash. */
	assert_int_equal(mp_prefetcher_gate(pf, 0, 0, g->layers, ids, w, g->topk, NULL, NULL),
			 -EINVAL);
	mp_prefetcher_close(pf);
	mp_pager_close(p);
	mp_trace_close(t);
	mp_store_close(s);
}

/* Layer l's eviction hint of row (what the pager's eviction reads). */
static float hint_of(struct mp_pager *p, uint32_t l, uint32_t row)
{
	float v;

	pthread_mutex_lock(&p->lock);
	v = p->evict.env.hints->p[mp_pager_slot(p, l, row)];
	pthread_mutex_unlock(&p->lock);
	return v;
}

/*
 * Two models over one pager (mp_prefetcher_set_models(), as Multi-MoE
 * serves them): model 1's rows are E + e, bound to a second source. While
 * only model 1 has a request open, model 0's rows are hinted 0 (first to
 * go); model 1's request teaches model 1's store only; once it closes and
 * model 0's opens, its hints do not fall on model 0's rows (a closed
 * request's map is gone: they used to land on rows e) and model 1's rows
 * are the 0s.
 */
static void driver_hints_the_rows_of_the_models_running(void **state)
{
	struct mp_prefetcher_config fc = { .policy = "finemoe", .distance = 1, .requests = 4 };
	const struct mp_expert_source_ops *ops = mp_prefetcher_source_ops();
	struct mp_prefetcher_stats st;
	struct mp_pager_config pc;
	struct mp_prefetcher *pf;
	struct mp_store *s;
	struct mp_pager *p;
	uint32_t L, E, *tab;
	int src;

	(void)state;
	s = tiny_store("tiny-models.mpk", 11);
	L = mp_store_geometry(s)->layers;
	E = mp_store_geometry(s)->experts;
	mp_pager_config_init(&pc);
	pc.budget = "100%";
	pc.slots_per_layer = 2 * E;
	p = open_or_skip(s, &pc);
	src = mp_pager_add_store(p, s);
	assert_true(src > 0);
	tab = malloc(2 * L * E * sizeof(*tab));
	const uint32_t **m0 = malloc(2 * L * sizeof(*m0)), **m1 = m0 + L;
	const uint32_t *const *maps[2] = { m0, m1 };

	assert_non_null(tab);
	assert_non_null(m0);
	for (uint32_t l = 0; l < L; l++) {
		m0[l] = tab + (size_t)l * E;
		m1[l] = tab + (size_t)(L + l) * E;
		for (uint32_t e = 0; e < E; e++) {
			tab[(size_t)l * E + e] = e;
			tab[(size_t)(L + l) * E + e] = E + e;
			assert_int_equal(mp_pager_bind(p, l, E + e, src, e), 0);
		}
	}
	assert_int_equal(mp_prefetcher_open(p, &fc, &pf), 0);
	assert_int_equal(mp_prefetcher_set_models(pf, maps, MP_PREFETCH_MAX_MODELS + 1, 0),
			 -EINVAL);
	assert_int_equal(mp_prefetcher_set_models(pf, maps, 2, 4), -EINVAL);
	assert_int_equal(mp_prefetcher_set_models(pf, maps, 2, 0), 0);
	ops->seq_map(pf, 1, m1);
	for (uint32_t tok = 0; tok < 6; tok++)
		for (uint32_t l = 0; l < L; l++) {
			uint32_t rows[2] = { E + (tok + l) % E, E + (tok + l + 1) % E };

			assert_int_equal(ops->route(pf, 1, tok, l, rows, NULL, 2), 0);
		}
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	mp_prefetcher_stats(pf, &st);
	assert_int_equal(st.emap_records, 0);	/* model 0's store learnt nothing */
	bool hinted = false;

	for (uint32_t l = 0; l < L; l++)
		for (uint32_t e = 0; e < E; e++) {
			assert_float_equal(hint_of(p, l, e), 0.0f, 0);
			hinted |= hint_of(p, l, E + e) > 0;
		}
	assert_true(hinted);
	ops->seq_map(pf, 1, NULL);
	ops->seq_map(pf, 2, m0);
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t e = 0; e < E; e++) {
			assert_float_equal(hint_of(p, l, e), -1.0f, 0);
			assert_float_equal(hint_of(p, l, E + e), 0.0f, 0);
		}
	mp_prefetcher_stats(pf, &st);
	assert_int_equal(st.hint_unmapped, 0);
	ops->seq_map(pf, 2, NULL);
	assert_int_equal(mp_prefetcher_set_models(pf, NULL, 0, 0), 0);
	mp_prefetcher_close(pf);
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t e = 0; e < E; e++)
			mp_pager_unbind(p, l, E + e);
	mp_pager_close(p);
	mp_store_close(s);
	free(tab);
	free(m0);
}

/* Threads of this process (/proc/self/task entries). */
static uint32_t thread_count(void)
{
	DIR *dir = opendir("/proc/self/task");
	struct dirent *e;
	uint32_t n = 0;

	assert_non_null(dir);
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

/*
 * Policy none starts no thread: its gates are handled on the calling thread
 * before mp_prefetcher_gate() returns (a thread woken per gate cost the
 * engine more than the handling). A predicting policy keeps its thread.
 */
static void policy_none_handles_gates_on_the_callers_thread(void **state)
{
	struct mp_prefetcher_config none = { .policy = "none" }, dep = { .policy = "dependency" };
	struct mp_prefetcher_stats st;
	struct mp_pager_config pc;
	struct mp_prefetcher *pf;
	struct mp_store *s;
	struct mp_pager *p;
	uint32_t before, ids[2] = { 1, 4 };

	(void)state;
	s = tiny_store("tiny-inline.mpk", 12);
	mp_pager_config_init(&pc);
	p = open_or_skip(s, &pc);
	before = thread_count();
	assert_int_equal(mp_prefetcher_open(p, &none, &pf), 0);
	assert_int_equal(thread_count(), before);
	for (uint32_t l = 0; l < 3; l++) {
		assert_int_equal(mp_prefetcher_gate(pf, 0, 0, l, ids, NULL, 2, NULL, NULL), 0);
		mp_prefetcher_stats(pf, &st);
		assert_int_equal(st.events, l + 1);
	}
	assert_int_equal(st.dropped, 0);
	mp_prefetcher_close(pf);
	assert_int_equal(mp_prefetcher_open(p, &dep, &pf), 0);
	assert_int_equal(thread_count(), before + 1);
	mp_prefetcher_close(pf);
	mp_pager_close(p);
	mp_store_close(s);
}

/*
 * The driver learns one read's cost in layers of compute (load_ratio) from
 * the pager's demand reads and the gaps between gates: a budget of two
 * experts makes every token read, and a pause between gates stands in for
 * the layer's compute. Times are the machine's: only the wiring is checked.
 */
static void driver_measures_the_load_ratio(void **state)
{
	struct mp_prefetcher_config fc = { .policy = "none" };
	struct mp_prefetcher_stats st;
	struct mp_pager_config pc;
	struct mp_pager_stats ps;
	struct mp_prefetcher *pf;
	const struct mp_geometry *g;
	struct mp_store *s;
	struct mp_pager *p;

	(void)state;
	s = tiny_store("tiny-lr.mpk", 11);
	g = mp_store_geometry(s);
	mp_pager_config_init(&pc);
	pc.budget_bytes = 2 * mp_store_expert_bytes(s);
	p = open_or_skip(s, &pc);
	assert_int_equal(mp_prefetcher_open(p, &fc, &pf), 0);
	mp_prefetcher_stats(pf, &st);
	assert_float_equal(st.load_ratio, 0.0, 0);
	for (uint32_t tok = 0; tok < 3; tok++)
		for (uint32_t l = 0; l < g->layers; l++) {
			uint32_t ids[2] = { (tok + l) % g->experts, (tok + l + 3) % g->experts };

			assert_int_equal(mp_prefetcher_gate(pf, 0, tok, l, ids, NULL, 2, NULL, NULL),
					 0);
			assert_int_equal(mp_pager_route(p, 0, tok, l, ids, NULL, 2), 0);
			/* Touch both: a miss waits for its demand read. */
			for (uint32_t i = 0; i < 2; i++) {
				const volatile uint8_t *x = mp_pager_expert(p, l, ids[i]);

				assert_non_null(x);
				(void)x[0];
			}
			usleep(2000);
		}
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	mp_pager_stats(p, &ps);
	assert_true(ps.file_reads > 0 && ps.file_read_ns > 0);
	mp_prefetcher_stats(pf, &st);
	assert_true(st.load_ratio > 0 && st.load_ratio < 1e6f);
	mp_prefetcher_close(pf);
	mp_pager_close(p);
	mp_store_close(s);
}

/*
 * Semantic vectors through the driver: trained from trace tokens with
 * sem.fn, then an iteration begun with its vector alone brings in the
 * first d layers' experts before any gate.
 */
static void driver_begins_an_iteration_from_its_semantic_vector(void **state)
{
	struct mp_prefetcher_config fc = { .policy = "finemoe", .distance = 2,
					   .sem = { 3, sem_of, NULL } };
	struct mp_prefetcher_config plain = { .policy = "finemoe" };
	struct mp_prefetcher *pf;
	const struct mp_geometry *g;
	struct mp_store *s;
	struct mp_pager *p;
	struct mp_trace *t;
	float sem[3];

	(void)state;
	t_log_capture();
	p = open_tiny("tiny-sem.mpk", 13, "100%", &s);
	g = mp_store_geometry(s);
	struct mk m = { g->layers, g->experts, g->topk, 2, 12, pick_hashed3 };
	t = make_trace(&m);
	/* Without sem.fn there are no vectors for the trace's tokens. */
	fc.sem.fn = NULL;
	assert_int_equal(mp_prefetcher_open(p, &fc, &pf), 0);
	assert_int_equal(mp_prefetcher_train(pf, t, 0, 0, 12), -EINVAL);
	mp_prefetcher_close(pf);
	fc.sem.fn = sem_of;
	assert_int_equal(mp_prefetcher_open(p, &fc, &pf), 0);
	assert_int_equal(mp_prefetcher_train(pf, t, 0, 0, 12), 0);
	for (uint32_t tok = 0; tok < 3; tok++) {
		sem_of(NULL, 1, tok, sem);
		assert_int_equal(mp_prefetcher_begin(pf, 1, tok, sem), 0);
		assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
		assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
		for (uint32_t l = 0; l < 2; l++) {
			const uint32_t *ids;
			const float *w;

			assert_int_equal(mp_trace_route(t, 1, tok, l, &ids, &w), 0);
			for (uint32_t i = 0; i < g->topk; i++)
				assert_int_equal(mp_pager_residency(p, l, ids[i]), MP_RES_MAPPED);
		}
		/* Evict everything for the next token's check (none is in use). */
		for (uint32_t l = 0; l < g->layers; l++)
			for (uint32_t e = 0; e < g->experts; e++)
				mp_pager_evict(p, l, e, 0);
	}
	assert_int_equal(mp_prefetcher_begin(pf, 1, 3, NULL), -EINVAL);
	mp_prefetcher_close(pf);
	/* A prefetcher opened without semantic vectors takes none. */
	assert_int_equal(mp_prefetcher_open(p, &plain, &pf), 0);
	t_log_reset();
	assert_int_equal(mp_prefetcher_begin(pf, 1, 0, sem), -EINVAL);
	assert_true(t_log_contains("opened without semantic vectors"));
	mp_prefetcher_close(pf);
	mp_pager_close(p);
	mp_trace_close(t);
	mp_store_close(s);
}

static void trajectory_records_drive_the_prefetcher(void **state)
{
	struct mp_traj_opts to = { .source = MP_TRAJ_SRC_INPROC };
	struct mp_prefetcher_config fc = { .policy = "dependency", .distance = 1 };
	struct mp_prefetcher_stats st;
	struct mp_prefetcher *pf;
	const struct mp_geometry *g;
	struct mp_traj *tr;
	struct mp_store *s;
	struct mp_pager *p;

	(void)state;
	p = open_tiny("tiny5.mpk", 7, NULL, &s);
	g = mp_store_geometry(s);
	assert_int_equal(mp_prefetcher_open(p, &fc, &pf), 0);
	assert_int_equal(mp_traj_open(&to, &tr), 0);
	assert_int_equal(mp_traj_start(tr), 0);
	/* Two tokens of every layer, then a prompt record that must not count. */
	for (uint32_t tok = 0; tok < 2; tok++)
		for (uint32_t l = 0; l < g->layers; l++) {
			uint32_t ids[2] = { l % g->experts, (l + 1) % g->experts };

			assert_int_equal(mp_traj_route(tr, 0, tok, l, g->topk, ids, NULL), 0);
		}
	{
		uint32_t ids[2] = { 0, 1 };

		assert_int_equal(mp_traj_route(tr, 0, MP_TRAJ_NONE, 0, g->topk, ids, NULL), 0);
	}
	assert_int_equal(mp_traj_poll(tr, 0, mp_prefetcher_traj_fn, pf), 2 * g->layers + 1);
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	mp_prefetcher_stats(pf, &st);
	assert_int_equal(st.events, 2 * g->layers);
	/* The second token follows the first's transitions: predictions were made. */
	assert_true(st.predicted > 0);
	mp_traj_close(tr);
	mp_prefetcher_close(pf);
	mp_pager_close(p);
	mp_store_close(s);
}

static void driver_keeps_the_expert_maps_across_restarts(void **state)
{
	const char *maps = t_path("tiny2.emap");
	struct mp_prefetcher_config fc = { .policy = "finemoe", .emap_path = maps };
	struct mp_prefetcher_stats st;
	struct mp_prefetcher *pf;
	struct mp_store *s;
	struct mp_pager *p;
	const struct mp_geometry *g;
	struct mp_trace *t;

	(void)state;
	p = open_tiny("tiny2.mpk", 4, NULL, &s);
	g = mp_store_geometry(s);
	struct mk m = { g->layers, g->experts, g->topk, 1, 5, pick_cycle3 };
	t = make_trace(&m);
	assert_int_equal(mp_prefetcher_open(p, &fc, &pf), 0);
	assert_int_equal(mp_prefetcher_train(pf, t, 0, 0, 5), 0);
	mp_prefetcher_stats(pf, &st);
	assert_int_equal(st.emap_records, 5);
	assert_true(st.emap_bytes > 0);
	mp_prefetcher_close(pf);
	assert_int_equal(access(maps, F_OK), 0);
	/* A restarted prefetcher starts with what the first one learned. */
	assert_int_equal(mp_prefetcher_open(p, &fc, &pf), 0);
	mp_prefetcher_stats(pf, &st);
	assert_int_equal(st.emap_records, 5);
	mp_prefetcher_close(pf);
	mp_pager_close(p);
	mp_trace_close(t);
	mp_store_close(s);
}

/*
 * emap_bytes counts each followed request's query (session 34): a second
 * request's first gate (no iteration ended, so the store is unchanged)
 * adds at least its query's rows (L x J floats) and products (C x 36
 * bytes), and a third request's as much again.
 */
static void expert_map_memory_counts_every_request_followed(void **state)
{
	struct mp_prefetcher_config fc = { .policy = "finemoe", .distance = 1, .requests = 3,
					   .emap_capacity = 32 };
	struct mp_prefetcher_stats st[3];
	struct mp_prefetcher *pf;
	struct mp_store *s;
	struct mp_pager *p;
	uint32_t L, J;
	uint64_t query;

	(void)state;
	p = open_tiny("tiny-qb.mpk", 6, "100%", &s);
	L = mp_store_geometry(s)->layers;
	J = mp_store_geometry(s)->experts;
	query = (uint64_t)L * J * sizeof(float) + 32ull * 36;
	assert_int_equal(mp_prefetcher_open(p, &fc, &pf), 0);
	for (uint32_t tok = 0; tok < 4; tok++)
		for (uint32_t l = 0; l < L; l++) {
			uint32_t ids[2] = { l % J, (l + tok + 1) % J };

			assert_int_equal(mp_prefetcher_gate(pf, 0, tok, l, ids, NULL, 2, NULL, NULL),
					 0);
		}
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	mp_prefetcher_stats(pf, &st[0]);
	assert_true(st[0].emap_records > 0);
	for (uint32_t r = 1; r < 3; r++) {
		uint32_t ids[2] = { 0, 1 };

		assert_int_equal(mp_prefetcher_gate(pf, r, 0, 0, ids, NULL, 2, NULL, NULL), 0);
		assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
		mp_prefetcher_stats(pf, &st[r]);
		assert_int_equal(st[r].emap_records, st[0].emap_records);
		assert_true(st[r].emap_bytes >= st[r - 1].emap_bytes + query);
	}
	/* The same request again holds no more. */
	{
		uint32_t ids[2] = { 2, 3 };

		assert_int_equal(mp_prefetcher_gate(pf, 2, 0, 1, ids, NULL, 2, NULL, NULL), 0);
	}
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	mp_prefetcher_stats(pf, &st[0]);
	assert_int_equal(st[0].emap_bytes, st[2].emap_bytes);
	mp_prefetcher_close(pf);
	mp_pager_close(p);
	mp_store_close(s);
}

/*
 * Prefills 3 tokens and decodes 4 through mp_prefetcher_source_ops() over a
 * pager at 50 % of a new tiny store: the prefetcher's stats afterwards.
 */
static struct mp_prefetcher_stats decode_through_source(const char *model, uint64_t seed,
							 const struct mp_prefetcher_config *fc)
{
	struct mp_engine_config ec = { .threads = 1 };
	struct mp_runner_config rc = { 0 };
	struct mp_prefetcher_stats st;
	struct mp_prefetcher *pf;
	struct mp_runner *r;
	struct mp_engine *e;
	struct mp_store *s;
	struct mp_pager *p;
	uint32_t prompt[3] = { 1, 2, 3 };

	p = open_tiny(model, seed, "50%", &s);
	assert_int_equal(mp_prefetcher_open(p, fc, &pf), 0);
	assert_int_equal(mp_engine_open("ref", &ec, &e), 0);
	rc.engine = e;
	rc.source = mp_prefetcher_source_ops();
	rc.source_ctx = pf;
	assert_int_equal(mp_runner_open(s, &rc, &r), 0);
	assert_int_equal(mp_runner_prefill(r, prompt, 3), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(mp_runner_step(r, mp_runner_argmax(r)), 0);
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	mp_prefetcher_stats(pf, &st);
	mp_runner_close(r);
	mp_engine_close(e);
	mp_prefetcher_close(pf);
	mp_pager_close(p);
	mp_store_close(s);
	return st;
}

/* The geometry of the tiny store generated with seed (every seed gives the same). */
static struct mp_geometry tiny_geometry(const char *model, uint64_t seed)
{
	struct mp_store *s = tiny_store(model, seed);
	struct mp_geometry g = *mp_store_geometry(s);

	mp_store_close(s);
	return g;
}

static void prefetcher_source_feeds_decode_steps_to_the_policy(void **state)
{
	struct mp_prefetcher_config fc = { .policy = "nextlayer" };
	struct mp_geometry g = tiny_geometry("tiny3.mpk", 5);
	struct mp_prefetcher_stats st;

	(void)state;
	st = decode_through_source("tiny3.mpk", 5, &fc);
	/* Decode steps only (the prompt is no iteration), every layer of each. */
	assert_int_equal(st.events, 4 * g.layers);
	/* nextlayer speculated from the runner's layer inputs: k experts per layer but the last. */
	assert_int_equal(st.predicted, 4ull * (g.layers - 1) * g.topk);
}

static void prefetcher_source_begins_iterations_with_the_token_embedding(void **state)
{
	struct mp_geometry g = tiny_geometry("tiny-src.mpk", 9);
	struct mp_prefetcher_config fc = { .policy = "finemoe", .sem = { g.hidden, NULL, NULL } };
	struct mp_prefetcher_stats st;

	(void)state;
	/* sem.dim = hidden: one begin event per decode step ahead of its gates. */
	st = decode_through_source("tiny-src.mpk", 9, &fc);
	assert_int_equal(st.events, 4 * g.layers + 4);
	assert_int_equal(st.dropped, 0);
	assert_int_equal(st.iterations, 4);
	/* Vectors of another length are not the embedding: gates only. */
	fc.sem.dim = g.hidden + 1;
	st = decode_through_source("tiny-src.mpk", 9, &fc);
	assert_int_equal(st.events, 4 * g.layers);
}

/*
 * A pager over a new tiny store with room for two experts (LRU), with the
 * eviction hints h attached: no next use known yet, now = 10.
 */
static struct mp_pager *open_two_with_hints(const char *name, uint64_t seed,
					    struct mp_store **s, struct mp_evict_hints *h)
{
	struct mp_pager_config pc;
	struct mp_pager *p;

	*s = tiny_store(name, seed);
	mp_pager_config_init(&pc);
	pc.budget_bytes = 2 * mp_store_expert_bytes(*s);
	pc.eviction = "lru";
	p = open_or_skip(*s, &pc);
	h->next_use = malloc(p->nslots * sizeof(uint64_t));
	assert_non_null(h->next_use);
	for (uint32_t k = 0; k < p->nslots; k++)
		h->next_use[k] = UINT64_MAX;
	h->now = 10;
	pthread_mutex_lock(&p->lock);
	p->evict.env.hints = h;
	pthread_mutex_unlock(&p->lock);
	return p;
}

static void close_with_hints(struct mp_pager *p, struct mp_store *s, struct mp_evict_hints *h)
{
	pthread_mutex_lock(&p->lock);
	p->evict.env.hints = NULL;
	pthread_mutex_unlock(&p->lock);
	mp_pager_close(p);
	free(h->next_use);
	mp_store_close(s);
}

static void pager_refuses_a_prefetch_that_would_evict_an_expert_needed_sooner(void **state)
{
	struct mp_evict_hints h = { 0 };
	struct mp_store *s;
	struct mp_pager *p;
	uint32_t a, b, c;

	(void)state;
	p = open_two_with_hints("tiny4.mpk", 6, &s, &h);
	a = mp_pager_slot(p, 0, 0);
	b = mp_pager_slot(p, 0, 1);
	c = mp_pager_slot(p, 0, 2);
	assert_int_equal(mp_pager_prefetch(p, 0, 0, 1), 1);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_pager_prefetch(p, 0, 1, 1), 1);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	/* Full. The LRU victim (0, 0) is needed at 12, the incoming (0, 2) only at 20. */
	h.next_use[a] = 12;
	h.next_use[b] = 13;
	h.next_use[c] = 20;
	assert_int_equal(mp_pager_prefetch(p, 0, 2, 1), 1);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_pager_residency(p, 0, 2), MP_RES_NONE);
	assert_int_equal(mp_pager_residency(p, 0, 0), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, 0, 1), MP_RES_MAPPED);
	/* Needed at 11, before the victim: admitted, and the victim goes. */
	h.next_use[c] = 11;
	assert_int_equal(mp_pager_prefetch(p, 0, 2, 1), 1);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_pager_residency(p, 0, 2), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, 0, 0), MP_RES_NONE);
	/* Demand is never refused: reading (0, 0) brings it back whatever the hints say. */
	h.next_use[a] = 30;
	{
		const volatile uint8_t *e = mp_pager_expert(p, 0, 0);

		assert_non_null(e);
		(void)e[0];
	}
	assert_int_equal(mp_pager_residency(p, 0, 0), MP_RES_MAPPED);
	close_with_hints(p, s, &h);
}

static int touch_first_byte(void *arg)
{
	const volatile uint8_t *e = arg;

	(void)e[0];
	return 0;
}

/*
 * A prefetch refused admission and a thread faulting on the same expert
 * race: the fault may land after the refusal, before the fill gives the slot
 * up. The thread must get the expert (a demand fill), not an error. The race
 * is run many times; each round puts back the two experts the refused
 * prefetch would evict.
 */
static void a_thread_faulting_on_a_refused_prefetch_gets_the_expert(void **state)
{
	struct mp_evict_hints h = { 0 };
	struct mp_pager_stats st;
	struct mp_store *s;
	struct mp_pager *p;
	void *a, *b, *c;

	(void)state;
	p = open_two_with_hints("tiny5.mpk", 7, &s, &h);
	/* (0, 0) and (0, 1) are needed before (0, 2): a prefetch of (0, 2) is refused. */
	h.next_use[mp_pager_slot(p, 0, 0)] = 12;
	h.next_use[mp_pager_slot(p, 0, 1)] = 13;
	h.next_use[mp_pager_slot(p, 0, 2)] = 20;
	a = (void *)mp_pager_expert(p, 0, 0);
	b = (void *)mp_pager_expert(p, 0, 1);
	c = (void *)mp_pager_expert(p, 0, 2);
	for (int round = 0; round < 2000; round++) {
		assert_int_equal(mp_pager_guard(p, touch_first_byte, a), 0);
		assert_int_equal(mp_pager_guard(p, touch_first_byte, b), 0);
		assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
		assert_int_equal(mp_pager_prefetch(p, 0, 2, 1), 1);
		assert_int_equal(mp_pager_guard(p, touch_first_byte, c), 0);
		assert_int_equal(mp_pager_residency(p, 0, 2), MP_RES_MAPPED);
	}
	mp_pager_stats(p, &st);
	assert_int_equal(st.read_errors, 0);
	close_with_hints(p, s, &h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(score_one_selects_exactly_topk),
		cmocka_unit_test(score_zero_selects_every_nonzero_expert),
		cmocka_unit_test(partial_score_stops_at_the_cumulative_threshold),
		cmocka_unit_test(delta_one_with_rounded_sums_is_capped),
		cmocka_unit_test(fewer_nonzero_than_k_still_gives_k),
		cmocka_unit_test(selection_is_the_prefix_of_the_whole_ranking),
		cmocka_unit_test(priority_is_p_over_layer_distance),
		cmocka_unit_test(plan_use_reads_only_what_is_worth_a_read),
		cmocka_unit_test(finemoe_predicts_a_seen_trajectory_exactly),
		cmocka_unit_test(finemoe_predicts_a_model_from_its_own_trajectories_only),
		cmocka_unit_test(interleaved_requests_keep_their_own_trajectories),
		cmocka_unit_test(finemoe_plans_the_first_layers_from_the_semantic_vector),
		cmocka_unit_test(finemoe_with_an_empty_store_stays_on_demand),
		cmocka_unit_test(finemoe_hints_an_expert_every_recent_token_routes_above_the_rest),
		cmocka_unit_test(an_iteration_without_gates_teaches_nothing),
		cmocka_unit_test(oracle_emits_the_true_future),
		cmocka_unit_test(dependency_follows_recorded_transitions),
		cmocka_unit_test(eam_matches_the_request_with_the_same_activation),
		cmocka_unit_test(nextlayer_speculates_from_the_next_router),
		cmocka_unit_test(finemoe_nextlayer_plans_every_layer_within_reach),
		cmocka_unit_test(finemoe_nextlayer_asks_for_the_router_only_where_it_beats_the_trajectory),
		cmocka_unit_test(finemoe_nextlayer_plans_later_layers_from_the_semantic_vector),
		cmocka_unit_test(miss_weights_mark_the_layers_no_prefetch_reaches_in_time),
		cmocka_unit_test(names_are_checked),
		cmocka_unit_test(driver_prefetches_what_the_policy_predicts),
		cmocka_unit_test(driver_hints_the_rows_of_the_models_running),
		cmocka_unit_test(driver_keeps_the_expert_maps_across_restarts),
		cmocka_unit_test(expert_map_memory_counts_every_request_followed),
		cmocka_unit_test(trajectory_records_drive_the_prefetcher),
		cmocka_unit_test(driver_begins_an_iteration_from_its_semantic_vector),
		cmocka_unit_test(driver_measures_the_load_ratio),
		cmocka_unit_test(policy_none_handles_gates_on_the_callers_thread),
		cmocka_unit_test(prefetcher_source_feeds_decode_steps_to_the_policy),
		cmocka_unit_test(prefetcher_source_begins_iterations_with_the_token_embedding),
		cmocka_unit_test(pager_refuses_a_prefetch_that_would_evict_an_expert_needed_sooner),
		cmocka_unit_test(a_thread_faulting_on_a_refused_prefetch_gets_the_expert),
	};
	int ret;

	t_test_filter();
	ret = cmocka_run_group_tests_name("prefetch", tests, NULL, NULL);

	t_tmpdir_cleanup();
	return ret;
}
