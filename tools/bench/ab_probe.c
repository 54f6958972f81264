// SPDX-License-Identifier: MIT
/*
 * bench-adapters' phase 3: what rerouting and slot lookups cost against a
 * step. A second runner reads through a tap in front of the setup's source
 * and decodes a full batch of the stream's first requests twice: once
 * timed (the step), once with the tap recording every layer's routed ids
 * (turned back into the router's base ids by the row's map) and every
 * expert lookup. Then mp_reroute() is timed over the recorded [B, k] ids
 * with their rows' maps, and the setup's expert() over the recorded
 * lookups, each the median of several passes, per step.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/adapterbench.h"

#define PASSES 9

struct tap {
	const struct mp_expert_source_ops *ops;	/* the setup's source */
	void *ctx;
	uint32_t experts, k;
	bool on;
	const uint32_t *const *const *seq_map;	/* by request id: the sequence's maps */
	uint32_t *ids;				/* [rows][k]: the router's base ids */
	const uint32_t **row_map;		/* [rows]: the row's map at its layer */
	uint32_t rows, max_rows;
	uint32_t (*calls)[2];			/* expert lookups: layer, row */
	uint32_t n_calls, max_calls;
};

/* The router's id behind a routed row id: the map is the identity but for its adapter's rows. */
static uint32_t unroute(const uint32_t *map, uint32_t id, uint32_t experts)
{
	if (map && id >= experts)
		for (uint32_t e = 0; e < experts; e++)
			if (map[e] == id)
				return e;
	return id;
}

static const void *tap_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	struct tap *t = ctx;

	if (t->on && t->n_calls < t->max_calls) {
		t->calls[t->n_calls][0] = layer;
		t->calls[t->n_calls++][1] = expert;
	}
	return t->ops->expert(t->ctx, layer, expert);
}

static int tap_route(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		     const uint32_t *ids, const float *weights, uint32_t k)
{
	struct tap *t = ctx;

	if (t->on && t->rows < t->max_rows) {
		const uint32_t *const *maps = t->seq_map[request];
		const uint32_t *m = maps ? maps[layer] : NULL;

		for (uint32_t j = 0; j < k; j++)
			t->ids[(size_t)t->rows * k + j] = unroute(m, ids[j], t->experts);
		t->row_map[t->rows++] = m;
	}
	return t->ops->route ? t->ops->route(t->ctx, request, token, layer, ids, weights, k) : 0;
}

static int tap_guard(void *ctx, int (*fn)(void *arg), void *arg)
{
	struct tap *t = ctx;

	return t->ops->guard ? t->ops->guard(t->ctx, fn, arg) : fn(arg);
}

static const struct mp_expert_source_ops tap_ops = {
	.expert = tap_expert,
	.route = tap_route,
	.guard = tap_guard,
};

/*
 * B sequences of the stream's first requests: prefilled, then max_tokens - 1
 * decode steps: their time and weight bytes per step (when step is not NULL).
 */
static int decode(struct ab_setup *s, struct mp_runner *r, struct tap *t, uint32_t B,
		  bool record, double *step)
{
	const struct ab_opts *o = s->b->o;
	const uint32_t vocab = mp_store_geometry(s->b->base)->vocab;
	struct mp_batch_item items[B];
	struct mp_seq *seq[B];
	struct mp_runner_stats s0, s1;
	uint32_t next[B];
	uint64_t t0, t1;
	int err = 0;

	memset(seq, 0, sizeof(seq));
	for (uint32_t i = 0; i < B && !err; i++) {
		const struct ab_req *q = &s->b->reqs[i];
		struct mp_seq_config sc = { .request = i, .map = ab_setup_map(s, q->adapter) };

		err = mp_seq_open(r, &sc, &seq[i]);
		if (!err)
			err = mp_runner_batch(r, &(struct mp_batch_item){
				seq[i], q->prompt, o->prompt_tokens, MP_BATCH_PREFILL }, 1);
	}
	t->on = record;
	mp_runner_stats(r, &s0);
	t0 = cli_now_ns();
	for (uint32_t step = 0; step + 1 < o->max_tokens && !err; step++) {
		for (uint32_t i = 0; i < B; i++) {
			next[i] = mp_logits_argmax(mp_seq_logits(seq[i]), vocab);
			items[i] = (struct mp_batch_item){ seq[i], &next[i], 1, MP_BATCH_DECODE };
		}
		err = mp_runner_batch(r, items, B);
	}
	t1 = cli_now_ns();
	t->on = false;
	mp_runner_stats(r, &s1);
	if (step && !err) {
		step[0] = (double)(t1 - t0) / (s1.steps - s0.steps);
		step[1] = (double)(s1.dense_bytes - s0.dense_bytes + s1.expert_bytes -
				   s0.expert_bytes) / (s1.steps - s0.steps);
	}
	for (uint32_t i = 0; i < B; i++)
		mp_seq_close(seq[i]);
	return err;
}

/* mp_reroute() over every recorded step's [B, k] ids: ns per pass (median). */
static double time_reroute(const struct tap *t, uint32_t B, uint32_t *scratch)
{
	double ns[PASSES];

	for (uint32_t p = 0; p < PASSES; p++) {
		uint64_t t0;

		memcpy(scratch, t->ids, (size_t)t->rows * t->k * sizeof(*scratch));
		t0 = cli_now_ns();
		for (uint32_t first = 0; first + B <= t->rows; first += B)
			mp_reroute(scratch + (size_t)first * t->k, B, t->k, t->row_map + first);
		ns[p] = (double)(cli_now_ns() - t0);
	}
	return cli_median(ns, PASSES);
}

/* The setup's expert() over every recorded lookup: ns per pass (median). */
static double time_lookups(const struct tap *t)
{
	double ns[PASSES];
	uintptr_t sink = 0;

	for (uint32_t p = 0; p < PASSES; p++) {
		uint64_t t0 = cli_now_ns();

		for (uint32_t i = 0; i < t->n_calls; i++)
			sink ^= (uintptr_t)t->ops->expert(t->ctx, t->calls[i][0], t->calls[i][1]);
		ns[p] = (double)(cli_now_ns() - t0);
	}
	/* Keeps the lookups from being optimised away. */
	__asm__ __volatile__("" : : "r"(sink));
	return cli_median(ns, PASSES);
}

static int tap_alloc(struct ab_setup *s, struct tap *t, uint32_t B)
{
	const struct mp_geometry *g = mp_store_geometry(s->b->base);
	uint32_t steps = s->b->o->max_tokens;

	t->ops = s->inst->source;
	t->ctx = s->inst->source_ctx;
	t->experts = g->experts;
	t->k = g->topk;
	t->max_rows = B * steps * g->layers;
	t->max_calls = t->max_rows * g->topk;
	t->ids = malloc((size_t)t->max_rows * t->k * sizeof(*t->ids));
	t->row_map = malloc((size_t)t->max_rows * sizeof(*t->row_map));
	t->calls = malloc((size_t)t->max_calls * sizeof(*t->calls));
	return t->ids && t->row_map && t->calls ? 0 : -ENOMEM;
}

static void tap_free(struct tap *t)
{
	free(t->ids);
	free(t->row_map);
	free(t->calls);
}

int ab_run_probe(struct ab_setup *s, double *fig)
{
	const struct ab_opts *o = s->b->o;
	const uint32_t B = o->max_batch < o->requests ? o->max_batch : o->requests;
	const uint32_t *const *seq_map[B];
	struct tap t = { .seq_map = seq_map };
	struct mp_runner_config rc = {
		.engine = s->inst->engine, .source = &tap_ops, .source_ctx = &t,
		.max_seq = o->prompt_tokens + o->max_tokens + 1,
		.expert_rows = s->set ? mp_adapters_rows(s->set) : 0,
	};
	struct mp_runner *r = NULL;
	uint32_t *scratch = NULL;
	double step[2], bw[2];
	int err;

	for (uint32_t i = 0; i < B; i++)
		seq_map[i] = ab_setup_map(s, s->b->reqs[i].adapter);
	err = tap_alloc(s, &t, B);
	if (!err)
		err = mp_runner_open(s->inst->store, &rc, &r);
	/* The bandwidth around the timed decode: the bound of its bytes at that moment. */
	if (!err)
		err = ab_membw(s->b->membw, &bw[0]);
	if (!err)
		err = decode(s, r, &t, B, false, step);
	if (!err)
		err = ab_membw(s->b->membw, &bw[1]);
	if (!err)
		err = decode(s, r, &t, B, true, NULL);
	scratch = err ? NULL : malloc((size_t)t.rows * t.k * sizeof(*scratch) + 1);
	if (!err && !scratch)
		err = -ENOMEM;
	if (!err) {
		fig[F_PROBE_STEP_MS] = step[0] / 1e6;
		fig[F_PROBE_BYTES] = step[1];
		fig[F_PROBE_MEMBW] = (bw[0] + bw[1]) / 2;
		fig[F_REROUTE_NS] = time_reroute(&t, B, scratch) / (o->max_tokens - 1);
		fig[F_LOOKUP_NS] = time_lookups(&t) / (o->max_tokens - 1);
	} else {
		cli_fail(err, "%s setup, rerouting probe", ab_kind_names[s->kind]);
	}
	free(scratch);
	mp_runner_close(r);
	tap_free(&t);
	return err;
}
