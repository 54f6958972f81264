// SPDX-License-Identifier: MIT
/* The pager's calls on experts: pointers, routing, prefetch, eviction, residency, statistics. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include <moepager/source.h>

#include "base/base.h"
#include "pager/pager_priv.h"
#include "pager/hooks.h"
#include "base/probes.h"

/* True when (layer, id) is one of the store's experts or a bound row. */
static bool valid_row(struct mp_pager *p, uint32_t layer, uint32_t id)
{
	uint8_t state;

	if (layer >= p->layers || id >= p->slots_per_layer)
		return false;
	if (id < p->experts)
		return true;
	pthread_mutex_lock(&p->lock);
	state = p->slots[mp_pager_slot(p, layer, id)].state;
	pthread_mutex_unlock(&p->lock);
	return state != ST_UNUSED;
}

static int check_id(struct mp_pager *p, uint32_t layer, uint32_t expert, const char *what)
{
	if (!valid_row(p, layer, expert))
		return plog_err(p, -EINVAL, "%s: layer %u expert %u out of range (%u layers, %u "
				"experts, no bound row %u)", what, layer, expert, p->layers,
				p->experts, expert);
	return 0;
}

/* The slot's address; a use for the policy, or, when poisoned and retry is set, a retry. */
static const void *expert_at(struct mp_pager *p, uint32_t slot, bool retry)
{
	bool poisoned;

	pthread_mutex_lock(&p->lock);
	poisoned = p->slots[slot].state == ST_POISONED;
	if (!poisoned && p->evict.ops->on_access)
		p->evict.ops->on_access(&p->evict, slot);
	pthread_mutex_unlock(&p->lock);
	/* A poisoned expert is asked for again: let the next touch read it again. */
	if (poisoned && retry)
		mp_pager_clear(p, slot);
	return mp_region_slot_addr(p->region, slot);
}

const void *mp_pager_expert(struct mp_pager *p, uint32_t layer, uint32_t expert)
{
	if (check_id(p, layer, expert, "expert"))
		return NULL;
	return expert_at(p, mp_pager_slot(p, layer, expert), true);
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
		if (!valid_row(p, layer, ids[i]))
			return plog_err(p, -EINVAL, "route: layer %u: expert %u out of range (%u, "
					"and not a bound row)", layer, ids[i], p->experts);
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
		if (s->evicted)
			p->st.refaults++;
		if (s->state == ST_FILLING) {
			/*
			 * Routed while its prefetch is read: late, as a fault on it
			 * would count. The note below clears prefetched, so that
			 * fault no longer tells.
			 */
			if (s->prefetched && !s->counted)
				p->st.prefetch_late++;
			mp_pager_note_use(p, s);
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
	while (!mp_pager_idle(p)) {
		uint64_t now = mp_now_ns();

		if (now >= deadline) {
			ret = -ETIMEDOUT;
			break;
		}
		mp_pager_wait_ns(p, &p->state_cv, MP_MIN(deadline - now, 10000000ull));
	}
	pthread_mutex_unlock(&p->lock);
	return ret;
}

int mp_pager_evict(struct mp_pager *p, uint32_t layer, uint32_t expert, unsigned flags)
{
	int err;

	if (check_id(p, layer, expert, "evict"))
		return -EINVAL;
	if (flags & ~(MP_EVICT_KEEP_HOST | MP_EVICT_DEFER))
		return plog_err(p, -EINVAL, "evict: unknown flags %#x", flags);
	pthread_mutex_lock(&p->lock);
	if (flags & MP_EVICT_DEFER)
		err = mp_pager_evict_deferred(p, mp_pager_slot(p, layer, expert),
					      flags & MP_EVICT_KEEP_HOST);
	else
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
	out->resident_bytes = p->mem.resident;
	out->resident_peak = p->mem.resident_peak;
	out->budget_bytes = p->mem.budget;
	out->resident_experts = p->mem.resident_n;
	out->mapped_experts = p->mem.mapped_n;
	out->fill_threads = p->nworkers;
	pthread_mutex_unlock(&p->lock);
	out->memory_bytes = mem.populated_bytes;
	out->fresh_bytes = mem.fresh_bytes;
	out->released_bytes = mem.released_bytes;
	out->fill_cpu_ns = mp_pager_fill_cpu_ns(p);
}

void mp_pager_stats_reset(struct mp_pager *p)
{
	pthread_mutex_lock(&p->lock);
	memset(&p->st, 0, sizeof(p->st));
	p->mem.resident_peak = p->mem.resident;
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
	struct mp_pager *p = ctx;
	uint32_t slot;

	if (!p->caller_resolves || check_id(p, layer, expert, "expert"))
		return mp_pager_expert(p, layer, expert);
	slot = mp_pager_slot(p, layer, expert);
	/* Poisoned by this very request: its touch reports the error rather than reading again. */
	return expert_at(p, slot, !mp_pager_serve(p, slot));
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

/* In memory: mapped, or in host memory (a touch maps it back without a tier read). */
static int source_resident(void *ctx, uint32_t layer, uint32_t expert)
{
	int r = mp_pager_residency(ctx, layer, expert);

	if (r < 0)
		return r;
	return r == MP_RES_MAPPED || r == MP_RES_HOST;
}

static const struct mp_expert_source_ops pager_source_ops = {
	.expert = source_expert,
	.route = source_route,
	.guard = source_guard,
	.resident = source_resident,
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

void mp_pager_demand_reads(struct mp_pager *p, uint64_t *reads, uint64_t *read_ns)
{
	pthread_mutex_lock(&p->lock);
	*reads = p->st.file_reads;
	*read_ns = p->st.file_read_ns;
	pthread_mutex_unlock(&p->lock);
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
	uint32_t n = 0, m, batch[64];

	pthread_mutex_lock(&p->lock);
	/*
	 * The heap's entries, not every slot: the driver calls this at nearly
	 * every gate. A removal reorders the heap, so the keys to drop are
	 * picked first, then unqueued, until a pass finds no more.
	 */
	do {
		m = 0;
		for (uint32_t i = 0; i < p->q.heap_n && m < MP_ARRAY_SIZE(batch); i++)
			if (drop(arg, p->q.heap[i]))
				batch[m++] = p->q.heap[i];
		for (uint32_t i = 0; i < m; i++)
			mp_pager_unqueue(p, batch[i]);
		n += m;
	} while (m == MP_ARRAY_SIZE(batch));
	mp_pager_after_idle(p);
	pthread_mutex_unlock(&p->lock);
	return n;
}
