// SPDX-License-Identifier: MIT
/*
 * Rows from several sources: spare rows of the range bound to experts of
 * other files (adapters, variants of the model), each with its own tier,
 * paged under the pager's one budget, eviction policy and queues.
 */
#include <errno.h>
#include <string.h>

#include <moepager/source.h>

#include "base/base.h"
#include "pager/pager_priv.h"
#include "tier/inject.h"

void mp_pager_rows_init(struct mp_pager *p)
{
	for (uint32_t l = 0; l < p->layers; l++) {
		for (uint32_t e = 0; e < p->experts; e++) {
			const struct mp_expert_info *x = mp_store_expert(p->store, l, e);
			struct row_origin *o = &p->origin[mp_pager_slot(p, l, e)];

			*o = (struct row_origin){ .offset = x->offset, .checksum = x->checksum,
						  .src = 0, .expert = e };
		}
	}
}

void mp_pager_rows_fini(struct mp_pager *p)
{
	for (uint32_t i = 1; i <= MP_PAGER_MAX_SOURCES; i++)
		mp_tier_destroy(p->srcs[i].tier);
}

struct mp_tier *mp_pager_row_tier(struct mp_pager *p, uint32_t slot)
{
	uint32_t src = p->origin[slot].src;

	return src ? p->srcs[src].tier : p->tier;
}

/* Opens a tier over path in a free entry. Returns the source id or -errno. */
static int add_source(struct mp_pager *p, const char *path, struct mp_store *s,
		      struct mp_adapter *a)
{
	struct mp_tier *t;
	uint32_t i;
	int err;

	err = mp_tier_file_open_path(path, &p->tier_cfg, &t);
	if (err)
		return err;
	/* Fault rules (a read:rate= cap) are the device's: every source's reads pass them. */
	err = mp_tier_inject_share(p->fault_tier, &t);
	if (err) {
		mp_tier_destroy(t);
		return plog_err(p, err, "%s: out of memory", path);
	}
	pthread_mutex_lock(&p->lock);
	for (i = 1; i <= MP_PAGER_MAX_SOURCES && p->srcs[i].tier; i++)
		;
	if (i <= MP_PAGER_MAX_SOURCES)
		p->srcs[i] = (struct row_src){ .tier = t, .store = s, .adapter = a };
	pthread_mutex_unlock(&p->lock);
	if (i > MP_PAGER_MAX_SOURCES) {
		mp_tier_destroy(t);
		return plog_err(p, -ENOSPC, "%s: all %u row sources are in use", path,
				MP_PAGER_MAX_SOURCES);
	}
	plog_debug(p, "row source %u: %s", i, path);
	return (int)i;
}

int mp_pager_add_store(struct mp_pager *p, struct mp_store *s)
{
	const struct mp_geometry *g;

	if (!s)
		return plog_err(p, -EINVAL, "add_store: no store");
	g = mp_store_geometry(s);
	if (memcmp(g, &p->geo, sizeof(*g)) ||
	    mp_store_expert_bytes(s) != p->expert_bytes)
		return plog_err(p, -EMEDIUMTYPE, "%s: not a variant of %s: its geometry (%u "
				"layers x %u experts, hidden %u, ffn %u) differs", mp_store_path(s),
				mp_store_path(p->store), g->layers, g->experts, g->hidden, g->ffn);
	return add_source(p, mp_store_path(s), s, NULL);
}

int mp_pager_add_adapter(struct mp_pager *p, struct mp_adapter *a)
{
	int err;

	if (!a)
		return plog_err(p, -EINVAL, "add_adapter: no adapter");
	err = mp_adapter_check_base(a, p->store);
	if (err)
		return err;
	return add_source(p, mp_adapter_path(a), NULL, a);
}

int mp_pager_remove_source(struct mp_pager *p, int source)
{
	struct mp_tier *t = NULL;
	int err = 0;

	pthread_mutex_lock(&p->lock);
	if (source < 1 || source > (int)MP_PAGER_MAX_SOURCES || !p->srcs[source].tier)
		err = -EINVAL;
	else if (p->srcs[source].rows)
		err = -EBUSY;
	if (!err) {
		t = p->srcs[source].tier;
		p->srcs[source] = (struct row_src){ 0 };
	}
	pthread_mutex_unlock(&p->lock);
	if (err)
		return plog_err(p, err, "remove_source %d: %s", source, err == -EBUSY ?
				"rows are still bound to it" : "no such source");
	mp_tier_destroy(t);
	return 0;
}

/* The extent of expert (layer, expert) in source src (called locked). */
static int source_extent(struct mp_pager *p, uint32_t src, uint32_t layer, uint32_t expert,
			 struct row_origin *o)
{
	const struct row_src *rs = &p->srcs[src];

	*o = (struct row_origin){ .src = src, .expert = expert };
	if (rs->store) {
		const struct mp_expert_info *x;

		if (expert >= p->experts)
			return plog_err(p, -EINVAL, "bind: %s has no expert %u in layer %u",
					mp_store_path(rs->store), expert, layer);
		x = mp_store_expert(rs->store, layer, expert);
		o->offset = x->offset;
		o->checksum = x->checksum;
	} else {
		const struct mp_adapter_expert *x = mp_adapter_find(rs->adapter, layer, expert);

		if (!x)
			return plog_err(p, -ENOENT, "bind: adapter %s does not replace layer %u "
					"expert %u", mp_adapter_path(rs->adapter), layer, expert);
		o->offset = x->offset;
		o->checksum = x->checksum;
	}
	return 0;
}

/* The slot of a spare row, or an error naming it. */
static int spare_row(struct mp_pager *p, uint32_t layer, uint32_t row, const char *what)
{
	if (layer >= p->layers || row < p->experts || row >= p->slots_per_layer)
		return plog_err(p, -EINVAL, "%s: layer %u row %u is not a spare row (rows %u..%u "
				"of %u layers)", what, layer, row, p->experts,
				p->slots_per_layer - 1, p->layers);
	return 0;
}

int mp_pager_bind(struct mp_pager *p, uint32_t layer, uint32_t row, int source,
		  uint32_t expert)
{
	struct row_origin o;
	uint32_t slot;
	struct slot *s;
	int err;

	err = spare_row(p, layer, row, "bind");
	if (err)
		return err;
	slot = mp_pager_slot(p, layer, row);
	s = &p->slots[slot];
	pthread_mutex_lock(&p->lock);
	if (source < 1 || source > (int)MP_PAGER_MAX_SOURCES || !p->srcs[source].tier)
		err = plog_err(p, -EINVAL, "bind: layer %u row %u: no source %d", layer, row,
			       source);
	else if (s->state != ST_UNUSED)
		err = plog_err(p, -EEXIST, "bind: layer %u row %u is already bound", layer, row);
	else
		err = source_extent(p, (uint32_t)source, layer, expert, &o);
	if (err)
		goto unlock;
	p->origin[slot] = o;
	p->srcs[source].rows++;
	/* A touch while it was spare left poison markers: zap them first. */
	if (s->tail_poisoned) {
		s->state = ST_CLEARING;
		pthread_mutex_unlock(&p->lock);
		err = mp_region_slot_clear(p->region, slot);
		pthread_mutex_lock(&p->lock);
		s->tail_poisoned = err != 0;
	}
	s->state = ST_EMPTY;
	s->err = 0;
	pthread_cond_broadcast(&p->state_cv);
unlock:
	pthread_mutex_unlock(&p->lock);
	return err;
}

/* Brings a bound row back to EMPTY (called locked; drops the lock to wait or move pages). */
static void drain_row(struct mp_pager *p, uint32_t slot)
{
	struct slot *s = &p->slots[slot];

	for (;;) {
		if (s->queued)
			mp_pager_unqueue(p, slot);
		if (s->state == ST_EMPTY)
			return;
		if (s->state == ST_MAPPED || s->state == ST_HOST) {
			if (!mp_pager_evict_locked(p, slot, false))
				continue;
		} else if (s->state == ST_POISONED) {
			/* Closing: the markers stay; a later bind zaps them. */
			if (atomic_load(&p->closing) || p->broken) {
				s->tail_poisoned = true;
				return;
			}
			pthread_mutex_unlock(&p->lock);
			mp_pager_clear(p, slot);
			pthread_mutex_lock(&p->lock);
			continue;
		}
		/* A read, a move or a clear is running (or pinned pages): wait for it. */
		mp_pager_wait_ns(p, &p->state_cv, 10 * 1000 * 1000);
	}
}

int mp_pager_unbind(struct mp_pager *p, uint32_t layer, uint32_t row)
{
	uint32_t slot;
	struct slot *s;
	int err;

	err = spare_row(p, layer, row, "unbind");
	if (err)
		return err;
	slot = mp_pager_slot(p, layer, row);
	s = &p->slots[slot];
	pthread_mutex_lock(&p->lock);
	if (s->state == ST_UNUSED) {
		pthread_mutex_unlock(&p->lock);
		return plog_err(p, -EINVAL, "unbind: layer %u row %u is not bound", layer, row);
	}
	drain_row(p, slot);
	s->state = ST_UNUSED;
	p->srcs[p->origin[slot].src].rows--;
	p->origin[slot] = (struct row_origin){ 0 };
	pthread_mutex_unlock(&p->lock);
	return 0;
}

static int ops_add_adapter(void *ctx, struct mp_adapter *a)
{
	return mp_pager_add_adapter(ctx, a);
}

static int ops_add_store(void *ctx, struct mp_store *s)
{
	return mp_pager_add_store(ctx, s);
}

static int ops_remove_source(void *ctx, int source)
{
	return mp_pager_remove_source(ctx, source);
}

static int ops_bind(void *ctx, uint32_t layer, uint32_t row, int source, uint32_t expert)
{
	return mp_pager_bind(ctx, layer, row, source, expert);
}

static int ops_unbind(void *ctx, uint32_t layer, uint32_t row)
{
	return mp_pager_unbind(ctx, layer, row);
}

static int ops_prefetch(void *ctx, uint32_t layer, uint32_t row, int priority)
{
	return mp_pager_prefetch(ctx, layer, row, priority);
}

static const struct mp_row_ops pager_row_ops = {
	.add_adapter = ops_add_adapter,
	.add_store = ops_add_store,
	.remove_source = ops_remove_source,
	.bind = ops_bind,
	.unbind = ops_unbind,
	.prefetch = ops_prefetch,
};

const struct mp_row_ops *mp_pager_row_ops(void)
{
	return &pager_row_ops;
}
