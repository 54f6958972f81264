// SPDX-License-Identifier: MIT
/* No prefetch: every expert comes in on demand (the baseline the others must beat). */
#include "prefetch/policy.h"

const struct mp_prefetch_ops mp_prefetch_none = {
	.name = "none",
	.description = "on demand only",
	.inline_gates = true,
};
