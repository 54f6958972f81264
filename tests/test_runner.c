// SPDX-License-Identifier: MIT
/* The decoder runner: batched prefill, routing reported before expert reads, guards, traces. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/pager.h>

#include "helpers.h"

#define MAX_EVENTS 4096

/* A source over the resident one that records what the runner asked, and can fail on cue. */
struct event {
	char kind;		/* 'r' route, 'e' expert */
	uint32_t token, layer, expert;
	uint32_t ids[8];
	float w[8];
};

struct spy {
	struct mp_resident *res;
	struct event ev[MAX_EVENTS];
	uint32_t n;
	uint32_t k;
	/* Failure injection: route fails at this layer; the guard fails for this expert. */
	int route_fail_layer;
	int guard_fail_layer, guard_fail_expert;
	uint32_t cur_layer, cur_expert;
	uint32_t guard_calls;
	/* The embed op's calls: step, and the vector of the last one. */
	uint32_t embeds;
	uint32_t embed_token[8];
	float embed_vec[1024];
	uint32_t embed_hidden;
	uint32_t routes_at_embed;
	/* The seq_map op's calls: request, and whether a map came (else its close). */
	uint32_t map_req[8];
	bool map_set[8];
	uint32_t maps;
};

static const void *spy_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	struct spy *s = ctx;

	if (s->n < MAX_EVENTS)
		s->ev[s->n++] = (struct event){ .kind = 'e', .layer = layer, .expert = expert };
	s->cur_layer = layer;
	s->cur_expert = expert;
	return mp_resident_source_ops()->expert(s->res, layer, expert);
}

static int spy_route(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		     const uint32_t *ids, const float *w, uint32_t k)
{
	struct spy *s = ctx;
	struct event e = { .kind = 'r', .token = token, .layer = layer };

	(void)request;
	if ((int)layer == s->route_fail_layer)
		return -EIO;
	memcpy(e.ids, ids, k * sizeof(*ids));
	memcpy(e.w, w, k * sizeof(*w));
	s->k = k;
	if (s->n < MAX_EVENTS)
		s->ev[s->n++] = e;
	return 0;
}

static int spy_guard(void *ctx, int (*fn)(void *arg), void *arg)
{
	struct spy *s = ctx;

	__atomic_fetch_add(&s->guard_calls, 1, __ATOMIC_RELAXED);
	if ((int)s->cur_layer == s->guard_fail_layer && (int)s->cur_expert == s->guard_fail_expert)
		return -EIO;
	return fn(arg);
}

static void spy_embed(void *ctx, uint32_t request, uint32_t token, const float *e,
		      uint32_t hidden)
{
	struct spy *s = ctx;

	(void)request;
	if (s->embeds < 8)
		s->embed_token[s->embeds] = token;
	s->embeds++;
	s->embed_hidden = hidden;
	s->routes_at_embed = s->n;
	memcpy(s->embed_vec, e, (hidden < 1024 ? hidden : 1024) * sizeof(float));
}

static void spy_seq_map(void *ctx, uint32_t request, const uint32_t *const *map)
{
	struct spy *s = ctx;

	if (s->maps < 8) {
		s->map_req[s->maps] = request;
		s->map_set[s->maps] = map != NULL;
	}
	s->maps++;
}

static const struct mp_expert_source_ops spy_ops = {
	.expert = spy_expert,
	.route = spy_route,
	.guard = spy_guard,
	.embed = spy_embed,
	.seq_map = spy_seq_map,
};

struct fixture {
	struct mp_store *store;
	struct mp_resident *res;
	struct mp_engine *engine;
	struct spy *spy;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	t_log_capture();
	if (!f)
		return -1;
	if (t_gen_tiny(t_path("tiny.mpk"), MP_DTYPE_BF16, 5) ||
	    mp_store_open(t_path("tiny.mpk"), &f->store) ||
	    mp_resident_open(f->store, NULL, NULL, &f->res) ||
	    mp_engine_open("ref", &(struct mp_engine_config){ .threads = 2 }, &f->engine))
		return -1;
	f->spy = calloc(1, sizeof(*f->spy));
	if (!f->spy)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	mp_engine_close(f->engine);
	mp_resident_close(f->res);
	mp_store_close(f->store);
	free(f->spy);
	free(f);
	t_tmpdir_cleanup();
	return 0;
}

/* A fresh spy (no failures) and a runner over it. */
static struct mp_runner *open_runner(struct fixture *f, const struct mp_trace *trace,
				     uint32_t request, uint32_t max_seq)
{
	struct mp_runner_config cfg = {
		.engine = f->engine, .source = &spy_ops, .source_ctx = f->spy,
		.trace = trace, .request = request, .max_seq = max_seq,
	};
	struct mp_runner *r = NULL;

	memset(f->spy, 0, sizeof(*f->spy));
	f->spy->res = f->res;
	f->spy->route_fail_layer = f->spy->guard_fail_layer = f->spy->guard_fail_expert = -1;
	assert_int_equal(mp_runner_open(f->store, &cfg, &r), 0);
	return r;
}

static const uint32_t prompt[] = { 3, 141, 59, 265, 358, 97, 93, 238, 462, 64, 33 };
#define PROMPT_LEN (sizeof(prompt) / sizeof(prompt[0]))

static void assert_logits_close(const float *a, const float *b, uint32_t n, double rel)
{
	double max_diff = 0, max_ref = 0;

	for (uint32_t i = 0; i < n; i++) {
		max_diff = fmax(max_diff, fabs((double)a[i] - b[i]));
		max_ref = fmax(max_ref, fabs((double)b[i]));
	}
	if (!(max_diff <= rel * max_ref)) {
		print_error("logits differ by %.3g (max |ref| %.3g)\n", max_diff, max_ref);
		fail();
	}
}

static void batched_prefill_equals_token_by_token(void **state)
{
	struct fixture *f = *state;
	const uint32_t vocab = mp_store_geometry(f->store)->vocab;
	struct mp_runner *a = open_runner(f, NULL, 0, 64), *b;
	float *la = malloc(vocab * sizeof(float));

	assert_int_equal(mp_runner_prefill(a, prompt, PROMPT_LEN), 0);
	assert_int_equal(mp_runner_pos(a), PROMPT_LEN);
	memcpy(la, mp_runner_logits(a), vocab * sizeof(float));
	b = open_runner(f, NULL, 0, 64);
	for (uint32_t i = 0; i < PROMPT_LEN; i++)
		assert_int_equal(mp_runner_prefill(b, prompt + i, 1), 0);
	assert_logits_close(mp_runner_logits(b), la, vocab, 1e-5);
	/* And the caches agree: one more step on each gives the same logits. */
	assert_int_equal(mp_runner_step(a, 7), 0);
	assert_int_equal(mp_runner_step(b, 7), 0);
	assert_logits_close(mp_runner_logits(b), mp_runner_logits(a), vocab, 1e-5);
	assert_int_equal(mp_runner_steps(a), 1);
	mp_runner_close(a);
	mp_runner_close(b);
	free(la);
}

static void routing_is_reported_before_the_layers_experts_are_read(void **state)
{
	struct fixture *f = *state;
	const struct mp_geometry *g = mp_store_geometry(f->store);
	struct mp_runner *r = open_runner(f, NULL, 0, 64);
	struct spy *s = f->spy;
	uint32_t layer = UINT32_MAX, routed = 0, read = 0;
	bool used[64] = { false }, reading = false;

	assert_int_equal(mp_runner_prefill(r, prompt, 4), 0);
	assert_int_equal(mp_runner_step(r, 9), 0);
	for (uint32_t i = 0; i < s->n; i++) {
		const struct event *e = &s->ev[i];

		if (e->kind == 'r') {
			/* The 4 prompt tokens first (4 layers x 4), then the step. */
			assert_int_equal(e->token, routed < 4 * g->layers ? MP_TOKEN_PROMPT : 0);
			if (e->layer != layer) {
				layer = e->layer;
				reading = false;
				memset(used, 0, sizeof(used));
			}
			/* Every route of a layer comes before the first of its expert reads. */
			assert_false(reading);
			for (uint32_t k = 0; k < s->k; k++)
				used[e->ids[k]] = true;
			routed++;
		} else {
			assert_int_equal(e->layer, layer);
			assert_true(used[e->expert]);
			reading = true;
			read++;
		}
	}
	/* 4 prompt tokens and one step, every layer. */
	assert_int_equal(routed, 5 * g->layers);
	assert_int_equal(s->ev[s->n - 1].kind, 'e');
	assert_true(read >= g->layers * g->topk);
	assert_true(s->guard_calls >= 2 * read);	/* gate|up and down chunks, at least */
	mp_runner_close(r);
}

static void decode_step_reports_its_step_and_router_order(void **state)
{
	struct fixture *f = *state;
	const struct mp_geometry *g = mp_store_geometry(f->store);
	struct mp_runner *r = open_runner(f, NULL, 0, 64);
	struct spy *s = f->spy;
	uint32_t routes = 0;

	assert_int_equal(mp_runner_prefill(r, prompt, 3), 0);
	s->n = 0;
	assert_int_equal(mp_runner_step(r, 1), 0);
	for (uint32_t i = 0; i < s->n; i++) {
		if (s->ev[i].kind != 'r')
			continue;
		assert_int_equal(s->ev[i].token, 0);	/* the first decode step */
		/* Weights are a softmax over the chosen experts, largest first. */
		assert_true(fabsf(s->ev[i].w[0] + s->ev[i].w[1] - 1.0f) < 1e-6f);
		assert_true(s->ev[i].w[0] >= s->ev[i].w[1]);
		/* One token: its experts are read in router order, right after its route. */
		assert_int_equal(s->ev[i + 1].expert, s->ev[i].ids[0]);
		assert_int_equal(s->ev[i + 2].expert, s->ev[i].ids[1]);
		routes++;
	}
	assert_int_equal(routes, g->layers);
	mp_runner_close(r);
}

/* Each decode step hands the source its input token's embedding row, before any layer. */
static void decode_step_gives_the_tokens_embedding_first(void **state)
{
	struct fixture *f = *state;
	const struct mp_geometry *g = mp_store_geometry(f->store);
	const struct mp_tensor_info *ti = mp_store_tensor(f->store, "tok_embd");
	struct mp_runner *r = open_runner(f, NULL, 0, 64);
	struct spy *s = f->spy;
	const uint32_t steps[2] = { 5, 9 };
	float *row = malloc(g->hidden * sizeof(float));
	char *table;

	assert_non_null(ti);
	assert_non_null(row);
	assert_true(g->hidden <= 1024);
	table = malloc(ti->bytes);
	assert_non_null(table);
	assert_int_equal(mp_store_read_tensor(f->store, ti, table), 0);
	/* A prompt is no iteration of its own. */
	assert_int_equal(mp_runner_prefill(r, prompt, 3), 0);
	assert_int_equal(s->embeds, 0);
	for (uint32_t i = 0; i < 2; i++) {
		s->n = 0;
		assert_int_equal(mp_runner_step(r, steps[i]), 0);
		assert_int_equal(s->embeds, i + 1);
		assert_int_equal(s->embed_token[i], i);
		assert_int_equal(s->embed_hidden, g->hidden);
		assert_int_equal(s->routes_at_embed, 0);
		mp_dtype_to_f32(ti->dtype, table + (size_t)steps[i] * g->hidden *
				mp_dtype_size(ti->dtype), row, g->hidden);
		assert_memory_equal(s->embed_vec, row, g->hidden * sizeof(float));
	}
	free(table);
	free(row);
	mp_runner_close(r);
}

static void route_error_aborts_the_step(void **state)
{
	struct fixture *f = *state;
	struct mp_runner *r = open_runner(f, NULL, 0, 64);
	uint32_t experts_read = 0;

	assert_int_equal(mp_runner_prefill(r, prompt, 2), 0);
	f->spy->route_fail_layer = 2;
	f->spy->n = 0;
	t_log_reset();
	assert_int_equal(mp_runner_step(r, 5), -EIO);
	assert_true(t_log_contains("layer 2 position 2: the expert source refused the routing"));
	for (uint32_t i = 0; i < f->spy->n; i++) {
		if (f->spy->ev[i].kind != 'e')
			continue;
		assert_true(f->spy->ev[i].layer < 2);
		experts_read++;
	}
	assert_true(experts_read > 0);
	mp_runner_close(r);
}

static void guard_error_names_layer_and_expert(void **state)
{
	struct fixture *f = *state;
	struct mp_runner *r = open_runner(f, NULL, 0, 64);
	char want[64];
	int expert = -1;

	assert_int_equal(mp_runner_prefill(r, prompt, 2), 0);
	/* Find the expert layer 3 reads first in this step, then fail it in a replay. */
	f->spy->n = 0;
	assert_int_equal(mp_runner_step(r, 5), 0);
	for (uint32_t i = 0; i < f->spy->n && expert < 0; i++)
		if (f->spy->ev[i].kind == 'e' && f->spy->ev[i].layer == 3)
			expert = (int)f->spy->ev[i].expert;
	assert_true(expert >= 0);
	mp_runner_reset(r);
	assert_int_equal(mp_runner_prefill(r, prompt, 2), 0);
	f->spy->guard_fail_layer = 3;
	f->spy->guard_fail_expert = expert;
	t_log_reset();
	assert_int_equal(mp_runner_step(r, 5), -EIO);
	assert_int_equal(mp_runner_pos(r), 2);
	snprintf(want, sizeof(want), "layer 3 expert %d: reading the expert failed",
		 f->spy->guard_fail_expert);
	assert_true(t_log_contains(want));
	mp_runner_close(r);
}

static void tokens_do_not_depend_on_thread_count(void **state)
{
	struct fixture *f = *state;
	uint32_t want[8], got[8];

	for (uint32_t t = 1; t <= 4; t++) {
		struct mp_engine *e;
		struct mp_runner_config cfg = {
			.source = mp_resident_source_ops(), .source_ctx = f->res, .max_seq = 64,
		};
		struct mp_runner *r;
		uint32_t *out = t == 1 ? want : got;

		assert_int_equal(mp_engine_open("ref", &(struct mp_engine_config){ .threads = t },
						&e), 0);
		cfg.engine = e;
		assert_int_equal(mp_runner_open(f->store, &cfg, &r), 0);
		assert_int_equal(mp_runner_prefill(r, prompt, PROMPT_LEN), 0);
		out[0] = mp_runner_argmax(r);
		for (uint32_t i = 1; i < 8; i++) {
			assert_int_equal(mp_runner_step(r, out[i - 1]), 0);
			out[i] = mp_runner_argmax(r);
		}
		if (t > 1)
			assert_memory_equal(got, want, sizeof(want));
		mp_runner_close(r);
		mp_engine_close(e);
	}
}

/* A trace for the tiny geometry (4 layers, 8 experts, top-2) with 2 requests of 3 tokens. */
static struct mp_trace *tiny_trace(uint32_t layers, bool weights)
{
	char buf[8192];
	size_t len = 0;
	struct mp_trace *t = NULL;

	len += (size_t)snprintf(buf + len, sizeof(buf) - len,
				"# moe-trace v1\n# layers=%u\n# experts=8\n# topk=2\n"
				"request,token,layer,e0,e1%s\n", layers, weights ? ",w0,w1" : "");
	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t tok = 0; tok < 3; tok++)
			for (uint32_t l = 0; l < layers; l++)
				len += (size_t)snprintf(buf + len, sizeof(buf) - len,
							"%u,%u,%u,%u,%u%s\n", r, tok, l,
							(r + tok + l) % 8,
							(r + 3 * tok + l + 5) % 8,
							weights ? ",0.750000,0.250000" : "");
	assert_int_equal(mp_trace_parse(buf, len, "tiny-trace", &t), 0);
	return t;
}

static void trace_forces_decode_routing(void **state)
{
	struct fixture *f = *state;
	struct mp_trace *tr = tiny_trace(4, true);
	struct mp_runner *r = open_runner(f, tr, 1, 64);
	struct mp_runner_stats st;

	assert_int_equal(mp_runner_prefill(r, prompt, 4), 0);
	for (uint32_t step = 0; step < 3; step++) {
		f->spy->n = 0;
		assert_int_equal(mp_runner_step(r, 11), 0);
		for (uint32_t i = 0; i < f->spy->n; i++) {
			const struct event *e = &f->spy->ev[i];
			const uint32_t *ids;
			const float *w;

			if (e->kind != 'r')
				continue;
			assert_int_equal(mp_trace_route(tr, 1, step, e->layer, &ids, &w), 0);
			assert_int_equal(e->token, step);
			assert_int_equal(e->ids[0], ids[0]);
			assert_int_equal(e->ids[1], ids[1]);
			assert_true(e->w[0] == 0.75f && e->w[1] == 0.25f);
		}
	}
	mp_runner_stats(r, &st);
	assert_int_equal(st.route_calls, 4 * 4 + 3 * 4);
	assert_int_equal(st.expert_bytes, st.expert_calls * mp_store_expert_bytes(f->store));
	/* The trace ends after 3 tokens: a fourth step has no routing. */
	t_log_reset();
	assert_int_equal(mp_runner_step(r, 11), -ERANGE);
	assert_true(t_log_contains("trace request 1 ends after 3 tokens"));
	mp_runner_close(r);
	mp_trace_close(tr);
}

static void trace_without_weights_uses_router_softmax_over_its_experts(void **state)
{
	struct fixture *f = *state;
	struct mp_trace *tr = tiny_trace(4, false);
	struct mp_runner *r = open_runner(f, tr, 0, 64);

	assert_int_equal(mp_runner_prefill(r, prompt, 4), 0);
	f->spy->n = 0;
	assert_int_equal(mp_runner_step(r, 11), 0);
	for (uint32_t i = 0; i < f->spy->n; i++) {
		const struct event *e = &f->spy->ev[i];

		if (e->kind != 'r')
			continue;
		assert_int_equal(e->ids[0], e->layer % 8);
		assert_int_equal(e->ids[1], (e->layer + 5) % 8);
		assert_true(fabsf(e->w[0] + e->w[1] - 1.0f) < 1e-6f);
		assert_true(e->w[0] != 0.75f);
	}
	mp_runner_close(r);
	mp_trace_close(tr);
}

static void trace_of_another_geometry_is_refused(void **state)
{
	struct fixture *f = *state;
	struct mp_trace *tr = tiny_trace(3, true);
	struct mp_runner_config cfg = {
		.engine = f->engine, .source = mp_resident_source_ops(), .source_ctx = f->res,
		.trace = tr,
	};
	struct mp_runner *r = NULL;

	t_log_reset();
	assert_int_equal(mp_runner_open(f->store, &cfg, &r), -EINVAL);
	assert_null(r);
	assert_true(t_log_contains("layers"));
	mp_trace_close(tr);

	tr = tiny_trace(4, true);
	cfg.trace = tr;
	cfg.request = 2;
	t_log_reset();
	assert_int_equal(mp_runner_open(f->store, &cfg, &r), -EINVAL);
	assert_true(t_log_contains("trace has 2 requests, request 2 asked for"));
	mp_trace_close(tr);
}

static void bad_tokens_and_a_full_cache_are_errors(void **state)
{
	struct fixture *f = *state;
	const uint32_t vocab = mp_store_geometry(f->store)->vocab;
	struct mp_runner *r = open_runner(f, NULL, 0, 4);
	uint32_t bad[2] = { 1, vocab };

	t_log_reset();
	assert_int_equal(mp_runner_prefill(r, bad, 2), -EINVAL);
	assert_true(t_log_contains("token 1 is id 512"));
	assert_int_equal(mp_runner_pos(r), 0);
	assert_int_equal(mp_runner_prefill(r, prompt, 3), 0);
	assert_int_equal(mp_runner_step(r, 2), 0);
	t_log_reset();
	assert_int_equal(mp_runner_step(r, 2), -ENOSPC);
	assert_true(t_log_contains("overflow a KV cache of 4"));
	mp_runner_reset(r);
	assert_int_equal(mp_runner_prefill(r, prompt, 4), 0);
	mp_runner_close(r);
}

/* Greedy tokens and logits of a run over source (prefill, then 8 steps, trace forced). */
static int run_tokens(struct fixture *f, const struct mp_expert_source_ops *ops, void *ctx,
		      const struct mp_trace *tr, uint32_t *tokens, float *logits)
{
	const uint32_t vocab = mp_store_geometry(f->store)->vocab;
	struct mp_runner_config cfg = {
		.engine = f->engine, .source = ops, .source_ctx = ctx, .max_seq = 64,
		.trace = tr, .request = 1,
	};
	struct mp_runner *r;
	int err = mp_runner_open(f->store, &cfg, &r);

	if (err)
		return err;
	err = mp_runner_prefill(r, prompt, PROMPT_LEN);
	tokens[0] = mp_runner_argmax(r);
	for (uint32_t i = 1; !err && i < 4; i++) {
		err = mp_runner_step(r, tokens[i - 1]);
		tokens[i] = mp_runner_argmax(r);
		memcpy(logits + (size_t)(i - 1) * vocab, mp_runner_logits(r),
		       vocab * sizeof(float));
	}
	mp_runner_close(r);
	return err;
}

static void paged_runs_give_the_resident_tokens(void **state)
{
	struct fixture *f = *state;
	const uint32_t vocab = mp_store_geometry(f->store)->vocab;
	const uint64_t eb = mp_store_expert_bytes(f->store);
	const uint64_t budgets[] = { 0, 2 * eb };
	struct mp_trace *tr = tiny_trace(4, true);
	float *want = malloc(3ull * vocab * sizeof(float));
	float *got = malloc(3ull * vocab * sizeof(float));
	uint32_t want_tok[4], got_tok[4];

	assert_int_equal(run_tokens(f, mp_resident_source_ops(), f->res, tr, want_tok, want), 0);
	for (size_t b = 0; b < sizeof(budgets) / sizeof(budgets[0]); b++) {
		struct mp_pager_config cfg;
		struct mp_pager *p;
		struct mp_pager_stats st;
		int err;

		mp_pager_config_init(&cfg);
		cfg.budget_bytes = budgets[b];
		err = mp_pager_open(f->store, &cfg, &p);
		if (err == -EPERM && !t_require_all())
			skip();
		assert_int_equal(err, 0);
		assert_int_equal(run_tokens(f, mp_pager_source_ops(), p, tr, got_tok, got), 0);
		mp_pager_stats(p, &st);
		mp_pager_close(p);
		/* Same bytes, same engine, same order: the logits are bit for bit the same. */
		assert_memory_equal(got_tok, want_tok, sizeof(want_tok));
		assert_memory_equal(got, want, 3ull * vocab * sizeof(float));
		assert_true(st.faults_file + st.faults_host > 0 || st.hits > 0);
		if (budgets[b])
			assert_true(st.evictions > 0);
	}
	mp_trace_close(tr);
	free(want);
	free(got);
}

/*
 * Resident experts packed for the engine (mp_resident_pack()) give the
 * logits of the file's order bit for bit; the source says they are packed,
 * and a runner whose engine cannot read the layout is refused.
 */
static void packed_resident_runs_give_the_file_orders_logits(void **state)
{
	struct fixture *f = *state;
	const struct mp_expert_source_ops *ops = mp_resident_source_ops();
	const uint32_t vocab = mp_store_geometry(f->store)->vocab;
	const size_t len = mp_store_expert_bytes(f->store);
	struct mp_trace *tr = tiny_trace(4, true);
	float *want = malloc(3ull * vocab * sizeof(float));
	float *got = malloc(3ull * vocab * sizeof(float));
	void *file = malloc(len);
	uint32_t want_tok[4], got_tok[4];
	struct mp_resident *res;
	struct mp_engine *scalar;
	struct mp_runner *r = NULL;
	int err;

	assert_non_null(want);
	assert_non_null(got);
	assert_non_null(file);
	assert_int_equal(run_tokens(f, ops, f->res, tr, want_tok, want), 0);
	assert_int_equal(mp_resident_open(f->store, NULL, NULL, &res), 0);
	err = mp_resident_pack(res, f->engine);
	if (err == -EOPNOTSUPP) {
		/* No AVX-512 here: nothing packed, the source says so. */
		assert_false(mp_engine_packs(f->engine, MP_DTYPE_BF16));
		assert_int_equal(ops->packed(res), 0);
		printf("# engine ref has no packed layout on this CPU\n");
		goto out;
	}
	assert_int_equal(err, 0);
	assert_int_equal(ops->packed(res), 1);
	assert_int_equal(ops->packed(f->res), 0);
	assert_int_equal(mp_resident_pack(res, f->engine), 0);
	assert_int_equal(mp_store_read_expert(f->store, 3, 5, file), 0);
	assert_true(memcmp(ops->expert(res, 3, 5), file, len) != 0);
	assert_int_equal(run_tokens(f, ops, res, tr, got_tok, got), 0);
	assert_memory_equal(got_tok, want_tok, sizeof(want_tok));
	assert_memory_equal(got, want, 3ull * vocab * sizeof(float));
	assert_int_equal(mp_engine_open("ref-scalar", NULL, &scalar), 0);
	t_log_reset();
	assert_int_equal(mp_runner_open(f->store, &(struct mp_runner_config){
		.engine = scalar, .source = ops, .source_ctx = res }, &r), -EINVAL);
	assert_true(t_log_contains("packed layout"));
	assert_null(r);
	mp_engine_close(scalar);
out:
	mp_resident_close(res);
	mp_trace_close(tr);
	free(file);
	free(want);
	free(got);
}

/* A source over a resident one that lends the named dense tensors from its own copies. */
struct lender {
	struct mp_store *store;
	struct mp_resident *res;
	const char *const *names;	/* NULL-terminated */
	void *copy[8];
	uint32_t copies;
	uint64_t lent;
};

static const void *lend_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	return mp_resident_source_ops()->expert(((struct lender *)ctx)->res, layer, expert);
}

static const void *lend_tensor(void *ctx, const struct mp_tensor_info *t)
{
	struct lender *l = ctx;

	for (const char *const *n = l->names; *n; n++) {
		void *p;

		if (strcmp(*n, t->name))
			continue;
		assert_true(l->copies < sizeof(l->copy) / sizeof(l->copy[0]));
		p = aligned_alloc(64, (t->bytes + 63) / 64 * 64);
		assert_non_null(p);
		assert_int_equal(mp_store_read_tensor(l->store, t, p), 0);
		l->copy[l->copies++] = p;
		l->lent += t->bytes;
		return p;
	}
	return NULL;
}

static const struct mp_expert_source_ops lend_ops = {
	.expert = lend_expert,
	.tensor = lend_tensor,
};

/* A prompt and three decode steps (no trace): the tokens, the steps' logits, the stats. */
static void run_dense(struct mp_store *s, struct mp_engine *e,
		      const struct mp_expert_source_ops *ops, void *ctx, uint32_t flags,
		      uint32_t *tokens, float *logits, struct mp_runner_stats *st)
{
	const uint32_t vocab = mp_store_geometry(s)->vocab;
	struct mp_runner *r;

	assert_int_equal(mp_runner_open(s, &(struct mp_runner_config){ .engine = e,
		.source = ops, .source_ctx = ctx, .max_seq = 32, .flags = flags }, &r), 0);
	assert_int_equal(mp_runner_prefill(r, prompt, PROMPT_LEN), 0);
	tokens[0] = mp_runner_argmax(r);
	for (uint32_t i = 1; i < 4; i++) {
		assert_int_equal(mp_runner_step(r, tokens[i - 1]), 0);
		tokens[i] = mp_runner_argmax(r);
		memcpy(logits + (size_t)(i - 1) * vocab, mp_runner_logits(r),
		       vocab * sizeof(float));
	}
	mp_runner_stats(r, st);
	mp_runner_close(r);
}

/*
 * Bytes MP_RUNNER_PACK_DENSE packs on e: the LM head, the routers and each
 * layer's Q, K, V and O where e has a layout for their type, but for a layer
 * with a lent one among them (all four stay row-major) and lent tensors.
 */
static uint64_t dense_packable(struct mp_store *s, struct mp_engine *e, const char *const *lent)
{
	uint64_t bytes = 0;

	for (uint32_t i = 0; i < mp_store_tensor_count(s); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(s, i);
		const char *attn = strstr(t->name, ".attn_");
		bool skip = !mp_engine_packs(e, t->dtype);
		char layer[MP_TENSOR_NAME_MAX];

		if (strcmp(t->name, "output") && !strstr(t->name, ".router") &&
		    (!attn || strstr(t->name, "_norm")))
			continue;
		snprintf(layer, sizeof(layer), "%.*s.attn_", attn ? (int)(attn - t->name) : 0,
			 t->name);
		for (const char *const *n = lent; *n && !skip; n++)
			skip = !strcmp(*n, t->name) || (attn && !strncmp(*n, layer, strlen(layer)));
		bytes += skip ? 0 : t->bytes;
	}
	return bytes;
}

/*
 * MP_RUNNER_PACK_DENSE gives the logits of the file's order bit for bit, on
 * every engine (those without a layout keep row-major and say nothing is
 * packed), with the experts packed too, and over a source that lends some
 * tensors (read as lent: a layer with one lent keeps all four of its
 * attention matrices row-major). The tiny model, and one whose Q, K and V
 * rows (18, 6, 6) split a 4-row group where they join (one matrix of 30 rows
 * read as one), whose LM head (499 rows) ends in a part group and whose
 * columns (48, 18) end in part blocks.
 */
static void packed_dense_runs_give_the_file_orders_logits(void **state)
{
	struct fixture *f = *state;
	static const char *const engines[] = { "ref", "ref-bf16", "ref-scalar" };
	static const char *const lent[] = { "output", "blk.1.attn_q", "blk.1.attn_k",
					    "blk.1.attn_v", "blk.1.attn_o", "blk.0.attn_k", NULL };
	static const char *const none[] = { NULL };
	const struct mp_geometry odd = {
		.layers = 2, .experts = 4, .topk = 2, .hidden = 48, .ffn = 24, .heads = 3,
		.kv_heads = 1, .head_dim = 6, .vocab = 499, .max_seq = 64,
		.dtype = MP_DTYPE_BF16, .rope_theta = 10000.0f, .norm_eps = 1e-5f,
	};
	struct mp_store *stores[2] = { f->store, NULL };
	uint32_t packing = 0;

	assert_int_equal(mp_gen_model(t_path("odd.mpk"), &odd, 3, "odd", NULL, NULL), 0);
	assert_int_equal(mp_store_open(t_path("odd.mpk"), &stores[1]), 0);
	for (uint32_t m = 0; m < 2; m++) {
		struct mp_store *s = stores[m];
		const uint32_t vocab = mp_store_geometry(s)->vocab;
		const size_t len = 3ull * vocab * sizeof(float);
		float *want = malloc(len), *got = malloc(len);
		uint32_t want_tok[4], got_tok[4];
		struct mp_resident *res, *packed;

		assert_true(want && got);
		assert_int_equal(mp_resident_open(s, NULL, NULL, &res), 0);
		assert_int_equal(mp_resident_open(s, NULL, NULL, &packed), 0);
		for (uint32_t i = 0; i < sizeof(engines) / sizeof(engines[0]); i++) {
			struct lender l = { .store = s, .res = res, .names = lent };
			struct mp_runner_stats st0, st;
			struct mp_engine *e;
			int err = mp_engine_open(engines[i],
						 &(struct mp_engine_config){ .threads = 2 }, &e);
			bool packs;

			if (err == -EOPNOTSUPP)
				continue;
			assert_int_equal(err, 0);
			packs = mp_engine_packs(e, MP_DTYPE_BF16);
			packing += packs;
			run_dense(s, e, mp_resident_source_ops(), res, 0, want_tok, want, &st0);
			assert_int_equal(st0.dense_packed_bytes, 0);
			run_dense(s, e, mp_resident_source_ops(), res, MP_RUNNER_PACK_DENSE,
				  got_tok, got, &st);
			assert_memory_equal(got_tok, want_tok, sizeof(want_tok));
			assert_memory_equal(got, want, len);
			assert_int_equal(st.dense_read_bytes, st0.dense_read_bytes);
			assert_int_equal(st.dense_packed_bytes, dense_packable(s, e, none));
			assert_true(!packs || st.dense_packed_bytes > 0);
			if (packs) {
				/* Experts and dense weights both packed: what batchbench and run keep. */
				assert_int_equal(mp_resident_pack(packed, e), 0);
				run_dense(s, e, mp_resident_source_ops(), packed,
					  MP_RUNNER_PACK_DENSE, got_tok, got, &st);
				assert_memory_equal(got_tok, want_tok, sizeof(want_tok));
				assert_memory_equal(got, want, len);
			}
			run_dense(s, e, &lend_ops, &l, MP_RUNNER_PACK_DENSE, got_tok, got, &st);
			assert_memory_equal(got_tok, want_tok, sizeof(want_tok));
			assert_memory_equal(got, want, len);
			assert_int_equal(st.dense_lent_bytes, l.lent);
			assert_true(l.lent > 0);
			assert_int_equal(st.dense_packed_bytes, dense_packable(s, e, lent));
			assert_true(!packs || st.dense_packed_bytes < dense_packable(s, e, none));
			for (uint32_t c = 0; c < l.copies; c++)
				free(l.copy[c]);
			mp_engine_close(e);
		}
		mp_resident_close(packed);
		mp_resident_close(res);
		free(want);
		free(got);
	}
	if (!packing)
		printf("# no engine has a packed layout on this CPU: row-major only\n");
	mp_store_close(stores[1]);
}

/* Reusing a sequence closes the old request's map at the source and opens the new one's. */
static void reuse_hands_the_source_each_requests_map(void **state)
{
	struct fixture *f = *state;
	struct mp_runner *r = open_runner(f, NULL, 0, 0);
	const struct mp_geometry *g = mp_store_geometry(f->store);
	uint32_t ident[MP_MAX_EXPERTS];
	const uint32_t *map[64] = { 0 };
	static const uint32_t want_req[] = { 7, 7, 8, 8, 10, 10 };
	static const bool want_set[] = { true, false, true, false, true, false };
	struct mp_seq *q;

	for (uint32_t e = 0; e < g->experts; e++)
		ident[e] = e;
	for (uint32_t l = 0; l < g->layers; l++)
		map[l] = ident;
	assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .request = 7, .map = map }, &q),
			 0);
	assert_int_equal(mp_seq_reuse(q, &(struct mp_seq_config){ .request = 8, .map = map }), 0);
	assert_int_equal(mp_seq_reuse(q, &(struct mp_seq_config){ .request = 9 }), 0);
	assert_int_equal(mp_seq_reuse(q, &(struct mp_seq_config){ .request = 10, .map = map }),
			 0);
	/* A refused reuse changes nothing, the source's view included. */
	assert_int_equal(mp_seq_reuse(q, &(struct mp_seq_config){ .request = 11, .model = 5 }),
			 -EINVAL);
	mp_seq_close(q);
	assert_int_equal(f->spy->maps, 6);
	for (uint32_t i = 0; i < 6; i++) {
		assert_int_equal(f->spy->map_req[i], want_req[i]);
		assert_int_equal(f->spy->map_set[i], want_set[i]);
	}
	mp_runner_close(r);
}

static void resident_source_serves_the_files_expert_bytes(void **state)
{
	struct fixture *f = *state;
	const struct mp_expert_source_ops *ops = mp_resident_source_ops();
	size_t len = mp_store_expert_bytes(f->store);
	void *buf = malloc(len);

	assert_int_equal(mp_store_read_expert(f->store, 3, 5, buf), 0);
	assert_memory_equal(ops->expert(f->res, 3, 5), buf, len);
	t_log_reset();
	assert_null(ops->expert(f->res, 4, 0));
	assert_true(t_log_contains("no layer 4 expert 0"));
	free(buf);
}

/* The reference: one scan keeping the first strictly greater value. */
static uint32_t argmax_scan(const float *v, uint32_t n)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < n; i++)
		if (v[i] > v[best])
			best = i;
	return best;
}

/*
 * mp_logits_argmax() runs in two passes over independent maxima; it gives
 * the scan's id on ties, signed zeros, infinities and NaNs (logits[0]
 * included), at sizes around its 16- and 32-wide blocks and at a vocabulary's.
 */
static void logits_argmax_is_the_first_of_the_largest(void **state)
{
	static const uint32_t sizes[] = { 1, 2, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 4096,
					      4099, 32000 };
	const float specials[] = { 0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, -1.0f };
	float *v = malloc(32000 * sizeof(*v));
	uint64_t rng = 7;

	(void)state;
	assert_non_null(v);
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
		for (uint32_t trial = 0; trial < 64; trial++) {
			const uint32_t n = sizes[s];

			for (uint32_t i = 0; i < n; i++) {
				rng = rng * 6364136223846793005ull + 1442695040888963407ull;
				/* few distinct values, so ties are common; some specials */
				v[i] = (float)((rng >> 33) % 5) - 2.0f;
				if ((rng >> 20) % 9 == 0)
					v[i] = specials[(rng >> 40) % 7];
			}
			if (trial == 1)
				v[0] = NAN;
			if (trial == 2)
				for (uint32_t i = 0; i < n; i++)
					v[i] = -INFINITY;
			/* One largest value anywhere, so the second pass runs far; a -0 twin later. */
			if (trial % 4 == 3) {
				uint32_t at = (uint32_t)(rng >> 7) % n;

				for (uint32_t i = 0; i < n; i++)
					if (!(v[i] <= 2.0f))
						v[i] = 1.0f;
				for (uint32_t i = 0; i < n; i++)
					v[i] = v[i] == 0.0f ? -1.0f : v[i] - 3.0f;
				v[at] = trial % 8 == 3 ? -0.0f : 0.0f;
				if (at + 7 < n)
					v[at + 7] = -v[at];
			}
			if (mp_logits_argmax(v, n) != argmax_scan(v, n))
				fail_msg("size %u trial %u: argmax %u, a scan gives %u", n, trial,
					 mp_logits_argmax(v, n), argmax_scan(v, n));
		}
	free(v);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(batched_prefill_equals_token_by_token),
		cmocka_unit_test(routing_is_reported_before_the_layers_experts_are_read),
		cmocka_unit_test(decode_step_reports_its_step_and_router_order),
		cmocka_unit_test(decode_step_gives_the_tokens_embedding_first),
		cmocka_unit_test(route_error_aborts_the_step),
		cmocka_unit_test(guard_error_names_layer_and_expert),
		cmocka_unit_test(tokens_do_not_depend_on_thread_count),
		cmocka_unit_test(trace_forces_decode_routing),
		cmocka_unit_test(trace_without_weights_uses_router_softmax_over_its_experts),
		cmocka_unit_test(trace_of_another_geometry_is_refused),
		cmocka_unit_test(bad_tokens_and_a_full_cache_are_errors),
		cmocka_unit_test(reuse_hands_the_source_each_requests_map),
		cmocka_unit_test(resident_source_serves_the_files_expert_bytes),
		cmocka_unit_test(paged_runs_give_the_resident_tokens),
		cmocka_unit_test(packed_resident_runs_give_the_file_orders_logits),
		cmocka_unit_test(packed_dense_runs_give_the_file_orders_logits),
		cmocka_unit_test(logits_argmax_is_the_first_of_the_largest),
	};

	return cmocka_run_group_tests_name("runner", tests, setup, teardown);
}
