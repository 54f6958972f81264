// SPDX-License-Identifier: MIT
/*
 * The local backend: one .mpk model, its experts resident or paged under a
 * budget (with a prefetcher that follows each request of the batch), a
 * runner and a scheduler, and the model's tokenizer when it has one; and
 * optionally expert adapters over it (ExpertWeave), each served as a model
 * of its own name.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "serve/backend.h"
#include "serve/metrics.h"
#include "text.h"

/* An adapter as a served model: slot i of the set. */
struct adapter_model {
	struct serve_model m;
	char name[MP_ADAPTER_NAME_MAX];
	const uint32_t *const *map;
	int index;
	uint32_t users;			/* requests holding it, under local.lock */
};

struct local {
	struct serve_backend b;
	struct serve_model m;
	char *name;
	struct mp_store *store;
	struct mp_engine *engine;
	struct mp_resident *resident;
	struct mp_pager *pager;
	struct mp_attach *attach;
	struct mp_prefetcher *prefetcher;
	struct mp_runner *runner;
	struct mp_tokenizer *tok;
	/* Closed by stop() while the HTTP thread may still cancel or read counters. */
	pthread_rwlock_t sched_lock;
	struct mp_sched *sched;
	struct serve_backend_ops ops;	/* local_ops, and the adapter operations with adapters */
	struct mp_adapters *adapters;
	char *adapter_dir;
	pthread_mutex_t lock;		/* am[].users and the model each slot's entry describes */
	struct adapter_model *am;	/* [slots] */
	uint32_t n_slots;
	/* Variants served together (cfg.consolidate): models[0] is m, over store. */
	struct mp_consolidation *map;
	struct mp_multi *multi;
	struct mp_store *more[MP_CONSOL_MAX_MODELS - 1];
	struct serve_model mm[MP_CONSOL_MAX_MODELS];
	char *mm_names[MP_CONSOL_MAX_MODELS];
	uint32_t n_models;
	struct dirent **adapter_files;	/* the directory's .mpa files, until loaded */
	int n_adapter_files;
	uint32_t e_max;			/* the set's E_max */
	/* The front end's per-step hook (local_on_step()), called under step_lock. */
	pthread_mutex_t step_lock;
	void (*step_fn)(void *arg);
	void *step_arg;
	uint64_t dense_lent, dense_read;	/* the runner's dense weights, from its open */
	/* The engine's threads as /metrics reads them (the scheduler's thread changes them). */
	_Atomic uint32_t threads;
	_Atomic uint64_t thread_changes;
};

static const struct serve_model *local_acquire(struct serve_backend *b, const char *name)
{
	struct local *l = (struct local *)b;
	const uint32_t *const *map;
	struct adapter_model *a;
	int i;

	if (!name || !*name || !strcmp(name, l->m.name))
		return &l->m;
	for (uint32_t i = 1; i < l->n_models; i++)
		if (!strcmp(name, l->mm[i].name))
			return &l->mm[i];
	if (!l->adapters || (i = mp_adapters_acquire(l->adapters, name, &map)) < 0)
		return NULL;
	a = &l->am[i];
	pthread_mutex_lock(&l->lock);
	/* The first user of a slot describes what it holds now; later ones read it. */
	if (!a->users++) {
		a->m = l->m;
		snprintf(a->name, sizeof(a->name), "%s", name);
		a->m.name = a->name;
		a->map = map;
		a->index = i;
	}
	pthread_mutex_unlock(&l->lock);
	return &a->m;
}

static void local_release(struct serve_backend *b, const struct serve_model *m)
{
	struct local *l = (struct local *)b;
	struct adapter_model *a;

	if (!m || m == &l->m || (m >= l->mm && m < l->mm + l->n_models))
		return;
	a = (struct adapter_model *)m;
	pthread_mutex_lock(&l->lock);
	a->users--;
	pthread_mutex_unlock(&l->lock);
	mp_adapters_release(l->adapters, a->index);
}

static uint32_t local_list(struct serve_backend *b, char (*names)[SERVE_NAME_MAX], uint32_t max)
{
	struct local *l = (struct local *)b;
	char name[MP_ADAPTER_NAME_MAX];
	uint32_t n = 0;

	if (max)
		snprintf(names[n++], SERVE_NAME_MAX, "%s", l->m.name);
	for (uint32_t i = 1; i < l->n_models && n < max; i++)
		snprintf(names[n++], SERVE_NAME_MAX, "%s", l->mm[i].name);
	for (uint32_t i = 0; l->adapters && i < l->n_slots && n < max; i++)
		if (!mp_adapters_name(l->adapters, i, name))
			snprintf(names[n++], SERVE_NAME_MAX, "%s", name);
	return n;
}

static int local_submit(struct serve_backend *b, const struct serve_model *m,
			const uint32_t *prompt, uint32_t n, const struct mp_sched_params *p,
			const struct mp_sched_callbacks *cb, uint64_t *id)
{
	struct local *l = (struct local *)b;
	struct mp_sched_params q = *p;

	int err = -ESHUTDOWN;

	if (l->multi) {
		/* Model i (the base is 0) runs with its maps and its dense weights. */
		q.model = m == &l->m ? 0 : (uint32_t)(m - l->mm);
		q.map = mp_multi_map(l->multi, q.model);
	} else if (m != &l->m) {
		q.map = ((const struct adapter_model *)m)->map;
	}
	pthread_rwlock_rdlock(&l->sched_lock);
	if (l->sched)
		err = mp_sched_submit(l->sched, prompt, n, &q, cb, id);
	pthread_rwlock_unlock(&l->sched_lock);
	return err;
}

static int local_cancel(struct serve_backend *b, const struct serve_model *m, uint64_t id)
{
	struct local *l = (struct local *)b;
	int err = -ENOENT;

	(void)m;
	pthread_rwlock_rdlock(&l->sched_lock);
	if (l->sched)
		err = mp_sched_cancel(l->sched, id);
	pthread_rwlock_unlock(&l->sched_lock);
	return err;
}

static void local_metrics(struct serve_backend *b, struct strbuf *out)
{
	struct local *l = (struct local *)b;
	struct mp_sched_stats ss;

	pthread_rwlock_rdlock(&l->sched_lock);
	if (l->sched) {
		mp_sched_stats(l->sched, &ss);
		metrics_sched(out, l->m.name, &ss);
	}
	pthread_rwlock_unlock(&l->sched_lock);
	metrics_dense(out, l->m.name, l->dense_lent, l->dense_read);
	metrics_threads(out, l->m.name, atomic_load(&l->threads), atomic_load(&l->thread_changes));
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
	if (l->multi) {
		struct mp_multi_stats ms;

		mp_multi_stats(l->multi, &ms);
		metrics_multi(out, l->m.name, &ms);
	}
	if (l->adapters) {
		struct mp_adapters_stats as;

		mp_adapters_stats(l->adapters, &as);
		metrics_adapters(out, l->m.name, &as);
	}
}

void serve_local_stats(struct serve_backend *b, struct serve_local_stats *out)
{
	struct local *l = (struct local *)b;

	memset(out, 0, sizeof(*out));
	pthread_rwlock_rdlock(&l->sched_lock);
	if (l->sched)
		mp_sched_stats(l->sched, &out->sched);
	pthread_rwlock_unlock(&l->sched_lock);
	if (l->pager)
		mp_pager_stats(l->pager, &out->pager);
	if (l->multi)
		mp_multi_stats(l->multi, &out->multi);
	if (l->runner)
		mp_runner_layer_times(l->runner, &out->layers);
	if (l->prefetcher)
		mp_prefetcher_stats(l->prefetcher, &out->prefetch);
}

struct threads_call {
	struct local *l;
	uint32_t threads;
	uint32_t before;		/* read where the change is made: calls run one at a time */
	char why[256];
};

/* On the scheduler's thread, between two steps: no engine op runs. */
static int threads_change(void *arg)
{
	struct threads_call *t = arg;
	int err;

	t->before = atomic_load(&t->l->threads);
	if (t->threads == t->before)
		return 0;
	err = mp_engine_set_threads(t->l->engine, t->threads);
	if (err) {
		snprintf(t->why, sizeof(t->why), "%s", mp_last_error());
		return err;
	}
	atomic_store(&t->l->threads, t->threads);
	atomic_fetch_add(&t->l->thread_changes, 1);
	return 0;
}

static int local_set_threads(struct serve_backend *b, uint32_t threads, uint32_t *before,
			     char *why, size_t len)
{
	struct local *l = (struct local *)b;
	struct threads_call t = { .l = l, .threads = threads };
	int err = -ESHUTDOWN;

	pthread_rwlock_rdlock(&l->sched_lock);
	if (l->sched)
		err = mp_sched_call(l->sched, threads_change, &t);
	pthread_rwlock_unlock(&l->sched_lock);
	*before = err ? atomic_load(&l->threads) : t.before;
	if (err == -ESHUTDOWN)
		snprintf(why, len, "the server is shutting down");
	else if (err)
		snprintf(why, len, "%s", t.why);
	return err;
}

/* From the thread that stops the server, while the scheduler is open. */
static int local_drain(struct serve_backend *b, uint32_t timeout_ms)
{
	return mp_sched_drain(((struct local *)b)->sched, timeout_ms);
}

static void local_stop(struct serve_backend *b)
{
	struct local *l = (struct local *)b;

	pthread_rwlock_wrlock(&l->sched_lock);
	mp_sched_close(l->sched);
	l->sched = NULL;
	pthread_rwlock_unlock(&l->sched_lock);
}

static void local_close(struct serve_backend *b)
{
	struct local *l = (struct local *)b;

	if (!l)
		return;
	mp_sched_close(l->sched);
	pthread_rwlock_destroy(&l->sched_lock);
	pthread_mutex_destroy(&l->step_lock);
	mp_runner_close(l->runner);
	mp_adapters_close(l->adapters);
	/* The prefetcher borrows the set's maps. */
	if (l->prefetcher)
		mp_prefetcher_set_models(l->prefetcher, NULL, 0, 0);
	mp_multi_close(l->multi);
	mp_consolidation_close(l->map);
	for (uint32_t i = 0; i < MP_CONSOL_MAX_MODELS - 1; i++) {
		mp_store_close(l->more[i]);
		free(l->mm_names[i + 1]);
	}
	if (l->am)
		pthread_mutex_destroy(&l->lock);
	free(l->am);
	free(l->adapter_dir);
	for (int i = 0; l->adapter_files && i < l->n_adapter_files; i++)
		free(l->adapter_files[i]);
	free(l->adapter_files);
	mp_prefetcher_close(l->prefetcher);
	mp_pager_close(l->pager);
	mp_attach_close(l->attach);
	mp_resident_close(l->resident);
	mp_engine_close(l->engine);
	mp_tokenizer_close(l->tok);
	mp_store_close(l->store);
	free(l->name);
	free(l);
}

/* A file name inside the adapter directory: no directories, nothing hidden. */
static int adapter_path(struct local *l, const char *file, char *path, size_t len)
{
	size_t n = strlen(file);

	if (n < 5 || strchr(file, '/') || file[0] == '.' || strcmp(file + n - 4, ".mpa"))
		return -EINVAL;
	if ((size_t)snprintf(path, len, "%s/%s", l->adapter_dir, file) >= len)
		return -ENAMETOOLONG;
	return 0;
}

static int local_adapter_load(struct serve_backend *b, const char *file, const char *name,
			      char *why, size_t len)
{
	struct local *l = (struct local *)b;
	char path[4096];
	int err;

	err = adapter_path(l, file, path, sizeof(path));
	if (err) {
		snprintf(why, len, "'%s' is not the name of an .mpa file in the adapter directory",
			 file);
		return err;
	}
	err = mp_adapters_load(l->adapters, path, name);
	if (err < 0)
		snprintf(why, len, "%s", mp_last_error());
	return err < 0 ? err : 0;
}

static int local_adapter_unload(struct serve_backend *b, const char *name)
{
	return mp_adapters_unload(((struct local *)b)->adapters, name);
}

static char *local_adapters_json(struct serve_backend *b)
{
	struct local *l = (struct local *)b;
	char name[MP_ADAPTER_NAME_MAX];
	struct mp_adapters_stats st;
	json_t *root, *names = json_array();
	char *s = NULL;

	mp_adapters_stats(l->adapters, &st);
	for (uint32_t i = 0; names && i < l->n_slots; i++)
		if (!mp_adapters_name(l->adapters, i, name))
			json_array_append_new(names, json_string(name));
	root = json_pack("{s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I}",
			 "base", l->m.name, "loaded", names ? names : json_array(),
			 "draining", (json_int_t)st.draining, "slots", (json_int_t)st.slots,
			 "e_max", (json_int_t)st.e_max, "adapter_bytes", (json_int_t)st.adapter_bytes,
			 "held_bytes", (json_int_t)st.held_bytes,
			 "padded_bytes", (json_int_t)st.padded_bytes, "f_mem", st.f_mem,
			 "loads", (json_int_t)st.loads, "unloads", (json_int_t)st.unloads,
			 "load_errors", (json_int_t)st.load_errors);
	if (root)
		s = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	return s;
}

/* The scheduler's on_step: the front end's hook, if it set one. */
static void local_step(void *arg)
{
	struct local *l = arg;

	pthread_mutex_lock(&l->step_lock);
	if (l->step_fn)
		l->step_fn(l->step_arg);
	pthread_mutex_unlock(&l->step_lock);
}

static void local_on_step(struct serve_backend *b, void (*fn)(void *arg), void *arg)
{
	struct local *l = (struct local *)b;

	pthread_mutex_lock(&l->step_lock);
	l->step_fn = fn;
	l->step_arg = arg;
	pthread_mutex_unlock(&l->step_lock);
}

static const struct serve_backend_ops local_ops = {
	.name = "local",
	.acquire = local_acquire,
	.release = local_release,
	.list = local_list,
	.submit = local_submit,
	.cancel = local_cancel,
	.metrics = local_metrics,
	.drain = local_drain,
	.stop = local_stop,
	.on_step = local_on_step,
	.set_threads = local_set_threads,
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

/*
 * Experts in memory, paged under the budget with a prefetcher between the
 * runner and the pager, or read from a pager daemon's shared host tier.
 */
static int open_source(struct local *l, const struct serve_local_config *cfg,
		       struct mp_runner_config *rc)
{
	struct mp_pager_config pc = { .budget = cfg->budget, .fault = cfg->fault };
	struct mp_prefetcher_config fc = { .policy = cfg->prefetch,
					   .requests = cfg->sched.max_batch ?
						       cfg->sched.max_batch : 8 };
	int err;

	if (cfg->attach) {
		err = mp_attach_open(l->store, cfg->attach, &l->attach);
		rc->source = mp_attach_source_ops();
		rc->source_ctx = l->attach;
		return err;
	}
	if (!cfg->budget) {
		err = mp_resident_open(l->store, NULL, NULL, &l->resident);
		/*
		 * Packed only where the runner reads the experts itself: adapters
		 * and co-served models read the base rows in the file's order.
		 */
		if (!err && !cfg->adapters && !cfg->consolidate)
			err = cli_resident_pack(l->resident, l->engine, &rc->flags);
		rc->source = mp_resident_source_ops();
		rc->source_ctx = l->resident;
		return err;
	}
	pc.eviction = cfg->evict ? cfg->evict : paper_evict(cfg->prefetch);
	/* Every model's experts have rows: model i's expert e is row i x E + e. */
	if (cfg->consolidate)
		pc.slots_per_layer = (1 + cfg->n_more) * mp_store_geometry(l->store)->experts;
	/* Adapter rows are paged too: the range holds the set's M + N x E_max rows. */
	if (cfg->adapters && !cfg->adapters_padded)
		pc.slots_per_layer = mp_store_geometry(l->store)->experts +
				     (cfg->adapter_slots ? cfg->adapter_slots :
				      MP_ADAPTERS_DEFAULT_SLOTS) * l->e_max;
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

static int is_adapter_file(const struct dirent *d)
{
	size_t n = strlen(d->d_name);

	return d->d_name[0] != '.' && n > 4 && !strcmp(d->d_name + n - 4, ".mpa");
}

/* E_max: the most experts any adapter of the directory replaces in a layer (unreadable: 1). */
static uint32_t dir_e_max(struct local *l, struct dirent **files, int n)
{
	uint32_t e_max = 1;

	for (int i = 0; i < n; i++) {
		char path[4096];
		struct mp_adapter *a;

		snprintf(path, sizeof(path), "%s/%s", l->adapter_dir, files[i]->d_name);
		if (mp_adapter_open(path, &a))
			continue;
		if (mp_adapter_max_per_layer(a) > e_max)
			e_max = mp_adapter_max_per_layer(a);
		mp_adapter_close(a);
	}
	return e_max;
}

/* The adapter directory's files and the set's E_max, before the pager is sized for them. */
static int scan_adapters(struct local *l, const struct serve_local_config *cfg)
{
	int err;

	l->adapter_dir = strdup(cfg->adapters);
	l->n_adapter_files = scandir(cfg->adapters, &l->adapter_files, is_adapter_file,
				     alphasort);
	if (!l->adapter_dir || l->n_adapter_files < 0) {
		err = l->adapter_dir ? -errno : -ENOMEM;
		return cli_error(err, "adapter directory %s: %s", cfg->adapters, strerror(-err));
	}
	l->e_max = cfg->adapter_rows ? cfg->adapter_rows :
		   dir_e_max(l, l->adapter_files, l->n_adapter_files);
	return 0;
}

/*
 * The adapter set between the runner and the base's source, and every
 * adapter of the directory loaded; one that cannot be is reported and
 * skipped, the others are served. Under a budget its rows are the pager's.
 */
static int open_adapters(struct local *l, const struct serve_local_config *cfg,
			 struct mp_runner_config *rc)
{
	struct mp_adapters_config ac = { .base = l->store, .source = rc->source,
					 .source_ctx = rc->source_ctx, .slots = cfg->adapter_slots,
					 .e_max = l->e_max, .padded = cfg->adapters_padded };
	struct dirent **files = l->adapter_files;
	int n = l->n_adapter_files, err;

	if (l->pager && !cfg->adapters_padded) {
		ac.rows = mp_pager_row_ops();
		ac.rows_ctx = l->pager;
		ac.warm_rows = cfg->warm_rows;
	}
	l->adapter_files = NULL;
	err = mp_adapters_open(&ac, &l->adapters);
	if (!err) {
		struct mp_adapters_stats st;

		mp_adapters_stats(l->adapters, &st);
		l->n_slots = st.slots;
		l->am = calloc(l->n_slots, sizeof(*l->am));
		err = l->am ? 0 : -ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		char why[512];

		if (!err && local_adapter_load(&l->b, files[i]->d_name, NULL, why, sizeof(why)))
			cli_say("adapter %s not loaded: %s", files[i]->d_name, why);
		free(files[i]);
	}
	free(files);
	if (err)
		return err;
	pthread_mutex_init(&l->lock, NULL);
	rc->source = mp_adapters_source_ops();
	rc->source_ctx = l->adapters;
	rc->expert_rows = mp_adapters_rows(l->adapters);
	return 0;
}

/*
 * The other variants and the map (which must list the models in their
 * order), the set over the pager's source: owned positions in memory, the
 * others' unowned experts bound as pager rows.
 */
static int open_multi(struct local *l, const struct serve_local_config *cfg,
		      struct mp_runner_config *rc)
{
	struct mp_store *models[MP_CONSOL_MAX_MODELS] = { l->store };
	struct mp_multi_config mc = { .models = models, .n = 1 + cfg->n_more,
				      .flags = cfg->owned_paged ? MP_MULTI_OWNED_PAGED : 0,
				      .source = rc->source, .source_ctx = rc->source_ctx,
				      .rows = mp_pager_row_ops(), .rows_ctx = l->pager };
	int err = 0;

	for (uint32_t i = 0; i < cfg->n_more && !err; i++) {
		err = mp_store_open(cfg->more[i], &l->more[i]);
		models[i + 1] = l->more[i];
	}
	if (!err)
		err = mp_consolidation_open(cfg->consolidate, &l->map);
	if (err)
		return err;
	mc.map = l->map;
	err = mp_multi_open(&mc, &l->multi);
	if (err)
		return err;
	rc->source = mp_multi_source_ops();
	rc->source_ctx = l->multi;
	rc->expert_rows = mp_multi_rows(l->multi);
	if (l->prefetcher) {
		const uint32_t *const *maps[MP_CONSOL_MAX_MODELS];

		for (uint32_t x = 0; x < mc.n; x++)
			maps[x] = mp_multi_prefetch_map(l->multi, x);
		err = mp_prefetcher_set_models(l->prefetcher, maps, mc.n,
					       cfg->shared_store ? MP_PREFETCH_ONE_STORE : 0);
	}
	return err;
}

char *serve_model_name(const char *path)
{
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	size_t len = strlen(base);

	if (len > 4 && !strcmp(base + len - 4, ".mpk"))
		len -= 4;
	return strndup(base, len);
}

/* The other models' dense weights in the runner (swapped in as requests need them), named. */
static int add_models(struct local *l, const struct serve_local_config *cfg)
{
	int err = 0;

	l->n_models = 1 + cfg->n_more;
	for (uint32_t i = 1; i < l->n_models && !err; i++) {
		int index = mp_runner_add_model(l->runner, l->more[i - 1]);

		err = index == (int)i ? 0 : index < 0 ? index : -EINVAL;
		l->mm_names[i] = serve_model_name(cfg->more[i - 1]);
		if (!err && !l->mm_names[i])
			err = -ENOMEM;
		for (uint32_t j = 0; !err && j < i; j++) {
			if (strcmp(l->mm_names[i], j ? l->mm_names[j] : l->name))
				continue;
			err = cli_error(-EINVAL, "two models are called '%s': rename a file",
					l->mm_names[i]);
		}
	}
	if (err || cfg->mixed)
		return err;
	return mp_runner_activate(l->runner, 0);
}

/*
 * Time-sharing: the model just activated starts from an empty pager (rows
 * being read or pinned stay; nothing reads them once the batch is empty).
 */
static void evict_all(void *arg, uint32_t model)
{
	struct local *l = arg;
	const struct mp_geometry *g = mp_store_geometry(l->store);

	(void)model;
	for (uint32_t layer = 0; layer < g->layers; layer++)
		for (uint32_t row = 0; row < l->n_models * g->experts; row++)
			mp_pager_evict(l->pager, layer, row, 0);
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

/* Reads the experts a new server is to start with (cfg->warm), so its first requests do not. */
static int warm(struct local *l, uint32_t *warmed)
{
	const struct mp_geometry *g = mp_store_geometry(l->store);
	uint64_t stride = (mp_store_expert_bytes(l->store) + 4095) & ~4095ull;
	uint64_t fit;
	int err = 0;

	*warmed = 0;
	if (l->attach)
		return mp_attach_warm(l->attach, warmed);
	if (!l->pager)
		return 0;
	fit = mp_pager_budget(l->pager) / stride;
	for (uint64_t i = 0; !err && i < fit && i < (uint64_t)g->layers * g->experts; i++) {
		int r = mp_pager_prefetch(l->pager, (uint32_t)(i / g->experts),
					  (uint32_t)(i % g->experts), 0);

		err = r < 0 ? r : 0;
		*warmed += r >= 0;
	}
	return err ? err : mp_pager_wait_idle(l->pager, 600000);
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
	pthread_rwlock_init(&l->sched_lock, NULL);
	pthread_mutex_init(&l->step_lock, NULL);
	l->name = cfg->name ? strdup(cfg->name) : serve_model_name(cfg->model);
	err = l->name ? mp_store_open(cfg->model, &l->store) : -ENOMEM;
	if (!err)
		err = open_tokenizer(l, cfg);
	if (!err)
		err = mp_engine_open(cfg->engine ? cfg->engine : "ref", &ec, &l->engine);
	if (!err)
		atomic_store(&l->threads, l->engine->threads);
	if (!err && cfg->adapters)
		err = scan_adapters(l, cfg);
	if (!err)
		err = open_source(l, cfg, &rc);
	if (!err && cfg->adapters)
		err = open_adapters(l, cfg, &rc);
	if (!err && cfg->consolidate)
		err = open_multi(l, cfg, &rc);
	if (!err && cfg->warm) {
		uint64_t t = cli_now_ns();

		err = warm(l, cfg->warmed);
		*cfg->warm_s = (double)(cli_now_ns() - t) / 1e9;
	}
	if (!err) {
		struct mp_runner_stats rs;

		rc.engine = l->engine;
		rc.flags |= cfg->layer_times ? MP_RUNNER_LAYER_TIMES : 0;
		err = mp_runner_open(l->store, &rc, &l->runner);
		if (!err) {
			mp_runner_stats(l->runner, &rs);
			l->dense_lent = rs.dense_lent_bytes;
			l->dense_read = rs.dense_read_bytes;
		}
	}
	if (!err && cfg->consolidate)
		err = add_models(l, cfg);
	if (!err && cfg->timeshare && cfg->mixed) {
		err = cli_error(-EINVAL, "time-sharing swaps models; mixed batches do not");
	}
	if (!err && cfg->timeshare && !(l->pager && cfg->consolidate)) {
		err = cli_error(-EINVAL, "time-sharing needs several models and a budget");
	}
	if (!err && cfg->timeshare) {
		sc.on_swap = evict_all;
		sc.on_swap_arg = l;
	}
	if (!err) {
		sc.runner = l->runner;
		sc.on_step = local_step;
		sc.on_step_arg = l;
		err = mp_sched_open(&sc, &l->sched);
	}
	if (err) {
		local_close(&l->b);
		return err;
	}
	l->ops = local_ops;
	if (l->adapters) {
		l->ops.adapter_load = local_adapter_load;
		l->ops.adapter_unload = local_adapter_unload;
		l->ops.adapters_json = local_adapters_json;
	}
	l->b.ops = &l->ops;
	g = mp_store_geometry(l->store);
	l->m = (struct serve_model){
		.name = l->name, .tok = l->tok, .vocab = g->vocab, .context = g->max_seq,
		.bos = l->tok ? mp_tokenizer_bos(l->tok) : UINT32_MAX,
		.eos = l->tok ? mp_tokenizer_eos(l->tok) : UINT32_MAX,
	};
	for (uint32_t i = 1; i < l->n_models; i++) {
		l->mm[i] = l->m;
		l->mm[i].name = l->mm_names[i];
	}
	*out = &l->b;
	return 0;
}
