// SPDX-License-Identifier: MIT
/* The MoE decoder: Mixtral-style forward pass, batched prefill and greedy decode steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <moepager/store.h>
#include <moepager/trace.h>
#include <moepager/engine.h>
#include <moepager/runner.h>
#include <moepager/source.h>

#include "base/base.h"
#include "base/probes.h"

/* Non-expert tensors start on this boundary in the runner's copy (vector loads, cache lines). */
#define TENSOR_ALIGN 64u

struct layer_weights {
	const float *attn_norm;
	const void *wq, *wk, *wv, *wo;
	const float *ffn_norm;
	const void *router;
	enum mp_dtype router_dtype;
};

struct mp_runner {
	struct mp_store *store;
	struct mp_geometry g;
	struct mp_engine *e;
	const struct mp_expert_source_ops *src;
	void *src_ctx;
	struct mp_guard guard;
	const struct mp_guard *gp;		/* &guard, or NULL when the source has none */
	const struct mp_trace *trace;
	uint32_t request;
	uint32_t max_seq;
	uint32_t qdim, kvdim;
	uint32_t pos, steps;

	/* Every non-expert tensor, read once at open. */
	void *weights;
	size_t weights_len;
	const void *tok_embd, *output;
	enum mp_dtype embd_dtype, output_dtype;
	const float *output_norm;
	struct layer_weights *layers;
	uint64_t layer_bytes;			/* dense weight bytes one pass reads per layer */
	uint64_t expert_bytes;

	/* KV cache: [layers][max_seq][kv_heads x head_dim] each. */
	float *kcache, *vcache;
	size_t cache_len;

	/* Activations for up to cap tokens. */
	uint32_t cap;
	float *x, *xn, *q, *k, *v, *att, *tmp, *moe, *xg, *eout, *rlogits, *gw, *selw;
	uint32_t *ids, *sel;
	float *logits;

	struct mp_runner_stats st;
};

static const struct mp_tensor_info *find_tensor(struct mp_runner *r, const char *name,
						uint64_t rows, uint64_t cols)
{
	const struct mp_tensor_info *t = mp_store_tensor(r->store, name);
	uint32_t ndim = cols ? 2 : 1;

	if (!t) {
		mp_err(-EINVAL, "%s: model has no tensor %s", mp_store_path(r->store), name);
		return NULL;
	}
	if (t->ndim != ndim || t->dims[0] != rows || (cols && t->dims[1] != cols)) {
		mp_err(-EINVAL, "%s: tensor %s has %u dims [%llu, %llu], expected [%llu, %llu]",
		       mp_store_path(r->store), name, t->ndim, (unsigned long long)t->dims[0],
		       (unsigned long long)(t->ndim > 1 ? t->dims[1] : 0),
		       (unsigned long long)rows, (unsigned long long)cols);
		return NULL;
	}
	return t;
}

/*
 * Reads the tensor into the weights block at *off. Norm vectors are used as
 * f32 by the engine, so others are widened here (they are tiny).
 */
static int load_tensor(struct mp_runner *r, const char *name, uint64_t rows, uint64_t cols,
		       bool want_f32, size_t *off, const void **out, enum mp_dtype *dtype)
{
	const struct mp_tensor_info *t = find_tensor(r, name, rows, cols);
	char *dst = (char *)r->weights + *off;
	int err;

	if (!t)
		return -EINVAL;
	if (!want_f32 || t->dtype == MP_DTYPE_F32) {
		err = mp_store_read_tensor(r->store, t, dst);
		if (err)
			return err;
		*off += MP_ALIGN_UP(t->bytes, TENSOR_ALIGN);
		if (dtype)
			*dtype = t->dtype;
	} else {
		void *raw = malloc(t->bytes);
		size_t n = t->bytes / mp_dtype_size(t->dtype);

		if (!raw)
			return mp_err(-ENOMEM, "runner: out of memory reading %s", name);
		err = mp_store_read_tensor(r->store, t, raw);
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

/* Room for every tensor, widened to f32 in the worst case. */
static size_t weights_size(const struct mp_store *s)
{
	size_t len = 0;

	for (uint32_t i = 0; i < mp_store_tensor_count(s); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(s, i);

		uint64_t elems = t->bytes / mp_dtype_size(t->dtype);

		len += MP_ALIGN_UP(elems * sizeof(float), TENSOR_ALIGN);
	}
	return len;
}

static int load_weights(struct mp_runner *r)
{
	const struct mp_geometry *g = &r->g;
	char name[MP_TENSOR_NAME_MAX];
	enum mp_dtype dt = g->dtype;
	size_t off = 0;
	const void *p;
	int err;

	r->weights_len = weights_size(r->store);
	r->weights = aligned_alloc(TENSOR_ALIGN, MP_ALIGN_UP(r->weights_len, TENSOR_ALIGN));
	r->layers = calloc(g->layers, sizeof(*r->layers));
	if (!r->weights || !r->layers)
		return mp_err(-ENOMEM, "runner: out of memory for %zu bytes of weights",
			      r->weights_len);

	err = load_tensor(r, "tok_embd", g->vocab, g->hidden, false, &off, &r->tok_embd,
			  &r->embd_dtype);
	if (err)
		return err;
	err = load_tensor(r, "output_norm", g->hidden, 0, true, &off, &p, NULL);
	if (err)
		return err;
	r->output_norm = p;
	err = load_tensor(r, "output", g->vocab, g->hidden, false, &off, &r->output,
			  &r->output_dtype);
	if (err)
		return err;
	for (uint32_t l = 0; l < g->layers; l++) {
		struct layer_weights *lw = &r->layers[l];

		/* Attention matrices are in the model's weight type (byte counts assume it). */
#define LOAD(suffix, rows, cols, f32, dst, dtp, check) do {			\
		snprintf(name, sizeof(name), "blk.%u." suffix, l);		\
		err = load_tensor(r, name, rows, cols, f32, &off, &p, dtp);	\
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
	}
	r->layer_bytes = (2ull * r->qdim * g->hidden + 2ull * r->kvdim * g->hidden) *
			 mp_dtype_size(g->dtype) +
			 (uint64_t)g->experts * g->hidden *
			 mp_dtype_size(r->layers[0].router_dtype) +
			 2ull * g->hidden * sizeof(float);
	return 0;

bad_dtype:
	return mp_err(-EINVAL, "%s: tensor %s is %s, the model's weights are %s",
		      mp_store_path(r->store), name, mp_dtype_name(dt), mp_dtype_name(g->dtype));
}

static void free_activations(struct mp_runner *r)
{
	float **f[] = { &r->x, &r->xn, &r->q, &r->k, &r->v, &r->att, &r->tmp, &r->moe, &r->xg,
			&r->eout, &r->rlogits, &r->gw, &r->selw };

	for (size_t i = 0; i < MP_ARRAY_SIZE(f); i++) {
		free(*f[i]);
		*f[i] = NULL;
	}
	free(r->ids);
	free(r->sel);
	r->ids = r->sel = NULL;
	r->cap = 0;
}

static float *falloc(size_t n)
{
	return aligned_alloc(64, MP_ALIGN_UP(n * sizeof(float), 64));
}

static int reserve(struct mp_runner *r, uint32_t n)
{
	const struct mp_geometry *g = &r->g;

	if (n <= r->cap)
		return 0;
	free_activations(r);
	r->x = falloc((size_t)n * g->hidden);
	r->xn = falloc((size_t)n * g->hidden);
	r->tmp = falloc((size_t)n * g->hidden);
	r->moe = falloc((size_t)n * g->hidden);
	r->xg = falloc((size_t)n * g->hidden);
	r->eout = falloc((size_t)n * g->hidden);
	r->q = falloc((size_t)n * r->qdim);
	r->att = falloc((size_t)n * r->qdim);
	r->k = falloc((size_t)n * r->kvdim);
	r->v = falloc((size_t)n * r->kvdim);
	r->rlogits = falloc((size_t)n * g->experts);
	r->gw = falloc((size_t)n * g->topk);
	r->selw = falloc(n);
	r->ids = calloc((size_t)n * g->topk, sizeof(uint32_t));
	r->sel = calloc(n, sizeof(uint32_t));
	if (!r->x || !r->xn || !r->tmp || !r->moe || !r->xg || !r->eout || !r->q || !r->att ||
	    !r->k || !r->v || !r->rlogits || !r->gw || !r->selw || !r->ids || !r->sel) {
		free_activations(r);
		return mp_err(-ENOMEM, "runner: out of memory for the activations of %u tokens", n);
	}
	r->cap = n;
	return 0;
}

int mp_runner_open(struct mp_store *s, const struct mp_runner_config *cfg,
		   struct mp_runner **out)
{
	struct mp_runner *r;
	size_t cache_bytes;
	int err;

	if (!s || !cfg || !out || !cfg->engine || !cfg->source || !cfg->source->expert)
		return mp_err(-EINVAL, "runner open: missing %s",
			      !s ? "store" : !cfg ? "config" : !out ? "out" :
			      !cfg->engine ? "engine" : "expert source");
	err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved), "runner config");
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
	r->trace = cfg->trace;
	r->request = cfg->request;
	r->qdim = r->g.heads * r->g.head_dim;
	r->kvdim = r->g.kv_heads * r->g.head_dim;
	r->expert_bytes = mp_store_expert_bytes(s);
	r->max_seq = cfg->max_seq ? cfg->max_seq : r->g.max_seq;
	if (r->max_seq > r->g.max_seq) {
		err = mp_err(-EINVAL, "runner: a KV cache of %u tokens exceeds max_seq %u",
			     r->max_seq, r->g.max_seq);
		goto free_runner;
	}
	if (r->src->guard) {
		r->guard.wrap = r->src->guard;
		r->guard.wctx = r->src_ctx;
		r->gp = &r->guard;
	}
	if (r->trace) {
		err = mp_trace_check_geometry(r->trace, &r->g);
		if (err)
			goto free_runner;
		if (r->request >= mp_trace_requests(r->trace)) {
			err = mp_err(-EINVAL, "runner: trace has %u requests, request %u asked for",
				     mp_trace_requests(r->trace), r->request);
			goto free_runner;
		}
	}
	err = load_weights(r);
	if (err)
		goto free_weights;

	/* Anonymous memory: only the positions a run reaches are ever backed. */
	cache_bytes = (size_t)r->g.layers * r->max_seq * r->kvdim * sizeof(float);
	r->cache_len = 2 * cache_bytes;
	r->kcache = mmap(NULL, r->cache_len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (r->kcache == MAP_FAILED) {
		r->kcache = NULL;
		err = mp_err(-ENOMEM, "runner: cannot map a KV cache of %zu bytes", r->cache_len);
		goto free_weights;
	}
	r->vcache = r->kcache + cache_bytes / sizeof(float);
	r->logits = falloc(r->g.vocab);
	if (!r->logits) {
		err = mp_err(-ENOMEM, "runner: out of memory for logits");
		goto free_weights;
	}
	memset(r->logits, 0, r->g.vocab * sizeof(float));
	*out = r;
	return 0;

free_weights:
	mp_runner_close(r);
	return err;
free_runner:
	free(r);
	return err;
}

void mp_runner_close(struct mp_runner *r)
{
	if (!r)
		return;
	free_activations(r);
	if (r->kcache)
		munmap(r->kcache, r->cache_len);
	free(r->logits);
	free(r->layers);
	free(r->weights);
	free(r);
}

static void embed(struct mp_runner *r, const uint32_t *tokens, uint32_t n)
{
	const size_t row = (size_t)r->g.hidden * mp_dtype_size(r->embd_dtype);

	for (uint32_t t = 0; t < n; t++)
		mp_dtype_to_f32(r->embd_dtype, (const char *)r->tok_embd + tokens[t] * row,
				r->x + (size_t)t * r->g.hidden, r->g.hidden);
}

static void add(float *y, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
}

static int attention(struct mp_runner *r, uint32_t l, uint32_t n)
{
	const struct mp_geometry *g = &r->g;
	const struct layer_weights *lw = &r->layers[l];
	const size_t layer_off = (size_t)l * r->max_seq * r->kvdim;
	struct mp_attention a = {
		.q = r->q, .k_cache = r->kcache + layer_off, .v_cache = r->vcache + layer_off,
		.out = r->att, .n = n, .pos0 = r->pos, .heads = g->heads,
		.kv_heads = g->kv_heads, .head_dim = g->head_dim,
	};
	int err;

	if ((err = mp_engine_rmsnorm(r->e, r->x, lw->attn_norm, g->hidden, n, g->norm_eps,
				     r->xn)) ||
	    (err = mp_engine_matmul(r->e, NULL, g->dtype, lw->wq, r->qdim, g->hidden, r->xn, n,
				    r->q)) ||
	    (err = mp_engine_matmul(r->e, NULL, g->dtype, lw->wk, r->kvdim, g->hidden, r->xn, n,
				    r->k)) ||
	    (err = mp_engine_matmul(r->e, NULL, g->dtype, lw->wv, r->kvdim, g->hidden, r->xn, n,
				    r->v)) ||
	    (err = mp_engine_rope(r->e, r->q, n, g->heads, g->head_dim, r->pos, g->rope_theta)) ||
	    (err = mp_engine_rope(r->e, r->k, n, g->kv_heads, g->head_dim, r->pos,
				  g->rope_theta)))
		return err;
	memcpy(r->kcache + layer_off + (size_t)r->pos * r->kvdim, r->k,
	       (size_t)n * r->kvdim * sizeof(float));
	memcpy(r->vcache + layer_off + (size_t)r->pos * r->kvdim, r->v,
	       (size_t)n * r->kvdim * sizeof(float));
	if ((err = mp_engine_attention(r->e, &a)) ||
	    (err = mp_engine_matmul(r->e, NULL, g->dtype, lw->wo, g->hidden, r->qdim, r->att, n,
				    r->tmp)))
		return err;
	add(r->x, r->tmp, (size_t)n * g->hidden);
	return 0;
}

static bool same_experts(const uint32_t *a, const uint32_t *b, uint32_t k)
{
	for (uint32_t i = 0; i < k; i++) {
		bool found = false;

		for (uint32_t j = 0; j < k && !found; j++)
			found = a[i] == b[j];
		if (!found)
			return false;
	}
	return true;
}

/* Replaces the router's choice for this decode step by the trace's. */
static int force_route(struct mp_runner *r, uint32_t l, const float *logits, uint32_t *ids,
		       float *w)
{
	const uint32_t k = r->g.topk;
	const uint32_t *tids;
	const float *tw;
	float max = -INFINITY, sum = 0.0f;
	int err = mp_trace_route(r->trace, r->request, r->steps, l, &tids, &tw);

	if (err)
		return mp_err(err, "runner: trace has no routing for request %u token %u layer %u",
			      r->request, r->steps, l);
	if (!same_experts(ids, tids, k))
		r->st.trace_overrides++;
	memcpy(ids, tids, k * sizeof(*ids));
	if (tw) {
		memcpy(w, tw, k * sizeof(*w));
		return 0;
	}
	/* Ids only: gate weights are this model's router softmax over the trace's experts. */
	for (uint32_t i = 0; i < k; i++)
		max = fmaxf(max, logits[ids[i]]);
	for (uint32_t i = 0; i < k; i++) {
		w[i] = expf(logits[ids[i]] - max);
		sum += w[i];
	}
	for (uint32_t i = 0; i < k; i++)
		w[i] /= sum;
	return 0;
}

static int run_expert(struct mp_runner *r, uint32_t l, uint32_t ex, const float *x, uint32_t m)
{
	const void *w = r->src->expert(r->src_ctx, l, ex);
	int err;

	if (!w)
		return mp_err(-EIO, "runner: layer %u expert %u: the expert source has no address",
			      l, ex);
	err = mp_engine_expert_ffn(r->e, r->gp, r->g.dtype, w, r->g.hidden, r->g.ffn, x, m,
				   r->eout);
	if (err)
		return mp_err(err, "runner: layer %u expert %u: reading the expert failed: %s",
			      l, ex, strerror(-err));
	r->st.expert_calls++;
	r->st.expert_bytes += r->expert_bytes;
	return 0;
}

static int moe(struct mp_runner *r, uint32_t l, uint32_t n, bool decode)
{
	const struct mp_geometry *g = &r->g;
	const struct layer_weights *lw = &r->layers[l];
	const uint32_t k = g->topk;
	int err;

	if ((err = mp_engine_rmsnorm(r->e, r->x, lw->ffn_norm, g->hidden, n, g->norm_eps,
				     r->xn)) ||
	    (err = mp_engine_matmul(r->e, NULL, lw->router_dtype, lw->router, g->experts,
				    g->hidden, r->xn, n, r->rlogits)))
		return err;
	for (uint32_t t = 0; t < n; t++) {
		const float *lg = r->rlogits + (size_t)t * g->experts;
		uint32_t *ids = r->ids + (size_t)t * k;
		float *w = r->gw + (size_t)t * k;

		err = mp_engine_topk(r->e, lg, g->experts, k, ids, w);
		if (!err && decode && r->trace)
			err = force_route(r, l, lg, ids, w);
		if (err)
			return err;
	}
	/* Report every decision of the layer before any of its experts is read. */
	for (uint32_t t = 0; t < n; t++) {
		const uint32_t *ids = r->ids + (size_t)t * k;
		const float *w = r->gw + (size_t)t * k;
		const uint32_t token = decode ? r->steps : MP_TOKEN_PROMPT;

		MP_PROBE(route, r->request, token, l, k, ids, w);
		r->st.route_calls++;
		if (decode && r->src->gate)
			r->src->gate(r->src_ctx, r->request, token, l,
				     r->rlogits + (size_t)t * g->experts, g->experts,
				     r->xn + (size_t)t * g->hidden, g->hidden);
		if (!r->src->route)
			continue;
		err = r->src->route(r->src_ctx, r->request, token, l, ids, w, k);
		if (err)
			return mp_err(err, "runner: layer %u position %u: the expert source "
				      "refused the routing: %s", l, r->pos + t, strerror(-err));
	}

	memset(r->moe, 0, (size_t)n * g->hidden * sizeof(float));
	if (n == 1) {
		/* One token: its experts in router order, straight from xn. */
		for (uint32_t i = 0; i < k; i++) {
			err = run_expert(r, l, r->ids[i], r->xn, 1);
			if (err)
				return err;
			for (uint32_t c = 0; c < g->hidden; c++)
				r->moe[c] += r->gw[i] * r->eout[c];
		}
	} else {
		/* A batch: each expert once, over the tokens that chose it. */
		for (uint32_t ex = 0; ex < g->experts; ex++) {
			uint32_t m = 0;

			for (uint32_t t = 0; t < n; t++) {
				for (uint32_t i = 0; i < k; i++) {
					if (r->ids[(size_t)t * k + i] != ex)
						continue;
					r->sel[m] = t;
					r->selw[m] = r->gw[(size_t)t * k + i];
					memcpy(r->xg + (size_t)m * g->hidden,
					       r->xn + (size_t)t * g->hidden,
					       g->hidden * sizeof(float));
					m++;
				}
			}
			if (!m)
				continue;
			err = run_expert(r, l, ex, r->xg, m);
			if (err)
				return err;
			for (uint32_t j = 0; j < m; j++) {
				float *dst = r->moe + (size_t)r->sel[j] * g->hidden;
				const float *src = r->eout + (size_t)j * g->hidden;

				for (uint32_t c = 0; c < g->hidden; c++)
					dst[c] += r->selw[j] * src[c];
			}
		}
	}
	add(r->x, r->moe, (size_t)n * g->hidden);
	return 0;
}

static int forward(struct mp_runner *r, const uint32_t *tokens, uint32_t n, bool decode)
{
	const struct mp_geometry *g = &r->g;
	const float *last;
	int err;

	for (uint32_t t = 0; t < n; t++)
		if (tokens[t] >= g->vocab)
			return mp_err(-EINVAL, "runner: token %u is id %u, vocabulary has %u", t,
				      tokens[t], g->vocab);
	if (n > r->max_seq - r->pos)
		return mp_err(-ENOSPC, "runner: %u tokens at position %u overflow a KV cache of %u",
			      n, r->pos, r->max_seq);
	if (decode && r->trace && r->steps >= mp_trace_tokens(r->trace, r->request))
		return mp_err(-ERANGE, "runner: trace request %u ends after %u tokens; decode step "
			      "%u has no routing", r->request,
			      mp_trace_tokens(r->trace, r->request), r->steps);
	err = reserve(r, n);
	if (err)
		return err;

	embed(r, tokens, n);
	if (decode && r->src->embed)
		r->src->embed(r->src_ctx, r->request, r->steps, r->x, g->hidden);
	for (uint32_t l = 0; l < g->layers; l++) {
		err = attention(r, l, n);
		if (!err)
			err = moe(r, l, n, decode);
		if (err)
			return err;
	}
	/* Only the last token's logits are needed: prefill predicts one token. */
	last = r->x + (size_t)(n - 1) * g->hidden;
	err = mp_engine_rmsnorm(r->e, last, r->output_norm, g->hidden, 1, g->norm_eps, r->xn);
	if (!err)
		err = mp_engine_matvec(r->e, NULL, r->output_dtype, r->output, g->vocab, g->hidden,
				       r->xn, r->logits);
	if (err)
		return err;

	r->pos += n;
	if (decode)
		r->steps++;
	r->st.tokens += n;
	r->st.dense_bytes += g->layers * r->layer_bytes +
			     (uint64_t)g->vocab * g->hidden * mp_dtype_size(r->output_dtype) +
			     (uint64_t)n * g->hidden * mp_dtype_size(r->embd_dtype) +
			     g->hidden * sizeof(float);
	return 0;
}

int mp_runner_prefill(struct mp_runner *r, const uint32_t *tokens, uint32_t n)
{
	if (!r || !tokens || !n)
		return mp_err(-EINVAL, "runner prefill: %s", !r ? "NULL runner" :
			      !tokens ? "NULL tokens" : "no tokens");
	MP_PROBE(prefill, r->request, r->pos, n);
	return forward(r, tokens, n, false);
}

int mp_runner_step(struct mp_runner *r, uint32_t token)
{
	if (!r)
		return mp_err(-EINVAL, "runner step: NULL runner");
	return forward(r, &token, 1, true);
}

const float *mp_runner_logits(const struct mp_runner *r)
{
	return r->logits;
}

uint32_t mp_runner_argmax(const struct mp_runner *r)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < r->g.vocab; i++)
		if (r->logits[i] > r->logits[best])
			best = i;
	return best;
}

uint32_t mp_runner_pos(const struct mp_runner *r)
{
	return r->pos;
}

uint32_t mp_runner_steps(const struct mp_runner *r)
{
	return r->steps;
}

void mp_runner_reset(struct mp_runner *r)
{
	r->pos = 0;
	r->steps = 0;
}

void mp_runner_stats(const struct mp_runner *r, struct mp_runner_stats *out)
{
	*out = r->st;
}

void mp_runner_stats_reset(struct mp_runner *r)
{
	memset(&r->st, 0, sizeof(r->st));
}
