/* SPDX-License-Identifier: MIT */
/* The region's state, shared by region.c (memory, slots), ioctl.c and handler.c (the thread). */
#ifndef MP_REGION_PRIV_H
#define MP_REGION_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "uffd/region.h"

#define SPOT_NONE	UINT32_MAX
#define NNURSERY	4

enum { CLS_FULL = 0, CLS_TAIL = 1, NCLS = 2 };

/* Parking spots of one chunk size in the pool. */
struct spot_class {
	uint64_t size;		/* bytes per spot (0: class unused) */
	char *base;		/* first spot */
	uint32_t count;
	uint32_t per_pmd;	/* spots in each 2 MiB of the class (mp_region_spot_addr()) */
	uint32_t *spare;	/* stack of populated spots holding no data */
	uint32_t nspare;
	uint32_t *holes;	/* stack of spots with no pages */
	uint32_t nholes;
	uint32_t *owner;	/* per spot: the slot holding it, or OWNER_SPARE / OWNER_HOLE */
};

/* A spot on the spare stack, or on the holes stack, rather than held by a slot. */
#define OWNER_SPARE	UINT32_MAX
#define OWNER_HOLE	(UINT32_MAX - 1)
/* A spot whose chunk is being created ahead of need (mp_region_grow_spares()). */
#define OWNER_AHEAD	(UINT32_MAX - 2)

enum slot_mem {
	SLOT_EMPTY = 0,		/* no chunks */
	SLOT_HELD,		/* data in the slot's pool spots */
	SLOT_MAPPED,		/* data in the range; the spots wait empty for an unmap */
};

struct mp_region {
	char name[64];
	struct mp_region_ops ops;
	void *owner;

	uint32_t nslots;
	uint64_t slot_bytes;
	uint64_t data_bytes;
	uint32_t nfull;		/* 2 MiB chunks per slot */
	uint64_t tail_bytes;	/* bytes of the tail chunk (0: none) */
	uint32_t nchunks;
	int numa_node;

	char *base;		/* the registered range */
	uint64_t bytes;
	char *pool;		/* parking spots, registered on pool_uffd */
	uint64_t pool_bytes;
	/*
	 * Unregistered: where new chunk pages are born, NNURSERY places of a
	 * full and a tail chunk each, so that fills create chunks at once
	 * without the lock; nursery_busy (locked) marks the places in use.
	 */
	char *nursery;
	uint64_t nursery_bytes;
	uint32_t nursery_busy;
	pthread_cond_t nursery_cv;
	/*
	 * (Locked.) ahead: a fill had to create chunks, so the pool is still
	 * filling up and mp_region_grow_spares() creates spares ahead of the
	 * next fills, until the memory bound stops it; growing: a thread does.
	 */
	bool ahead, growing;
	/* Test seam: called unlocked as a new chunk is created (NULL: none). */
	void (*creating)(struct mp_region *r, void *arg);
	void *creating_arg;

	int uffd;		/* the range's: faults and events, read by the handler */
	/*
	 * The pool's. UFFDIO_MOVE needs its destination registered with the
	 * ioctl's userfaultfd, and eviction moves pages into the pool. Opened
	 * with UFFD_FEATURE_SIGBUS and never read: a stray access to an empty
	 * spot (a bug) raises SIGBUS or -EFAULT instead of blocking forever.
	 */
	int pool_uffd;
	uint64_t features;
	bool user_mode_only;

	pthread_mutex_t lock;	/* spot stacks, the nursery places; counters are written locked */
	struct spot_class cls[NCLS];
	uint32_t *slot_spots;	/* nslots x nchunks spot ids */
	_Atomic uint8_t *slot_mem;	/* enum slot_mem per slot */
	/* mp_region_mem's counters: atomic, read without the lock on every demand fill. */
	struct {
		_Atomic uint64_t populated, spare, fresh, released;
	} mem;

	/* The handler thread (handler.c). */
	pthread_t thread;
	bool thread_started;
	int stop_efd;
	_Atomic pid_t handler_tid;
};

/*
 * Where a spot is. A class's spots are packed per_pmd to each 2 MiB and
 * none crosses into the next: UFFDIO_MOVE moves a batch of PTEs, and
 * flushes its source's TLB range, within one page table, so a spot over a
 * 2 MiB boundary cost every move in or out of it two flushes (two
 * TLB-shootdown IPIs to the other vCPU, docs/region.md) instead of one.
 */
static inline char *mp_region_spot_addr(const struct mp_region *r, int cls, uint32_t spot)
{
	const struct spot_class *c = &r->cls[cls];

	return c->base + (uint64_t)(spot / c->per_pmd) * MP_REGION_CHUNK +
	       (uint64_t)(spot % c->per_pmd) * c->size;
}

int mp_region_handler_start(struct mp_region *r);
void mp_region_handler_stop(struct mp_region *r);

#define rlog_debug(r, fmt, ...) mp_debug("region %s: " fmt, (r)->name, ##__VA_ARGS__)
#define rlog_info(r, fmt, ...) mp_info("region %s: " fmt, (r)->name, ##__VA_ARGS__)
#define rlog_warn(r, fmt, ...) mp_warn("region %s: " fmt, (r)->name, ##__VA_ARGS__)
#define rlog_err(r, err, fmt, ...) mp_err(err, "region %s: " fmt, (r)->name, ##__VA_ARGS__)

#endif /* MP_REGION_PRIV_H */
