// SPDX-License-Identifier: MIT
/* FIFO eviction: the expert that entered host memory first goes first, whatever its use. */
#include "policy.h"

const struct mp_policy_ops mp_policy_fifo = {
	.name = "fifo",
	.description = "first in, first out (insertion order; uses do not count)",
	/* LRU's list, but only insertions move a key to the head. */
	.init = mp_policy_lru_init,
	.on_insert = mp_policy_lru_insert,
	.on_remove = mp_policy_lru_remove,
	.pick_victim = mp_policy_lru_victim,
	.fini = mp_policy_lru_fini,
};
