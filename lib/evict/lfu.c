// SPDX-License-Identifier: MIT
/*
 * LFU eviction: the resident expert used least often goes first (counts
 * survive eviction, as MoE-Infinity's); ties go to the least recently used.
 */
#include <errno.h>
#include <stdlib.h>

#include "evict/evict.h"

int mp_evict_lfu_init(struct mp_evict *pol)
{
	struct mp_lfu_state *f = calloc(1, sizeof(*f));

	if (!f)
		return -ENOMEM;
	f->freq = calloc(pol->env.nkeys, sizeof(*f->freq));
	if (!f->freq || mp_keylist_init(&f->recent, pol->env.nkeys)) {
		free(f->freq);
		free(f);
		return -ENOMEM;
	}
	pol->priv = f;
	return 0;
}

void mp_evict_lfu_insert(struct mp_evict *pol, uint32_t key)
{
	struct mp_lfu_state *f = pol->priv;

	mp_keylist_push_head(&f->recent, key);
}

void mp_evict_lfu_access(struct mp_evict *pol, uint32_t key)
{
	struct mp_lfu_state *f = pol->priv;

	f->freq[key]++;
	if (f->recent.on[key])
		mp_keylist_push_head(&f->recent, key);
}

void mp_evict_lfu_remove(struct mp_evict *pol, uint32_t key)
{
	struct mp_lfu_state *f = pol->priv;

	mp_keylist_remove(&f->recent, key);
}

static int64_t lfu_victim(struct mp_evict *pol, mp_evict_ok_fn evictable, void *arg)
{
	struct mp_lfu_state *f = pol->priv;
	int64_t best = -ENOENT;

	/* From the tail, so among equal counts the least recent wins. */
	for (uint32_t k = f->recent.tail; k != MP_KEYLIST_NONE; k = f->recent.prev[k])
		if ((best < 0 || f->freq[k] < f->freq[best]) && evictable(arg, k))
			best = k;
	return best;
}

void mp_evict_lfu_fini(struct mp_evict *pol)
{
	struct mp_lfu_state *f = pol->priv;

	if (!f)
		return;
	mp_keylist_fini(&f->recent);
	free(f->freq);
	free(f);
	pol->priv = NULL;
}

const struct mp_evict_ops mp_evict_lfu = {
	.name = "lfu",
	.description = "least frequently used (counts kept across evictions), then least recent",
	.init = mp_evict_lfu_init,
	.on_insert = mp_evict_lfu_insert,
	.on_access = mp_evict_lfu_access,
	.on_fault = mp_evict_lfu_access,
	.on_remove = mp_evict_lfu_remove,
	.pick_victim = lfu_victim,
	.fini = mp_evict_lfu_fini,
};
