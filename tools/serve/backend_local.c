// SPDX-License-Identifier: MIT
/*
 * The local backend: one .mpk model, its experts resident or paged under a
 * budget (with a prefetcher that follows each request of the batch), a
 * runner and a scheduler, and the model's tokenizer when it has one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/backend.h"
#include "serve/metrics.h"
#include "text.h"

struct local {
	struct serve_backend b;
	struct serve_model m;
	char *name;
	struct mp_store *store;
	struct mp_engine *engine;
	struct mp_resident *resident;
	struct mp_pager *pager;
	struct mp_prefetcher *prefetcher;
	struct mp_runner *runner;
	struct mp_tokenizer *tok;
	struct mp_sched *sched;
};

static const struct serve_model *local_model(struct serve_backend *b, uint32_t i)
{
	struct local *l = (struct local *)b;

	return i == 0 ? &l->m : NULL;
}

static int local_submit(struct serve_backend *b, const struct serve_model *m,
			const uint32_t *prompt, uint32_t n, const struct mp_sched_params *p,
			const struct mp_sched_callbacks *cb, uint64_t *id)
{
	(void)m;
	return mp_sched_submit(((struct local *)b)->sched, prompt, n, p, cb, id);
}

static int local_cancel(struct serve_backend *b, const struct serve_model *m, uint64_t id)
{
	(void)m;
	return mp_sched_cancel(((struct local *)b)->sched, id);
}

static void local_metrics(struct serve_backend *b, struct strbuf *out)
{
	struct local *l = (struct local *)b;
	struct mp_sched_stats ss;

	mp_sched_stats(l->sched, &ss);
	metrics_sched(out, l->m.name, &ss);
	if (l->pager) {
		struct mp_pager_stats ps;

		mp_pager_stats(l->pager, &ps);
		metrics_pager(out, l->m.name, &ps);
	}
	if (l->prefetcher) {
		struct mp_prefetcher_stats fs;

		mp_prefetcher_stats(l->prefetcher, &fs);
		metrics_prefetcher(out, l->m.name, &fs);
	}
}

static int local_drain(struct serve_backend *b, uint32_t timeout_ms)
{
	return mp_sched_drain(((struct local *)b)->sched, timeout_ms);
}

static void local_close(struct serve_backend *b)
{
	struct local *l = (struct local *)b;

	if (!l)
		return;
	mp_sched_close(l->sched);
	mp_runner_close(l->runner);
	mp_prefetcher_close(l->prefetcher);
	mp_pager_close(l->pager);
	mp_resident_close(l->resident);
	mp_engine_close(l->engine);
	mp_tokenizer_close(l->tok);
	mp_store_close(l->store);
	free(l->name);
	free(l);
}

static const struct serve_backend_ops local_ops = {
	.name = "local",
	.model = local_model,
	.submit = local_submit,
	.cancel = local_cancel,
	.metrics = local_metrics,
	.drain = local_drain,
	.close = local_close,
};

/* The eviction each prefetch policy's paper pairs it with. */
static const char *paper_evict(const char *prefetch)
{
	static const char *const pairs[][2] = {
		{ "finemoe", "finemoe" }, { "eam", "lfu" }, { "dependency", "coserve" },
	};

	for (size_t i = 0; prefetch && i < sizeof(pairs) / sizeof(pairs[0]); i++)
		if (!strcmp(prefetch, pairs[i][0]))
			return pairs[i][1];
	return "lru";
}

/* Experts in memory, or paged under the budget with a prefetcher between the runner and the pager. */
static int open_source(struct local *l, const struct serve_local_config *cfg,
		       struct mp_runner_config *rc)
{
	struct mp_pager_config pc = { .budget = cfg->budget };
	struct mp_prefetcher_config fc = { .policy = cfg->prefetch,
					   .requests = cfg->sched.max_batch ?
						       cfg->sched.max_batch : 8 };
	int err;

	if (!cfg->budget) {
		err = mp_resident_open(l->store, NULL, NULL, &l->resident);
		rc->source = mp_resident_source_ops();
		rc->source_ctx = l->resident;
		return err;
	}
	pc.eviction = cfg->evict ? cfg->evict : paper_evict(cfg->prefetch);
	err = mp_prefetch_check_names(cfg->prefetch, pc.eviction);
	if (!err)
		err = mp_pager_open(l->store, &pc, &l->pager);
	if (err)
		return err;
	rc->source = mp_pager_source_ops();
	rc->source_ctx = l->pager;
	if (!cfg->prefetch || !strcmp(cfg->prefetch, "none"))
		return 0;
	/* Each request's token embedding is its iteration's semantic vector. */
	fc.sem.dim = mp_store_geometry(l->store)->hidden;
	err = mp_prefetcher_open(l->pager, &fc, &l->prefetcher);
	rc->source = mp_prefetcher_source_ops();
	rc->source_ctx = l->prefetcher;
	return err;
}

/* The tokenizer beside the model (MODEL.tok), when there is one; else prompts are ids. */
static int open_tokenizer(struct local *l, const struct serve_local_config *cfg)
{
	const struct mp_geometry *g = mp_store_geometry(l->store);
	size_t len = strlen(cfg->model);
	char guess[4096];

	if (!cfg->tokenizer) {
		if (len > 4 && !strcmp(cfg->model + len - 4, ".mpk"))
			len -= 4;
		snprintf(guess, sizeof(guess), "%.*s.tok", (int)len, cfg->model);
		if (access(guess, R_OK))
			return 0;
	}
	return text_tokenizer_open(cfg->tokenizer, cfg->model, g->vocab, &l->tok);
}

static char *model_name(const char *path)
{
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	size_t len = strlen(base);

	if (len > 4 && !strcmp(base + len - 4, ".mpk"))
		len -= 4;
	return strndup(base, len);
}

int serve_local_open(const struct serve_local_config *cfg, struct serve_backend **out)
{
	struct mp_engine_config ec = { .threads = cfg->threads };
	struct mp_runner_config rc = { 0 };
	struct mp_sched_config sc = cfg->sched;
	struct local *l = calloc(1, sizeof(*l));
	const struct mp_geometry *g;
	int err;

	if (!l)
		return -ENOMEM;
	l->b.ops = &local_ops;
	l->name = cfg->name ? strdup(cfg->name) : model_name(cfg->model);
	err = l->name ? mp_store_open(cfg->model, &l->store) : -ENOMEM;
	if (!err)
		err = open_tokenizer(l, cfg);
	if (!err)
		err = mp_engine_open(cfg->engine ? cfg->engine : "ref", &ec, &l->engine);
	if (!err)
		err = open_source(l, cfg, &rc);
	if (!err) {
		rc.engine = l->engine;
		err = mp_runner_open(l->store, &rc, &l->runner);
	}
	if (!err) {
		sc.runner = l->runner;
		err = mp_sched_open(&sc, &l->sched);
	}
	if (err) {
		local_close(&l->b);
		return err;
	}
	g = mp_store_geometry(l->store);
	l->m = (struct serve_model){
		.name = l->name, .tok = l->tok, .vocab = g->vocab, .context = g->max_seq,
		.bos = l->tok ? mp_tokenizer_bos(l->tok) : UINT32_MAX,
		.eos = l->tok ? mp_tokenizer_eos(l->tok) : UINT32_MAX,
	};
	*out = &l->b;
	return 0;
}

const struct serve_model *serve_model_find(struct serve_backend *b, const char *name)
{
	const struct serve_model *m;

	for (uint32_t i = 0; (m = b->ops->model(b, i)); i++)
		if (!name || !*name || !strcmp(name, m->name))
			return m;
	return NULL;
}
