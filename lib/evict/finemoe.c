// SPDX-License-Identifier: MIT
/*
 * FineMoE eviction: the highest PRI = 1 / (p · freq) goes first, i.e. the
 * lowest p · freq, where p is the expert's probability in the map the
 * prefetcher searched last for its layer (hints->p) and freq its use count.
 * No recency term; equal scores go to the least recently used.
 */
#include <errno.h>
#include <stdlib.h>

#include "evict/evict.h"

/*
 * p · freq, times what a miss in the key's layer costs (hints->miss_w); no
 * hint for the key's layer yet: p the uniform prior 1/E.
 */
static double fm_score(const struct mp_evict *pol, uint32_t key)
{
	const struct mp_lfu_state *f = pol->priv;
	const struct mp_evict_hints *h = pol->env.hints;
	double p = 1.0 / pol->env.experts;
	float hp;

	if (h && h->p) {
		__atomic_load(&h->p[key], &hp, __ATOMIC_RELAXED);
		if (hp >= 0)
			p = hp;
	}

	return p * (double)f->freq[key] * mp_evict_miss_w(pol, key);
}

static int64_t fm_victim(struct mp_evict *pol, mp_evict_ok_fn evictable, void *arg)
{
	struct mp_lfu_state *f = pol->priv;

	return mp_keylist_min_victim(&f->recent, fm_score, pol, evictable, arg);
}

const struct mp_evict_ops mp_evict_finemoe = {
	.name = "finemoe",
	.description = "evict the highest 1/(p*freq): p from the prefetcher's searched map, "
		       "freq uses",
	/* LFU's bookkeeping (freq, recency for ties); only the victim differs. */
	.init = mp_evict_lfu_init,
	.on_insert = mp_evict_lfu_insert,
	.on_access = mp_evict_lfu_access,
	.on_fault = mp_evict_lfu_access,
	.on_remove = mp_evict_lfu_remove,
	.pick_victim = fm_victim,
	.fini = mp_evict_lfu_fini,
};
