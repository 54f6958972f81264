// SPDX-License-Identifier: MIT
/*
 * Description: adapter slots over one base (ExpertWeave, moepager/adapters.h):
 * a batch mixing adapters and the base gives each request exactly the logits
 * of its adapter's merged model decoded alone; memory is held only for the
 * experts adapters replace (F_mem 1) unless padded; bad adapters are refused
 * by reason and leave the set serving; an adapter unloaded under a request
 * stays until the request ends; loads and unloads while batches run; a
 * prefetcher fetches the adapter rows a request's map will read.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

#define E_MAX 3
#define STEPS 8
#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* Three adapters of the tiny preset (4 layers x 8 experts), each from another seed. */
static const uint32_t picks0[][2] = { { 0, 1 }, { 0, 6 }, { 2, 3 }, { 3, 0 } };
static const uint32_t picks1[][2] = { { 0, 0 }, { 1, 2 }, { 1, 5 }, { 1, 7 }, { 3, 4 } };
static const uint32_t picks2[][2] = { { 0, 3 }, { 2, 2 }, { 2, 5 } };
static const uint32_t picks_big[][2] = { { 1, 0 }, { 1, 1 }, { 1, 2 }, { 1, 3 } };

static const struct {
	const uint32_t (*picks)[2];
	size_t n;
} adapters[] = {
	{ picks0, N_ELEMS(picks0) }, { picks1, N_ELEMS(picks1) }, { picks2, N_ELEMS(picks2) },
};
#define N_ADAPTERS N_ELEMS(adapters)

struct fixture {
	struct mp_store *base;
	struct mp_store *from[N_ADAPTERS];
	struct mp_resident *res;
	struct mp_engine *engine;
	uint32_t vocab;
	uint64_t expert_bytes;
	char path[N_ADAPTERS][64];
	char merged[N_ADAPTERS][64];
};

static struct fixture fx;

static int group_setup(void **state)
{
	(void)state;
	t_log_capture();
	if (t_gen_tiny(t_path("base.mpk"), MP_DTYPE_BF16, 21) ||
	    mp_store_open(t_path("base.mpk"), &fx.base) ||
	    mp_resident_open(fx.base, NULL, NULL, &fx.res) ||
	    mp_engine_open("ref", &(struct mp_engine_config){ .threads = 2 }, &fx.engine))
		return -1;
	fx.vocab = mp_store_geometry(fx.base)->vocab;
	fx.expert_bytes = mp_store_expert_bytes(fx.base);
	for (uint32_t a = 0; a < N_ADAPTERS; a++) {
		char from[32], name[16];
		struct mp_adapter *ad;
		int err;

		snprintf(from, sizeof(from), "from%u.mpk", a);
		snprintf(name, sizeof(name), "ad%u", a);
		snprintf(fx.path[a], sizeof(fx.path[a]), "%s", t_path(name));
		strcat(fx.path[a], ".mpa");
		snprintf(fx.merged[a], sizeof(fx.merged[a]), "%s", t_path(name));
		strcat(fx.merged[a], ".mpk");
		if (t_gen_tiny(t_path(from), MP_DTYPE_BF16, 100 + a) ||
		    mp_store_open(t_path(from), &fx.from[a]) ||
		    t_write_adapter(fx.path[a], fx.base, fx.from[a], adapters[a].picks,
				    adapters[a].n, name) ||
		    mp_adapter_open(fx.path[a], &ad))
			return -1;
		err = mp_adapter_merge(fx.base, ad, name, fx.merged[a]);
		mp_adapter_close(ad);
		if (err)
			return -1;
	}
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	for (uint32_t a = 0; a < N_ADAPTERS; a++)
		mp_store_close(fx.from[a]);
	mp_engine_close(fx.engine);
	mp_resident_close(fx.res);
	mp_store_close(fx.base);
	t_tmpdir_cleanup();
	return 0;
}

static struct mp_adapters *open_set(bool padded)
{
	struct mp_adapters_config c = { .base = fx.base, .source = mp_resident_source_ops(),
					.source_ctx = fx.res, .slots = 4, .e_max = E_MAX,
					.padded = padded };
	struct mp_adapters *set = NULL;

	assert_int_equal(mp_adapters_open(&c, &set), 0);
	return set;
}

static struct mp_runner *open_runner(struct mp_store *s, const struct mp_expert_source_ops *ops,
				     void *ctx, uint32_t rows)
{
	struct mp_runner_config rc = { .engine = fx.engine, .source = ops, .source_ctx = ctx,
				       .expert_rows = rows };
	struct mp_runner *r = NULL;

	assert_int_equal(mp_runner_open(s, &rc, &r), 0);
	return r;
}

/* Decodes one token for each of n sequences in one batch. */
static void step(struct mp_runner *r, struct mp_seq **q, uint32_t *tok, uint32_t n)
{
	struct mp_batch_item items[8];

	for (uint32_t i = 0; i < n; i++)
		items[i] = (struct mp_batch_item){ q[i], &tok[i], 1, MP_BATCH_DECODE };
	assert_int_equal(mp_runner_batch(r, items, n), 0);
}

/*
 * Logits of each adapter's merged model decoded alone from token start, and
 * the base's, STEPS greedy tokens: want[a][step][vocab] (a == N_ADAPTERS: the base).
 */
static float *lone_logits(uint32_t start)
{
	float *want = malloc((N_ADAPTERS + 1) * STEPS * fx.vocab * sizeof(float));

	assert_non_null(want);
	for (uint32_t a = 0; a <= N_ADAPTERS; a++) {
		struct mp_store *m = fx.base;
		struct mp_resident *res = fx.res;
		struct mp_runner *r;
		struct mp_seq *q;
		uint32_t tok = start;

		if (a < N_ADAPTERS) {
			assert_int_equal(mp_store_open(fx.merged[a], &m), 0);
			assert_int_equal(mp_resident_open(m, NULL, NULL, &res), 0);
		}
		r = open_runner(m, mp_resident_source_ops(), res, 0);
		assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .request = a }, &q), 0);
		for (uint32_t t = 0; t < STEPS; t++) {
			step(r, &q, &tok, 1);
			memcpy(want + ((size_t)a * STEPS + t) * fx.vocab, mp_seq_logits(q),
			       fx.vocab * sizeof(float));
			tok = mp_logits_argmax(mp_seq_logits(q), fx.vocab);
		}
		mp_seq_close(q);
		mp_runner_close(r);
		if (a < N_ADAPTERS) {
			mp_resident_close(res);
			mp_store_close(m);
		}
	}
	return want;
}

static void load_all(struct mp_adapters *set)
{
	for (uint32_t a = 0; a < N_ADAPTERS; a++)
		assert_int_equal(mp_adapters_load(set, fx.path[a], NULL), (int)a);
}

/* Every adapter of set (loaded) and the base in one batch give their merged models' lone logits. */
static void check_mixed_batch(struct mp_adapters *set)
{
	float *want = lone_logits(7);
	struct mp_seq *q[N_ADAPTERS + 1];
	uint32_t tok[N_ADAPTERS + 1];
	struct mp_runner *r;
	int idx[N_ADAPTERS];

	r = open_runner(fx.base, mp_adapters_source_ops(), set, mp_adapters_rows(set));
	for (uint32_t a = 0; a <= N_ADAPTERS; a++) {
		const uint32_t *const *map = NULL;
		char name[8];

		if (a < N_ADAPTERS) {
			snprintf(name, sizeof(name), "ad%u", a);
			idx[a] = mp_adapters_acquire(set, name, &map);
			assert_int_equal(idx[a], (int)a);
		}
		assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .request = 10 + a,
								     .map = map }, &q[a]), 0);
		tok[a] = 7;
	}
	for (uint32_t t = 0; t < STEPS; t++) {
		step(r, q, tok, N_ADAPTERS + 1);
		for (uint32_t a = 0; a <= N_ADAPTERS; a++) {
			const float *w = want + ((size_t)a * STEPS + t) * fx.vocab;

			if (memcmp(mp_seq_logits(q[a]), w, fx.vocab * sizeof(float)))
				fail_msg("step %u: request %u differs from its model alone", t, a);
			tok[a] = mp_logits_argmax(mp_seq_logits(q[a]), fx.vocab);
		}
	}
	/* The adapters change the output: none of them decodes as the base. */
	for (uint32_t a = 0; a < N_ADAPTERS; a++)
		assert_true(memcmp(want + (size_t)a * STEPS * fx.vocab,
				   want + (size_t)N_ADAPTERS * STEPS * fx.vocab,
				   STEPS * fx.vocab * sizeof(float)) != 0);
	for (uint32_t a = 0; a <= N_ADAPTERS; a++)
		mp_seq_close(q[a]);
	for (uint32_t a = 0; a < N_ADAPTERS; a++)
		mp_adapters_release(set, idx[a]);
	mp_runner_close(r);
	free(want);
}

/* Issue 16's correctness: every adapter and the base in one batch, as their merged models alone. */
static void mixed_batch_gives_each_request_its_merged_models_lone_logits(void **state)
{
	struct mp_adapters *set = open_set(false);

	(void)state;
	load_all(set);
	check_mixed_batch(set);
	mp_adapters_close(set);
}

/*
 * Adapter rows paged with the base's (mp_pager_row_ops()): under a budget
 * of three experts, base and adapter rows evict each other, and every
 * request still gets its merged model's lone logits; unloading an adapter
 * unbinds its rows.
 */
/*
 * A set whose rows are paged by a pager over the base under a budget of
 * that many experts; with pfc, through a prefetcher over that pager (*pf).
 */
static struct mp_adapters *open_paged_set_pf(struct mp_pager **p, uint64_t budget_experts,
					     const struct mp_prefetcher_config *pfc,
					     struct mp_prefetcher **pf, bool warm)
{
	struct mp_pager_config pc = { .budget_bytes = budget_experts * fx.expert_bytes,
				      .slots_per_layer = 8 + 4 * E_MAX };
	struct mp_adapters_config c = { .base = fx.base, .source = mp_pager_source_ops(),
					.slots = 4, .e_max = E_MAX, .rows = mp_pager_row_ops(),
					.warm_rows = warm };
	struct mp_adapters *set = NULL;
	int err;

	err = mp_pager_open(fx.base, &pc, p);
	if (err == -EPERM || err == -EOPNOTSUPP) {
		print_message("userfaultfd unavailable: %s\n", mp_last_error());
		exit(t_require_all() ? 1 : T_EXIT_SKIP);
	}
	assert_int_equal(err, 0);
	c.source_ctx = c.rows_ctx = *p;
	if (pfc) {
		assert_int_equal(mp_prefetcher_open(*p, pfc, pf), 0);
		c.source = mp_prefetcher_source_ops();
		c.source_ctx = *pf;
	}
	assert_int_equal(mp_adapters_open(&c, &set), 0);
	assert_int_equal(mp_adapters_rows(set), pc.slots_per_layer);
	return set;
}

static struct mp_adapters *open_paged_set(struct mp_pager **p, uint64_t budget_experts)
{
	return open_paged_set_pf(p, budget_experts, NULL, NULL, false);
}

static void paged_adapter_rows_share_the_budget_and_keep_the_logits(void **state)
{
	struct mp_pager_stats st;
	struct mp_pager *p = NULL;
	struct mp_adapters *set = open_paged_set(&p, 3);

	(void)state;
	load_all(set);
	/* Adapter 0's first row in layer 0 (base expert 1) is a pager row now, not yet read. */
	assert_int_equal(mp_pager_residency(p, 0, 8), MP_RES_NONE);
	check_mixed_batch(set);
	mp_pager_stats(p, &st);
	assert_true(st.resident_peak <= 3 * fx.expert_bytes);
	assert_true(st.evictions > 0);
	/* Every adapter's rows were read (the pager's reads exceed the base's experts it used). */
	assert_true(st.bytes_file >= (uint64_t)(N_ELEMS(picks0) + N_ELEMS(picks1) +
						 N_ELEMS(picks2)) * fx.expert_bytes);
	assert_int_equal(mp_adapters_unload(set, "ad0"), 0);
	assert_int_equal(mp_pager_residency(p, 0, 8), -EINVAL);
	mp_adapters_close(set);
	mp_pager_close(p);
}

/*
 * Prefetch of adapter rows: the prefetcher hears a request's routes in rows
 * (rerouted), learns in the router's ids and fetches its predictions at the
 * rows the request's map reads them from. The oracle (distance 1) predicts
 * layer 1's true experts {2, 5} at layer 0's gate: for a request of ad1
 * (which replaced them: rows 11 and 12 of layer 1) those rows are read and
 * the base's 2 and 5 are not; for a base request, the base's.
 */
static void prefetcher_fetches_the_adapter_rows_a_request_will_read(void **state)
{
	static const char trace[] = "# moe-trace v1\n# layers=4\n# experts=8\n# topk=2\n"
				    "request,token,layer,e0,e1,w0,w1\n"
				    "0,0,0,0,3,0.6,0.4\n0,0,1,2,5,0.6,0.4\n"
				    "0,0,2,1,6,0.6,0.4\n0,0,3,4,0,0.6,0.4\n"
				    "1,0,0,0,3,0.6,0.4\n1,0,1,2,5,0.6,0.4\n"
				    "1,0,2,1,6,0.6,0.4\n1,0,3,4,0,0.6,0.4\n";
	const struct mp_expert_source_ops *src = mp_prefetcher_source_ops();
	struct mp_prefetcher_config pfc = { .policy = "oracle", .distance = 1 };
	const uint32_t *const *map = NULL;
	const float w[2] = { 0.6f, 0.4f };
	struct mp_prefetcher_stats st;
	struct mp_prefetcher *pf = NULL;
	struct mp_pager *p = NULL;
	struct mp_adapters *set;
	struct mp_trace *t;
	uint32_t ids[2];
	int idx;

	(void)state;
	assert_int_equal(mp_trace_parse(trace, sizeof(trace) - 1, "weave", &t), 0);
	pfc.trace = t;
	set = open_paged_set_pf(&p, 64, &pfc, &pf, false);
	load_all(set);
	idx = mp_adapters_acquire(set, "ad1", &map);
	assert_int_equal(idx, 1);
	assert_int_equal(map[1][2], 11);
	assert_int_equal(map[1][5], 12);
	/* Request 0 runs ad1: layer 0's route {0, 3} arrives rerouted, as {11, 3}. */
	src->seq_map(pf, 0, map);
	ids[0] = map[0][0];
	ids[1] = map[0][3];
	assert_int_equal(ids[0], 11);
	assert_int_equal(src->route(pf, 0, 0, 0, ids, w, 2), 0);
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_pager_residency(p, 1, 11), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, 1, 12), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, 1, 2), MP_RES_NONE);
	assert_int_equal(mp_pager_residency(p, 1, 5), MP_RES_NONE);
	mp_prefetcher_stats(pf, &st);
	assert_true(st.row_issued >= 2);
	/* Request 1 runs the base (no map): the same prediction fetches the base's experts. */
	ids[0] = 0;
	ids[1] = 3;
	assert_int_equal(src->route(pf, 1, 0, 0, ids, w, 2), 0);
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_pager_residency(p, 1, 2), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, 1, 5), MP_RES_MAPPED);
	/* Closed: its map is forgotten before the adapter may go (its rows then mean nothing). */
	src->seq_map(pf, 0, NULL);
	mp_adapters_release(set, idx);
	assert_int_equal(mp_adapters_unload(set, "ad1"), 0);
	assert_int_equal(mp_pager_residency(p, 1, 11), -EINVAL);
	mp_adapters_close(set);
	mp_prefetcher_close(pf);
	mp_pager_close(p);
	mp_trace_close(t);
}

/*
 * warm_rows: acquiring a request's adapter reads all of its rows ahead (ad1:
 * layer 0's row 11, layer 1's 11-13, layer 3's 11), none of another
 * adapter's (ad0's row 8 of layer 0), and the request's logits are its
 * merged model's.
 */
static void warm_rows_reads_the_acquired_adapters_rows_only(void **state)
{
	static const uint32_t rows[][2] = { { 0, 11 }, { 1, 11 }, { 1, 12 }, { 1, 13 }, { 3, 11 } };
	const uint32_t *const *map = NULL;
	struct mp_pager *p = NULL;
	struct mp_adapters *set = open_paged_set_pf(&p, 64, NULL, NULL, true);
	int idx;

	(void)state;
	{
		/* Warming needs rows paged by ops that prefetch. */
		struct mp_adapters_config c = { .base = fx.base, .source = mp_pager_source_ops(),
						.source_ctx = p, .warm_rows = true };
		struct mp_adapters *bad = NULL;

		assert_int_equal(mp_adapters_open(&c, &bad), -EINVAL);
		assert_non_null(strstr(mp_last_error(), "warm_rows needs paged rows"));
		assert_null(bad);
	}
	load_all(set);
	for (size_t i = 0; i < N_ELEMS(rows); i++)
		assert_int_equal(mp_pager_residency(p, rows[i][0], rows[i][1]), MP_RES_NONE);
	idx = mp_adapters_acquire(set, "ad1", &map);
	assert_int_equal(idx, 1);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	for (size_t i = 0; i < N_ELEMS(rows); i++)
		assert_int_equal(mp_pager_residency(p, rows[i][0], rows[i][1]), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, 0, 8), MP_RES_NONE);
	mp_adapters_release(set, idx);
	check_mixed_batch(set);
	mp_adapters_close(set);
	mp_pager_close(p);
}

/*
 * End to end: the runner tells the prefetcher each sequence's map; under a
 * three-expert budget the speculative policy predicts adapter rows, and
 * every request still gets its merged model's lone logits.
 */
static void prefetched_adapter_rows_keep_the_logits(void **state)
{
	struct mp_prefetcher_config pfc = { .policy = "nextlayer", .requests = 4 };
	struct mp_prefetcher_stats st;
	struct mp_prefetcher *pf = NULL;
	struct mp_pager *p = NULL;
	struct mp_adapters *set = open_paged_set_pf(&p, 3, &pfc, &pf, false);

	(void)state;
	load_all(set);
	check_mixed_batch(set);
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	mp_prefetcher_stats(pf, &st);
	assert_int_equal(st.dropped, 0);
	assert_true(st.row_predicted > 0);
	assert_true(st.row_predicted < st.predicted);
	mp_adapters_close(set);
	mp_prefetcher_close(pf);
	mp_pager_close(p);
}

static void memory_is_held_only_for_replaced_experts_unless_padded(void **state)
{
	struct mp_adapters_stats st;
	uint64_t replaced = 0, layers = mp_store_geometry(fx.base)->layers;

	(void)state;
	for (uint32_t a = 0; a < N_ADAPTERS; a++)
		replaced += adapters[a].n;
	for (int padded = 0; padded < 2; padded++) {
		struct mp_adapters *set = open_set(padded);

		mp_adapters_stats(set, &st);
		assert_int_equal(st.held_bytes, 0);
		load_all(set);
		mp_adapters_stats(set, &st);
		assert_int_equal(st.loaded, N_ADAPTERS);
		assert_int_equal(st.adapter_bytes, replaced * fx.expert_bytes);
		assert_int_equal(st.padded_bytes, N_ADAPTERS * layers * E_MAX * fx.expert_bytes);
		if (padded) {
			assert_true(st.held_bytes >= st.padded_bytes);
			assert_true(st.f_mem >= (double)(N_ADAPTERS * layers * E_MAX) / replaced);
		} else {
			assert_int_equal(st.held_bytes,
					 replaced * ((fx.expert_bytes + 4095) / 4096 * 4096));
			assert_true(st.f_mem < 1.0 + 4096.0 / fx.expert_bytes);
		}
		mp_adapters_close(set);
	}
}

static void bad_adapters_are_refused_by_reason_and_the_set_keeps_serving(void **state)
{
	struct mp_adapters *set = open_set(false);
	struct mp_adapters_stats st;
	const uint32_t *const *map;
	char big[64], bad[64];

	(void)state;
	snprintf(big, sizeof(big), "%s", t_path("big.mpa"));
	snprintf(bad, sizeof(bad), "%s", t_path("bad.mpa"));
	assert_int_equal(t_write_adapter(big, fx.base, fx.from[0], picks_big, N_ELEMS(picks_big),
					 "big"), 0);
	t_log_reset();
	assert_int_equal(mp_adapters_load(set, big, NULL), -E2BIG);
	assert_true(t_log_contains("more than the 3 rows of a slot"));
	/* An adapter of another base: from0's own adapter. */
	assert_int_equal(t_write_adapter(bad, fx.from[1], fx.from[0], picks2, 1, "alien"), 0);
	assert_int_equal(mp_adapters_load(set, bad, NULL), -EMEDIUMTYPE);
	/* A damaged expert: refused when read, the slot given back. */
	assert_int_equal(t_write_adapter(bad, fx.base, fx.from[0], picks2, 1, "rot"), 0);
	assert_int_equal(t_flip_byte(bad, 4096 + 100), 0);
	assert_int_equal(mp_adapters_load(set, bad, NULL), -EBADMSG);
	assert_int_equal(mp_adapters_load(set, t_path("nothing.mpa"), NULL), -ENOENT);
	assert_int_equal(mp_adapters_acquire(set, "rot", &map), -ENOENT);
	/* Good adapters still load, into every slot; a taken name and a full set are refused. */
	load_all(set);
	assert_int_equal(mp_adapters_load(set, fx.path[0], NULL), -EEXIST);
	assert_int_equal(mp_adapters_load(set, fx.path[0], "again"), 3);
	assert_int_equal(mp_adapters_load(set, fx.path[1], "more"), -ENOSPC);
	mp_adapters_stats(set, &st);
	assert_int_equal(st.loaded, 4);
	assert_int_equal(st.load_errors, 6);
	assert_int_equal(st.loads, 4);
	mp_adapters_close(set);
}

static void unloaded_adapter_stays_until_its_last_request_ends(void **state)
{
	struct mp_adapters *set = open_set(false);
	const uint32_t *const *map = NULL, *const *other;
	struct mp_adapters_stats st;
	uint32_t tok = 3;
	struct mp_runner *r;
	struct mp_seq *q;
	char name[MP_ADAPTER_NAME_MAX];
	int i;

	(void)state;
	load_all(set);
	r = open_runner(fx.base, mp_adapters_source_ops(), set, mp_adapters_rows(set));
	i = mp_adapters_acquire(set, "ad1", &map);
	assert_int_equal(i, 1);
	assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .map = map }, &q), 0);
	step(r, &q, &tok, 1);
	assert_int_equal(mp_adapters_unload(set, "ad1"), 0);
	assert_int_equal(mp_adapters_unload(set, "ad1"), -ENOENT);
	assert_int_equal(mp_adapters_acquire(set, "ad1", &other), -ENOENT);
	assert_int_equal(mp_adapters_name(set, 1, name), -ENOENT);
	mp_adapters_stats(set, &st);
	assert_int_equal(st.loaded, 2);
	assert_int_equal(st.draining, 1);
	/* The request carries on with its adapter's experts. */
	for (int t = 0; t < 4; t++) {
		tok = mp_logits_argmax(mp_seq_logits(q), fx.vocab);
		step(r, &q, &tok, 1);
	}
	/* Its slot cannot be taken yet: a new load goes to the free one. */
	assert_int_equal(mp_adapters_load(set, fx.path[1], "ad1-new"), 3);
	mp_seq_close(q);
	mp_adapters_release(set, i);
	mp_adapters_stats(set, &st);
	assert_int_equal(st.draining, 0);
	assert_int_equal(st.held_bytes, (uint64_t)(N_ELEMS(picks0) + N_ELEMS(picks2) +
						   N_ELEMS(picks1)) * fx.expert_bytes);
	assert_int_equal(mp_adapters_load(set, fx.path[1], NULL), 1);
	assert_int_equal(mp_adapters_name(set, 1, name), 0);
	assert_string_equal(name, "ad1");
	mp_runner_close(r);
	mp_adapters_close(set);
}

/* Loads and unloads adapter 2 over and over while batches of adapters 0, 1 and the base run. */
struct churn {
	struct mp_adapters *set;
	atomic_bool stop;
	atomic_uint cycles;
};

static void *churn_thread(void *arg)
{
	struct churn *c = arg;

	while (!atomic_load(&c->stop)) {
		if (mp_adapters_load(c->set, fx.path[2], NULL) < 0 ||
		    mp_adapters_unload(c->set, "ad2"))
			return (void *)1;
		atomic_fetch_add(&c->cycles, 1);
	}
	return NULL;
}

/* Adapter ad2 loads and unloads on another thread while batches of ad0, ad1 and the base run. */
static void churn_while_batches_run(struct mp_adapters *set)
{
	struct churn c = { .set = set };
	float *want = lone_logits(11);
	const uint32_t *const *map;
	struct mp_seq *q[3];
	uint32_t tok[3] = { 11, 11, 11 };
	struct mp_runner *r;
	pthread_t th;
	void *ret;

	assert_int_equal(mp_adapters_load(c.set, fx.path[0], NULL), 0);
	assert_int_equal(mp_adapters_load(c.set, fx.path[1], NULL), 1);
	r = open_runner(fx.base, mp_adapters_source_ops(), c.set, mp_adapters_rows(c.set));
	for (uint32_t a = 0; a < 3; a++) {
		char name[8];

		snprintf(name, sizeof(name), "ad%u", a);
		map = NULL;
		if (a < 2)
			assert_int_equal(mp_adapters_acquire(c.set, name, &map), (int)a);
		assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .map = map }, &q[a]), 0);
	}
	assert_int_equal(pthread_create(&th, NULL, churn_thread, &c), 0);
	/* Rounds of STEPS from the start until the other thread has loaded and unloaded a few times. */
	for (uint32_t round = 0; round < 1000 && atomic_load(&c.cycles) < 3; round++) {
		for (uint32_t a = 0; a < 3; a++) {
			mp_seq_reset(q[a]);
			tok[a] = 11;
		}
		for (uint32_t t = 0; t < STEPS; t++) {
			step(r, q, tok, 3);
			for (uint32_t a = 0; a < 3; a++) {
				uint32_t w = a < 2 ? a : N_ADAPTERS;

				assert_memory_equal(mp_seq_logits(q[a]),
						    want + ((size_t)w * STEPS + t) * fx.vocab,
						    fx.vocab * sizeof(float));
				tok[a] = mp_logits_argmax(mp_seq_logits(q[a]), fx.vocab);
			}
		}
	}
	atomic_store(&c.stop, true);
	assert_int_equal(pthread_join(th, &ret), 0);
	assert_null(ret);
	assert_true(atomic_load(&c.cycles) >= 3);
	for (uint32_t a = 0; a < 3; a++)
		mp_seq_close(q[a]);
	mp_adapters_release(c.set, 0);
	mp_adapters_release(c.set, 1);
	mp_runner_close(r);
	free(want);
}

static void loads_and_unloads_while_batches_run_disturb_nothing(void **state)
{
	struct mp_adapters *set = open_set(false);

	(void)state;
	churn_while_batches_run(set);
	mp_adapters_close(set);
}

/* The same with the rows paged: binds and unbinds in the pager while its rows are read. */
static void paged_loads_and_unloads_while_batches_run_disturb_nothing(void **state)
{
	struct mp_pager *p;
	struct mp_adapters *set = open_paged_set(&p, 4);

	(void)state;
	churn_while_batches_run(set);
	mp_adapters_close(set);
	mp_pager_close(p);
}

int main(void)
{
	static const struct CMUnitTest tests[] = {
		cmocka_unit_test(mixed_batch_gives_each_request_its_merged_models_lone_logits),
		cmocka_unit_test(paged_adapter_rows_share_the_budget_and_keep_the_logits),
		cmocka_unit_test(prefetcher_fetches_the_adapter_rows_a_request_will_read),
		cmocka_unit_test(prefetched_adapter_rows_keep_the_logits),
		cmocka_unit_test(warm_rows_reads_the_acquired_adapters_rows_only),
		cmocka_unit_test(memory_is_held_only_for_replaced_experts_unless_padded),
		cmocka_unit_test(bad_adapters_are_refused_by_reason_and_the_set_keeps_serving),
		cmocka_unit_test(unloaded_adapter_stays_until_its_last_request_ends),
		cmocka_unit_test(loads_and_unloads_while_batches_run_disturb_nothing),
		cmocka_unit_test(paged_loads_and_unloads_while_batches_run_disturb_nothing),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
