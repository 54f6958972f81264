// SPDX-License-Identifier: MIT
/*
 * Consolidation (Multi-MoE's Algorithm 1): distances between variants whose
 * experts differ by known amounts, ranks and owners, capacity, refusals, the
 * map file (every damaged field refused by name) and the check against models.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"

/* The small models: 3 layers x 4 experts of 8 x 8, f32. */
#define LAYERS		3u
#define EXPERTS		4u
#define POSITIONS	(LAYERS * EXPERTS)
#define N_MODELS	3u

/* Position p's scale s(p) = perm[p] + 1: model m's expert there is m * s(p) at element 0, else 0. */
static const uint32_t perm[POSITIONS] = { 7, 2, 11, 0, 5, 9, 3, 10, 1, 6, 8, 4 };

static const struct mp_geometry small = {
	.layers = LAYERS, .experts = EXPERTS, .topk = 1, .hidden = 8, .ffn = 8, .heads = 2,
	.kv_heads = 1, .head_dim = 4, .vocab = 16, .max_seq = 16, .dtype = MP_DTYPE_F32,
	.rope_theta = 10000.0f, .norm_eps = 1e-5f,
};

/* Fills one expert (bytes long) of a model being written. */
typedef int (*fill_fn)(void *ctx, uint32_t layer, uint32_t expert, void *buf, uint64_t bytes);

/* Writes a model of geometry g: tensors from base (or zeros), experts from fill. */
static int write_model(const char *path, const struct mp_geometry *g, const char *name,
		       struct mp_store *base, fill_fn fill, void *ctx)
{
	struct mp_store_writer *w;
	uint64_t xb = mp_geometry_expert_bytes(g);
	uint8_t *buf = malloc(xb);
	int err = buf ? mp_store_writer_create(path, g, name, &w) : -ENOMEM;

	for (uint32_t i = 0; !err && i < mp_store_writer_tensor_count(w); i++) {
		const struct mp_tensor_info *t = mp_store_writer_tensor_at(w, i);
		uint8_t *tb = calloc(1, t->bytes);

		err = tb ? 0 : -ENOMEM;
		if (!err && base)
			err = mp_store_read_tensor(base, mp_store_tensor(base, t->name), tb);
		if (!err)
			err = mp_store_writer_put_tensor(w, t->name, tb);
		free(tb);
	}
	for (uint32_t l = 0; !err && l < g->layers; l++)
		for (uint32_t e = 0; !err && e < g->experts; e++) {
			err = fill(ctx, l, e, buf, xb);
			if (!err)
				err = mp_store_writer_put_expert(w, l, e, buf);
		}
	if (err)
		mp_store_writer_abort(w);
	else
		err = mp_store_writer_finish(w);
	free(buf);
	return err;
}

static int fill_scaled(void *ctx, uint32_t layer, uint32_t expert, void *buf, uint64_t bytes)
{
	uint32_t m = *(const uint32_t *)ctx;
	float *f = buf;

	memset(buf, 0, bytes);
	f[0] = (float)(m * (perm[layer * EXPERTS + expert] + 1));
	return 0;
}

/* Element 1 is the model's number everywhere (an f32 value; bytes of another type otherwise). */
static int fill_equal(void *ctx, uint32_t layer, uint32_t expert, void *buf, uint64_t bytes)
{
	float *f = buf;

	(void)layer;
	(void)expert;
	memset(buf, 0, bytes);
	f[1] = (float)*(const uint32_t *)ctx;
	return 0;
}

struct fixture {
	struct mp_store *m[N_MODELS];	/* model m: m * s(p) at every position */
	struct mp_store *eq[2];		/* every position at the same distance */
};

static struct fixture fx;

static int open_scaled(uint32_t m, const char *path, fill_fn fill, struct mp_store **out)
{
	char name[16];

	snprintf(name, sizeof(name), "v%u", m);
	return write_model(path, &small, name, NULL, fill, &m) ?: mp_store_open(path, out);
}

static int setup(void **state)
{
	(void)state;
	t_log_capture();
	if (open_scaled(0, t_path("m0.mpk"), fill_scaled, &fx.m[0]) ||
	    open_scaled(1, t_path("m1.mpk"), fill_scaled, &fx.m[1]) ||
	    open_scaled(2, t_path("m2.mpk"), fill_scaled, &fx.m[2]) ||
	    open_scaled(1, t_path("e1.mpk"), fill_equal, &fx.eq[0]) ||
	    open_scaled(3, t_path("e3.mpk"), fill_equal, &fx.eq[1]))
		return -1;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	for (uint32_t i = 0; i < N_MODELS; i++)
		mp_store_close(fx.m[i]);
	mp_store_close(fx.eq[0]);
	mp_store_close(fx.eq[1]);
	t_tmpdir_cleanup();
	return 0;
}

static struct mp_consolidation *build(struct mp_store **models, uint32_t n, uint32_t capacity)
{
	struct mp_consolidation *c = NULL;

	assert_int_equal(mp_consolidation_build(models, n, capacity, NULL, NULL, &c), 0);
	assert_non_null(c);
	return c;
}

static void distances_are_l2_between_experts_summed_over_pairs(void **state)
{
	struct mp_consolidation *c = build(fx.m, N_MODELS, 0);

	(void)state;
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t e = 0; e < EXPERTS; e++) {
			double s = perm[l * EXPERTS + e] + 1;

			for (uint32_t i = 0; i < N_MODELS; i++)
				for (uint32_t j = 0; j < N_MODELS; j++)
					assert_true(mp_consolidation_pair_distance(c, i, j, l, e) ==
						    fabs((double)i - j) * s);
			/* pairs (0,1), (0,2), (1,2): s + 2s + s */
			assert_true(mp_consolidation_distance(c, l, e) == 4 * s);
		}
	assert_true(isnan(mp_consolidation_distance(c, LAYERS, 0)));
	assert_true(isnan(mp_consolidation_pair_distance(c, 0, N_MODELS, 0, 0)));
	mp_consolidation_close(c);
}

/* Algorithm 1 restated: rank r (1-based, by ascending distance) owned by (r - 1) mod n if r <= C. */
static void expect_algorithm_1(const struct mp_consolidation *c, uint32_t capacity)
{
	uint32_t owned[N_MODELS] = { 0 };

	assert_int_equal(mp_consolidation_capacity(c), capacity);
	for (uint32_t p = 0; p < POSITIONS; p++) {
		uint32_t rank = perm[p] + 1;
		int owner = rank <= capacity ? (int)((rank - 1) % N_MODELS) : MP_CONSOL_NONE;

		assert_int_equal(mp_consolidation_rank(c, p / EXPERTS, p % EXPERTS), rank);
		assert_int_equal(mp_consolidation_owner(c, p / EXPERTS, p % EXPERTS), owner);
		if (owner >= 0)
			owned[owner]++;
	}
	for (uint32_t i = 0; i < N_MODELS; i++)
		assert_int_equal(mp_consolidation_owned(c, i), owned[i]);
}

static void ranks_and_owners_are_algorithm_1s(void **state)
{
	struct mp_consolidation *c = build(fx.m, N_MODELS, 7);

	(void)state;
	expect_algorithm_1(c, 7);
	/* rank 1 is position 3 (s = 1): model 0; rank 2 is position 8: model 1; rank 3: model 2 */
	assert_int_equal(mp_consolidation_owner(c, 0, 3), 0);
	assert_int_equal(mp_consolidation_owner(c, 2, 0), 1);
	assert_int_equal(mp_consolidation_owner(c, 0, 1), 2);
	assert_int_equal(mp_consolidation_owner(c, LAYERS, 0), MP_CONSOL_NONE);
	assert_int_equal(mp_consolidation_rank(c, 0, EXPERTS), 0);
	mp_consolidation_close(c);
}

static void capacity_zero_owns_nothing_and_all_owns_everything(void **state)
{
	struct mp_consolidation *c;

	(void)state;
	c = build(fx.m, N_MODELS, 0);
	expect_algorithm_1(c, 0);
	mp_consolidation_close(c);
	c = build(fx.m, N_MODELS, POSITIONS);
	expect_algorithm_1(c, POSITIONS);
	for (uint32_t i = 0; i < N_MODELS; i++)
		assert_int_equal(mp_consolidation_owned(c, i), POSITIONS / N_MODELS);
	mp_consolidation_close(c);
	/* One model: every distance 0, ranks by position, everything its own. */
	c = build(fx.m + 1, 1, POSITIONS);
	for (uint32_t p = 0; p < POSITIONS; p++) {
		assert_true(mp_consolidation_distance(c, p / EXPERTS, p % EXPERTS) == 0);
		assert_int_equal(mp_consolidation_rank(c, p / EXPERTS, p % EXPERTS), p + 1);
		assert_int_equal(mp_consolidation_owner(c, p / EXPERTS, p % EXPERTS), 0);
	}
	mp_consolidation_close(c);
}

static void equal_distances_rank_the_lower_position_first(void **state)
{
	struct mp_consolidation *c = build(fx.eq, 2, 5);

	(void)state;
	for (uint32_t p = 0; p < POSITIONS; p++) {
		assert_true(mp_consolidation_distance(c, p / EXPERTS, p % EXPERTS) == 2);
		assert_int_equal(mp_consolidation_rank(c, p / EXPERTS, p % EXPERTS), p + 1);
		assert_int_equal(mp_consolidation_owner(c, p / EXPERTS, p % EXPERTS),
				 p < 5 ? (int)(p % 2) : MP_CONSOL_NONE);
	}
	assert_int_equal(mp_consolidation_owned(c, 0), 3);
	assert_int_equal(mp_consolidation_owned(c, 1), 2);
	mp_consolidation_close(c);
}

/* Model 1's experts, but 5 more at element 0 of position 6 (layer 1 expert 2). */
static int fill_one_changed(void *ctx, uint32_t layer, uint32_t expert, void *buf, uint64_t bytes)
{
	int err = fill_scaled(ctx, layer, expert, buf, bytes);

	if (layer * EXPERTS + expert == 6)
		((float *)buf)[0] += 5;
	return err;
}

static void experts_a_variant_left_alone_are_at_distance_zero(void **state)
{
	struct mp_store *m[2] = { fx.m[1], NULL };
	struct mp_consolidation *c;
	uint32_t one = 1;

	(void)state;
	assert_int_equal(write_model(t_path("one.mpk"), &small, "one", NULL, fill_one_changed,
				     &one), 0);
	assert_int_equal(mp_store_open(t_path("one.mpk"), &m[1]), 0);
	c = build(m, 2, POSITIONS);
	for (uint32_t p = 0; p < POSITIONS; p++) {
		uint32_t rank = p < 6 ? p + 1 : p == 6 ? POSITIONS : p;

		assert_true(mp_consolidation_distance(c, p / EXPERTS, p % EXPERTS) == (p == 6 ? 5 : 0));
		assert_int_equal(mp_consolidation_rank(c, p / EXPERTS, p % EXPERTS), rank);
		assert_int_equal(mp_consolidation_owner(c, p / EXPERTS, p % EXPERTS),
				 (int)((rank - 1) % 2));
	}
	mp_consolidation_close(c);
	mp_store_close(m[1]);
}

static void bad_sets_of_models_are_refused_naming_the_field_and_files(void **state)
{
	struct mp_geometry g = small;
	struct mp_store *other[2] = { fx.m[0], NULL }, *twice[2] = { fx.m[1], fx.m[1] };
	struct mp_consolidation *c = NULL;
	uint32_t zero = 0;

	(void)state;
	t_log_reset();
	assert_int_equal(mp_consolidation_build(fx.m, N_MODELS, POSITIONS + 1, NULL, NULL, &c),
			 -EINVAL);
	assert_true(t_log_contains("capacity 13 exceeds the 3 x 4 = 12 positions"));
	assert_int_equal(mp_consolidation_build(fx.m, 0, 0, NULL, NULL, &c), -EINVAL);
	assert_int_equal(mp_consolidation_build(twice, 2, 0, NULL, NULL, &c), -EINVAL);
	assert_true(t_log_contains("are the same model"));

	g.dtype = MP_DTYPE_BF16;
	assert_int_equal(write_model(t_path("bf16.mpk"), &g, "bf", NULL, fill_equal, &zero), 0);
	assert_int_equal(mp_store_open(t_path("bf16.mpk"), &other[1]), 0);
	t_log_reset();
	assert_int_equal(mp_consolidation_build(other, 2, 0, NULL, NULL, &c), -EINVAL);
	assert_true(t_log_contains("m0.mpk and "));
	assert_true(t_log_contains("bf16.mpk differ in geometry: dtype f32 vs bf16"));
	mp_store_close(other[1]);

	g = small;
	g.ffn = 16;
	assert_int_equal(write_model(t_path("ffn.mpk"), &g, "ffn", NULL, fill_equal, &zero), 0);
	assert_int_equal(mp_store_open(t_path("ffn.mpk"), &other[1]), 0);
	t_log_reset();
	assert_int_equal(mp_consolidation_build(other, 2, 0, NULL, NULL, &c), -EINVAL);
	assert_true(t_log_contains("ffn.mpk differ in geometry: ffn 8 vs 16"));
	assert_int_equal(mp_consolidation_cross_distances(fx.m[0], other[1], 0, 4,
							  (double[4]){ 0 }), -EINVAL);
	mp_store_close(other[1]);
	assert_null(c);
}

static void cross_distances_compare_different_experts_of_a_layer(void **state)
{
	double got[EXPERTS * (EXPERTS - 1)];
	uint32_t total = EXPERTS * (EXPERTS - 1), l = 1;

	(void)state;
	/* every (e1 of model 1, e2 != e1 of model 2): |1 * s(e1) - 2 * s(e2)| */
	assert_int_equal(mp_consolidation_cross_distances(fx.m[1], fx.m[2], l, 100, got),
			 (int)total);
	for (uint32_t q = 0, k = 0; q < EXPERTS; q++)
		for (uint32_t r = 0; r < EXPERTS; r++) {
			if (r == q)
				continue;
			assert_true(got[k++] == fabs((double)(perm[l * EXPERTS + q] + 1) -
						     2.0 * (perm[l * EXPERTS + r] + 1)));
		}
	/* 3 samples of the 12 pairs: pairs 0, 4 and 8, i.e. (0,1), (1,2), (2,3) */
	assert_int_equal(mp_consolidation_cross_distances(fx.m[1], fx.m[2], l, 3, got), 3);
	assert_true(got[0] == fabs((perm[4] + 1) - 2.0 * (perm[5] + 1)));
	assert_true(got[1] == fabs((perm[5] + 1) - 2.0 * (perm[6] + 1)));
	assert_true(got[2] == fabs((perm[6] + 1) - 2.0 * (perm[7] + 1)));
	assert_int_equal(mp_consolidation_cross_distances(fx.m[1], fx.m[2], LAYERS, 3, got),
			 -EINVAL);
	assert_int_equal(mp_consolidation_cross_distances(fx.m[1], fx.m[2], 0, 0, got), 0);
}

/*
 * A generated model and a variant with every expert moved by a known
 * amount: delta(p) * (+1, -1, +1, ...), delta = step * (perm2(p) + 1).
 */
#define TINY_POSITIONS	32u
static uint32_t perm2(uint32_t p)
{
	return (p * 13 + 5) % TINY_POSITIONS;
}

struct perturb {
	struct mp_store *base;
	float step;
	float *f;
};

static int fill_perturbed(void *ctx, uint32_t layer, uint32_t expert, void *buf, uint64_t bytes)
{
	struct perturb *pt = ctx;
	const struct mp_geometry *g = mp_store_geometry(pt->base);
	uint64_t n = bytes / mp_dtype_size(g->dtype);
	float delta = pt->step * (float)(perm2(layer * g->experts + expert) + 1);
	int err = mp_store_read_expert(pt->base, layer, expert, buf);

	if (err)
		return err;
	mp_dtype_to_f32(g->dtype, buf, pt->f, n);
	for (uint64_t i = 0; i < n; i++)
		pt->f[i] += i % 2 ? -delta : delta;
	mp_dtype_from_f32(g->dtype, pt->f, buf, n);
	return 0;
}

/* The distance by a plain double loop over both experts. */
static double direct_distance(struct mp_store *a, struct mp_store *b, uint32_t l, uint32_t e)
{
	enum mp_dtype t = mp_store_geometry(a)->dtype;
	uint64_t xb = mp_store_expert_bytes(a), n = xb / mp_dtype_size(t);
	void *ra = malloc(xb), *rb = malloc(xb);
	float *fa = malloc(n * 4), *fb = malloc(n * 4);
	double sum = 0;

	assert_int_equal(mp_store_read_expert(a, l, e, ra), 0);
	assert_int_equal(mp_store_read_expert(b, l, e, rb), 0);
	mp_dtype_to_f32(t, ra, fa, n);
	mp_dtype_to_f32(t, rb, fb, n);
	for (uint64_t i = 0; i < n; i++)
		sum += ((double)fa[i] - fb[i]) * ((double)fa[i] - fb[i]);
	free(ra);
	free(rb);
	free(fa);
	free(fb);
	return sqrt(sum);
}

/* Writes base (tiny preset, type t) and its variant moved by step; returns both open. */
static void write_perturbed(enum mp_dtype t, float step, struct mp_store **m)
{
	struct perturb pt;
	uint64_t n;

	assert_int_equal(t_gen_tiny(t_path("tb.mpk"), t, 5), 0);
	assert_int_equal(mp_store_open(t_path("tb.mpk"), &m[0]), 0);
	assert_int_equal(mp_store_geometry(m[0])->layers * mp_store_geometry(m[0])->experts,
			 TINY_POSITIONS);
	n = mp_store_expert_bytes(m[0]) / mp_dtype_size(t);
	pt = (struct perturb){ m[0], step, malloc(n * sizeof(float)) };
	assert_int_equal(write_model(t_path("tv.mpk"), mp_store_geometry(m[0]), "variant", m[0],
				     fill_perturbed, &pt), 0);
	assert_int_equal(mp_store_open(t_path("tv.mpk"), &m[1]), 0);
	free(pt.f);
}

/* Distances as a plain loop gives them, about step * rank * sqrt(n), ranked by the step. */
static void check_perturbed(enum mp_dtype t, float step, struct mp_store **m)
{
	const struct mp_geometry *g = mp_store_geometry(m[0]);
	double n = (double)(mp_store_expert_bytes(m[0]) / mp_dtype_size(t));
	struct mp_consolidation *c = build(m, 2, 10);

	for (uint32_t p = 0; p < TINY_POSITIONS; p++) {
		uint32_t l = p / g->experts, e = p % g->experts;
		double d = mp_consolidation_distance(c, l, e), want = direct_distance(m[0], m[1], l, e);

		assert_true(fabs(d - want) <= 1e-6 * want);
		/* rounding to the type moves each element by at most half its ulp */
		assert_true(fabs(d / (step * (perm2(p) + 1) * sqrt(n)) - 1) < 0.02);
		assert_int_equal(mp_consolidation_rank(c, l, e), perm2(p) + 1);
		assert_int_equal(mp_consolidation_owner(c, l, e),
				 perm2(p) < 10 ? (int)(perm2(p) % 2) : MP_CONSOL_NONE);
	}
	mp_consolidation_close(c);
}

static void perturbed_f32_variant_ranks_by_its_perturbation(void **state)
{
	struct mp_store *m[2];
	double cross[8], largest = 0.001 * TINY_POSITIONS;

	(void)state;
	write_perturbed(MP_DTYPE_F32, 0.001f, m);
	check_perturbed(MP_DTYPE_F32, 0.001f, m);
	/* across positions the experts are unrelated: far more than the largest perturbation */
	assert_int_equal(mp_consolidation_cross_distances(m[0], m[1], 2, 8, cross), 8);
	for (int i = 0; i < 8; i++)
		assert_true(cross[i] > 3 * largest * sqrt(mp_store_expert_bytes(m[0]) / 4.0));
	mp_store_close(m[0]);
	mp_store_close(m[1]);
}

static void perturbed_bf16_variant_ranks_by_its_perturbation(void **state)
{
	struct mp_store *m[2];

	(void)state;
	/* steps of a few bf16 ulps of the weights (about 0.15: ulp 2^-10) */
	write_perturbed(MP_DTYPE_BF16, 0.004f, m);
	check_perturbed(MP_DTYPE_BF16, 0.004f, m);
	mp_store_close(m[0]);
	mp_store_close(m[1]);
}

static void map_round_trips_through_its_file(void **state)
{
	struct mp_consolidation *c = build(fx.m, N_MODELS, 7), *r;

	(void)state;
	assert_int_equal(mp_consolidation_write(c, t_path("map.mpc")), 0);
	assert_int_equal(mp_consolidation_open(t_path("map.mpc"), &r), 0);
	assert_int_equal(mp_consolidation_models(r), N_MODELS);
	assert_int_equal(mp_consolidation_layers(r), LAYERS);
	assert_int_equal(mp_consolidation_experts(r), EXPERTS);
	expect_algorithm_1(r, 7);
	for (uint32_t i = 0; i < N_MODELS; i++) {
		char name[8];

		snprintf(name, sizeof(name), "v%u", i);
		assert_string_equal(mp_consolidation_model_name(r, i), name);
		snprintf(name, sizeof(name), "m%u.mpk", i);
		assert_string_equal(mp_consolidation_model_file(r, i), name);
		assert_true(mp_consolidation_model_identity(r, i) == mp_store_identity(fx.m[i]));
	}
	assert_null(mp_consolidation_model_name(r, N_MODELS));
	for (uint32_t p = 0; p < POSITIONS; p++)
		for (uint32_t i = 0; i < N_MODELS; i++)
			assert_true(mp_consolidation_pair_distance(r, i, (i + 1) % N_MODELS,
								   p / EXPERTS, p % EXPERTS) ==
				    mp_consolidation_pair_distance(c, i, (i + 1) % N_MODELS,
								   p / EXPERTS, p % EXPERTS));
	assert_int_equal(mp_consolidation_check(r, fx.m, N_MODELS), 0);
	mp_consolidation_close(r);
	mp_consolidation_close(c);
}

static void map_checked_against_other_models_is_refused_naming_the_model(void **state)
{
	struct mp_consolidation *c = build(fx.m, N_MODELS, 7);
	struct mp_store *swapped[N_MODELS] = { fx.m[0], fx.m[2], fx.m[1] };
	struct mp_store *stranger[N_MODELS] = { fx.m[0], fx.m[1], fx.eq[0] };

	(void)state;
	t_log_reset();
	assert_int_equal(mp_consolidation_check(c, fx.m, 2), -EMEDIUMTYPE);
	assert_true(t_log_contains("the map consolidates 3 models, 2 were given"));
	assert_int_equal(mp_consolidation_check(c, swapped, N_MODELS), -EMEDIUMTYPE);
	assert_true(t_log_contains("m2.mpk is model 2 of the map, not 1"));
	assert_int_equal(mp_consolidation_check(c, stranger, N_MODELS), -EMEDIUMTYPE);
	assert_true(t_log_contains("e1.mpk ('v1', identity"));
	assert_true(t_log_contains("is not in the map: its model 2 is 'v2' (file m2.mpk"));
	mp_consolidation_close(c);
}

static void a_failed_write_leaves_no_map(void **state)
{
	struct mp_consolidation *c = build(fx.m, N_MODELS, 1);

	(void)state;
	assert_true(mp_consolidation_write(c, t_path("no/such/dir/map.mpc")) < 0);
	assert_int_equal(access(t_path("no/such/dir/map.mpc"), F_OK), -1);
	mp_consolidation_close(c);
}

/*
 * The file, damaged field by field (offsets from docs/consolidate-format.md)
 */

#define OFF_VERSION		8
#define OFF_HEADER_BYTES	12
#define OFF_FILE_BYTES		16
#define OFF_N_MODELS		24
#define OFF_FLAGS		28
#define OFF_LAYERS		32
#define OFF_CAPACITY		52
#define OFF_EXPERT_BYTES	56
#define OFF_MODELS_OFF		64
#define OFF_POSITIONS_OFF	72
#define OFF_PAIRS_OFF		80
#define OFF_MODEL_ENTRY		88
#define OFF_N_POSITIONS		96
#define OFF_SUMS		104
#define OFF_HEADER_SUM		4088

static uint64_t u64_at(const char *path, uint64_t off)
{
	uint64_t v;

	t_read_at(path, &v, 8, off);
	return v;
}

static void put_u32(const char *path, uint64_t off, uint32_t v)
{
	t_write_at(path, &v, 4, off);
}

/* Rewrites the three table checksums and the header's, so only the field under test is wrong. */
static void reseal(const char *path)
{
	uint8_t *h = malloc(4096);
	struct stat st;
	uint32_t n, pos;
	uint64_t sum;

	assert_int_equal(stat(path, &st), 0);
	t_read_at(path, h, 4096, 0);
	memcpy(&n, h + OFF_N_MODELS, 4);
	memcpy(&pos, h + OFF_N_POSITIONS, 4);
	for (int t = 0; t < 3; t++) {
		uint64_t off, len = t == 0 ? n * 256ull : t == 1 ? pos * 16ull :
				    n * (n - 1ull) / 2 * pos * 8;
		uint8_t *b;

		memcpy(&off, h + OFF_MODELS_OFF + 8 * t, 8);
		if (off > (uint64_t)st.st_size || len > (uint64_t)st.st_size - off)
			continue;
		b = malloc(len + 1);
		t_read_at(path, b, len, off);
		sum = mp_checksum(b, len);
		memcpy(h + OFF_SUMS + 8 * t, &sum, 8);
		free(b);
	}
	sum = mp_checksum(h, OFF_HEADER_SUM);
	memcpy(h + OFF_HEADER_SUM, &sum, 8);
	t_write_at(path, h, 4096, 0);
	free(h);
}

/* Writes the test map (3 models, capacity 7) at path. */
static void write_map(const char *path)
{
	struct mp_consolidation *c = build(fx.m, N_MODELS, 7);

	assert_int_equal(mp_consolidation_write(c, path), 0);
	mp_consolidation_close(c);
}

static void expect_refused(const char *path, const char *what, int err, const char *message)
{
	struct mp_consolidation *c = NULL;

	t_log_reset();
	assert_int_equal(mp_consolidation_open(path, &c), err);
	assert_null(c);
	if (!t_log_contains(message))
		fail_msg("%s: the message does not say '%s' (%s)", what, message, mp_last_error());
}

/* Writes a u32 at a header offset, reseals, expects the refusal. */
static void header_u32(const char *p, uint64_t off, uint32_t v, int err, const char *message)
{
	write_map(p);
	put_u32(p, off, v);
	reseal(p);
	expect_refused(p, message, err, message);
}

static void damaged_header_fields_are_refused_by_name(void **state)
{
	const char *p = t_path("d.mpc");
	uint64_t u64;

	(void)state;
	write_map(p);
	assert_int_equal(t_flip_byte(p, 0), 0);
	expect_refused(p, "magic", -EPROTO, "not a moepager consolidation map");
	expect_refused(t_path("m0.mpk"), "an .mpk", -EPROTO, "not a moepager consolidation map");

	write_map(p);
	put_u32(p, OFF_VERSION, 9);
	expect_refused(p, "version", -EPROTONOSUPPORT, "unknown map version 9 at offset 8");

	write_map(p);
	assert_int_equal(t_flip_byte(p, 300), 0);
	expect_refused(p, "reserved byte", -EBADMSG, "header checksum mismatch");

	header_u32(p, OFF_FLAGS, 1, -EPROTONOSUPPORT, "unknown header flags 0x1 at offset 28");
	header_u32(p, OFF_HEADER_BYTES, 4097, -EINVAL, "header_bytes 4097 at offset 12");
	header_u32(p, OFF_MODEL_ENTRY, 128, -EINVAL, "model_entry_bytes 128 at offset 88");
	header_u32(p, OFF_N_MODELS, 0, -EINVAL, "n_models 0 at offset 24");
	header_u32(p, OFF_N_MODELS, 65, -EINVAL, "n_models 65 at offset 24");
	header_u32(p, OFF_N_MODELS, 2, -EINVAL, "n_pairs 3 at offset 100, expected 1");
	header_u32(p, OFF_LAYERS, 0, -EINVAL, "0 layers x 4 experts at offsets 32, 36");
	header_u32(p, OFF_EXPERT_BYTES, 100, -EINVAL, "do not describe an expert");
	header_u32(p, OFF_N_POSITIONS, 13, -EINVAL, "n_positions 13 at offset 96, expected 12");
	header_u32(p, OFF_CAPACITY, 13, -EINVAL, "capacity 13 at offset 52 exceeds the 12");
	header_u32(p, OFF_MODELS_OFF, 100, -EINVAL, "the model table at 100 (models_off at offset "
		   "64), 768 bytes, is not inside [4096, ");

	write_map(p);
	u64 = u64_at(p, OFF_MODELS_OFF);
	t_write_at(p, &u64, 8, OFF_POSITIONS_OFF);
	reseal(p);
	expect_refused(p, "overlap", -EINVAL, "the position table at 4096 (positions_off at offset 72) overlaps "
		       "the model table");

	write_map(p);
	assert_int_equal(truncate(p, 5000), 0);
	expect_refused(p, "truncated", -ENODATA, "truncated: file is 5000 bytes");

	write_map(p);
	assert_int_equal(truncate(p, 100), 0);
	expect_refused(p, "short header", -ENODATA, "the header alone is 4096");

	write_map(p);
	u64 = 1 << 20;
	t_write_at(p, &u64, 8, OFF_FILE_BYTES);
	reseal(p);
	expect_refused(p, "file_bytes", -ENODATA, "header says 1048576");
}

static void damaged_tables_are_refused_by_name(void **state)
{
	const char *p = t_path("t.mpc");
	uint64_t models, positions, pairs;
	char name[64];

	(void)state;
	write_map(p);
	models = u64_at(p, OFF_MODELS_OFF);
	positions = u64_at(p, OFF_POSITIONS_OFF);
	pairs = u64_at(p, OFF_PAIRS_OFF);

	assert_int_equal(t_flip_byte(p, models + 300), 0);
	expect_refused(p, "model table", -EBADMSG, "model table checksum mismatch (checksum at "
		       "offset 104)");
	write_map(p);
	assert_int_equal(t_flip_byte(p, positions + 5), 0);
	expect_refused(p, "position table", -EBADMSG, "position table checksum mismatch");
	write_map(p);
	assert_int_equal(t_flip_byte(p, pairs + 7), 0);
	expect_refused(p, "pair table", -EBADMSG, "pair table checksum mismatch");

	write_map(p);
	memset(name, 'x', sizeof(name));
	t_write_at(p, name, sizeof(name), (models + 256 + 16));
	reseal(p);
	expect_refused(p, "name", -EINVAL, "model 1 (entry at offset 4352): name or file");

	write_map(p);
	put_u32(p, (models + 2 * 256 + 12), 4);
	reseal(p);
	expect_refused(p, "model flags", -EPROTONOSUPPORT, "model 2 (entry at offset 4608): "
		       "unknown flags 0x4");

	write_map(p);
	t_write_at(p, (uint64_t[]){ u64_at(p, models) }, 8, (models + 256));
	reseal(p);
	expect_refused(p, "identity", -EINVAL, "model 1 (entry at offset 4352) has the identity "
		       "of model 0");

	write_map(p);
	put_u32(p, (models + 8), 9);
	reseal(p);
	expect_refused(p, "owned", -EINVAL, "model 0's entry says it owns 9 positions, it owns 3");
}

static void put_double(const char *p, uint64_t off, double v)
{
	t_write_at(p, &v, 8, off);
}

static void positions_that_are_not_algorithm_1s_are_refused(void **state)
{
	const char *p = t_path("a.mpc");
	uint64_t positions, pairs;

	(void)state;
	write_map(p);
	positions = u64_at(p, OFF_POSITIONS_OFF);
	pairs = u64_at(p, OFF_PAIRS_OFF);

	/* pair (0, 1) at position 5 */
	put_double(p, pairs + 5 * 8, -1);
	reseal(p);
	expect_refused(p, "negative", -EINVAL, "distance -1 between models 0 and 1 at layer 1 "
		       "expert 1 (offset");
	write_map(p);
	put_double(p, pairs + 12 * 8 + 2 * 8, NAN);
	reseal(p);
	expect_refused(p, "nan", -EINVAL, "between models 0 and 2 at layer 0 expert 2");

	write_map(p);
	put_double(p, positions + 4 * 16 + 8, 1000);
	reseal(p);
	expect_refused(p, "sum", -EINVAL, "layer 1 expert 0: distance 1000 at offset 4936 is not "
		       "the sum 24 of its pairs");

	/* positions 3 (rank 1) and 8 (rank 2) swap ranks */
	write_map(p);
	put_u32(p, (positions + 3 * 16 + 4), 2);
	put_u32(p, (positions + 8 * 16 + 4), 1);
	reseal(p);
	expect_refused(p, "rank", -EINVAL, "layer 0 expert 3 (entry at offset 4912): rank 2, its "
		       "distance ranks it 1");

	/* position 8 (rank 2) given to model 0 */
	write_map(p);
	put_u32(p, (positions + 8 * 16), 0);
	reseal(p);
	expect_refused(p, "owner", -EINVAL, "layer 2 expert 0 (entry at offset 4992): owner 0, "
		       "Algorithm 1 gives 1 for rank 2 of capacity 7");

	/* capacity 6: rank 7 (position 9) must then be owned by none */
	write_map(p);
	put_u32(p, OFF_CAPACITY, 6);
	reseal(p);
	expect_refused(p, "capacity", -EINVAL, "owner 0, Algorithm 1 gives -1 for rank 7 of "
		       "capacity 6");
}

int main(void)
{
	static const struct CMUnitTest tests[] = {
		cmocka_unit_test(distances_are_l2_between_experts_summed_over_pairs),
		cmocka_unit_test(ranks_and_owners_are_algorithm_1s),
		cmocka_unit_test(capacity_zero_owns_nothing_and_all_owns_everything),
		cmocka_unit_test(equal_distances_rank_the_lower_position_first),
		cmocka_unit_test(experts_a_variant_left_alone_are_at_distance_zero),
		cmocka_unit_test(bad_sets_of_models_are_refused_naming_the_field_and_files),
		cmocka_unit_test(cross_distances_compare_different_experts_of_a_layer),
		cmocka_unit_test(perturbed_f32_variant_ranks_by_its_perturbation),
		cmocka_unit_test(perturbed_bf16_variant_ranks_by_its_perturbation),
		cmocka_unit_test(map_round_trips_through_its_file),
		cmocka_unit_test(map_checked_against_other_models_is_refused_naming_the_model),
		cmocka_unit_test(a_failed_write_leaves_no_map),
		cmocka_unit_test(damaged_header_fields_are_refused_by_name),
		cmocka_unit_test(damaged_tables_are_refused_by_name),
		cmocka_unit_test(positions_that_are_not_algorithm_1s_are_refused),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
