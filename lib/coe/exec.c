// SPDX-License-Identifier: MIT
/*
 * An executor's engine: an engine instance (its thread group), a runner per
 * architecture over that architecture's trunk, whose expert source maps the
 * model being run onto its slots of the container's pager range; and the
 * calls that load, check and evict a whole model through the pager.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/runner.h>
#include <moepager/source.h>

#include "base/base.h"
#include "coe/exec.h"

/* The runner asks for (layer, expert) of the model the executor is running now. */
struct exec_src {
	struct mp_coe *c;
	struct mp_pager *p;
	uint32_t model;
};

struct exec_arch {
	struct exec_src src;
	struct mp_runner *runner;
	struct mp_seq **seqs;		/* max_batch of them, KV caches of `tokens` */
};

struct coe_exec {
	struct mp_coe *c;
	struct mp_pager *p;
	struct mp_engine *engine;
	struct exec_arch *arch;
	uint32_t max_batch;
	uint32_t tokens;
	uint32_t *tok;			/* max_batch x tokens */
	struct mp_batch_item *items;
};

static const void *src_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	struct exec_src *s = ctx;
	uint32_t cl, ce;

	if (mp_coe_slot(s->c, s->model, layer, expert, &cl, &ce))
		return NULL;
	return mp_pager_expert(s->p, cl, ce);
}

static int src_guard(void *ctx, int (*fn)(void *arg), void *arg)
{
	return mp_pager_guard(((struct exec_src *)ctx)->p, fn, arg);
}

static const struct mp_expert_source_ops exec_source = {
	.expert = src_expert,
	.guard = src_guard,
};

static int open_arch(struct coe_exec *ex, uint32_t a)
{
	struct exec_arch *xa = &ex->arch[a];
	struct mp_runner_config rc = { .engine = ex->engine, .source = &exec_source,
				       .source_ctx = &xa->src, .max_seq = ex->tokens };
	struct mp_seq_config sc = { .max_seq = ex->tokens };
	int err;

	xa->src = (struct exec_src){ ex->c, ex->p, 0 };
	err = mp_runner_open(ex->c->archs[a].trunk, &rc, &xa->runner);
	if (err)
		return err;
	xa->seqs = calloc(ex->max_batch, sizeof(*xa->seqs));
	if (!xa->seqs)
		return -ENOMEM;
	for (uint32_t i = 0; i < ex->max_batch; i++) {
		sc.request = i;
		err = mp_seq_open(xa->runner, &sc, &xa->seqs[i]);
		if (err)
			return err;
	}
	return 0;
}

int coe_exec_open(struct mp_coe *c, struct mp_pager *p, const char *engine, uint32_t threads,
		  uint32_t max_batch, uint32_t tokens, struct coe_exec **out)
{
	struct mp_engine_config ec = { .threads = threads ? threads : 1 };
	struct coe_exec *ex;
	int err;

	for (uint32_t a = 0; a < c->n_archs; a++)
		if (!tokens || tokens > c->archs[a].g.max_seq)
			return mp_err(-EINVAL, "coe executor: %u tokens per request (1 to "
				      "architecture %s's max_seq %u)", tokens, c->archs[a].name,
				      c->archs[a].g.max_seq);
	if (!max_batch)
		return mp_err(-EINVAL, "coe executor: a batch of 0");
	ex = calloc(1, sizeof(*ex));
	if (!ex)
		return mp_err(-ENOMEM, "coe executor: out of memory");
	ex->c = c;
	ex->p = p;
	ex->max_batch = max_batch;
	ex->tokens = tokens;
	ex->arch = calloc(c->n_archs, sizeof(*ex->arch));
	ex->tok = calloc((size_t)max_batch * tokens, sizeof(*ex->tok));
	ex->items = calloc(max_batch, sizeof(*ex->items));
	if (!ex->arch || !ex->tok || !ex->items) {
		err = mp_err(-ENOMEM, "coe executor: out of memory");
		goto close;
	}
	err = mp_engine_open(engine ? engine : "ref", &ec, &ex->engine);
	for (uint32_t a = 0; !err && a < c->n_archs; a++)
		err = open_arch(ex, a);
	if (err)
		goto close;
	*out = ex;
	return 0;
close:
	coe_exec_close(ex);
	return err;
}

void coe_exec_close(struct coe_exec *ex)
{
	if (!ex)
		return;
	for (uint32_t a = 0; ex->arch && a < ex->c->n_archs; a++) {
		struct exec_arch *xa = &ex->arch[a];

		for (uint32_t i = 0; xa->seqs && i < ex->max_batch; i++)
			mp_seq_close(xa->seqs[i]);
		free(xa->seqs);
		mp_runner_close(xa->runner);
	}
	mp_engine_close(ex->engine);
	free(ex->arch);
	free(ex->tok);
	free(ex->items);
	free(ex);
}

uint64_t coe_exec_item_bytes(const struct coe_exec *ex, uint32_t arch)
{
	const struct mp_geometry *g = &ex->c->archs[arch].g;

	/* Its KV cache, and the step's f32 activations of its rows (an estimate). */
	return mp_seq_kv_bytes(ex->arch[arch].runner, ex->tokens) +
	       (uint64_t)ex->tokens * sizeof(float) *
	       (4ull * g->hidden + 2ull * g->topk * g->ffn + g->vocab);
}

/* A request's input (its image): tokens drawn from its id, the same for every model. */
static void request_tokens(uint64_t id, uint32_t vocab, uint32_t n, uint32_t *out)
{
	for (uint32_t t = 0; t < n; t++)
		out[t] = (uint32_t)(coe_mix(id, 0x70c0ull + t) % vocab);
}

int coe_exec_run(struct coe_exec *ex, uint32_t model, const uint64_t *ids, uint32_t n,
		 uint32_t *out)
{
	uint32_t a = ex->c->models[model].arch;
	struct exec_arch *xa = &ex->arch[a];
	const struct mp_geometry *g = &ex->c->archs[a].g;
	int err;

	if (!n || n > ex->max_batch)
		return mp_err(-EINVAL, "coe executor: batch of %u (1 to %u)", n, ex->max_batch);
	xa->src.model = model;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t *tok = ex->tok + (size_t)i * ex->tokens;

		request_tokens(ids[i], g->vocab, ex->tokens, tok);
		mp_seq_reset(xa->seqs[i]);
		ex->items[i] = (struct mp_batch_item){ .seq = xa->seqs[i], .tokens = tok,
						       .n = ex->tokens, .kind = MP_BATCH_PREFILL };
	}
	err = mp_runner_batch(xa->runner, ex->items, n);
	if (err)
		return mp_err(err, "coe: model %s: batch of %u failed: %s", ex->c->models[model].name,
			      n, mp_last_error());
	for (uint32_t i = 0; i < n; i++)
		out[i] = mp_logits_argmax(mp_seq_logits(xa->seqs[i]), g->vocab);
	return 0;
}

/*
 * Whole models through the pager
 */

static void model_slot(const struct mp_coe *c, uint32_t model, uint32_t s, uint32_t *cl,
		       uint32_t *ce)
{
	uint32_t flat = c->models[model].first_slot + s;

	*cl = flat / c->c_experts;
	*ce = flat % c->c_experts;
}

int coe_model_load(struct mp_coe *c, struct mp_pager *p, uint32_t model, bool demand)
{
	uint32_t n = c->archs[c->models[model].arch].slots, ids[MP_MAX_TOPK], k = 0, layer = 0;
	int err = 0;

	for (uint32_t s = 0; s < n && !err; s++) {
		uint32_t cl, ce;

		model_slot(c, model, s, &cl, &ce);
		if (!demand) {
			err = mp_pager_prefetch(p, cl, ce, 1);
			err = err < 0 ? err : 0;
			continue;
		}
		/* Reported as routed: the pager reads them at once, as demand, in parallel. */
		if (k && (cl != layer || k == MP_MAX_TOPK)) {
			err = mp_pager_route(p, UINT32_MAX, 0, layer, ids, NULL, k);
			k = 0;
		}
		layer = cl;
		ids[k++] = ce;
	}
	if (!err && k)
		err = mp_pager_route(p, UINT32_MAX, 0, layer, ids, NULL, k);
	return err;
}

bool coe_model_host(struct mp_coe *c, struct mp_pager *p, uint32_t model)
{
	uint32_t cl, ce;

	model_slot(c, model, 0, &cl, &ce);
	return mp_pager_residency(p, cl, ce) == MP_RES_HOST;
}

struct touch {
	struct mp_coe *c;
	struct mp_pager *p;
	uint32_t model;
};

static int touch_slots(void *arg)
{
	struct touch *t = arg;
	uint32_t n = t->c->archs[t->c->models[t->model].arch].slots;

	for (uint32_t s = 0; s < n; s++) {
		uint32_t cl, ce;
		const volatile char *b;

		model_slot(t->c, t->model, s, &cl, &ce);
		b = mp_pager_expert(t->p, cl, ce);
		if (!b)
			return -EIO;
		(void)b[0];
	}
	return 0;
}

static int flush_slots(void *arg)
{
	struct touch *t = arg;
	uint32_t n = t->c->archs[t->c->models[t->model].arch].slots;

	for (uint32_t s = 0; s < n; s++) {
		uint32_t cl, ce;
		const char *b;

		model_slot(t->c, t->model, s, &cl, &ce);
		b = mp_pager_expert(t->p, cl, ce);
		if (!b)
			return -EIO;
#if defined(__x86_64__) || defined(__i386__)
		for (uint64_t o = 0; o < t->c->slot_bytes; o += 64)
			__builtin_ia32_clflush(b + o);
#endif
	}
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_mfence();
#endif
	return 0;
}

int coe_model_flush(struct mp_coe *c, struct mp_pager *p, uint32_t model)
{
	struct touch t = { c, p, model };

	return mp_pager_guard(p, flush_slots, &t);
}

int coe_model_touch(struct mp_coe *c, struct mp_pager *p, uint32_t model)
{
	struct touch t = { c, p, model };

	return mp_pager_guard(p, touch_slots, &t);
}

uint32_t coe_model_evict(struct mp_coe *c, struct mp_pager *p, uint32_t model, bool keep_host)
{
	uint32_t n = c->archs[c->models[model].arch].slots, busy = 0;
	/*
	 * Deferred: an expert a prefetch is still reading goes when the read
	 * ends. Left to the pager's own budget, its pages would push out that
	 * budget's least recently used expert instead: a pinned model's, say.
	 */
	unsigned flags = MP_EVICT_DEFER | (keep_host ? MP_EVICT_KEEP_HOST : 0);

	for (uint32_t s = 0; s < n; s++) {
		uint32_t cl, ce;
		int err;

		model_slot(c, model, s, &cl, &ce);
		err = mp_pager_evict(p, cl, ce, flags);
		/* -ENOENT: not in memory (never read, or the pager's own budget took it). */
		busy += err == -EBUSY;
	}
	return busy;
}
