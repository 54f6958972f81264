// SPDX-License-Identifier: MIT
/*
 * CoServe's two-stage dependency-aware eviction, mapped to MoE layers: the
 * "preliminary" experts are those the current token just ran in layer l,
 * their "successors" the experts of layer l + 1. Stage 1 evicts successors
 * that cannot run next (no recorded transition from any expert just run);
 * stage 2 evicts the lowest usage probability (the conditional transition
 * probability for layer l + 1, the layer's recorded frequency elsewhere).
 * Experts all have one size, so CoServe's "largest footprint first" is moot;
 * ties go to the least recently used. The choice is mp_two_stage (evict.h),
 * which the CoE layer's whole-model pool shares. docs/prefetch.md, "coserve".
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "evict/evict.h"

struct coserve {
	struct mp_keylist recent;
	uint32_t L, J, spl;
	uint64_t *trans;	/* [L - 1][J][J] */
	uint64_t *freq;		/* [L][J] */
	uint64_t *layer_total;	/* [L] */
	uint32_t cur_layer;	/* layer of the last routing report, UINT32_MAX: none */
	uint32_t cur_request, cur_token;
	uint32_t cur_k;
	uint32_t cur[MP_MAX_TOPK];
	double *succ_p;		/* [J]: P(successor | experts just run), per report */
	bool succ_known;	/* the current set has recorded transitions */
};

static void cs_fini(struct mp_evict *pol);

static int cs_init(struct mp_evict *pol)
{
	struct coserve *c = calloc(1, sizeof(*c));
	uint32_t L = pol->env.layers, J = pol->env.experts;

	if (!c)
		return -ENOMEM;
	pol->priv = c;
	c->L = L;
	c->J = J;
	c->spl = pol->env.slots_per_layer ? pol->env.slots_per_layer : J;
	c->cur_layer = UINT32_MAX;
	c->trans = calloc((size_t)(L > 1 ? L - 1 : 1) * J * J, sizeof(uint64_t));
	c->freq = calloc((size_t)L * J, sizeof(uint64_t));
	c->layer_total = calloc(L, sizeof(uint64_t));
	c->succ_p = calloc(J, sizeof(double));
	if (!c->trans || !c->freq || !c->layer_total || !c->succ_p ||
	    mp_keylist_init(&c->recent, pol->env.nkeys)) {
		cs_fini(pol);
		return -ENOMEM;
	}
	return 0;
}

static void cs_route(struct mp_evict *pol, const struct mp_evict_route *r)
{
	struct coserve *c = pol->priv;
	uint32_t l = r->layer, k = MP_MIN(r->k, MP_MAX_TOPK);
	bool chained = c->cur_layer != UINT32_MAX && l == c->cur_layer + 1 &&
		       r->request == c->cur_request && r->token == c->cur_token;

	if (l >= c->L)
		return;
	for (uint32_t i = 0; i < k; i++) {
		uint32_t e = r->keys[i] % c->spl;

		if (e >= c->J)
			continue;
		c->freq[(size_t)l * c->J + e]++;
		c->layer_total[l]++;
		for (uint32_t a = 0; chained && a < c->cur_k; a++)
			c->trans[((size_t)(l - 1) * c->J + c->cur[a]) * c->J + e]++;
	}
	c->cur_layer = l;
	c->cur_request = r->request;
	c->cur_token = r->token;
	c->cur_k = 0;
	for (uint32_t i = 0; i < k; i++)
		if (r->keys[i] % c->spl < c->J)
			c->cur[c->cur_k++] = r->keys[i] % c->spl;
	/* The successors' conditional probabilities, averaged over the experts just run. */
	memset(c->succ_p, 0, c->J * sizeof(double));
	c->succ_known = false;
	if (l + 1 >= c->L)
		return;
	for (uint32_t a = 0; a < c->cur_k; a++) {
		const uint64_t *row = c->trans + ((size_t)l * c->J + c->cur[a]) * c->J;
		uint64_t sum = 0;

		for (uint32_t b = 0; b < c->J; b++)
			sum += row[b];
		for (uint32_t b = 0; sum && b < c->J; b++)
			c->succ_p[b] += (double)row[b] / sum / c->cur_k;
		c->succ_known |= sum > 0;
	}
}

/* Usage probability of a resident key, and whether it is an unrunnable successor. */
static double cs_usage(const struct coserve *c, uint32_t key, bool *unrunnable)
{
	uint32_t l = key / c->spl, e = key % c->spl;

	*unrunnable = false;
	if (l >= c->L || e >= c->J)
		return 0;
	if (c->cur_layer != UINT32_MAX && l == c->cur_layer + 1 && c->succ_known) {
		*unrunnable = c->succ_p[e] <= 0;
		return c->succ_p[e];
	}
	return c->layer_total[l] ? (double)c->freq[(size_t)l * c->J + e] / c->layer_total[l] : 0;
}

static int64_t cs_victim(struct mp_evict *pol, mp_evict_ok_fn evictable, void *arg)
{
	struct coserve *c = pol->priv;
	struct mp_two_stage t;

	/* From the least recently used end: ties go to the oldest. */
	mp_two_stage_init(&t);
	for (uint32_t k = c->recent.tail; k != MP_KEYLIST_NONE; k = c->recent.prev[k]) {
		bool unrunnable;
		double u = cs_usage(c, k, &unrunnable);

		if (evictable(arg, k))
			mp_two_stage_offer(&t, k, 1, u, unrunnable);
	}
	return mp_two_stage_victim(&t);
}

static void cs_insert(struct mp_evict *pol, uint32_t key)
{
	struct coserve *c = pol->priv;

	mp_keylist_push_head(&c->recent, key);
}

static void cs_access(struct mp_evict *pol, uint32_t key)
{
	struct coserve *c = pol->priv;

	if (c->recent.on[key])
		mp_keylist_push_head(&c->recent, key);
}

static void cs_remove(struct mp_evict *pol, uint32_t key)
{
	struct coserve *c = pol->priv;

	mp_keylist_remove(&c->recent, key);
}

static void cs_fini(struct mp_evict *pol)
{
	struct coserve *c = pol->priv;

	if (!c)
		return;
	mp_keylist_fini(&c->recent);
	free(c->trans);
	free(c->freq);
	free(c->layer_total);
	free(c->succ_p);
	free(c);
	pol->priv = NULL;
}

const struct mp_evict_ops mp_evict_coserve = {
	.name = "coserve",
	.description = "two-stage: next-layer experts that cannot follow the ones just run, then "
		       "lowest usage probability (CoServe, mapped to layers)",
	.init = cs_init,
	.on_insert = cs_insert,
	.on_access = cs_access,
	.on_fault = cs_access,
	.on_remove = cs_remove,
	.on_route = cs_route,
	.pick_victim = cs_victim,
	.fini = cs_fini,
};
