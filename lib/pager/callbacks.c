// SPDX-License-Identifier: MIT
/*
 * The region's callbacks, on its handler thread: a thread faulted on a slot,
 * the application zapped or unmapped part of the range, the handler stopped.
 */
#include <errno.h>
#include <string.h>

#include "base/base.h"
#include "pager/pager_priv.h"

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
		mp_pager_count_fault(p, s, true);
		mp_pager_note_use(p, s);
		s->demanded = true;
		mp_pager_map_locked(p, slot);
		break;
	case ST_EMPTY:
		mp_pager_demand_fill(p, slot);
		break;
	case ST_FILLING:
		if (!s->counted && s->prefetched)
			p->st.prefetch_late++;
		mp_pager_count_fault(p, s, false);
		mp_pager_note_use(p, s);
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

		/*
		 * Our own zaps: clearing poison, discarding a lost slot, or a
		 * fill whose map failed (a FILLING slot's range is the fill's
		 * alone: before its map there is nothing there to zap).
		 */
		if (s->state == ST_CLEARING || s->state == ST_BUSY)
			continue;
		if (s->state == ST_FILLING) {
			/* Its experts are gone if the range went: the fill's map then fails. */
			s->gone |= unmapped;
			continue;
		}
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
		} else if (s->state == ST_POISONED && s->poisoning) {
			/* Markers going in now land after the zap: put in the rest on the next fault. */
			s->markers_pending = true;
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
