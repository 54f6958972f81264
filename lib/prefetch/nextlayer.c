// SPDX-License-Identifier: MIT
/*
 * Speculative gating of the next layer (Mixtral-offloading): layer l + 1's
 * router applied to layer l's hidden state picks the experts to fetch now.
 */
#include "prefetch/policy.h"

static void nextlayer_gate(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids,
			   uint32_t k, const float *spec)
{
	(void)ids;
	(void)k;
	/* Without the hidden state there is nothing to speculate on: stay on demand. */
	if (!spec || layer + 1 >= pf->env.layers)
		return;
	/* Always the top-k of the speculative gate, as the speculated router would choose. */
	mp_prefetch_plan(pf, layer + 1, spec, 1.0f, (int32_t)layer);
}

/* Layer l is predicted at layer l - 1's gate; layer 0 never. */
static float nextlayer_lead(const struct mp_prefetch *pf, uint32_t layer)
{
	(void)pf;
	return layer ? 1.0f : -1.0f;
}

const struct mp_prefetch_ops mp_prefetch_nextlayer = {
	.name = "nextlayer",
	.description = "top-k of layer l+1's router applied to layer l's hidden state (d = 1)",
	.gate = nextlayer_gate,
	.lead = nextlayer_lead,
	.layer_input = true,
};
