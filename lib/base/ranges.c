// SPDX-License-Identifier: MIT
/* The list of open expert ranges a tracer reads from /proc/PID/mem (see base/ranges.h). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>


#include "base/base.h"
#include "base/ranges.h"
#include "base/probes.h"

/* Initialised data (not .bss): a reader recognises the list before any pager opens. */
struct mp_pager_ranges mp_pager_ranges = {
	.magic = MP_PAGER_RANGES_MAGIC,
	.version = MP_PAGER_RANGES_VERSION,
	.entry_bytes = sizeof(struct mp_pager_range_entry),
	.next_id = 1,
};

/* Writers take turns; the seqlock is for the reader in another process. */
static pthread_mutex_t ranges_lock = PTHREAD_MUTEX_INITIALIZER;

static void write_begin(void)
{
	/* Acquire: the list changes below cannot move above the odd gen. */
	__atomic_fetch_add(&mp_pager_ranges.gen, 1, __ATOMIC_ACQ_REL);
}

static void write_end(void)
{
	__atomic_store_n(&mp_pager_ranges.gen, mp_pager_ranges.gen + 1, __ATOMIC_RELEASE);
}

int mp_pager_ranges_add(uint64_t base, uint64_t slot_bytes, uint32_t slots_per_layer,
			uint32_t layers, uint32_t experts)
{
	struct mp_pager_range_entry *e = calloc(1, sizeof(*e));

	if (!e)
		return mp_err(-ENOMEM, "pager: out of memory listing the expert range at 0x%llx",
			      (unsigned long long)base);
	e->base = base;
	e->slot_bytes = slot_bytes;
	e->slots_per_layer = slots_per_layer;
	e->layers = layers;
	e->experts = experts;

	pthread_mutex_lock(&ranges_lock);
	write_begin();
	e->id = mp_pager_ranges.next_id++;
	e->next = mp_pager_ranges.head;
	mp_pager_ranges.head = (uintptr_t)e;
	mp_pager_ranges.count++;
	/* Inside the write section: a reader that saw gen unchanged also missed no probe. */
	MP_PROBE(region, e->id, base, slot_bytes, slots_per_layer, layers, experts);
	write_end();
	pthread_mutex_unlock(&ranges_lock);
	return 0;
}

void mp_pager_ranges_remove(uint64_t base)
{
	struct mp_pager_range_entry *e = NULL, *cur;
	uint64_t *link;

	pthread_mutex_lock(&ranges_lock);
	for (link = &mp_pager_ranges.head; *link; link = &cur->next) {
		cur = (struct mp_pager_range_entry *)(uintptr_t)*link;
		if (cur->base == base) {
			e = cur;
			break;
		}
	}
	if (e) {
		write_begin();
		*link = e->next;
		mp_pager_ranges.count--;
		MP_PROBE(region_close, e->id, base);
		write_end();
	}
	pthread_mutex_unlock(&ranges_lock);
	free(e);
}
