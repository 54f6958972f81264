// SPDX-License-Identifier: MIT
/*
 * Model variants served together (Multi-MoE): owned positions' experts in
 * host memory, the other models' unowned experts bound as pager rows, each
 * model's routed-id maps, and the expert source over both.
 */
#include <stdlib.h>
#include <string.h>

#include <moepager/multi.h>

#include "base/base.h"

#define PAGE 4096u

struct mp_multi {
	struct mp_multi_config cfg;
	uint32_t n, layers, experts;
	uint64_t expert_bytes, stride;
	int src[MP_CONSOL_MAX_MODELS];	/* pager source id of each model (0: none) */
	uint8_t *owned_mem;		/* the owned experts (mp_huge_map) */
	size_t owned_len;
	const void **owned;		/* [layers x experts]: the owner's bytes, or NULL */
	uint32_t *tables;		/* [n][layers][experts] */
	const uint32_t **maps;		/* [n][layers] */
	/* The same for the source's prefetcher: owned rows in memory as UINT32_MAX. */
	uint32_t *pf_tables;
	const uint32_t **pf_maps;
	uint32_t owned_n, bound;
	uint64_t owned_reads, paged_reads, owned_routes;
};

/* Reads the owned positions' experts into host memory (one block). */
static int read_owned(struct mp_multi *m)
{
	const struct mp_consolidation *c = m->cfg.map;
	uint32_t i = 0;
	int err;

	m->owned_n = mp_consolidation_capacity(c);
	m->owned = calloc((size_t)m->layers * m->experts, sizeof(*m->owned));
	if (!m->owned)
		return mp_err(-ENOMEM, "multi: out of memory");
	/* Paged: the owner's row is read like any other (owned[] stays NULL). */
	if (!m->owned_n || (m->cfg.flags & MP_MULTI_OWNED_PAGED))
		return 0;
	m->owned_len = (size_t)m->owned_n * m->stride;
	/* Huge pages, as the resident experts': the engine streams these rows alike. */
	m->owned_mem = mp_huge_map(m->owned_len);
	if (!m->owned_mem)
		return mp_err(-ENOMEM, "multi: out of memory for %u owned experts", m->owned_n);
	for (uint32_t l = 0; l < m->layers; l++) {
		for (uint32_t e = 0; e < m->experts; e++) {
			int y = mp_consolidation_owner(c, l, e);
			uint8_t *dst = m->owned_mem + (size_t)i * m->stride;

			if (y == MP_CONSOL_NONE)
				continue;
			err = mp_store_read_expert(m->cfg.models[y], l, e, dst);
			if (err)
				return err;
			m->owned[(size_t)l * m->experts + e] = dst;
			i++;
		}
	}
	return 0;
}

/*
 * Whether row x * E + e of a layer whose position e has owner y is model
 * x's to bind (x > 0): its unowned experts, and, paged, its owned ones.
 */
static bool binds(const struct mp_multi *m, uint32_t x, int y)
{
	return x && (y == MP_CONSOL_NONE ||
		     ((m->cfg.flags & MP_MULTI_OWNED_PAGED) && y == (int)x));
}

/* Model x's maps, and its rows bound (binds()) as x * E + e. */
static int map_model(struct mp_multi *m, uint32_t x)
{
	const struct mp_row_ops *ops = m->cfg.rows;
	int err;

	if (x) {
		m->src[x] = ops->add_store(m->cfg.rows_ctx, m->cfg.models[x]);
		if (m->src[x] < 0)
			return m->src[x];
	}
	for (uint32_t l = 0; l < m->layers; l++) {
		uint32_t *t = m->tables + ((size_t)x * m->layers + l) * m->experts;

		uint32_t *pt = m->pf_tables + (t - m->tables);

		m->maps[(size_t)x * m->layers + l] = t;
		m->pf_maps[(size_t)x * m->layers + l] = pt;
		for (uint32_t e = 0; e < m->experts; e++) {
			int y = mp_consolidation_owner(m->cfg.map, l, e);

			t[e] = (y == MP_CONSOL_NONE ? x : (uint32_t)y) * m->experts + e;
			pt[e] = m->owned[(size_t)l * m->experts + e] ? UINT32_MAX : t[e];
			if (!binds(m, x, y))
				continue;
			err = ops->bind(m->cfg.rows_ctx, l, t[e], m->src[x], e);
			if (err)
				return err;
			m->bound++;
		}
	}
	return 0;
}

static int check_config(const struct mp_multi_config *c)
{
	if (!c || !c->models || !c->n || c->n > MP_CONSOL_MAX_MODELS || !c->map || !c->source ||
	    !c->source->expert || !c->rows || !c->rows->add_store || !c->rows->bind ||
	    !c->rows->unbind || !c->rows->remove_source || (c->flags & ~MP_MULTI_OWNED_PAGED))
		return mp_err(-EINVAL, "multi: a config without models (1..%u), map, source or "
			      "row ops, or with unknown flags", MP_CONSOL_MAX_MODELS);
	if (mp_consolidation_models(c->map) != c->n)
		return mp_err(-EMEDIUMTYPE, "multi: the map consolidates %u models, %u given",
			      mp_consolidation_models(c->map), c->n);
	if (mp_check_reserved_ops(c->source->reserved, MP_ARRAY_SIZE(c->source->reserved),
				  "multi source") ||
	    mp_check_reserved_ops(c->rows->reserved, MP_ARRAY_SIZE(c->rows->reserved),
				  "multi row ops"))
		return -EINVAL;
	return mp_check_reserved(c->reserved, MP_ARRAY_SIZE(c->reserved), "multi config");
}

int mp_multi_open(const struct mp_multi_config *cfg, struct mp_multi **out)
{
	const struct mp_geometry *g;
	struct mp_multi *m;
	int err;

	*out = NULL;
	err = check_config(cfg);
	if (!err)
		err = mp_consolidation_check(cfg->map, cfg->models, cfg->n);
	if (err)
		return err;
	g = mp_store_geometry(cfg->models[0]);
	m = calloc(1, sizeof(*m));
	if (!m)
		return mp_err(-ENOMEM, "multi: out of memory");
	m->cfg = *cfg;
	m->n = cfg->n;
	m->layers = g->layers;
	m->experts = g->experts;
	m->expert_bytes = mp_store_expert_bytes(cfg->models[0]);
	m->stride = MP_ALIGN_UP(m->expert_bytes, PAGE);
	m->tables = malloc((size_t)m->n * m->layers * m->experts * sizeof(*m->tables));
	m->maps = calloc((size_t)m->n * m->layers, sizeof(*m->maps));
	m->pf_tables = malloc((size_t)m->n * m->layers * m->experts * sizeof(*m->pf_tables));
	m->pf_maps = calloc((size_t)m->n * m->layers, sizeof(*m->pf_maps));
	err = m->tables && m->maps && m->pf_tables && m->pf_maps ?
	      read_owned(m) : mp_err(-ENOMEM, "multi: out of memory");
	for (uint32_t x = 0; x < m->n && !err; x++)
		err = map_model(m, x);
	if (err) {
		mp_multi_close(m);
		return err;
	}
	mp_info("multi: %u models, %u of %u positions owned (%.1f MiB in memory), %u rows of "
		"the other models' own experts paged", m->n, m->owned_n, m->layers * m->experts,
		(double)m->owned_len / (1 << 20), m->bound);
	*out = m;
	return 0;
}

void mp_multi_close(struct mp_multi *m)
{
	if (!m)
		return;
	/* Rows bound so far: binds() of each layer mapped, for each model with a source. */
	for (uint32_t x = 1; x < m->n && m->maps; x++) {
		if (m->src[x] <= 0)
			continue;
		for (uint32_t l = 0; l < m->layers && m->maps[(size_t)x * m->layers + l]; l++)
			for (uint32_t e = 0; e < m->experts; e++)
				if (binds(m, x, mp_consolidation_owner(m->cfg.map, l, e)))
					m->cfg.rows->unbind(m->cfg.rows_ctx, l, x * m->experts + e);
		m->cfg.rows->remove_source(m->cfg.rows_ctx, m->src[x]);
	}
	mp_huge_unmap(m->owned_mem, m->owned_len);
	free(m->owned);
	free(m->tables);
	free(m->maps);
	free(m->pf_tables);
	free(m->pf_maps);
	free(m);
}

uint32_t mp_multi_rows(const struct mp_multi *m)
{
	return m->n * m->experts;
}

const uint32_t *const *mp_multi_map(const struct mp_multi *m, uint32_t i)
{
	return i < m->n ? m->maps + (size_t)i * m->layers : NULL;
}

const uint32_t *const *mp_multi_prefetch_map(const struct mp_multi *m, uint32_t i)
{
	return i < m->n ? m->pf_maps + (size_t)i * m->layers : NULL;
}

void mp_multi_stats(struct mp_multi *m, struct mp_multi_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->models = m->n;
	out->owned = m->owned_n;
	out->owned_bytes = m->owned_len;
	out->bound = m->bound;
	out->owned_reads = __atomic_load_n(&m->owned_reads, __ATOMIC_RELAXED);
	out->paged_reads = __atomic_load_n(&m->paged_reads, __ATOMIC_RELAXED);
	out->owned_routes = __atomic_load_n(&m->owned_routes, __ATOMIC_RELAXED);
}

/* The owned bytes row stands for, or NULL when the row is paged. */
static const void *owned_row(const struct mp_multi *m, uint32_t layer, uint32_t row)
{
	uint32_t e = row % m->experts;

	if (layer >= m->layers || row >= m->n * m->experts)
		return NULL;
	return m->owned[(size_t)layer * m->experts + e];
}

static const void *multi_expert(void *ctx, uint32_t layer, uint32_t row)
{
	struct mp_multi *m = ctx;
	const void *p = owned_row(m, layer, row);

	if (p) {
		__atomic_fetch_add(&m->owned_reads, 1, __ATOMIC_RELAXED);
		return p;
	}
	__atomic_fetch_add(&m->paged_reads, 1, __ATOMIC_RELAXED);
	return m->cfg.source->expert(m->cfg.source_ctx, layer, row);
}

/* The pager hears of the paged rows only: owned ones are the set's memory. */
static int multi_route(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		       const uint32_t *ids, const float *weights, uint32_t k)
{
	struct mp_multi *m = ctx;
	uint32_t paged[MP_MAX_TOPK], n = 0;
	float w[MP_MAX_TOPK];

	for (uint32_t j = 0; j < k && j < MP_MAX_TOPK; j++) {
		if (owned_row(m, layer, ids[j]))
			continue;
		paged[n] = ids[j];
		w[n++] = weights ? weights[j] : 0.0f;
	}
	__atomic_fetch_add(&m->owned_routes, MP_MIN(k, MP_MAX_TOPK) - n, __ATOMIC_RELAXED);
	if (!n || !m->cfg.source->route)
		return 0;
	return m->cfg.source->route(m->cfg.source_ctx, request, token, layer, paged,
				    weights ? w : NULL, n);
}

static int multi_guard(void *ctx, int (*fn)(void *arg), void *arg)
{
	struct mp_multi *m = ctx;

	return m->cfg.source->guard ? m->cfg.source->guard(m->cfg.source_ctx, fn, arg) : fn(arg);
}

static void multi_gate(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		       const float *logits, uint32_t experts, const float *x, uint32_t hidden)
{
	struct mp_multi *m = ctx;

	if (m->cfg.source->gate)
		m->cfg.source->gate(m->cfg.source_ctx, request, token, layer, logits, experts, x,
				    hidden);
}

static void multi_embed(void *ctx, uint32_t request, uint32_t token, const float *e,
			uint32_t hidden)
{
	struct mp_multi *m = ctx;

	if (m->cfg.source->embed)
		m->cfg.source->embed(m->cfg.source_ctx, request, token, e, hidden);
}

/*
 * A request's map reaches the source's prefetcher as its twin without the
 * owned rows in memory, so predictions fetch the model's own unowned rows
 * (any model's: the paper has no prefetch) and never an owned position.
 */
static void multi_seq_map(void *ctx, uint32_t request, const uint32_t *const *map)
{
	struct mp_multi *m = ctx;
	const uint32_t *const *pf = map;

	if (!m->cfg.source->seq_map)
		return;
	for (uint32_t x = 0; map && x < m->n; x++)
		if (map == (const uint32_t *const *)m->maps + (size_t)x * m->layers)
			pf = m->pf_maps + (size_t)x * m->layers;
	m->cfg.source->seq_map(m->cfg.source_ctx, request, pf);
}

/* Owned rows are the set's memory; the others are the source's to say. */
static int multi_resident(void *ctx, uint32_t layer, uint32_t row)
{
	struct mp_multi *m = ctx;

	if (owned_row(m, layer, row))
		return 1;
	return m->cfg.source->resident ? m->cfg.source->resident(m->cfg.source_ctx, layer, row)
				       : -EOPNOTSUPP;
}

static const struct mp_expert_source_ops multi_ops = {
	.expert = multi_expert,
	.route = multi_route,
	.guard = multi_guard,
	.gate = multi_gate,
	.embed = multi_embed,
	.seq_map = multi_seq_map,
	.resident = multi_resident,
};

const struct mp_expert_source_ops *mp_multi_source_ops(void)
{
	return &multi_ops;
}
