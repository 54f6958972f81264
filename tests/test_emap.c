// SPDX-License-Identifier: MIT
/* The expert-map store: normalisation, cosine search, RDY replacement, bounded memory, the file. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "prefetch/emap.h"

#define L 4
#define J 8
#define H 5

/* A store of L x J maps, top-2; sem_dim L x J: its semantic vectors are maps. */
static struct mp_emap *make(uint32_t capacity, uint32_t sem_dim)
{
	struct mp_emap_config c = { .layers = L, .experts = J, .topk = 2, .sem_dim = sem_dim,
				    .sem_is_map = sem_dim == L * J, .capacity = capacity,
				    .distance = 1 };
	struct mp_emap *m = NULL;

	assert_int_equal(mp_emap_create(&c, &m), 0);
	return m;
}

/* A top-2 map: layer l routes to experts (seed + l) % J and (seed + 3 l + 1) % J. */
static void top2_map(uint32_t seed, float *map)
{
	memset(map, 0, L * J * sizeof(float));
	for (uint32_t l = 0; l < L; l++) {
		uint32_t a = (seed + l) % J, b = (seed + 3 * l + 1) % J;

		if (b == a)
			b = (a + 1) % J;
		map[l * J + a] = 0.7f;
		map[l * J + b] = 0.3f;
	}
}

static void sem_vec(uint32_t seed, float *sem)
{
	for (uint32_t i = 0; i < H; i++)
		sem[i] = (float)((seed * 7 + i * 3) % 11) - 5.0f;
}

/* Rows sum to 1; a row with more than 2k values keeps its 2k largest, scaled to sum to 1. */
static void insert_normalises_every_layer_row_and_keeps_its_largest_values(void **state)
{
	struct mp_emap *m = make(8, 0);
	float map[L * J] = { 0 }, got[L * J];

	(void)state;
	for (uint32_t j = 0; j < J; j++)
		map[0 * J + j] = (float)(j + 1);	/* sums to 36; the largest four to 26 */
	map[1 * J + 3] = 5.0f;
	/* layer 2 all zero, layer 3 two values */
	map[3 * J + 0] = 1.0f;
	map[3 * J + 7] = 3.0f;
	assert_int_equal(mp_emap_insert(m, NULL, map, NULL), 0);
	assert_int_equal(mp_emap_record(m, 0, got, NULL), 0);
	for (uint32_t l = 0; l < L; l++) {
		double sum = 0;

		for (uint32_t j = 0; j < J; j++)
			sum += got[l * J + j];
		assert_true(fabs(sum - (l == 2 ? 0.0 : 1.0)) < 1e-6);
	}
	for (uint32_t j = 0; j < J; j++)
		assert_float_equal(got[0 * J + j], j < 4 ? 0.0 : (j + 1) / 26.0, 1e-6);
	assert_true(fabsf(got[1 * J + 3] - 1.0f) < 1e-6f);
	assert_true(fabsf(got[3 * J + 7] - 0.75f) < 1e-6f);
	assert_int_equal(mp_emap_record(m, 1, got, NULL), -ENOENT);
	mp_emap_destroy(m);
}

static void bad_gate_values_are_refused(void **state)
{
	struct mp_emap *m = make(8, 0);
	float map[L * J] = { 0 };

	(void)state;
	t_log_capture();
	t_log_reset();
	map[2 * J + 5] = -0.5f;
	assert_int_equal(mp_emap_insert(m, NULL, map, NULL), -EINVAL);
	assert_true(t_log_contains("layer 2 expert 5"));
	map[2 * J + 5] = NAN;
	assert_int_equal(mp_emap_insert(m, NULL, map, NULL), -EINVAL);
	mp_emap_destroy(m);
}

static void exact_replay_scores_one_and_finds_its_record(void **state)
{
	struct mp_emap *m = make(16, H);
	float map[L * J], sem[H], score;

	(void)state;
	for (uint32_t s = 0; s < 6; s++) {
		top2_map(s, map);
		sem_vec(s, sem);
		assert_int_equal(mp_emap_insert(m, NULL, map, sem), (int)s);
	}
	for (uint32_t s = 0; s < 6; s++) {
		top2_map(s, map);
		sem_vec(s, sem);
		/* The full prefix identifies the record; its score is 1 (within rounding). */
		assert_int_equal(mp_emap_search_traj(m, map, L, &score), (int)s);
		assert_true(score > 0.99999f && score < 1.00001f);
		assert_int_equal(mp_emap_search_sem(m, NULL, sem, &score), (int)s);
		assert_true(score > 0.99999f);
	}
	mp_emap_destroy(m);
}

static void prefix_search_ignores_later_layers(void **state)
{
	struct mp_emap *m = make(16, 0);
	float a[L * J], b[L * J], q[L * J], score;

	(void)state;
	top2_map(1, a);
	memcpy(b, a, sizeof(b));
	/* b shares a's first two layers and differs after. */
	memset(b + 2 * J, 0, 2 * J * sizeof(float));
	b[2 * J + 6] = 1.0f;
	b[3 * J + 6] = 1.0f;
	assert_int_equal(mp_emap_insert(m, NULL, a, NULL), 0);
	assert_int_equal(mp_emap_insert(m, NULL, b, NULL), 1);
	/* A query equal to b on layers 0..2: a 2-layer prefix cannot tell, a 3-layer one can. */
	memcpy(q, b, sizeof(q));
	assert_true(mp_emap_search_traj(m, q, 2, &score) >= 0);
	assert_true(score > 0.99999f);
	assert_int_equal(mp_emap_search_traj(m, q, 3, &score), 1);
	assert_int_equal(mp_emap_search_traj(m, q, 0, &score), -ENOENT);
	mp_emap_destroy(m);
}

static void empty_store_has_nothing_to_find(void **state)
{
	struct mp_emap *m = make(4, H);
	float map[L * J], sem[H], score;

	(void)state;
	top2_map(0, map);
	sem_vec(0, sem);
	assert_int_equal(mp_emap_search_traj(m, map, 2, &score), -ENOENT);
	assert_int_equal(mp_emap_search_sem(m, NULL, sem, &score), -ENOENT);
	mp_emap_destroy(m);
}

static bool same_map(const struct mp_emap *m, uint32_t idx, const float *map)
{
	float got[L * J];

	assert_int_equal(mp_emap_record(m, idx, got, NULL), 0);
	for (uint32_t i = 0; i < L * J; i++)
		if (fabsf(got[i] - map[i]) > 1e-6f)
			return false;
	return true;
}

static void full_store_duplicate_replaces_its_twin(void **state)
{
	struct mp_emap *m = make(4, H);
	struct mp_emap_stats st;
	float map[L * J], sem[H];

	(void)state;
	for (uint32_t s = 0; s < 4; s++) {
		top2_map(s, map);
		sem_vec(s, sem);
		assert_int_equal(mp_emap_insert(m, NULL, map, sem), (int)s);
	}
	/* A duplicate of record 2 (RDY = 1) must land on record 2, keeping 0, 1 and 3. */
	top2_map(2, map);
	sem_vec(2, sem);
	assert_int_equal(mp_emap_insert(m, NULL, map, sem), 2);
	mp_emap_stats(m, &st);
	assert_int_equal(st.count, 4);
	assert_int_equal(st.replaced, 1);
	assert_int_equal(st.inserted, 5);
	for (uint32_t s = 0; s < 4; s++) {
		top2_map(s, map);
		assert_true(same_map(m, s, map));
	}
	/* A new, different map replaces one record; the store stays at capacity. */
	top2_map(5, map);
	sem_vec(5, sem);
	assert_true(mp_emap_insert(m, NULL, map, sem) >= 0);
	mp_emap_stats(m, &st);
	assert_int_equal(st.count, 4);
	mp_emap_destroy(m);
}

static void memory_is_bounded_and_reported(void **state)
{
	struct mp_emap *m = make(32, H);
	struct mp_emap_stats a, b;
	float map[L * J], sem[H];

	(void)state;
	mp_emap_stats(m, &a);
	/* Kept rows, semantic vectors, norms and scratch: allocated at creation. */
	assert_true(a.bytes >= 32ull * (L * 4 * (2 + 4) + H * 4));
	assert_true(a.bytes < 32ull * (L * J + H + L + 8) * 2 * sizeof(float) + 4096);
	for (uint32_t s = 0; s < 400; s++) {
		top2_map(s, map);
		sem_vec(s, sem);
		assert_true(mp_emap_insert(m, NULL, map, sem) >= 0);
		/* Each (layer, expert) lists its records: each kept value once, room doubling. */
		mp_emap_stats(m, &b);
		assert_true(b.bytes >= a.bytes);
		assert_true(b.bytes <= a.bytes + (2ull * 32 * L * 4 + L * J * 8) * 16);
	}
	assert_int_equal(b.count, 32);
	mp_emap_destroy(m);
}

/* An empty store of `experts` experts (L layers, top-2, 32 records, no semantic vector). */
static uint64_t bytes_with_experts(uint32_t experts)
{
	struct mp_emap_config c = { .layers = L, .experts = experts, .topk = 2, .capacity = 32,
				    .distance = 1 };
	struct mp_emap_stats st;
	struct mp_emap *m = NULL;

	assert_int_equal(mp_emap_create(&c, &m), 0);
	mp_emap_stats(m, &st);
	mp_emap_destroy(m);
	return st.bytes;
}

/*
 * The figure counts a query's rows (layers x experts floats, as the store's
 * scratch row): per (layer, expert), at least its list's head (16 bytes),
 * the scratch row's float and the query row's (before session 33 only the
 * first two were counted: 20 bytes).
 */
static void memory_counts_the_query_rows(void **state)
{
	uint64_t small = bytes_with_experts(J), large = bytes_with_experts(256);

	(void)state;
	print_message("store bytes: %llu with %u experts, %llu with 256\n",
		      (unsigned long long)small, J, (unsigned long long)large);
	assert_true(large - small >= (uint64_t)L * (256 - J) * (16 + 4 + 4));
}

static void persistence_round_trip_keeps_every_record(void **state)
{
	struct mp_emap_config c = { .layers = L, .experts = J, .topk = 2, .sem_dim = H,
				    .capacity = 8, .distance = 1 };
	struct mp_emap *m = make(8, H), *back = NULL;
	struct mp_emap_stats st;
	float map[L * J], sem[H], score;
	const char *path = t_path("maps.emap");

	(void)state;
	for (uint32_t s = 0; s < 11; s++) {
		top2_map(s, map);
		sem_vec(s, sem);
		assert_true(mp_emap_insert(m, NULL, map, sem) >= 0);
	}
	assert_int_equal(mp_emap_save(m, path), 0);
	assert_int_equal(mp_emap_load(path, &c, &back), 0);
	mp_emap_stats(back, &st);
	assert_int_equal(st.count, 8);
	assert_int_equal(st.inserted, 11);
	for (uint32_t y = 0; y < 8; y++) {
		float a[L * J], b[L * J], sa[H], sb[H];

		assert_int_equal(mp_emap_record(back, y, a, sa), 0);
		assert_int_equal(mp_emap_record(m, y, b, sb), 0);
		assert_memory_equal(a, b, sizeof(a));
		assert_memory_equal(sa, sb, sizeof(sa));
	}
	/* Searches over the loaded store find the same records. */
	top2_map(10, map);
	assert_int_equal(mp_emap_search_traj(back, map, L, &score),
			 mp_emap_search_traj(m, map, L, &score));
	assert_true(score > 0.99999f);
	mp_emap_destroy(back);
	mp_emap_destroy(m);
}

static void corrupt_files_are_refused_naming_the_offset(void **state)
{
	struct mp_emap_config c = { .layers = L, .experts = J, .topk = 2, .sem_dim = H,
				    .capacity = 8 };
	struct mp_emap_config other = c;
	struct mp_emap *m = make(8, H), *back = NULL;
	float map[L * J], sem[H];
	const char *path = t_path("bad.emap");
	char cmd[1024];

	(void)state;
	t_log_capture();
	for (uint32_t s = 0; s < 3; s++) {
		top2_map(s, map);
		sem_vec(s, sem);
		assert_true(mp_emap_insert(m, NULL, map, sem) >= 0);
	}
	assert_int_equal(mp_emap_save(m, path), 0);
	other.experts = J * 2;
	t_log_reset();
	assert_int_equal(mp_emap_load(path, &other, &back), -EINVAL);
	assert_true(t_log_contains("4 layers x 8 experts"));

	assert_int_equal(t_flip_byte(path, 64 + 17), 0);	/* a record byte */
	t_log_reset();
	assert_int_equal(mp_emap_load(path, &c, &back), -EBADMSG);
	assert_true(t_log_contains("offset 64: record checksum mismatch"));
	assert_int_equal(t_flip_byte(path, 64 + 17), 0);
	assert_int_equal(mp_emap_load(path, &c, &back), 0);
	mp_emap_destroy(back);

	assert_int_equal(t_flip_byte(path, 20), 0);		/* experts, header checksummed */
	t_log_reset();
	assert_int_equal(mp_emap_load(path, &c, &back), -EBADMSG);
	assert_true(t_log_contains("header checksum"));
	assert_int_equal(t_flip_byte(path, 20), 0);

	assert_int_equal(t_flip_byte(path, 0), 0);
	t_log_reset();
	assert_int_equal(mp_emap_load(path, &c, &back), -EPROTO);
	assert_true(t_log_contains("not an expert-map file"));
	assert_int_equal(t_flip_byte(path, 0), 0);

	assert_int_equal(truncate(path, 64 + 100), 0);
	t_log_reset();
	assert_int_equal(mp_emap_load(path, &c, &back), -ENODATA);
	assert_true(t_log_contains("truncated"));

	snprintf(cmd, sizeof(cmd), "%s.none", path);
	assert_int_equal(mp_emap_load(cmd, &c, &back), -ENOENT);
	mp_emap_destroy(m);
}

/* Records whose context (sem = previous map) uses experts {0, 1} at layer 2 go to {4, 5} there. */
static void predict_layer_learns_the_layer_transition(void **state)
{
	struct mp_emap *m = make(16, L * J);
	float map[L * J], ctx[L * J], use[J];
	const float row01[J] = { 0.5f, 0.5f };
	double sum = 0;

	(void)state;
	for (uint32_t i = 0; i < 4; i++) {
		memset(ctx, 0, sizeof(ctx));
		ctx[2 * J + 0] = ctx[2 * J + 1] = 0.5f;
		memset(map, 0, sizeof(map));
		map[2 * J + 4] = 0.6f;
		map[2 * J + 5] = 0.4f;
		assert_int_equal(mp_emap_insert(m, NULL, map, ctx), (int)i);
	}
	/* A record with another context: weight 0 for this one. */
	memset(ctx, 0, sizeof(ctx));
	ctx[2 * J + 7] = 1.0f;
	memset(map, 0, sizeof(map));
	map[2 * J + 3] = 1.0f;
	map[2 * J + 6] = 1.0f;
	assert_int_equal(mp_emap_insert(m, NULL, map, ctx), 4);

	assert_int_equal(mp_emap_predict_layer(m, NULL, 2, row01, use), 0);
	/* Four votes of weight 0.5 each and the pseudo-record (2/8 each, weight 1): / 3. */
	for (uint32_t j = 0; j < J; j++) {
		double want = (0.25 + ((j == 4 || j == 5) ? 2.0 : 0.0)) / 3.0;

		assert_float_equal(use[j], want, 1e-6);
		sum += use[j];
	}
	assert_float_equal(sum, 2.0, 1e-5);
	/* A context no record shares: the uniform prior k/J. */
	const float row2[J] = { 0, 0, 1.0f };

	assert_int_equal(mp_emap_predict_layer(m, NULL, 2, row2, use), 0);
	for (uint32_t j = 0; j < J; j++)
		assert_float_equal(use[j], 0.25, 1e-6);
	/* Arguments out of range are refused. */
	assert_int_equal(mp_emap_predict_layer(m, NULL, L, row01, use), -EINVAL);
	mp_emap_destroy(m);
	/* Only a store whose semantic vectors are maps has a layer transition. */
	m = make(8, H);
	assert_int_equal(mp_emap_predict_layer(m, NULL, 2, row01, use), -EINVAL);
	mp_emap_destroy(m);
}

/* Neighbours vote with their cosine; only the MP_EMAP_NEIGHBOURS closest count. */
static void predict_traj_votes_the_nearest_records(void **state)
{
	struct mp_emap *m = make(64, 0);
	float a[L * J], b[L * J], use[J], score;
	double sum = 0;

	(void)state;
	top2_map(0, a);
	top2_map(3, b);
	/* More copies of a than there are neighbour places, then b's. */
	for (uint32_t i = 0; i < MP_EMAP_NEIGHBOURS + 4; i++)
		assert_true(mp_emap_insert(m, NULL, a, NULL) >= 0);
	for (uint32_t i = 0; i < 8; i++)
		assert_true(mp_emap_insert(m, NULL, b, NULL) >= 0);
	assert_int_equal(mp_emap_predict_traj(m, NULL, a, 2, 3, use, &score), 0);
	assert_float_equal(score, 1.0, 1e-5);
	/* All places go to a's exact copies (cosine 1): a's layer-3 pair gets 16 of 17 votes. */
	for (uint32_t j = 0; j < J; j++) {
		bool in_a = a[3 * J + j] > 0;
		double want = (0.25 + (in_a ? (double)MP_EMAP_NEIGHBOURS : 0.0)) /
			      (1.0 + MP_EMAP_NEIGHBOURS);

		assert_float_equal(use[j], want, 1e-5);
		sum += use[j];
	}
	assert_float_equal(sum, 2.0, 1e-5);
	/* A prefix nothing shares (a: {0,1} {1,4}, b: {3,4} {4,7}): score 0, the prior. */
	float none[L * J] = { 0 };

	none[0 * J + 6] = 1.0f;
	none[1 * J + 2] = 1.0f;
	assert_int_equal(mp_emap_predict_traj(m, NULL, none, 2, 3, use, &score), 0);
	assert_float_equal(score, 0.0, 0);
	for (uint32_t j = 0; j < J; j++)
		assert_float_equal(use[j], 0.25, 1e-6);
	assert_int_equal(mp_emap_predict_traj(m, NULL, a, 0, 3, use, &score), -EINVAL);
	assert_int_equal(mp_emap_predict_traj(m, NULL, a, 2, L, use, &score), -EINVAL);
	mp_emap_destroy(m);
}

static void predict_sem_votes_the_nearest_records_for_every_layer(void **state)
{
	struct mp_emap *m = make(64, H);
	float a[L * J], b[L * J], sa[H], sb[H], use[L * J], score;

	(void)state;
	top2_map(0, a);
	top2_map(3, b);
	/* Two semantic vectors at right angles: each record votes only for its own kind. */
	memset(sa, 0, sizeof(sa));
	memset(sb, 0, sizeof(sb));
	sa[0] = 2.0f;
	sb[1] = 1.0f;
	for (uint32_t i = 0; i < 3; i++)
		assert_true(mp_emap_insert(m, NULL, a, sa) >= 0);
	assert_true(mp_emap_insert(m, NULL, b, sb) >= 0);
	assert_int_equal(mp_emap_predict_sem(m, NULL, sb, use, &score), 0);
	assert_float_equal(score, 1.0, 1e-6);
	/* b's one record (cosine 1) against the prior: (k/J + 1) / 2 on b's pair of every layer. */
	for (uint32_t l = 0; l < L; l++) {
		double sum = 0;

		for (uint32_t j = 0; j < J; j++) {
			double want = (0.25 + (b[l * J + j] > 0 ? 1.0 : 0.0)) / 2.0;

			assert_float_equal(use[l * J + j], want, 1e-6);
			sum += use[l * J + j];
		}
		assert_float_equal(sum, 2.0, 1e-5);
	}
	/* Halfway between: all four vote, weighted by the cosine (a's three each 1/sqrt 2). */
	float mid[H] = { 1.0f, 1.0f, 0, 0, 0 };
	double c = 1.0 / sqrt(2.0);

	assert_int_equal(mp_emap_predict_sem(m, NULL, mid, use, &score), 0);
	assert_float_equal(score, c, 1e-6);
	for (uint32_t j = 0; j < J; j++) {
		double votes = (a[0 * J + j] > 0 ? 3 * c : 0) + (b[0 * J + j] > 0 ? c : 0);

		assert_float_equal(use[0 * J + j], (0.25 + votes) / (1.0 + 4 * c), 1e-5);
	}
	/* A vector nothing shares: the prior everywhere, score 0. */
	float other[H] = { 0, 0, 3.0f, 0, 0 };

	assert_int_equal(mp_emap_predict_sem(m, NULL, other, use, &score), 0);
	assert_float_equal(score, 0.0, 0);
	for (uint32_t i = 0; i < L * J; i++)
		assert_float_equal(use[i], 0.25, 1e-6);
	assert_int_equal(mp_emap_predict_sem(m, NULL, NULL, use, &score), -EINVAL);
	mp_emap_destroy(m);
	/* A store without semantic vectors has nothing to search them by. */
	m = make(8, 0);
	assert_int_equal(mp_emap_predict_sem(m, NULL, sa, use, &score), -EINVAL);
	mp_emap_destroy(m);
}

/*
 * Vectors longer than MP_EMAP_SKETCH_DIM are compared by their sketches:
 * each still scores 1 against itself, a vector close to one record finds
 * it (cosine 0.875 here, within the sketch's error), and the record keeps
 * its own values.
 */
static void long_semantic_vectors_are_searched_by_their_sketches(void **state)
{
	const uint32_t D = 4 * MP_EMAP_SKETCH_DIM, N = 24;
	struct mp_emap_config c = { .layers = L, .experts = J, .topk = 2, .sem_dim = D,
				    .capacity = 64, .distance = 1 };
	float map[L * J], *sem = malloc(N * D * sizeof(float)), *got = malloc(D * sizeof(float));
	struct mp_emap *m = NULL;
	uint32_t seed = 12345;
	float score;

	(void)state;
	assert_non_null(sem);
	assert_non_null(got);
	assert_int_equal(mp_emap_create(&c, &m), 0);
	for (uint32_t i = 0; i < N * D; i++) {
		seed = seed * 1103515245u + 12345u;
		sem[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
	}
	for (uint32_t s = 0; s < N; s++) {
		top2_map(s, map);
		assert_int_equal(mp_emap_insert(m, NULL, map, sem + (size_t)s * D), (int)s);
	}
	for (uint32_t s = 0; s < N; s++) {
		assert_int_equal(mp_emap_search_sem(m, NULL, sem + (size_t)s * D, &score), (int)s);
		assert_true(score > 0.99999f);
		/* A few values changed: still nearest its record. */
		memcpy(got, sem + (size_t)s * D, D * sizeof(float));
		for (uint32_t i = 0; i < D; i += 16)
			got[i] = -got[i];
		assert_int_equal(mp_emap_search_sem(m, NULL, got, &score), (int)s);
		assert_true(score > 0.6f && score < 0.99f);
		assert_int_equal(mp_emap_record(m, s, NULL, got), 0);
		assert_memory_equal(got, sem + (size_t)s * D, D * sizeof(float));
	}
	mp_emap_destroy(m);
	free(sem);
	free(got);
}

static void a_topk_outside_the_experts_is_refused(void **state)
{
	struct mp_emap_config c = { .layers = L, .experts = J, .topk = 0, .capacity = 4 };
	struct mp_emap *m = NULL;

	(void)state;
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_emap_create(&c, &m), -EINVAL);
	assert_true(t_log_contains("topk 0"));
	c.topk = J + 1;
	assert_int_equal(mp_emap_create(&c, &m), -EINVAL);
	assert_null(m);
}

/* A dense map of pseudo-random gate values (every expert non-zero, as a full softmax). */
static void dense_map(uint32_t *seed, float *map)
{
	for (uint32_t i = 0; i < L * J; i++) {
		*seed = *seed * 1103515245u + 12345u;
		map[i] = (float)((*seed >> 8) % 1000 + 1);
	}
}

/* The query's search and a search from scratch give the same bits. */
static void same_prediction(struct mp_emap *m, struct mp_emap_query *q, const float *traj,
			    uint32_t prefix)
{
	float a[J], b[J], sa, sb;

	assert_int_equal(mp_emap_predict_traj(m, q, traj, prefix, L - 1, a, &sa), 0);
	assert_int_equal(mp_emap_predict_traj(m, NULL, traj, prefix, L - 1, b, &sb), 0);
	assert_memory_equal(a, b, sizeof(a));
	assert_memory_equal(&sa, &sb, sizeof(sa));
}

/*
 * A query adds only the layers gated since its last search, yet finds what a
 * search from scratch finds: as the prefix grows, when records are replaced
 * under it (another request's maps), when a layer is gated again, and when
 * it moves to another store.
 */
static void a_query_finds_what_a_search_from_scratch_finds(void **state)
{
	struct mp_emap *m = make(8, 0), *other = make(8, 0);
	struct mp_emap_query q = { 0 };
	float traj[L * J] = { 0 }, full[L * J], map[L * J];
	uint32_t seed = 7;

	(void)state;
	for (uint32_t i = 0; i < 8; i++) {
		dense_map(&seed, map);
		assert_true(mp_emap_insert(m, NULL, map, NULL) >= 0);
		dense_map(&seed, map);
		assert_true(mp_emap_insert(other, NULL, map, NULL) >= 0);
	}
	dense_map(&seed, full);
	for (uint32_t l = 0; l + 1 < L; l++) {
		memcpy(traj + l * J, full + l * J, J * sizeof(float));
		same_prediction(m, &q, traj, l + 1);
		/* A full store replaces a record: the query recomputes that one. */
		dense_map(&seed, map);
		assert_true(mp_emap_insert(m, NULL, map, NULL) >= 0);
	}
	same_prediction(m, &q, traj, L - 1);
	/* Layer 0 gated again with other values: the prefix did not grow, start over. */
	traj[0] = traj[1] * 3;
	same_prediction(m, &q, traj, 1);
	same_prediction(m, &q, traj, 2);
	same_prediction(other, &q, traj, 3);
	mp_emap_query_reset(&q);
	same_prediction(other, &q, traj, 3);
	mp_emap_query_fini(&q);
	mp_emap_destroy(other);
	mp_emap_destroy(m);
}

/* Two stores that saw the same maps with dense semantic maps. */
static void twin_stores(struct mp_emap **a, struct mp_emap **b, uint32_t *seed)
{
	float map[L * J], ctx[L * J];

	*a = make(8, L * J);
	*b = make(8, L * J);
	for (uint32_t i = 0; i < 8; i++) {
		dense_map(seed, map);
		dense_map(seed, ctx);
		assert_true(mp_emap_insert(*a, NULL, map, ctx) >= 0);
		assert_true(mp_emap_insert(*b, NULL, map, ctx) >= 0);
	}
}

/*
 * With a semantic map (the previous iteration's), the transition searches of
 * an iteration's gates sum its rows into the next iteration's semantic
 * products: the next begin's search and end's insert find what they find
 * from scratch, with a record written in between, and rows skipped or out
 * of order fall back to a whole pass.
 */
static void gated_rows_become_the_next_iterations_semantic_search(void **state)
{
	struct mp_emap_query q = { 0 };
	struct mp_emap *a, *b;
	float traj[L * J], map[L * J], use_a[J], use_b[J], sa, sb;
	uint32_t seed = 11;

	(void)state;
	twin_stores(&a, &b, &seed);
	dense_map(&seed, traj);
	for (uint32_t l = 0; l < L; l++) {
		assert_int_equal(mp_emap_predict_layer(a, &q, l, traj + l * J, use_a), 0);
		assert_int_equal(mp_emap_predict_layer(b, NULL, l, traj + l * J, use_b), 0);
		assert_memory_equal(use_a, use_b, sizeof(use_a));
	}
	/* The iteration's own map goes in (replacing a record): the next one's context is traj. */
	dense_map(&seed, map);
	assert_int_equal(mp_emap_insert(a, NULL, traj, map), mp_emap_insert(b, NULL, traj, map));
	mp_emap_query_reset(&q);
	assert_int_equal(mp_emap_search_sem(a, &q, traj, &sa), mp_emap_search_sem(b, NULL, traj, &sb));
	assert_memory_equal(&sa, &sb, sizeof(sa));
	dense_map(&seed, map);
	assert_int_equal(mp_emap_insert(a, &q, map, traj), mp_emap_insert(b, NULL, map, traj));

	/* Layer 2, or the last, skipped: the next search makes a whole pass and finds the same. */
	for (uint32_t skip = 2; skip < L; skip += L - 3) {
		for (uint32_t l = 0; l < L; l++)
			if (l != skip)
				assert_int_equal(mp_emap_predict_layer(a, &q, l, map + l * J, use_a),
						 0);
		mp_emap_query_reset(&q);
		assert_int_equal(mp_emap_search_sem(a, &q, map, &sa),
				 mp_emap_search_sem(b, NULL, map, &sb));
		assert_memory_equal(&sa, &sb, sizeof(sa));
	}
	mp_emap_query_fini(&q);
	mp_emap_destroy(a);
	mp_emap_destroy(b);
}

/*
 * A dense reference of the store's searches, from scratch: every record's
 * map normalised, its rows kept, the cosines of flattened prefixes, the
 * nearest records' vote, the insert's victim. The store computes the same
 * through its expert lists, running products per query, products reused
 * from the iteration at the insert, and neighbours turned away without
 * their cosine; it must give the same bits.
 */
#define RL 6
#define RJ 64
#define RK 6
#define RKEPT (MP_EMAP_ROW_KEEP * RK)
#define RCAP 48
#define RSEM 16
#define RD 2

struct ref {
	float norm[RCAP][RL * RJ];	/* each record's map as the store normalises it */
	float sem[RCAP][RSEM];
	uint32_t count;
	bool with_sem;
};

/* As the store normalises a map: each row over its sum, in double. */
static void ref_normalise(const float *map, float *out)
{
	for (uint32_t l = 0; l < RL; l++) {
		double sum = 0;

		for (uint32_t j = 0; j < RJ; j++)
			sum += map[l * RJ + j];
		for (uint32_t j = 0; j < RJ; j++)
			out[l * RJ + j] = sum > 0 ? (float)(map[l * RJ + j] / sum) : 0.0f;
	}
}

/*
 * The indices of the (at most) `want` largest positive values of v[0..n),
 * largest first, equal ones by increasing index, into out; returns how many.
 */
static uint32_t ref_top(const float *v, uint32_t n, uint32_t want, uint32_t *out)
{
	bool *used = calloc(n, sizeof(*used));
	uint32_t got = 0;

	assert_non_null(used);
	for (; got < want; got++) {
		uint32_t b = n;

		for (uint32_t j = 0; j < n; j++)
			if (!used[j] && v[j] > 0 && (b == n || v[j] > v[b]))
				b = j;
		if (b == n)
			break;
		used[b] = true;
		out[got] = b;
	}
	free(used);
	return got;
}

/*
 * A row as kept: its RKEPT largest positive values (ties: lower index)
 * scaled to the row's sum when it has more, spread out over kept[];
 * their squares added to *sq by index.
 */
static void ref_keep(const float *row, float *kept, double *sq)
{
	uint32_t best[RKEPT], n = ref_top(row, RJ, RKEPT, best), nz = 0;
	double total = 0, sum = 0;

	for (uint32_t j = 0; j < RJ; j++)
		if (row[j] > 0) {
			nz++;
			total += row[j];
		}
	for (uint32_t i = 0; nz > n && i < n; i++)
		sum += row[best[i]];
	memset(kept, 0, RJ * sizeof(float));
	for (uint32_t i = 0; i < n; i++)
		kept[best[i]] = nz > n ? (float)(row[best[i]] * (total / sum)) : row[best[i]];
	for (uint32_t j = 0; j < RJ; j++)
		*sq += (double)kept[j] * kept[j];
}

/* Cosine of q's first `layers` rows (as kept) with record y's. */
static float ref_cos(const struct ref *r, uint32_t y, const float *q, uint32_t layers)
{
	float qk[RJ], yk[RJ];
	double dot = 0, vsq = 0, ysq = 0;
	float ysqf;

	for (uint32_t l = 0; l < layers; l++) {
		ref_keep(q + l * RJ, qk, &vsq);
		ref_keep(r->norm[y] + l * RJ, yk, &ysq);
		for (uint32_t j = 0; j < RJ; j++)
			if (qk[j] != 0 && yk[j] != 0)
				dot += (double)qk[j] * yk[j];
	}
	ysqf = (float)ysq;
	return vsq > 0 && ysqf > 0 ? (float)(dot / sqrt(vsq * ysqf)) : 0.0f;
}

static float ref_cos_sem(const struct ref *r, uint32_t y, const float *v)
{
	double dot = 0, vsq = 0, ysq = 0;
	float yn;

	for (uint32_t i = 0; i < RSEM; i++) {
		if (v[i] != 0)
			dot += (double)v[i] * r->sem[y][i];
		vsq += (double)v[i] * v[i];
		ysq += (double)r->sem[y][i] * r->sem[y][i];
	}
	yn = (float)sqrt(ysq);
	return vsq > 0 && yn > 0 ? (float)(dot / (sqrt(vsq) * yn)) : 0.0f;
}

/* The neighbours' vote for layer target (the uniform pseudo-record included), and the score. */
static void ref_vote(const struct ref *r, const float *c, const uint32_t *ys, uint32_t n,
		     uint32_t target, float *out, float *score)
{
	double acc[RJ] = { 0 }, wsum = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint32_t top[RK], k = ref_top(r->norm[ys[i]] + target * RJ, RJ, RK, top);

		wsum += c[ys[i]];
		for (uint32_t t = 0; t < k; t++)
			acc[top[t]] += c[ys[i]];
	}
	for (uint32_t j = 0; j < RJ; j++)
		out[j] = (float)(((double)RK / RJ + acc[j]) / (1.0 + wsum));
	*score = n ? c[ys[0]] : 0.0f;
}

/* mp_emap_predict_traj_n() from scratch. */
static void ref_traj(const struct ref *r, const float *q, uint32_t prefix, uint32_t target,
		     uint32_t n, float *out, float *score)
{
	float c[RCAP];
	uint32_t ys[MP_EMAP_NEIGHBOURS], nb;

	for (uint32_t y = 0; y < r->count; y++)
		c[y] = ref_cos(r, y, q, prefix);
	nb = ref_top(c, r->count, MP_EMAP_NEIGHBOURS, ys);	/* the nearest */
	for (uint32_t i = 0; i < n; i++)
		ref_vote(r, c, ys, nb, target + i, out + i * RJ, score);
}

/* The record an insert of map (normalised) with sem replaces: FineMoE's highest RDY. */
static uint32_t ref_victim(const struct ref *r, const float *norm, const float *sem)
{
	const uint32_t Lr = RL, d = RD;
	float best = -INFINITY;
	uint32_t v = 0;

	for (uint32_t y = 0; y < r->count; y++) {
		float traj = ref_cos(r, y, norm, RL);
		float s = r->with_sem ? ref_cos_sem(r, y, sem) : traj;
		float rdy = ((float)d / Lr) * s + ((float)(Lr - d) / Lr) * traj;

		if (rdy > best) {
			best = rdy;
			v = y;
		}
	}
	return v;
}

static float rnd(uint32_t *seed)
{
	*seed = *seed * 1103515245u + 12345u;
	return (float)((*seed >> 8) % 1000 + 1);
}

/*
 * A map of pseudo-random gate values, normalised as a gate's rows are:
 * each row a full softmax (every expert), a top-k row (RK experts), or
 * now and then all zeros (a layer that saw no gate).
 */
static void ref_map(uint32_t *seed, float *map)
{
	float raw[RL * RJ] = { 0 };

	for (uint32_t l = 0; l < RL; l++) {
		uint32_t kind = (uint32_t)rnd(seed) % 8;

		for (uint32_t j = 0; kind < 5 && j < RJ; j++)
			raw[l * RJ + j] = rnd(seed);
		for (uint32_t t = 0; kind >= 5 && kind < 7 && t < RK; t++)
			raw[l * RJ + (uint32_t)rnd(seed) % RJ] = rnd(seed);
	}
	ref_normalise(raw, map);
}

static void same_bits(const float *a, const float *b, size_t n)
{
	assert_memory_equal(a, b, n * sizeof(float));
}

static void fast_searches_equal_a_dense_reference(bool with_sem)
{
	struct mp_emap_config c = { .layers = RL, .experts = RJ, .topk = RK,
				    .sem_dim = with_sem ? RSEM : 0, .capacity = RCAP,
				    .distance = RD };
	struct ref *r = calloc(1, sizeof(*r));
	struct mp_emap_query q = { 0 };
	struct mp_emap *m = NULL;
	float map[RL * RJ], other[RL * RJ], traj[RL * RJ], nm[RL * RJ], sem[RSEM], osem[RSEM];
	float got[RL * RJ], want[RL * RJ], gs, ws;
	uint32_t seed = with_sem ? 5 : 3, dup = 0;

	assert_non_null(r);
	r->with_sem = with_sem;
	assert_int_equal(mp_emap_create(&c, &m), 0);
	for (uint32_t it = 0; it < 4 * RCAP; it++) {
		int y;

		ref_map(&seed, map);
		/* Now and then an earlier map again: equal cosines, ties broken by the index. */
		if (it % 9 == 8 && r->count)
			memcpy(map, r->norm[dup++ % r->count], sizeof(map));
		for (uint32_t i = 0; i < RSEM; i++)
			sem[i] = rnd(&seed) - 500.0f;
		mp_emap_query_reset(&q);
		if (with_sem && r->count) {
			float cs[RCAP];
			uint32_t ys[MP_EMAP_NEIGHBOURS], nb;

			assert_int_equal(mp_emap_predict_sem(m, &q, sem, got, &gs), 0);
			for (uint32_t y = 0; y < r->count; y++)
				cs[y] = ref_cos_sem(r, y, sem);
			nb = ref_top(cs, r->count, MP_EMAP_NEIGHBOURS, ys);
			for (uint32_t l = 0; l < RL; l++)
				ref_vote(r, cs, ys, nb, l, want + l * RJ, &ws);
			same_bits(got, want, RL * RJ);
			same_bits(&gs, &ws, 1);
		}
		/* The iteration's gates, one prefix longer each. */
		memset(traj, 0, sizeof(traj));
		for (uint32_t p = 1; p < RL && r->count; p++) {
			memcpy(traj + (p - 1) * RJ, map + (p - 1) * RJ, RJ * sizeof(float));
			assert_int_equal(mp_emap_predict_traj_n(m, &q, traj, p, p, RL - p, got, &gs),
					 0);
			ref_traj(r, traj, p, p, RL - p, want, &ws);
			same_bits(got, want, (RL - p) * RJ);
			same_bits(&gs, &ws, 1);
			/* Another request's map written under the query: its product is redone. */
			if ((it + p) % 5 == 0) {
				ref_map(&seed, other);
				for (uint32_t i = 0; i < RSEM; i++)
					osem[i] = rnd(&seed) - 500.0f;
				y = mp_emap_insert(m, NULL, other, with_sem ? osem : NULL);
				ref_normalise(other, nm);
				assert_int_equal(y, r->count < RCAP ? r->count :
						 ref_victim(r, nm, osem));
				memcpy(r->norm[y], nm, sizeof(nm));
				memcpy(r->sem[y], osem, sizeof(osem));
				r->count += r->count < RCAP;
			}
		}
		/* The iteration's own map goes in, its query's products reused where they apply. */
		y = mp_emap_insert(m, &q, map, with_sem ? sem : NULL);
		ref_normalise(map, nm);
		assert_int_equal(y, r->count < RCAP ? r->count : ref_victim(r, nm, sem));
		memcpy(r->norm[y], nm, sizeof(nm));
		memcpy(r->sem[y], sem, sizeof(sem));
		r->count += r->count < RCAP;
	}
	mp_emap_query_fini(&q);
	mp_emap_destroy(m);
	free(r);
}

static void fast_trajectory_searches_equal_a_dense_reference(void **state)
{
	(void)state;
	fast_searches_equal_a_dense_reference(false);
}

static void fast_semantic_searches_equal_a_dense_reference(void **state)
{
	(void)state;
	fast_searches_equal_a_dense_reference(true);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(insert_normalises_every_layer_row_and_keeps_its_largest_values),
		cmocka_unit_test(bad_gate_values_are_refused),
		cmocka_unit_test(exact_replay_scores_one_and_finds_its_record),
		cmocka_unit_test(prefix_search_ignores_later_layers),
		cmocka_unit_test(empty_store_has_nothing_to_find),
		cmocka_unit_test(full_store_duplicate_replaces_its_twin),
		cmocka_unit_test(memory_is_bounded_and_reported),
		cmocka_unit_test(memory_counts_the_query_rows),
		cmocka_unit_test(persistence_round_trip_keeps_every_record),
		cmocka_unit_test(corrupt_files_are_refused_naming_the_offset),
		cmocka_unit_test(predict_layer_learns_the_layer_transition),
		cmocka_unit_test(predict_traj_votes_the_nearest_records),
		cmocka_unit_test(predict_sem_votes_the_nearest_records_for_every_layer),
		cmocka_unit_test(long_semantic_vectors_are_searched_by_their_sketches),
		cmocka_unit_test(a_topk_outside_the_experts_is_refused),
		cmocka_unit_test(a_query_finds_what_a_search_from_scratch_finds),
		cmocka_unit_test(gated_rows_become_the_next_iterations_semantic_search),
		cmocka_unit_test(fast_trajectory_searches_equal_a_dense_reference),
		cmocka_unit_test(fast_semantic_searches_equal_a_dense_reference),
	};
	int ret = cmocka_run_group_tests_name("emap", tests, NULL, NULL);

	t_tmpdir_cleanup();
	return ret;
}
