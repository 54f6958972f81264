/* SPDX-License-Identifier: MIT */
/* The reserved range of fixed-size slots, its userfaultfd handler and the memory pool behind it. */
#ifndef MP_REGION_H
#define MP_REGION_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

/*
 * A region is one registered virtual range cut into `nslots` slots of
 * `slot_bytes` (a multiple of 2 MiB). The first `data_bytes` of a slot hold
 * data when the slot is backed; the rest of the slot is padding that is
 * never backed (an access there is poisoned). The region knows nothing of
 * models: its owner (the pager) tells it which slot to fill, map, unmap or
 * poison, and it calls the owner back when a thread faults on a slot.
 *
 * Memory comes in chunks: 2 MiB for every full 2 MiB of data_bytes and one
 * tail chunk for the rest. Chunks are anonymous pages that live either in
 * the range (the slot is mapped) or in a pool of parking spots outside it
 * (the slot is held: filled, or evicted from view). They move with
 * UFFDIO_MOVE and are recycled, never freed and re-allocated on the hot path.
 *
 * Callers serialise operations per slot (the pager's slot states do); the
 * region itself is thread-safe across slots.
 */

struct mp_region;

struct mp_region_ops {
	/*
	 * Threads faulted on slot: `count` fault messages of one batch, the
	 * first at byte `offset` of the slot, read at now_ns. Called on the
	 * handler thread, once per slot per batch. It must not wait for tier
	 * I/O and must not zap the range (mp_region_slot_clear()): the handler
	 * is the one thread that completes REMOVE events. Returns 0, or
	 * -EAGAIN when an ioctl it needs met a pending event: the region
	 * reads the pending messages and calls it again with count 0.
	 */
	int (*fault)(void *owner, uint32_t slot, uint64_t offset, uint32_t count, uint64_t now_ns);
	/*
	 * A REMOVE (madvise) or UNMAP (munmap) event covered slots first..last,
	 * possibly partly. Called on the handler thread before the kernel zaps
	 * or unmaps them: the owner must not trust those slots' mappings.
	 */
	void (*removed)(void *owner, uint32_t first, uint32_t last, bool unmapped);
	/*
	 * The handler thread is exiting on an error (err): no fault will be
	 * read again. Called on the handler thread; the owner poisons every
	 * slot that is not mapped so no thread blocks forever. May be NULL.
	 */
	void (*stopped)(void *owner, int err);
};

struct mp_region_config {
	uint32_t nslots;
	uint64_t slot_bytes;		/* multiple of 2 MiB */
	uint64_t data_bytes;		/* multiple of the page size, <= slot_bytes */
	int numa_node;			/* node for new chunks, or -1: the kernel's choice */
	const char *name;		/* used in log lines ("region NAME: ...") */
};

/* Bytes a region uses to hold one slot's data (data_bytes, page-rounded). */
#define MP_REGION_CHUNK		(2u << 20)

struct mp_region_mem {
	uint64_t populated_bytes;	/* chunk pages the region holds (held, mapped, spare) */
	uint64_t spare_bytes;		/* populated chunks holding no slot's data */
	uint64_t fresh_bytes;		/* chunk bytes newly allocated since creation */
	uint64_t released_bytes;	/* spare chunk bytes given back to the kernel */
};

/*
 * Opens the userfaultfd (O_NONBLOCK|O_CLOEXEC; the syscall, then
 * /dev/userfaultfd, then user-mode-only faults), negotiates the features
 * the region needs (MOVE, POISON, EVENT_REMOVE, EVENT_UNMAP), reserves and
 * registers the range once, reserves the pool and starts the handler
 * thread. Returns 0 and sets *out, -EPERM with a message saying which
 * permission is missing, -EOPNOTSUPP naming a missing kernel feature,
 * -EINVAL for a bad config, or -ENOMEM.
 */
int mp_region_create(const struct mp_region_config *cfg, const struct mp_region_ops *ops,
		     void *owner, struct mp_region **out);
/*
 * Stops the handler thread (no owner callback runs after this returns).
 * Faults that arrive later stay blocked until mp_region_destroy(); the
 * owner poisons what must not hang first. Idempotent.
 */
void mp_region_stop(struct mp_region *r);
/* Stops the handler, closes the userfaultfds and unmaps everything. NULL is allowed. */
void mp_region_destroy(struct mp_region *r);

void *mp_region_base(const struct mp_region *r);
uint64_t mp_region_bytes(const struct mp_region *r);
uint32_t mp_region_nslots(const struct mp_region *r);
void *mp_region_slot_addr(const struct mp_region *r, uint32_t slot);
/* The slot an address falls in, or -1 when it is outside the range. */
int64_t mp_region_slot_of(const struct mp_region *r, const void *addr);
/* Chunks per slot; the destination segments of a fill have this many entries. */
uint32_t mp_region_chunks(const struct mp_region *r);
void mp_region_mem(struct mp_region *r, struct mp_region_mem *out);

/*
 * Slot operations. A slot is empty, held (its data in pool chunks) or
 * mapped (its data in the range); each call says which state it needs and
 * returns -EINVAL from any other.
 */

/*
 * empty -> held: takes chunks for the slot (spare ones first, new ones
 * otherwise) and returns their addresses in iov[mp_region_chunks()]; a
 * fill writes the slot's data there. The populated bytes may reach at most
 * limit with the new ones (MP_REGION_NO_LIMIT: any): -ENOSPC (nothing taken)
 * past it. The limit is checked where the chunks are taken, under the
 * region's lock, so concurrent fills cannot each pass a check made apart
 * from the taking and together go over it.
 * Returns the number of segments, -ENOMEM, -ENOSPC, or -EINVAL.
 */
#define MP_REGION_NO_LIMIT	UINT64_MAX
int mp_region_slot_alloc(struct mp_region *r, uint32_t slot, struct iovec *iov, uint64_t limit);
/* held: the chunk segments mp_region_slot_alloc() gave. Returns their number or -EINVAL. */
int mp_region_slot_iov(struct mp_region *r, uint32_t slot, struct iovec *iov);
/*
 * held -> mapped: moves the chunks into the range. It wakes nobody: the
 * caller records the slot as mapped, then wakes its waiters with one
 * mp_region_slot_wake() (so a woken thread never sees stale bookkeeping,
 * and none wakes to refault on a chunk still on its way). Returns 0, or a
 * negative errno after which the slot is left held (its data intact) or,
 * for -EFAULT, lost (see mp_region_slot_discard()).
 */
int mp_region_slot_map(struct mp_region *r, uint32_t slot);
/*
 * mapped -> held: moves the pages back into the slot's chunks. Returns 0,
 * -EBUSY (pages pinned: still mapped and whole), or -EFAULT (pages missing:
 * the slot's data is lost, see mp_region_slot_discard()).
 */
int mp_region_slot_unmap(struct mp_region *r, uint32_t slot);
/* held -> empty: the chunks become spare (kept for recycling). */
int mp_region_slot_free(struct mp_region *r, uint32_t slot);
/*
 * any -> empty, data dropped: for a slot whose pages were zapped behind
 * the owner's back. Releases the chunks and zaps what is left in the range.
 */
int mp_region_slot_discard(struct mp_region *r, uint32_t slot);
/*
 * Installs poison markers over [offset, slot_bytes) of an unmapped part of
 * the slot and wakes the threads waiting there: they (and later accesses)
 * get SIGBUS until mp_region_slot_clear(). Returns 0 or a negative errno.
 */
int mp_region_slot_poison(struct mp_region *r, uint32_t slot, uint64_t offset);
/*
 * Removes poison markers from an empty slot so the next access faults to
 * the handler again. Never call it from the handler thread (it raises a
 * REMOVE event only the handler completes).
 */
int mp_region_slot_clear(struct mp_region *r, uint32_t slot);
/* Wakes threads waiting on the slot (for a fault that was already resolved). */
int mp_region_slot_wake(struct mp_region *r, uint32_t slot);
/* Pages of [addr, addr+len) mapped now (for anonymous memory: the PTE is present). */
uint64_t mp_region_pages_present(void *addr, uint64_t len);
/* True when the page at offset of the slot is mapped in the range. */
bool mp_region_page_present(struct mp_region *r, uint32_t slot, uint64_t offset);

/*
 * Gives spare chunks back to the kernel until at most keep_bytes of spare
 * chunks remain. Returns the bytes released.
 */
uint64_t mp_region_trim(struct mp_region *r, uint64_t keep_bytes);
/*
 * Creates one chunk ahead of need onto the spare stacks, so that fills find
 * spares rather than create their own before their reads (~3 ms a 2 MiB
 * chunk on the project VM: fresh pages cost host faults). Only while the
 * pool fills up: from a fill that had to create chunks until the populated
 * bytes reach limit. Nothing (0) while the spare stacks hold want slots'
 * chunks or another thread grows them. Returns 1 when it created a chunk,
 * 0, or -errno.
 */
int mp_region_grow_spares(struct mp_region *r, uint32_t want, uint64_t limit);

/* Requests a short scheduler slice for the calling service thread (best effort). */
void mp_thread_short_slice(void);

/* True when the calling thread is this region's handler thread. */
bool mp_region_on_handler(const struct mp_region *r);

/*
 * Outcome of a UFFDIO_* ioctl, classified in one place (uffd/ioctl.c). Partial
 * progress (the ioctl's own count) is handled by the caller before this.
 */
enum mp_uffd_outcome {
	MP_UFFD_DONE = 0,
	MP_UFFD_PRESENT,	/* EEXIST: the destination is already mapped */
	MP_UFFD_RETRY,		/* EAGAIN: an event is pending, or a folio was busy */
	MP_UFFD_BUSY,		/* EBUSY: a page is pinned (DMA) or shared: not movable now */
	MP_UFFD_GONE,		/* ENOENT/ESRCH: no source page, or the mm is exiting */
	MP_UFFD_FAIL,		/* anything else: a bug or resource failure; log and fail */
};

enum mp_uffd_outcome mp_uffd_classify(int err);
const char *mp_uffd_outcome_name(enum mp_uffd_outcome o);

#endif /* MP_REGION_H */
