// SPDX-License-Identifier: MIT
/* FIFO eviction: the expert that entered host memory first goes first, whatever its use. */
#include "evict/evict.h"

const struct mp_evict_ops mp_evict_fifo = {
	.name = "fifo",
	.description = "first in, first out (insertion order; uses do not count)",
	/* LRU's list, but only insertions move a key to the head. */
	.init = mp_evict_lru_init,
	.on_insert = mp_evict_lru_insert,
	.on_remove = mp_evict_lru_remove,
	.pick_victim = mp_evict_lru_victim,
	.fini = mp_evict_lru_fini,
};
