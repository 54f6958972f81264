// SPDX-License-Identifier: MIT
/*
 * CoServe's offline profiler (§4.5): per executor kind (engine threads) and
 * architecture, the batch latency K n + B by least squares, the largest
 * batch before the per-request latency stops improving, the time to load a
 * whole model from each tier, and the memory a model and a batch item hold.
 * Models of one architecture are profiled once (one model stands for all).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "coe/exec.h"

/* Per-request latency must fall by this much for a larger batch to count as better. */
#define MAX_BATCH_GAIN 0.05

/*
 * The fastest of n runs: on a shared machine other work only ever adds to a
 * run, so the minimum is the closest to what the executor itself costs.
 */
static double fastest(const double *v, uint32_t n)
{
	double m = v[0];

	for (uint32_t i = 1; i < n; i++)
		m = v[i] < m ? v[i] : m;
	return m;
}

int coe_fit_line(const double *x, const double *y, uint32_t n, double *k, double *b, double *r2)
{
	double sx = 0, sy = 0, sxx = 0, sxy = 0, den, ss = 0, sr = 0, my;

	for (uint32_t i = 0; i < n; i++) {
		sx += x[i];
		sy += y[i];
		sxx += x[i] * x[i];
		sxy += x[i] * y[i];
	}
	den = n * sxx - sx * sx;
	if (n < 2 || !(fabs(den) > 1e-12 * (1 + sxx)))
		return -EINVAL;
	*k = (n * sxy - sx * sy) / den;
	*b = (sy - *k * sx) / n;
	if (!r2)
		return 0;
	my = sy / n;
	for (uint32_t i = 0; i < n; i++) {
		double e = y[i] - (*k * x[i] + *b);

		sr += e * e;
		ss += (y[i] - my) * (y[i] - my);
	}
	*r2 = ss > 0 ? 1 - sr / ss : 1;
	return 0;
}

uint32_t coe_max_batch(const double *lat, uint32_t n, double gain)
{
	for (uint32_t i = 1; i <= n; i++) {
		double avg = lat[i - 1] / i;
		bool better = false;

		for (uint32_t j = i + 1; j <= n && !better; j++)
			better = lat[j - 1] / j < avg * (1 - gain);
		if (!better)
			return i;
	}
	return n;
}

struct prof {
	struct mp_coe *c;
	struct mp_pager *p;
	const struct mp_coe_profile_config *cfg;
	struct coe_exec *ex;
	uint32_t max_batch, tokens, repeat;
};

/* The most used model of the architecture stands for it. */
static uint32_t representative(const struct mp_coe *c, uint32_t arch)
{
	uint32_t best = UINT32_MAX;

	for (uint32_t m = 0; m < c->n_models; m++)
		if (c->models[m].arch == arch &&
		    (best == UINT32_MAX || c->models[m].usage > c->models[best].usage))
			best = m;
	return best;
}

static int measure_loads(struct prof *pf, uint32_t m, struct mp_coe_perf *out)
{
	double *f = calloc(pf->repeat, sizeof(double)), *h = calloc(pf->repeat, sizeof(double));
	int err = 0;

	if (!f || !h) {
		err = -ENOMEM;
		goto free_all;
	}
	for (uint32_t r = 0; r < pf->repeat && !err; r++) {
		uint64_t t0;

		coe_model_evict(pf->c, pf->p, m, false);
		if (pf->cfg->before_file_load)
			pf->cfg->before_file_load(pf->cfg->arg);
		t0 = mp_now_ns();
		err = coe_model_load(pf->c, pf->p, m, true);
		if (!err)
			err = coe_model_touch(pf->c, pf->p, m);
		f[r] = (double)(mp_now_ns() - t0);
		coe_model_evict(pf->c, pf->p, m, true);
		t0 = mp_now_ns();
		if (!err)
			err = coe_model_touch(pf->c, pf->p, m);
		h[r] = (double)(mp_now_ns() - t0);
	}
	out->load_file_ns = fastest(f, pf->repeat);
	out->load_host_ns = fastest(h, pf->repeat);
free_all:
	free(f);
	free(h);
	return err;
}

static int measure_batches(struct prof *pf, uint32_t m, struct mp_coe_perf *out)
{
	double *lat = calloc(pf->max_batch, sizeof(double)), *x = calloc(pf->max_batch, sizeof(double));
	double *rep = calloc(pf->repeat, sizeof(double));
	uint64_t *ids = calloc(pf->max_batch, sizeof(uint64_t));
	uint32_t *tok = calloc(pf->max_batch, sizeof(uint32_t));
	int err = 0;

	if (!lat || !x || !rep || !ids || !tok) {
		err = -ENOMEM;
		goto free_all;
	}
	for (uint32_t i = 0; i < pf->max_batch; i++)
		ids[i] = i;
	err = coe_model_touch(pf->c, pf->p, m);
	/* One batch first: the engine's buffers are warm for every point (the weights are not). */
	if (!err)
		err = coe_exec_run(pf->ex, m, ids, pf->max_batch, tok);
	for (uint32_t n = 1; n <= pf->max_batch && !err; n++) {
		for (uint32_t r = 0; r < pf->repeat && !err; r++) {
			uint64_t t0;

			/* Its weights out of the caches, as when it was just loaded. */
			err = coe_model_flush(pf->c, pf->p, m);
			t0 = mp_now_ns();
			if (!err)
				err = coe_exec_run(pf->ex, m, ids, n, tok);
			rep[r] = (double)(mp_now_ns() - t0);
		}
		lat[n - 1] = fastest(rep, pf->repeat);
		x[n - 1] = n;
	}
	if (!err && coe_fit_line(x, lat, pf->max_batch, &out->k_ns, &out->b_ns, &out->r2))
		err = mp_err(-EINVAL, "coe profile: a line needs batches of two sizes (max_batch 1)");
	out->max_batch = coe_max_batch(lat, pf->max_batch, MAX_BATCH_GAIN);
free_all:
	free(lat);
	free(x);
	free(rep);
	free(ids);
	free(tok);
	return err;
}

static int profile_threads(struct prof *pf, uint32_t threads, struct mp_coe_profile *out)
{
	int err = coe_exec_open(pf->c, pf->p, pf->cfg->engine, threads, pf->max_batch, pf->tokens,
				&pf->ex);

	for (uint32_t a = 0; !err && a < pf->c->n_archs; a++) {
		struct mp_coe_perf *e = &out->perf[out->n];
		uint32_t m = representative(pf->c, a);

		if (m == UINT32_MAX)
			continue;
		*e = (struct mp_coe_perf){ .threads = threads, .arch = a,
					   .model_bytes = coe_model_bytes(pf->c, m),
					   .item_bytes = coe_exec_item_bytes(pf->ex, a) };
		err = measure_loads(pf, m, e);
		if (!err)
			err = measure_batches(pf, m, e);
		/* The next architecture's loads start from an empty pool. */
		coe_model_evict(pf->c, pf->p, m, false);
		out->n += !err;
	}
	coe_exec_close(pf->ex);
	pf->ex = NULL;
	return err;
}

int mp_coe_profile_run(struct mp_coe *c, struct mp_pager *p,
		       const struct mp_coe_profile_config *cfg, struct mp_coe_profile *out)
{
	struct prof pf = { c, p, cfg, NULL, cfg->max_batch ? cfg->max_batch : 16,
			   cfg->tokens ? cfg->tokens : 4, cfg->repeat ? cfg->repeat : 5 };
	int err;

	memset(out, 0, sizeof(*out));
	err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved), "coe profile config");
	if (err)
		return err;
	if (!cfg->n_threads || !cfg->threads)
		return mp_err(-EINVAL, "coe profile: no executor kind (threads) to profile");
	if (pf.max_batch < 2)
		return mp_err(-EINVAL, "coe profile: max_batch %u (K and B need two sizes)",
			      pf.max_batch);
	out->perf = calloc((size_t)cfg->n_threads * c->n_archs, sizeof(*out->perf));
	if (!out->perf)
		return mp_err(-ENOMEM, "coe profile: out of memory");
	out->tokens = pf.tokens;
	for (uint32_t i = 0; i < cfg->n_threads && !err; i++)
		err = profile_threads(&pf, cfg->threads[i], out);
	if (err)
		mp_coe_profile_free(out);
	return err;
}

void mp_coe_profile_free(struct mp_coe_profile *pr)
{
	free(pr->perf);
	memset(pr, 0, sizeof(*pr));
}

const struct mp_coe_perf *mp_coe_profile_find(const struct mp_coe_profile *pr, uint32_t threads,
					      uint32_t arch)
{
	for (uint32_t i = 0; pr && i < pr->n; i++)
		if (pr->perf[i].threads == threads && pr->perf[i].arch == arch)
			return &pr->perf[i];
	return NULL;
}

/*
 * The profile file (JSON)
 */

int mp_coe_profile_save(const struct mp_coe_profile *pr, const char *path)
{
	json_t *root = json_object(), *arr = json_array();
	int err = 0;

	if (!root || !arr) {
		err = -ENOMEM;
		goto free_json;
	}
	json_object_set_new(root, "format", json_string("moepager-coe-profile"));
	json_object_set_new(root, "version", json_integer(1));
	json_object_set_new(root, "tokens", json_integer(pr->tokens));
	for (uint32_t i = 0; i < pr->n; i++) {
		const struct mp_coe_perf *e = &pr->perf[i];

		json_array_append_new(arr, json_pack("{s:i, s:i, s:f, s:f, s:i, s:f, s:f, s:I, "
			"s:I, s:f}", "threads", (int)e->threads, "arch", (int)e->arch, "k_ns",
			e->k_ns, "b_ns", e->b_ns, "max_batch", (int)e->max_batch, "load_file_ns",
			e->load_file_ns, "load_host_ns", e->load_host_ns, "model_bytes",
			(json_int_t)e->model_bytes, "item_bytes", (json_int_t)e->item_bytes,
			"r2", e->r2));
	}
	json_object_set(root, "perf", arr);
	if (json_dump_file(root, path, JSON_INDENT(1)))
		err = mp_err(-EIO, "coe profile: cannot write %s", path);
free_json:
	json_decref(arr);
	json_decref(root);
	return err;
}

static int load_entry(json_t *o, uint32_t i, const char *path, struct mp_coe_perf *e)
{
	json_int_t threads, arch, max_batch, model_bytes, item_bytes;
	json_error_t jerr;

	if (json_unpack_ex(o, &jerr, JSON_STRICT, "{s:I, s:I, s:F, s:F, s:I, s:F, s:F, s:I, s:I, "
			   "s:F}", "threads", &threads, "arch", &arch, "k_ns", &e->k_ns, "b_ns",
			   &e->b_ns, "max_batch", &max_batch, "load_file_ns", &e->load_file_ns,
			   "load_host_ns", &e->load_host_ns, "model_bytes", &model_bytes,
			   "item_bytes", &item_bytes, "r2", &e->r2))
		return mp_err(-EINVAL, "coe profile %s: perf[%u]: %s", path, i, jerr.text);
	if (threads < 1 || threads > 1024 || arch < 0 || arch > 64 || max_batch < 1 ||
	    max_batch > 4096 || model_bytes < 0 || item_bytes < 0 || !(e->k_ns >= 0) ||
	    !(e->load_file_ns >= 0) || !(e->load_host_ns >= 0))
		return mp_err(-EINVAL, "coe profile %s: perf[%u]: a value out of range", path, i);
	e->threads = (uint32_t)threads;
	e->arch = (uint32_t)arch;
	e->max_batch = (uint32_t)max_batch;
	e->model_bytes = (uint64_t)model_bytes;
	e->item_bytes = (uint64_t)item_bytes;
	return 0;
}

int mp_coe_profile_load(const char *path, struct mp_coe_profile *out)
{
	json_error_t jerr;
	json_t *root = json_load_file(path, 0, &jerr), *arr;
	json_int_t tokens = 0;
	int err = 0;

	memset(out, 0, sizeof(*out));
	if (!root)
		return mp_err(-EINVAL, "coe profile %s: line %d: %s", path, jerr.line, jerr.text);
	arr = json_object_get(root, "perf");
	if (json_unpack_ex(root, &jerr, 0, "{s:I}", "tokens", &tokens) || tokens < 1 ||
	    !json_is_array(arr) || !json_array_size(arr)) {
		err = mp_err(-EINVAL, "coe profile %s: needs \"tokens\" and a non-empty \"perf\"",
			     path);
		goto free_json;
	}
	out->perf = calloc(json_array_size(arr), sizeof(*out->perf));
	if (!out->perf) {
		err = -ENOMEM;
		goto free_json;
	}
	out->tokens = (uint32_t)tokens;
	for (uint32_t i = 0; i < json_array_size(arr) && !err; i++) {
		err = load_entry(json_array_get(arr, i), i, path, &out->perf[i]);
		out->n += !err;
	}
	if (err)
		mp_coe_profile_free(out);
free_json:
	json_decref(root);
	return err;
}
