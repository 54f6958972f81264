/* SPDX-License-Identifier: MIT */
/* The pager's state and the calls its files make on each other; never seen outside lib/pager/. */
#ifndef MP_PAGER_INTERNAL_H
#define MP_PAGER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <moepager/adapter.h>
#include <moepager/pager.h>
#include <moepager/store.h>

#include "base/hash.h"
#include "tier/io.h"
#include "evict/evict.h"
#include "pager/slot.h"
#include "tier/tier.h"
#include "uffd/region.h"

struct worker {
	struct mp_pager *p;
	pthread_t thread;
	struct mp_io *io;
	struct iovec *iov;
	struct mp_hash *hash;
	uint32_t id;
	bool started;
};

/* The fill jobs (queue.c): demand jobs (FIFO) always go before prefetch jobs (a max-heap). */
struct pager_queue {
	uint32_t demand_head;
	uint32_t demand_tail;
	uint32_t *heap;
	uint32_t heap_n;
	uint64_t seq;
	uint32_t jobs;			/* jobs being run by workers */
	uint32_t fills;			/* fills running */
	uint32_t prefetch_fills;	/* of which prefetches */
	uint32_t max_prefetch_fills;
};

/* Expert memory against the budget (budget.c, slots.c). */
struct pager_mem {
	uint64_t budget;
	uint64_t resident;		/* expert bytes in memory or reserved for a fill */
	uint64_t resident_peak;
	uint64_t dropping;		/* of it, bytes of experts being evicted now */
	uint64_t pending_drop;		/* of it, bytes of reads a deferred eviction drops */
	uint32_t resident_n;
	uint32_t mapped_n;
	uint64_t min_resident_ns;
	uint64_t spare_bytes;		/* spare chunk bytes kept for recycling */
	bool no_ahead;			/* no spares created ahead (one failed, or a test) */
};

/*
 * A file whose experts back rows (rows.c): an adapter's or another
 * variant's. Entry 0 stands for the pager's own store (p->tier); an entry
 * with no tier is free.
 */
struct row_src {
	struct mp_tier *tier;
	struct mp_store *store;		/* a variant, or NULL */
	struct mp_adapter *adapter;	/* an adapter, or NULL */
	uint32_t rows;			/* rows bound to it */
};

/* Where a slot's bytes come from: a source and that file's extent (set while the slot is UNUSED). */
struct row_origin {
	uint64_t offset;
	uint64_t checksum;
	uint32_t src;			/* index in p->srcs; 0: the pager's store */
	uint32_t expert;		/* the expert's id in its source, for messages */
};

struct mp_pager {
	/* Fixed at open. */
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
	uint32_t read_attempts;
	bool route_fill;
	bool caller_resolves;	/* engine requests are resolved on the asking thread */
	uint32_t nworkers;
	uint32_t io_depth;

	struct mp_region *region;
	struct mp_tier *tier;
	struct mp_tier *fault_tier;	/* in tier's chain: the fault rules, or NULL */
	struct mp_tier_file_config tier_cfg;	/* for the sources' tiers */
	struct worker *workers;
	struct worker caller;	/* what a thread resolving its own request reads with */

	/* Under lock. */
	pthread_mutex_t lock;
	pthread_cond_t work_cv;		/* workers: a job or close */
	pthread_cond_t state_cv;	/* a transition ended, budget freed, idle */
	struct slot *slots;
	struct row_origin *origin;	/* [nslots] */
	struct row_src srcs[MP_PAGER_MAX_SOURCES + 1];
	struct mp_evict evict;
	struct pager_queue q;
	struct pager_mem mem;
	struct mp_pager_stats st;	/* counters (resident figures are filled on read) */
	bool broken;			/* the handler died: nothing is served any more */
	bool caller_busy;		/* a thread reads with p->caller */
	/* Threads inside mp_pager_guard() on this pager, | GUARDS_CLOSING (guard.c). */
	atomic_uint guards;
	bool guards_out;		/* the last of them left after a close began waiting */
	pthread_cond_t guard_cv;

	atomic_bool closing;
	atomic_uint demand_reads;	/* demand fills reading now: prefetch reads yield */
	/* Test seam: called unlocked as a demand fill takes its chunks (NULL: none). */
	void (*taking)(struct mp_pager *p, void *arg);
	void *taking_arg;
	/* Test seam: called unlocked when a prefetch was refused its room (-EAGAIN). */
	void (*refused)(struct mp_pager *p, uint32_t slot, void *arg);
	void *refused_arg;
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

/* queue.c: the fill jobs (called locked). */
void mp_pager_enqueue(struct mp_pager *p, uint32_t slot, enum queue_class cls, int prio);
/* The next job: demand first, prefetches while a worker stays free for demand. -ENOENT: none. */
int mp_pager_dequeue(struct mp_pager *p, uint32_t *slot, enum queue_class *cls);
void mp_pager_unqueue(struct mp_pager *p, uint32_t slot);
/* No job queued or running. */
bool mp_pager_idle(const struct mp_pager *p);
/* Wakes mp_pager_wait_idle() when no job is queued or running. */
void mp_pager_after_idle(struct mp_pager *p);

/* slots.c: transitions (called locked; the slow ones drop the lock around the ioctl). */
uint32_t mp_pager_slot(const struct mp_pager *p, uint32_t layer, uint32_t expert);
/* Index of the log2 latency bucket for ns. */
uint32_t mp_pager_hist_bucket(uint64_t ns);
void mp_pager_release_waiters(struct mp_pager *p, struct slot *s, int err);
int mp_pager_poison_locked(struct mp_pager *p, uint32_t slot, int err);
/* Counts a fault episode once, by the tier that serves it (host or not), and fires fault_begin. */
void mp_pager_count_fault(struct mp_pager *p, struct slot *s, bool host);
/* A prefetched expert was used (routed to, or faulted on): its read may no longer yield. */
void mp_pager_note_use(struct mp_pager *p, struct slot *s);
/* Threads wait for an EMPTY slot: count the fault episode, queue its read ahead of prefetches. */
void mp_pager_demand_fill(struct mp_pager *p, uint32_t slot);
int mp_pager_map_locked(struct mp_pager *p, uint32_t slot);
void mp_pager_unreserve(struct mp_pager *p, uint32_t slot);
int mp_pager_evict_locked(struct mp_pager *p, uint32_t slot, bool keep_host);
/* MP_EVICT_DEFER: a read in flight is marked (returns 1) and evicted when it ends. */
int mp_pager_evict_deferred(struct mp_pager *p, uint32_t slot, bool keep_host);
/* Counts (or no longer) a marked FILLING slot's reserved bytes in mem.pending_drop. */
void mp_pager_count_pending(struct mp_pager *p, struct slot *s);
/*
 * The end of a successful fill: the eviction asked for during it (pending,
 * taken off the slot before its waiters were woken; counted: its bytes are
 * still in mem.pending_drop).
 */
void mp_pager_evict_pending(struct mp_pager *p, uint32_t slot, uint8_t pending, bool counted);
/* Spare chunks past budget + spare_bytes of memory held go back to the kernel. */
void mp_pager_trim_spares(struct mp_pager *p);
uint64_t mp_pager_mem_limit(const struct mp_pager *p);
/* Not locked: POISONED -> EMPTY, so the next access reads the expert again. */
int mp_pager_clear(struct mp_pager *p, uint32_t slot);

/* budget.c */
/* p->budget from the config, $MOEPAGER_BUDGET or the default; at least one expert. */
int mp_pager_resolve_budget(struct mp_pager *p, const struct mp_pager_config *cfg);
/* Waits on cv (under p->lock) for at most ns. */
void mp_pager_wait_ns(struct mp_pager *p, pthread_cond_t *cv, uint64_t ns);
int mp_pager_reserve(struct mp_pager *p, uint32_t slot);
void mp_pager_enforce_budget(struct mp_pager *p);

/* rows.c */
/* Fills the origins of the store's own rows. */
void mp_pager_rows_init(struct mp_pager *p);
/* Frees the sources' tiers (at close). */
void mp_pager_rows_fini(struct mp_pager *p);
/* The tier the slot's bytes come from (called locked, or while the slot is FILLING). */
struct mp_tier *mp_pager_row_tier(struct mp_pager *p, uint32_t slot);

/* callbacks.c */
extern const struct mp_region_ops mp_pager_region_ops;

/* fill.c */
int mp_pager_workers_start(struct mp_pager *p);
/* CPU time the fill threads have used so far (0 for a thread whose clock cannot be read). */
uint64_t mp_pager_fill_cpu_ns(struct mp_pager *p);
void mp_pager_workers_stop(struct mp_pager *p);
/*
 * EMPTY -> FILLING -> MAPPED (or POISONED, or EMPTY for an unwanted
 * prefetch): reads the slot's expert with w's ring. Called locked; drops
 * the lock for the read and the map.
 */
void mp_pager_fill(struct worker *w, uint32_t slot, enum queue_class cls);

/* serve.c */
/*
 * The engine asks for the expert in slot (its source's expert op): a
 * routed expert not yet in memory is read or mapped on this thread, or
 * waited for while a fill thread reads it. Returns true when the read it
 * did or waited for failed (the touch that follows gets the error, rather
 * than reading again). Not locked.
 */
bool mp_pager_serve(struct mp_pager *p, uint32_t slot);

/* guard.c */
int mp_guard_register(struct mp_pager *p, const void *start, uint64_t len);
void mp_guard_unregister(struct mp_pager *p);
/* Under p->lock, for close: waits until no thread is inside the guard on p. */
void mp_guard_wait_out(struct mp_pager *p);
/*
 * For the guard: names what made the access at addr fail and starts the
 * retry (clears the poison). Called with the registry locked, the pager
 * alive. Returns the cause; *clear gets the slot to clear, or SLOT_NONE.
 */
int mp_pager_fault_cause(struct mp_pager *p, const void *addr, uint32_t *clear);

#define plog_debug(p, fmt, ...) mp_debug("pager %s: " fmt, (p)->name, ##__VA_ARGS__)
#define plog_info(p, fmt, ...) mp_info("pager %s: " fmt, (p)->name, ##__VA_ARGS__)
#define plog_warn(p, fmt, ...) mp_warn("pager %s: " fmt, (p)->name, ##__VA_ARGS__)
#define plog_err(p, err, fmt, ...) mp_err(err, "pager %s: " fmt, (p)->name, ##__VA_ARGS__)

#endif /* MP_PAGER_INTERNAL_H */
