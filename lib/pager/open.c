// SPDX-License-Identifier: MIT
/* Opening and closing a pager: its config, slots, eviction policy, tier, region and threads. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "pager/pager_priv.h"
#include "base/ranges.h"
#include "tier/inject.h"

#define DEFAULT_FILL_THREADS	2u
#define DEFAULT_IO_DEPTH	32u
#define DEFAULT_REQUEST_BYTES	(512u << 10)
#define DEFAULT_MIN_RESIDENT_US	2000u
#define PAGE			4096ull

void mp_pager_config_init(struct mp_pager_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
}

struct mp_store *mp_pager_store(const struct mp_pager *p)
{
	return p->store;
}

static int setup_slots(struct mp_pager *p)
{
	p->slots = calloc(p->nslots, sizeof(*p->slots));
	p->origin = calloc(p->nslots, sizeof(*p->origin));
	p->q.heap = calloc(p->nslots, sizeof(*p->q.heap));
	if (!p->slots || !p->origin || !p->q.heap)
		return -ENOMEM;
	for (uint32_t l = 0; l < p->layers; l++) {
		for (uint32_t e = 0; e < p->slots_per_layer; e++) {
			struct slot *s = &p->slots[mp_pager_slot(p, l, e)];

			s->state = e < p->experts ? ST_EMPTY : ST_UNUSED;
			s->layer = l;
			s->expert = e;
			s->next = SLOT_NONE;
		}
	}
	p->q.demand_head = p->q.demand_tail = SLOT_NONE;
	mp_pager_rows_init(p);
	return 0;
}

static int sync_init(struct mp_pager *p)
{
	pthread_condattr_t ca;

	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->work_cv, NULL);
	pthread_cond_init(&p->guard_cv, NULL);
	/* Timed waits (budget, idle) are on the monotonic clock. */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->state_cv, &ca);
	pthread_condattr_destroy(&ca);
	return 0;
}

static void destroy(struct mp_pager *p)
{
	mp_pager_workers_stop(p);
	mp_guard_unregister(p);
	if (p->region)
		mp_pager_ranges_remove((uintptr_t)mp_region_base(p->region));
	mp_region_destroy(p->region);
	mp_tier_destroy(p->tier);
	mp_pager_rows_fini(p);
	mp_evict_fini(&p->evict);
	free(p->slots);
	free(p->origin);
	free(p->q.heap);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->work_cv);
	pthread_cond_destroy(&p->state_cv);
	pthread_cond_destroy(&p->guard_cv);
	free(p);
}

int mp_pager_open(struct mp_store *store, const struct mp_pager_config *cfg,
		  struct mp_pager **out)
{
	return mp_pager_open_hooked(store, cfg, NULL, out);
}

/*
 * Who resolves the engine's requests (enum mp_pager_resolve): the config,
 * else $MOEPAGER_RESOLVE (auto, fault, caller), else by the expert size:
 * below a 2 MiB chunk the fault path's hand-offs cost as much as the read
 * (serve.c).
 */
static int resolve_path(struct mp_pager *p, uint32_t resolve)
{
	static const char *const names[] = { "auto", "fault", "caller" };
	const char *env = getenv("MOEPAGER_RESOLVE");

	if (resolve > MP_RESOLVE_CALLER)
		return plog_err(p, -EINVAL, "resolve %u is not one of auto (0), fault (1), caller "
				"(2)", resolve);
	if (!resolve && env && *env) {
		while (resolve < MP_ARRAY_SIZE(names) && strcmp(env, names[resolve]))
			resolve++;
		if (resolve == MP_ARRAY_SIZE(names))
			return plog_err(p, -EINVAL, "MOEPAGER_RESOLVE '%s' is not auto, fault or "
					"caller", env);
	}
	p->caller_resolves = resolve == MP_RESOLVE_CALLER ||
			     (resolve == MP_RESOLVE_AUTO && p->expert_bytes < MP_REGION_CHUNK);
	return 0;
}

/* The config's numbers, with their defaults, and the derived sizes. */
static int apply_config(struct mp_pager *p, const struct mp_pager_config *cfg)
{
	int err;

	p->geo = *mp_store_geometry(p->store);
	p->layers = p->geo.layers;
	p->experts = p->geo.experts;
	p->expert_bytes = mp_store_expert_bytes(p->store);
	p->data_bytes = MP_ALIGN_UP(p->expert_bytes, PAGE);
	p->slot_bytes = MP_ALIGN_UP(p->expert_bytes, MP_EXPERT_ALIGN);
	p->slots_per_layer = cfg->slots_per_layer ? cfg->slots_per_layer : 2 * p->experts;
	p->nworkers = cfg->fill_threads ? cfg->fill_threads : DEFAULT_FILL_THREADS;
	p->io_depth = cfg->io_depth ? cfg->io_depth : DEFAULT_IO_DEPTH;
	p->read_attempts = cfg->read_attempts ? cfg->read_attempts : MP_PAGER_DEFAULT_READ_ATTEMPTS;
	p->route_fill = !cfg->no_route_fill;
	p->mem.min_resident_ns = cfg->min_resident_us == UINT32_MAX ? 0 :
				 (uint64_t)(cfg->min_resident_us ? cfg->min_resident_us :
					    DEFAULT_MIN_RESIDENT_US) * 1000;
	p->mem.spare_bytes = cfg->spare_bytes ? cfg->spare_bytes : 2 * p->data_bytes;
	p->q.max_prefetch_fills = p->nworkers > 1 ? p->nworkers - 1 : 1;
	err = resolve_path(p, cfg->resolve);
	if (err)
		return err;
	if (p->slots_per_layer < p->experts || p->slots_per_layer > MP_MAX_EXPERTS * 16)
		return plog_err(p, -EINVAL, "slots_per_layer %u must be in [%u (experts), %u]",
				p->slots_per_layer, p->experts, MP_MAX_EXPERTS * 16);
	if (p->nworkers > 64)
		return plog_err(p, -EINVAL, "fill_threads %u out of range [1, 64]", p->nworkers);
	p->nslots = p->layers * p->slots_per_layer;
	return mp_pager_resolve_budget(p, cfg);
}

/* The eviction policy named by the config, $MOEPAGER_EVICTION, or lru. */
static int open_eviction(struct mp_pager *p, const struct mp_pager_config *cfg)
{
	const char *name = cfg->eviction ? cfg->eviction : getenv("MOEPAGER_EVICTION");
	const struct mp_evict_ops *ops;
	struct mp_evict_env env = {
		.nkeys = p->nslots, .layers = p->layers, .experts = p->experts,
		.slots_per_layer = p->slots_per_layer,
	};

	if (!name || !*name)
		name = "lru";
	ops = mp_evict_find(name);
	if (!ops)
		return plog_err(p, -EINVAL, "unknown eviction policy '%s' (%s)", name,
				mp_evict_names());
	return mp_evict_init(&p->evict, ops, &env);
}

/* The file tier, wrapped by fault injection (docs/fault-injection.md) and the hooks' tier. */
static int open_tier(struct mp_pager *p, const struct mp_pager_config *cfg,
		     const struct mp_pager_hooks *hooks)
{
	struct mp_tier *top = NULL;
	int err;

	p->tier_cfg = (struct mp_tier_file_config){
		.request_bytes = cfg->io_request_bytes ? cfg->io_request_bytes :
							 DEFAULT_REQUEST_BYTES,
		.no_direct = cfg->no_direct,
	};
	err = mp_tier_file_open(p->store, &p->tier_cfg, &p->tier);
	if (!err)
		err = mp_tier_inject_wrap(&p->tier, cfg->fault, cfg->fault_seed);
	if (!err && mp_tier_is_fault(p->tier))
		p->fault_tier = p->tier;
	if (err || !hooks || !hooks->wrap_tier)
		return err;
	err = hooks->wrap_tier(hooks->arg, p->tier, &top);
	if (!err)
		p->tier = top;
	return err;
}

/* The range, listed for tracers (moepager:region, docs/probes.md) and guarded. */
static int open_region(struct mp_pager *p, const struct mp_pager_config *cfg)
{
	struct mp_region_config rc = {
		.nslots = p->nslots, .slot_bytes = p->slot_bytes, .data_bytes = p->data_bytes,
		.numa_node = cfg->numa_bind ? cfg->numa_node : -1, .name = p->name,
	};
	int err;

	err = mp_region_create(&rc, &mp_pager_region_ops, p, &p->region);
	if (err)
		return err;
	err = mp_pager_ranges_add((uintptr_t)mp_region_base(p->region), p->slot_bytes,
				  p->slots_per_layer, p->layers, p->experts);
	if (err)
		return err;
	return mp_guard_register(p, mp_region_base(p->region), mp_region_bytes(p->region));
}

int mp_pager_open_hooked(struct mp_store *store, const struct mp_pager_config *ucfg,
			 const struct mp_pager_hooks *hooks, struct mp_pager **out)
{
	struct mp_pager_config cfg;
	struct mp_pager *p;
	const char *path, *base;
	int err;

	*out = NULL;
	if (!store)
		return mp_err(-EINVAL, "pager: no store");
	if (ucfg)
		cfg = *ucfg;
	else
		mp_pager_config_init(&cfg);
	err = mp_check_reserved(cfg.reserved, MP_ARRAY_SIZE(cfg.reserved), "pager config");
	if (!err && cfg.reserved0)
		err = mp_err(-EINVAL, "pager config: reserved0 is not zero (a field this "
			     "library does not know?)");
	if (err)
		return err;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	path = mp_store_path(store);
	base = strrchr(path, '/');
	snprintf(p->name, sizeof(p->name), "%s", base ? base + 1 : path);
	p->store = store;
	sync_init(p);
	err = apply_config(p, &cfg);
	if (!err)
		err = setup_slots(p);
	if (!err)
		err = open_eviction(p, &cfg);
	if (!err)
		err = open_tier(p, &cfg, hooks);
	if (!err)
		err = open_region(p, &cfg);
	if (!err)
		err = mp_pager_workers_start(p);
	if (err) {
		atomic_store(&p->closing, true);
		destroy(p);
		return err;
	}
	plog_info(p, "%u experts of %llu bytes in %u slots at %p; budget %llu (%.1f experts), "
		  "%s eviction, %s tier, %u fill threads x %u requests of %u KiB", p->layers *
		  p->experts, (unsigned long long)p->expert_bytes, p->nslots,
		  mp_region_base(p->region), (unsigned long long)p->mem.budget,
		  (double)p->mem.budget / (double)p->expert_bytes, p->evict.ops->name,
		  p->tier->name, p->nworkers, p->io_depth, (cfg.io_request_bytes ?
		  cfg.io_request_bytes : DEFAULT_REQUEST_BYTES) >> 10);
	*out = p;
	return 0;
}

void mp_pager_close(struct mp_pager *p)
{
	uint32_t slot;
	enum queue_class cls;

	if (!p)
		return;
	atomic_store(&p->closing, true);
	pthread_mutex_lock(&p->lock);
	/* Queued work is dropped; whoever waits on it is released with an error. */
	p->q.max_prefetch_fills = UINT32_MAX;
	while (!mp_pager_dequeue(p, &slot, &cls)) {
		struct slot *s = &p->slots[slot];

		if (s->waiters && (s->state == ST_EMPTY || s->state == ST_HOST))
			mp_pager_poison_locked(p, slot, -ESHUTDOWN);
	}
	/* A thread resolving its own request finishes (its read is cancelled) before the ring goes. */
	while (p->caller_busy)
		pthread_cond_wait(&p->state_cv, &p->lock);
	pthread_mutex_unlock(&p->lock);
	mp_pager_workers_stop(p);

	pthread_mutex_lock(&p->lock);
	for (slot = 0; slot < p->nslots; slot++) {
		struct slot *s = &p->slots[slot];

		if ((s->waiters || s->refault) && (s->state == ST_EMPTY || s->state == ST_HOST))
			mp_pager_poison_locked(p, slot, -ESHUTDOWN);
	}
	/*
	 * Threads inside the guard may still be faulting: the handler keeps
	 * running and poisons whatever they touch, so they leave with an error.
	 */
	mp_guard_wait_out(p);
	pthread_mutex_unlock(&p->lock);
	plog_debug(p, "closed");
	destroy(p);
}
