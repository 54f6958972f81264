/* SPDX-License-Identifier: MIT */
/* Reads another process's list of open expert ranges (mp_pager_ranges) from /proc/PID/mem. */
#ifndef MP_BPF_TARGET_RANGES_H
#define MP_BPF_TARGET_RANGES_H

#include <stdint.h>

struct target_range {
	uint64_t id;
	uint64_t base;
	uint64_t slot_bytes;
	uint32_t slots_per_layer;
	uint32_t layers;
	uint32_t experts;
};

/*
 * The address of mp_pager_ranges in pid, which maps binary (libmoepager.so
 * or an executable linking it statically): the ELF symbol's value plus the
 * load bias of binary's mapping (found by device and inode in
 * /proc/PID/maps). Returns 0, -ENOENT (binary not mapped, or it has no such
 * symbol: an older library) with a debug line, or -errno with a message.
 */
int target_ranges_locate(int pid, const char *binary, uint64_t *addr);

/*
 * Reads the list at addr: a consistent snapshot, taken when the list's
 * generation was the same even number before and after the walk (retried
 * while a pager opens or closes). Stores up to max ranges in out, sets *gen.
 * Returns the number of ranges listed (may exceed max), -EPROTO (not a
 * list of a version this reader knows), -EAGAIN (kept changing), or -errno.
 */
int target_ranges_read(int pid, uint64_t addr, struct target_range *out, uint32_t max,
		       uint64_t *gen);

/* The list's generation alone. Returns 0 or -errno. */
int target_ranges_gen(int pid, uint64_t addr, uint64_t *gen);

#endif /* MP_BPF_TARGET_RANGES_H */
