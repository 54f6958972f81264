/* SPDX-License-Identifier: MIT */
/*
 * The model pool: which whole models are in memory under the budget, which
 * are in use (a batch runs on them, or they are loaded for a queued group),
 * and the eviction that makes room (LRU, FIFO or CoServe's two stages).
 * Every call is made under the scheduler's lock.
 */
#ifndef MP_COE_POOL_H
#define MP_COE_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "coe/coe_priv.h"

struct coe_pool {
	struct mp_coe *c;
	struct mp_pager *p;
	enum mp_coe_evict policy;
	uint64_t budget;
	uint64_t used;			/* bytes of resident and loading models */
	uint64_t in_use_bytes;		/* of which in use (refs > 0): no victim among them */
	const uint32_t *wanted;		/* per model: requests waiting that run or may run
					 * it (the scheduler's), or NULL */
	uint32_t *refs;			/* per model: batches and held prefetches on it */
	bool *in_use;			/* refs > 0 */
	bool *resident;			/* per model */
	uint64_t *last_use;		/* LRU ticks */
	uint64_t *loaded_at;		/* FIFO ticks */
	bool *loaded_once;		/* per model: loaded since the counters were reset */
	uint64_t tick;
	uint32_t *list;			/* resident models, n_list of them */
	uint32_t n_list;
	/* counters */
	uint64_t loads, loads_file, loads_host, bytes_loaded, evictions, prefetched, distinct;
	uint64_t manage_ns;		/* in the pager: evicting, starting loads */
};

int coe_pool_init(struct coe_pool *pl, struct mp_coe *c, struct mp_pager *p,
		  enum mp_coe_evict policy, uint64_t budget);
void coe_pool_fini(struct coe_pool *pl);
/*
 * Takes a reference on model, loading it (evicting victims first) when it
 * is not resident: as demand (a batch waits for it: any model not in use
 * may go), or as a prefetch (only models no request wants that are less
 * used than it may go: a load ahead of need never costs a likelier one).
 * Returns 1 when it had to be loaded, 0 when it was resident, -ENOSPC when
 * no victim may go now: the caller waits and tries again, or gives up the
 * prefetch.
 */
int coe_pool_acquire(struct coe_pool *pl, uint32_t model, bool demand);
void coe_pool_release(struct coe_pool *pl, uint32_t model);
/* Loads the pinned models and holds them for good. Returns 0 or -ENOSPC (they do not fit). */
int coe_pool_pin(struct coe_pool *pl);
/* Loads models by usage, highest first, while they fit (the warm start). Returns how many. */
uint32_t coe_pool_warm(struct coe_pool *pl);

#endif /* MP_COE_POOL_H */
