// SPDX-License-Identifier: MIT
/*
 * The MoE decoder runner: the model's dense weights, sequences with their own
 * KV caches, and steps over one sequence or a batch of them (forward.c).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"
#include "base/probes.h"
#include "engine/kernels.h"
#include "engine/runner_priv.h"

/* Non-expert tensors start on this boundary in the runner's copy (vector loads, cache lines). */
#define TENSOR_ALIGN 64u
/* Items of one batch at most (a step's sequences). */
#define MAX_BATCH_ITEMS 4096u

static const struct mp_tensor_info *find_tensor(struct mp_store *s, const char *name,
						uint64_t rows, uint64_t cols)
{
	const struct mp_tensor_info *t = mp_store_tensor(s, name);
	uint32_t ndim = cols ? 2 : 1;

	if (!t) {
		mp_err(-EINVAL, "%s: model has no tensor %s", mp_store_path(s), name);
		return NULL;
	}
	if (t->ndim != ndim || t->dims[0] != rows || (cols && t->dims[1] != cols)) {
		mp_err(-EINVAL, "%s: tensor %s has %u dims [%llu, %llu], expected [%llu, %llu]",
		       mp_store_path(s), name, t->ndim, (unsigned long long)t->dims[0],
		       (unsigned long long)(t->ndim > 1 ? t->dims[1] : 0),
		       (unsigned long long)rows, (unsigned long long)cols);
		return NULL;
	}
	return t;
}

/*
 * The source's copy of t when it lends one the runner can read as it is:
 * for the runner's own model only (the source serves that store), in the
 * type the runner reads, aligned as the runner's own copy would be.
 */
static const void *borrow(const struct mp_runner *r, const struct dense_set *d,
			  const struct mp_tensor_info *t, bool want_f32)
{
	const void *p;

	if (d->store != r->store || !r->src->tensor || (want_f32 && t->dtype != MP_DTYPE_F32))
		return NULL;
	p = r->src->tensor(r->src_ctx, t);
	return p && !((uintptr_t)p % TENSOR_ALIGN) ? p : NULL;
}

/*
 * Points *out at the tensor: the source's copy when it lends one, else read
 * into the weights block at *off. Norm vectors are used as f32 by the
 * engine, so others are widened here (they are tiny).
 */
static int load_tensor(struct mp_runner *r, struct dense_set *d, const char *name,
		       uint64_t rows, uint64_t cols, bool want_f32, size_t *off, const void **out,
		       enum mp_dtype *dtype)
{
	const struct mp_tensor_info *t = find_tensor(d->store, name, rows, cols);
	char *dst = (char *)d->weights + *off;
	const void *lent;
	int err;

	if (!t)
		return -EINVAL;
	lent = borrow(r, d, t, want_f32);
	if (lent) {
		r->dense_lent += t->bytes;
		*out = lent;
		if (dtype)
			*dtype = t->dtype;
		return 0;
	}
	r->dense_read += t->bytes;
	if (!want_f32 || t->dtype == MP_DTYPE_F32) {
		err = mp_store_read_tensor(d->store, t, dst);
		if (err)
			return err;
		*off += MP_ALIGN_UP(t->bytes, TENSOR_ALIGN);
		if (dtype)
			*dtype = t->dtype;
	} else {
		void *raw = malloc(t->bytes);
		size_t n = mp_dtype_elems(t->dtype, t->bytes);

		if (!raw)
			return mp_err(-ENOMEM, "runner: out of memory reading %s", name);
		err = mp_store_read_tensor(d->store, t, raw);
		if (!err)
			mp_dtype_to_f32(t->dtype, raw, (float *)dst, n);
		free(raw);
		if (err)
			return err;
		*off += MP_ALIGN_UP(n * sizeof(float), TENSOR_ALIGN);
		if (dtype)
			*dtype = MP_DTYPE_F32;
	}
	*out = dst;
	return 0;
}

/*
 * wq when wk and wv follow it end to end (the file's order, read into one
 * block; a source's lent copies may be anywhere), else NULL: then Q, K and V
 * are one product over qdim + 2 kvdim rows, one pool job instead of three,
 * and each row's sum is the same (the kernels' rows are independent).
 */
static const void *qkv_joined(const struct mp_runner *r, const struct layer_weights *lw)
{
	const size_t q = mp_dtype_bytes(r->g.dtype, (uint64_t)r->qdim * r->g.hidden);
	const size_t kv = mp_dtype_bytes(r->g.dtype, (uint64_t)r->kvdim * r->g.hidden);

	return (const char *)lw->wk == (const char *)lw->wq + q &&
	       (const char *)lw->wv == (const char *)lw->wk + kv ? lw->wq : NULL;
}

/* Room for every tensor, widened to f32 in the worst case. */
static size_t weights_size(const struct mp_store *s)
{
	size_t len = 0;

	for (uint32_t i = 0; i < mp_store_tensor_count(s); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(s, i);

		uint64_t elems = mp_dtype_elems(t->dtype, t->bytes);

		len += MP_ALIGN_UP(elems * sizeof(float), TENSOR_ALIGN);
	}
	return len;
}

/* Whether p is in d's own block (read from the file), not a tensor the source lends. */
static bool owned(const struct dense_set *d, const void *p)
{
	return (const char *)p >= (const char *)d->weights &&
	       (const char *)p < (const char *)d->weights + d->weights_len;
}

/* Rewrites d's own rows x cols matrix at w in place in the engine's packed layout. */
static int pack_matrix(struct mp_runner *r, struct dense_set *d, enum mp_dtype dt, const void *w,
		       uint32_t rows, uint32_t cols, void *tmp)
{
	char *dst = (char *)d->weights + ((const char *)w - (const char *)d->weights);
	size_t bytes = mp_dtype_bytes(dt, (uint64_t)rows * cols);
	int err = mp_engine_pack(r->e, dt, w, rows, cols, tmp);

	if (err)
		return mp_err(err, "runner: packing a %u x %u dense matrix of %s: %s", rows, cols,
			      mp_store_path(d->store), strerror(-err));
	memcpy(dst, tmp, bytes);
	r->dense_packed += bytes;
	return 0;
}

/* Whether w is d's own and the engine has a packed layout for dt: then it is packed. */
static bool packable(const struct mp_runner *r, const struct dense_set *d, enum mp_dtype dt,
		     const void *w)
{
	return owned(d, w) && mp_engine_packs(r->e, dt);
}

/*
 * MP_RUNNER_PACK_DENSE: the matrices of d the runner reads itself, in the
 * engine's packed layout. A layer's Q, K, V and O are packed together or not
 * at all (one flag); Q, K and V as the one matrix the step reads when they
 * lie end to end (a group of the layout may then span two of them, as in
 * the product), else each alone.
 */
static int pack_dense(struct mp_runner *r, struct dense_set *d)
{
	const struct mp_geometry *g = &r->g;
	const uint32_t all = r->qdim + 2 * r->kvdim;
	size_t max = mp_dtype_bytes(d->output_dtype, (uint64_t)g->vocab * g->hidden);
	void *tmp;
	int err = 0;

	if (!r->pack_dense)
		return 0;
	max = MP_MAX(max, mp_dtype_bytes(g->dtype, (uint64_t)MP_MAX(all, g->hidden) * g->hidden));
	/* Routers' types are not checked to agree: room for the widest. */
	max = MP_MAX(max, (size_t)g->experts * g->hidden * sizeof(float));
	tmp = malloc(max);
	if (!tmp)
		return mp_err(-ENOMEM, "runner: out of memory packing the dense weights");
	if (packable(r, d, d->output_dtype, d->output)) {
		err = pack_matrix(r, d, d->output_dtype, d->output, g->vocab, g->hidden, tmp);
		d->output_packed = !err;
	}
	for (uint32_t l = 0; l < g->layers && !err; l++) {
		struct layer_weights *lw = &d->layers[l];

		if (packable(r, d, g->dtype, lw->wq) && owned(d, lw->wk) && owned(d, lw->wv) &&
		    owned(d, lw->wo)) {
			if (lw->wqkv)
				err = pack_matrix(r, d, g->dtype, lw->wqkv, all, g->hidden, tmp);
			else if (!(err = pack_matrix(r, d, g->dtype, lw->wq, r->qdim, g->hidden,
						     tmp)) &&
				 !(err = pack_matrix(r, d, g->dtype, lw->wk, r->kvdim, g->hidden,
						     tmp)))
				err = pack_matrix(r, d, g->dtype, lw->wv, r->kvdim, g->hidden, tmp);
			if (!err)
				err = pack_matrix(r, d, g->dtype, lw->wo, g->hidden, r->qdim, tmp);
			lw->attn_packed = !err;
		}
		if (!err && packable(r, d, lw->router_dtype, lw->router)) {
			err = pack_matrix(r, d, lw->router_dtype, lw->router, g->experts, g->hidden,
					  tmp);
			lw->router_packed = !err;
		}
	}
	free(tmp);
	return err;
}

/*
 * Reads d->store's non-expert tensors into d, or points d at the source's
 * copies. The block has room for every tensor; the share of a lent one is
 * never touched, so never backed by memory (but for the rest of a huge
 * page a read tensor shares with it). Huge pages, as the resident experts':
 * every step streams the dense matrices too.
 */
static int load_dense(struct mp_runner *r, struct dense_set *d)
{
	const struct mp_geometry *g = &r->g;
	char name[MP_TENSOR_NAME_MAX];
	enum mp_dtype dt = g->dtype;
	size_t off = 0;
	const void *p;
	int err;

	d->weights_len = weights_size(d->store);
	d->weights = mp_huge_map(d->weights_len);
	d->layers = calloc(g->layers, sizeof(*d->layers));
	if (!d->weights || !d->layers)
		return mp_err(-ENOMEM, "runner: out of memory for %zu bytes of weights",
			      d->weights_len);

	err = load_tensor(r, d, "tok_embd", g->vocab, g->hidden, false, &off, &d->tok_embd,
			  &d->embd_dtype);
	if (err)
		return err;
	err = load_tensor(r, d, "output_norm", g->hidden, 0, true, &off, &p, NULL);
	if (err)
		return err;
	d->output_norm = p;
	err = load_tensor(r, d, "output", g->vocab, g->hidden, false, &off, &d->output,
			  &d->output_dtype);
	if (err)
		return err;
	for (uint32_t l = 0; l < g->layers; l++) {
		struct layer_weights *lw = &d->layers[l];

		/* Attention matrices are in the model's weight type (byte counts assume it). */
#define LOAD(suffix, rows, cols, f32, dst, dtp, check) do {			\
		snprintf(name, sizeof(name), "blk.%u." suffix, l);		\
		err = load_tensor(r, d, name, rows, cols, f32, &off, &p, dtp);	\
		if (err)							\
			return err;						\
		if ((check) && dt != g->dtype)					\
			goto bad_dtype;						\
		dst = p;							\
	} while (0)
		LOAD("attn_norm", g->hidden, 0, true, lw->attn_norm, NULL, false);
		LOAD("attn_q", r->qdim, g->hidden, false, lw->wq, &dt, true);
		LOAD("attn_k", r->kvdim, g->hidden, false, lw->wk, &dt, true);
		LOAD("attn_v", r->kvdim, g->hidden, false, lw->wv, &dt, true);
		LOAD("attn_o", g->hidden, r->qdim, false, lw->wo, &dt, true);
		LOAD("ffn_norm", g->hidden, 0, true, lw->ffn_norm, NULL, false);
		LOAD("router", g->experts, g->hidden, false, lw->router, &lw->router_dtype, false);
#undef LOAD
		lw->wqkv = qkv_joined(r, lw);
	}
	err = pack_dense(r, d);
	if (err)
		return err;
	d->layer_bytes = mp_dtype_bytes(g->dtype, (2ull * r->qdim + 2ull * r->kvdim) * g->hidden) +
			 mp_dtype_bytes(d->layers[0].router_dtype,
					(uint64_t)g->experts * g->hidden) +
			 2ull * g->hidden * sizeof(float);
	return 0;

bad_dtype:
	return mp_err(-EINVAL, "%s: tensor %s is %s, the model's weights are %s",
		      mp_store_path(d->store), name, mp_dtype_name(dt), mp_dtype_name(g->dtype));
}

static void free_dense(struct dense_set *d)
{
	free(d->layers);
	mp_huge_unmap(d->weights, d->weights_len);
}

/* The field in which two geometries differ, or NULL when they are the same. */
static const char *geometry_diff(const struct mp_geometry *a, const struct mp_geometry *b)
{
#define SAME(f) if (a->f != b->f) return #f
	SAME(layers); SAME(experts); SAME(topk); SAME(hidden); SAME(ffn); SAME(heads);
	SAME(kv_heads); SAME(head_dim); SAME(vocab); SAME(max_seq); SAME(dtype);
	SAME(rope_theta); SAME(norm_eps);
#undef SAME
	return NULL;
}

int mp_runner_add_model(struct mp_runner *r, struct mp_store *s)
{
	const char *field;
	struct dense_set *m;
	int err;

	if (!r || !s)
		return mp_err(-EINVAL, "runner add model: NULL %s", !r ? "runner" : "store");
	field = geometry_diff(&r->g, mp_store_geometry(s));
	if (field)
		return mp_err(-EINVAL, "%s: its %s differs from %s's: a runner serves models of "
			      "one architecture", mp_store_path(s), field, mp_store_path(r->store));
	m = realloc(r->models, (r->n_models + 1) * sizeof(*m));
	if (!m)
		return mp_err(-ENOMEM, "runner: out of memory for another model");
	r->models = m;
	m = &r->models[r->n_models];
	*m = (struct dense_set){ .store = s };
	err = load_dense(r, m);
	if (err) {
		free_dense(m);
		return err;
	}
	return (int)r->n_models++;
}

uint32_t mp_runner_models(const struct mp_runner *r)
{
	return r->n_models;
}

/*
 * Sequences
 */

static int seq_create(struct mp_runner *r, const struct mp_seq_config *cfg, struct mp_seq **out)
{
	struct mp_seq *s;
	size_t cache_bytes;

	if (cfg->max_seq > r->g.max_seq)
		return mp_err(-EINVAL, "runner: a KV cache of %u tokens exceeds max_seq %u",
			      cfg->max_seq, r->g.max_seq);
	if (cfg->trace && cfg->trace_request >= mp_trace_requests(cfg->trace))
		return mp_err(-EINVAL, "runner: trace has %u requests, request %u asked for",
			      mp_trace_requests(cfg->trace), cfg->trace_request);
	s = calloc(1, sizeof(*s));
	if (!s)
		return mp_err(-ENOMEM, "runner: out of memory for a sequence");
	s->r = r;
	s->request = cfg->request;
	s->model = cfg->model;
	s->map = cfg->map;
	s->trace = cfg->trace;
	s->trace_request = cfg->trace_request;
	s->max_seq = cfg->max_seq ? cfg->max_seq : r->max_seq;
	/* Anonymous memory: only the positions a run reaches are ever backed. */
	cache_bytes = (size_t)r->g.layers * s->max_seq * r->kvdim * sizeof(float);
	s->cache_len = 2 * cache_bytes;
	s->kcache = mmap(NULL, s->cache_len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	s->logits = calloc(r->g.vocab, sizeof(float));
	if (s->kcache == MAP_FAILED || !s->logits) {
		if (s->kcache != MAP_FAILED)
			munmap(s->kcache, s->cache_len);
		free(s->logits);
		free(s);
		return mp_err(-ENOMEM, "runner: cannot map a KV cache of %zu bytes",
			      2 * cache_bytes);
	}
	s->vcache = s->kcache + cache_bytes / sizeof(float);
	/* A prefetcher predicts the rows this sequence reads (adapter rows) through its map. */
	if (s->map && r->src->seq_map)
		r->src->seq_map(r->src_ctx, s->request, s->map);
	*out = s;
	return 0;
}

/* Every entry of a routed-id map names a row the source takes. */
static int check_map(const struct mp_runner *r, const uint32_t *const *map)
{
	for (uint32_t l = 0; l < r->g.layers; l++)
		for (uint32_t e = 0; map[l] && e < r->g.experts; e++)
			if (map[l][e] >= r->expert_rows)
				return mp_err(-EINVAL, "sequence: map of layer %u sends expert %u to "
					      "row %u, beyond the %u the source takes", l, e,
					      map[l][e], r->expert_rows);
	return 0;
}

/* What a sequence's config may ask of the runner (its cache's length aside). */
static int check_seq_config(const struct mp_runner *r, const struct mp_seq_config *cfg,
			    const char *what)
{
	int err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved),
				    "sequence config");

	if (err)
		return err;
	if (cfg->trace && (err = mp_trace_check_geometry(cfg->trace, &r->g)))
		return err;
	if (cfg->map && (err = check_map(r, cfg->map)))
		return err;
	if (cfg->model >= r->n_models || cfg->reserved32)
		return mp_err(-EINVAL, "%s: model %u, the runner has %u%s", what, cfg->model,
			      r->n_models, cfg->reserved32 ? "; reserved32 must be zero" : "");
	return 0;
}

int mp_seq_open(struct mp_runner *r, const struct mp_seq_config *cfg, struct mp_seq **out)
{
	int err;

	if (!r || !cfg || !out)
		return mp_err(-EINVAL, "sequence open: NULL %s", !r ? "runner" : !cfg ? "config" :
			      "out");
	*out = NULL;
	err = check_seq_config(r, cfg, "sequence open");
	return err ? err : seq_create(r, cfg, out);
}

int mp_seq_reuse(struct mp_seq *s, const struct mp_seq_config *cfg)
{
	struct mp_runner *r;
	int err;

	if (!s || !cfg)
		return mp_err(-EINVAL, "sequence reuse: NULL %s", !s ? "sequence" : "config");
	r = s->r;
	if (cfg->max_seq > s->max_seq)
		return mp_err(-EINVAL, "sequence reuse: %u tokens asked for, its KV cache holds %u",
			      cfg->max_seq, s->max_seq);
	if (cfg->trace && cfg->trace_request >= mp_trace_requests(cfg->trace))
		return mp_err(-EINVAL, "runner: trace has %u requests, request %u asked for",
			      mp_trace_requests(cfg->trace), cfg->trace_request);
	err = check_seq_config(r, cfg, "sequence reuse");
	if (err)
		return err;
	/* The source lets the old request's map go, as at a close (its adapter may go next). */
	if (s->map && r->src->seq_map)
		r->src->seq_map(r->src_ctx, s->request, NULL);
	s->request = cfg->request;
	s->model = cfg->model;
	s->map = cfg->map;
	s->trace = cfg->trace;
	s->trace_request = cfg->trace_request;
	/* The cache keeps its pages and their old values: a step reads only positions < pos. */
	s->pos = 0;
	s->steps = 0;
	if (s->map && r->src->seq_map)
		r->src->seq_map(r->src_ctx, s->request, s->map);
	return 0;
}

void mp_seq_close(struct mp_seq *s)
{
	if (!s)
		return;
	if (s->map && s->r->src->seq_map)
		s->r->src->seq_map(s->r->src_ctx, s->request, NULL);
	munmap(s->kcache, s->cache_len);
	free(s->logits);
	free(s);
}

const float *mp_seq_logits(const struct mp_seq *s)
{
	return s->logits;
}

uint32_t mp_seq_pos(const struct mp_seq *s)
{
	return s->pos;
}

uint32_t mp_seq_steps(const struct mp_seq *s)
{
	return s->steps;
}

uint32_t mp_seq_capacity(const struct mp_seq *s)
{
	return s->max_seq;
}

uint64_t mp_seq_kv_bytes(const struct mp_runner *r, uint32_t tokens)
{
	return 2ull * r->g.layers * tokens * r->kvdim * sizeof(float);
}

void mp_seq_reset(struct mp_seq *s)
{
	s->pos = 0;
	s->steps = 0;
	/* The cache's pages go back to the kernel: a long-lived sequence holds only what it uses. */
	madvise(s->kcache, s->cache_len, MADV_DONTNEED);
}

/*
 * Runner
 */

int mp_runner_open(struct mp_store *s, const struct mp_runner_config *cfg,
		   struct mp_runner **out)
{
	struct mp_seq_config sc;
	struct mp_runner *r;
	int err;

	if (!s || !cfg || !out || !cfg->engine || !cfg->source || !cfg->source->expert)
		return mp_err(-EINVAL, "runner open: missing %s",
			      !s ? "store" : !cfg ? "config" : !out ? "out" :
			      !cfg->engine ? "engine" : "expert source");
	err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved), "runner config");
	if (!err)
		err = mp_check_reserved_ops(cfg->source->reserved,
					    MP_ARRAY_SIZE(cfg->source->reserved), "runner source");
	if (err)
		return err;
	r = calloc(1, sizeof(*r));
	if (!r)
		return mp_err(-ENOMEM, "runner: out of memory");
	r->store = s;
	r->g = *mp_store_geometry(s);
	r->e = cfg->engine;
	r->src = cfg->source;
	r->src_ctx = cfg->source_ctx;
	r->qdim = r->g.heads * r->g.head_dim;
	r->kvdim = r->g.kv_heads * r->g.head_dim;
	r->expert_bytes = mp_store_expert_bytes(s);
	r->max_seq = cfg->max_seq ? cfg->max_seq : r->g.max_seq;
	r->expert_rows = cfg->expert_rows ? cfg->expert_rows : r->g.experts;
	if (r->expert_rows < r->g.experts || r->expert_rows > MP_MAX_EXPERTS * 16 ||
	    (cfg->flags & ~(uint32_t)(MP_RUNNER_LAYER_TIMES | MP_RUNNER_PACK_DENSE))) {
		uint32_t experts = r->g.experts;

		free(r);
		if (cfg->flags & ~(uint32_t)(MP_RUNNER_LAYER_TIMES | MP_RUNNER_PACK_DENSE))
			return mp_err(-EINVAL, "runner: unknown flags 0x%x", cfg->flags);
		return mp_err(-EINVAL, "runner: expert_rows %u must be in [%u (experts), %u]",
			      cfg->expert_rows, experts, MP_MAX_EXPERTS * 16);
	}
	r->layer_times = cfg->flags & MP_RUNNER_LAYER_TIMES;
	r->pack_dense = cfg->flags & MP_RUNNER_PACK_DENSE;
	r->experts_packed = r->src->packed && r->src->packed(r->src_ctx) == 1;
	if (r->experts_packed && !mp_engine_packs(r->e, r->g.dtype)) {
		free(r);
		return mp_err(-EINVAL, "runner: the source's experts are in a packed layout that "
			      "engine %s does not read", mp_engine_name(cfg->engine));
	}
	if (r->src->guard) {
		r->guard.wrap = r->src->guard;
		r->guard.wctx = r->src_ctx;
		r->gp = &r->guard;
	}
	sc = (struct mp_seq_config){ .request = cfg->request, .max_seq = r->max_seq,
				     .trace = cfg->trace, .trace_request = cfg->request,
				     .map = cfg->map };
	err = sc.trace ? mp_trace_check_geometry(sc.trace, &r->g) : 0;
	if (!err && sc.map)
		err = check_map(r, sc.map);
	if (!err)
		err = seq_create(r, &sc, &r->seq0);
	if (!err && !(r->models = calloc(1, sizeof(*r->models))))
		err = mp_err(-ENOMEM, "runner: out of memory");
	if (!err) {
		r->models[0].store = s;
		r->n_models = 1;
		r->active_model = -1;
		err = load_dense(r, &r->models[0]);
	}
	if (err) {
		mp_runner_close(r);
		return err;
	}
	*out = r;
	return 0;
}

void mp_runner_close(struct mp_runner *r)
{
	if (!r)
		return;
	mp_runner_free_activations(r);
	mp_seq_close(r->seq0);
	for (uint32_t i = 0; i < r->n_models; i++)
		free_dense(&r->models[i]);
	free(r->models);
	free(r);
}

/*
 * Multi-MoE's swap. Every model's dense weights are already in host memory
 * (mp_runner_add_model()) and the engine reads them there, so activating a
 * model copies nothing: it only restricts steps to that model's sequences,
 * which read its own set as they would unswapped.
 */
int mp_runner_activate(struct mp_runner *r, uint32_t model)
{
	if (!r || model >= r->n_models)
		return mp_err(-EINVAL, "runner activate: model %u, the runner has %u", model,
			      r ? r->n_models : 0);
	r->active_model = (int32_t)model;
	return 0;
}

int mp_runner_active(const struct mp_runner *r)
{
	return r->active_model;
}

/* Checks an item before anything runs: a refused batch changes nothing. */
static int check_item(const struct mp_runner *r, const struct mp_batch_item *b, uint32_t i)
{
	const struct mp_seq *s = b->seq;

	if (!s || s->r != r || !b->tokens || !b->n)
		return mp_err(-EINVAL, "runner batch: item %u: %s", i,
			      !s ? "no sequence" : s->r != r ? "a sequence of another runner" :
			      !b->tokens ? "no tokens" : "no tokens (n = 0)");
	if (b->kind != MP_BATCH_PREFILL && (b->kind != MP_BATCH_DECODE || b->n != 1))
		return mp_err(-EINVAL, "runner batch: item %u: kind %u with %u tokens (decode "
			      "takes one)", i, b->kind, b->n);
	for (uint32_t t = 0; t < b->n; t++)
		if (b->tokens[t] >= r->g.vocab)
			return mp_err(-EINVAL, "runner: item %u token %u is id %u, vocabulary has "
				      "%u", i, t, b->tokens[t], r->g.vocab);
	if (b->n > s->max_seq - s->pos)
		return mp_err(-ENOSPC, "runner: item %u: %u tokens at position %u overflow a KV "
			      "cache of %u", i, b->n, s->pos, s->max_seq);
	if (b->kind == MP_BATCH_DECODE && s->trace &&
	    s->steps >= mp_trace_tokens(s->trace, s->trace_request))
		return mp_err(-ERANGE, "runner: trace request %u ends after %u tokens; decode step "
			      "%u has no routing", s->trace_request,
			      mp_trace_tokens(s->trace, s->trace_request), s->steps);
	return 0;
}

/*
 * The step's items grouped by model, in batch order within a model, and
 * their runs: each model's rows are contiguous for its dense products.
 */
static void order_items(struct mp_runner *r, const struct mp_batch_item *batch, uint32_t count)
{
	uint32_t rows = 0, n = 0;

	r->n_runs = 0;
	for (uint32_t m = 0; m < r->n_models && n < count; m++) {
		struct step_run *run = &r->runs[r->n_runs];

		*run = (struct step_run){ .d = &r->models[m], .item = n, .first = rows };
		for (uint32_t i = 0; i < count; i++) {
			if (batch[i].seq->model != m)
				continue;
			r->items[n++] = (struct step_item){
				.seq = batch[i].seq, .tokens = batch[i].tokens, .first = rows,
				.n = batch[i].n, .decode = batch[i].kind == MP_BATCH_DECODE,
			};
			if (batch[i].kind != MP_BATCH_DECODE)
				MP_PROBE(prefill, batch[i].seq->request, batch[i].seq->pos,
					 batch[i].n);
			rows += batch[i].n;
		}
		run->count = n - run->item;
		run->rows = rows - run->first;
		r->n_runs += run->count > 0;
	}
}

int mp_runner_batch(struct mp_runner *r, const struct mp_batch_item *batch, uint32_t count)
{
	uint32_t rows = 0;
	int err;

	if (!r || !batch || !count || count > MAX_BATCH_ITEMS)
		return mp_err(-EINVAL, "runner batch: %s", !r ? "NULL runner" :
			      !batch ? "NULL items" : !count ? "no items" : "too many items");
	for (uint32_t i = 0; i < count; i++) {
		if ((err = check_item(r, &batch[i], i)))
			return err;
		if (r->active_model >= 0 && batch[i].seq->model != (uint32_t)r->active_model)
			return mp_err(-EINVAL, "runner batch: item %u is of model %u, model %d is "
				      "active", i, batch[i].seq->model, r->active_model);
		for (uint32_t j = 0; j < i; j++)
			if (batch[j].seq == batch[i].seq)
				return mp_err(-EINVAL, "runner batch: items %u and %u are the same "
					      "sequence", j, i);
		if (batch[i].n > UINT32_MAX - rows)
			return mp_err(-EINVAL, "runner batch: too many tokens");
		rows += batch[i].n;
	}
	err = mp_runner_reserve(r, rows, count);
	if (err)
		return err;
	order_items(r, batch, count);
	return mp_runner_forward(r, r->items, count, rows);
}

int mp_runner_prefill(struct mp_runner *r, const uint32_t *tokens, uint32_t n)
{
	if (!r || !tokens || !n)
		return mp_err(-EINVAL, "runner prefill: %s", !r ? "NULL runner" :
			      !tokens ? "NULL tokens" : "no tokens");
	return mp_runner_batch(r, &(struct mp_batch_item){ .seq = r->seq0, .tokens = tokens,
							  .n = n, .kind = MP_BATCH_PREFILL }, 1);
}

int mp_runner_step(struct mp_runner *r, uint32_t token)
{
	if (!r)
		return mp_err(-EINVAL, "runner step: NULL runner");
	return mp_runner_batch(r, &(struct mp_batch_item){ .seq = r->seq0, .tokens = &token,
							  .n = 1, .kind = MP_BATCH_DECODE }, 1);
}

const float *mp_runner_logits(const struct mp_runner *r)
{
	return r->seq0->logits;
}

/*
 * The engine's argmax kernel of the widest ISA (kernels.h: the lowest id of
 * the largest value, NaN never the largest but at 0), picked once. AVX-512
 * takes ~0.1 us for 4,096 logits in L1, where the SSE2 two passes took
 * ~0.4 us and a scalar scan ~4-5 us; on the serving thread, every step.
 */
uint32_t mp_logits_argmax(const float *logits, uint32_t vocab)
{
	static _Atomic(const struct mp_kernels *) best;
	const struct mp_kernels *k = atomic_load_explicit(&best, memory_order_relaxed);

	if (!k) {
		k = mp_kernels_for(mp_isa_best());
		atomic_store_explicit(&best, k, memory_order_relaxed);
	}
	return k->argmax(logits, vocab);
}

uint32_t mp_runner_argmax(const struct mp_runner *r)
{
	return mp_logits_argmax(r->seq0->logits, r->g.vocab);
}

uint32_t mp_runner_pos(const struct mp_runner *r)
{
	return r->seq0->pos;
}

uint32_t mp_runner_steps(const struct mp_runner *r)
{
	return r->seq0->steps;
}

void mp_runner_reset(struct mp_runner *r)
{
	r->seq0->pos = 0;
	r->seq0->steps = 0;
}

const struct mp_geometry *mp_runner_geometry(const struct mp_runner *r)
{
	return &r->g;
}

void mp_runner_stats(const struct mp_runner *r, struct mp_runner_stats *out)
{
	*out = r->st;
	out->dense_lent_bytes = r->dense_lent;
	out->dense_read_bytes = r->dense_read;
	out->dense_packed_bytes = r->dense_packed;
}

void mp_runner_stats_reset(struct mp_runner *r)
{
	uint64_t *c = (uint64_t *)&r->lt;

	memset(&r->st, 0, sizeof(r->st));
	for (size_t i = 0; i < sizeof(r->lt) / sizeof(*c); i++)
		__atomic_store_n(&c[i], 0, __ATOMIC_RELAXED);
}

void mp_runner_layer_times(const struct mp_runner *r, struct mp_runner_layer_times *out)
{
	const uint64_t *c = (const uint64_t *)&r->lt;
	uint64_t *o = (uint64_t *)out;

	for (size_t i = 0; i < sizeof(*out) / sizeof(*o); i++)
		o[i] = __atomic_load_n(&c[i], __ATOMIC_RELAXED);
}
