// SPDX-License-Identifier: MIT
/* The fill workers' job queues: demand jobs in a FIFO, prefetch jobs in a max-heap on priority. */
#include <errno.h>

#include "base/base.h"
#include "pager/pager_priv.h"

/*
 * A slot is in at most one of the queues; the heap orders by (priority, -seq),
 * so prefetches of equal priority run in the order they were asked for.
 */

static bool heap_before(const struct mp_pager *p, uint32_t a, uint32_t b)
{
	const struct slot *x = &p->slots[a], *y = &p->slots[b];

	return x->prio > y->prio || (x->prio == y->prio && x->seq < y->seq);
}

static void heap_set(struct mp_pager *p, uint32_t i, uint32_t slot)
{
	p->q.heap[i] = slot;
	p->slots[slot].heap_idx = i;
}

static void heap_up(struct mp_pager *p, uint32_t i)
{
	uint32_t slot = p->q.heap[i];

	while (i && heap_before(p, slot, p->q.heap[(i - 1) / 2])) {
		heap_set(p, i, p->q.heap[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	heap_set(p, i, slot);
}

static void heap_down(struct mp_pager *p, uint32_t i)
{
	uint32_t slot = p->q.heap[i];

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= p->q.heap_n)
			break;
		if (c + 1 < p->q.heap_n && heap_before(p, p->q.heap[c + 1], p->q.heap[c]))
			c++;
		if (!heap_before(p, p->q.heap[c], slot))
			break;
		heap_set(p, i, p->q.heap[c]);
		i = c;
	}
	heap_set(p, i, slot);
}

static void heap_remove(struct mp_pager *p, uint32_t i)
{
	uint32_t last = p->q.heap[--p->q.heap_n];

	if (i == p->q.heap_n)
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
		if (p->q.demand_tail != SLOT_NONE)
			p->slots[p->q.demand_tail].next = slot;
		else
			p->q.demand_head = slot;
		p->q.demand_tail = slot;
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
		s->seq = p->q.seq++;
		heap_set(p, p->q.heap_n++, slot);
		heap_up(p, p->q.heap_n - 1);
	}
	pthread_cond_signal(&p->work_cv);
}

int mp_pager_dequeue(struct mp_pager *p, uint32_t *slot, enum queue_class *cls)
{
	if (p->q.demand_head != SLOT_NONE) {
		*slot = p->q.demand_head;
		p->q.demand_head = p->slots[*slot].next;
		if (p->q.demand_head == SLOT_NONE)
			p->q.demand_tail = SLOT_NONE;
		p->slots[*slot].queued = Q_NONE;
		*cls = Q_DEMAND;
		return 0;
	}
	/* Keep a worker free for demand: prefetches never occupy them all. */
	if (p->q.heap_n && p->q.prefetch_fills < p->q.max_prefetch_fills) {
		*slot = p->q.heap[0];
		heap_remove(p, 0);
		p->slots[*slot].queued = Q_NONE;
		*cls = Q_PREFETCH;
		p->q.prefetch_fills++;
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
		for (uint32_t i = p->q.demand_head; i != slot; i = p->slots[i].next)
			prev = i;
		if (prev == SLOT_NONE)
			p->q.demand_head = s->next;
		else
			p->slots[prev].next = s->next;
		if (p->q.demand_tail == slot)
			p->q.demand_tail = prev;
	}
	s->queued = Q_NONE;
}

bool mp_pager_idle(const struct mp_pager *p)
{
	return !p->q.jobs && !p->q.heap_n && p->q.demand_head == SLOT_NONE;
}

void mp_pager_after_idle(struct mp_pager *p)
{
	if (mp_pager_idle(p))
		pthread_cond_broadcast(&p->state_cv);
}
