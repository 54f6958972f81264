// SPDX-License-Identifier: MIT
/*
 * Description: batched decode: sequences stepped together give exactly the
 * tokens and logits they give alone (every engine), join and leave between
 * steps, read each routed expert once per step, report routing with their
 * own request ids, and a refused batch changes nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/pager.h>

#include "helpers.h"

#define NSEQ 4
#define DECODE 10
#define MAX_PROMPT 24
#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

static const char *const engines[] = { "ref-scalar", "ref-avx2", "ref-avx512", "ref",
				       "ref-amx", "ref-bf16", "openblas" };

/* Prompts of different lengths; sequence i starts decoding at a different step. */
static const uint32_t prompt_len[NSEQ] = { 17, 5, 1, 23 };

static uint32_t prompt_token(uint32_t s, uint32_t t, uint32_t vocab)
{
	return (s * 131u + t * 29u + 7u) % vocab;
}

struct fixture {
	struct mp_store *store;
	struct mp_resident *res;
	uint32_t vocab;
};

static struct fixture fx;

static int group_setup(void **state)
{
	(void)state;
	t_log_capture();
	if (t_gen_tiny(t_path("tiny.mpk"), MP_DTYPE_BF16, 11) ||
	    mp_store_open(t_path("tiny.mpk"), &fx.store) ||
	    mp_resident_open(fx.store, NULL, NULL, &fx.res))
		return -1;
	fx.vocab = mp_store_geometry(fx.store)->vocab;
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	mp_resident_close(fx.res);
	mp_store_close(fx.store);
	t_tmpdir_cleanup();
	return 0;
}

static struct mp_engine *open_engine(const char *name, uint32_t threads)
{
	struct mp_engine *e = NULL;

	if (mp_engine_open(name, &(struct mp_engine_config){ .threads = threads }, &e))
		fail_msg("engine %s: %s", name, mp_last_error());
	return e;
}

static struct mp_runner *open_runner(struct mp_engine *e, const struct mp_expert_source_ops *ops,
				     void *ctx)
{
	struct mp_runner_config rc = { .engine = e, .source = ops, .source_ctx = ctx };
	struct mp_runner *r = NULL;

	assert_int_equal(mp_runner_open(fx.store, &rc, &r), 0);
	return r;
}

/* What one sequence produced: its greedy tokens and the logits of every decode step. */
struct record {
	uint32_t tokens[DECODE];
	float *logits;		/* [DECODE][vocab] */
};

static void record_init(struct record *rec)
{
	rec->logits = calloc((size_t)DECODE * fx.vocab, sizeof(float));
	assert_non_null(rec->logits);
}

/* Sequence s alone: the whole prompt in one prefill, then DECODE greedy steps. */
static void run_alone(struct mp_runner *r, uint32_t s, struct record *rec)
{
	struct mp_seq_config sc = { .request = s };
	uint32_t prompt[MAX_PROMPT], tok;
	struct mp_seq *q;

	for (uint32_t t = 0; t < prompt_len[s]; t++)
		prompt[t] = prompt_token(s, t, fx.vocab);
	assert_int_equal(mp_seq_open(r, &sc, &q), 0);
	assert_int_equal(mp_runner_batch(r, &(struct mp_batch_item){ q, prompt, prompt_len[s],
								     MP_BATCH_PREFILL }, 1), 0);
	for (uint32_t d = 0; d < DECODE; d++) {
		tok = mp_logits_argmax(mp_seq_logits(q), fx.vocab);
		rec->tokens[d] = tok;
		assert_int_equal(mp_runner_batch(r, &(struct mp_batch_item){ q, &tok, 1,
									     MP_BATCH_DECODE }, 1), 0);
		memcpy(rec->logits + (size_t)d * fx.vocab, mp_seq_logits(q),
		       fx.vocab * sizeof(float));
	}
	assert_int_equal(mp_seq_pos(q), prompt_len[s] + DECODE);
	mp_seq_close(q);
}

/* Where a sequence of the batch is: its prompt in chunks of `chunk`, then decodes. */
struct live {
	struct mp_seq *q;
	uint32_t prompt[MAX_PROMPT];
	uint32_t fed;		/* prompt tokens run */
	uint32_t decoded;
	uint32_t tok;		/* its next decode token */
	uint32_t join;		/* the step it joins at */
};

/*
 * All sequences through shared steps: sequence s joins at step 2s, prefills
 * in chunks of 6 tokens beside the others' decodes, and leaves once it has
 * decoded DECODE tokens (its sequence closed while the others go on).
 */
static void run_batched(struct mp_runner *r, struct record *rec)
{
	struct live lv[NSEQ] = { 0 };
	uint32_t done = 0;

	for (uint32_t s = 0; s < NSEQ; s++) {
		lv[s].join = 2 * s;
		for (uint32_t t = 0; t < prompt_len[s]; t++)
			lv[s].prompt[t] = prompt_token(s, t, fx.vocab);
	}
	for (uint32_t step = 0; done < NSEQ; step++) {
		struct mp_batch_item items[NSEQ];
		uint32_t n = 0, idx[NSEQ];

		assert_true(step < 200);
		for (uint32_t s = 0; s < NSEQ; s++) {
			struct live *l = &lv[s];

			if (step < l->join || l->decoded == DECODE)
				continue;
			if (!l->q)
				assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .request = s },
							     &l->q), 0);
			if (l->fed < prompt_len[s]) {
				uint32_t c = prompt_len[s] - l->fed < 6 ? prompt_len[s] - l->fed : 6;

				items[n] = (struct mp_batch_item){ l->q, l->prompt + l->fed, c,
								   MP_BATCH_PREFILL };
				l->fed += c;
			} else {
				l->tok = mp_logits_argmax(mp_seq_logits(l->q), fx.vocab);
				rec[s].tokens[l->decoded] = l->tok;
				items[n] = (struct mp_batch_item){ l->q, &l->tok, 1, MP_BATCH_DECODE };
			}
			idx[n++] = s;
		}
		assert_int_equal(mp_runner_batch(r, items, n), 0);
		for (uint32_t i = 0; i < n; i++) {
			struct live *l = &lv[idx[i]];

			if (items[i].kind != MP_BATCH_DECODE)
				continue;
			memcpy(rec[idx[i]].logits + (size_t)l->decoded * fx.vocab,
			       mp_seq_logits(l->q), fx.vocab * sizeof(float));
			if (++l->decoded == DECODE) {
				mp_seq_close(l->q);
				l->q = NULL;
				done++;
			}
		}
	}
}

/*
 * The same over experts packed for the engine (mp_resident_pack()), which the
 * runner runs a layer at a time (two pool runs for all of a layer's experts):
 * each sequence's tokens and logits are also those of the unpacked run.
 */
static void batched_sequences_give_their_lone_tokens_and_logits(void **state)
{
	const char *name = *state;
	struct record alone[NSEQ], batch[NSEQ], unpacked[NSEQ];

	for (uint32_t threads = 1; threads <= 2; threads++) {
		struct mp_engine *e = open_engine(name, threads);

		for (int packed = 0; packed < 2; packed++) {
			struct mp_resident *res = fx.res;
			struct mp_runner *r;

			if (packed) {
				int err;

				assert_int_equal(mp_resident_open(fx.store, NULL, NULL, &res), 0);
				err = mp_resident_pack(res, e);
				if (err == -EOPNOTSUPP) {
					printf("# engine %s packs no experts here\n", name);
					mp_resident_close(res);
					for (uint32_t s = 0; s < NSEQ; s++)
						free(unpacked[s].logits);
					break;
				}
				assert_int_equal(err, 0);
			}
			r = open_runner(e, mp_resident_source_ops(), res);
			for (uint32_t s = 0; s < NSEQ; s++) {
				record_init(&alone[s]);
				record_init(&batch[s]);
				run_alone(r, s, &alone[s]);
			}
			run_batched(r, batch);
			for (uint32_t s = 0; s < NSEQ; s++) {
				assert_memory_equal(batch[s].tokens, alone[s].tokens,
						    sizeof(alone[s].tokens));
				if (memcmp(batch[s].logits, alone[s].logits,
					   (size_t)DECODE * fx.vocab * sizeof(float)))
					fail_msg("engine %s, %u threads%s: sequence %u's logits in the "
						 "batch differ from its logits alone", name, threads,
						 packed ? ", packed" : "", s);
				if (packed && memcmp(alone[s].logits, unpacked[s].logits,
						     (size_t)DECODE * fx.vocab * sizeof(float)))
					fail_msg("engine %s, %u threads: sequence %u's logits over "
						 "packed experts differ from the file order's", name,
						 threads, s);
				free(batch[s].logits);
				if (packed) {
					free(alone[s].logits);
					free(unpacked[s].logits);
				} else {
					unpacked[s] = alone[s];
				}
			}
			mp_runner_close(r);
			if (packed)
				mp_resident_close(res);
		}
		mp_engine_close(e);
	}
}

/* A source over the resident one counting expert reads per layer and routes per request. */
struct counter {
	uint32_t expert_reads[64];
	uint32_t routes[NSEQ];
	uint32_t last_token[NSEQ];
	uint32_t bad;
	uint32_t asked;		/* resident() calls */
};

static const void *count_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	struct counter *c = ctx;

	c->expert_reads[layer]++;
	return mp_resident_source_ops()->expert(fx.res, layer, expert);
}

static int count_route(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		       const uint32_t *ids, const float *w, uint32_t k)
{
	struct counter *c = ctx;

	(void)layer;
	(void)ids;
	(void)w;
	(void)k;
	if (request >= NSEQ)
		c->bad++;
	else {
		c->routes[request]++;
		c->last_token[request] = token;
	}
	return 0;
}

static const struct mp_expert_source_ops count_ops = {
	.expert = count_expert,
	.route = count_route,
};

static void each_routed_expert_is_read_once_per_step(void **state)
{
	const struct mp_geometry *g = mp_store_geometry(fx.store);
	struct mp_engine *e = open_engine("ref", 2);
	struct counter c = { 0 };
	struct mp_runner *r = open_runner(e, &count_ops, &c);
	struct mp_runner_stats st;
	struct mp_batch_item items[NSEQ];
	struct mp_seq *q[NSEQ];
	uint32_t tok[NSEQ];
	uint64_t reads;

	(void)state;
	assert_true(g->layers <= N_ELEMS(c.expert_reads));
	for (uint32_t s = 0; s < NSEQ; s++) {
		tok[s] = prompt_token(s, 0, g->vocab);
		assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .request = 100 + s },
					     &q[s]), 0);
		items[s] = (struct mp_batch_item){ q[s], &tok[s], 1, MP_BATCH_DECODE };
	}
	assert_int_equal(mp_runner_batch(r, items, NSEQ), 0);
	mp_runner_stats(r, &st);
	assert_int_equal(st.steps, 1);
	assert_int_equal(st.tokens, NSEQ);
	assert_int_equal(st.route_calls, (uint64_t)NSEQ * g->layers);
	/* Four tokens route 4 x topk choices per layer; each distinct expert is read once. */
	for (uint32_t l = 0; l < g->layers; l++) {
		assert_true(c.expert_reads[l] >= g->topk);
		assert_true(c.expert_reads[l] <= NSEQ * g->topk);
		assert_true(c.expert_reads[l] <= g->experts);
	}
	reads = 0;
	for (uint32_t l = 0; l < g->layers; l++)
		reads += c.expert_reads[l];
	assert_int_equal(st.expert_calls, reads);
	for (uint32_t s = 0; s < NSEQ; s++)
		mp_seq_close(q[s]);
	mp_runner_close(r);
	mp_engine_close(e);
}

static int count_resident(void *ctx, uint32_t layer, uint32_t expert)
{
	(void)layer;
	(void)expert;
	return (int)(((struct counter *)ctx)->asked++ & 1);
}

static const struct mp_expert_source_ops asked_ops = {
	.expert = count_expert,
	.resident = count_resident,
};

/*
 * Only a runner asked for layer times asks its source which experts are in
 * memory (a pager answers under its lock) or times layers: one-token steps of
 * one opened without MP_RUNNER_LAYER_TIMES ask nothing and count nothing.
 */
static void residency_is_asked_only_for_layer_times(void **state)
{
	const struct mp_geometry *g = mp_store_geometry(fx.store);
	struct mp_engine *e = open_engine("ref", 1);
	struct mp_runner_layer_times lt;
	struct mp_runner *r;

	(void)state;
	for (uint32_t timed = 0; timed < 2; timed++) {
		struct counter c = { 0 };
		struct mp_runner_config rc = { .engine = e, .source = &asked_ops, .source_ctx = &c,
					       .flags = timed ? MP_RUNNER_LAYER_TIMES : 0 };
		uint64_t passes = 0;

		r = NULL;
		assert_int_equal(mp_runner_open(fx.store, &rc, &r), 0);
		for (uint32_t t = 0; t < 3; t++)
			assert_int_equal(mp_runner_step(r, 5 + t), 0);
		mp_runner_layer_times(r, &lt);
		for (uint32_t h = 0; h <= g->topk; h++)
			passes += lt.moe_passes[h];
		assert_int_equal(c.asked, timed ? 3 * g->layers * g->topk : 0);
		assert_int_equal(lt.attn_passes, timed ? 3 * g->layers : 0);
		assert_int_equal(passes, timed ? 3 * g->layers : 0);
		mp_runner_close(r);
	}
	r = NULL;
	assert_int_equal(mp_runner_open(fx.store, &(struct mp_runner_config){ .engine = e,
		.source = &asked_ops, .flags = 1u << 2 }, &r), -EINVAL);
	assert_null(r);
	mp_engine_close(e);
}

static void routes_carry_each_sequences_request_id_and_step(void **state)
{
	const struct mp_geometry *g = mp_store_geometry(fx.store);
	struct mp_engine *e = open_engine("ref", 1);
	struct counter c = { 0 };
	struct mp_runner *r = open_runner(e, &count_ops, &c);
	uint32_t prompt[3] = { 1, 2, 3 }, tok = 5;
	struct mp_seq *a, *b;

	(void)state;
	assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .request = 1 }, &a), 0);
	assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .request = 3 }, &b), 0);
	/* a decodes twice on its own; then a's third step shares one with b's prefill. */
	for (int i = 0; i < 2; i++)
		assert_int_equal(mp_runner_batch(r, &(struct mp_batch_item){ a, &tok, 1,
									     MP_BATCH_DECODE }, 1), 0);
	assert_int_equal(mp_runner_batch(r, (struct mp_batch_item[]){
		{ b, prompt, 3, MP_BATCH_PREFILL }, { a, &tok, 1, MP_BATCH_DECODE } }, 2), 0);
	assert_int_equal(c.bad, 0);
	assert_int_equal(c.routes[1], 3 * g->layers);
	assert_int_equal(c.routes[3], 3 * g->layers);
	assert_int_equal(c.last_token[1], 2);		/* a's third decode step */
	assert_int_equal(c.last_token[3], MP_TOKEN_PROMPT);
	assert_int_equal(mp_seq_steps(a), 3);
	assert_int_equal(mp_seq_steps(b), 0);
	assert_int_equal(mp_seq_pos(b), 3);
	mp_seq_close(a);
	mp_seq_close(b);
	mp_runner_close(r);
	mp_engine_close(e);
}

static void a_refused_batch_changes_nothing(void **state)
{
	const struct mp_geometry *g = mp_store_geometry(fx.store);
	struct mp_engine *e = open_engine("ref", 1);
	struct mp_runner *r = open_runner(e, mp_resident_source_ops(), fx.res);
	uint32_t good = 1, bad = g->vocab, many[40] = { 0 };
	struct mp_seq *a, *b, *small;
	struct mp_runner *other = open_runner(e, mp_resident_source_ops(), fx.res);
	struct mp_seq *foreign;

	(void)state;
	assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .request = 1 }, &a), 0);
	assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .request = 2 }, &b), 0);
	assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .request = 3, .max_seq = 32 },
				     &small), 0);
	assert_int_equal(mp_seq_open(other, &(struct mp_seq_config){ 0 }, &foreign), 0);
	t_log_reset();
	assert_int_equal(mp_runner_batch(r, (struct mp_batch_item[]){
		{ a, &good, 1, MP_BATCH_DECODE }, { b, &bad, 1, MP_BATCH_DECODE } }, 2), -EINVAL);
	assert_true(t_log_contains("item 1 token 0 is id"));
	assert_int_equal(mp_runner_batch(r, (struct mp_batch_item[]){
		{ a, &good, 1, MP_BATCH_DECODE }, { a, &good, 1, MP_BATCH_DECODE } }, 2), -EINVAL);
	assert_true(t_log_contains("the same sequence"));
	assert_int_equal(mp_runner_batch(r, (struct mp_batch_item[]){
		{ a, &good, 1, MP_BATCH_DECODE }, { small, many, 40, MP_BATCH_PREFILL } }, 2),
			 -ENOSPC);
	assert_int_equal(mp_runner_batch(r, (struct mp_batch_item[]){
		{ a, many, 2, MP_BATCH_DECODE } }, 1), -EINVAL);
	assert_int_equal(mp_runner_batch(r, (struct mp_batch_item[]){
		{ foreign, &good, 1, MP_BATCH_DECODE } }, 1), -EINVAL);
	assert_true(t_log_contains("another runner"));
	assert_int_equal(mp_seq_pos(a), 0);
	assert_int_equal(mp_seq_pos(b), 0);
	assert_int_equal(mp_seq_pos(small), 0);
	/* Still serving. */
	assert_int_equal(mp_runner_batch(r, (struct mp_batch_item[]){
		{ a, &good, 1, MP_BATCH_DECODE }, { b, &good, 1, MP_BATCH_DECODE } }, 2), 0);
	assert_int_equal(mp_seq_pos(a), 1);
	assert_int_equal(mp_seq_pos(b), 1);
	mp_seq_close(foreign);
	mp_seq_close(a);
	mp_seq_close(b);
	mp_seq_close(small);
	mp_runner_close(other);
	mp_runner_close(r);
	mp_engine_close(e);
}

/* Through a pager holding two experts: every step faults, and the tokens are the lone ones. */
static void paged_batch_under_a_two_expert_budget_gives_the_lone_tokens(void **state)
{
	struct mp_pager_config pc = { .budget_bytes = 2 * mp_store_expert_bytes(fx.store) };
	struct mp_engine *e = open_engine("ref", 2);
	struct mp_runner *alone_r = open_runner(e, mp_resident_source_ops(), fx.res);
	struct record alone[NSEQ], batch[NSEQ];
	struct mp_pager_stats st;
	struct mp_runner *r;
	struct mp_pager *p;
	int err;

	(void)state;
	err = mp_pager_open(fx.store, &pc, &p);
	if (err == -EPERM || err == -EOPNOTSUPP) {
		print_message("userfaultfd unavailable: %s\n", mp_last_error());
		if (t_require_all())
			fail();
		skip();
	}
	assert_int_equal(err, 0);
	r = open_runner(e, mp_pager_source_ops(), p);
	for (uint32_t s = 0; s < NSEQ; s++) {
		record_init(&alone[s]);
		record_init(&batch[s]);
		run_alone(alone_r, s, &alone[s]);
	}
	run_batched(r, batch);
	for (uint32_t s = 0; s < NSEQ; s++) {
		assert_memory_equal(batch[s].tokens, alone[s].tokens, sizeof(alone[s].tokens));
		assert_memory_equal(batch[s].logits, alone[s].logits,
				    (size_t)DECODE * fx.vocab * sizeof(float));
		free(alone[s].logits);
		free(batch[s].logits);
	}
	mp_pager_stats(p, &st);
	assert_true(st.faults_file > 0);
	assert_true(st.resident_peak <= pc.budget_bytes);
	mp_runner_close(r);
	mp_pager_close(p);
	mp_runner_close(alone_r);
	mp_engine_close(e);
}

/*
 * ExpertWeave's Fig. 4: M = 64 base experts, K = 6, N = 2 adapters of E_max = 8
 * slots; adapter 0 fine-tunes {3, 14, 47} (rows 64-66), adapter 1
 * {5, 13, 14, 27, 35, 57, 59} (rows 72-78); a step of three tokens, one per
 * adapter and one of the base (-1: no map).
 */
static void rerouting_reproduces_expertweave_figure_4(void **state)
{
	static const uint32_t a0[] = { 3, 14, 47 }, a1[] = { 5, 13, 14, 27, 35, 57, 59 };
	uint32_t pi0[64], pi1[64];
	const uint32_t *maps[3] = { pi0, pi1, NULL };
	uint32_t ids[3 * 6] = { 26, 47, 31, 3, 58, 60, 57, 5, 3, 13, 27, 59, 26, 47, 31, 3, 58, 60 };
	static const uint32_t want[3 * 6] = { 26, 66, 31, 64, 58, 60, 77, 72, 3, 73, 75, 78,
					      26, 47, 31, 3, 58, 60 };
	uint32_t bad[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 }, down[2] = { 9, 4 }, far[1] = { 64 };

	(void)state;
	assert_int_equal(mp_reroute_table(64, 8, 0, a0, 3, pi0), 0);
	assert_int_equal(mp_reroute_table(64, 8, 1, a1, 7, pi1), 0);
	mp_reroute(ids, 3, 6, maps);
	assert_memory_equal(ids, want, sizeof(want));
	t_log_reset();
	assert_int_equal(mp_reroute_table(64, 8, 0, bad, 9, pi0), -EINVAL);
	assert_true(t_log_contains("more than E_max 8"));
	assert_int_equal(mp_reroute_table(64, 8, 0, down, 2, pi0), -EINVAL);
	assert_int_equal(mp_reroute_table(64, 8, 0, far, 1, pi0), -EINVAL);
}

/*
 * Two models of one architecture in one runner: rows [0, M) are model A's
 * experts, [M, 2M) model B's; B's sequences run with B's dense weights and a
 * map to B's rows. In a batch mixing them, each sequence gets exactly the
 * logits of its model decoded alone.
 */
struct two_models {
	struct mp_resident *res[2];
	uint32_t experts;
};

static const void *two_expert(void *ctx, uint32_t layer, uint32_t row)
{
	struct two_models *t = ctx;
	uint32_t m = row / t->experts;

	return mp_resident_source_ops()->expert(t->res[m], layer, row % t->experts);
}

static const struct mp_expert_source_ops two_ops = { .expert = two_expert };

static void batch_mixing_two_models_gives_each_its_lone_logits(void **state)
{
	struct mp_engine *e = open_engine("ref", 2);
	const struct mp_geometry *g = mp_store_geometry(fx.store);
	struct two_models tm = { .res = { fx.res }, .experts = g->experts };
	uint32_t table[64], tok[2] = { 3, 3 };
	const uint32_t *map[16];
	struct mp_store *b, *odd;
	struct mp_runner *r, *alone[2];
	struct mp_seq *q[2], *lq[2];
	struct mp_runner_stats st;
	struct mp_geometry og;

	(void)state;
	assert_int_equal(t_gen_tiny(t_path("b.mpk"), MP_DTYPE_BF16, 12), 0);
	assert_int_equal(mp_store_open(t_path("b.mpk"), &b), 0);
	assert_int_equal(mp_resident_open(b, NULL, NULL, &tm.res[1]), 0);
	for (uint32_t i = 0; i < g->experts; i++)
		table[i] = g->experts + i;
	for (uint32_t l = 0; l < g->layers; l++)
		map[l] = table;
	{
		struct mp_runner_config rc = { .engine = e, .source = &two_ops, .source_ctx = &tm,
					       .expert_rows = 2 * g->experts };

		assert_int_equal(mp_runner_open(fx.store, &rc, &r), 0);
	}
	assert_int_equal(mp_runner_models(r), 1);
	assert_int_equal(mp_runner_add_model(r, b), 1);
	/* Another architecture is refused, naming what differs. */
	og = *g;
	og.hidden *= 2;
	og.head_dim *= 2;
	assert_int_equal(mp_gen_model(t_path("odd.mpk"), &og, 1, "odd", NULL, NULL), 0);
	assert_int_equal(mp_store_open(t_path("odd.mpk"), &odd), 0);
	t_log_reset();
	assert_int_equal(mp_runner_add_model(r, odd), -EINVAL);
	assert_true(t_log_contains("its hidden differs"));
	mp_store_close(odd);
	assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .model = 2 }, &q[0]), -EINVAL);
	/* B first in the batch, A second: the runner groups them by model. */
	assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .model = 1, .map = map }, &q[1]),
			 0);
	assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .request = 1 }, &q[0]), 0);
	alone[0] = open_runner(e, mp_resident_source_ops(), fx.res);
	{
		struct mp_runner_config rc = { .engine = e, .source = mp_resident_source_ops(),
					       .source_ctx = tm.res[1] };

		assert_int_equal(mp_runner_open(b, &rc, &alone[1]), 0);
	}
	for (uint32_t m = 0; m < 2; m++)
		assert_int_equal(mp_seq_open(alone[m], &(struct mp_seq_config){ 0 }, &lq[m]), 0);
	mp_runner_stats_reset(r);
	for (int t = 0; t < 8; t++) {
		struct mp_batch_item items[2] = {
			{ q[1], &tok[1], 1, MP_BATCH_DECODE }, { q[0], &tok[0], 1, MP_BATCH_DECODE },
		};

		assert_int_equal(mp_runner_batch(r, items, 2), 0);
		for (uint32_t m = 0; m < 2; m++) {
			assert_int_equal(mp_runner_batch(alone[m], &(struct mp_batch_item){
				lq[m], &tok[m], 1, MP_BATCH_DECODE }, 1), 0);
			assert_memory_equal(mp_seq_logits(q[m]), mp_seq_logits(lq[m]),
					    fx.vocab * sizeof(float));
		}
		for (uint32_t m = 0; m < 2; m++)
			tok[m] = mp_logits_argmax(mp_seq_logits(q[m]), fx.vocab);
	}
	assert_true(memcmp(mp_seq_logits(q[0]), mp_seq_logits(q[1]),
			   fx.vocab * sizeof(float)) != 0);
	mp_runner_stats(r, &st);
	assert_int_equal(st.steps, 8);
	assert_int_equal(st.model_runs, 16);
	for (uint32_t m = 0; m < 2; m++) {
		mp_seq_close(q[m]);
		mp_seq_close(lq[m]);
		mp_runner_close(alone[m]);
	}
	mp_runner_close(r);
	mp_resident_close(tm.res[1]);
	mp_store_close(b);
	mp_engine_close(e);
}

/* An engine is tested where this CPU has its ISA and this build made it. */
static bool engine_here(const char *name)
{
	const char *built = getenv("MOEPAGER_TEST_PLUGINS");
	struct mp_engine *e = NULL;
	int err;

	if (!strcmp(name, "openblas") && !(built && strstr(built, name))) {
		printf("# engine %s: not built here, its case is not run\n", name);
		return false;
	}
	err = mp_engine_open(name, NULL, &e);
	mp_engine_close(e);
	if (err == -EOPNOTSUPP) {
		printf("# engine %s: %s; its case is not run\n", name, mp_last_error());
		return false;
	}
	return true;
}

int main(void)
{
	static const struct CMUnitTest global[] = {
		cmocka_unit_test(each_routed_expert_is_read_once_per_step),
		cmocka_unit_test(residency_is_asked_only_for_layer_times),
		cmocka_unit_test(routes_carry_each_sequences_request_id_and_step),
		cmocka_unit_test(a_refused_batch_changes_nothing),
		cmocka_unit_test(paged_batch_under_a_two_expert_budget_gives_the_lone_tokens),
		cmocka_unit_test(rerouting_reproduces_expertweave_figure_4),
		cmocka_unit_test(batch_mixing_two_models_gives_each_its_lone_logits),
	};
	struct CMUnitTest tests[N_ELEMS(engines) + N_ELEMS(global)];
	static char names[N_ELEMS(engines)][96];
	size_t n = 0;

	for (size_t i = 0; i < N_ELEMS(engines); i++) {
		if (!engine_here(engines[i]))
			continue;
		snprintf(names[n], sizeof(names[n]),
			 "batched_sequences_give_their_lone_tokens_and_logits/%s", engines[i]);
		tests[n] = (struct CMUnitTest){
			.name = names[n],
			.test_func = batched_sequences_give_their_lone_tokens_and_logits,
			.initial_state = (void *)engines[i],
		};
		n++;
	}
	memcpy(tests + n, global, sizeof(global));
	n += N_ELEMS(global);
	return _cmocka_run_group_tests("test_batch", tests, n, group_setup, group_teardown);
}
