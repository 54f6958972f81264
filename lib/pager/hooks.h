/* SPDX-License-Identifier: MIT */
/*
 * What the layers above the pager may ask of it beyond the public API: the
 * prefetch driver's hints for the eviction policy and its cancelling of
 * queued prefetches. Narrow on purpose: nothing here exposes the pager's state.
 */
#ifndef MP_PAGER_HOOKS_H
#define MP_PAGER_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

#include <moepager/pager.h>

#include "evict/evict.h"

/* Slots per layer: the eviction policy's key of (layer, expert) is layer * this + expert. */
uint32_t mp_pager_slots_per_layer(const struct mp_pager *p);

/*
 * Points the eviction policy and prefetch admission at hints (NULL: none),
 * under the pager's lock. The hints must stay valid until replaced.
 */
void mp_pager_set_hints(struct mp_pager *p, const struct mp_evict_hints *h);

/*
 * The demand reads from the file tier and their summed read and checksum
 * time (mp_pager_stats' file_reads, file_read_ns), without the rest of a
 * snapshot: the driver samples them every step.
 */
void mp_pager_demand_reads(struct mp_pager *p, uint64_t *reads, uint64_t *read_ns);

/* Unqueues every queued prefetch whose key drop() accepts (called locked). Returns how many. */
uint32_t mp_pager_drop_prefetches(struct mp_pager *p, bool (*drop)(void *arg, uint32_t key),
				  void *arg);

#endif /* MP_PAGER_HOOKS_H */
