// SPDX-License-Identifier: MIT
/* The model generator: presets, determinism, order independence, value distribution. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "store/gen.h"

static void *slurp(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY);
	off_t size;
	char *buf;

	assert_true(fd >= 0);
	size = lseek(fd, 0, SEEK_END);
	assert_true(size > 0);
	buf = malloc((size_t)size);
	assert_non_null(buf);
	assert_int_equal(pread(fd, buf, (size_t)size, 0), size);
	close(fd);
	*len = (size_t)size;
	return buf;
}

static void presets_are_valid_geometries(void **state)
{
	const char *const *names = mp_gen_preset_names();
	struct mp_geometry g;
	size_t n = 0;

	(void)state;
	for (; names[n]; n++) {
		assert_int_equal(mp_gen_preset(names[n], &g), 0);
		assert_int_equal(mp_geometry_check(&g), 0);
	}
	assert_int_equal(n, 6);

	assert_int_equal(mp_gen_preset("mixtral-mini", &g), 0);
	assert_int_equal(g.layers, 32);
	assert_int_equal(g.experts, 8);
	assert_int_equal(g.topk, 2);
	assert_int_equal(g.hidden, 1024);
	assert_int_equal(g.ffn, 3584);
	assert_int_equal(g.dtype, MP_DTYPE_BF16);
	/* "about 5.6 GB of experts" */
	assert_int_equal(mp_geometry_expert_bytes(&g) * g.layers * g.experts, 5637144576ull);

	assert_int_equal(mp_gen_preset("deepseek-lite-mini", &g), 0);
	assert_int_equal(g.experts, 64);
	assert_int_equal(g.topk, 6);
	assert_true(g.ffn < g.hidden * 2);	/* fine-grained */

	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	assert_true(mp_geometry_expert_bytes(&g) * g.layers * g.experts < (32u << 20));

	t_log_reset();
	assert_int_equal(mp_gen_preset("huge", &g), -ENOENT);
	assert_true(t_log_contains("unknown preset 'huge'"));
}

/*
 * The fine-grained presets: their models' routing (layers x experts, top-k),
 * experts narrowed so each model's experts total a few GB.
 */
static const struct {
	const char *name;
	uint32_t layers, experts, topk;
	uint64_t expert_bytes;
} fine[] = {
	{ "deepseek-v2-lite-mini", 26, 64, 6, 2433024 },	/* 2.3 MiB, 4.0 GB in all */
	{ "qwen3-moe-mini", 48, 128, 8, 589824 },		/* 0.56 MiB, 3.6 GB */
	{ "olmoe-mini", 16, 64, 8, 3145728 },			/* 3 MiB, 3.2 GB */
};

static void fine_grained_presets_have_their_models_routing(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
		struct mp_geometry g;
		uint64_t total;

		assert_int_equal(mp_gen_preset(fine[i].name, &g), 0);
		assert_int_equal(mp_geometry_check(&g), 0);
		assert_int_equal(g.layers, fine[i].layers);
		assert_int_equal(g.experts, fine[i].experts);
		assert_int_equal(g.topk, fine[i].topk);
		assert_int_equal(g.dtype, MP_DTYPE_BF16);
		assert_int_equal(mp_geometry_expert_bytes(&g), fine[i].expert_bytes);
		total = mp_geometry_expert_bytes(&g) * g.layers * g.experts;
		assert_true(total > (2ull << 30) && total < (5ull << 30));
		assert_true(g.ffn < g.hidden);	/* fine-grained: narrower than the model */
	}
}

/* One layer of each, its top-k experts: the files open and every checksum holds. */
static void fine_grained_presets_write_valid_files(void **state)
{
	const char *path = t_path("fine.mpk");

	(void)state;
	for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
		struct mp_geometry g;
		struct mp_store *s;

		assert_int_equal(mp_gen_preset(fine[i].name, &g), 0);
		g.layers = 1;
		g.experts = g.topk;
		g.vocab = 512;
		assert_int_equal(mp_gen_model(path, &g, 5, fine[i].name, NULL, NULL), 0);
		assert_int_equal(mp_store_open(path, &s), 0);
		assert_int_equal(mp_store_geometry(s)->hidden, g.hidden);
		assert_int_equal(mp_store_geometry(s)->ffn, g.ffn);
		assert_int_equal(mp_store_expert_bytes(s), fine[i].expert_bytes);
		assert_int_equal(mp_store_verify(s, NULL, 0, NULL, NULL), 0);
		mp_store_close(s);
	}
}

/* Two files hold the same bytes. */
static void assert_same_file(const char *a, const char *b)
{
	size_t la, lb;
	char *x = slurp(a, &la), *y = slurp(b, &lb);

	assert_int_equal(la, lb);
	assert_memory_equal(x, y, la);
	free(x);
	free(y);
}

/* Two models' norms are equal (ones whatever the seed or variant); every matrix differs. */
static void assert_norms_same_matrices_differ(struct mp_store *sa, struct mp_store *sb)
{
	for (uint32_t i = 0; i < mp_store_tensor_count(sa); i++) {
		const struct mp_tensor_info *ta = mp_store_tensor_at(sa, i);
		const struct mp_tensor_info *tb = mp_store_tensor_at(sb, i);

		if (ta->ndim == 1)
			assert_int_equal(ta->checksum, tb->checksum);
		else
			assert_int_not_equal(ta->checksum, tb->checksum);
	}
}

static void same_seed_gives_same_bytes(void **state)
{
	const char *a = t_path("a.mpk"), *b = t_path("b.mpk");

	(void)state;
	for (int dt = 0; dt < MP_DTYPE_COUNT; dt++) {
		assert_int_equal(t_gen_tiny(a, (enum mp_dtype)dt, 1234), 0);
		assert_int_equal(t_gen_tiny(b, (enum mp_dtype)dt, 1234), 0);
		assert_same_file(a, b);
	}
}

static void different_seed_gives_different_weights(void **state)
{
	const char *a = t_path("a.mpk"), *b = t_path("b.mpk");
	struct mp_store *sa, *sb;

	(void)state;
	assert_int_equal(t_gen_tiny(a, MP_DTYPE_BF16, 1), 0);
	assert_int_equal(t_gen_tiny(b, MP_DTYPE_BF16, 2), 0);
	assert_int_equal(mp_store_open(a, &sa), 0);
	assert_int_equal(mp_store_open(b, &sb), 0);
	for (uint32_t l = 0; l < 4; l++)
		for (uint32_t e = 0; e < 8; e++)
			assert_int_not_equal(mp_store_expert(sa, l, e)->checksum,
					     mp_store_expert(sb, l, e)->checksum);
	assert_norms_same_matrices_differ(sa, sb);
	/* and no two experts of one model are the same */
	for (uint32_t i = 1; i < 32; i++)
		assert_int_not_equal(mp_store_expert(sa, i / 8, i % 8)->checksum,
				     mp_store_expert(sa, (i - 1) / 8, (i - 1) % 8)->checksum);
	mp_store_close(sa);
	mp_store_close(sb);
}

/* Pieces made one by one, in reverse order, give the file mp_gen_model() writes. */
static void generation_order_does_not_matter(void **state)
{
	const char *a = t_path("a.mpk"), *b = t_path("b.mpk");
	struct mp_store_writer *w;
	struct mp_geometry g;
	void *buf = malloc(1 << 20);

	(void)state;
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	g.dtype = MP_DTYPE_BF16;
	assert_int_equal(mp_gen_model(a, &g, 99, "tiny", NULL, NULL), 0);

	assert_int_equal(mp_store_writer_create(b, &g, "tiny", &w), 0);
	for (uint32_t l = g.layers; l-- > 0;) {
		for (uint32_t e = g.experts; e-- > 0;) {
			mpk_gen_expert(&g, l, e, 99, buf);
			assert_int_equal(mp_store_writer_put_expert(w, l, e, buf), 0);
		}
	}
	for (uint32_t i = mp_store_writer_tensor_count(w); i-- > 0;) {
		const struct mp_tensor_info *t = mp_store_writer_tensor_at(w, i);

		mpk_gen_tensor(t, i, 99, buf);
		assert_int_equal(mp_store_writer_put_tensor(w, t->name, buf), 0);
	}
	assert_int_equal(mp_store_writer_finish(w), 0);
	assert_same_file(a, b);
	free(buf);
}

/* The same seed in f16/bf16 holds the f32 model's values rounded to nearest even. */
static void narrow_types_round_the_f32_values(void **state)
{
	const char *a = t_path("f32.mpk"), *b = t_path("narrow.mpk");
	struct mp_store *s32, *s16;
	size_t n;
	float *wide;
	uint16_t *narrow;

	(void)state;
	assert_int_equal(t_gen_tiny(a, MP_DTYPE_F32, 7), 0);
	assert_int_equal(mp_store_open(a, &s32), 0);
	n = mp_store_expert_bytes(s32) / 4;
	wide = malloc(n * 4);
	narrow = malloc(n * 2);
	assert_int_equal(mp_store_read_expert(s32, 1, 3, wide), 0);
	for (int dt = MP_DTYPE_F16; dt <= MP_DTYPE_BF16; dt++) {
		assert_int_equal(t_gen_tiny(b, (enum mp_dtype)dt, 7), 0);
		assert_int_equal(mp_store_open(b, &s16), 0);
		assert_int_equal(mp_store_read_expert(s16, 1, 3, narrow), 0);
		for (size_t i = 0; i < n; i++) {
			uint16_t want = dt == MP_DTYPE_BF16 ? mp_f32_to_bf16(wide[i])
							    : mp_f32_to_f16(wide[i]);

			if (narrow[i] != want)
				fail_msg("%s value %zu: 0x%04x, expected 0x%04x (from %a)",
					 mp_dtype_name((enum mp_dtype)dt), i, narrow[i], want,
					 (double)wide[i]);
		}
		mp_store_close(s16);
	}
	mp_store_close(s32);
	free(wide);
	free(narrow);
}

/* A block type's model holds the f32 model's values quantized: the same stream, block by block. */
static void block_types_quantize_the_f32_values(void **state)
{
	const char *a = t_path("f32.mpk"), *b = t_path("q.mpk");
	const enum mp_dtype types[] = { MP_DTYPE_Q8_0, MP_DTYPE_Q4_0 };
	struct mp_store *s32, *sq;
	size_t n;
	float *wide;
	uint8_t *got, *want;

	(void)state;
	assert_int_equal(t_gen_tiny(a, MP_DTYPE_F32, 7), 0);
	assert_int_equal(mp_store_open(a, &s32), 0);
	n = mp_store_expert_bytes(s32) / 4;
	wide = malloc(n * 4);
	got = malloc(n * 2);	/* q8_0 holds 34 bytes per 32 values */
	want = malloc(n * 2);
	assert_int_equal(mp_store_read_expert(s32, 2, 5, wide), 0);
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		assert_int_equal(t_gen_tiny(b, types[i], 7), 0);
		assert_int_equal(mp_store_open(b, &sq), 0);
		assert_int_equal(mp_store_expert_bytes(sq), mp_dtype_bytes(types[i], n));
		assert_int_equal(mp_store_read_expert(sq, 2, 5, got), 0);
		mp_dtype_from_f32(types[i], wide, want, n);
		assert_memory_equal(got, want, mp_store_expert_bytes(sq));
		/* norms stay f32, matrices take the type */
		assert_int_equal(mp_store_tensor(sq, "blk.0.attn_norm")->dtype, MP_DTYPE_F32);
		assert_int_equal(mp_store_tensor(sq, "blk.0.router")->dtype, MP_DTYPE_F32);
		assert_int_equal(mp_store_tensor(sq, "tok_embd")->dtype, types[i]);
		mp_store_close(sq);
	}
	mp_store_close(s32);
	free(wide);
	free(got);
	free(want);
}

static void check_uniform(const float *v, size_t n, uint64_t fan_in)
{
	double a = sqrt(3.0 / (double)fan_in), sum = 0, sq = 0, var;
	/* the scale is an f32: allow its rounding at the ends */
	double lim = a * (1 + 1e-6);
	size_t low = 0, high = 0;

	for (size_t i = 0; i < n; i++) {
		assert_true(v[i] >= -lim && v[i] <= lim);
		sum += v[i];
		sq += (double)v[i] * v[i];
		low += v[i] < -a / 2;
		high += v[i] >= a / 2;
	}
	var = sq / (double)n - (sum / (double)n) * (sum / (double)n);
	/* n >= 32768: the estimates are within a few percent of the truth */
	assert_true(fabs(sum / (double)n) < 0.05 * a);
	assert_true(fabs(var * (double)fan_in - 1.0) < 0.05);
	assert_true(fabs((double)low / (double)n - 0.25) < 0.02);
	assert_true(fabs((double)high / (double)n - 0.25) < 0.02);
}

static void weights_have_variance_one_over_fan_in(void **state)
{
	const char *a = t_path("f32.mpk");
	struct mp_store *s;
	const struct mp_geometry *g;
	const struct mp_tensor_info *t;
	float *buf;
	uint64_t n;

	(void)state;
	assert_int_equal(t_gen_tiny(a, MP_DTYPE_F32, 3), 0);
	assert_int_equal(mp_store_open(a, &s), 0);
	g = mp_store_geometry(s);
	buf = malloc(mp_store_expert_bytes(s));
	n = (uint64_t)g->ffn * g->hidden;
	assert_int_equal(mp_store_read_expert(s, 3, 2, buf), 0);
	check_uniform(buf, n, g->hidden);		/* gate */
	check_uniform(buf + n, n, g->hidden);		/* up */
	check_uniform(buf + 2 * n, n, g->ffn);		/* down */

	t = mp_store_tensor(s, "tok_embd");
	free(buf);
	buf = malloc(t->bytes);
	assert_int_equal(mp_store_read_tensor(s, t, buf), 0);
	check_uniform(buf, t->bytes / 4, g->hidden);

	t = mp_store_tensor(s, "blk.2.ffn_norm");
	assert_int_equal(mp_store_read_tensor(s, t, buf), 0);
	for (uint64_t i = 0; i < t->dims[0]; i++)
		assert_true(buf[i] == 1.0f);
	mp_store_close(s);
	free(buf);
}

static double l2(const float *a, const float *b, size_t n)
{
	double s = 0;

	for (size_t i = 0; i < n; i++)
		s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
	return sqrt(s);
}

/*
 * A variant is its base plus noise within spread x the values' range: two
 * variants' experts at one position are spread times as far apart as a
 * model's experts at two positions; variant 0 is the base itself; norms
 * stay ones; a spread out of (0, 1] is refused.
 */
static void variants_are_their_base_plus_spread_noise(void **state)
{
	const char *base = t_path("base.mpk"), *v0 = t_path("v0.mpk");
	const char *v1 = t_path("v1.mpk"), *v2 = t_path("v2.mpk");
	struct mp_store *s1, *s2;
	struct mp_geometry g;
	size_t n;
	float *a, *b, *c;
	double same = 0, across = 0;

	(void)state;
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	assert_int_equal(mp_gen_model(base, &g, 5, "tiny", NULL, NULL), 0);
	assert_int_equal(mp_gen_variant(v0, &g, 5, 0, 0.5f, "tiny", NULL, NULL), 0);
	assert_same_file(base, v0);
	assert_int_equal(mp_gen_variant(v1, &g, 5, 1, 0.03f, "tiny", NULL, NULL), 0);
	assert_int_equal(mp_gen_variant(v2, &g, 5, 2, 0.03f, "tiny", NULL, NULL), 0);
	assert_int_equal(mp_store_open(v1, &s1), 0);
	assert_int_equal(mp_store_open(v2, &s2), 0);
	n = mp_store_expert_bytes(s1) / sizeof(float);
	a = malloc(n * sizeof(float));
	b = malloc(n * sizeof(float));
	c = malloc(n * sizeof(float));
	for (uint32_t l = 0; l < g.layers; l++) {
		assert_int_equal(mp_store_read_expert(s1, l, 0, a), 0);
		assert_int_equal(mp_store_read_expert(s2, l, 0, b), 0);
		assert_int_equal(mp_store_read_expert(s1, l, 1, c), 0);
		same += l2(a, b, n);
		across += l2(a, c, n);
	}
	/* 0.03 x (sqrt(2) x the weights' norm) against sqrt(2) x it; the norms differ a little */
	assert_true(same / across > 0.027 && same / across < 0.033);
	assert_norms_same_matrices_differ(s1, s2);
	mp_store_close(s1);
	mp_store_close(s2);
	free(a);
	free(b);
	free(c);
	assert_int_equal(mp_gen_variant(v1, &g, 5, 1, 0.0f, "tiny", NULL, NULL), -EINVAL);
	assert_int_equal(mp_gen_variant(v1, &g, 5, 1, 1.5f, "tiny", NULL, NULL), -EINVAL);
	assert_non_null(strstr(mp_last_error(), "spread"));
}

static void progress(uint64_t done, uint64_t total, void *arg)
{
	uint64_t *last = arg;

	assert_true(done > last[0]);
	assert_true(done <= total);
	last[0] = done;
	last[1] = total;
	last[2]++;
}

static void progress_reaches_total(void **state)
{
	struct mp_geometry g;
	uint64_t seen[3] = { 0, 0, 0 };

	(void)state;
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	assert_int_equal(mp_gen_model(t_path("p.mpk"), &g, 1, NULL, progress, seen), 0);
	assert_int_equal(seen[0], seen[1]);
	/* one call per tensor and per expert */
	assert_int_equal(seen[2], 3 + 7 * g.layers + g.layers * g.experts);
	assert_true(seen[1] > mp_geometry_expert_bytes(&g) * g.layers * g.experts);
}

static void gen_rejects_bad_geometry(void **state)
{
	struct mp_geometry g;
	const char *path = t_path("bad.mpk");

	(void)state;
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	g.heads = 3;
	t_log_reset();
	assert_int_equal(mp_gen_model(path, &g, 1, NULL, NULL, NULL), -EINVAL);
	assert_true(t_log_contains("heads (3) is not a multiple of kv_heads (2)"));
	assert_int_equal(access(path, F_OK), -1);

	/* block types: every matrix row must be whole blocks of 32 */
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	g.dtype = MP_DTYPE_Q8_0;
	g.ffn = 100;
	t_log_reset();
	assert_int_equal(mp_gen_model(path, &g, 1, NULL, NULL, NULL), -EINVAL);
	assert_true(t_log_contains("q8_0 rows are blocks of 32"));
	assert_true(t_log_contains("ffn (100)"));
	assert_int_equal(access(path, F_OK), -1);
}

static int setup(void **state)
{
	(void)state;
	t_log_capture();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	t_tmpdir_cleanup();
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(presets_are_valid_geometries),
		cmocka_unit_test(fine_grained_presets_have_their_models_routing),
		cmocka_unit_test(fine_grained_presets_write_valid_files),
		cmocka_unit_test(same_seed_gives_same_bytes),
		cmocka_unit_test(different_seed_gives_different_weights),
		cmocka_unit_test(generation_order_does_not_matter),
		cmocka_unit_test(narrow_types_round_the_f32_values),
		cmocka_unit_test(block_types_quantize_the_f32_values),
		cmocka_unit_test(weights_have_variance_one_over_fan_in),
		cmocka_unit_test(variants_are_their_base_plus_spread_noise),
		cmocka_unit_test(progress_reaches_total),
		cmocka_unit_test(gen_rejects_bad_geometry),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
