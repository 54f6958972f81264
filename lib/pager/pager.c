// SPDX-License-Identifier: MIT
/* The pager's public calls: open/close, expert pointers, routing, prefetch, budget, statistics. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <moepager/source.h>
#include <moepager/store.h>
#include <moepager/pager.h>

#include "base/base.h"
#include "pager/pager_priv.h"
#include "pager/hooks.h"
#include "base/ranges.h"
#include "base/probes.h"
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

/* The budget from the config, $MOEPAGER_BUDGET, or the default; checked against one expert. */
static int resolve_budget(struct mp_pager *p, const struct mp_pager_config *cfg)
{
	uint64_t total = mp_store_total_expert_bytes(p->store), b = 0;
	const char *env = getenv("MOEPAGER_BUDGET");
	const char *from = "config";
	int err;

	if (cfg->budget_bytes) {
		b = cfg->budget_bytes;
	} else if (cfg->budget && *cfg->budget) {
		err = mp_budget_parse(cfg->budget, total, &b);
		if (err)
			return err;
	} else if (env && *env) {
		from = "MOEPAGER_BUDGET";
		err = mp_budget_parse(env, total, &b);
		if (err)
			return err;
	} else {
		long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
		uint64_t half = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 2 : total;

		from = "default";
		b = MP_MIN(total, half);
	}
	if (b < p->expert_bytes)
		return plog_err(p, -EINVAL, "budget %llu bytes (%s) is below one expert "
				"(%llu bytes)",
				(unsigned long long)b, from, (unsigned long long)p->expert_bytes);
	p->budget = b;
	plog_debug(p, "budget %llu bytes (%s): %.1f experts of %llu", (unsigned long long)b, from,
		   (double)b / (double)p->expert_bytes, (unsigned long long)total);
	return 0;
}

static int setup_slots(struct mp_pager *p)
{
	p->slots = calloc(p->nslots, sizeof(*p->slots));
	p->heap = calloc(p->nslots, sizeof(*p->heap));
	if (!p->slots || !p->heap)
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
	p->demand_head = p->demand_tail = SLOT_NONE;
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
	mp_evict_fini(&p->evict);
	free(p->slots);
	free(p->heap);
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

int mp_pager_open_hooked(struct mp_store *store, const struct mp_pager_config *ucfg,
			 const struct mp_pager_hooks *hooks, struct mp_pager **out)
{
	struct mp_pager_config cfg;
	const struct mp_evict_ops *pol;
	const char *path, *base, *eviction;
	struct mp_evict_env env;
	struct mp_pager *p;
	int err;

	*out = NULL;
	if (!store)
		return mp_err(-EINVAL, "pager: no store");
	if (ucfg)
		cfg = *ucfg;
	else
		mp_pager_config_init(&cfg);
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	path = mp_store_path(store);
	base = strrchr(path, '/');
	snprintf(p->name, sizeof(p->name), "%s", base ? base + 1 : path);
	p->store = store;
	p->geo = *mp_store_geometry(store);
	p->layers = p->geo.layers;
	p->experts = p->geo.experts;
	p->expert_bytes = mp_store_expert_bytes(store);
	p->data_bytes = MP_ALIGN_UP(p->expert_bytes, PAGE);
	p->slot_bytes = MP_ALIGN_UP(p->expert_bytes, MP_EXPERT_ALIGN);
	p->slots_per_layer = cfg.slots_per_layer ? cfg.slots_per_layer : 2 * p->experts;
	p->nworkers = cfg.fill_threads ? cfg.fill_threads : DEFAULT_FILL_THREADS;
	p->io_depth = cfg.io_depth ? cfg.io_depth : DEFAULT_IO_DEPTH;
	p->read_attempts = cfg.read_attempts ? cfg.read_attempts : MP_PAGER_DEFAULT_READ_ATTEMPTS;
	p->route_fill = !cfg.no_route_fill;
	p->min_resident_ns = cfg.min_resident_us == UINT32_MAX ? 0 :
			     (uint64_t)(cfg.min_resident_us ? cfg.min_resident_us :
					DEFAULT_MIN_RESIDENT_US) * 1000;
	p->spare_bytes = cfg.spare_bytes ? cfg.spare_bytes : 2 * p->data_bytes;
	p->max_prefetch_fills = p->nworkers > 1 ? p->nworkers - 1 : 1;
	sync_init(p);

	err = -EINVAL;
	if (p->slots_per_layer < p->experts || p->slots_per_layer > MP_MAX_EXPERTS * 16) {
		plog_err(p, err, "slots_per_layer %u must be in [%u (experts), %u]",
			 p->slots_per_layer, p->experts, MP_MAX_EXPERTS * 16);
		goto destroy;
	}
	if (p->nworkers > 64) {
		plog_err(p, err, "fill_threads %u out of range [1, 64]", p->nworkers);
		goto destroy;
	}
	p->nslots = p->layers * p->slots_per_layer;
	err = resolve_budget(p, &cfg);
	if (err)
		goto destroy;
	eviction = cfg.eviction ? cfg.eviction : getenv("MOEPAGER_EVICTION");
	if (!eviction || !*eviction)
		eviction = "lru";
	pol = mp_evict_find(eviction);
	if (!pol) {
		err = plog_err(p, -EINVAL, "unknown eviction policy '%s' (%s)", eviction,
			       mp_evict_names());
		goto destroy;
	}
	err = setup_slots(p);
	if (err)
		goto destroy;
	env = (struct mp_evict_env){ .nkeys = p->nslots, .layers = p->layers,
				      .experts = p->experts,
				      .slots_per_layer = p->slots_per_layer };
	err = mp_evict_init(&p->evict, pol, &env);
	if (err)
		goto destroy;
	err = mp_tier_file_open(store, &(struct mp_tier_file_config){
					.request_bytes = cfg.io_request_bytes ?
							 cfg.io_request_bytes :
							 DEFAULT_REQUEST_BYTES,
					.no_direct = cfg.no_direct }, &p->tier);
	if (err)
		goto destroy;
	/* Fault injection wraps the file tier (docs/fault-injection.md). */
	err = mp_tier_fault_wrap(&p->tier, cfg.fault, cfg.fault_seed);
	if (err)
		goto destroy;
	if (hooks && hooks->wrap_tier) {
		struct mp_tier *top = NULL;

		err = hooks->wrap_tier(hooks->arg, p->tier, &top);
		if (err)
			goto destroy;
		p->tier = top;
	}
	err = mp_region_create(&(struct mp_region_config){
					.nslots = p->nslots,
					.slot_bytes = p->slot_bytes,
					.data_bytes = p->data_bytes,
					.numa_node = cfg.numa_bind ? cfg.numa_node : -1,
					.name = p->name }, &mp_pager_region_ops, p, &p->region);
	if (err)
		goto destroy;
	/* Tracers attribute page faults by this (moepager:region, docs/probes.md). */
	err = mp_pager_ranges_add((uintptr_t)mp_region_base(p->region), p->slot_bytes,
				  p->slots_per_layer, p->layers, p->experts);
	if (err)
		goto destroy;
	err = mp_guard_register(p, mp_region_base(p->region), mp_region_bytes(p->region));
	if (err)
		goto destroy;
	err = mp_pager_workers_start(p);
	if (err)
		goto destroy;
	plog_info(p, "%u experts of %llu bytes in %u slots at %p; budget %llu (%.1f experts), "
		  "%s eviction, %s tier, %u fill threads x %u requests of %u KiB", p->layers *
		  p->experts, (unsigned long long)p->expert_bytes, p->nslots,
		  mp_region_base(p->region), (unsigned long long)p->budget,
		  (double)p->budget / (double)p->expert_bytes, pol->name, p->tier->name,
		  p->nworkers, p->io_depth, (cfg.io_request_bytes ? cfg.io_request_bytes :
					     DEFAULT_REQUEST_BYTES) >> 10);
	*out = p;
	return 0;

destroy:
	atomic_store(&p->closing, true);
	destroy(p);
	return err;
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
	p->max_prefetch_fills = UINT32_MAX;
	while (!mp_pager_dequeue(p, &slot, &cls)) {
		struct slot *s = &p->slots[slot];

		if (s->waiters && (s->state == ST_EMPTY || s->state == ST_HOST))
			mp_pager_poison_locked(p, slot, -ESHUTDOWN);
	}
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
	while (p->guards)
		pthread_cond_wait(&p->guard_cv, &p->lock);
	pthread_mutex_unlock(&p->lock);
	plog_debug(p, "closed");
	destroy(p);
}

/*
 * Expert pointers, routing, prefetch
 */

static int check_id(struct mp_pager *p, uint32_t layer, uint32_t expert, const char *what)
{
	if (layer >= p->layers || expert >= p->experts)
		return plog_err(p, -EINVAL, "%s: layer %u expert %u out of range (%u layers, %u "
				"experts)", what, layer, expert, p->layers, p->experts);
	return 0;
}

const void *mp_pager_expert(struct mp_pager *p, uint32_t layer, uint32_t expert)
{
	bool poisoned;
	uint32_t slot;

	if (check_id(p, layer, expert, "expert"))
		return NULL;
	slot = mp_pager_slot(p, layer, expert);
	pthread_mutex_lock(&p->lock);
	poisoned = p->slots[slot].state == ST_POISONED;
	if (!poisoned && p->evict.ops->on_access)
		p->evict.ops->on_access(&p->evict, slot);
	pthread_mutex_unlock(&p->lock);
	/* A poisoned expert is asked for again: let the next touch read it again. */
	if (poisoned)
		mp_pager_clear(p, slot);
	return mp_region_slot_addr(p->region, slot);
}

const void *mp_pager_expert_proj(struct mp_pager *p, uint32_t layer, uint32_t expert,
				 enum mp_proj proj)
{
	const char *e = mp_pager_expert(p, layer, expert);
	uint64_t mat = (uint64_t)p->geo.ffn * p->geo.hidden * mp_dtype_size(p->geo.dtype);

	if (!e)
		return NULL;
	if ((unsigned)proj > MP_PROJ_DOWN) {
		plog_err(p, -EINVAL, "expert_proj: projection %d out of range", (int)proj);
		return NULL;
	}
	return e + (uint64_t)proj * mat;
}

int mp_pager_route(struct mp_pager *p, uint32_t request, uint32_t token, uint32_t layer,
		   const uint32_t *ids, const float *weights, uint32_t k)
{
	uint32_t keys[MP_MAX_TOPK];
	struct mp_evict_route r = { request, token, layer, k, keys, weights };

	if (layer >= p->layers || k > MP_MAX_TOPK || (k && !ids))
		return plog_err(p, -EINVAL, "route: layer %u, k %u: out of range", layer, k);
	for (uint32_t i = 0; i < k; i++) {
		if (ids[i] >= p->experts)
			return plog_err(p, -EINVAL, "route: layer %u: expert %u out of range (%u)",
					layer, ids[i], p->experts);
		keys[i] = mp_pager_slot(p, layer, ids[i]);
	}
	/* The runner fires the route probe; firing it here too would count decisions twice. */
	pthread_mutex_lock(&p->lock);
	for (uint32_t i = 0; i < k; i++) {
		struct slot *s = &p->slots[keys[i]];

		if (s->state == ST_MAPPED && !s->lost) {
			p->st.hits++;
			if (s->prefetched) {
				s->prefetched = false;
				p->st.prefetch_used++;
			}
			if (p->evict.ops->on_access)
				p->evict.ops->on_access(&p->evict, keys[i]);
			continue;
		}
		p->st.misses++;
		if (s->state == ST_FILLING) {
			atomic_store(&s->wanted, true);
			if (s->prefetched) {
				s->prefetched = false;
				p->st.prefetch_used++;
			}
		}
		if (p->evict.ops->on_access)
			p->evict.ops->on_access(&p->evict, keys[i]);
		if (p->route_fill && !atomic_load(&p->closing) &&
		    (s->state == ST_EMPTY || s->state == ST_HOST))
			mp_pager_enqueue(p, keys[i], Q_DEMAND, 0);
	}
	if (p->evict.ops->on_route)
		p->evict.ops->on_route(&p->evict, &r);
	/*
	 * Later: the prefetch policy hook (its vtable comes with the
	 * prefetcher issue) sees every route here, under the lock.
	 */
	pthread_mutex_unlock(&p->lock);
	return 0;
}

int mp_pager_prefetch(struct mp_pager *p, uint32_t layer, uint32_t expert, int priority)
{
	uint32_t slot;
	struct slot *s;
	int ret = 0;

	if (check_id(p, layer, expert, "prefetch"))
		return -EINVAL;
	slot = mp_pager_slot(p, layer, expert);
	s = &p->slots[slot];
	mp_pager_clear(p, slot);
	pthread_mutex_lock(&p->lock);
	if (atomic_load(&p->closing) || p->broken) {
		ret = -ESHUTDOWN;
	} else if (s->queued == Q_PREFETCH) {
		mp_pager_enqueue(p, slot, Q_PREFETCH, priority);
	} else if (!s->queued && (s->state == ST_EMPTY || s->state == ST_HOST)) {
		s->prefetch_at = mp_now_ns();
		mp_pager_enqueue(p, slot, Q_PREFETCH, priority);
		p->st.prefetch_issued++;
		MP_PROBE(prefetch_issue, layer, expert, s->state == ST_HOST ? 0 : p->tier->number);
		ret = 1;
	}
	pthread_mutex_unlock(&p->lock);
	return ret;
}

int mp_pager_wait_idle(struct mp_pager *p, uint32_t timeout_ms)
{
	uint64_t deadline = mp_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int ret = 0;

	pthread_mutex_lock(&p->lock);
	while (p->jobs || p->heap_n || p->demand_head != SLOT_NONE) {
		struct timespec ts;
		uint64_t now = mp_now_ns();

		if (now >= deadline) {
			ret = -ETIMEDOUT;
			break;
		}
		clock_gettime(CLOCK_MONOTONIC, &ts);
		now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec +
		      MP_MIN(deadline - mp_now_ns(), 10000000ull);
		ts.tv_sec = (time_t)(now / 1000000000ull);
		ts.tv_nsec = (long)(now % 1000000000ull);
		pthread_cond_timedwait(&p->state_cv, &p->lock, &ts);
	}
	pthread_mutex_unlock(&p->lock);
	return ret;
}

int mp_pager_evict(struct mp_pager *p, uint32_t layer, uint32_t expert, unsigned flags)
{
	int err;

	if (check_id(p, layer, expert, "evict"))
		return -EINVAL;
	if (flags & ~MP_EVICT_KEEP_HOST)
		return plog_err(p, -EINVAL, "evict: unknown flags %#x", flags);
	pthread_mutex_lock(&p->lock);
	err = mp_pager_evict_locked(p, mp_pager_slot(p, layer, expert),
				    flags & MP_EVICT_KEEP_HOST);
	pthread_mutex_unlock(&p->lock);
	return err;
}

int mp_pager_residency(struct mp_pager *p, uint32_t layer, uint32_t expert)
{
	const struct slot *s;
	int r;

	if (check_id(p, layer, expert, "residency"))
		return -EINVAL;
	pthread_mutex_lock(&p->lock);
	s = &p->slots[mp_pager_slot(p, layer, expert)];
	switch (s->state) {
	case ST_FILLING:
		r = MP_RES_FILLING;
		break;
	case ST_HOST:
		r = MP_RES_HOST;
		break;
	case ST_MAPPED:
		r = MP_RES_MAPPED;
		break;
	case ST_POISONED:
	case ST_CLEARING:
		r = MP_RES_POISONED;
		break;
	case ST_BUSY:
		/* Mid-transition: where it is headed. */
		r = s->busy_op == BUSY_MAP ? MP_RES_MAPPED :
		    s->busy_op == BUSY_UNMAP ? MP_RES_HOST : MP_RES_NONE;
		break;
	default:
		r = MP_RES_NONE;
		break;
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

/*
 * Budget
 */

int mp_pager_set_budget(struct mp_pager *p, uint64_t bytes)
{
	if (bytes < p->expert_bytes)
		return plog_err(p, -EINVAL, "budget %llu bytes is below one expert (%llu bytes)",
				(unsigned long long)bytes, (unsigned long long)p->expert_bytes);
	pthread_mutex_lock(&p->lock);
	p->budget = bytes;
	mp_pager_enforce_budget(p);
	pthread_cond_broadcast(&p->state_cv);
	pthread_mutex_unlock(&p->lock);
	return 0;
}

uint64_t mp_pager_budget(const struct mp_pager *p)
{
	return p->budget;
}

/*
 * Guard support
 */

int mp_pager_fault_cause(struct mp_pager *p, const void *addr, uint32_t *clear)
{
	int64_t slot = mp_region_slot_of(p->region, addr);
	const struct slot *s;
	int err;

	*clear = SLOT_NONE;
	if (slot < 0)
		return plog_err(p, -EIO, "SIGBUS at %p outside the range", addr);
	s = &p->slots[slot];
	pthread_mutex_lock(&p->lock);
	if (s->state == ST_UNUSED) {
		err = plog_err(p, -EFAULT, "access at %p: slot %lld holds no expert", addr,
			       (long long)slot);
	} else if ((uint64_t)((const char *)addr - (const char *)mp_region_slot_addr(p->region,
			(uint32_t)slot)) >= p->data_bytes) {
		err = plog_err(p, -EFAULT, "access at %p: past the end of layer %u expert %u",
			       addr, s->layer, s->expert);
	} else if (s->state == ST_POISONED && s->err) {
		err = s->err;
		plog_err(p, err, "layer %u expert %u: %s", s->layer, s->expert,
			 err == -ESHUTDOWN ? "the pager closed while it was being read" :
			 strerror(-err));
		if (!atomic_load(&p->closing))
			*clear = (uint32_t)slot;
	} else {
		err = plog_err(p, -EIO, "layer %u expert %u: SIGBUS at %p (memory error)", s->layer,
			       s->expert, addr);
	}
	pthread_mutex_unlock(&p->lock);
	return err;
}

/*
 * Statistics
 */

void mp_pager_stats(struct mp_pager *p, struct mp_pager_stats *out)
{
	struct mp_region_mem mem;

	mp_region_mem(p->region, &mem);
	pthread_mutex_lock(&p->lock);
	*out = p->st;
	out->resident_bytes = p->resident;
	out->resident_peak = p->resident_peak;
	out->budget_bytes = p->budget;
	out->resident_experts = p->resident_n;
	out->mapped_experts = p->mapped_n;
	pthread_mutex_unlock(&p->lock);
	out->memory_bytes = mem.populated_bytes;
}

void mp_pager_stats_reset(struct mp_pager *p)
{
	pthread_mutex_lock(&p->lock);
	memset(&p->st, 0, sizeof(p->st));
	p->resident_peak = p->resident;
	pthread_mutex_unlock(&p->lock);
}

uint64_t mp_pager_stats_quantile(const struct mp_pager_stats *s, double q)
{
	uint64_t total = 0, seen = 0;
	double want;

	for (int i = 0; i < MP_PAGER_HIST_BUCKETS; i++)
		total += s->fault_latency_hist[i];
	if (!total)
		return 0;
	q = q < 0 ? 0 : q > 1 ? 1 : q;
	want = q * (double)total;
	for (int i = 0; i < MP_PAGER_HIST_BUCKETS; i++) {
		uint64_t n = s->fault_latency_hist[i];

		if (n && (double)(seen + n) >= want) {
			double lo = ldexp(1.0, i), frac = n ? (want - (double)seen) / (double)n : 0;

			return (uint64_t)(lo + frac * lo);
		}
		seen += n;
	}
	return (uint64_t)ldexp(1.0, MP_PAGER_HIST_BUCKETS);
}

/*
 * Engine glue
 */

static const void *source_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	return mp_pager_expert(ctx, layer, expert);
}

static int source_route(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
			const uint32_t *ids, const float *weights, uint32_t k)
{
	return mp_pager_route(ctx, request, token, layer, ids, weights, k);
}

static int source_guard(void *ctx, int (*fn)(void *arg), void *arg)
{
	return mp_pager_guard(ctx, fn, arg);
}

static const struct mp_expert_source_ops pager_source_ops = {
	.expert = source_expert,
	.route = source_route,
	.guard = source_guard,
};

const struct mp_expert_source_ops *mp_pager_source_ops(void)
{
	return &pager_source_ops;
}

/*
 * For the prefetch driver (pager/hooks.h)
 */

uint32_t mp_pager_slots_per_layer(const struct mp_pager *p)
{
	return p->slots_per_layer;
}

void mp_pager_set_hints(struct mp_pager *p, const struct mp_evict_hints *h)
{
	pthread_mutex_lock(&p->lock);
	p->evict.env.hints = h;
	pthread_mutex_unlock(&p->lock);
}

uint32_t mp_pager_drop_prefetches(struct mp_pager *p, bool (*drop)(void *arg, uint32_t key),
				  void *arg)
{
	uint32_t n = 0;

	pthread_mutex_lock(&p->lock);
	for (uint32_t k = 0; k < p->nslots; k++) {
		if (p->slots[k].queued == Q_PREFETCH && drop(arg, k)) {
			mp_pager_unqueue(p, k);
			n++;
		}
	}
	mp_pager_after_idle(p);
	pthread_mutex_unlock(&p->lock);
	return n;
}
