// SPDX-License-Identifier: MIT
/*
 * bench-adapters' inputs and setups: the adapter files and their replicas,
 * the request stream, and each setup deployed over the base (weave, base,
 * padded) or as one merged model per adapter (merged), resident or paged.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "bench/adapterbench.h"

const char *const ab_kind_names[AB_KINDS] = { "weave", "base", "padded", "merged" };

static int is_mpa(const struct dirent *d)
{
	size_t n = strlen(d->d_name);

	return d->d_name[0] != '.' && n > 4 && !strcmp(d->d_name + n - 4, ".mpa");
}

/* An adapter file: made for the base, its name and sizes. */
static int read_file(struct ab_bench *b, const char *dir, const char *name, struct ab_file *f)
{
	struct mp_adapter *a;
	int err;

	if (asprintf(&f->path, "%s/%s", dir, name) < 0) {
		f->path = NULL;
		return -ENOMEM;
	}
	err = mp_adapter_open(f->path, &a);
	if (!err)
		err = mp_adapter_check_base(a, b->base);
	if (!err) {
		snprintf(f->name, sizeof(f->name), "%s", mp_adapter_name(a));
		f->experts = mp_adapter_count(a);
		f->max_per_layer = mp_adapter_max_per_layer(a);
	}
	mp_adapter_close(a);
	return err ? cli_fail(err, "%s", f->path) : 0;
}

static int read_files(struct ab_bench *b)
{
	struct dirent **ents = NULL;
	int n = scandir(b->o->adapters, &ents, is_mpa, alphasort), err = 0;

	if (n <= 0) {
		cli_error(0, "--adapters %s: %s", b->o->adapters,
			n < 0 ? strerror(errno) : "no .mpa file in it");
		free(ents);
		return n < 0 ? -errno : -ENOENT;
	}
	b->files = calloc((size_t)n, sizeof(*b->files));
	err = b->files ? 0 : -ENOMEM;
	for (int i = 0; i < n; i++) {
		if (!err && b->n_files < AB_MAX_ADAPTERS)
			err = read_file(b, b->o->adapters, ents[i]->d_name, &b->files[b->n_files++]);
		free(ents[i]);
	}
	free(ents);
	return err;
}

/* N adapters from the files round-robin: replica r >= 1 of a file is "NAME#(r+1)". */
static int name_adapters(struct ab_bench *b)
{
	uint32_t n = b->o->replicate ? b->o->replicate : b->n_files;

	b->adapters = calloc(n, sizeof(*b->adapters));
	if (!b->adapters)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		struct ab_adapter *a = &b->adapters[i];
		uint32_t round = i / b->n_files;
		int len;

		a->file = i % b->n_files;
		len = round ? snprintf(a->name, sizeof(a->name), "%s#%u", b->files[a->file].name,
				       round + 1) :
			      snprintf(a->name, sizeof(a->name), "%s", b->files[a->file].name);
		if (len >= (int)sizeof(a->name))
			return cli_error(-ENAMETOOLONG, "replica name of '%s' is too long",
				b->files[a->file].name);
		if (b->files[a->file].max_per_layer > b->e_max)
			b->e_max = b->files[a->file].max_per_layer;
	}
	b->n_adapters = n;
	return 0;
}

/* Poisson arrivals at --rate, adapters by power-law shares, random prompt ids. */
static int draw_stream(struct ab_bench *b)
{
	const struct ab_opts *o = b->o;
	uint32_t vocab = mp_store_geometry(b->base)->vocab;
	uint64_t rng = o->seed ^ 0x6164617074657273ull;
	double cdf[AB_MAX_ADAPTERS], t = 0;

	b->reqs = calloc(o->requests, sizeof(*b->reqs));
	if (!b->reqs)
		return -ENOMEM;
	cli_power_cdf(cdf, b->n_adapters, o->mix_alpha);
	for (uint32_t i = 0; i < o->requests; i++) {
		struct ab_req *r = &b->reqs[i];

		t += -log(cli_rand_unit(&rng)) / o->rate;
		r->t_arrive = t;
		r->adapter = cli_power_pick(cdf, b->n_adapters, cli_rand_unit(&rng));
		r->prompt = malloc(o->prompt_tokens * sizeof(*r->prompt));
		if (!r->prompt)
			return -ENOMEM;
		for (uint32_t j = 0; j < o->prompt_tokens; j++)
			r->prompt[j] = (uint32_t)(cli_rand_unit(&rng) * vocab) % vocab;
	}
	return 0;
}

int ab_bench_open(struct ab_bench *b, const struct ab_opts *o)
{
	struct mp_engine_config ec = { .threads = o->eng.threads };
	int err;

	memset(b, 0, sizeof(*b));
	b->o = o;
	err = mp_store_open(o->model, &b->base);
	if (!err && o->budget)
		err = mp_budget_parse(o->budget, mp_store_total_expert_bytes(b->base), &b->budget);
	if (err)
		return err;
	err = read_files(b);
	if (!err)
		err = name_adapters(b);
	if (!err && o->e_max && o->e_max < b->e_max)
		err = cli_error(-EINVAL, "--e-max %u is below the %u experts an "
			"adapter replaces in a layer", o->e_max, b->e_max);
	if (!err && o->e_max)
		b->e_max = o->e_max;
	if (!err)
		err = draw_stream(b);
	if (!err)
		err = mp_engine_open(o->eng.engine ? o->eng.engine : "ref", &ec, &b->engine);
	if (!err)
		err = mp_membw_open(b->engine, 0, &b->membw);
	if (err == -ENOMEM)
		cli_error(0, "out of memory");
	return err;
}

void ab_bench_close(struct ab_bench *b)
{
	for (uint32_t i = 0; b->reqs && i < b->o->requests; i++)
		free(b->reqs[i].prompt);
	free(b->reqs);
	for (uint32_t i = 0; i < b->n_files; i++) {
		if (b->files[i].merged)
			unlink(b->files[i].merged);
		free(b->files[i].merged);
		free(b->files[i].path);
	}
	if (b->tmpdir[0])
		rmdir(b->tmpdir);
	free(b->files);
	free(b->adapters);
	mp_resident_close(b->resident);
	mp_membw_close(b->membw);
	mp_engine_close(b->engine);
	mp_store_close(b->base);
}

/*
 * Setups
 */

/* Refuses a setup that would not fit in the machine's available memory (shared: keep 10%). */
static int check_memory(enum ab_kind kind, uint64_t need)
{
	char line[256];
	unsigned long long kb = 0;
	FILE *f = fopen("/proc/meminfo", "re");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	if (!kb || need <= kb * 1024 / 10 * 9)
		return 0;
	return cli_error(-ENOMEM, "the %s setup needs %.2f GB of expert memory, "
		"more than the %.2f GB available here: run fewer adapters, other --setups, or "
		"page the experts with --budget", ab_kind_names[kind], need / 1e9,
		kb * 1024 / 1e9);
}

/* With --prefetch, a prefetcher between the runner and the instance's pager. */
static int inst_prefetcher(struct ab_bench *b, struct ab_inst *in)
{
	struct mp_prefetcher_config fc = { .policy = b->o->prefetch,
					   .requests = b->o->max_batch };
	int err;

	if (!b->o->prefetch)
		return 0;
	/* Each request's token embedding is its iteration's semantic vector, as serve does. */
	fc.sem.dim = mp_store_geometry(in->store)->hidden;
	err = mp_prefetcher_open(in->pager, &fc, &in->prefetcher);
	if (err)
		return err;
	b->pf_no_rows = *mp_prefetcher_source_ops();
	b->pf_no_rows.seq_map = NULL;
	in->source = b->o->no_row_prefetch ? &b->pf_no_rows : mp_prefetcher_source_ops();
	in->source_ctx = in->prefetcher;
	return 0;
}

/*
 * The instance's experts: resident (the base's shared by the setups over
 * it), or paged under budget bytes (from the file, O_DIRECT) in a range of
 * rows per layer (0: the pager's default).
 */
static int inst_source(struct ab_bench *b, struct ab_inst *in, uint64_t budget, uint32_t rows)
{
	int err = 0;

	if (!budget && in->store == b->base) {
		if (!b->resident)
			err = mp_resident_open(b->base, NULL, NULL, &b->resident);
		in->source = mp_resident_source_ops();
		in->source_ctx = b->resident;
	} else if (!budget) {
		err = mp_resident_open(in->store, NULL, NULL, &in->resident);
		in->source = mp_resident_source_ops();
		in->source_ctx = in->resident;
	} else {
		err = mp_pager_open(in->store, &(struct mp_pager_config){
					.budget_bytes = budget, .slots_per_layer = rows }, &in->pager);
		in->source = mp_pager_source_ops();
		in->source_ctx = in->pager;
		if (!err)
			err = inst_prefetcher(b, in);
	}
	return err;
}

static int inst_runner(struct ab_bench *b, struct ab_inst *in, uint32_t expert_rows)
{
	struct mp_runner_config rc = {
		.engine = in->engine, .source = in->source, .source_ctx = in->source_ctx,
		.max_seq = b->o->prompt_tokens + b->o->max_tokens + 1, .expert_rows = expert_rows,
	};

	return mp_runner_open(in->store, &rc, &in->runner);
}

static int one_inst(struct ab_setup *s)
{
	s->inst = calloc(1, sizeof(*s->inst));
	if (!s->inst)
		return -ENOMEM;
	s->n_inst = 1;
	s->inst->store = s->b->base;
	s->inst->engine = s->b->engine;
	return 0;
}

/* What the adapters will hold, before loading them (for the memory check). */
static uint64_t adapters_need(const struct ab_bench *b, bool padded)
{
	uint64_t stride = (mp_store_expert_bytes(b->base) + 4095) & ~4095ull, n = 0;

	for (uint32_t i = 0; i < b->n_adapters; i++)
		n += padded ? (uint64_t)mp_store_geometry(b->base)->layers * b->e_max :
			      b->files[b->adapters[i].file].experts;
	return n * stride;
}

/* Loads every adapter into its slot and holds its maps for the whole run. */
static int load_adapters(struct ab_setup *s)
{
	struct ab_bench *b = s->b;

	for (uint32_t i = 0; i < b->n_adapters; i++) {
		int slot = mp_adapters_load(s->set, b->files[b->adapters[i].file].path,
					    b->adapters[i].name);

		if (slot >= 0)
			s->slot[i] = mp_adapters_acquire(s->set, b->adapters[i].name, &s->map[i]);
		if (slot < 0 || s->slot[i] < 0)
			return slot < 0 ? slot : s->slot[i];
	}
	mp_adapters_stats(s->set, &s->stats);
	return 0;
}

/*
 * The base and its adapter slots (padded or not). Under a budget the pager
 * gets what the adapters' rows leave of it, so the whole setup lives in it;
 * with --paged-rows (weave) the adapter rows are the pager's, under the
 * whole budget, and prefetched with the base's.
 */
static int open_weave(struct ab_setup *s)
{
	struct ab_bench *b = s->b;
	uint64_t base_bytes = mp_store_total_expert_bytes(b->base);
	struct mp_adapters_config ac = { .base = b->base, .slots = b->n_adapters,
					 .e_max = b->e_max, .padded = s->kind == AB_PADDED };
	bool paged_rows = b->budget && b->o->paged_rows && !ac.padded;
	uint32_t rows = mp_store_geometry(b->base)->experts + b->n_adapters * b->e_max;
	int err = check_memory(s->kind, b->budget ? b->budget : adapters_need(b, ac.padded) +
					(b->resident ? 0 : base_bytes));

	if (!err)
		err = one_inst(s);
	if (!err)
		err = inst_source(b, s->inst, b->budget, paged_rows ? rows : 0);
	if (err)
		return err;
	ac.source = s->inst->source;
	ac.source_ctx = s->inst->source_ctx;
	if (paged_rows) {
		ac.rows = mp_pager_row_ops();
		ac.rows_ctx = s->inst->pager;
		ac.warm_rows = b->o->warm_rows;
	}
	err = mp_adapters_open(&ac, &s->set);
	if (!err)
		err = load_adapters(s);
	if (!err && paged_rows) {
		s->inst->source = mp_adapters_source_ops();
		s->inst->source_ctx = s->set;
		s->memory = b->budget;
		return inst_runner(b, s->inst, mp_adapters_rows(s->set));
	}
	if (!err && b->budget && s->stats.held_bytes + mp_store_expert_bytes(b->base) > b->budget)
		return cli_error(-ENOSPC, "--budget %s leaves no room for the base's "
			"experts beside the %.1f MB the adapters hold", b->o->budget,
			s->stats.held_bytes / 1e6);
	if (!err && b->budget)
		err = mp_pager_set_budget(s->inst->pager, b->budget - s->stats.held_bytes);
	if (err)
		return err;
	s->inst->source = mp_adapters_source_ops();
	s->inst->source_ctx = s->set;
	s->memory = (b->budget ? b->budget - s->stats.held_bytes : base_bytes) +
		    s->stats.held_bytes;
	return inst_runner(b, s->inst, mp_adapters_rows(s->set));
}

static int open_base(struct ab_setup *s)
{
	struct ab_bench *b = s->b;
	int err;

	s->memory = b->budget ? b->budget : mp_store_total_expert_bytes(b->base);
	err = check_memory(s->kind, b->resident ? 0 : s->memory);
	if (!err)
		err = one_inst(s);
	if (!err)
		err = inst_source(b, s->inst, b->budget, 0);
	return err ? err : inst_runner(b, s->inst, 0);
}

/* Each adapter file's merged model, once, in a temporary directory (removed at the end). */
static int make_merged(struct ab_bench *b)
{
	const char *tmp = getenv("TMPDIR");
	struct statvfs vfs;
	int err = 0;

	if (b->tmpdir[0])
		return 0;
	snprintf(b->tmpdir, sizeof(b->tmpdir), "%s/moepager-abench-XXXXXX", tmp ? tmp : "/tmp");
	if (!mkdtemp(b->tmpdir)) {
		err = -errno;
		cli_error(0, "%s: %s", b->tmpdir, strerror(errno));
		b->tmpdir[0] = '\0';
		return err;
	}
	if (!statvfs(b->tmpdir, &vfs) &&
	    (uint64_t)vfs.f_bavail * vfs.f_frsize < b->n_files * mp_store_file_bytes(b->base)) {
		return cli_error(-ENOSPC, "%u merged models of %.2f GB do not fit "
			"in %s (set TMPDIR)", b->n_files, mp_store_file_bytes(b->base) / 1e9,
			b->tmpdir);
	}
	for (uint32_t i = 0; i < b->n_files && !err; i++) {
		struct mp_adapter *a = NULL;

		if (asprintf(&b->files[i].merged, "%s/%u.mpk", b->tmpdir, i) < 0) {
			b->files[i].merged = NULL;
			return -ENOMEM;
		}
		err = mp_adapter_open(b->files[i].path, &a);
		if (!err)
			err = mp_adapter_merge(b->base, a, b->files[i].name, b->files[i].merged);
		mp_adapter_close(a);
	}
	return err;
}

/*
 * The naive deployment: one runner per adapter over its merged model, each
 * with its own engine (threads as given: they share the machine's cores),
 * resident or paged under an equal share of the budget.
 */
static int open_merged(struct ab_setup *s)
{
	struct ab_bench *b = s->b;
	uint64_t share = b->budget / b->n_adapters;
	struct mp_engine_config ec = { .threads = b->o->eng.threads };
	int err;

	s->memory = b->budget ? b->budget :
				b->n_adapters * mp_store_total_expert_bytes(b->base);
	err = check_memory(s->kind, s->memory);
	if (!err && b->budget && share < mp_store_expert_bytes(b->base))
		err = cli_error(-ENOSPC, "--budget %s shared by %u merged models "
			"leaves each less than one expert", b->o->budget, b->n_adapters);
	if (!err)
		err = make_merged(b);
	s->inst = err ? NULL : calloc(b->n_adapters, sizeof(*s->inst));
	if (!err && !s->inst)
		err = -ENOMEM;
	for (uint32_t i = 0; i < b->n_adapters && !err; i++) {
		struct ab_inst *in = &s->inst[i];

		s->n_inst++;
		in->engine = b->engine;
		err = mp_store_open(b->files[b->adapters[i].file].merged, &in->store);
		if (!err && i)
			err = mp_engine_open(b->o->eng.engine ? b->o->eng.engine : "ref", &ec,
					     &in->engine);
		if (!err)
			err = inst_source(b, in, share, 0);
		if (!err)
			err = inst_runner(b, in, 0);
	}
	return err;
}

int ab_setup_open(struct ab_bench *b, enum ab_kind kind, struct ab_setup *s)
{
	int err;

	memset(s, 0, sizeof(*s));
	s->kind = kind;
	s->b = b;
	for (uint32_t i = 0; i < AB_MAX_ADAPTERS; i++)
		s->slot[i] = -1;
	if (kind == AB_MERGED)
		err = open_merged(s);
	else if (kind == AB_BASE)
		err = open_base(s);
	else
		err = open_weave(s);
	for (uint32_t i = 0; i < s->n_inst && !err; i++) {
		struct mp_sched_config sc = { .runner = s->inst[i].runner,
					      .max_batch = b->o->max_batch,
					      .max_queue = b->o->requests + 1 };

		err = mp_sched_open(&sc, &s->inst[i].sched);
	}
	return err ? cli_fail(err, "%s setup", ab_kind_names[kind]) : 0;
}

void ab_setup_close(struct ab_setup *s)
{
	for (uint32_t i = 0; i < s->n_inst; i++) {
		struct ab_inst *in = &s->inst[i];

		mp_sched_close(in->sched);
		mp_runner_close(in->runner);
	}
	for (uint32_t i = 0; s->set && i < s->b->n_adapters; i++)
		mp_adapters_release(s->set, s->slot[i]);
	mp_adapters_close(s->set);
	for (uint32_t i = 0; i < s->n_inst; i++) {
		struct ab_inst *in = &s->inst[i];

		mp_prefetcher_close(in->prefetcher);
		mp_pager_close(in->pager);
		mp_resident_close(in->resident);
		if (in->engine != s->b->engine)
			mp_engine_close(in->engine);
		if (in->store != s->b->base)
			mp_store_close(in->store);
	}
	free(s->inst);
	memset(s, 0, sizeof(*s));
}

struct ab_inst *ab_setup_inst(struct ab_setup *s, uint32_t a)
{
	return s->kind == AB_MERGED ? &s->inst[a] : &s->inst[0];
}

const uint32_t *const *ab_setup_map(const struct ab_setup *s, uint32_t a)
{
	return s->set ? s->map[a] : NULL;
}
