/* SPDX-License-Identifier: MIT */
/* The pager's state, shared by pager.c (API), residency.c (states, budget), fill.c (workers). */
#ifndef MP_PAGER_INTERNAL_H
#define MP_PAGER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <moepager/pager.h>
#include <moepager/store.h>

#include "tier/io.h"
#include "evict/evict.h"
#include "uffd/region.h"
#include "tier/tier.h"

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

struct slot {
	uint8_t state;		/* enum slot_state */
	uint8_t queued;		/* enum queue_class */
	uint8_t busy_op;	/* enum busy_op, while BUSY */
	bool refault;		/* faulted while BUSY/CLEARING: serve when that ends */
	bool lost;		/* pages zapped behind our back: discard and refill */
	bool gone;		/* the application unmapped this part of the range */
	bool prefetched;	/* filled by a prefetch and not used yet */
	atomic_bool wanted;	/* FILLING for a thread or a route: the read may not yield */
	bool demanded;		/* threads faulted on it: min_resident applies */
	bool counted;		/* this fault episode was counted (file or host) */
	bool tail_poisoned;	/* the padding after the data carries poison markers */
	bool markers_pending;	/* POISONED, but the markers are not in yet (ioctl refused) */
	uint8_t fault_tier;	/* tier of the episode's fault_begin probe */
	uint32_t layer;
	uint32_t expert;
	int err;		/* why it is poisoned */
	uint32_t waiters;	/* blocked threads (fault messages) not yet released */
	uint64_t wait_sum_ns;	/* sum of their fault times */
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

struct worker {
	struct mp_pager *p;
	pthread_t thread;
	struct mp_io *io;
	struct iovec *iov;
	void *hash;		/* XXH3_state_t */
	uint32_t id;
	bool started;
};

struct mp_pager {
	char name[64];
	struct mp_store *store;
	struct mp_geometry geo;
	uint32_t layers;
	uint32_t experts;
	uint32_t slots_per_layer;
	uint32_t nslots;
	uint64_t expert_bytes;	/* data bytes of an expert */
	uint64_t data_bytes;	/* page-rounded */
	uint64_t slot_bytes;	/* 2 MiB-rounded: the range stride */

	struct mp_region *region;
	struct mp_tier *tier;
	struct mp_evict evict;
	struct slot *slots;

	pthread_mutex_t lock;
	pthread_cond_t work_cv;		/* workers: a job or close */
	pthread_cond_t state_cv;	/* a transition ended, budget freed, idle */
	/* Demand jobs (FIFO) always go before prefetch jobs (a max-heap on priority). */
	uint32_t demand_head;
	uint32_t demand_tail;
	uint32_t *heap;
	uint32_t heap_n;
	uint64_t seq;
	uint32_t jobs;			/* jobs being run by workers */
	uint32_t fills;			/* fills running */
	uint32_t prefetch_fills;	/* of which prefetches */
	uint32_t max_prefetch_fills;

	uint64_t budget;
	uint64_t resident;		/* expert bytes in memory or reserved for a fill */
	uint64_t resident_peak;
	uint32_t resident_n;
	uint32_t mapped_n;
	uint64_t min_resident_ns;
	uint64_t spare_bytes;
	uint32_t read_attempts;
	bool route_fill;
	bool broken;			/* the handler died: nothing is served any more */
	atomic_bool closing;
	atomic_uint demand_reads;	/* demand fills reading now: prefetch reads yield */
	struct mp_pager_stats st;	/* counters (resident figures are filled on read) */

	uint32_t nworkers;
	struct worker *workers;
	uint32_t io_depth;

	int guards;			/* threads inside mp_pager_guard() on this pager */
	pthread_cond_t guard_cv;
};

/*
 * Hooks for tests and the fault-injection layer: wrap_tier gets the file
 * tier and returns the tier the pager reads through (a wrapper that owns
 * lower), or an error that fails the open.
 */
struct mp_pager_hooks {
	int (*wrap_tier)(void *arg, struct mp_tier *lower, struct mp_tier **out);
	void *arg;
};

/* mp_pager_open() with hooks (may be NULL). */
int mp_pager_open_hooked(struct mp_store *store, const struct mp_pager_config *cfg,
			 const struct mp_pager_hooks *hooks, struct mp_pager **out);

/* residency.c */
extern const struct mp_region_ops mp_pager_region_ops;
uint32_t mp_pager_slot(const struct mp_pager *p, uint32_t layer, uint32_t expert);
void mp_pager_enqueue(struct mp_pager *p, uint32_t slot, enum queue_class cls, int prio);
int mp_pager_dequeue(struct mp_pager *p, uint32_t *slot, enum queue_class *cls);
void mp_pager_unqueue(struct mp_pager *p, uint32_t slot);
int mp_pager_reserve(struct mp_pager *p, uint32_t slot);
void mp_pager_unreserve(struct mp_pager *p, uint32_t slot);
int mp_pager_evict_locked(struct mp_pager *p, uint32_t slot, bool keep_host);
void mp_pager_enforce_budget(struct mp_pager *p);
void mp_pager_release_waiters(struct mp_pager *p, struct slot *s, int err);
int mp_pager_poison_locked(struct mp_pager *p, uint32_t slot, int err);
int mp_pager_clear(struct mp_pager *p, uint32_t slot);
int mp_pager_map_locked(struct mp_pager *p, uint32_t slot);
void mp_pager_after_idle(struct mp_pager *p);

/* fill.c */
int mp_pager_workers_start(struct mp_pager *p);
void mp_pager_workers_stop(struct mp_pager *p);

/* guard.c */
int mp_guard_register(struct mp_pager *p, const void *start, uint64_t len);
void mp_guard_unregister(struct mp_pager *p);
/*
 * For the guard: names what made the access at addr fail and starts the
 * retry (clears the poison). Called with the registry locked, the pager
 * alive. Returns the cause; *clear gets the slot to clear, or SLOT_NONE.
 */
int mp_pager_fault_cause(struct mp_pager *p, const void *addr, uint32_t *clear);

/* Index of the log2 latency bucket for ns. */
uint32_t mp_pager_hist_bucket(uint64_t ns);

#define plog_debug(p, fmt, ...) mp_debug("pager %s: " fmt, (p)->name, ##__VA_ARGS__)
#define plog_info(p, fmt, ...) mp_info("pager %s: " fmt, (p)->name, ##__VA_ARGS__)
#define plog_warn(p, fmt, ...) mp_warn("pager %s: " fmt, (p)->name, ##__VA_ARGS__)
#define plog_err(p, err, fmt, ...) mp_err(err, "pager %s: " fmt, (p)->name, ##__VA_ARGS__)

#endif /* MP_PAGER_INTERNAL_H */
