// SPDX-License-Identifier: MIT
/* Slot states, the job queues, the budget and eviction, and the region's fault callbacks. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include <moepager/pager.h>

#include "base/base.h"
#include "pager/pager_priv.h"
#include "base/probes.h"

/* An unmap refused because pages are pinned is not tried again for this long. */
#define EVICT_RETRY_NS	(10ull * 1000 * 1000)
/* Longest wait for budget before looking again (a fill ends or grace runs out sooner). */
#define BUDGET_WAIT_NS	(100ull * 1000 * 1000)

uint32_t mp_pager_slot(const struct mp_pager *p, uint32_t layer, uint32_t expert)
{
	return layer * p->slots_per_layer + expert;
}

uint32_t mp_pager_hist_bucket(uint64_t ns)
{
	uint32_t b = ns ? 63u - (uint32_t)__builtin_clzll(ns) : 0;

	return MP_MIN(b, MP_PAGER_HIST_BUCKETS - 1u);
}

static void cond_wait_ns(struct mp_pager *p, pthread_cond_t *cv, uint64_t ns)
{
	struct timespec ts;
	uint64_t t;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + ns;
	ts.tv_sec = (time_t)(t / 1000000000ull);
	ts.tv_nsec = (long)(t % 1000000000ull);
	pthread_cond_timedwait(cv, &p->lock, &ts);
}

/*
 * Queues: demand jobs in a FIFO, prefetch jobs in a max-heap on
 * (priority, -seq). A slot is in at most one of them.
 */

static bool heap_before(const struct mp_pager *p, uint32_t a, uint32_t b)
{
	const struct slot *x = &p->slots[a], *y = &p->slots[b];

	return x->prio > y->prio || (x->prio == y->prio && x->seq < y->seq);
}

static void heap_set(struct mp_pager *p, uint32_t i, uint32_t slot)
{
	p->heap[i] = slot;
	p->slots[slot].heap_idx = i;
}

static void heap_up(struct mp_pager *p, uint32_t i)
{
	uint32_t slot = p->heap[i];

	while (i && heap_before(p, slot, p->heap[(i - 1) / 2])) {
		heap_set(p, i, p->heap[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	heap_set(p, i, slot);
}

static void heap_down(struct mp_pager *p, uint32_t i)
{
	uint32_t slot = p->heap[i];

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= p->heap_n)
			break;
		if (c + 1 < p->heap_n && heap_before(p, p->heap[c + 1], p->heap[c]))
			c++;
		if (!heap_before(p, p->heap[c], slot))
			break;
		heap_set(p, i, p->heap[c]);
		i = c;
	}
	heap_set(p, i, slot);
}

static void heap_remove(struct mp_pager *p, uint32_t i)
{
	uint32_t last = p->heap[--p->heap_n];

	if (i == p->heap_n)
		return;
	heap_set(p, i, last);
	heap_up(p, i);
	heap_down(p, p->slots[last].heap_idx);
}

void mp_pager_enqueue(struct mp_pager *p, uint32_t slot, enum queue_class cls, int prio)
{
	struct slot *s = &p->slots[slot];

	if (cls == Q_DEMAND) {
		if (s->queued == Q_DEMAND)
			return;
		if (s->queued == Q_PREFETCH)
			heap_remove(p, s->heap_idx);
		s->queued = Q_DEMAND;
		s->next = SLOT_NONE;
		if (p->demand_tail != SLOT_NONE)
			p->slots[p->demand_tail].next = slot;
		else
			p->demand_head = slot;
		p->demand_tail = slot;
	} else {
		if (s->queued == Q_DEMAND)
			return;
		if (s->queued == Q_PREFETCH) {
			if (prio > s->prio) {
				s->prio = prio;
				heap_up(p, s->heap_idx);
			}
			return;
		}
		s->queued = Q_PREFETCH;
		s->prio = prio;
		s->seq = p->seq++;
		heap_set(p, p->heap_n++, slot);
		heap_up(p, p->heap_n - 1);
	}
	pthread_cond_signal(&p->work_cv);
}

int mp_pager_dequeue(struct mp_pager *p, uint32_t *slot, enum queue_class *cls)
{
	if (p->demand_head != SLOT_NONE) {
		*slot = p->demand_head;
		p->demand_head = p->slots[*slot].next;
		if (p->demand_head == SLOT_NONE)
			p->demand_tail = SLOT_NONE;
		p->slots[*slot].queued = Q_NONE;
		*cls = Q_DEMAND;
		return 0;
	}
	/* Keep a worker free for demand: prefetches never occupy them all. */
	if (p->heap_n && p->prefetch_fills < p->max_prefetch_fills) {
		*slot = p->heap[0];
		heap_remove(p, 0);
		p->slots[*slot].queued = Q_NONE;
		*cls = Q_PREFETCH;
		p->prefetch_fills++;
		return 0;
	}
	return -ENOENT;
}

void mp_pager_unqueue(struct mp_pager *p, uint32_t slot)
{
	struct slot *s = &p->slots[slot];
	uint32_t prev = SLOT_NONE;

	if (s->queued == Q_PREFETCH) {
		heap_remove(p, s->heap_idx);
	} else if (s->queued == Q_DEMAND) {
		for (uint32_t i = p->demand_head; i != slot; i = p->slots[i].next)
			prev = i;
		if (prev == SLOT_NONE)
			p->demand_head = s->next;
		else
			p->slots[prev].next = s->next;
		if (p->demand_tail == slot)
			p->demand_tail = prev;
	}
	s->queued = Q_NONE;
}

void mp_pager_after_idle(struct mp_pager *p)
{
	if (!p->jobs && !p->heap_n && p->demand_head == SLOT_NONE)
		pthread_cond_broadcast(&p->state_cv);
}

/*
 * Waiters and poison
 */

/* Releases the threads recorded on s: stall time, latency histogram, fault_done probe. */
void mp_pager_release_waiters(struct mp_pager *p, struct slot *s, int err)
{
	uint64_t now = mp_now_ns();

	if (s->waiters)
		p->st.stall_ns += s->waiters * now - s->wait_sum_ns;
	if (s->fault_begin) {
		uint64_t lat = now - s->fault_begin;

		if (!err)
			p->st.fault_latency_hist[mp_pager_hist_bucket(lat)]++;
		MP_PROBE(fault_done, s->layer, s->expert, s->fault_tier, lat, err);
	}
	s->waiters = 0;
	s->wait_sum_ns = 0;
	s->fault_begin = 0;
	s->counted = false;
}

/*
 * Poisons a slot that holds nothing in the range (EMPTY, or HOST whose
 * data stays in the pool), so its waiters and later readers get SIGBUS
 * with cause err. Called locked; drops the lock around the ioctl.
 */
int mp_pager_poison_locked(struct mp_pager *p, uint32_t slot, int err)
{
	struct slot *s = &p->slots[slot];
	int ret;

	s->state = ST_POISONED;
	s->err = err;
	if (err != -ESHUTDOWN)
		p->st.poisoned++;
	pthread_mutex_unlock(&p->lock);
	ret = mp_region_slot_poison(p->region, slot, 0);
	pthread_mutex_lock(&p->lock);
	/* Refused (an event pending, on the handler): the handler tries again. */
	s->markers_pending = ret != 0;
	if (!ret)
		mp_pager_release_waiters(p, s, err);
	pthread_cond_broadcast(&p->state_cv);
	return ret;
}

/* Counts a fault episode once, by the tier that serves it, and fires fault_begin. */
static void count_fault(struct mp_pager *p, struct slot *s, bool host)
{
	if (s->counted)
		return;
	s->counted = true;
	s->fault_tier = host ? 0 : p->tier->number;
	if (host)
		p->st.faults_host++;
	else
		p->st.faults_file++;
	MP_PROBE(fault_begin, s->layer, s->expert, s->fault_tier, s->fault_addr);
}

/* A prefetched expert was used (routed to, or faulted on). */
static void prefetch_use(struct mp_pager *p, struct slot *s)
{
	atomic_store(&s->wanted, true);
	if (s->prefetched) {
		s->prefetched = false;
		p->st.prefetch_used++;
	}
}

/*
 * Mapping and eviction
 */

/* HOST -> MAPPED. Called locked (drops it around the move). */
int mp_pager_map_locked(struct mp_pager *p, uint32_t slot)
{
	struct slot *s = &p->slots[slot];
	int err;

	s->state = ST_BUSY;
	s->busy_op = BUSY_MAP;
	pthread_mutex_unlock(&p->lock);
	err = mp_region_slot_map(p->region, slot);
	pthread_mutex_lock(&p->lock);
	if (!err) {
		s->state = ST_MAPPED;
		s->mapped_at = mp_now_ns();
		p->mapped_n++;
		p->st.bytes_host += p->expert_bytes;
		mp_pager_release_waiters(p, s, 0);
		pthread_cond_broadcast(&p->state_cv);
		pthread_mutex_unlock(&p->lock);
		/* Woken after the books say mapped: what they read next is consistent. */
		mp_region_slot_wake(p->region, slot);
		pthread_mutex_lock(&p->lock);
		return 0;
	}
	if (err == -EAGAIN || err == -EBUSY) {
		/*
		 * On the handler with an event pending (or a page briefly
		 * pinned): a worker, which may wait, maps it instead.
		 */
		s->state = ST_HOST;
		mp_pager_enqueue(p, slot, Q_DEMAND, 0);
		return err;
	}
	if (err == -EFAULT) {
		/* Pages lost: the slot counts as mapped until a worker discards and refills it. */
		s->state = ST_MAPPED;
		s->lost = true;
		p->mapped_n++;
		mp_pager_enqueue(p, slot, Q_DEMAND, 0);
		return err;
	}
	/* The data is intact in the pool, but cannot be mapped: fail its readers, keep nothing. */
	s->state = ST_BUSY;
	s->busy_op = BUSY_DROP;
	pthread_mutex_unlock(&p->lock);
	mp_region_slot_free(p->region, slot);
	pthread_mutex_lock(&p->lock);
	mp_pager_unreserve(p, slot);
	if (p->evict.ops->on_remove)
		p->evict.ops->on_remove(&p->evict, slot);
	mp_pager_poison_locked(p, slot, err);
	return err;
}

struct evict_scan {
	struct mp_pager *p;
	uint64_t now;
	uint64_t next_ok;	/* earliest time a skipped candidate becomes evictable */
};

static bool evictable(void *arg, uint32_t key)
{
	struct evict_scan *c = arg;
	struct mp_pager *p = c->p;
	struct slot *s = &p->slots[key];

	if (s->state != ST_MAPPED && s->state != ST_HOST)
		return false;
	if (s->evict_retry_at > c->now) {
		c->next_ok = MP_MIN(c->next_ok, s->evict_retry_at);
		return false;
	}
	return true;
}

/*
 * When the threads that faulted a slot in may first read it: until then
 * the slot is not evicted, so a reader under a tight budget is not
 * starved by a refill racing its read. 0 when it may go now.
 */
static uint64_t grace_end(const struct mp_pager *p, const struct slot *s, uint64_t now)
{
	/*
	 * Only a budget that cannot hold one expert per fill thread and one
	 * more lets concurrent fills evict each other's fresh experts; with
	 * more room the policy's victim is old enough, and waiting on it
	 * would only stall the fill.
	 */
	if (p->budget >= (uint64_t)(p->nworkers + 2) * p->expert_bytes)
		return 0;
	if (s->demanded && s->state == ST_MAPPED && now - s->mapped_at < p->min_resident_ns)
		return s->mapped_at + p->min_resident_ns;
	return 0;
}

/* Returns the reserved bytes of a slot whose data left (or never reached) memory. */
void mp_pager_unreserve(struct mp_pager *p, uint32_t slot)
{
	(void)slot;
	p->resident -= p->expert_bytes;
	p->resident_n--;
	pthread_cond_broadcast(&p->state_cv);
}

/* The end of a BUSY transition: serve the threads that faulted meanwhile. */
static void finish_busy(struct mp_pager *p, uint32_t slot)
{
	struct slot *s = &p->slots[slot];

	pthread_cond_broadcast(&p->state_cv);
	if (!s->refault)
		return;
	s->refault = false;
	if (atomic_load(&p->closing))
		return;
	switch (s->state) {
	case ST_HOST:
		count_fault(p, s, true);
		mp_pager_enqueue(p, slot, Q_DEMAND, 0);
		break;
	case ST_EMPTY:
		count_fault(p, s, false);
		s->demanded = true;
		mp_pager_enqueue(p, slot, Q_DEMAND, 0);
		break;
	case ST_MAPPED:
		/* Back in place (an unmap was rolled back): the waiters were woken with it. */
		mp_pager_release_waiters(p, s, 0);
		break;
	default:
		break;
	}
}

/*
 * MAPPED/HOST -> HOST (keep_host) or EMPTY. Called locked, never on the
 * handler thread (a lost slot is discarded here, which zaps the range).
 */
int mp_pager_evict_locked(struct mp_pager *p, uint32_t slot, bool keep_host)
{
	struct slot *s = &p->slots[slot];
	uint8_t prev = s->state;
	bool lost = false;
	int err = 0;

	if (prev != ST_MAPPED && prev != ST_HOST)
		return prev == ST_EMPTY || prev == ST_POISONED ? -ENOENT : -EBUSY;
	if (prev == ST_HOST && keep_host)
		return 0;
	plog_debug(p, "layer %u expert %u: %s", s->layer, s->expert,
		   keep_host ? "unmapping (kept in host memory)" : "evicting");
	s->state = ST_BUSY;
	s->busy_op = keep_host ? BUSY_UNMAP : BUSY_DROP;
	pthread_mutex_unlock(&p->lock);
	if (prev == ST_MAPPED)
		err = mp_region_slot_unmap(p->region, slot);
	if (!err && !keep_host)
		err = mp_region_slot_free(p->region, slot);
	if (err == -EFAULT) {
		lost = true;
		mp_region_slot_discard(p->region, slot);
	}
	pthread_mutex_lock(&p->lock);
	if (err && !lost) {
		/* Pinned pages (EBUSY) or a transient failure: still mapped and whole. */
		s->state = prev;
		s->evict_retry_at = mp_now_ns() + EVICT_RETRY_NS;
		finish_busy(p, slot);
		return err;
	}
	if (prev == ST_MAPPED)
		p->mapped_n--;
	if (keep_host && !lost) {
		s->state = ST_HOST;
		p->st.evictions_view++;
		MP_PROBE(evict, s->layer, s->expert, 0);
	} else {
		s->state = ST_EMPTY;
		s->demanded = false;
		s->lost = false;
		mp_pager_unreserve(p, slot);
		if (p->evict.ops->on_remove)
			p->evict.ops->on_remove(&p->evict, slot);
		p->st.evictions++;
		if (s->prefetched) {
			s->prefetched = false;
			p->st.prefetch_wasted++;
		}
		MP_PROBE(evict, s->layer, s->expert, p->expert_bytes);
		mp_region_trim(p->region, p->spare_bytes);
	}
	/* No handler to serve the next touch: make it an error, not a hang. */
	if (p->broken)
		mp_pager_poison_locked(p, slot, -EPIPE);
	finish_busy(p, slot);
	return 0;
}

/*
 * Makes room for one expert and reserves it for slot. Called locked by a
 * fill worker; evicts victims the policy picks, and waits when every
 * candidate is busy or within its minimum residency. -EAGAIN: a prefetch
 * that may not evict the victim (mp_evict_admit()), nothing reserved.
 */
int mp_pager_reserve(struct mp_pager *p, uint32_t slot)
{
	while (p->resident + p->expert_bytes > p->budget) {
		struct evict_scan c = { p, mp_now_ns(), UINT64_MAX };
		int64_t v;

		if (atomic_load(&p->closing))
			return -ESHUTDOWN;
		if (p->broken)
			return -EPIPE;
		v = p->evict.ops->pick_victim(&p->evict, evictable, &c);
		/*
		 * A prefetch never evicts an expert predicted to be needed before
		 * the one it brings (lib/prefetch.h hints): it is given up, like an
		 * unwanted prefetch, unless a thread already waits for it.
		 */
		if (v >= 0 && p->slots[slot].prefetched && !p->slots[slot].waiters &&
		    !mp_evict_admit(p->evict.env.hints, slot, (uint32_t)v))
			return -EAGAIN;
		if (v >= 0) {
			/* The policy's choice stands; if it is still in its grace, wait for it. */
			uint64_t until = grace_end(p, &p->slots[v], c.now);

			if (until) {
				cond_wait_ns(p, &p->state_cv, until - c.now + 1000);
				continue;
			}
			mp_pager_evict_locked(p, (uint32_t)v, false);
			continue;
		}
		if (!p->resident)
			return plog_err(p, -ENOSPC, "budget %llu cannot hold one expert "
					"(%llu bytes)",
					(unsigned long long)p->budget,
					(unsigned long long)p->expert_bytes);
		cond_wait_ns(p, &p->state_cv, c.next_ok != UINT64_MAX ?
			     MP_MIN(c.next_ok - c.now, BUDGET_WAIT_NS) + 1000 : BUDGET_WAIT_NS);
	}
	p->resident += p->expert_bytes;
	p->resident_n++;
	p->resident_peak = MP_MAX(p->resident_peak, p->resident);
	return 0;
}

/* Evicts until the budget holds (after it shrank). Called locked, off the handler. */
void mp_pager_enforce_budget(struct mp_pager *p)
{
	while (p->resident > p->budget && !p->broken) {
		struct evict_scan c = { p, mp_now_ns(), UINT64_MAX };
		int64_t v = p->evict.ops->pick_victim(&p->evict, evictable, &c);

		if (v < 0)
			break;
		mp_pager_evict_locked(p, (uint32_t)v, false);
	}
}

/*
 * Poison: clearing it so the next access reads again
 */

int mp_pager_clear(struct mp_pager *p, uint32_t slot)
{
	struct slot *s = &p->slots[slot];
	int err;

	pthread_mutex_lock(&p->lock);
	if (s->state != ST_POISONED || atomic_load(&p->closing) || p->broken) {
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	s->state = ST_CLEARING;
	pthread_mutex_unlock(&p->lock);
	err = mp_region_slot_clear(p->region, slot);
	pthread_mutex_lock(&p->lock);
	if (err) {
		s->state = ST_POISONED;
	} else {
		s->state = ST_EMPTY;
		s->err = 0;
		s->tail_poisoned = false;
		plog_debug(p, "layer %u expert %u: poison cleared; the next access reads it again",
			   s->layer, s->expert);
	}
	finish_busy(p, slot);
	pthread_mutex_unlock(&p->lock);
	return err;
}

/*
 * The region's callbacks (handler thread)
 */

static int on_fault(void *owner, uint32_t slot, uint64_t offset, uint32_t count, uint64_t now)
{
	struct mp_pager *p = owner;
	struct slot *s;
	int err = 0;

	if (slot >= p->nslots)
		return 0;
	s = &p->slots[slot];
	pthread_mutex_lock(&p->lock);
	if (s->state == ST_UNUSED || s->gone || offset >= p->data_bytes) {
		/*
		 * No expert lives here (a spare slot, or the padding after an
		 * expert's bytes): nothing will ever resolve it, so poison it.
		 */
		if (!s->tail_poisoned && s->state != ST_POISONED && s->state != ST_CLEARING) {
			s->tail_poisoned = true;
			pthread_mutex_unlock(&p->lock);
			err = mp_region_slot_poison(p->region, slot,
						    s->state == ST_UNUSED ? 0 : p->data_bytes);
			if (err) {
				pthread_mutex_lock(&p->lock);
				s->tail_poisoned = false;
				pthread_mutex_unlock(&p->lock);
			}
			return err == -EAGAIN ? err : 0;
		}
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	if (s->state == ST_POISONED && s->markers_pending) {
		err = mp_pager_poison_locked(p, slot, s->err);
		pthread_mutex_unlock(&p->lock);
		return err == -EAGAIN ? err : 0;
	}
	if (s->state == ST_MAPPED && !s->lost) {
		if (mp_region_page_present(p->region, slot, offset)) {
			/* Queued before the map woke its thread: nothing to do but make sure. */
			pthread_mutex_unlock(&p->lock);
			mp_region_slot_wake(p->region, slot);
			return 0;
		}
		/* Mapped, yet the page is gone: zapped behind our back. Refill. */
		plog_warn(p, "layer %u expert %u: pages missing from a mapped expert; reading it "
			  "again", s->layer, s->expert);
		s->lost = true;
		mp_pager_enqueue(p, slot, Q_DEMAND, 0);
	}
	/* count 0: a deferred fault tried again, its waiters already counted. */
	s->waiters += count;
	s->wait_sum_ns += count * now;
	p->st.fault_waits += count;
	if (!s->fault_begin) {
		s->fault_begin = now;
		s->fault_addr = (uint64_t)(uintptr_t)mp_region_slot_addr(p->region, slot) + offset;
	}
	if (atomic_load(&p->closing) || p->broken) {
		if (s->state == ST_EMPTY || s->state == ST_HOST) {
			if (s->queued)
				mp_pager_unqueue(p, slot);
			err = mp_pager_poison_locked(p, slot, p->broken ? -EPIPE : -ESHUTDOWN);
		}
		pthread_mutex_unlock(&p->lock);
		return err == -EAGAIN ? err : 0;
	}
	if (p->evict.ops->on_fault)
		p->evict.ops->on_fault(&p->evict, slot);
	switch (s->state) {
	case ST_HOST:
		count_fault(p, s, true);
		prefetch_use(p, s);
		s->demanded = true;
		mp_pager_map_locked(p, slot);
		break;
	case ST_EMPTY:
		count_fault(p, s, false);
		s->demanded = true;
		mp_pager_enqueue(p, slot, Q_DEMAND, 0);
		break;
	case ST_FILLING:
		if (!s->counted && s->prefetched)
			p->st.prefetch_late++;
		count_fault(p, s, false);
		prefetch_use(p, s);
		s->demanded = true;
		break;
	case ST_MAPPED:		/* lost: queued above */
	case ST_BUSY:
	case ST_CLEARING:
		s->refault = true;
		break;
	case ST_POISONED:
		/* Read before the poison went in; the poison woke them into SIGBUS. */
		mp_pager_release_waiters(p, s, s->err);
		break;
	default:
		break;
	}
	pthread_mutex_unlock(&p->lock);
	return 0;
}

static void on_removed(void *owner, uint32_t first, uint32_t last, bool unmapped)
{
	struct mp_pager *p = owner;
	bool told = false;

	pthread_mutex_lock(&p->lock);
	for (uint32_t slot = first; slot <= last && slot < p->nslots; slot++) {
		struct slot *s = &p->slots[slot];

		/* Our own zaps: clearing poison, discarding a lost slot. */
		if (s->state == ST_CLEARING || s->state == ST_BUSY)
			continue;
		if (!told) {
			plog_warn(p, "the application %s slots %u..%u of the range; their "
				  "experts %s",
				  unmapped ? "unmapped" : "zapped", first, last,
				  unmapped ? "are gone" : "will be read again");
			told = true;
		}
		s->gone |= unmapped;
		s->tail_poisoned = false;
		if (s->state == ST_MAPPED) {
			s->lost = true;
			mp_pager_enqueue(p, slot, Q_DEMAND, 0);
		} else if (s->state == ST_POISONED) {
			/* The markers are gone: accesses reach the handler again. */
			s->state = ST_EMPTY;
		}
	}
	pthread_mutex_unlock(&p->lock);
}

static void on_stopped(void *owner, int err)
{
	struct mp_pager *p = owner;

	pthread_mutex_lock(&p->lock);
	p->broken = true;
	plog_err(p, err, "the fault handler stopped (%s): failing every expert not mapped",
		 strerror(-err));
	for (uint32_t slot = 0; slot < p->nslots; slot++) {
		struct slot *s = &p->slots[slot];

		if (s->queued)
			mp_pager_unqueue(p, slot);
		if (s->state == ST_EMPTY || s->state == ST_HOST)
			mp_pager_poison_locked(p, slot, -EPIPE);
	}
	pthread_cond_broadcast(&p->work_cv);
	pthread_cond_broadcast(&p->state_cv);
	pthread_mutex_unlock(&p->lock);
}

const struct mp_region_ops mp_pager_region_ops = {
	.fault = on_fault,
	.removed = on_removed,
	.stopped = on_stopped,
};
