/* SPDX-License-Identifier: MIT */
/* The open expert ranges of this process, published for tracers that attach later. */
#ifndef MP_PAGER_RANGES_H
#define MP_PAGER_RANGES_H

#include <stdint.h>

#include <moepager/common.h>

/*
 * A tracer cannot see a moepager:region probe fired before it attached, so
 * every open range is also listed in mp_pager_ranges, an exported data
 * symbol it finds through the ELF symbol table of the mapped libmoepager.so
 * and reads from /proc/PID/mem (as debuggers find r_debug). The layout is an
 * interface (docs/probes.md): fixed-width fields, changed only with version.
 *
 * The list is a seqlock for that reader: gen is odd while a writer changes
 * the list (and fires the probe), even when it is stable; a reader that saw
 * the same even gen before and after its walk read a consistent list.
 */
#define MP_PAGER_RANGES_MAGIC	0x4e52504du	/* "MPRN" little-endian */
#define MP_PAGER_RANGES_VERSION	1u

struct mp_pager_range_entry {
	uint64_t next;			/* address of the next entry, 0 at the end */
	uint64_t id;			/* unique in the process, from 1: the probes' id */
	uint64_t base;
	uint64_t slot_bytes;
	uint32_t slots_per_layer;
	uint32_t layers;
	uint32_t experts;		/* experts per layer (slots beyond are unused) */
	uint32_t reserved;
};

struct mp_pager_ranges {
	uint32_t magic;
	uint32_t version;
	uint32_t entry_bytes;		/* sizeof(struct mp_pager_range_entry) */
	uint32_t count;
	uint64_t gen;
	uint64_t head;			/* address of the newest entry, 0 when none */
	uint64_t next_id;
};

/* The one list of the process (like the log handler, a deliberate process-wide object). */
extern MP_API struct mp_pager_ranges mp_pager_ranges;

/*
 * Lists the range and fires moepager:region. Returns 0, or -ENOMEM (the
 * pager then fails to open: an unlisted range could not be traced).
 */
int mp_pager_ranges_add(uint64_t base, uint64_t slot_bytes, uint32_t slots_per_layer,
			uint32_t layers, uint32_t experts);
/* Withdraws the range at base and fires moepager:region_close. No-op when not listed. */
void mp_pager_ranges_remove(uint64_t base);

#endif /* MP_PAGER_RANGES_H */
