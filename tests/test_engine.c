// SPDX-License-Identifier: MIT
/* Engines: every op of every engine against a naive f64 computation, odd sizes, 1-4 threads. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include <moepager/membw.h>
#include <moepager/runner.h>

#include "base/base.h"
#include "engine/kernels.h"
#include "helpers.h"

#define MAX_THREADS 4u
#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

struct engine_case {
	const char *name;
	bool plugin;
};

/* The reference engine's ISA paths, then the plug-ins this build made. */
static const struct engine_case engines[] = {
	{ "ref-scalar", false },
	{ "ref-avx2", false },
	{ "ref-avx512", false },
	{ "ref", false },
	{ "openblas", true },
};

static const enum mp_dtype dtypes[] = {
	MP_DTYPE_F32, MP_DTYPE_F16, MP_DTYPE_BF16, MP_DTYPE_Q8_0, MP_DTYPE_Q4_0,
};

/* A row length the type can hold: block types' rows are whole blocks, so odd sizes round up. */
static uint32_t fit(enum mp_dtype dt, uint32_t cols)
{
	uint32_t b = mp_dtype_block(dt);

	return (cols + b - 1) / b * b;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (float)((rng_state >> 40) * (2.0 / 16777216.0) - 1.0);
}

static void fill(float *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		v[i] = frand();
}

/* Random weights in type dt (wq), and the same values as f32 (wf): dequantised for block types. */
static void make_weights(enum mp_dtype dt, size_t n, void **wq, float **wf)
{
	float *src = malloc(n * sizeof(float));

	assert_non_null(src);
	fill(src, n);
	*wq = malloc(mp_dtype_bytes(dt, n));
	*wf = malloc(n * sizeof(float));
	assert_non_null(*wq);
	assert_non_null(*wf);
	mp_dtype_from_f32(dt, src, *wq, n);
	mp_dtype_to_f32(dt, *wq, *wf, n);
	free(src);
}

/* |got - want| within rel * scale + 1e-6, scale being sum |terms| of the exact result. */
static void assert_close(const char *what, size_t i, float got, double want, double scale,
			 double rel)
{
	double tol = rel * scale + 1e-6;

	if (!(fabs((double)got - want) <= tol)) {
		print_error("%s[%zu]: got %.9g, want %.9g (tolerance %.3g)\n", what, i,
			    (double)got, want, tol);
		fail();
	}
}

/* Opens the case's engine (main() registered only cases this CPU and build have). */
static struct mp_engine *open_engine(const struct engine_case *c, uint32_t threads)
{
	struct mp_engine_config cfg = { .threads = threads };
	struct mp_engine *e = NULL;
	int err = mp_engine_open(c->name, &cfg, &e);

	if (err) {
		print_error("opening engine %s: %s\n", c->name, mp_last_error());
		fail();
	}
	assert_int_equal(e->threads, threads);
	return e;
}

/* Runs the body once per thread count with a fresh engine. */
#define FOR_EACH_THREADS(c, e, t)						\
	for (uint32_t t = 1; t <= MAX_THREADS; t++)				\
		for (struct mp_engine *e = open_engine(c, t); e;		\
		     mp_engine_close(e), e = NULL)

static void check_matmul(struct mp_engine *e, enum mp_dtype dt, uint32_t rows, uint32_t cols,
			 uint32_t n)
{
	void *wq;
	float *wf, *x = malloc((size_t)n * cols * sizeof(float));
	float *y = malloc((size_t)n * rows * sizeof(float));
	char what[96];

	assert_non_null(x);
	assert_non_null(y);
	make_weights(dt, (size_t)rows * cols, &wq, &wf);
	fill(x, (size_t)n * cols);
	if (n == 1)
		assert_int_equal(mp_engine_matvec(e, NULL, dt, wq, rows, cols, x, y), 0);
	else
		assert_int_equal(mp_engine_matmul(e, NULL, dt, wq, rows, cols, x, n, y), 0);
	snprintf(what, sizeof(what), "%s %s %ux%u n=%u t=%u", mp_engine_name(e), mp_dtype_name(dt),
		 rows, cols, n, e->threads);
	for (uint32_t t = 0; t < n; t++) {
		for (uint32_t r = 0; r < rows; r++) {
			double s = 0, scale = 0;

			for (uint32_t c = 0; c < cols; c++) {
				double p = (double)wf[(size_t)r * cols + c] *
					   x[(size_t)t * cols + c];

				s += p;
				scale += fabs(p);
			}
			assert_close(what, (size_t)t * rows + r, y[(size_t)t * rows + r], s, scale,
				     1e-5);
		}
	}
	free(wq);
	free(wf);
	free(x);
	free(y);
}

static void matvec_matches_f64_for_odd_sizes(void **state)
{
	const struct engine_case *c = *state;
	static const uint32_t rows[] = { 1, 3, 5, 37, 130 };
	static const uint32_t cols[] = { 1, 7, 17, 33, 100, 257 };

	FOR_EACH_THREADS(c, e, t)
		for (size_t d = 0; d < N_ELEMS(dtypes); d++)
			for (size_t i = 0; i < N_ELEMS(rows); i++)
				for (size_t j = 0; j < N_ELEMS(cols); j++)
					check_matmul(e, dtypes[d], rows[i],
						     fit(dtypes[d], cols[j]), 1);
}

static void matvec_large_enough_to_split_over_threads(void **state)
{
	const struct engine_case *c = *state;

	/* 4099 rows x 1031 cols: every thread gets chunks, the last one a ragged tail. */
	FOR_EACH_THREADS(c, e, t)
		for (size_t d = 0; d < N_ELEMS(dtypes); d++)
			check_matmul(e, dtypes[d], 4099, fit(dtypes[d], 1031), 1);
}

static void matmul_matches_f64_for_batches(void **state)
{
	const struct engine_case *c = *state;
	static const uint32_t ns[] = { 2, 3, 4, 5, 9 };

	FOR_EACH_THREADS(c, e, t)
		for (size_t d = 0; d < N_ELEMS(dtypes); d++)
			for (size_t i = 0; i < N_ELEMS(ns); i++) {
				check_matmul(e, dtypes[d], 7, fit(dtypes[d], 45), ns[i]);
				check_matmul(e, dtypes[d], 301, fit(dtypes[d], 129), ns[i]);
			}
}

static double silu(double v)
{
	return v / (1.0 + exp(-v));
}

static void check_expert(struct mp_engine *e, enum mp_dtype dt, uint32_t hidden, uint32_t ffn,
			 uint32_t n)
{
	const size_t mat = (size_t)hidden * ffn;
	void *wq;
	float *wf, *x = malloc((size_t)n * hidden * sizeof(float));
	float *out = malloc((size_t)n * hidden * sizeof(float));
	double *h = malloc(ffn * sizeof(double));
	char what[96];

	assert_non_null(x);
	assert_non_null(out);
	assert_non_null(h);
	make_weights(dt, 3 * mat, &wq, &wf);
	fill(x, (size_t)n * hidden);
	assert_int_equal(mp_engine_expert_ffn(e, NULL, dt, wq, hidden, ffn, x, n, out), 0);
	snprintf(what, sizeof(what), "%s expert %s %ux%u n=%u t=%u", mp_engine_name(e),
		 mp_dtype_name(dt), hidden, ffn, n, e->threads);
	for (uint32_t t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * hidden;

		for (uint32_t f = 0; f < ffn; f++) {
			double g = 0, u = 0;

			for (uint32_t c = 0; c < hidden; c++) {
				g += (double)wf[(size_t)f * hidden + c] * xt[c];
				u += (double)wf[mat + (size_t)f * hidden + c] * xt[c];
			}
			h[f] = silu(g) * u;
		}
		for (uint32_t r = 0; r < hidden; r++) {
			double s = 0, scale = 0;

			for (uint32_t f = 0; f < ffn; f++) {
				double p = (double)wf[2 * mat + (size_t)r * ffn + f] * h[f];

				s += p;
				scale += fabs(p);
			}
			/* h itself carries f32 rounding from two dot products: allow for it. */
			assert_close(what, (size_t)t * hidden + r, out[(size_t)t * hidden + r], s,
				     scale, 1e-4);
		}
	}
	free(wq);
	free(wf);
	free(x);
	free(out);
	free(h);
}

static void expert_ffn_matches_f64(void **state)
{
	const struct engine_case *c = *state;

	FOR_EACH_THREADS(c, e, t)
		for (size_t d = 0; d < N_ELEMS(dtypes); d++) {
			const enum mp_dtype dt = dtypes[d];

			check_expert(e, dt, fit(dt, 37), fit(dt, 45), 1);
			check_expert(e, dt, fit(dt, 37), fit(dt, 45), 3);
			check_expert(e, dt, fit(dt, 129), fit(dt, 515), 1);
			check_expert(e, dt, fit(dt, 129), fit(dt, 515), 6);
		}
}

/*
 * A vector's products are the same bits alone and in a batch, wherever it
 * sits in the batch: batched decoding gives each sequence exactly the tokens
 * it gives alone. Checked for matmul and the expert FFN, every type, batch
 * sizes around the kernels' blocks, over 1..4 threads.
 */
static void check_batch_invariance(struct mp_engine *e, enum mp_dtype dt, uint32_t rows,
				   uint32_t cols, uint32_t n, bool expert)
{
	const uint32_t out_dim = expert ? cols : rows;
	const size_t wn = expert ? 3ull * rows * cols : (size_t)rows * cols;
	float *x = malloc((size_t)n * cols * sizeof(float));
	float *batch = malloc((size_t)n * out_dim * sizeof(float));
	float *one = malloc(out_dim * sizeof(float));
	void *wq;
	float *wf;

	assert_non_null(x);
	assert_non_null(batch);
	assert_non_null(one);
	make_weights(dt, wn, &wq, &wf);
	fill(x, (size_t)n * cols);
	if (expert)
		assert_int_equal(mp_engine_expert_ffn(e, NULL, dt, wq, cols, rows, x, n, batch), 0);
	else
		assert_int_equal(mp_engine_matmul(e, NULL, dt, wq, rows, cols, x, n, batch), 0);
	for (uint32_t t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * cols;

		if (expert)
			assert_int_equal(mp_engine_expert_ffn(e, NULL, dt, wq, cols, rows, xt, 1, one),
					 0);
		else
			assert_int_equal(mp_engine_matmul(e, NULL, dt, wq, rows, cols, xt, 1, one), 0);
		if (memcmp(one, batch + (size_t)t * out_dim, out_dim * sizeof(float))) {
			print_error("%s %s %s %ux%u: vector %u of %u differs from its product "
				    "alone\n", mp_engine_name(e), expert ? "expert" : "matmul",
				    mp_dtype_name(dt), rows, cols, t, n);
			fail();
		}
	}
	free(wq);
	free(wf);
	free(x);
	free(batch);
	free(one);
}

static void products_are_the_same_bits_alone_and_batched(void **state)
{
	const struct engine_case *c = *state;
	static const uint32_t ns[] = { 2, 4, 5, 7, 9, 13, 17 };

	FOR_EACH_THREADS(c, e, t)
		for (size_t d = 0; d < N_ELEMS(dtypes); d++) {
			const enum mp_dtype dt = dtypes[d];

			for (size_t i = 0; i < N_ELEMS(ns); i++) {
				check_batch_invariance(e, dt, 301, fit(dt, 129), ns[i], false);
				check_batch_invariance(e, dt, 515, fit(dt, 129), ns[i], false);
				check_batch_invariance(e, dt, fit(dt, 45), fit(dt, 37), ns[i], true);
			}
			/* Past the engine's 256 KiB of vectors: a prefill's row and vector blocks. */
			check_batch_invariance(e, dt, 67, 1024, 70, false);
		}
}

/*
 * matmul (or, expert, expert_ffn with hidden = cols and ffn = rows) over w
 * and over its packed copy: the same bytes for every n = 1..nmax.
 */
static void check_packed(struct mp_engine *e, uint32_t rows, uint32_t cols, uint32_t nmax,
			 bool expert)
{
	const enum mp_dtype dt = MP_DTYPE_BF16;
	const uint32_t out_dim = expert ? cols : rows;
	const size_t wn = expert ? 3ull * rows * cols : (size_t)rows * cols;
	float *x = malloc((size_t)nmax * cols * sizeof(float));
	float *want = malloc((size_t)nmax * out_dim * sizeof(float));
	float *got = malloc((size_t)nmax * out_dim * sizeof(float));
	void *wq, *pk = malloc(mp_dtype_bytes(dt, wn));
	float *wf;

	assert_non_null(x);
	assert_non_null(want);
	assert_non_null(got);
	assert_non_null(pk);
	make_weights(dt, wn, &wq, &wf);
	fill(x, (size_t)nmax * cols);
	if (expert)
		assert_int_equal(mp_engine_pack_expert(e, dt, wq, cols, rows, pk), 0);
	else
		assert_int_equal(mp_engine_pack(e, dt, wq, rows, cols, pk), 0);
	/* Two rows of two whole blocks or more are laid out otherwise: not a copy. */
	if (rows >= 2 && cols >= 64)
		assert_true(memcmp(pk, wq, mp_dtype_bytes(dt, wn)) != 0);
	for (uint32_t n = 1; n <= nmax; n++) {
		if (expert) {
			assert_int_equal(mp_engine_expert_ffn(e, NULL, dt, wq, cols, rows, x, n, want),
					 0);
			assert_int_equal(mp_engine_expert_ffn_packed(e, NULL, dt, pk, cols, rows, x, n,
								     got), 0);
		} else {
			assert_int_equal(mp_engine_matmul(e, NULL, dt, wq, rows, cols, x, n, want), 0);
			assert_int_equal(mp_engine_matmul_packed(e, NULL, dt, pk, rows, cols, x, n,
								 got), 0);
		}
		if (memcmp(want, got, (size_t)n * out_dim * sizeof(float))) {
			print_error("%s packed %s %ux%u n=%u: not the row-major bits\n",
				    mp_engine_name(e), expert ? "expert" : "matmul", rows, cols, n);
			fail();
		}
	}
	free(wq);
	free(wf);
	free(pk);
	free(x);
	free(want);
	free(got);
}

/*
 * Every built-in engine either packs bf16 weights, and its products over
 * them are the bytes of the same products over the row-major weights (every
 * n = 1..17, row counts that leave a short last group of 1-3 rows, columns
 * with and without a part block, chunks over threads, a prefill's blocks),
 * or refuses packing and the packed calls with -EOPNOTSUPP. No engine packs
 * f32.
 */
static void packed_products_are_the_bits_of_row_major(void **state)
{
	static const uint32_t rows[] = { 1, 2, 3, 4, 5, 6, 7, 9, 37 };
	static const uint32_t cols[] = { 16, 32, 37, 64, 117, 129 };
	const char *const *names = mp_engine_builtin_names();
	uint32_t packing = 0;

	(void)state;
	for (size_t i = 0; names[i]; i++) {
		for (uint32_t t = 1; t <= 3; t += 2) {
			struct mp_engine *e = NULL;
			float y[4], x[64] = { 0 };
			uint16_t w[4 * 64] = { 0 }, pk[4 * 64];
			int err = mp_engine_open(names[i], &(struct mp_engine_config){ .threads = t },
						 &e);

			if (err == -EOPNOTSUPP)
				break;
			assert_int_equal(err, 0);
			assert_false(mp_engine_packs(e, MP_DTYPE_F32));
			assert_int_equal(mp_engine_pack(e, MP_DTYPE_F32, w, 2, 32, pk), -EOPNOTSUPP);
			if (!mp_engine_packs(e, MP_DTYPE_BF16)) {
				printf("# engine %s: no packed layout\n", names[i]);
				assert_int_equal(mp_engine_pack(e, MP_DTYPE_BF16, w, 4, 64, pk),
						 -EOPNOTSUPP);
				assert_int_equal(mp_engine_matmul_packed(e, NULL, MP_DTYPE_BF16, w, 4,
									 64, x, 1, y), -EOPNOTSUPP);
				mp_engine_close(e);
				break;
			}
			packing++;
			for (size_t r = 0; r < N_ELEMS(rows); r++)
				for (size_t c = 0; c < N_ELEMS(cols); c++)
					check_packed(e, rows[r], cols[c], 17, false);
			/* Chunks over the threads, and a prefill's row and vector blocks. */
			check_packed(e, 515, 129, 17, false);
			check_packed(e, 515, 1024, 70, false);
			/* ref-bf16's 4-block segments (7+ vectors): a short last one and a part block */
			check_packed(e, 38, 557, 17, false);
			/* Experts: ffn (rows) x hidden (cols). */
			check_packed(e, 37, 45, 17, true);
			check_packed(e, 130, 96, 17, true);
			check_packed(e, 512, 256, 17, true);
			mp_engine_close(e);
		}
	}
	/* The CPU decides which engines pack; say so when none did. */
	if (!packing)
		printf("# no engine packs on this CPU: only the refusals were checked\n");
}

static void rmsnorm_matches_f64(void **state)
{
	const struct engine_case *c = *state;
	const uint32_t dim = 37, n = 3;
	float x[37 * 3], w[37], y[37 * 3];

	fill(x, dim * n);
	fill(w, dim);
	FOR_EACH_THREADS(c, e, t) {
		assert_int_equal(mp_engine_rmsnorm(e, x, w, dim, n, 1e-5f, y), 0);
		for (uint32_t r = 0; r < n; r++) {
			double ss = 0;

			for (uint32_t i = 0; i < dim; i++)
				ss += (double)x[r * dim + i] * x[r * dim + i];
			for (uint32_t i = 0; i < dim; i++) {
				double want = x[r * dim + i] / sqrt(ss / dim + 1e-5) * w[i];

				assert_close("rmsnorm", r * dim + i, y[r * dim + i], want,
					     fabs(want), 1e-5);
			}
		}
	}
}

static void topk_picks_largest_with_softmax_over_them(void **state)
{
	const struct engine_case *c = *state;
	/* 3 and 5 tie: the lower id comes first. */
	const float logits[7] = { 0.5f, -1.0f, 2.0f, 3.0f, 1.0f, 3.0f, -4.0f };
	uint32_t ids[3];
	float w[3];

	FOR_EACH_THREADS(c, e, t) {
		double z = exp(3.0) + exp(3.0) + exp(2.0);

		assert_int_equal(mp_engine_topk(e, logits, 7, 3, ids, w), 0);
		assert_int_equal(ids[0], 3);
		assert_int_equal(ids[1], 5);
		assert_int_equal(ids[2], 2);
		assert_close("topk w", 0, w[0], exp(3.0) / z, 1, 1e-6);
		assert_close("topk w", 1, w[1], exp(3.0) / z, 1, 1e-6);
		assert_close("topk w", 2, w[2], exp(2.0) / z, 1, 1e-6);
		t_log_reset();
		assert_int_equal(mp_engine_topk(e, logits, 7, 8, ids, w), -EINVAL);
		assert_true(t_log_contains("top-8 of 7"));
	}
}

static void rope_rotates_half_pairs_by_position(void **state)
{
	const struct engine_case *c = *state;
	const uint32_t n = 3, heads = 2, hd = 6, pos0 = 5;
	float x[3 * 2 * 6], y[3 * 2 * 6];

	fill(x, n * heads * hd);
	FOR_EACH_THREADS(c, e, t) {
		memcpy(y, x, sizeof(x));
		assert_int_equal(mp_engine_rope(e, y, n, heads, hd, pos0, 10000.0f), 0);
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t h = 0; h < heads; h++)
				for (uint32_t j = 0; j < hd / 2; j++) {
					const float *xr = x + (i * heads + h) * hd;
					const float *yr = y + (i * heads + h) * hd;
					double a = (pos0 + i) * pow(10000.0, -2.0 * j / hd);
					double x0 = xr[j], x1 = xr[j + hd / 2];

					assert_close("rope", j, yr[j], x0 * cos(a) - x1 * sin(a), 2,
						     1e-6);
					assert_close("rope", j + hd / 2, yr[j + hd / 2],
						     x0 * sin(a) + x1 * cos(a), 2, 1e-6);
				}
	}
}

/*
 * The reference engine keeps RoPE's cos and sin in a table that grows with
 * the positions asked for and is remade when theta or head_dim change;
 * positions past its cap are computed per call. Every path gives the
 * floats a per-call computation gives, bit for bit.
 */
static void rope_table_gives_the_floats_of_a_direct_computation(void **state)
{
	static const struct {
		uint32_t pos0, n, hd;
		float theta;
	} calls[] = {
		{ 5, 3, 6, 10000.0f }, { 250, 12, 6, 10000.0f }, { 0, 2, 6, 500.0f },
		{ 1000, 4, 8, 500.0f }, { 40000, 3, 8, 500.0f }, { 7, 2, 8, 500.0f },
	};
	const uint32_t heads = 2;
	struct mp_engine *e;
	float x[12 * 2 * 8], y[12 * 2 * 8];

	(void)state;
	assert_int_equal(mp_engine_open("ref", &(struct mp_engine_config){ .threads = 1 }, &e),
			 0);
	for (size_t c = 0; c < N_ELEMS(calls); c++) {
		const uint32_t n = calls[c].n, hd = calls[c].hd, half = hd / 2;

		fill(x, n * heads * hd);
		memcpy(y, x, sizeof(x));
		assert_int_equal(mp_engine_rope(e, y, n, heads, hd, calls[c].pos0,
						calls[c].theta), 0);
		for (uint32_t i = 0; i < n * heads; i++)
			for (uint32_t j = 0; j < half; j++) {
				double pos = (double)calls[c].pos0 + i / heads;
				double a = pos * pow((double)calls[c].theta, -2.0 * j / hd);
				float co = (float)cos(a), si = (float)sin(a);
				float x0 = x[i * hd + j], x1 = x[i * hd + j + half];
				float w0 = x0 * co - x1 * si, w1 = x0 * si + x1 * co;

				if (memcmp(&w0, &y[i * hd + j], sizeof(w0)) ||
				    memcmp(&w1, &y[i * hd + j + half], sizeof(w1)))
					fail_msg("rope call %zu row %u pair %u: %.9g %.9g, want "
						 "%.9g %.9g", c, i, j, (double)y[i * hd + j],
						 (double)y[i * hd + j + half], (double)w0,
						 (double)w1);
			}
	}
	mp_engine_close(e);
}

static void attention_is_causal_gqa(void **state)
{
	const struct engine_case *c = *state;
	const uint32_t n = 3, pos0 = 4, heads = 4, kvh = 2, hd = 5, len = pos0 + n;
	float q[3 * 4 * 5], kc[7 * 2 * 5], vc[7 * 2 * 5], out[3 * 4 * 5];
	struct mp_attention a = {
		.q = q, .k_cache = kc, .v_cache = vc, .out = out, .n = n, .pos0 = pos0,
		.heads = heads, .kv_heads = kvh, .head_dim = hd,
	};

	fill(q, sizeof(q) / sizeof(q[0]));
	fill(kc, sizeof(kc) / sizeof(kc[0]));
	fill(vc, sizeof(vc) / sizeof(vc[0]));
	(void)len;
	FOR_EACH_THREADS(c, e, t) {
		assert_int_equal(mp_engine_attention(e, &a), 0);
		for (uint32_t i = 0; i < n; i++) {
			for (uint32_t h = 0; h < heads; h++) {
				uint32_t g = h / (heads / kvh), plen = pos0 + i + 1;
				double s[7], max = -INFINITY, z = 0;

				for (uint32_t p = 0; p < plen; p++) {
					s[p] = 0;
					for (uint32_t d = 0; d < hd; d++)
						s[p] += (double)q[(i * heads + h) * hd + d] *
							kc[(p * kvh + g) * hd + d];
					s[p] /= sqrt(hd);
					max = fmax(max, s[p]);
				}
				for (uint32_t p = 0; p < plen; p++)
					z += s[p] = exp(s[p] - max);
				for (uint32_t d = 0; d < hd; d++) {
					double o = 0;

					for (uint32_t p = 0; p < plen; p++)
						o += s[p] / z * vc[(p * kvh + g) * hd + d];
					assert_close("attention", (i * heads + h) * hd + d,
						     out[(i * heads + h) * hd + d], o, 1, 1e-5);
				}
			}
		}
	}
}

/* A guard that counts its calls and fails the call numbered fail_at (0: none). */
struct count_guard {
	atomic_uint calls;
	unsigned fail_at;
};

static int counting_wrap(void *wctx, int (*fn)(void *arg), void *arg)
{
	struct count_guard *g = wctx;
	unsigned n = atomic_fetch_add(&g->calls, 1) + 1;

	if (n == g->fail_at)
		return -EFAULT;
	return fn(arg);
}

static void guard_wraps_weight_reads_and_its_error_is_returned(void **state)
{
	const struct engine_case *c = *state;
	const uint32_t hidden = 129, ffn = 1030;
	float *x = calloc(hidden, sizeof(float)), *out = calloc(hidden, sizeof(float));
	float *ref = calloc(hidden, sizeof(float));
	void *wq;
	float *wf;

	make_weights(MP_DTYPE_BF16, 3ull * hidden * ffn, &wq, &wf);
	fill(x, hidden);
	FOR_EACH_THREADS(c, e, t) {
		struct count_guard cg = { .fail_at = 0 };
		struct mp_guard g = { counting_wrap, &cg };

		assert_int_equal(mp_engine_expert_ffn(e, NULL, MP_DTYPE_BF16, wq, hidden, ffn, x, 1,
						      ref), 0);
		assert_int_equal(mp_engine_expert_ffn(e, &g, MP_DTYPE_BF16, wq, hidden, ffn, x, 1,
						      out), 0);
		assert_true(atomic_load(&cg.calls) >= 2);	/* gate|up, then down */
		assert_memory_equal(out, ref, hidden * sizeof(float));

		/* Any chunk's failure (first, middle, last) is the op's result. */
		for (unsigned k = 1; k <= atomic_load(&cg.calls); k++) {
			struct count_guard fg = { .fail_at = k };
			struct mp_guard f = { counting_wrap, &fg };

			assert_int_equal(mp_engine_expert_ffn(e, &f, MP_DTYPE_BF16, wq, hidden, ffn,
							      x, 1, out), -EFAULT);
		}
	}
	free(wq);
	free(wf);
	free(x);
	free(out);
	free(ref);
}

struct worker_check {
	const struct mp_engine *e;
	atomic_uint bad;		/* chunks run by a worker index >= e->threads */
	atomic_uint runs;
};

static int check_worker_chunk(void *ctx, uint32_t chunk, uint32_t worker)
{
	struct worker_check *w = ctx;

	(void)chunk;
	atomic_fetch_add(&w->runs, 1);
	if (worker >= w->e->threads)
		atomic_fetch_add(&w->bad, 1);
	return 0;
}

/*
 * The threads change in place (what a server does between two steps,
 * docs/elastic.md): each count's ops give the right answers (the per-worker
 * scratch grown and shrunk with the pool), chunks run on workers of the new
 * pool only, and a bad count changes nothing.
 */
static void set_threads_resizes_in_place(void **state)
{
	const struct engine_case *c = *state;
	static const uint32_t counts[] = { 3, 1, 4, 2 };
	struct mp_engine *e = open_engine(c, 1);
	const enum mp_dtype dt = dtypes[N_ELEMS(dtypes) - 1];

	for (size_t i = 0; i < N_ELEMS(counts); i++) {
		struct worker_check w = { .e = e };

		assert_int_equal(mp_engine_set_threads(e, counts[i]), 0);
		assert_int_equal(e->threads, counts[i]);
		check_matmul(e, dt, 4099, fit(dt, 1031), 1);
		check_expert(e, dt, fit(dt, 129), fit(dt, 515), 6);
		assert_int_equal(mp_engine_parallel(e, NULL, 64, check_worker_chunk, &w), 0);
		assert_int_equal(atomic_load(&w.runs), 64);
		assert_int_equal(atomic_load(&w.bad), 0);
	}
	assert_int_equal(mp_engine_set_threads(e, 0), -EINVAL);
	assert_int_equal(mp_engine_set_threads(e, 1025), -EINVAL);
	assert_non_null(strstr(mp_last_error(), "1025 threads"));
	assert_int_equal(e->threads, 2);
	assert_int_equal(mp_engine_set_threads(NULL, 2), -EINVAL);
	check_matmul(e, dt, 301, fit(dt, 129), 5);
	mp_engine_close(e);
}

static int count_chunk(void *ctx, uint32_t chunk, uint32_t worker)
{
	atomic_uint *hits = ctx;

	if (worker >= MAX_THREADS)
		return -EINVAL;
	atomic_fetch_add(&hits[chunk], 1);
	return 0;
}

static void parallel_runs_every_chunk_once(void **state)
{
	const struct engine_case *c = *state;
	static atomic_uint hits[257];

	FOR_EACH_THREADS(c, e, t) {
		/* Back-to-back jobs: a worker late for one must never run a chunk of the next. */
		for (uint32_t round = 0; round < 2000; round++) {
			uint32_t n = 1 + round % 257;

			for (uint32_t i = 0; i < n; i++)
				atomic_store(&hits[i], 0);
			assert_int_equal(mp_engine_parallel(e, NULL, n, count_chunk, hits), 0);
			for (uint32_t i = 0; i < n; i++)
				assert_int_equal(atomic_load(&hits[i]), 1);
		}
	}
}

static int fail_chunk(void *ctx, uint32_t chunk, uint32_t worker)
{
	(void)ctx;
	(void)worker;
	return chunk == 7 ? -EIO : 0;
}

static void parallel_returns_a_chunk_error(void **state)
{
	const struct engine_case *c = *state;

	FOR_EACH_THREADS(c, e, t) {
		assert_int_equal(mp_engine_parallel(e, NULL, 50, fail_chunk, NULL), -EIO);
		/* The pool recovers: the next job runs clean. */
		assert_int_equal(mp_engine_parallel(e, NULL, 5, fail_chunk, NULL), 0);
	}
}

static void membw_measures_a_positive_rate(void **state)
{
	const struct engine_case *c = *state;
	double gbps = 0;

	FOR_EACH_THREADS(c, e, t) {
		assert_int_equal(mp_engine_membw(e, 8u << 20, 3, &gbps), 0);
		assert_true(gbps > 0.01 && gbps < 10000.0);
		assert_int_equal(mp_engine_membw(e, 1024, 3, &gbps), -EINVAL);
	}
}

static void membw_one_thread_and_page_kind(void **state)
{
	const struct engine_case *c = *state;
	struct mp_membw *m;
	double gbps = 0, share;

	FOR_EACH_THREADS(c, e, t) {
		assert_int_equal(mp_membw_open(e, 5u << 20, &m), 0);
		assert_int_equal(mp_membw_bytes(m), 5u << 20);
		assert_int_equal(mp_membw_sample_one(m, &gbps), 0);
		assert_true(gbps > 0.01 && gbps < 10000.0);
		share = mp_membw_huge_share(m);
		assert_true(share == -1 || (share >= 0 && share <= 1));
		mp_membw_close(m);
	}
}

static void bad_arguments_are_refused(void **state)
{
	const struct engine_case *c = *state;
	float x[4] = { 0 }, y[4];

	FOR_EACH_THREADS(c, e, t) {
		t_log_reset();
		assert_int_equal(mp_engine_matvec(e, NULL, MP_DTYPE_F32, NULL, 4, 1, x, y),
				 -EINVAL);
		assert_true(t_log_contains("NULL weights"));
		assert_int_equal(mp_engine_matmul(e, NULL, MP_DTYPE_F32, x, 0, 4, x, 1, y),
				 -EINVAL);
		assert_true(t_log_contains("empty product"));
		assert_int_equal(mp_engine_matvec(e, NULL, (enum mp_dtype)9, x, 1, 4, x, y),
				 -EINVAL);
		assert_true(t_log_contains("unknown weight type 9"));
		assert_int_equal(mp_engine_rope(e, y, 1, 1, 3, 0, 10000.0f), -EINVAL);
		/* block types' rows are whole blocks of 32, an expert's ffn rows too */
		t_log_reset();
		assert_int_equal(mp_engine_matvec(e, NULL, MP_DTYPE_Q8_0, x, 1, 48, x, y), -EINVAL);
		assert_true(t_log_contains("q8_0 rows of 48 elements are not whole blocks of 32"));
		t_log_reset();
		assert_int_equal(mp_engine_expert_ffn(e, NULL, MP_DTYPE_Q4_0, x, 64, 40, x, 1, y),
				 -EINVAL);
		assert_true(t_log_contains("q4_0 rows of 40 elements"));
	}
}

/* A plug-in whose init fails for counts at or above fail_from (0: never). */
static uint32_t fail_from;
static unsigned int inits, finis;
static uint32_t init_saw_pool;	/* workers a parallel run from init saw */

struct meeting {
	atomic_uint arrived;
	uint32_t expect;
};

/* Waits (2 s at most) until every chunk runs at once: only a pool of expect workers can. */
static int meet_chunk(void *ctx, uint32_t chunk, uint32_t worker)
{
	struct meeting *m = ctx;
	struct timespec t0, t;

	(void)chunk;
	(void)worker;
	atomic_fetch_add(&m->arrived, 1);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		if (atomic_load(&m->arrived) >= m->expect)
			return 0;
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while (t.tv_sec - t0.tv_sec < 2);
	return -ETIMEDOUT;
}

static int flaky_init(struct mp_engine *e)
{
	struct meeting m = { .expect = e->threads };

	inits++;
	if (e->host->parallel(e, NULL, e->threads, meet_chunk, &m))
		return -EPROTO;
	init_saw_pool = e->threads;
	return fail_from && e->threads >= fail_from ? -ENOTRECOVERABLE : 0;
}

static void flaky_fini(struct mp_engine *e)
{
	(void)e;
	finis++;
}

/*
 * A plug-in's init runs again with the new pool in place; when it fails the
 * old threads come back and still compute; when it fails for the old count
 * too, the instance refuses every op with -EIO and close skips its fini.
 */
static void set_threads_survives_a_failing_plugin_init(void **state)
{
	struct mp_engine_config cfg = { .threads = 1 };
	struct mp_engine *e = NULL;
	struct mp_engine_ops ops;
	float w[64], x[8], y[8];

	(void)state;
	memset(w, 0, sizeof(w));
	memset(x, 0, sizeof(x));
	assert_int_equal(mp_engine_open("ref", &cfg, &e), 0);
	ops = *e->ops;
	ops.init = flaky_init;
	ops.fini = flaky_fini;
	e->ops = &ops;
	assert_int_equal(mp_engine_set_threads(e, 2), 0);
	assert_int_equal(init_saw_pool, 2);
	assert_int_equal(finis, 1);
	fail_from = 3;
	assert_int_equal(mp_engine_set_threads(e, 4), -ENOTRECOVERABLE);
	assert_int_equal(e->threads, 2);
	assert_int_equal(init_saw_pool, 2);
	assert_int_equal(mp_engine_matvec(e, NULL, MP_DTYPE_F32, w, 8, 8, x, y), 0);
	fail_from = 1;
	assert_int_equal(mp_engine_set_threads(e, 1), -ENOTRECOVERABLE);
	assert_non_null(strstr(mp_last_error(), "unusable"));
	assert_int_equal(mp_engine_matvec(e, NULL, MP_DTYPE_F32, w, 8, 8, x, y), -EIO);
	assert_int_equal(mp_engine_set_threads(e, 3), -EIO);
	assert_int_equal(inits, 5);
	assert_int_equal(finis, 3);
	mp_engine_close(e);
	assert_int_equal(finis, 3);
}

/* The THPeligible line of the smaps entry holding p: 1 advised, 0 not, -1 none or unreadable. */
static int thp_eligible(const void *p)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	unsigned long long a, b;
	char line[512], perm[8];
	int in = 0, v = -1;

	while (f && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx-%llx %7s", &a, &b, perm) == 3)
			in = (uintptr_t)p >= a && (uintptr_t)p < b;
		else if (in && sscanf(line, "THPeligible: %d", &v) == 1)
			break;
	}
	if (f)
		fclose(f);
	return v;
}

/* THP is on for advised memory here: "[always]" or "[madvise]" in the kernel's setting. */
static bool thp_for_advised(void)
{
	char s[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re");

	if (f && !fgets(s, sizeof(s), f))
		s[0] = '\0';
	if (f)
		fclose(f);
	return strstr(s, "[always]") || strstr(s, "[madvise]");
}

static void huge_map_is_aligned_zeroed_and_advised(void **state)
{
	static const size_t lens[] = { 1, 4096, (3u << 20) + 5, 8u << 20 };

	(void)state;
	assert_null(mp_huge_map(0));
	for (size_t i = 0; i < N_ELEMS(lens); i++) {
		unsigned char *p = mp_huge_map(lens[i]);
		double share;

		assert_non_null(p);
		assert_int_equal((uintptr_t)p % (2u << 20), 0);
		assert_int_equal(p[0] | p[lens[i] / 2] | p[lens[i] - 1], 0);
		memset(p, 0xa5, lens[i]);
		/*
		 * Advised: eligible wherever the kernel gives THP to advised memory and
		 * the mapping can hold a huge page (smaller ones never can).
		 */
		if (lens[i] >= (2u << 20) && thp_for_advised() && thp_eligible(p) != -1)
			assert_int_equal(thp_eligible(p), 1);
		share = mp_huge_share(p);
		assert_true(share == -1 || (share >= 0 && share <= 1));
		mp_huge_unmap(p, lens[i]);
	}
}

static void unknown_engine_is_enoent_naming_it(void **state)
{
	struct mp_engine *e = NULL;

	(void)state;
	t_log_reset();
	assert_int_equal(mp_engine_open("no-such-engine", NULL, &e), -ENOENT);
	assert_null(e);
	assert_true(t_log_contains("engine 'no-such-engine': not built in"));
	t_log_reset();
	assert_int_equal(mp_engine_open("bad name", NULL, &e), -EINVAL);
	assert_true(t_log_contains("engine name 'bad name'"));
}

static void plugin_that_is_not_an_engine_is_enoexec(void **state)
{
	struct mp_engine_config cfg = { .threads = 1, .plugin_dir = t_tmpdir() };
	struct mp_engine *e = NULL;
	FILE *f = fopen(t_path("junk.so"), "w");

	(void)state;
	assert_non_null(f);
	fputs("not an ELF file\n", f);
	fclose(f);
	t_log_reset();
	assert_int_equal(mp_engine_open("junk", &cfg, &e), -ENOEXEC);
	assert_true(t_log_contains("junk.so"));
	/* A real shared object without the symbol. */
	t_log_reset();
	assert_int_equal(mp_engine_open("/lib/x86_64-linux-gnu/libm.so.6", &cfg, &e), -ENOEXEC);
	assert_true(t_log_contains("no symbol mp_engine_plugin_ops"));
	assert_null(e);
}

static void builtin_names_open_or_say_why_not(void **state)
{
	const char *const *names = mp_engine_builtin_names();

	(void)state;
	for (size_t i = 0; names[i]; i++) {
		struct mp_engine *e = NULL;
		int err;

		t_log_reset();
		err = mp_engine_open(names[i], NULL, &e);

		if (err == -EOPNOTSUPP) {
			assert_true(t_log_contains("this CPU"));
			continue;
		}
		assert_int_equal(err, 0);
		assert_string_equal(mp_engine_name(e), names[i]);
		mp_engine_close(e);
	}
}

/*
 * Every ISA's kernels widen each type to exactly the floats mp_dtype_to_f32()
 * gives (a block type's dequantised values): the batched path (widen, then
 * f32 tiles) and the single-vector path (gemv, which dequantises in
 * registers) see the same weights.
 */
static void kernels_widen_to_the_floats_of_mp_dtype_to_f32(void **state)
{
	const size_t n = 32 * 37;
	const enum mp_isa isas[] = { MP_ISA_SCALAR, MP_ISA_AVX2, MP_ISA_AVX512 };
	float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
	void *wq;
	float *wf;

	(void)state;
	assert_non_null(want);
	assert_non_null(got);
	for (size_t d = 0; d < N_ELEMS(dtypes); d++) {
		make_weights(dtypes[d], n, &wq, &wf);
		mp_dtype_to_f32(dtypes[d], wq, want, n);
		for (size_t i = 0; i < N_ELEMS(isas); i++) {
			const struct mp_kernels *k = mp_kernels_for(isas[i]);

			if (!k)
				continue;
			memset(got, 0xff, n * sizeof(float));
			k->widen[dtypes[d]](wq, got, n);
			if (memcmp(got, want, n * sizeof(float))) {
				print_error("%s widen of %s differs from mp_dtype_to_f32\n", k->isa,
					    mp_dtype_name(dtypes[d]));
				fail();
			}
		}
		free(wq);
		free(wf);
	}
	free(want);
	free(got);
}

/*
 * Every ISA's silu_mul gives the bits of the scalar expression over expf()
 * (mp_silu_mul1()), AVX-512's computing expf 16 lanes at a time: over 2^24
 * floats spread across all 2^32 (every sign and exponent, so the infinities,
 * NaNs and the ranges where expf over- and underflows, which AVX-512 hands
 * to expf()) and the edges of its fast path, in calls of odd lengths
 * (masked tails), writing nothing past n. A slip at a float's scale (a
 * table entry off by 2^-24) fails here; one in a double's last bits moves
 * a float only next to a rounding boundary, which these samples need not
 * hit: the check over all 2^32 inputs is docs/engine.md's (session 37).
 */
static void kernels_silu_mul_gives_the_bits_of_expf(void **state)
{
	const enum mp_isa isas[] = { MP_ISA_SCALAR, MP_ISA_AVX2, MP_ISA_AVX512 };
	static const float edges[] = {
		0.0f, -0.0f, 1.0f, -1.0f, 87.99999f, -87.99999f, 88.0f, -88.0f, 88.72283f,
		-88.72284f, 88.7229f, -88.7229f, 103.27893f, -103.27893f, 103.972f, -103.973f,
		1e-45f, -1e-45f, 1e-38f, 3.4e38f, -3.4e38f, INFINITY, -INFINITY, NAN, -NAN,
	};
	const uint32_t len = 4093, calls = 1u << 12;
	float *g = malloc((len + 16) * sizeof(float)), *u = malloc(len * sizeof(float));
	float *h = malloc((len + 16) * sizeof(float));
	uint32_t bits = 0x12345;

	(void)state;
	assert_non_null(g);
	assert_non_null(u);
	assert_non_null(h);
	for (uint32_t c = 0; c < calls; c++) {
		/* Each call a stretch of the 2^32 patterns, 2^32 / (calls * len) apart. */
		const uint32_t n = c ? len - c % 16 : N_ELEMS(edges);

		for (uint32_t i = 0; i < n; i++) {
			if (c) {
				bits += 256 + i % 7;
				memcpy(&g[i], &bits, sizeof(bits));
			} else {
				g[i] = edges[i];
			}
			u[i] = i % 3 ? frand() * 4.0f : 1.0f;
		}
		for (size_t i = 0; i < N_ELEMS(isas); i++) {
			const struct mp_kernels *k = mp_kernels_for(isas[i]);

			if (!k)
				continue;
			memset(h, 0xab, (len + 16) * sizeof(float));
			k->silu_mul(g, u, h, n);
			for (uint32_t j = 0; j < n; j++) {
				const float want = mp_silu_mul1(g[j], u[j]);

				if (memcmp(&h[j], &want, sizeof(want)) &&
				    !(isnan(h[j]) && isnan(want))) {
					print_error("%s silu_mul(%a, %a) = %a, expf's %a\n", k->isa,
						    (double)g[j], (double)u[j], (double)h[j],
						    (double)want);
					fail();
				}
			}
			for (uint32_t j = n; j < len + 16; j++)
				assert_int_equal(((const uint8_t *)h)[j * sizeof(float)], 0xab);
		}
	}
	free(g);
	free(u);
	free(h);
}

/*
 * Every table's argmax kernel gives the plain scan's index
 * (mp_argmax_scan()): ties (few distinct values), signed zeros, +-inf and
 * NaNs (x[0] included), all -inf, one largest value anywhere with a -0 or
 * +0 twin after it, at every length 0..130 (the 8-, 16-, 32- and 64-wide
 * blocks and their tails) and at vocabularies' sizes; the values are laid
 * flush against an inaccessible page, so a tail read past x[n - 1] faults.
 */
static void argmax_fill(float *v, uint32_t n, uint32_t trial, uint64_t *rng)
{
	static const float specials[] = { 0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, -1.0f };
	uint32_t at;

	for (uint32_t i = 0; i < n; i++) {
		*rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
		v[i] = (float)((*rng >> 33) % 5) - 2.0f;
		if ((*rng >> 20) % 9 == 0)
			v[i] = specials[(*rng >> 40) % N_ELEMS(specials)];
	}
	if (!n)
		return;
	if (trial == 1)
		v[0] = NAN;
	if (trial == 2)
		for (uint32_t i = 0; i < n; i++)
			v[i] = -INFINITY;
	if (trial == 3)
		for (uint32_t i = 0; i < n; i++)
			v[i] = NAN;
	if (trial % 4 == 0 && trial) {
		/* One largest (a zero) anywhere, its twin of the other sign 1..16 later. */
		at = (uint32_t)(*rng >> 7) % n;
		for (uint32_t i = 0; i < n; i++)
			v[i] = isnan(v[i]) ? v[i] : -1.0f - fabsf(v[i]);
		v[at] = trial % 8 ? -0.0f : 0.0f;
		if (at + 1 + trial % 16 < n)
			v[at + 1 + trial % 16] = -v[at];
	}
}

static void kernels_argmax_is_the_scan_of_the_first_largest(void **state)
{
	const enum mp_isa isas[] = { MP_ISA_SCALAR, MP_ISA_AVX2, MP_ISA_AVX512, MP_ISA_AMX,
				     MP_ISA_BF16 };
	static const uint32_t big[] = { 4093, 4096, 4099, 32000, 32003 };
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	const size_t span = (32003 * sizeof(float) + page - 1) / page * page;
	char *map = mmap(NULL, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
	uint64_t rng = 11;

	(void)state;
	assert_true(map != MAP_FAILED);
	assert_int_equal(mprotect(map + span, page, PROT_NONE), 0);
	for (uint32_t s = 0; s < 131 + N_ELEMS(big); s++) {
		const uint32_t n = s < 131 ? s : big[s - 131];
		float *v = (float *)(map + span) - n;

		for (uint32_t trial = 0; trial < 48; trial++) {
			const uint32_t want = (argmax_fill(v, n, trial, &rng), mp_argmax_scan(v, n));

			for (size_t i = 0; i < N_ELEMS(isas); i++) {
				const struct mp_kernels *k = mp_kernels_for(isas[i]);
				uint32_t got;

				if (!k)
					continue;
				got = k->argmax(v, n);
				if (got != want)
					fail_msg("%s argmax n=%u trial %u: %u, the scan's %u", k->isa,
						 n, trial, got, want);
			}
			assert_int_equal(mp_logits_argmax(v, n), want);
		}
	}
	munmap(map, span + page);
}

/* n random vectors of cols floats at x, and at xk in the order k's gemm reads them. */
static void fill_vectors(const struct mp_kernels *k, enum mp_dtype dt, uint32_t n, uint32_t cols,
			 float *x, float *xk)
{
	fill(x, (size_t)n * cols);
	if (k->xprep[dt])
		k->xprep[dt](x, n, cols, xk);
	else
		memcpy(xk, x, (size_t)n * cols * sizeof(float));
}

/*
 * Every ISA's gemm over n = 1..17 vectors (across the vector kernels'
 * token groups of 2 and 6) at odd shapes: each vector's products are the
 * bits of the same kernel over that vector alone, close to the scalar
 * reference kernel's, written at their stride and nowhere else.
 */
static void check_gemm(const struct mp_kernels *k, enum mp_dtype dt, uint32_t rows, uint32_t cols)
{
	const struct mp_kernels *ref = mp_kernels_for(MP_ISA_SCALAR);
	const uint32_t nmax = 17, ystride = rows + 3;
	float *x = malloc((size_t)nmax * cols * sizeof(float));
	float *xk = malloc((size_t)nmax * cols * sizeof(float));	/* in k's order */
	float *y = malloc((size_t)nmax * ystride * sizeof(float));
	float *one = malloc(rows * sizeof(float)), *want = malloc(rows * sizeof(float));
	void *wq;
	float *wf;

	assert_non_null(x);
	assert_non_null(xk);
	assert_non_null(y);
	assert_non_null(one);
	assert_non_null(want);
	make_weights(dt, (size_t)rows * cols, &wq, &wf);
	fill_vectors(k, dt, nmax, cols, x, xk);
	for (uint32_t n = 1; n <= nmax; n++) {
		memset(y, 0xff, (size_t)nmax * ystride * sizeof(float));
		k->gemm[dt](wq, rows, cols, xk, n, y, ystride);
		for (uint32_t t = 0; t < nmax; t++) {
			const float *xt = x + (size_t)t * cols, *yt = y + (size_t)t * ystride;
			char what[96];

			/* Nothing past the n vectors' rows: the padding keeps its NaN bytes. */
			for (uint32_t r = t < n ? rows : 0; r < ystride; r++)
				assert_true(isnan(yt[r]));
			if (t >= n)
				continue;
			k->gemm[dt](wq, rows, cols, xk + (size_t)t * cols, 1, one, rows);
			if (memcmp(one, yt, rows * sizeof(float))) {
				print_error("%s gemm %s %ux%u: vector %u of %u differs from its "
					    "product alone\n", k->isa, mp_dtype_name(dt), rows, cols,
					    t, n);
				fail();
			}
			ref->gemm[dt](wq, rows, cols, xt, 1, want, rows);
			snprintf(what, sizeof(what), "%s gemm %s %ux%u n=%u vector %u", k->isa,
				 mp_dtype_name(dt), rows, cols, n, t);
			for (uint32_t r = 0; r < rows; r++) {
				double scale = 0;

				for (uint32_t c = 0; c < cols; c++)
					scale += fabs((double)wf[(size_t)r * cols + c] * xt[c]);
				assert_close(what, r, yt[r], want[r], scale, 1e-5);
			}
		}
	}
	free(wq);
	free(wf);
	free(x);
	free(xk);
	free(y);
	free(one);
	free(want);
}

/* An ISA's kernels, or NULL (saying so) when this CPU or build lacks them. */
static const struct mp_kernels *isa_kernels(enum mp_isa isa)
{
	const struct mp_kernels *k = mp_kernels_for(isa);

	if (!k)
		printf("# kernels of ISA %d: not on this CPU or build, not run\n", (int)isa);
	return k;
}

static void kernels_gemm_is_batch_invariant_and_matches_scalar(void **state)
{
	const enum mp_isa isas[] = { MP_ISA_SCALAR, MP_ISA_AVX2, MP_ISA_AVX512 };
	static const uint32_t rows[] = { 1, 3, 13, 38 };
	static const uint32_t cols[] = { 7, 45, 96, 129 };

	(void)state;
	for (size_t i = 0; i < N_ELEMS(isas); i++) {
		const struct mp_kernels *k = isa_kernels(isas[i]);

		if (!k)
			continue;
		for (size_t d = 0; d < N_ELEMS(dtypes); d++)
			for (size_t r = 0; r < N_ELEMS(rows); r++)
				for (size_t c = 0; c < N_ELEMS(cols); c++)
					check_gemm(k, dtypes[d], rows[r], fit(dtypes[d], cols[c]));
	}
}

/*
 * The kernels read no byte outside the weights: a matrix flush against an
 * inaccessible page on either side (masked tails, prefetches running ahead
 * of the reads, and any load that starts before a block with its first
 * lanes masked off) gives the bits of the same product elsewhere.
 */
/*
 * The bytes w (packed: for gemm_packed) copied flush against the start, then
 * the end, of span readable bytes at fence: n vectors' products there are
 * want (ahead of the call for the row-major kernel: computed here).
 */
static void fenced_run(const struct mp_kernels *k, enum mp_dtype dt, bool packed, const void *w,
		       uint32_t rows, uint32_t cols, const float *xk, uint32_t n, char *fence,
		       size_t span, float *want, float *got)
{
	const size_t bytes = mp_dtype_bytes(dt, (size_t)rows * cols);
	const mp_gemm_fn gemm = packed ? k->gemm_packed[dt] : k->gemm[dt];

	if (!packed)
		gemm(w, rows, cols, xk, n, want, rows);
	for (int at = 0; at < 2; at++) {
		char *f = fence + (at ? span - bytes : 0);

		memcpy(f, w, bytes);
		memset(got, 0xff, (size_t)n * rows * 4);
		gemm(f, rows, cols, xk, n, got, rows);
		if (memcmp(got, want, (size_t)n * rows * 4)) {
			print_error("%s %sgemm %s %ux%u n=%u: fenced at the %s, other products\n",
				    k->isa, packed ? "packed " : "", mp_dtype_name(dt), rows, cols, n,
				    at ? "end" : "start");
			fail();
		}
	}
}

static void check_fenced_gemm(const struct mp_kernels *k, enum mp_dtype dt, uint32_t rows,
			      uint32_t cols)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	const size_t bytes = mp_dtype_bytes(dt, (size_t)rows * cols);
	const size_t span = (bytes + page - 1) / page * page;
	const uint32_t n = 5;
	float *x = malloc((size_t)n * cols * sizeof(float)), *xk = malloc((size_t)n * cols * sizeof(float));
	float *want = malloc((size_t)n * rows * 4), *got = malloc((size_t)n * rows * 4);
	char *map = mmap(NULL, span + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	void *wq;
	float *wf;

	assert_non_null(x);
	assert_non_null(xk);
	assert_non_null(want);
	assert_non_null(got);
	assert_true(map != MAP_FAILED);
	assert_int_equal(mprotect(map + page, span, PROT_READ | PROT_WRITE), 0);
	make_weights(dt, (size_t)rows * cols, &wq, &wf);
	fill_vectors(k, dt, n, cols, x, xk);
	fenced_run(k, dt, false, wq, rows, cols, xk, n, map + page, span, want, got);
	/* The packed kernel, over the packed bytes fenced alike: one vector and n. */
	for (uint32_t m = 1; k->gemm_packed[dt] && m <= n; m += n - 1) {
		void *pk = malloc(bytes);

		assert_non_null(pk);
		mp_pack_bf16(wq, rows, cols, pk);
		k->gemm[dt](wq, rows, cols, xk, m, want, rows);
		fenced_run(k, dt, true, pk, rows, cols, xk, m, map + page, span, want, got);
		free(pk);
	}
	munmap(map, span + 2 * page);
	free(wq);
	free(wf);
	free(x);
	free(xk);
	free(want);
	free(got);
}

static void kernels_read_nothing_outside_the_weights(void **state)
{
	const enum mp_isa isas[] = { MP_ISA_SCALAR, MP_ISA_AVX2, MP_ISA_AVX512, MP_ISA_BF16 };

	(void)state;
	for (size_t i = 0; i < N_ELEMS(isas); i++) {
		const struct mp_kernels *k = isa_kernels(isas[i]);

		if (!k)
			continue;
		for (size_t d = 0; d < N_ELEMS(dtypes); d++) {
			check_fenced_gemm(k, dtypes[d], 9, fit(dtypes[d], 96));
			check_fenced_gemm(k, dtypes[d], 8, fit(dtypes[d], 1024));
			/* a part block, and a last group of 3 rows, at either fence */
			check_fenced_gemm(k, dtypes[d], 7, fit(dtypes[d], 117));
		}
	}
}

/*
 * A plug-in is tested when this build made it (meson lists them in the
 * environment); an ISA path when this CPU has it. Either way the output says
 * which cases were left out and why.
 */
static bool case_available(const struct engine_case *c)
{
	const char *built = getenv("MOEPAGER_TEST_PLUGINS");
	struct mp_engine *e = NULL;
	int err;

	if (c->plugin && !(built && strstr(built, c->name))) {
		printf("# engine %s: not built here, its cases are not run\n", c->name);
		return false;
	}
	err = mp_engine_open(c->name, NULL, &e);
	mp_engine_close(e);
	if (err == -EOPNOTSUPP) {
		printf("# engine %s: %s; its cases are not run\n", c->name, mp_last_error());
		return false;
	}
	/* Any other failure is the first case's to report. */
	return true;
}

int main(void)
{
	static const struct {
		const char *name;
		CMUnitTestFunction fn;
	} per_engine[] = {
		{ "matvec_matches_f64_for_odd_sizes", matvec_matches_f64_for_odd_sizes },
		{ "matvec_large_enough_to_split_over_threads",
		  matvec_large_enough_to_split_over_threads },
		{ "matmul_matches_f64_for_batches", matmul_matches_f64_for_batches },
		{ "expert_ffn_matches_f64", expert_ffn_matches_f64 },
		{ "products_are_the_same_bits_alone_and_batched",
		  products_are_the_same_bits_alone_and_batched },
		{ "rmsnorm_matches_f64", rmsnorm_matches_f64 },
		{ "topk_picks_largest_with_softmax_over_them",
		  topk_picks_largest_with_softmax_over_them },
		{ "rope_rotates_half_pairs_by_position", rope_rotates_half_pairs_by_position },
		{ "attention_is_causal_gqa", attention_is_causal_gqa },
		{ "guard_wraps_weight_reads_and_its_error_is_returned",
		  guard_wraps_weight_reads_and_its_error_is_returned },
		{ "parallel_runs_every_chunk_once", parallel_runs_every_chunk_once },
		{ "set_threads_resizes_in_place", set_threads_resizes_in_place },
		{ "parallel_returns_a_chunk_error", parallel_returns_a_chunk_error },
		{ "membw_measures_a_positive_rate", membw_measures_a_positive_rate },
		{ "membw_one_thread_and_page_kind", membw_one_thread_and_page_kind },
		{ "bad_arguments_are_refused", bad_arguments_are_refused },
	};
	static const struct CMUnitTest global[] = {
		cmocka_unit_test(unknown_engine_is_enoent_naming_it),
		cmocka_unit_test(huge_map_is_aligned_zeroed_and_advised),
		cmocka_unit_test(set_threads_survives_a_failing_plugin_init),
		cmocka_unit_test(plugin_that_is_not_an_engine_is_enoexec),
		cmocka_unit_test(builtin_names_open_or_say_why_not),
		cmocka_unit_test(kernels_widen_to_the_floats_of_mp_dtype_to_f32),
		cmocka_unit_test(kernels_silu_mul_gives_the_bits_of_expf),
		cmocka_unit_test(kernels_argmax_is_the_scan_of_the_first_largest),
		cmocka_unit_test(kernels_gemm_is_batch_invariant_and_matches_scalar),
		cmocka_unit_test(kernels_read_nothing_outside_the_weights),
		cmocka_unit_test(packed_products_are_the_bits_of_row_major),
		cmocka_unit_test(rope_table_gives_the_floats_of_a_direct_computation),
	};
	struct CMUnitTest tests[N_ELEMS(engines) * N_ELEMS(per_engine) +
				N_ELEMS(global)];
	static char names[N_ELEMS(engines) * N_ELEMS(per_engine)][128];
	size_t n = 0;

	for (size_t i = 0; i < N_ELEMS(engines); i++) {
		if (!case_available(&engines[i]))
			continue;
		for (size_t j = 0; j < N_ELEMS(per_engine); j++) {
			snprintf(names[n], sizeof(names[n]), "%s/%s", per_engine[j].name,
				 engines[i].name);
			tests[n] = (struct CMUnitTest){
				.name = names[n], .test_func = per_engine[j].fn,
				.initial_state = (void *)&engines[i],
			};
			n++;
		}
	}
	memcpy(tests + n, global, sizeof(global));
	n += N_ELEMS(global);
	return _cmocka_run_group_tests("engine", tests, n, t_group_log_capture, t_group_tmpdir_cleanup);
}
