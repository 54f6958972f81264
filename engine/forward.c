// SPDX-License-Identifier: MIT
/*
 * One forward step over a batch: the rows of every item (prefill chunks and
 * decode tokens of many sequences) go through each layer together. Dense
 * products run once over all rows; attention runs per sequence over its own
 * KV cache; the MoE layer reads each routed expert once for the rows that
 * chose it. A row's arithmetic does not depend on the rows beside it (the
 * engines' products are batch-invariant and every sum runs in the same
 * order), so a sequence gets the same bits in a batch as alone.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/probes.h"
#include "engine/engine_impl.h"
#include "engine/runner_priv.h"

static float *falloc(size_t n)
{
	return aligned_alloc(64, MP_ALIGN_UP(n * sizeof(float), 64));
}

void mp_runner_free_activations(struct mp_runner *r)
{
	float **f[] = { &r->x, &r->xn, &r->q, &r->k, &r->v, &r->att, &r->tmp, &r->moe,
			&r->rlogits, &r->gw, &r->xg, &r->eo, &r->last, &r->lbuf, &r->qkv };
	uint32_t **u[] = { &r->ids, &r->row_of, &r->count, &r->order, &r->offset, &r->em };

	for (size_t i = 0; i < MP_ARRAY_SIZE(f); i++) {
		free(*f[i]);
		*f[i] = NULL;
	}
	for (size_t i = 0; i < MP_ARRAY_SIZE(u); i++) {
		free(*u[i]);
		*u[i] = NULL;
	}
	free(r->items);
	free(r->runs);
	free(r->maps);
	free(r->ew);
	r->ew = NULL;
	r->items = NULL;
	r->runs = NULL;
	r->maps = NULL;
	r->cap = r->cap_items = 0;
}

int mp_runner_reserve(struct mp_runner *r, uint32_t rows, uint32_t count)
{
	const struct mp_geometry *g = &r->g;
	const size_t h = g->hidden, k = g->topk;

	if (rows <= r->cap && count <= r->cap_items)
		return 0;
	rows = MP_MAX(rows, r->cap);
	count = MP_MAX(count, r->cap_items);
	mp_runner_free_activations(r);
	r->x = falloc(rows * h);
	r->xn = falloc(rows * h);
	r->tmp = falloc(rows * h);
	r->moe = falloc(rows * h);
	r->q = falloc((size_t)rows * r->qdim);
	r->att = falloc((size_t)rows * r->qdim);
	r->k = falloc((size_t)rows * r->kvdim);
	r->v = falloc((size_t)rows * r->kvdim);
	r->qkv = falloc((size_t)rows * (r->qdim + 2ull * r->kvdim));
	r->rlogits = falloc((size_t)rows * g->experts);
	r->gw = falloc(rows * k);
	r->xg = falloc(rows * k * h);
	r->eo = falloc(rows * k * h);
	r->last = falloc(count * h);
	r->lbuf = falloc((size_t)count * g->vocab);
	r->ids = calloc(rows * k, sizeof(uint32_t));
	r->maps = calloc(rows, sizeof(*r->maps));
	r->row_of = calloc(rows * k, sizeof(uint32_t));
	r->count = calloc(r->expert_rows, sizeof(uint32_t));
	r->order = calloc(r->expert_rows, sizeof(uint32_t));
	r->offset = calloc(r->expert_rows, sizeof(uint32_t));
	r->ew = calloc(r->expert_rows, sizeof(*r->ew));
	r->em = calloc(r->expert_rows, sizeof(uint32_t));
	r->items = calloc(count, sizeof(*r->items));
	r->runs = calloc(count, sizeof(*r->runs));
	if (!r->x || !r->xn || !r->tmp || !r->moe || !r->q || !r->att || !r->k || !r->v || !r->qkv ||
	    !r->rlogits || !r->gw || !r->xg || !r->eo || !r->last || !r->lbuf || !r->ids || !r->maps ||
	    !r->row_of || !r->count || !r->order || !r->offset || !r->ew || !r->em || !r->items ||
	    !r->runs) {
		mp_runner_free_activations(r);
		return mp_err(-ENOMEM, "runner: out of memory for the activations of %u tokens",
			      rows);
	}
	r->cap = rows;
	r->cap_items = count;
	return 0;
}

static void embed(struct mp_runner *r, const struct step_item *it)
{
	const struct dense_set *d = &r->models[it->seq->model];
	const size_t row = mp_dtype_bytes(d->embd_dtype, r->g.hidden);

	for (uint32_t t = 0; t < it->n; t++)
		mp_dtype_to_f32(d->embd_dtype, (const char *)d->tok_embd + it->tokens[t] * row,
				r->x + (size_t)(it->first + t) * r->g.hidden, r->g.hidden);
}

static void add(float *y, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
}

/* RoPE, the cache append and attention for one item's rows, in its own sequence. */
static int attend(struct mp_runner *r, uint32_t l, const struct step_item *it)
{
	const struct mp_geometry *g = &r->g;
	struct mp_seq *s = it->seq;
	const size_t layer_off = (size_t)l * s->max_seq * r->kvdim;
	float *q = r->q + (size_t)it->first * r->qdim, *k = r->k + (size_t)it->first * r->kvdim;
	const float *v = r->v + (size_t)it->first * r->kvdim;
	struct mp_attention a = {
		.q = q, .k_cache = s->kcache + layer_off, .v_cache = s->vcache + layer_off,
		.out = r->att + (size_t)it->first * r->qdim, .n = it->n, .pos0 = s->pos,
		.heads = g->heads, .kv_heads = g->kv_heads, .head_dim = g->head_dim,
	};
	int err;

	if ((err = mp_engine_rope(r->e, q, it->n, g->heads, g->head_dim, s->pos,
				  g->rope_theta)) ||
	    (err = mp_engine_rope(r->e, k, it->n, g->kv_heads, g->head_dim, s->pos,
				  g->rope_theta)))
		return err;
	memcpy(s->kcache + layer_off + (size_t)s->pos * r->kvdim, k,
	       (size_t)it->n * r->kvdim * sizeof(float));
	memcpy(s->vcache + layer_off + (size_t)s->pos * r->kvdim, v,
	       (size_t)it->n * r->kvdim * sizeof(float));
	return mp_engine_attention(r->e, &a);
}

/* A dense product over w as the runner keeps it: packed (MP_RUNNER_PACK_DENSE) or row-major. */
static int dense_matmul(struct mp_runner *r, bool packed, enum mp_dtype dt, const void *w,
			uint32_t rows, uint32_t cols, const float *x, uint32_t n, float *y)
{
	return (packed ? mp_engine_matmul_packed : mp_engine_matmul)(r->e, NULL, dt, w, rows, cols,
								     x, n, y);
}

/* A run's Q, K and V: its model's norm and projections over its rows. */
static int qkv(struct mp_runner *r, uint32_t l, const struct step_run *run)
{
	const struct mp_geometry *g = &r->g;
	const struct layer_weights *lw = &run->d->layers[l];
	const size_t f = run->first;
	float *xn = r->xn + f * g->hidden;
	int err;

	if ((err = mp_engine_rmsnorm(r->e, r->x + f * g->hidden, lw->attn_norm, g->hidden,
				     run->rows, g->norm_eps, xn)))
		return err;
	if (lw->wqkv) {
		const uint32_t all = r->qdim + 2 * r->kvdim;
		const float *y = r->qkv + f * all;

		err = dense_matmul(r, lw->attn_packed, g->dtype, lw->wqkv, all, g->hidden, xn,
				   run->rows, r->qkv + f * all);
		for (uint32_t t = 0; t < run->rows && !err; t++, y += all) {
			memcpy(r->q + (f + t) * r->qdim, y, r->qdim * sizeof(float));
			memcpy(r->k + (f + t) * r->kvdim, y + r->qdim, r->kvdim * sizeof(float));
			memcpy(r->v + (f + t) * r->kvdim, y + r->qdim + r->kvdim,
			       r->kvdim * sizeof(float));
		}
		return err;
	}
	if ((err = dense_matmul(r, lw->attn_packed, g->dtype, lw->wq, r->qdim, g->hidden, xn,
				run->rows, r->q + f * r->qdim)) ||
	    (err = dense_matmul(r, lw->attn_packed, g->dtype, lw->wk, r->kvdim, g->hidden, xn,
				run->rows, r->k + f * r->kvdim)))
		return err;
	return dense_matmul(r, lw->attn_packed, g->dtype, lw->wv, r->kvdim, g->hidden, xn,
			    run->rows, r->v + f * r->kvdim);
}

static int attention(struct mp_runner *r, uint32_t l, const struct step_item *items,
		     uint32_t count, uint32_t n)
{
	const struct mp_geometry *g = &r->g;
	int err;

	for (uint32_t i = 0; i < r->n_runs; i++)
		if ((err = qkv(r, l, &r->runs[i])))
			return err;
	for (uint32_t i = 0; i < count; i++)
		if ((err = attend(r, l, &items[i])))
			return err;
	for (uint32_t i = 0; i < r->n_runs; i++) {
		const struct step_run *run = &r->runs[i];
		const struct layer_weights *lw = &run->d->layers[l];

		err = dense_matmul(r, lw->attn_packed, g->dtype, lw->wo, g->hidden, r->qdim,
				   r->att + (size_t)run->first * r->qdim, run->rows,
				   r->tmp + (size_t)run->first * g->hidden);
		if (err)
			return err;
	}
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

/* Replaces the router's choice for a decode step by the sequence's trace's. */
static int force_route(struct mp_runner *r, const struct mp_seq *s, uint32_t l,
		       const float *logits, uint32_t *ids, float *w)
{
	const uint32_t k = r->g.topk;
	const uint32_t *tids;
	const float *tw;
	float max = -INFINITY, sum = 0.0f;
	int err = mp_trace_route(s->trace, s->trace_request, s->steps, l, &tids, &tw);

	if (err)
		return mp_err(err, "runner: trace has no routing for request %u token %u layer %u",
			      s->trace_request, s->steps, l);
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

/* A timed one-token step's routed experts in memory, before they are reported. */
static void pass_hits(struct mp_runner *r, uint32_t l, const struct step_item *items,
		      uint32_t count)
{
	r->pass_hits = -1;
	if (!r->layer_times || count != 1 || items[0].n != 1 || !r->src->resident)
		return;
	r->pass_hits = 0;
	for (uint32_t j = 0; j < r->g.topk && r->pass_hits >= 0; j++) {
		int in = r->src->resident(r->src_ctx, l, r->ids[j]);

		r->pass_hits = in < 0 ? -1 : r->pass_hits + (in > 0);
	}
}

static void count_ns(uint64_t *c, uint64_t v)
{
	__atomic_fetch_add(c, v, __ATOMIC_RELAXED);
}

/* A one-token step's layer: its attention and MoE times, the MoE's by the hits. */
static void layer_time(struct mp_runner *r, uint64_t t0, uint64_t t1, uint64_t t2)
{
	struct mp_runner_layer_times *lt = &r->lt;

	count_ns(&lt->attn_passes, 1);
	count_ns(&lt->attn_ns, t1 - t0);
	if (r->pass_hits < 0)
		return;
	count_ns(&lt->moe_passes[r->pass_hits], 1);
	count_ns(&lt->moe_ns[r->pass_hits], t2 - t1);
}

/* The router's top-k of every row (a trace's for traced decode rows), reported to the source. */
static int route(struct mp_runner *r, uint32_t l, const struct step_item *items, uint32_t count)
{
	const struct mp_geometry *g = &r->g;
	const uint32_t k = g->topk;
	int err;

	for (uint32_t i = 0; i < count; i++) {
		const struct step_item *it = &items[i];

		for (uint32_t t = it->first; t < it->first + it->n; t++) {
			const float *lg = r->rlogits + (size_t)t * g->experts;

			err = mp_engine_topk(r->e, lg, g->experts, k, r->ids + (size_t)t * k,
					     r->gw + (size_t)t * k);
			if (!err && it->decode && it->seq->trace)
				err = force_route(r, it->seq, l, lg, r->ids + (size_t)t * k,
						  r->gw + (size_t)t * k);
			if (err)
				return err;
			r->maps[t] = it->seq->map ? it->seq->map[l] : NULL;
		}
	}
	/* A sequence's map sends its rows to its own experts (an adapter's, a variant's). */
	mp_reroute(r->ids, items[count - 1].first + items[count - 1].n, k, r->maps);
	pass_hits(r, l, items, count);
	/* Every decision of the layer is reported before any of its experts is read. */
	for (uint32_t i = 0; i < count; i++) {
		const struct step_item *it = &items[i];
		const struct mp_seq *s = it->seq;
		const uint32_t token = it->decode ? s->steps : MP_TOKEN_PROMPT;

		for (uint32_t t = it->first; t < it->first + it->n; t++) {
			const uint32_t *ids = r->ids + (size_t)t * k;
			const float *w = r->gw + (size_t)t * k;

			MP_PROBE(route, s->request, token, l, k, ids, w);
			r->st.route_calls++;
			if (it->decode && r->src->gate)
				r->src->gate(r->src_ctx, s->request, token, l,
					     r->rlogits + (size_t)t * g->experts, g->experts,
					     r->xn + (size_t)t * g->hidden, g->hidden);
			if (!r->src->route)
				continue;
			err = r->src->route(r->src_ctx, s->request, token, l, ids, w, k);
			if (err)
				return mp_err(err, "runner: layer %u position %u: the expert source "
					      "refused the routing of request %u: %s", l,
					      s->pos + t - it->first, s->request, strerror(-err));
		}
	}
	return 0;
}

void mp_reroute(uint32_t *ids, uint32_t n, uint32_t k, const uint32_t *const *maps)
{
	for (uint32_t t = 0; t < n; t++) {
		const uint32_t *m = maps[t];
		uint32_t *row = ids + (size_t)t * k;

		if (!m)
			continue;
		for (uint32_t j = 0; j < k; j++)
			row[j] = m[row[j]];
	}
}

int mp_reroute_table(uint32_t experts, uint32_t e_max, uint32_t index, const uint32_t *ids,
		     uint32_t n, uint32_t *table)
{
	if (n > e_max)
		return mp_err(-EINVAL, "adapter %u: %u experts at a layer, more than E_max %u",
			      index, n, e_max);
	for (uint32_t d = 0; d < n; d++)
		if (ids[d] >= experts || (d && ids[d] <= ids[d - 1]))
			return mp_err(-EINVAL, "adapter %u: expert id %u %s", index, ids[d],
				      ids[d] >= experts ? "out of range" : "not ascending");
	for (uint32_t e = 0; e < experts; e++)
		table[e] = e;
	for (uint32_t d = 0; d < n; d++)
		table[ids[d]] = experts + index * e_max + d;
	return 0;
}

/*
 * Groups the step's (row, choice) pairs by expert: experts in the order they
 * first appear (a lone token's experts in router order), each expert's rows
 * in row order, at offset[ex] of xg/eo. row_of maps a pair to its place.
 */
static uint32_t group(struct mp_runner *r, uint32_t n)
{
	const uint32_t k = r->g.topk;
	uint32_t ngroups = 0, next = 0;

	for (uint32_t p = 0; p < n * k; p++) {
		uint32_t ex = r->ids[p];

		if (!r->count[ex]++)
			r->order[ngroups++] = ex;
	}
	for (uint32_t i = 0; i < ngroups; i++) {
		r->offset[r->order[i]] = next;
		next += r->count[r->order[i]];
	}
	for (uint32_t p = 0; p < n * k; p++)
		r->row_of[p] = r->offset[r->ids[p]]++;
	return ngroups;
}

static const void *expert_at(struct mp_runner *r, uint32_t l, uint32_t ex)
{
	const void *w = r->src->expert(r->src_ctx, l, ex);

	if (!w)
		mp_err(-EIO, "runner: layer %u expert %u: the expert source has no address", l, ex);
	return w;
}

static void count_expert(struct mp_runner *r, uint32_t m)
{
	r->st.expert_calls++;
	r->st.expert_bytes += r->expert_bytes;
	r->st.expert_macs += 3ull * r->g.hidden * r->g.ffn * m;
}

static int run_expert(struct mp_runner *r, uint32_t l, uint32_t ex, uint32_t first, uint32_t m)
{
	const size_t h = r->g.hidden;
	const void *w = expert_at(r, l, ex);
	int err;

	if (!w)
		return -EIO;
	err = mp_engine_expert_ffn(r->e, r->gp, r->g.dtype, w, r->g.hidden, r->g.ffn,
				   r->xg + first * h, m, r->eo + first * h);
	if (err)
		return mp_err(err, "runner: layer %u expert %u: reading the expert failed: %s",
			      l, ex, strerror(-err));
	count_expert(r, m);
	return 0;
}

/*
 * A layer's packed (resident) experts, its ngroups groups in order, all in
 * one engine call: two pool runs a layer instead of two an expert (the
 * same bits, mp_engine_experts_ffn_packed()).
 */
static int run_packed_experts(struct mp_runner *r, uint32_t l, uint32_t ngroups)
{
	int err;

	for (uint32_t i = 0; i < ngroups; i++) {
		r->ew[i] = expert_at(r, l, r->order[i]);
		if (!r->ew[i])
			return -EIO;
		r->em[i] = r->count[r->order[i]];
	}
	err = mp_engine_experts_ffn_packed(r->e, r->gp, r->g.dtype, r->ew, ngroups, r->g.hidden,
					   r->g.ffn, r->xg, r->em, r->eo);
	if (err)
		return mp_err(err, "runner: layer %u: reading its %u experts failed: %s", l,
			      ngroups, strerror(-err));
	for (uint32_t i = 0; i < ngroups; i++)
		count_expert(r, r->em[i]);
	return 0;
}

/* Each routed expert once over the rows that chose it, then each row's sum in router order. */
static int experts(struct mp_runner *r, uint32_t l, uint32_t n)
{
	const uint32_t k = r->g.topk;
	const size_t h = r->g.hidden;
	uint32_t ngroups = group(r, n);
	int err = 0;

	for (uint32_t p = 0; p < n * k; p++)
		memcpy(r->xg + r->row_of[p] * h, r->xn + (p / k) * h, h * sizeof(float));
	if (r->experts_packed)
		err = run_packed_experts(r, l, ngroups);
	for (uint32_t i = 0; i < ngroups; i++) {
		uint32_t ex = r->order[i], m = r->count[ex];

		/* offset[ex] has moved past the group while rows were placed. */
		if (!err && !r->experts_packed)
			err = run_expert(r, l, ex, r->offset[ex] - m, m);
		r->count[ex] = 0;
	}
	if (err)
		return err;
	for (uint32_t t = 0; t < n; t++) {
		float *dst = r->moe + t * h;

		memset(dst, 0, h * sizeof(float));
		for (uint32_t i = 0; i < k; i++) {
			const float *src = r->eo + r->row_of[t * k + i] * h;
			const float w = r->gw[t * k + i];

			for (size_t c = 0; c < h; c++)
				dst[c] += w * src[c];
		}
	}
	add(r->x, r->moe, n * h);
	return 0;
}

static int moe(struct mp_runner *r, uint32_t l, const struct step_item *items, uint32_t count,
	       uint32_t n)
{
	const struct mp_geometry *g = &r->g;
	int err;

	/* Each run's norm and router (its model's); the experts over every row at once. */
	for (uint32_t i = 0; i < r->n_runs; i++) {
		const struct step_run *run = &r->runs[i];
		const struct layer_weights *lw = &run->d->layers[l];
		float *xn = r->xn + (size_t)run->first * g->hidden;

		if ((err = mp_engine_rmsnorm(r->e, r->x + (size_t)run->first * g->hidden,
					     lw->ffn_norm, g->hidden, run->rows, g->norm_eps,
					     xn)) ||
		    (err = dense_matmul(r, lw->router_packed, lw->router_dtype, lw->router,
					g->experts, g->hidden, xn, run->rows,
					r->rlogits + (size_t)run->first * g->experts)))
			return err;
	}
	if ((err = route(r, l, items, count)))
		return err;
	return experts(r, l, n);
}

/* The logits of every item's last row, into its sequence, with its model's head. */
static int logits(struct mp_runner *r, const struct step_item *items, uint32_t count)
{
	const struct mp_geometry *g = &r->g;
	int err = 0;

	for (uint32_t i = 0; i < count; i++)
		memcpy(r->last + (size_t)i * g->hidden,
		       r->x + (size_t)(items[i].first + items[i].n - 1) * g->hidden,
		       g->hidden * sizeof(float));
	for (uint32_t i = 0; i < r->n_runs && !err; i++) {
		const struct step_run *run = &r->runs[i];
		float *xn = r->xn + (size_t)run->item * g->hidden;

		err = mp_engine_rmsnorm(r->e, r->last + (size_t)run->item * g->hidden,
					run->d->output_norm, g->hidden, run->count, g->norm_eps, xn);
		if (!err)
			err = dense_matmul(r, run->d->output_packed, run->d->output_dtype,
					   run->d->output, g->vocab, g->hidden, xn, run->count,
					   r->lbuf + (size_t)run->item * g->vocab);
	}
	if (err)
		return err;
	for (uint32_t i = 0; i < count; i++)
		memcpy(items[i].seq->logits, r->lbuf + (size_t)i * g->vocab,
		       g->vocab * sizeof(float));
	return 0;
}

/*
 * The dense multiply-adds of a step, before the positions move: per row and
 * layer Q/K/V/O and the router, attention's scores and weighted sums over
 * the row's own causal window (pos + 1 positions), and the LM head for each
 * item's last row.
 */
static uint64_t dense_macs(const struct mp_runner *r, const struct step_item *items,
			   uint32_t count, uint32_t rows)
{
	const struct mp_geometry *g = &r->g;
	const uint64_t proj = (uint64_t)g->hidden *
			      (2ull * r->qdim + 2ull * r->kvdim + g->experts);
	uint64_t window = 0;

	/* Row t of an item at pos sees pos + t + 1 positions: n(pos + 1) + n(n - 1) / 2. */
	for (uint32_t i = 0; i < count; i++)
		window += (uint64_t)items[i].n * (items[i].seq->pos + 1) +
			  (uint64_t)items[i].n * (items[i].n - 1) / 2;
	return g->layers * (rows * proj + 2ull * g->heads * g->head_dim * window) +
	       (uint64_t)count * g->vocab * g->hidden;
}

int mp_runner_forward(struct mp_runner *r, struct step_item *items, uint32_t count,
		      uint32_t rows)
{
	const struct mp_geometry *g = &r->g;
	int err = 0;

	for (uint32_t i = 0; i < count; i++) {
		embed(r, &items[i]);
		if (items[i].decode && r->src->embed)
			r->src->embed(r->src_ctx, items[i].seq->request, items[i].seq->steps,
				      r->x + (size_t)items[i].first * g->hidden, g->hidden);
	}
	for (uint32_t l = 0; l < g->layers && !err; l++) {
		/* Two clock reads a layer, for one-token steps only (Table 1 is per token). */
		bool timed = r->layer_times && rows == 1;
		uint64_t t0 = timed ? mp_now_ns() : 0, t1 = 0;

		err = attention(r, l, items, count, rows);
		if (!err && timed)
			t1 = mp_now_ns();
		if (!err)
			err = moe(r, l, items, count, rows);
		if (!err && timed)
			layer_time(r, t0, t1, mp_now_ns());
	}
	if (!err)
		err = logits(r, items, count);
	if (err)
		return err;
	r->st.dense_macs += dense_macs(r, items, count, rows);
	for (uint32_t i = 0; i < count; i++) {
		items[i].seq->pos += items[i].n;
		items[i].seq->steps += items[i].decode;
	}
	r->st.steps++;
	r->st.tokens += rows;
	r->st.model_runs += r->n_runs;
	for (uint32_t i = 0; i < r->n_runs; i++) {
		const struct dense_set *d = r->runs[i].d;

		r->st.dense_bytes += g->layers * d->layer_bytes +
				     mp_dtype_bytes(d->output_dtype, (uint64_t)g->vocab * g->hidden) +
				     r->runs[i].rows * mp_dtype_bytes(d->embd_dtype, g->hidden) +
				     g->hidden * sizeof(float);
	}
	return 0;
}
