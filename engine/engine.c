// SPDX-License-Identifier: MIT
/* Engine instances: lookup by name (built-ins, then dlopen()ed plug-ins), checked op calls. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <moepager/engine.h>

#include "engine/engine_impl.h"
#include "base/base.h"

#define MAX_THREADS 1024u

static const struct mp_engine_ops *const builtins[] = {
	&mp_ref_ops,
	&mp_ref_scalar_ops,
	&mp_ref_avx2_ops,
	&mp_ref_avx512_ops,
	&mp_ref_amx_ops,
	&mp_ref_bf16_ops,
};

static const char *const builtin_names[] = {
	"ref", "ref-scalar", "ref-avx2", "ref-avx512", "ref-amx", "ref-bf16", NULL,
};

const char *const *mp_engine_builtin_names(void)
{
	return builtin_names;
}

static void host_to_f32(struct mp_engine *e, enum mp_dtype dt, const void *src, float *dst,
			size_t n)
{
	engine_impl(e)->kern->widen[dt](src, dst, n);
}

static const struct mp_engine_host host = {
	.abi = MP_ENGINE_ABI,
	.ref = &mp_ref_ops,
	.parallel = mp_engine_parallel,
	.err = mp_err,
	.to_f32 = host_to_f32,
};

/* Plug-in names become file names: keep them to one path component. */
static bool plugin_name_ok(const char *name)
{
	if (!*name || !strcmp(name, ".") || !strcmp(name, ".."))
		return false;
	for (const char *c = name; *c; c++)
		if (!(*c == '-' || *c == '_' || *c == '.' || (*c >= '0' && *c <= '9') ||
		      (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')))
			return false;
	return true;
}

static bool try_dir(const char *dir, size_t dlen, const char *name, char *path, size_t len)
{
	int n = snprintf(path, len, "%.*s/%s.so", (int)dlen, dir, name);

	return n > 0 && (size_t)n < len && !access(path, R_OK);
}

/* Finds name.so in the search order of mp_engine_open(); returns 0 or -ENOENT. */
static int find_plugin(const char *name, const char *dir, char *path, size_t len)
{
	const char *env = getenv("MOEPAGER_ENGINE_PATH");

	if (strchr(name, '/')) {
		if (snprintf(path, len, "%s", name) >= (int)len)
			return mp_err(-ENAMETOOLONG, "engine plug-in path too long: %s", name);
		if (access(path, R_OK))
			return mp_err(-ENOENT, "engine plug-in %s: %s", path, strerror(errno));
		return 0;
	}
	if (!plugin_name_ok(name))
		return mp_err(-EINVAL, "engine name '%s': use letters, digits, '-', '_' or '.'",
			      name);
	if (dir && try_dir(dir, strlen(dir), name, path, len))
		return 0;
	for (const char *p = env; p && *p;) {
		const char *end = strchrnul(p, ':');

		if (end > p && try_dir(p, (size_t)(end - p), name, path, len))
			return 0;
		p = *end ? end + 1 : end;
	}
	if (try_dir(MP_ENGINE_DIR, strlen(MP_ENGINE_DIR), name, path, len))
		return 0;
	return mp_err(-ENOENT,
		      "engine '%s': not built in (ref, ref-scalar, ref-avx2, ref-avx512, "
		      "ref-amx, ref-bf16) and no %s.so in %s%s$MOEPAGER_ENGINE_PATH (%s) or %s", name, name,
		      dir ? dir : "", dir ? ", " : "", env ? env : "unset", MP_ENGINE_DIR);
}

static int load_plugin(struct engine_impl *ei, const char *name, const char *dir)
{
	const struct mp_engine_ops *ops;
	char path[4096];
	int err = find_plugin(name, dir, path, sizeof(path));

	if (err)
		return err;
	ei->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!ei->dl)
		return mp_err(-ENOEXEC, "engine plug-in %s: %s", path, dlerror());
	ops = dlsym(ei->dl, MP_ENGINE_PLUGIN_SYMBOL);
	if (!ops)
		return mp_err(-ENOEXEC, "engine plug-in %s: no symbol %s", path,
			      MP_ENGINE_PLUGIN_SYMBOL);
	if (ops->abi != MP_ENGINE_ABI || !ops->name)
		return mp_err(-ENOEXEC, "engine plug-in %s: ABI %u, this library speaks %u%s", path,
			      ops->abi, MP_ENGINE_ABI, ops->name ? "" : " (and it has no name)");
	ei->pub.ops = ops;
	snprintf(ei->name, sizeof(ei->name), "%s", ops->name);
	return 0;
}

int mp_engine_open(const char *name, const struct mp_engine_config *cfg, struct mp_engine **out)
{
	struct engine_impl *ei;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	uint32_t threads = cfg && cfg->threads ? cfg->threads : (ncpu > 0 ? (uint32_t)ncpu : 1);
	int err;

	if (!name || !out)
		return mp_err(-EINVAL, "engine open: NULL %s", name ? "out" : "name");
	if (threads > MAX_THREADS)
		return mp_err(-EINVAL, "engine %s: %u threads is above %u", name, threads,
			      MAX_THREADS);
	if (cfg && (err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved),
					    "engine config")))
		return err;
	ei = calloc(1, sizeof(*ei));
	if (!ei)
		return mp_err(-ENOMEM, "engine %s: out of memory", name);
	ei->pub.host = &host;
	ei->pub.threads = threads;
	ei->kern = mp_kernels_for(mp_isa_best());
	for (size_t i = 0; i < MP_ARRAY_SIZE(builtins); i++) {
		if (!strcmp(name, builtins[i]->name)) {
			ei->pub.ops = builtins[i];
			snprintf(ei->name, sizeof(ei->name), "%s", name);
		}
	}
	if (!ei->pub.ops) {
		err = load_plugin(ei, name, cfg ? cfg->plugin_dir : NULL);
		if (err)
			goto free_engine;
	}
	ei->wbuf = calloc(threads, sizeof(*ei->wbuf));
	ei->wbuf_len = calloc(threads, sizeof(*ei->wbuf_len));
	if (!ei->wbuf || !ei->wbuf_len) {
		err = mp_err(-ENOMEM, "engine %s: out of memory", name);
		goto free_engine;
	}
	err = mp_pool_create(threads, &ei->pool);
	if (err)
		goto free_engine;
	if (ei->pub.ops->init) {
		err = ei->pub.ops->init(&ei->pub);
		if (err)
			goto destroy_pool;
	}
	*out = &ei->pub;
	return 0;

destroy_pool:
	mp_pool_destroy(ei->pool);
	ei->pool = NULL;
free_engine:
	ei->pub.ops = NULL;	/* not initialised: close must not call fini */
	mp_engine_close(&ei->pub);
	return err;
}

void mp_engine_close(struct mp_engine *e)
{
	struct engine_impl *ei;

	if (!e)
		return;
	ei = engine_impl(e);
	if (e->ops && e->ops->fini && !ei->broken)
		e->ops->fini(e);
	mp_pool_destroy(ei->pool);
	for (uint32_t i = 0; ei->wbuf && i < e->threads; i++)
		free(ei->wbuf[i]);
	free(ei->wbuf);
	free(ei->wbuf_len);
	free(ei->buf);
	free(ei->rope_cs);
	if (ei->dl)
		dlclose(ei->dl);
	free(ei);
}

/* The pool and per-worker scratch an instance runs its ops with. */
struct workers {
	struct mp_pool *pool;
	float **wbuf;
	size_t *wbuf_len;
	uint32_t threads;
};

static void workers_swap(struct engine_impl *ei, struct workers *w)
{
	struct workers cur = { ei->pool, ei->wbuf, ei->wbuf_len, ei->pub.threads };

	ei->pool = w->pool;
	ei->wbuf = w->wbuf;
	ei->wbuf_len = w->wbuf_len;
	ei->pub.threads = w->threads;
	*w = cur;
}

/*
 * Frees what w holds past its first keep workers' scratch (which the other
 * set shares, or took over).
 */
static void workers_free(struct workers *w, uint32_t keep)
{
	for (uint32_t i = keep; w->wbuf && i < w->threads; i++)
		free(w->wbuf[i]);
	free(w->wbuf);
	free(w->wbuf_len);
	mp_pool_destroy(w->pool);
}

/*
 * A plug-in's fini and init run again under the workers installed, so its
 * init sees the pool and scratch of the count it is given. When init fails
 * the old workers come back and init runs for them; when that fails too
 * the instance is broken: its ops fail with -EIO and close skips fini.
 */
static int reinit(struct engine_impl *ei, struct workers *w, uint32_t keep)
{
	struct mp_engine *e = &ei->pub;
	int err;

	if (e->ops->fini)
		e->ops->fini(e);
	if (!e->ops->init || !(err = e->ops->init(e)))
		return 0;
	/* Scratch the failed init grew for the shared workers is kept by the old set. */
	memcpy(w->wbuf, ei->wbuf, keep * sizeof(*w->wbuf));
	memcpy(w->wbuf_len, ei->wbuf_len, keep * sizeof(*w->wbuf_len));
	workers_swap(ei, w);
	if (e->ops->init(e)) {
		ei->broken = true;
		mp_err(err, "engine %s: its init failed again with %u threads; the instance is "
		       "unusable", ei->name, e->threads);
	}
	return err;
}

int mp_engine_set_threads(struct mp_engine *e, uint32_t threads)
{
	struct workers w = { .threads = threads };
	struct engine_impl *ei;
	uint32_t keep;
	int err;

	if (!e)
		return mp_err(-EINVAL, "engine set threads: NULL engine");
	ei = engine_impl(e);
	if (ei->broken)
		return mp_err(-EIO, "engine %s: unusable since a failed re-initialisation", ei->name);
	if (threads == e->threads)
		return 0;
	if (threads > MAX_THREADS || !threads)
		return mp_err(-EINVAL, "engine %s: %u threads is outside [1, %u]", ei->name, threads,
			      MAX_THREADS);
	/* Everything new is made first, so a failure here leaves e as it was. */
	w.wbuf = calloc(threads, sizeof(*w.wbuf));
	w.wbuf_len = calloc(threads, sizeof(*w.wbuf_len));
	err = !w.wbuf || !w.wbuf_len ? -ENOMEM : mp_pool_create(threads, &w.pool);
	if (err) {
		mp_err(err, "engine %s: no pool or scratch for %u threads", ei->name, threads);
		workers_free(&w, 0);
		return err;
	}
	keep = MP_MIN(e->threads, threads);
	memcpy(w.wbuf, ei->wbuf, keep * sizeof(*w.wbuf));
	memcpy(w.wbuf_len, ei->wbuf_len, keep * sizeof(*w.wbuf_len));
	workers_swap(ei, &w);
	err = reinit(ei, &w, keep);
	/* w now holds the set not in use: the old one, or the new one after a failure. */
	workers_free(&w, keep);
	return err;
}

const char *mp_engine_name(const struct mp_engine *e)
{
	return engine_impl((struct mp_engine *)e)->name;
}

const char *mp_engine_isa(const struct mp_engine *e)
{
	return engine_impl((struct mp_engine *)e)->kern->isa;
}

int engine_worker_scratch(struct engine_impl *ei, size_t floats)
{
	for (uint32_t i = 0; i < ei->pub.threads; i++) {
		float *b;

		if (ei->wbuf_len[i] >= floats)
			continue;
		b = aligned_alloc(64, MP_ALIGN_UP(floats * sizeof(float), 64));
		if (!b)
			return mp_err(-ENOMEM, "engine %s: out of memory for %zu floats of scratch",
				      ei->name, floats);
		free(ei->wbuf[i]);
		ei->wbuf[i] = b;
		ei->wbuf_len[i] = floats;
	}
	return 0;
}

float *engine_scratch(struct engine_impl *ei, size_t floats)
{
	float *b;

	if (ei->buf_len >= floats)
		return ei->buf;
	b = aligned_alloc(64, MP_ALIGN_UP(floats * sizeof(float), 64));
	if (!b) {
		mp_err(-ENOMEM, "engine %s: out of memory for %zu floats of scratch", ei->name,
		       floats);
		return NULL;
	}
	free(ei->buf);
	ei->buf = b;
	ei->buf_len = floats;
	return b;
}

int mp_engine_parallel(struct mp_engine *e, const struct mp_guard *g, uint32_t nchunks,
		       mp_chunk_fn fn, void *ctx)
{
	if (!e || !fn || (g && !g->wrap))
		return mp_err(-EINVAL, "engine parallel: NULL %s", !e ? "engine" : "function");
	return mp_pool_run(engine_impl(e)->pool, g, nchunks, fn, ctx);
}

/*
 * Checked entry points: arguments are validated here once, so engines can
 * trust them; a NULL op falls back to the reference engine.
 */
#define OP(e, op) ((e)->ops->op ? (e)->ops->op : mp_ref_ops.op)

/* After a failed re-initialisation the plug-in has no state to run on. */
static int usable(struct mp_engine *e, const char *op)
{
	if (engine_impl(e)->broken)
		return mp_err(-EIO, "engine %s: %s on an instance whose plug-in failed to "
			      "re-initialise", engine_impl(e)->name, op);
	return 0;
}

static int check_weights(const char *op, struct mp_engine *e, const struct mp_guard *g,
			 enum mp_dtype dt, const void *w, uint32_t rows, uint32_t cols,
			 const void *x, uint32_t n, const void *y)
{
	if (!e || !w || !x || !y)
		return mp_err(-EINVAL, "engine %s: NULL %s", op,
			      !e ? "engine" : !w ? "weights" : !x ? "input" : "output");
	if (!mp_dtype_block(dt))
		return mp_err(-EINVAL, "engine %s: unknown weight type %d", op, (int)dt);
	if (!rows || !cols || !n)
		return mp_err(-EINVAL, "engine %s: empty product (%u x %u, %u vectors)", op, rows,
			      cols, n);
	if (cols % mp_dtype_block(dt))
		return mp_err(-EINVAL, "engine %s: %s rows of %u elements are not whole blocks "
			      "of %u", op, mp_dtype_name(dt), cols, mp_dtype_block(dt));
	if (g && !g->wrap)
		return mp_err(-EINVAL, "engine %s: guard without a wrap function", op);
	return 0;
}

int mp_engine_matvec(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		     const void *w, uint32_t rows, uint32_t cols, const float *x, float *y)
{
	int err = check_weights("matvec", e, g, dt, w, rows, cols, x, 1, y);

	if (!err)
		err = usable(e, "matvec");
	return err ? err : OP(e, matvec)(e, g, dt, w, rows, cols, x, y);
}

int mp_engine_matmul(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		     const void *w, uint32_t rows, uint32_t cols, const float *x, uint32_t n,
		     float *y)
{
	int err = check_weights("matmul", e, g, dt, w, rows, cols, x, n, y);

	if (!err)
		err = usable(e, "matmul");
	return err ? err : OP(e, matmul)(e, g, dt, w, rows, cols, x, n, y);
}

/* An expert's three matrices: gate and up rows are hidden long, down rows ffn long. */
static int check_expert(const char *op, struct mp_engine *e, const struct mp_guard *g,
			enum mp_dtype dt, const void *w, uint32_t hidden, uint32_t ffn,
			const float *x, uint32_t n, const float *out)
{
	int err = check_weights(op, e, g, dt, w, ffn, hidden, x, n, out);

	return err ? err : check_weights(op, e, g, dt, w, hidden, ffn, x, n, out);
}

int mp_engine_expert_ffn(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
			 const void *w, uint32_t hidden, uint32_t ffn, const float *x, uint32_t n,
			 float *out)
{
	int err = check_expert("expert_ffn", e, g, dt, w, hidden, ffn, x, n, out);

	if (!err)
		err = usable(e, "expert_ffn");
	return err ? err : OP(e, expert_ffn)(e, g, dt, w, hidden, ffn, x, n, out);
}

void mp_pack_bf16(const void *src, uint32_t rows, uint32_t cols, void *dst)
{
	const size_t rs = MP_ROW_bf16(cols), nb = cols / 32, ts = MP_ROW_bf16(cols % 32);

	for (uint32_t g = 0; g < rows; g += MP_KERN_ROWS) {
		const uint32_t R = MP_MIN(MP_KERN_ROWS, rows - g);
		const char *s = (const char *)src + g * rs;
		char *d = (char *)dst + g * rs;

		for (size_t b = 0; b < nb; b++)
			for (uint32_t r = 0; r < R; r++)
				memcpy(d + (b * R + r) * 64, s + r * rs + b * 64, 64);
		for (uint32_t r = 0; r < R; r++)
			memcpy(d + nb * R * 64 + r * ts, s + r * rs + nb * 64, ts);
	}
}

bool mp_engine_packs(const struct mp_engine *e, enum mp_dtype dt)
{
	const struct engine_impl *ei = e ? engine_impl((struct mp_engine *)e) : NULL;

	/* A plug-in's ops read row-major weights: only the built-ins' kernels pack. */
	return ei && !ei->dl && !ei->broken && (unsigned)dt < MP_DTYPE_COUNT &&
	       ei->kern->gemm_packed[dt];
}

static int check_packs(const char *op, struct mp_engine *e, enum mp_dtype dt)
{
	if (!mp_engine_packs(e, dt))
		return mp_err(-EOPNOTSUPP, "engine %s: %s: no packed layout for %s weights",
			      engine_impl(e)->name, op, mp_dtype_name(dt));
	return 0;
}

int mp_engine_pack(struct mp_engine *e, enum mp_dtype dt, const void *w, uint32_t rows,
		   uint32_t cols, void *out)
{
	int err = check_weights("pack", e, NULL, dt, w, rows, cols, w, 1, out);

	if (err)
		return err;
	if (!mp_engine_packs(e, dt))
		return -EOPNOTSUPP;
	mp_pack_bf16(w, rows, cols, out);
	return 0;
}

int mp_engine_pack_expert(struct mp_engine *e, enum mp_dtype dt, const void *w, uint32_t hidden,
			  uint32_t ffn, void *out)
{
	const size_t mat = (size_t)ffn * mp_dtype_bytes(dt, hidden);
	int err = 0;

	for (int m = 0; m < 3 && !err; m++)
		err = mp_engine_pack(e, dt, (const char *)w + m * mat, m < 2 ? ffn : hidden,
				     m < 2 ? hidden : ffn, (char *)out + m * mat);
	return err;
}

int mp_engine_matmul_packed(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
			    const void *w, uint32_t rows, uint32_t cols, const float *x,
			    uint32_t n, float *y)
{
	int err = check_weights("matmul_packed", e, g, dt, w, rows, cols, x, n, y);

	if (!err)
		err = check_packs("matmul_packed", e, dt);
	return err ? err : ref_matmul_as(e, g, dt, w, rows, cols, x, n, y, true);
}

/* Experts [0, count) of a layer over packed weights, each checked first (m[i] vectors each). */
static int experts_ffn_packed(const char *op, struct mp_engine *e, const struct mp_guard *g,
			      enum mp_dtype dt, const void *const *w, uint32_t count,
			      uint32_t hidden, uint32_t ffn, const float *x, const uint32_t *m,
			      float *out)
{
	int err = 0;

	for (size_t i = 0, t = 0; i < count && !err; t += m[i++])
		err = check_expert(op, e, g, dt, w[i], hidden, ffn, x + t * hidden, m[i],
				   out + t * hidden);
	if (!err)
		err = check_packs(op, e, dt);
	return err ? err : ref_experts_ffn_as(e, g, dt, w, count, hidden, ffn, x, m, out, true);
}

int mp_engine_expert_ffn_packed(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
				const void *w, uint32_t hidden, uint32_t ffn, const float *x,
				uint32_t n, float *out)
{
	return experts_ffn_packed("expert_ffn_packed", e, g, dt, &w, 1, hidden, ffn, x, &n, out);
}

int mp_engine_experts_ffn_packed(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
				 const void *const *w, uint32_t count, uint32_t hidden,
				 uint32_t ffn, const float *x, const uint32_t *m, float *out)
{
	return experts_ffn_packed("experts_ffn_packed", e, g, dt, w, count, hidden, ffn, x, m,
				  out);
}


int mp_engine_rmsnorm(struct mp_engine *e, const float *x, const float *weight, uint32_t dim,
		      uint32_t n, float eps, float *y)
{
	if (!e || !x || !weight || !y || !dim || !n || !(eps >= 0.0f))
		return mp_err(-EINVAL, "engine rmsnorm: bad arguments (dim %u, n %u, eps %g)", dim,
			      n, (double)eps);
	if (usable(e, "rmsnorm"))
		return -EIO;
	return OP(e, rmsnorm)(e, x, weight, dim, n, eps, y);
}

int mp_engine_topk(struct mp_engine *e, const float *logits, uint32_t experts, uint32_t k,
		   uint32_t *ids, float *weights)
{
	if (!e || !logits || !ids || !weights || !k || k > experts)
		return mp_err(-EINVAL, "engine topk: bad arguments (top-%u of %u)", k, experts);
	if (usable(e, "topk"))
		return -EIO;
	return OP(e, topk)(e, logits, experts, k, ids, weights);
}

int mp_engine_rope(struct mp_engine *e, float *x, uint32_t n, uint32_t heads, uint32_t head_dim,
		   uint32_t pos0, float theta)
{
	if (!e || !x || !n || !heads || !head_dim || head_dim % 2 || !(theta > 0.0f))
		return mp_err(-EINVAL, "engine rope: bad arguments (%u x %u heads of %u, theta %g)",
			      n, heads, head_dim, (double)theta);
	if (usable(e, "rope"))
		return -EIO;
	return OP(e, rope)(e, x, n, heads, head_dim, pos0, theta);
}

int mp_engine_attention(struct mp_engine *e, const struct mp_attention *a)
{
	if (!e || !a || !a->q || !a->k_cache || !a->v_cache || !a->out || !a->n || !a->heads ||
	    !a->kv_heads || !a->head_dim || a->heads % a->kv_heads)
		return mp_err(-EINVAL, "engine attention: bad arguments");
	if (usable(e, "attention"))
		return -EIO;
	return OP(e, attention)(e, a);
}
