// SPDX-License-Identifier: MIT
/*
 * Frequency-aware eviction that protects predicted experts: the resident
 * expert with the fewest expected uses in its layer's next two passes goes
 * first.
 *
 * Each expert has a rate q, an exponential moving average over its layer's
 * passes of "routed in this pass" (the layer's routing frequency, recent
 * passes weighing more), and, when the prefetcher has predicted the layer's
 * next pass, a probability p of being used there (hints->p). Used at the
 * next pass with probability p and at the one after with q, it is worth
 * p + q; without a prediction p = q. The hint stays until the prefetcher
 * replaces it: after the layer's pass it still marks the experts the
 * prefetcher thought likely, which measured better on the trained model's
 * traces than falling back to q at once (docs/prefetch.md, "Eviction
 * policies"). Ties go to the least recently used.
 */
#include <errno.h>
#include <stdlib.h>

#include "evict/evict.h"

/* Weight of one pass in the rate: about the last 1/EMA_ALPHA passes count. */
#define EMA_ALPHA (1.0f / 32)

struct ema {
	struct mp_keylist recent;	/* resident keys, most recent at the head */
	float *q;			/* [nkeys]: routing rate per pass of the key's layer */
	uint8_t *hot;			/* [slots_per_layer] scratch: routed in this pass */
};

static int ema_init(struct mp_evict *pol)
{
	const struct mp_evict_env *e = &pol->env;
	struct ema *m = calloc(1, sizeof(*m));
	/* Before any pass every expert of a layer is as likely as the others: k/J, with k unknown, 1/J. */
	float prior = e->experts ? 1.0f / (float)e->experts : 0.0f;

	if (!m)
		return -ENOMEM;
	m->q = malloc(e->nkeys * sizeof(*m->q));
	m->hot = calloc(e->slots_per_layer ? e->slots_per_layer : 1, 1);
	if (!m->q || !m->hot || mp_keylist_init(&m->recent, e->nkeys)) {
		free(m->q);
		free(m->hot);
		free(m);
		return -ENOMEM;
	}
	for (uint32_t k = 0; k < e->nkeys; k++)
		m->q[k] = prior;
	pol->priv = m;
	return 0;
}

static void ema_insert(struct mp_evict *pol, uint32_t key)
{
	struct ema *m = pol->priv;

	mp_keylist_push_head(&m->recent, key);
}

static void ema_access(struct mp_evict *pol, uint32_t key)
{
	struct ema *m = pol->priv;

	if (m->recent.on[key])
		mp_keylist_push_head(&m->recent, key);
}

static void ema_remove(struct mp_evict *pol, uint32_t key)
{
	struct ema *m = pol->priv;

	mp_keylist_remove(&m->recent, key);
}

/* One pass of r->layer: every expert of the layer moves toward 1 (routed) or 0. */
static void ema_route(struct mp_evict *pol, const struct mp_evict_route *r)
{
	struct ema *m = pol->priv;
	const struct mp_evict_env *e = &pol->env;
	uint32_t base;

	if (r->layer >= e->layers || !e->slots_per_layer)
		return;
	base = r->layer * e->slots_per_layer;
	for (uint32_t i = 0; i < r->k; i++)
		if (r->keys[i] >= base && r->keys[i] - base < e->slots_per_layer)
			m->hot[r->keys[i] - base] = 1;
	for (uint32_t j = 0; j < e->slots_per_layer && base + j < e->nkeys; j++) {
		float *q = &m->q[base + j];

		*q += EMA_ALPHA * ((m->hot[j] ? 1.0f : 0.0f) - *q);
		m->hot[j] = 0;
	}
}

/*
 * Expected uses in the layer's next two passes, p at the next and q at the
 * one after, times what a miss in the layer costs (hints->miss_w).
 */
static double ema_keep(const struct mp_evict *pol, uint32_t key)
{
	const struct ema *m = pol->priv;
	const struct mp_evict_hints *h = pol->env.hints;
	double q = m->q[key], p = q;
	float hp;

	if (h && h->p) {
		__atomic_load(&h->p[key], &hp, __ATOMIC_RELAXED);
		if (hp >= 0)
			p = hp > 1 ? 1 : hp;
	}
	return (p + q) * mp_evict_miss_w(pol, key);
}

static int64_t ema_victim(struct mp_evict *pol, mp_evict_ok_fn evictable, void *arg)
{
	struct ema *m = pol->priv;

	return mp_keylist_min_victim(&m->recent, ema_keep, pol, evictable, arg);
}

static void ema_fini(struct mp_evict *pol)
{
	struct ema *m = pol->priv;

	if (!m)
		return;
	mp_keylist_fini(&m->recent);
	free(m->q);
	free(m->hot);
	free(m);
	pol->priv = NULL;
}

const struct mp_evict_ops mp_evict_ema = {
	.name = "ema",
	.description = "fewest expected uses p + q: q an EMA of the layer's routing, p the "
		       "prefetcher's prediction for the layer's next pass (else q)",
	.init = ema_init,
	.on_insert = ema_insert,
	.on_access = ema_access,
	.on_fault = ema_access,
	.on_remove = ema_remove,
	.on_route = ema_route,
	.pick_victim = ema_victim,
	.fini = ema_fini,
};
