// SPDX-License-Identifier: MIT
/*
 * Slot transitions: mapping, unmapping and dropping an expert, poisoning and
 * clearing it, and releasing the threads that waited on it.
 */
#include <errno.h>
#include <string.h>

#include "base/base.h"
#include "pager/pager_priv.h"
#include "base/probes.h"

/* An unmap refused because pages are pinned is not tried again for this long. */
#define EVICT_RETRY_NS	(10ull * 1000 * 1000)

uint32_t mp_pager_slot(const struct mp_pager *p, uint32_t layer, uint32_t expert)
{
	return layer * p->slots_per_layer + expert;
}

uint32_t mp_pager_hist_bucket(uint64_t ns)
{
	uint32_t b = ns ? 63u - (uint32_t)__builtin_clzll(ns) : 0;

	return MP_MIN(b, MP_PAGER_HIST_BUCKETS - 1u);
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
	if (s->caller_waiters)
		p->st.caller_stall_ns += s->caller_waiters * now - s->caller_wait_sum_ns;
	if (s->fault_begin) {
		uint64_t lat = now - s->fault_begin;

		if (!err)
			p->st.fault_latency_hist[mp_pager_hist_bucket(lat)]++;
		MP_PROBE(fault_done, s->layer, s->expert, s->fault_tier, lat, err);
	}
	s->waiters = 0;
	s->wait_sum_ns = 0;
	s->caller_waiters = 0;
	s->caller_wait_sum_ns = 0;
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
	/*
	 * Until the markers are in, nobody may clear them: a zap that ran
	 * first would leave them behind on an EMPTY slot, and the next fill's
	 * move into the range would find them (EEXIST) and fail.
	 */
	s->poisoning = true;
	s->markers_pending = false;
	pthread_mutex_unlock(&p->lock);
	ret = mp_region_slot_poison(p->region, slot, 0);
	pthread_mutex_lock(&p->lock);
	s->poisoning = false;
	/* Refused (an event pending, on the handler), or zapped meanwhile: tried again. */
	s->markers_pending |= ret != 0;
	if (!ret)
		mp_pager_release_waiters(p, s, err);
	pthread_cond_broadcast(&p->state_cv);
	return ret;
}

/* Counts a fault episode once, by the tier that serves it, and fires fault_begin. */
void mp_pager_count_fault(struct mp_pager *p, struct slot *s, bool host)
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
void mp_pager_note_use(struct mp_pager *p, struct slot *s)
{
	atomic_store(&s->wanted, true);
	if (s->prefetched) {
		s->prefetched = false;
		p->st.prefetch_used++;
	}
}

void mp_pager_demand_fill(struct mp_pager *p, uint32_t slot)
{
	struct slot *s = &p->slots[slot];

	mp_pager_count_fault(p, s, false);
	s->demanded = true;
	mp_pager_enqueue(p, slot, Q_DEMAND, 0);
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
		p->mem.mapped_n++;
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
		p->mem.mapped_n++;
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

/* Returns the reserved bytes of a slot whose data left (or never reached) memory. */
void mp_pager_unreserve(struct mp_pager *p, uint32_t slot)
{
	(void)slot;
	p->mem.resident -= p->expert_bytes;
	p->mem.resident_n--;
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
		mp_pager_count_fault(p, s, true);
		mp_pager_enqueue(p, slot, Q_DEMAND, 0);
		break;
	case ST_EMPTY:
		mp_pager_demand_fill(p, slot);
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
 * Gives spare chunks back only past what the memory bound allows (pages
 * held <= budget + spare_bytes). An eviction turns the victim's chunks into
 * spares without growing what is held; trimming the spares themselves to
 * spare_bytes released the chunks a prefetch had just evicted for (it
 * evicts, then takes chunks), and a demand fill then found no spare and
 * zeroed new pages on its reader's critical path: ds26 zeroed 5 GB in 256
 * tokens that way (docs/region.md). Called locked, after each eviction and
 * when the budget changes.
 */
void mp_pager_trim_spares(struct mp_pager *p)
{
	uint64_t limit = mp_pager_mem_limit(p), excess;
	struct mp_region_mem m;

	mp_region_mem(p->region, &m);
	if (m.populated_bytes <= limit)
		return;
	excess = m.populated_bytes - limit;
	mp_region_trim(p->region, m.spare_bytes > excess ? m.spare_bytes - excess : 0);
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
	if (!keep_host)
		p->mem.dropping += p->expert_bytes;
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
	if (!keep_host)
		p->mem.dropping -= p->expert_bytes;
	if (err && !lost) {
		/* Pinned pages (EBUSY) or a transient failure: still mapped and whole. */
		s->state = prev;
		s->evict_retry_at = mp_now_ns() + EVICT_RETRY_NS;
		finish_busy(p, slot);
		return err;
	}
	if (prev == ST_MAPPED)
		p->mem.mapped_n--;
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
		s->evicted = true;
		if (s->prefetched) {
			s->prefetched = false;
			p->st.prefetch_wasted++;
		}
		MP_PROBE(evict, s->layer, s->expert, p->expert_bytes);
		mp_pager_trim_spares(p);
	}
	/* No handler to serve the next touch: make it an error, not a hang. */
	if (p->broken)
		mp_pager_poison_locked(p, slot, -EPIPE);
	finish_busy(p, slot);
	return 0;
}

/* A map or unmap is a few ioctls; this bound only keeps a wedged one from hanging the caller. */
#define BUSY_WAIT_NS		(1000ull * 1000 * 1000)
#define BUSY_WAIT_STEP_NS	(1000ull * 1000)

/*
 * Waits (locked, the lock released while it waits on state_cv) while
 * another thread maps, unmaps or drops the slot, or zaps its poison
 * markers. Not every end of those broadcasts, so it waits in short steps.
 */
static void wait_not_busy(struct mp_pager *p, struct slot *s)
{
	uint64_t deadline = mp_now_ns() + BUSY_WAIT_NS;

	while ((s->state == ST_BUSY || s->state == ST_CLEARING) && !atomic_load(&p->closing) &&
	       mp_now_ns() < deadline)
		mp_pager_wait_ns(p, &p->state_cv, BUSY_WAIT_STEP_NS);
}

/* A deferred drop's room is back (or no longer coming): a reserve waiting for it looks again. */
static void pending_drop_done(struct mp_pager *p)
{
	p->mem.pending_drop -= p->expert_bytes;
	pthread_cond_broadcast(&p->state_cv);
}

/*
 * A FILLING slot marked PENDING_DROP whose fill reserved its bytes: the
 * room they hold comes back when the read ends (evicted, or the fill
 * fails), so mp_pager_reserve() waits for it instead of evicting another
 * expert. Called locked whenever the mark or the reservation changes.
 */
void mp_pager_count_pending(struct mp_pager *p, struct slot *s)
{
	bool on = s->state == ST_FILLING && s->fill_reserved && s->evict_pending == PENDING_DROP;

	if (on == s->drop_counted)
		return;
	s->drop_counted = on;
	if (on) {
		p->mem.pending_drop += p->expert_bytes;
		return;
	}
	pending_drop_done(p);
}

/*
 * mp_pager_evict(MP_EVICT_DEFER). A read in flight: marked, and the fill
 * evicts when it ends (mp_pager_evict_pending()). A queued prefetch of the
 * expert would bring it back: dropped, after the wait (a prefetcher may
 * queue it meanwhile). Called locked, never on the handler thread. Returns
 * 1 (deferred) or what mp_pager_evict_locked() does.
 */
int mp_pager_evict_deferred(struct mp_pager *p, uint32_t slot, bool keep_host)
{
	struct slot *s = &p->slots[slot];

	wait_not_busy(p, s);
	if (s->queued == Q_PREFETCH) {
		mp_pager_unqueue(p, slot);
		mp_pager_after_idle(p);
	}
	if (s->state == ST_FILLING) {
		s->evict_pending = MP_MAX(s->evict_pending,
					  keep_host ? PENDING_UNMAP : PENDING_DROP);
		mp_pager_count_pending(p, s);
		return 1;
	}
	return mp_pager_evict_locked(p, slot, keep_host);
}

/*
 * The fill an eviction was deferred for mapped the expert and woke its
 * waiters: evict it now, if it is still that fill's. Meanwhile (the lock
 * was dropped) someone else may have evicted it, or evicted and read it
 * again: then there is nothing to do, and a new read's mark is its own.
 * The room stays counted as coming until the eviction counts it as
 * dropping, so no reserve evicts another expert for it in between. Called
 * locked by the thread that filled it.
 */
void mp_pager_evict_pending(struct mp_pager *p, uint32_t slot, uint8_t pending, bool counted)
{
	struct slot *s = &p->slots[slot];
	int err;

	if (!pending)
		return;
	wait_not_busy(p, s);
	if (counted)
		pending_drop_done(p);
	if (s->state != ST_MAPPED && s->state != ST_HOST)
		return;
	err = mp_pager_evict_locked(p, slot, pending == PENDING_UNMAP);
	if (err)
		plog_warn(p, "layer %u expert %u: eviction asked for during its read: %s",
			  s->layer, s->expert, strerror(-err));
}

/*
 * Poison: clearing it so the next access reads again
 */

int mp_pager_clear(struct mp_pager *p, uint32_t slot)
{
	struct slot *s = &p->slots[slot];
	int err;

	pthread_mutex_lock(&p->lock);
	while (s->poisoning)
		pthread_cond_wait(&p->state_cv, &p->lock);
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
