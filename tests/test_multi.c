// SPDX-License-Identifier: MIT
/*
 * Description: model variants served together (Multi-MoE, moepager/multi.h)
 * over one pager: with nothing shared (capacity 0) every model's logits are
 * exactly its own served alone; with shared positions, model X's logits are
 * exactly those of X's dense weights with each owned position's owner's
 * expert in place of X's (its "consolidated model", written as an .mpk and
 * decoded alone), and differ from X alone; owned rows cost no I/O; the
 * runner's swap of the active model changes nothing but refuses a
 * sequence of an inactive model; models not the map's are refused. With
 * the owners' experts paged, the logits are the same and every row is the
 * pager's. A prefetcher's predictions reach each model's own rows, never an
 * owned position's. The runner times one-token steps' layers by hits.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

#define N_MODELS 3
#define STEPS 6

struct fixture {
	struct mp_store *m[N_MODELS];
	struct mp_engine *engine;
	uint32_t vocab, layers, experts;
	uint64_t expert_bytes;
};

static struct fixture fx;

static int group_setup(void **state)
{
	(void)state;
	t_log_capture();
	if (mp_engine_open("ref", &(struct mp_engine_config){ .threads = 2 }, &fx.engine))
		return -1;
	for (uint32_t i = 0; i < N_MODELS; i++) {
		char name[32];

		snprintf(name, sizeof(name), "v%u.mpk", i);
		if (t_gen_tiny(t_path(name), MP_DTYPE_F32, 300 + i) ||
		    mp_store_open(t_path(name), &fx.m[i]))
			return -1;
	}
	fx.vocab = mp_store_geometry(fx.m[0])->vocab;
	fx.layers = mp_store_geometry(fx.m[0])->layers;
	fx.experts = mp_store_geometry(fx.m[0])->experts;
	fx.expert_bytes = mp_store_expert_bytes(fx.m[0]);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	for (uint32_t i = 0; i < N_MODELS; i++)
		mp_store_close(fx.m[i]);
	mp_engine_close(fx.engine);
	t_tmpdir_cleanup();
	return 0;
}

/* Greedy logits of a model decoded alone (resident experts) from token 5: [STEPS][vocab]. */
static float *alone(struct mp_store *s)
{
	float *out = malloc((size_t)STEPS * fx.vocab * sizeof(float));
	struct mp_resident *res;
	struct mp_runner *r;
	uint32_t tok = 5;

	assert_non_null(out);
	assert_int_equal(mp_resident_open(s, NULL, NULL, &res), 0);
	assert_int_equal(mp_runner_open(s, &(struct mp_runner_config){
		.engine = fx.engine, .source = mp_resident_source_ops(), .source_ctx = res }, &r),
		0);
	for (uint32_t t = 0; t < STEPS; t++) {
		assert_int_equal(mp_runner_step(r, tok), 0);
		memcpy(out + (size_t)t * fx.vocab, mp_runner_logits(r), fx.vocab * sizeof(float));
		tok = mp_logits_argmax(mp_runner_logits(r), fx.vocab);
	}
	mp_runner_close(r);
	mp_resident_close(res);
	return out;
}

struct served {
	struct mp_pager *pager;
	struct mp_multi *set;
	struct mp_runner *runner;
	struct mp_consolidation *map;
};

static void serve_open_flags(struct served *sv, uint32_t capacity, uint32_t budget_experts,
			     uint32_t flags)
{
	struct mp_pager_config pc = { .budget_bytes = budget_experts * fx.expert_bytes,
				      .slots_per_layer = N_MODELS * fx.experts };
	struct mp_multi_config mc = { .models = fx.m, .n = N_MODELS, .flags = flags,
				      .source = mp_pager_source_ops(),
				      .rows = mp_pager_row_ops() };
	int err;

	assert_int_equal(mp_consolidation_build(fx.m, N_MODELS, capacity, NULL, NULL, &sv->map), 0);
	err = mp_pager_open(fx.m[0], &pc, &sv->pager);
	if (err == -EPERM || err == -EOPNOTSUPP) {
		print_message("userfaultfd unavailable: %s\n", mp_last_error());
		exit(t_require_all() ? 1 : T_EXIT_SKIP);
	}
	assert_int_equal(err, 0);
	mc.map = sv->map;
	mc.source_ctx = mc.rows_ctx = sv->pager;
	assert_int_equal(mp_multi_open(&mc, &sv->set), 0);
	assert_int_equal(mp_runner_open(fx.m[0], &(struct mp_runner_config){
		.engine = fx.engine, .source = mp_multi_source_ops(), .source_ctx = sv->set,
		.expert_rows = mp_multi_rows(sv->set), .flags = MP_RUNNER_LAYER_TIMES },
		&sv->runner), 0);
	for (uint32_t i = 1; i < N_MODELS; i++)
		assert_int_equal(mp_runner_add_model(sv->runner, fx.m[i]), (int)i);
}

static void serve_open(struct served *sv, uint32_t capacity, uint32_t budget_experts)
{
	serve_open_flags(sv, capacity, budget_experts, 0);
}

static void serve_close(struct served *sv)
{
	mp_runner_close(sv->runner);
	mp_multi_close(sv->set);
	mp_pager_close(sv->pager);
	mp_consolidation_close(sv->map);
}

/* Every model in one batch from token 5, STEPS greedy steps: got[model][step][vocab]. */
static float *served_logits(struct served *sv)
{
	float *got = malloc((size_t)N_MODELS * STEPS * fx.vocab * sizeof(float));
	struct mp_batch_item items[N_MODELS];
	struct mp_seq *q[N_MODELS];
	uint32_t tok[N_MODELS];

	assert_non_null(got);
	for (uint32_t i = 0; i < N_MODELS; i++) {
		assert_int_equal(mp_seq_open(sv->runner, &(struct mp_seq_config){
			.request = i, .model = i, .map = mp_multi_map(sv->set, i) }, &q[i]), 0);
		tok[i] = 5;
	}
	for (uint32_t t = 0; t < STEPS; t++) {
		for (uint32_t i = 0; i < N_MODELS; i++)
			items[i] = (struct mp_batch_item){ q[i], &tok[i], 1, MP_BATCH_DECODE };
		assert_int_equal(mp_runner_batch(sv->runner, items, N_MODELS), 0);
		for (uint32_t i = 0; i < N_MODELS; i++) {
			memcpy(got + ((size_t)i * STEPS + t) * fx.vocab, mp_seq_logits(q[i]),
			       fx.vocab * sizeof(float));
			tok[i] = mp_logits_argmax(mp_seq_logits(q[i]), fx.vocab);
		}
	}
	for (uint32_t i = 0; i < N_MODELS; i++)
		mp_seq_close(q[i]);
	return got;
}

static void capacity_zero_gives_each_model_its_own_logits_alone(void **state)
{
	struct served sv = { 0 };
	struct mp_multi_stats st;
	float *got;

	(void)state;
	serve_open(&sv, 0, 3);
	got = served_logits(&sv);
	for (uint32_t i = 0; i < N_MODELS; i++) {
		float *want = alone(fx.m[i]);

		if (memcmp(got + (size_t)i * STEPS * fx.vocab, want,
			   (size_t)STEPS * fx.vocab * sizeof(float)))
			fail_msg("model %u served with the others differs from it alone", i);
		free(want);
	}
	mp_multi_stats(sv.set, &st);
	assert_int_equal(st.owned, 0);
	assert_int_equal(st.owned_reads, 0);
	assert_int_equal(st.bound, (N_MODELS - 1) * fx.layers * fx.experts);
	free(got);
	serve_close(&sv);
}

/* X with every owned position's expert taken from its owner: X's consolidated model. */
static void write_consolidated(const struct mp_consolidation *map, uint32_t x, const char *path)
{
	struct mp_adapter_writer *w;
	struct mp_adapter *a;
	void *buf = malloc(fx.expert_bytes);
	uint32_t put = 0;

	assert_int_equal(mp_adapter_writer_create(t_path("c.mpa"), fx.m[x], "c", &w), 0);
	for (uint32_t l = 0; l < fx.layers; l++) {
		for (uint32_t e = 0; e < fx.experts; e++) {
			int y = mp_consolidation_owner(map, l, e);

			if (y == MP_CONSOL_NONE || (uint32_t)y == x)
				continue;
			assert_int_equal(mp_store_read_expert(fx.m[y], l, e, buf), 0);
			assert_int_equal(mp_adapter_writer_put(w, l, e, buf), 0);
			put++;
		}
	}
	assert_true(put > 0);
	assert_int_equal(mp_adapter_writer_finish(w), 0);
	assert_int_equal(mp_adapter_open(t_path("c.mpa"), &a), 0);
	assert_int_equal(mp_adapter_merge(fx.m[x], a, NULL, path), 0);
	mp_adapter_close(a);
	free(buf);
}

static void shared_positions_give_the_consolidated_models_logits(void **state)
{
	uint32_t capacity = fx.layers * fx.experts / 2;
	struct served sv = { 0 };
	struct mp_pager_stats ps;
	struct mp_multi_stats st;
	float *got;

	(void)state;
	serve_open(&sv, capacity, 2);
	got = served_logits(&sv);
	for (uint32_t x = 0; x < N_MODELS; x++) {
		struct mp_store *c;
		float *want, *own = alone(fx.m[x]);

		write_consolidated(sv.map, x, t_path("cons.mpk"));
		assert_int_equal(mp_store_open(t_path("cons.mpk"), &c), 0);
		want = alone(c);
		if (memcmp(got + (size_t)x * STEPS * fx.vocab, want,
			   (size_t)STEPS * fx.vocab * sizeof(float)))
			fail_msg("model %u served consolidated differs from its consolidated model", x);
		/* Sharing changed its output: the test compares something. */
		assert_true(memcmp(got + (size_t)x * STEPS * fx.vocab, own,
				   (size_t)STEPS * fx.vocab * sizeof(float)) != 0);
		mp_store_close(c);
		free(want);
		free(own);
	}
	mp_multi_stats(sv.set, &st);
	mp_pager_stats(sv.pager, &ps);
	assert_int_equal(st.owned, capacity);
	assert_int_equal(st.owned_bytes, capacity * ((fx.expert_bytes + 4095) / 4096 * 4096));
	assert_true(st.owned_reads > 0 && st.paged_reads > 0);
	/* Owned positions were never read through the pager (no I/O); the rest within budget. */
	for (uint32_t l = 0; l < fx.layers; l++) {
		for (uint32_t e = 0; e < fx.experts; e++) {
			if (mp_consolidation_owner(sv.map, l, e) == MP_CONSOL_NONE)
				continue;
			assert_int_equal(mp_pager_residency(sv.pager, l, e), MP_RES_NONE);
			for (uint32_t x = 1; x < N_MODELS; x++)
				assert_int_equal(mp_pager_residency(sv.pager, l, x * fx.experts + e),
						 -EINVAL);
		}
	}
	assert_true(ps.bytes_file > 0);
	assert_true(ps.resident_peak <= 2 * fx.expert_bytes);
	free(got);
	serve_close(&sv);
}

static void swapped_dense_weights_change_nothing_and_refuse_other_models(void **state)
{
	struct served sv = { 0 };
	struct mp_seq *q[2];
	uint32_t tok[2] = { 5, 5 };
	float *want;

	(void)state;
	serve_open(&sv, 0, 3);
	want = served_logits(&sv);
	assert_int_equal(mp_runner_active(sv.runner), -1);
	for (uint32_t i = 0; i < 2; i++)
		assert_int_equal(mp_seq_open(sv.runner, &(struct mp_seq_config){
			.request = i, .model = i, .map = mp_multi_map(sv.set, i) }, &q[i]), 0);
	assert_int_equal(mp_runner_activate(sv.runner, 1), 0);
	assert_int_equal(mp_runner_active(sv.runner), 1);
	t_log_reset();
	assert_int_equal(mp_runner_batch(sv.runner, &(struct mp_batch_item){ q[0], &tok[0], 1,
				MP_BATCH_DECODE }, 1), -EINVAL);
	assert_true(t_log_contains("model 1 is active"));
	for (uint32_t t = 0; t < STEPS; t++) {
		/* Model 1 active; then model 0 after a swap back: each its own logits. */
		for (uint32_t i = 0; i < 2; i++) {
			assert_int_equal(mp_runner_activate(sv.runner, 1 - i), 0);
			assert_int_equal(mp_runner_batch(sv.runner, &(struct mp_batch_item){
				q[1 - i], &tok[1 - i], 1, MP_BATCH_DECODE }, 1), 0);
			assert_memory_equal(mp_seq_logits(q[1 - i]),
					    want + ((size_t)(1 - i) * STEPS + t) * fx.vocab,
					    fx.vocab * sizeof(float));
			tok[1 - i] = mp_logits_argmax(mp_seq_logits(q[1 - i]), fx.vocab);
		}
	}
	mp_seq_close(q[0]);
	mp_seq_close(q[1]);
	assert_int_equal(mp_runner_activate(sv.runner, N_MODELS), -EINVAL);
	free(want);
	serve_close(&sv);
}

/*
 * MP_MULTI_OWNED_PAGED: the same consolidated models (every logit equal to
 * the owned-in-memory set's), nothing held outside the pager, the owners'
 * rows bound and read through it like the rest.
 */
static void owned_experts_paged_give_the_same_logits(void **state)
{
	uint32_t capacity = fx.layers * fx.experts / 2, bound = 0;
	struct served held = { 0 }, paged = { 0 };
	struct mp_multi_stats st;
	struct mp_pager_stats ps;
	float *want, *got;

	(void)state;
	serve_open(&held, capacity, 2);
	want = served_logits(&held);
	serve_close(&held);
	serve_open_flags(&paged, capacity, 2, MP_MULTI_OWNED_PAGED);
	got = served_logits(&paged);
	assert_memory_equal(got, want, (size_t)N_MODELS * STEPS * fx.vocab * sizeof(float));
	mp_multi_stats(paged.set, &st);
	mp_pager_stats(paged.pager, &ps);
	for (uint32_t l = 0; l < fx.layers; l++)
		for (uint32_t e = 0; e < fx.experts; e++) {
			int y = mp_consolidation_owner(paged.map, l, e);

			/* Models 1.. bind their unowned experts and the ones they own. */
			bound += y == MP_CONSOL_NONE ? N_MODELS - 1 : y > 0;
		}
	assert_int_equal(st.owned, capacity);
	assert_int_equal(st.owned_bytes, 0);
	assert_int_equal(st.owned_reads + st.owned_routes, 0);
	assert_int_equal(st.bound, bound);
	assert_true(ps.resident_peak <= 2 * fx.expert_bytes);
	free(want);
	free(got);
	serve_close(&paged);
}

/* A layer L > 0 with a position owned by model 0 and one owned by none; at L - 1, one by none. */
static bool pick_positions(const struct mp_consolidation *map, uint32_t *L, uint32_t *a,
			   uint32_t *b, uint32_t *c)
{
	for (*L = 1; *L < fx.layers; (*L)++) {
		bool ha = false, hb = false, hc = false;

		for (uint32_t e = 0; e < fx.experts; e++) {
			int y = mp_consolidation_owner(map, *L, e);

			if (y == 0 && !ha)
				*a = e, ha = true;
			else if (y == MP_CONSOL_NONE && !hb)
				*b = e, hb = true;
			if (mp_consolidation_owner(map, *L - 1, e) == MP_CONSOL_NONE && !hc)
				*c = e, hc = true;
		}
		if (ha && hb && hc)
			return true;
	}
	return false;
}

/*
 * Prefetch of other models' rows: the prefetcher hears each request's map
 * (the set's twin without the owned rows in memory). The oracle (distance
 * 1) predicts layer L's {a, b} at layer L - 1's gate, a owned by model 0,
 * b by none: for a request of model 2 its row 2 x E + b is read; for one
 * of model 0 its own b; model 0's row a never (the owned copy serves).
 */
static void prefetch_reaches_each_models_rows_not_owned_ones(void **state)
{
	const struct mp_expert_source_ops *src = mp_multi_source_ops();
	struct mp_prefetcher_config pfc = { .policy = "oracle", .distance = 1 };
	struct mp_pager_config pc = { .budget_bytes = 64 * fx.expert_bytes,
				      .slots_per_layer = N_MODELS * fx.experts };
	struct mp_multi_config mc = { .models = fx.m, .n = N_MODELS,
				      .source = mp_prefetcher_source_ops(),
				      .rows = mp_pager_row_ops() };
	const float w[2] = { 0.6f, 0.4f };
	const uint32_t E = fx.experts;
	struct mp_prefetcher_stats st;
	struct mp_consolidation *map;
	struct mp_prefetcher *pf;
	struct mp_multi *set;
	struct mp_pager *p;
	struct mp_trace *t;
	char trace[1024];
	uint32_t L, a = 0, b = 0, c = 0, ids[2];
	int len, err;

	(void)state;
	assert_int_equal(mp_consolidation_build(fx.m, N_MODELS, fx.layers * fx.experts / 2, NULL,
						NULL, &map), 0);
	assert_true(pick_positions(map, &L, &a, &b, &c));
	len = snprintf(trace, sizeof(trace), "# moe-trace v1\n# layers=%u\n# experts=%u\n"
		       "# topk=2\nrequest,token,layer,e0,e1,w0,w1\n", fx.layers, E);
	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t l = 0; l < fx.layers; l++)
			len += snprintf(trace + len, sizeof(trace) - (size_t)len,
					"%u,0,%u,%u,%u,0.6,0.4\n", r, l, l == L ? a : c,
					l == L ? b : (c + 1) % E);
	assert_int_equal(mp_trace_parse(trace, (size_t)len, "multi", &t), 0);
	pfc.trace = t;
	err = mp_pager_open(fx.m[0], &pc, &p);
	if (err == -EPERM || err == -EOPNOTSUPP) {
		print_message("userfaultfd unavailable: %s\n", mp_last_error());
		exit(t_require_all() ? 1 : T_EXIT_SKIP);
	}
	assert_int_equal(err, 0);
	assert_int_equal(mp_prefetcher_open(p, &pfc, &pf), 0);
	mc.map = map;
	mc.source_ctx = pf;
	mc.rows_ctx = p;
	assert_int_equal(mp_multi_open(&mc, &set), 0);
	/* Request 0 of model 2: layer L - 1's route as its map reads it. */
	src->seq_map(set, 0, mp_multi_map(set, 2));
	ids[0] = mp_multi_map(set, 2)[L - 1][c];
	ids[1] = mp_multi_map(set, 2)[L - 1][(c + 1) % E];
	assert_int_equal(ids[0], 2 * E + c);
	assert_int_equal(src->route(set, 0, 0, L - 1, ids, w, 2), 0);
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_pager_residency(p, L, 2 * E + b), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, L, b), MP_RES_NONE);
	mp_prefetcher_stats(pf, &st);
	assert_true(st.row_issued >= 1);
	/* Request 1 of model 0: its own b; a is owned (by model 0 itself) and stays unread. */
	src->seq_map(set, 1, mp_multi_map(set, 0));
	ids[0] = c;
	ids[1] = mp_multi_map(set, 0)[L - 1][(c + 1) % E];
	assert_int_equal(src->route(set, 1, 0, L - 1, ids, w, 2), 0);
	assert_int_equal(mp_prefetcher_flush(pf, 5000), 0);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_pager_residency(p, L, b), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, L, a), MP_RES_NONE);
	src->seq_map(set, 0, NULL);
	src->seq_map(set, 1, NULL);
	mp_multi_close(set);
	mp_prefetcher_close(pf);
	mp_pager_close(p);
	mp_trace_close(t);
	mp_consolidation_close(map);
}

/* Decodes STEPS tokens of model x alone from token 5 (one-token steps). */
static void decode_alone(struct served *sv, uint32_t x)
{
	struct mp_seq *q;
	uint32_t tok = 5;

	assert_int_equal(mp_seq_open(sv->runner, &(struct mp_seq_config){
		.request = 9, .model = x, .map = mp_multi_map(sv->set, x) }, &q), 0);
	for (uint32_t t = 0; t < STEPS; t++) {
		assert_int_equal(mp_runner_batch(sv->runner, &(struct mp_batch_item){
			q, &tok, 1, MP_BATCH_DECODE }, 1), 0);
		tok = mp_logits_argmax(mp_seq_logits(q), fx.vocab);
	}
	mp_seq_close(q);
}

/*
 * Multi-MoE's Table 1: a one-token step's layers are timed, the MoE part by
 * how many of the token's experts were in memory. Cold, some layers miss;
 * the same tokens again under a budget that kept every row, all hit;
 * owned rows are hits; a step of several tokens is not timed.
 */
static void one_token_steps_time_their_layers_by_hits(void **state)
{
	const uint32_t k = mp_store_geometry(fx.m[0])->topk, passes = STEPS * fx.layers;
	struct mp_runner_layer_times lt;
	struct served sv = { 0 };
	uint64_t sum = 0;

	(void)state;
	serve_open(&sv, 0, N_MODELS * fx.layers * fx.experts);
	decode_alone(&sv, 1);
	mp_runner_layer_times(sv.runner, &lt);
	assert_int_equal(lt.attn_passes, passes);
	assert_true(lt.attn_ns > 0);
	for (uint32_t h = 0; h <= k; h++)
		sum += lt.moe_passes[h];
	assert_int_equal(sum, passes);
	assert_true(lt.moe_passes[k] < passes);
	assert_true(lt.moe_ns[0] + lt.moe_ns[k / 2] > 0);
	mp_runner_stats_reset(sv.runner);
	decode_alone(&sv, 1);
	mp_runner_layer_times(sv.runner, &lt);
	assert_int_equal(lt.moe_passes[k], passes);
	assert_true(lt.moe_ns[k] > 0);
	mp_runner_stats_reset(sv.runner);
	free(served_logits(&sv));
	mp_runner_layer_times(sv.runner, &lt);
	assert_int_equal(lt.attn_passes, 0);
	serve_close(&sv);
	/* Every position owned: every expert is in memory from the start. */
	serve_open(&sv, fx.layers * fx.experts, 1);
	decode_alone(&sv, 2);
	mp_runner_layer_times(sv.runner, &lt);
	assert_int_equal(lt.moe_passes[k], passes);
	serve_close(&sv);
}

static void models_not_the_maps_are_refused(void **state)
{
	struct mp_consolidation *map;
	struct mp_store *swapped[N_MODELS] = { fx.m[1], fx.m[0], fx.m[2] };
	struct mp_multi_config mc = { .models = swapped, .n = N_MODELS,
				      .source = mp_pager_source_ops(),
				      .rows = mp_pager_row_ops() };
	struct mp_multi *set = NULL;

	(void)state;
	assert_int_equal(mp_consolidation_build(fx.m, N_MODELS, 4, NULL, NULL, &map), 0);
	mc.map = map;
	assert_int_equal(mp_multi_open(&mc, &set), -EMEDIUMTYPE);
	mc.models = fx.m;
	mc.n = 2;
	assert_int_equal(mp_multi_open(&mc, &set), -EMEDIUMTYPE);
	mc.flags = 2;
	assert_int_equal(mp_multi_open(&mc, &set), -EINVAL);
	mc.flags = 0;
	mc.rows = NULL;
	assert_int_equal(mp_multi_open(&mc, &set), -EINVAL);
	assert_null(set);
	mp_consolidation_close(map);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(capacity_zero_gives_each_model_its_own_logits_alone),
		cmocka_unit_test(shared_positions_give_the_consolidated_models_logits),
		cmocka_unit_test(swapped_dense_weights_change_nothing_and_refuse_other_models),
		cmocka_unit_test(owned_experts_paged_give_the_same_logits),
		cmocka_unit_test(prefetch_reaches_each_models_rows_not_owned_ones),
		cmocka_unit_test(one_token_steps_time_their_layers_by_hits),
		cmocka_unit_test(models_not_the_maps_are_refused),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
