// SPDX-License-Identifier: MIT
/*
 * CoServe's two-stage eviction over whole models (the choice is evict.h's
 * mp_two_stage), and what requests want, which it spares.
 */
#include <errno.h>

#include "base/base.h"
#include "coe/coe_priv.h"
#include "evict/evict.h"

/* A subsequent model none of whose preliminaries is resident cannot run before they load. */
static bool unrunnable(const struct mp_coe *c, uint32_t m, const bool *resident_mask)
{
	const struct coe_model *x = &c->models[m];

	if (!x->n_pre)
		return false;
	for (uint32_t i = 0; i < x->n_pre; i++)
		if (resident_mask[x->pre[i]])
			return false;
	return true;
}

int coe_evict_pick(const struct mp_coe *c, const uint32_t *resident, const bool *in_use,
		   uint32_t n, const bool *resident_mask, const uint32_t *wanted)
{
	struct mp_two_stage idle, waited;

	mp_two_stage_init(&idle);
	mp_two_stage_init(&waited);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t m = resident[i];

		if (in_use[m])
			continue;
		/* Wanted: evicting it now costs a load the queue was promised it would not pay. */
		mp_two_stage_offer(wanted && wanted[m] ? &waited : &idle, m, coe_model_bytes(c, m),
				   c->models[m].usage, unrunnable(c, m, resident_mask));
	}
	return (int)(mp_two_stage_victim(&idle) >= 0 ? mp_two_stage_victim(&idle) :
		     mp_two_stage_victim(&waited));
}

bool coe_prefetch_may_evict(const struct mp_coe *c, uint32_t v, uint32_t m,
			    const uint32_t *wanted)
{
	return !(wanted && wanted[v]) && c->models[v].usage < c->models[m].usage;
}

void coe_want_next(const struct mp_coe *c, uint32_t *wanted, uint32_t m, int d)
{
	const struct coe_model *x = &c->models[m];

	for (uint32_t i = 0; i < x->n_next; i++)
		wanted[c->edges[x->first_edge + i].to] += (uint32_t)d;
}
