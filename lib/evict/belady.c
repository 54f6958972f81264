// SPDX-License-Identifier: MIT
/*
 * Belady's MIN: the resident expert whose next use is farthest (or never)
 * goes first. The future comes from the replayed trace through
 * hints->next_use: the on-demand optimum, for comparison only.
 */
#include <errno.h>
#include <stdlib.h>

#include "base/base.h"
#include "evict/evict.h"

static int belady_init(struct mp_evict *pol)
{
	/* A prefetcher over a trace replay attaches the hints after the pager opened. */
	if (!pol->env.hints || !pol->env.hints->next_use)
		mp_info("eviction belady: no future known yet: least recently used until a trace "
			"replay's prefetcher gives next-use hints");
	return mp_evict_lru_init(pol);
}

static int64_t belady_victim(struct mp_evict *pol, mp_evict_ok_fn evictable, void *arg)
{
	const struct mp_evict_hints *h = pol->env.hints;
	struct mp_keylist *l = pol->priv;
	const uint64_t *next;
	int64_t best = -ENOENT;

	if (!h || !h->next_use)
		return mp_keylist_victim(l, evictable, arg);
	next = h->next_use;
	for (uint32_t k = l->tail; k != MP_KEYLIST_NONE; k = l->prev[k])
		if ((best < 0 || __atomic_load_n(&next[k], __ATOMIC_RELAXED) >
				 __atomic_load_n(&next[best], __ATOMIC_RELAXED)) &&
		    evictable(arg, k))
			best = k;
	return best;
}

const struct mp_evict_ops mp_evict_belady = {
	.name = "belady",
	.description = "evict the expert used farthest in the future (trace replay only: the "
		       "on-demand optimum)",
	.init = belady_init,
	.on_insert = mp_evict_lru_insert,
	.on_access = mp_evict_lru_access,
	.on_fault = mp_evict_lru_access,
	.on_remove = mp_evict_lru_remove,
	.pick_victim = belady_victim,
	.fini = mp_evict_lru_fini,
};
