// SPDX-License-Identifier: MIT
/*
 * FineMoE eviction: the highest PRI = 1 / (p · freq) goes first, i.e. the
 * lowest p · freq, where p is the expert's probability in the map the
 * prefetcher searched last for its layer (hints->p) and freq its use count.
 * No recency term; equal scores go to the least recently used.
 */
#include <errno.h>
#include <stdlib.h>

#include "policy.h"

struct finemoe_evict {
	struct mp_keylist recent;
	uint64_t *freq;
};

static int fm_init(struct mp_policy *pol)
{
	struct finemoe_evict *f = calloc(1, sizeof(*f));

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

static void fm_insert(struct mp_policy *pol, uint32_t key)
{
	struct finemoe_evict *f = pol->priv;

	mp_keylist_push_head(&f->recent, key);
}

static void fm_access(struct mp_policy *pol, uint32_t key)
{
	struct finemoe_evict *f = pol->priv;

	f->freq[key]++;
	if (f->recent.on[key])
		mp_keylist_push_head(&f->recent, key);
}

static void fm_remove(struct mp_policy *pol, uint32_t key)
{
	struct finemoe_evict *f = pol->priv;

	mp_keylist_remove(&f->recent, key);
}

/* p · freq; no hint for the key's layer yet: the uniform prior 1/E. */
static double fm_score(const struct mp_policy *pol, const struct finemoe_evict *f, uint32_t key)
{
	const struct mp_policy_hints *h = pol->env.hints;
	double p = 1.0 / pol->env.experts;
	float hp;

	if (h && h->p) {
		__atomic_load(&h->p[key], &hp, __ATOMIC_RELAXED);
		if (hp >= 0)
			p = hp;
	}

	return p * (double)f->freq[key];
}

static int64_t fm_victim(struct mp_policy *pol, mp_policy_evictable_fn evictable, void *arg)
{
	struct finemoe_evict *f = pol->priv;
	int64_t best = -ENOENT;
	double best_s = 0;

	for (uint32_t k = f->recent.tail; k != MP_KEYLIST_NONE; k = f->recent.prev[k]) {
		double s = fm_score(pol, f, k);

		if ((best < 0 || s < best_s) && evictable(arg, k)) {
			best = k;
			best_s = s;
		}
	}
	return best;
}

static void fm_fini(struct mp_policy *pol)
{
	struct finemoe_evict *f = pol->priv;

	if (!f)
		return;
	mp_keylist_fini(&f->recent);
	free(f->freq);
	free(f);
	pol->priv = NULL;
}

const struct mp_policy_ops mp_policy_finemoe = {
	.name = "finemoe",
	.description = "evict the highest 1/(p*freq): p from the prefetcher's searched map, "
		       "freq uses",
	.init = fm_init,
	.on_insert = fm_insert,
	.on_access = fm_access,
	.on_fault = fm_access,
	.on_remove = fm_remove,
	.pick_victim = fm_victim,
	.fini = fm_fini,
};
