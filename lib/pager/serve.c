// SPDX-License-Identifier: MIT
/*
 * Engine requests resolved on the asking thread (MP_RESOLVE_CALLER): a routed
 * expert that no fill thread has started is read or mapped right there, one a
 * fill thread is reading is waited for; the engine never faults on it.
 */
#include "base/base.h"
#include "pager/pager_priv.h"

/*
 * Why (docs/region.md, "Small experts"): on the fault path a miss costs the
 * faulting thread a fault, a fault message, a wake-up of the handler, one of
 * a fill thread, and its own wake-up at the end, on CPUs the engine's own
 * threads are using. For a 0.2 MB expert (a ~0.3 ms read) that overhead is
 * as large as the read; the thread that needs the expert has nothing else to
 * do meanwhile, so it reads it itself, as a pread() would, while the fill
 * threads read the layer's other routed experts in parallel.
 */

/* A routed expert waiting in the demand queue for a fill thread. */
static bool queued_demand(const struct slot *s)
{
	return (s->state == ST_EMPTY || s->state == ST_HOST) && s->queued == Q_DEMAND;
}

/*
 * Counts the asking thread as one waiter of the slot's fault episode, as a
 * fault message would be (on_fault()): the one that ends the episode
 * (fill, map or poison) releases it with the stall and latency figures.
 */
static void join(struct mp_pager *p, uint32_t slot, bool host)
{
	struct slot *s = &p->slots[slot];
	uint64_t now = mp_now_ns();

	if (!s->counted && s->state == ST_FILLING && s->prefetched)
		p->st.prefetch_late++;
	if (!s->fault_begin) {
		s->fault_begin = now;
		s->fault_addr = (uint64_t)(uintptr_t)mp_region_slot_addr(p->region, slot);
	}
	s->waiters++;
	s->wait_sum_ns += now;
	s->caller_waiters++;
	s->caller_wait_sum_ns += now;
	p->st.fault_waits++;
	if (p->evict.ops->on_fault)
		p->evict.ops->on_fault(&p->evict, slot);
	mp_pager_count_fault(p, s, host);
	mp_pager_note_use(p, s);
	s->demanded = true;
}

/* Reads the queued expert with the caller's ring. Called locked, p->caller free. */
static void read_here(struct mp_pager *p, uint32_t slot)
{
	mp_pager_unqueue(p, slot);
	join(p, slot, false);
	p->caller_busy = true;
	p->q.jobs++;
	p->st.caller_reads++;
	mp_pager_fill(&p->caller, slot, Q_DEMAND);
	p->q.jobs--;
	p->caller_busy = false;
	pthread_cond_broadcast(&p->state_cv);
	mp_pager_after_idle(p);
}

bool mp_pager_serve(struct mp_pager *p, uint32_t slot)
{
	struct slot *s = &p->slots[slot];
	bool joined = false, tried = false, failed;

	pthread_mutex_lock(&p->lock);
	while (!atomic_load(&p->closing) && !p->broken) {
		if (!tried && queued_demand(s) && (s->state == ST_HOST || !p->caller_busy)) {
			/* Once: if it fails (poisoned, or queued again), a fill thread or the guard take over. */
			tried = true;
			if (s->state == ST_EMPTY) {
				read_here(p, slot);
			} else {
				mp_pager_unqueue(p, slot);
				join(p, slot, true);
				mp_pager_map_locked(p, slot);
			}
			continue;
		}
		if (s->state == ST_FILLING && !joined && !tried) {
			/* Every fill ends by releasing its waiters (mapped or poisoned). */
			join(p, slot, false);
			joined = true;
		} else if (s->state != ST_FILLING && s->state != ST_BUSY && !queued_demand(s)) {
			break;
		}
		pthread_cond_wait(&p->state_cv, &p->lock);
	}
	/* The episode it read or waited for failed: the touch reports it, not a second round. */
	failed = (tried || joined) && s->state == ST_POISONED;
	pthread_mutex_unlock(&p->lock);
	return failed;
}
