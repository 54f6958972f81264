// SPDX-License-Identifier: MIT
/*
 * LFU eviction: the resident expert used least often goes first (counts
 * survive eviction, as MoE-Infinity's); ties go to the least recently used.
 */
#include <errno.h>
#include <stdlib.h>

#include "policy.h"

struct lfu {
	struct mp_keylist recent;	/* resident keys, most recent at the head */
	uint64_t *freq;
};

static int lfu_init(struct mp_policy *pol)
{
	struct lfu *f = calloc(1, sizeof(*f));

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

static void lfu_insert(struct mp_policy *pol, uint32_t key)
{
	struct lfu *f = pol->priv;

	mp_keylist_push_head(&f->recent, key);
}

static void lfu_access(struct mp_policy *pol, uint32_t key)
{
	struct lfu *f = pol->priv;

	f->freq[key]++;
	if (f->recent.on[key])
		mp_keylist_push_head(&f->recent, key);
}

static void lfu_remove(struct mp_policy *pol, uint32_t key)
{
	struct lfu *f = pol->priv;

	mp_keylist_remove(&f->recent, key);
}

static int64_t lfu_victim(struct mp_policy *pol, mp_policy_evictable_fn evictable, void *arg)
{
	struct lfu *f = pol->priv;
	int64_t best = -ENOENT;

	/* From the tail, so among equal counts the least recent wins. */
	for (uint32_t k = f->recent.tail; k != MP_KEYLIST_NONE; k = f->recent.prev[k])
		if ((best < 0 || f->freq[k] < f->freq[best]) && evictable(arg, k))
			best = k;
	return best;
}

static void lfu_fini(struct mp_policy *pol)
{
	struct lfu *f = pol->priv;

	if (!f)
		return;
	mp_keylist_fini(&f->recent);
	free(f->freq);
	free(f);
	pol->priv = NULL;
}

const struct mp_policy_ops mp_policy_lfu = {
	.name = "lfu",
	.description = "least frequently used (counts kept across evictions), then least recent",
	.init = lfu_init,
	.on_insert = lfu_insert,
	.on_access = lfu_access,
	.on_fault = lfu_access,
	.on_remove = lfu_remove,
	.pick_victim = lfu_victim,
	.fini = lfu_fini,
};
