/* SPDX-License-Identifier: MIT */
/* One expert's slot in the pager: its state machine and its place in the job queues. */
#ifndef MP_PAGER_SLOT_H
#define MP_PAGER_SLOT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/*
 * Slot states. Every transition happens under p->lock; the slow part of a
 * transition (a MOVE, a read) runs unlocked while the slot sits in
 * FILLING or BUSY, which no other actor may change: a fault on such a
 * slot only records its waiters (and `refault`), and the owner of the
 * transition serves them when it ends. This is what makes evicting an
 * expert that a thread is reading safe: the thread faults, waits for the
 * eviction to finish, then for the refill, and reads the right bytes.
 */
enum slot_state {
	ST_UNUSED = 0,		/* no expert (a spare slot for adapters) */
	ST_EMPTY,		/* not in memory */
	ST_FILLING,		/* a worker reads it from a tier */
	ST_MAPPED,		/* in the range */
	ST_HOST,		/* in host memory, unmapped */
	ST_BUSY,		/* being mapped, unmapped or discarded */
	ST_POISONED,		/* reads failed: poison markers in the range */
	ST_CLEARING,		/* poison markers being zapped */
};

enum queue_class { Q_NONE = 0, Q_DEMAND, Q_PREFETCH };

/* Where a BUSY slot is headed. */
enum busy_op { BUSY_MAP = 0, BUSY_UNMAP, BUSY_DROP };

/* An eviction asked for during a read (MP_EVICT_DEFER): done when the read ends. */
enum pending_evict { PENDING_NONE = 0, PENDING_UNMAP, PENDING_DROP };

struct slot {
	uint8_t state;		/* enum slot_state */
	uint8_t queued;		/* enum queue_class */
	uint8_t busy_op;	/* enum busy_op, while BUSY */
	uint8_t evict_pending;	/* enum pending_evict: asked for while FILLING */
	bool fill_reserved;	/* FILLING, and its fill's bytes are counted in mem.resident */
	bool drop_counted;	/* those bytes are in mem.pending_drop (PENDING_DROP) */
	bool refault;		/* faulted while BUSY/CLEARING: serve when that ends */
	bool lost;		/* pages zapped behind our back: discard and refill */
	bool gone;		/* the application unmapped this part of the range */
	bool prefetched;	/* filled by a prefetch and not used yet */
	bool evicted;		/* dropped from memory before (a later miss is a refault) */
	atomic_bool wanted;	/* FILLING for a thread or a route: the read may not yield */
	bool demanded;		/* threads faulted on it: min_resident applies */
	bool counted;		/* this fault episode was counted (file or host) */
	bool tail_poisoned;	/* the padding after the data carries poison markers */
	bool markers_pending;	/* POISONED, but the markers are not in yet (ioctl refused) */
	bool poisoning;		/* POISONED, its markers going in now (the lock is dropped) */
	uint8_t fault_tier;	/* tier of the episode's fault_begin probe */
	uint8_t remaps;		/* reads again since a fill's map lost the pages */
	uint32_t layer;
	uint32_t expert;
	int err;		/* why it is poisoned */
	uint32_t waiters;	/* blocked threads (fault messages) not yet released */
	uint64_t wait_sum_ns;	/* sum of their fault times */
	uint32_t caller_waiters;	/* of them, engine requests resolved on their thread */
	uint64_t caller_wait_sum_ns;
	uint64_t fault_begin;	/* first fault of the current episode, 0: none */
	uint64_t fault_addr;
	uint64_t mapped_at;
	uint64_t prefetch_at;
	uint64_t evict_retry_at; /* an unmap failed (pinned pages): skip until then */
	int prio;		/* prefetch priority */
	uint64_t seq;		/* queue order */
	uint32_t heap_idx;	/* place in the prefetch heap */
	uint32_t next;		/* demand FIFO link */
};

#define SLOT_NONE UINT32_MAX

#endif /* MP_PAGER_SLOT_H */
