// SPDX-License-Identifier: MIT
/*
 * Adapter slots over one base (ExpertWeave): loading into a free slot,
 * unloading after the last request, the per-adapter routed-id maps, and the
 * expert source that puts adapter rows after the base's.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/adapters.h>

#include "base/base.h"

#define PAGE		4096u
/* A request's own rows go ahead of any prediction (a prefetcher's priorities reach 1e9). */
#define WARM_PRIORITY	1000000000

enum slot_state { SLOT_FREE, SLOT_LOADING, SLOT_READY, SLOT_DRAINING };

struct slot {
	enum slot_state state;
	uint32_t refs;			/* requests holding its maps */
	char name[MP_ADAPTER_NAME_MAX];
	uint8_t *mem;			/* its experts (mp_huge_map) */
	size_t mem_len;
	const void **rows;		/* [layers * e_max]: a row's bytes, NULL when unused */
	uint32_t *tables;		/* [layers * experts]: the routed-id maps */
	const uint32_t **maps;		/* [layers]: tables of the layers it changes, else NULL */
	uint64_t adapter_bytes;
	/* Paged (cfg.rows): the open adapter, its source id in the pager, rows bound so far. */
	struct mp_adapter *a;
	int src;
	uint32_t bound;
};

struct mp_adapters {
	struct mp_adapters_config cfg;
	uint32_t layers, experts, e_max, n_slots;
	uint64_t expert_bytes, stride;
	pthread_mutex_t lock;		/* slot states, names, refs, counters */
	struct slot *slots;
	uint64_t loads, unloads, load_errors, requests;
	double load_seconds;
};

int mp_adapters_open(const struct mp_adapters_config *cfg, struct mp_adapters **out)
{
	const struct mp_geometry *g;
	struct mp_adapters *set;
	int err;

	if (!cfg || !cfg->base || !cfg->source || !cfg->source->expert || !out)
		return mp_err(-EINVAL, "mp_adapters_open: NULL base or source");
	*out = NULL;
	err = mp_check_reserved_ops(cfg->source->reserved, MP_ARRAY_SIZE(cfg->source->reserved),
				    "adapters source");
	if (!err && cfg->rows)
		err = mp_check_reserved_ops(cfg->rows->reserved, MP_ARRAY_SIZE(cfg->rows->reserved),
					    "adapters row ops");
	if (!err && cfg->warm_rows && (!cfg->rows || !cfg->rows->prefetch))
		err = mp_err(-EINVAL, "adapters: warm_rows needs paged rows whose ops can prefetch");
	if (err)
		return err;
	g = mp_store_geometry(cfg->base);
	set = calloc(1, sizeof(*set));
	if (!set)
		return mp_err(-ENOMEM, "adapters: out of memory");
	set->cfg = *cfg;
	set->layers = g->layers;
	set->experts = g->experts;
	set->n_slots = cfg->slots ? cfg->slots : MP_ADAPTERS_DEFAULT_SLOTS;
	set->e_max = cfg->e_max ? cfg->e_max : MP_MAX(1u, g->experts / 4);
	set->expert_bytes = mp_store_expert_bytes(cfg->base);
	set->stride = MP_ALIGN_UP(set->expert_bytes, PAGE);
	if ((cfg->rows && cfg->padded) ||
	    (cfg->rows && (!cfg->rows->add_adapter || !cfg->rows->bind || !cfg->rows->unbind ||
			   !cfg->rows->remove_source))) {
		free(set);
		return mp_err(-EINVAL, "adapters: paged rows need every row op, and the padded "
			      "layout holds its rows in host memory");
	}
	if (set->e_max > g->experts ||
	    (uint64_t)set->n_slots * set->e_max > MP_MAX_EXPERTS * 64ull) {
		free(set);
		return mp_err(-EINVAL, "adapters: %u slots of E_max %u rows over %u experts is "
			      "impossible (E_max <= experts, N x E_max <= %u)", cfg->slots,
			      cfg->e_max, g->experts, MP_MAX_EXPERTS * 64);
	}
	set->slots = calloc(set->n_slots, sizeof(*set->slots));
	if (!set->slots) {
		free(set);
		return mp_err(-ENOMEM, "adapters: out of memory for the slots");
	}
	pthread_mutex_init(&set->lock, NULL);
	*out = set;
	return 0;
}

/* Paged: unbinds the rows bound so far (layer by layer, as loaded) and drops the source. */
static void slot_unbind(struct mp_adapters *set, struct slot *s)
{
	const struct mp_row_ops *ops = set->cfg.rows;
	uint32_t left = s->bound;

	for (uint32_t l = 0; l < set->layers && left; l++) {
		uint32_t n, i = (uint32_t)(s - set->slots);

		mp_adapter_layer(s->a, l, &n);
		for (uint32_t d = 0; d < n && left; d++, left--)
			ops->unbind(set->cfg.rows_ctx, l, set->experts + i * set->e_max + d);
	}
	if (s->src > 0)
		ops->remove_source(set->cfg.rows_ctx, s->src);
	mp_adapter_close(s->a);
	s->a = NULL;
	s->src = 0;
	s->bound = 0;
}

/* Frees a slot's memory; the slot keeps its state (the caller sets it). */
static void slot_free(struct mp_adapters *set, struct slot *s)
{
	if (s->a)
		slot_unbind(set, s);
	mp_huge_unmap(s->mem, s->mem_len);
	free(s->rows);
	free(s->tables);
	free(s->maps);
	s->mem = NULL;
	s->rows = NULL;
	s->tables = NULL;
	s->maps = NULL;
	s->mem_len = 0;
	s->adapter_bytes = 0;
}

void mp_adapters_close(struct mp_adapters *set)
{
	if (!set)
		return;
	for (uint32_t i = 0; i < set->n_slots; i++)
		slot_free(set, &set->slots[i]);
	pthread_mutex_destroy(&set->lock);
	free(set->slots);
	free(set);
}

uint32_t mp_adapters_rows(const struct mp_adapters *set)
{
	return set->experts + set->n_slots * set->e_max;
}

/* Checks what can be checked before a slot is taken: the base, E_max. */
static int check_adapter(struct mp_adapters *set, struct mp_adapter *a)
{
	int err = mp_adapter_check_base(a, set->cfg.base);

	if (err)
		return err;
	if (mp_adapter_max_per_layer(a) > set->e_max)
		return mp_err(-E2BIG, "%s: adapter '%s' replaces %u experts in a layer, more than "
			      "the %u rows of a slot (E_max)", mp_adapter_path(a),
			      mp_adapter_name(a), mp_adapter_max_per_layer(a), set->e_max);
	return 0;
}

/* Takes a free slot for name, or fails when the name is in use or no slot is free. */
static int slot_take(struct mp_adapters *set, const char *name)
{
	int free_slot = -ENOSPC;

	pthread_mutex_lock(&set->lock);
	for (uint32_t i = 0; i < set->n_slots; i++) {
		struct slot *s = &set->slots[i];

		if ((s->state == SLOT_READY || s->state == SLOT_LOADING) &&
		    !strcmp(s->name, name)) {
			free_slot = -EEXIST;
			break;
		}
		if (s->state == SLOT_FREE && free_slot < 0)
			free_slot = (int)i;
	}
	if (free_slot >= 0) {
		set->slots[free_slot].state = SLOT_LOADING;
		snprintf(set->slots[free_slot].name, MP_ADAPTER_NAME_MAX, "%s", name);
	}
	pthread_mutex_unlock(&set->lock);
	if (free_slot == -EEXIST)
		return mp_err(-EEXIST, "adapters: an adapter named '%s' is already loaded", name);
	if (free_slot < 0)
		return mp_err(-ENOSPC, "adapters: all %u slots are in use (unload one first)",
			      set->n_slots);
	return free_slot;
}

static int slot_alloc(struct mp_adapters *set, struct slot *s, uint32_t count)
{
	uint64_t experts = set->cfg.padded ? (uint64_t)set->layers * set->e_max : count;

	s->rows = calloc((size_t)set->layers * set->e_max, sizeof(*s->rows));
	s->tables = malloc((size_t)set->layers * set->experts * sizeof(*s->tables));
	s->maps = calloc(set->layers, sizeof(*s->maps));
	s->mem_len = experts * set->stride;
	/* Paged: the pager holds the rows, page-rounded like here, while they are resident. */
	if (set->cfg.rows)
		return s->rows && s->tables && s->maps ? 0 :
		       mp_err(-ENOMEM, "adapters: out of memory for the maps");
	/* Huge pages, as the resident base's: a row read on 4 KiB pages streams slower. */
	s->mem = mp_huge_map(s->mem_len);
	if (!s->rows || !s->tables || !s->maps || !s->mem)
		return mp_err(-ENOMEM, "adapters: out of memory for %llu experts",
			      (unsigned long long)experts);
	/* The padded layout holds (and touches) every row, loaded or not. */
	if (set->cfg.padded)
		memset(s->mem, 0, s->mem_len);
	return 0;
}

/* Reads layer l's experts into their rows and builds its map. */
static int slot_fill_layer(struct mp_adapters *set, struct slot *s, struct mp_adapter *a,
			   uint32_t index, uint32_t l, uint64_t *next)
{
	uint32_t n, ids[MP_MAX_EXPERTS];
	const struct mp_adapter_expert *e = mp_adapter_layer(a, l, &n);
	uint32_t *table = s->tables + (size_t)l * set->experts;
	int err;

	for (uint32_t d = 0; d < n; d++) {
		/* Padded: row d of the layer's E_max at its fixed place; else packed. */
		uint64_t at = set->cfg.padded ? ((uint64_t)l * set->e_max + d) : (*next)++;
		uint8_t *dst = s->mem ? s->mem + at * set->stride : NULL;

		if (set->cfg.rows)
			err = set->cfg.rows->bind(set->cfg.rows_ctx, l,
						  set->experts + index * set->e_max + d, s->src,
						  e[d].expert);
		else
			err = mp_adapter_read_expert(a, l, e[d].expert, dst);
		if (err)
			return err;
		s->bound += set->cfg.rows != NULL;
		s->rows[(size_t)l * set->e_max + d] = dst;
		s->adapter_bytes += set->expert_bytes;
		ids[d] = e[d].expert;
	}
	if (!n)
		return 0;
	err = mp_reroute_table(set->experts, set->e_max, index, ids, n, table);
	if (!err)
		s->maps[l] = table;
	return err;
}

int mp_adapters_load(struct mp_adapters *set, const char *path, const char *name)
{
	uint64_t t0 = mp_now_ns(), next = 0;
	struct mp_adapter *a = NULL;
	struct slot *s;
	int err, index;

	err = mp_adapter_open(path, &a);
	if (!err)
		err = check_adapter(set, a);
	if (!err && name && (!name[0] || strlen(name) >= MP_ADAPTER_NAME_MAX))
		err = mp_err(-EINVAL, "%s: adapter name '%s' is empty or too long", path, name);
	if (err)
		goto count_error;
	index = slot_take(set, name ? name : mp_adapter_name(a));
	if (index < 0) {
		err = index;
		goto count_error;
	}
	s = &set->slots[index];
	err = slot_alloc(set, s, mp_adapter_count(a));
	if (!err && set->cfg.rows) {
		/* The slot keeps the adapter open: the pager reads its rows from it. */
		s->a = a;
		a = NULL;
		s->src = set->cfg.rows->add_adapter(set->cfg.rows_ctx, s->a);
		err = s->src < 0 ? s->src : 0;
	}
	for (uint32_t l = 0; l < set->layers && !err; l++)
		err = slot_fill_layer(set, s, s->a ? s->a : a, (uint32_t)index, l, &next);
	pthread_mutex_lock(&set->lock);
	if (err) {
		slot_free(set, s);
		s->state = SLOT_FREE;
		set->load_errors++;
	} else {
		s->state = SLOT_READY;
		s->refs = 0;
		set->loads++;
		set->load_seconds += (mp_now_ns() - t0) / 1e9;
	}
	pthread_mutex_unlock(&set->lock);
	mp_adapter_close(a);
	return err ? err : index;
count_error:
	pthread_mutex_lock(&set->lock);
	set->load_errors++;
	pthread_mutex_unlock(&set->lock);
	mp_adapter_close(a);
	return err;
}

/* Under the lock: the ready slot called name, or -ENOENT. */
static int find_ready(struct mp_adapters *set, const char *name)
{
	for (uint32_t i = 0; i < set->n_slots; i++)
		if (set->slots[i].state == SLOT_READY && !strcmp(set->slots[i].name, name))
			return (int)i;
	return -ENOENT;
}

/* Under the lock: a draining slot nobody uses any more becomes free. */
static void maybe_free(struct mp_adapters *set, struct slot *s)
{
	if (s->state != SLOT_DRAINING || s->refs)
		return;
	slot_free(set, s);
	s->state = SLOT_FREE;
}

int mp_adapters_unload(struct mp_adapters *set, const char *name)
{
	int i;

	pthread_mutex_lock(&set->lock);
	i = find_ready(set, name);
	if (i >= 0) {
		set->slots[i].state = SLOT_DRAINING;
		set->unloads++;
		maybe_free(set, &set->slots[i]);
	}
	pthread_mutex_unlock(&set->lock);
	if (i < 0)
		return mp_err(-ENOENT, "adapters: no adapter named '%s' is loaded", name);
	return 0;
}

/*
 * Every row of the slot's adapter read ahead, earlier layers first: the
 * reads run together on the fill workers while the request's first step
 * goes through the layers, instead of one demand read per layer it reaches.
 * The slot is held, so its rows stay bound.
 */
static void warm(struct mp_adapters *set, const struct slot *s)
{
	const struct mp_row_ops *ops = set->cfg.rows;

	for (uint32_t l = 0; l < set->layers; l++)
		for (uint32_t e = 0; s->maps[l] && e < set->experts; e++)
			if (s->maps[l][e] >= set->experts)
				ops->prefetch(set->cfg.rows_ctx, l, s->maps[l][e],
					      WARM_PRIORITY - (int)l);
}

int mp_adapters_acquire(struct mp_adapters *set, const char *name, const uint32_t *const **map)
{
	int i;

	pthread_mutex_lock(&set->lock);
	i = find_ready(set, name);
	if (i >= 0) {
		set->slots[i].refs++;
		set->requests++;
		*map = set->slots[i].maps;
	}
	pthread_mutex_unlock(&set->lock);
	if (i >= 0 && set->cfg.warm_rows)
		warm(set, &set->slots[i]);
	return i;
}

void mp_adapters_release(struct mp_adapters *set, int index)
{
	struct slot *s;

	if (index < 0 || (uint32_t)index >= set->n_slots)
		return;
	s = &set->slots[index];
	pthread_mutex_lock(&set->lock);
	if (s->refs)
		s->refs--;
	maybe_free(set, s);
	pthread_mutex_unlock(&set->lock);
}

void mp_adapters_stats(struct mp_adapters *set, struct mp_adapters_stats *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&set->lock);
	for (uint32_t i = 0; i < set->n_slots; i++) {
		const struct slot *s = &set->slots[i];

		if (s->state != SLOT_READY && s->state != SLOT_DRAINING)
			continue;
		out->loaded += s->state == SLOT_READY;
		out->draining += s->state == SLOT_DRAINING;
		out->adapter_bytes += s->adapter_bytes;
		out->held_bytes += s->mem_len;
		out->padded_bytes += (uint64_t)set->layers * set->e_max * set->expert_bytes;
	}
	out->loads = set->loads;
	out->unloads = set->unloads;
	out->load_errors = set->load_errors;
	out->requests = set->requests;
	out->load_seconds = set->load_seconds;
	pthread_mutex_unlock(&set->lock);
	out->slots = set->n_slots;
	out->e_max = set->e_max;
	out->f_mem = out->adapter_bytes ? (double)out->held_bytes / out->adapter_bytes : 1.0;
}

int mp_adapters_name(struct mp_adapters *set, uint32_t i, char *buf)
{
	int err = -ENOENT;

	pthread_mutex_lock(&set->lock);
	if (i < set->n_slots && set->slots[i].state == SLOT_READY) {
		memcpy(buf, set->slots[i].name, MP_ADAPTER_NAME_MAX);
		err = 0;
	}
	pthread_mutex_unlock(&set->lock);
	return err;
}

/*
 * The expert source: the base's rows from the base's source, adapter rows
 * from the slots. A request holds its slot (acquire) while its sequence
 * runs, so a row it is routed to stays where it is without a lock here.
 */
static const void *set_expert(void *ctx, uint32_t layer, uint32_t row)
{
	struct mp_adapters *set = ctx;
	uint32_t i, d;
	const void *p = NULL;

	/* Paged rows are the source's own (it says which are not bound). */
	if (row < set->experts || set->cfg.rows)
		return set->cfg.source->expert(set->cfg.source_ctx, layer, row);
	i = (row - set->experts) / set->e_max;
	d = (row - set->experts) % set->e_max;
	if (i < set->n_slots && layer < set->layers && set->slots[i].rows)
		p = set->slots[i].rows[(size_t)layer * set->e_max + d];
	if (!p)
		mp_err(-EIO, "adapters: layer %u row %u belongs to no loaded adapter", layer, row);
	return p;
}

/*
 * Paged, the source hears of every routed row, adapter rows by their row
 * ids; else of the base rows only: adapter rows are then the set's own
 * memory, which it neither pages nor prefetches.
 */
static int set_route(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		     const uint32_t *ids, const float *weights, uint32_t k)
{
	struct mp_adapters *set = ctx;
	uint32_t base_ids[MP_MAX_TOPK], n = 0;
	float base_w[MP_MAX_TOPK];

	if (!set->cfg.source->route)
		return 0;
	if (set->cfg.rows)
		return set->cfg.source->route(set->cfg.source_ctx, request, token, layer, ids,
					      weights, k);
	for (uint32_t j = 0; j < k && j < MP_MAX_TOPK; j++)
		if (ids[j] < set->experts) {
			base_ids[n] = ids[j];
			base_w[n++] = weights ? weights[j] : 0.0f;
		}
	if (n == k)
		return set->cfg.source->route(set->cfg.source_ctx, request, token, layer, ids,
					      weights, k);
	if (!n)
		return 0;
	return set->cfg.source->route(set->cfg.source_ctx, request, token, layer, base_ids,
				      weights ? base_w : NULL, n);
}

static int set_guard(void *ctx, int (*fn)(void *arg), void *arg)
{
	struct mp_adapters *set = ctx;

	if (!set->cfg.source->guard)
		return fn(arg);
	return set->cfg.source->guard(set->cfg.source_ctx, fn, arg);
}

static void set_gate(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		     const float *logits, uint32_t experts, const float *x, uint32_t hidden)
{
	struct mp_adapters *set = ctx;

	if (set->cfg.source->gate)
		set->cfg.source->gate(set->cfg.source_ctx, request, token, layer, logits, experts,
				      x, hidden);
}

static void set_embed(void *ctx, uint32_t request, uint32_t token, const float *e,
		      uint32_t hidden)
{
	struct mp_adapters *set = ctx;

	if (set->cfg.source->embed)
		set->cfg.source->embed(set->cfg.source_ctx, request, token, e, hidden);
}

/*
 * Paged, a request's map reaches the source (a prefetcher predicts the
 * adapter rows it will read); else its adapter rows are the set's memory,
 * which the source never sees.
 */
static void set_seq_map(void *ctx, uint32_t request, const uint32_t *const *map)
{
	struct mp_adapters *set = ctx;

	if (set->cfg.rows && set->cfg.source->seq_map)
		set->cfg.source->seq_map(set->cfg.source_ctx, request, map);
}

/* Unpaged adapter rows are the set's memory; paged rows and the base's are the source's. */
static int set_resident(void *ctx, uint32_t layer, uint32_t row)
{
	struct mp_adapters *set = ctx;

	if (row >= set->experts && !set->cfg.rows)
		return 1;
	return set->cfg.source->resident ?
	       set->cfg.source->resident(set->cfg.source_ctx, layer, row) : -EOPNOTSUPP;
}

static const struct mp_expert_source_ops adapters_ops = {
	.expert = set_expert,
	.route = set_route,
	.guard = set_guard,
	.gate = set_gate,
	.embed = set_embed,
	.seq_map = set_seq_map,
	.resident = set_resident,
};

const struct mp_expert_source_ops *mp_adapters_source_ops(void)
{
	return &adapters_ops;
}
