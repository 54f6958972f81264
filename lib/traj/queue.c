// SPDX-License-Identifier: MIT
/* The in-process trajectory recorder: a bounded MPMC queue (per-cell sequence numbers). */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include <moepager/traj.h>

#include "base/base.h"
#include "traj/queue.h"

/*
 * Each cell's seq tells whose turn it is: == pos, free for the producer of
 * pos; == pos + 1, filled for the consumer of pos. A producer that finds the
 * cell of its position still unread gives up at once: inference never waits
 * for the consumer.
 */
struct cell {
	_Atomic uint64_t seq;
	struct mp_traj_rec rec;
};

struct traj_queue {
	struct cell *cells;
	uint64_t mask;
	_Alignas(64) _Atomic uint64_t head;	/* next position to fill */
	_Alignas(64) _Atomic uint64_t tail;	/* next position to read */
	_Alignas(64) _Atomic uint64_t dropped;
};

int traj_queue_create(uint32_t capacity, struct traj_queue **out)
{
	struct traj_queue *q;

	if (capacity < 2 || (capacity & (capacity - 1)))
		return mp_err(-EINVAL, "trajectory queue: capacity %u is not a power of two >= 2",
			      capacity);
	q = aligned_alloc(64, sizeof(*q));
	if (!q)
		return mp_err(-ENOMEM, "trajectory queue: out of memory");
	q->cells = calloc(capacity, sizeof(*q->cells));
	if (!q->cells) {
		free(q);
		return mp_err(-ENOMEM, "trajectory queue: out of memory for %u records", capacity);
	}
	for (uint32_t i = 0; i < capacity; i++)
		atomic_init(&q->cells[i].seq, i);
	q->mask = capacity - 1;
	atomic_init(&q->head, 0);
	atomic_init(&q->tail, 0);
	atomic_init(&q->dropped, 0);
	*out = q;
	return 0;
}

void traj_queue_destroy(struct traj_queue *q)
{
	if (!q)
		return;
	free(q->cells);
	free(q);
}

int traj_queue_push(struct traj_queue *q, const struct mp_traj_rec *r)
{
	uint64_t pos = atomic_load_explicit(&q->head, memory_order_relaxed);
	struct cell *c;

	for (;;) {
		int64_t dif;

		c = &q->cells[pos & q->mask];
		dif = (int64_t)(atomic_load_explicit(&c->seq, memory_order_acquire) - pos);
		if (dif == 0) {
			if (atomic_compare_exchange_weak_explicit(&q->head, &pos, pos + 1,
								  memory_order_relaxed,
								  memory_order_relaxed))
				break;
		} else if (dif < 0) {
			atomic_fetch_add_explicit(&q->dropped, 1, memory_order_relaxed);
			return -ENOSPC;
		} else {
			pos = atomic_load_explicit(&q->head, memory_order_relaxed);
		}
	}
	c->rec = *r;
	atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
	return 0;
}

bool traj_queue_pop(struct traj_queue *q, struct mp_traj_rec *out)
{
	uint64_t pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
	struct cell *c;

	for (;;) {
		int64_t dif;

		c = &q->cells[pos & q->mask];
		dif = (int64_t)(atomic_load_explicit(&c->seq, memory_order_acquire) - (pos + 1));
		if (dif == 0) {
			if (atomic_compare_exchange_weak_explicit(&q->tail, &pos, pos + 1,
								  memory_order_relaxed,
								  memory_order_relaxed))
				break;
		} else if (dif < 0) {
			return false;
		} else {
			pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
		}
	}
	*out = c->rec;
	atomic_store_explicit(&c->seq, pos + q->mask + 1, memory_order_release);
	return true;
}

uint64_t traj_queue_dropped(const struct traj_queue *q)
{
	return atomic_load_explicit(&q->dropped, memory_order_relaxed);
}
