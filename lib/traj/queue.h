/* SPDX-License-Identifier: MIT */
/* The in-process trajectory recorder: a bounded lock-free queue of records that never blocks. */
#ifndef MP_TRAJ_QUEUE_H
#define MP_TRAJ_QUEUE_H

#include <stdbool.h>
#include <stdint.h>

#include <moepager/traj.h>

struct traj_queue;

/* capacity: a power of two >= 2. Returns 0, -EINVAL or -ENOMEM. */
int traj_queue_create(uint32_t capacity, struct traj_queue **out);
void traj_queue_destroy(struct traj_queue *q);

/* Any thread. Returns 0, or -ENOSPC when full (the record is dropped and counted). */
int traj_queue_push(struct traj_queue *q, const struct mp_traj_rec *r);
/* Any thread. Copies the oldest record to *out; false when empty. */
bool traj_queue_pop(struct traj_queue *q, struct mp_traj_rec *out);
uint64_t traj_queue_dropped(const struct traj_queue *q);

#endif /* MP_TRAJ_QUEUE_H */
