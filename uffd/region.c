// SPDX-License-Identifier: MIT
/* The reserved expert range: its mappings, the chunk pool and the slot primitives. */

/*
 * Design: anonymous pages moved with UFFDIO_MOVE, recycled through a pool
 * =========================================================================
 *
 * DESIGN.md decision 2 offers two ways to resolve a fault without copying:
 * a memfd host tier resolved with UFFDIO_CONTINUE, or anonymous pages moved
 * into place with UFFDIO_MOVE. Measured on the project VM (2 vCPU, Linux
 * 6.18, virtio disk; scratch programs, 30 experts of 22 MiB, then
 * `moepager faultbench`, whose figures docs/region.md keeps):
 *
 *   host-tier fault, whole 22 MiB expert, first touch -> resolved:
 *     memfd MINOR + UFFDIO_CONTINUE (4 KiB shmem, THP for shmem is off) 2.0-2.2 ms  10.7 GB/s
 *     anon MISSING + UFFDIO_MOVE, 4 KiB pages                             0.6-0.9 ms  27-37 GB/s
 *     anon MISSING + UFFDIO_MOVE, 2 MiB THP chunks (PMDs move whole)      75-80 us    ~280 GB/s
 *   file-tier read target, io_uring O_DIRECT 1 MiB x QD16 (disk ~1-2.7 GB/s, noisy):
 *     fresh memfd pages (allocated by the read)       0.4-1.0 GB/s, CPU-bound in the kernel
 *     existing memfd pages, alias PTEs populated      ~= raw
 *     reused anonymous THP buffer (the raw baseline)  raw
 *   fresh memory: this VM reports freed memory to the host (page_reporting
 *   order 11), so a fresh page costs a host fault: populating new pages
 *   runs at 0.4-1.6 GB/s, recycled pages cost nothing.
 *
 *   `moepager faultbench` on mixtral-mini with this design (machine shared
 *   with other jobs): host-tier faults ~40 us per 21 MiB expert at the
 *   median (~500 GB/s: 7 us for the 10 PMDs in one move, 24 us for the 256
 *   PTEs of the 1 MiB tail, the rest fault entry and wake-ups), p99 75-95 us
 *   on a quiet machine, set by the first fault after an idle vCPU halts
 *   (docs/region.md); file-tier faults 0.8-1.0 of raw io_uring O_DIRECT
 *   (1.2-2.6 GB/s) in the same run; cold mmap 0.5-0.8 GB/s.
 *
 * A memfd ties a page to its file offset, i.e. to one slot: refilling a
 * slot after evicting another always allocates fresh shmem pages, which
 * caps file-tier faults far below the disk. Anonymous pages can move
 * between any two addresses, so the pool recycles them: a victim's chunks
 * become the next fill's read buffer. Chosen: anonymous pages + MOVE.
 *
 *   range   anonymous MAP_PRIVATE, MADV_HUGEPAGE, registered once (MISSING)
 *           on `uffd` (MOVE, POISON, EVENT_REMOVE, EVENT_UNMAP). Never
 *           written by the kernel on the handler's behalf: reads go to pool
 *           chunks, never into the registered range.
 *   pool    parking spots, one per chunk a slot can own, registered on a
 *           second userfaultfd (MOVE needs a registered destination; SIGBUS
 *           mode, never read, so a stray access fails instead of hanging).
 *           Holds the host tier (evicted from view, data kept), fill
 *           targets and spare chunks kept for recycling.
 *   nursery unregistered; new chunk pages are populated here (THP when the
 *           kernel gives one, on the chosen NUMA node) and moved into a spot.
 *
 *   fill:       spare chunks -> io_uring reads -> checksum -> MOVE into the range
 *   host fault: MOVE pool spots -> range (whole expert, one wake)
 *   evict:      MOVE range -> pool spots (kept: host tier) [-> spare: dropped]
 *   failure:    UFFDIO_POISON over the slot (SIGBUS), cleared by MADV_DONTNEED
 *
 * Sharing with a second process: anonymous pages cannot be mapped by
 * another process. The slot primitives below are the seam: a memfd backend
 * (alias-mapped memfd, fill into the alias, map = UFFDIO_CONTINUE, unmap =
 * zap, drop = PUNCH_HOLE, the memfd passed over a unix socket) implements
 * the same calls when a second engine process must attach; docs/region.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "uffd/compat.h"
#include "uffd/ioctl.h"
#include "uffd/region_priv.h"

#define PAGE		4096ull

/* Features the range's userfaultfd must have, and the one for the pool. */
#define RANGE_FEATURES	(UFFD_FEATURE_MOVE | UFFD_FEATURE_POISON | \
			 UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP)
#define POOL_FEATURES	(UFFD_FEATURE_MOVE | UFFD_FEATURE_SIGBUS)

/*
 * Mappings
 */

/* An anonymous private mapping of len bytes aligned to 2 MiB (the slack trimmed off). */
static void *map_aligned(uint64_t len, int advice)
{
	uint64_t a = MP_REGION_CHUNK, total = len + a;
	char *p = mmap(NULL, total, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	char *start;
	uint64_t head;

	if (p == MAP_FAILED)
		return NULL;
	start = (char *)MP_ALIGN_UP((uintptr_t)p, a);
	head = (uint64_t)(start - p);
	if (head)
		munmap(p, head);
	if (total - head - len)
		munmap(start + len, total - head - len);
	/* Not inherited by fork(): MOVE needs exclusive pages, and a child has no handler. */
	madvise(start, len, MADV_DONTFORK);
	if (advice)
		madvise(start, len, advice);
	return start;
}

static void place_on_node(struct mp_region *r, void *addr, uint64_t len)
{
	struct bitmask *nodes;

	if (r->numa_node < 0)
		return;
	if (numa_available() < 0 || numa_num_configured_nodes() < 2) {
		rlog_debug(r, "one NUMA node: host memory placement left to the kernel");
		return;
	}
	if (r->numa_node > numa_max_node()) {
		rlog_warn(r, "NUMA node %d does not exist (max %d); placement left to the kernel",
			  r->numa_node, numa_max_node());
		return;
	}
	nodes = numa_allocate_nodemask();
	if (!nodes)
		return;
	numa_bitmask_setbit(nodes, (unsigned)r->numa_node);
	if (mbind(addr, len, MPOL_BIND, nodes->maskp, nodes->size + 1, 0))
		rlog_warn(r, "mbind to node %d: %s; placement left to the kernel", r->numa_node,
			  strerror(errno));
	else
		rlog_debug(r, "new chunks placed on NUMA node %d", r->numa_node);
	numa_free_nodemask(nodes);
}

/*
 * Chunks and spots
 */

static char *spot_addr(const struct mp_region *r, int cls, uint32_t spot)
{
	return mp_region_spot_addr(r, cls, spot);
}

static int chunk_cls(const struct mp_region *r, uint32_t j)
{
	return j < r->nfull ? CLS_FULL : CLS_TAIL;
}

static uint32_t *slot_spot(const struct mp_region *r, uint32_t slot, uint32_t j)
{
	return &r->slot_spots[(uint64_t)slot * r->nchunks + j];
}

static char *chunk_dst(const struct mp_region *r, uint32_t slot, uint32_t j)
{
	return r->base + (uint64_t)slot * r->slot_bytes + (uint64_t)j * MP_REGION_CHUNK;
}

static void mem_add(_Atomic uint64_t *counter, uint64_t v)
{
	atomic_fetch_add_explicit(counter, v, memory_order_relaxed);
}

static void mem_sub(_Atomic uint64_t *counter, uint64_t v)
{
	atomic_fetch_sub_explicit(counter, v, memory_order_relaxed);
}

/* Takes a free nursery place, waiting while NNURSERY creations run. */
static char *nursery_take(struct mp_region *r, int *place)
{
	pthread_mutex_lock(&r->lock);
	while (r->nursery_busy == (1u << NNURSERY) - 1)
		pthread_cond_wait(&r->nursery_cv, &r->lock);
	*place = __builtin_ctz(~r->nursery_busy);
	r->nursery_busy |= 1u << *place;
	pthread_mutex_unlock(&r->lock);
	return r->nursery + (uint64_t)*place * 2 * MP_REGION_CHUNK;
}

static void nursery_put(struct mp_region *r, int place)
{
	pthread_mutex_lock(&r->lock);
	r->nursery_busy &= ~(1u << place);
	pthread_cond_signal(&r->nursery_cv);
	pthread_mutex_unlock(&r->lock);
}

/*
 * Populates new pages in a nursery place and moves them into an empty spot
 * the caller holds. Called unlocked: populating 2 MiB takes ~3 ms (zeroing,
 * compaction when THP defrag allows it), and under the lock every other
 * fill's slot_alloc and mp_region_mem() queued behind it (ds26: 8.6 s of
 * the fills' 8.7 s getting chunks, docs/region.md).
 */
static int chunk_create(struct mp_region *r, int cls, uint32_t spot)
{
	uint64_t size = r->cls[cls].size;
	int place, err;
	char *nursery = nursery_take(r, &place) + (cls == CLS_FULL ? 0 : MP_REGION_CHUNK);

	if (r->creating)
		r->creating(r, r->creating_arg);
	err = 0;
	if (madvise(nursery, size, MADV_POPULATE_WRITE)) {
		if (errno != EINVAL) {
			err = rlog_err(r, errno == ENOMEM ? -ENOMEM : -errno,
				       "allocating a %llu-byte chunk: %s",
				       (unsigned long long)size, strerror(errno));
			/* Pages populated before the failure are counted nowhere. */
			madvise(nursery, size, MADV_DONTNEED);
			goto out;
		}
		/* Kernel without MADV_POPULATE_WRITE (< 5.14): touch every page. */
		for (uint64_t o = 0; o < size; o += PAGE)
			((volatile char *)nursery)[o] = 0;
	}
	err = mp_uffd_move(r, r->pool_uffd, spot_addr(r, cls, spot), nursery, size, 0, NULL);
	if (err) {
		/*
		 * A move can fail part way: the pages it moved would make every
		 * later move into this spot fail with -EEXIST once it is a hole
		 * again. Zap both ends (the pool raises no EVENT_REMOVE).
		 */
		madvise(nursery, size, MADV_DONTNEED);
		madvise(spot_addr(r, cls, spot), size, MADV_DONTNEED);
		rlog_err(r, err, "moving a new chunk into the pool: %s", strerror(-err));
		goto out;
	}
	mem_add(&r->mem.fresh, size);
out:
	nursery_put(r, place);
	return err;
}

static const char *owner_name(uint32_t owner, char *buf, size_t len)
{
	if (owner == OWNER_SPARE)
		return "the spare stack";
	if (owner == OWNER_HOLE)
		return "the holes (no pages)";
	if (owner == OWNER_AHEAD)
		return "a chunk created ahead of need";
	snprintf(buf, len, "slot %u", owner);
	return buf;
}

/*
 * Hands a spot from one owner to the next. A spot held twice would have its
 * pages moved from under a read or into the wrong slot: the ledger refuses
 * the hand-over and says who holds it. Called locked.
 */
static int spot_pass(struct mp_region *r, int cls, uint32_t spot, uint32_t from, uint32_t to)
{
	uint32_t *owner = &r->cls[cls].owner[spot];
	char a[32], b[32], c[32];

	if (*owner != from)
		return rlog_err(r, -EUCLEAN, "accounting bug: class %d spot %u goes from %s to %s, "
				"but %s holds it", cls, spot, owner_name(from, a, sizeof(a)),
				owner_name(to, b, sizeof(b)), owner_name(*owner, c, sizeof(c)));
	*owner = to;
	return 0;
}

/*
 * Takes a spot of class cls for slot: a spare one (*hole false), or one
 * with no pages yet (*hole true; counted populated now, so that the memory
 * bound holds while the caller creates its chunk unlocked). Called locked.
 */
static int spot_take(struct mp_region *r, int cls, uint32_t slot, uint32_t *out, bool *hole)
{
	struct spot_class *c = &r->cls[cls];
	uint32_t spot;
	int err;

	*hole = !c->nspare;
	if (c->nspare) {
		spot = c->spare[c->nspare - 1];
		err = spot_pass(r, cls, spot, OWNER_SPARE, slot);
		if (err)
			return err;
		c->nspare--;
		mem_sub(&r->mem.spare, c->size);
		*out = spot;
		return 0;
	}
	if (!c->nholes)
		return rlog_err(r, -ENOSPC, "no free parking spot (class %d): accounting bug", cls);
	spot = c->holes[c->nholes - 1];
	err = spot_pass(r, cls, spot, OWNER_HOLE, slot);
	if (err)
		return err;
	c->nholes--;
	mem_add(&r->mem.populated, c->size);
	*out = spot;
	return 0;
}

/* A spot taken from the holes whose chunk was not created goes back to them. Called locked. */
static void spot_unhole(struct mp_region *r, int cls, uint32_t spot, uint32_t from)
{
	struct spot_class *c = &r->cls[cls];

	if (spot_pass(r, cls, spot, from, OWNER_HOLE))
		return;
	c->holes[c->nholes++] = spot;
	mem_sub(&r->mem.populated, c->size);
}

static void spot_put_spare(struct mp_region *r, int cls, uint32_t spot, uint32_t from)
{
	struct spot_class *c = &r->cls[cls];

	if (spot_pass(r, cls, spot, from, OWNER_SPARE))
		return;
	c->spare[c->nspare++] = spot;
	mem_add(&r->mem.spare, c->size);
}

/* Gives a spot's pages back to the kernel. Called locked. */
static void spot_release(struct mp_region *r, int cls, uint32_t spot, uint32_t from)
{
	struct spot_class *c = &r->cls[cls];

	if (spot_pass(r, cls, spot, from, OWNER_HOLE))
		return;
	/* The pool's userfaultfd has no EVENT_REMOVE: this zap raises no event. */
	madvise(spot_addr(r, cls, spot), c->size, MADV_DONTNEED);
	c->holes[c->nholes++] = spot;
	mem_sub(&r->mem.populated, c->size);
	mem_add(&r->mem.released, c->size);
}

uint64_t mp_region_pages_present(void *addr, uint64_t len)
{
	unsigned char vec[256];
	uint64_t n = 0;

	for (uint64_t off = 0; off < len; off += sizeof(vec) * PAGE) {
		uint64_t chunk = MP_MIN(len - off, (uint64_t)sizeof(vec) * PAGE);

		if (mincore((char *)addr + off, chunk, vec))
			return 0;
		for (uint64_t i = 0; i < chunk / PAGE; i++)
			n += vec[i] & 1;
	}
	return n;
}

static int slot_check(struct mp_region *r, uint32_t slot, enum slot_mem want, const char *op)
{
	uint8_t st;

	if (slot >= r->nslots)
		return rlog_err(r, -EINVAL, "%s: slot %u out of range (%u slots)", op, slot,
				r->nslots);
	st = atomic_load(&r->slot_mem[slot]);
	if (st != want)
		return rlog_err(r, -EINVAL, "%s: slot %u is %s", op, slot,
				st == SLOT_EMPTY ? "empty" : st == SLOT_HELD ? "held" : "mapped");
	return 0;
}

/*
 * Puts a slot's full chunks in ascending spot order. The spare stack hands
 * a recycled victim's spots back in reverse (LIFO), and move_chunks() can
 * merge only ascending runs: one UFFDIO_MOVE for a run of 10 PMDs takes
 * ~7 us, ten of them 13-50 us (a syscall and a VMA lookup each). Every
 * later map and unmap of the slot moves its chunks in as few runs as the
 * spots allow.
 */
static void sort_spots(struct mp_region *r, uint32_t slot)
{
	uint32_t *sp = slot_spot(r, slot, 0);

	for (uint32_t i = 1; i < r->nfull; i++) {
		uint32_t v = sp[i], k = i;

		for (; k && sp[k - 1] > v; k--)
			sp[k] = sp[k - 1];
		sp[k] = v;
	}
}

/* Bytes of new chunks a slot would take: what the spare stacks lack. Called locked. */
static uint64_t new_bytes_for_slot(const struct mp_region *r)
{
	uint64_t full = r->cls[CLS_FULL].nspare >= r->nfull ? 0 :
			r->nfull - r->cls[CLS_FULL].nspare;
	uint64_t tail = r->tail_bytes && !r->cls[CLS_TAIL].nspare ? r->tail_bytes : 0;

	return full * MP_REGION_CHUNK + tail;
}

/*
 * Creates the chunks of the spots a slot took from the holes (marked by a
 * NULL iov_base). Unlocked: the slot owns its spots. Returns 0 or -errno.
 */
static int create_chunks(struct mp_region *r, uint32_t slot, struct iovec *iov)
{
	for (uint32_t j = 0; j < r->nchunks; j++) {
		int cls = chunk_cls(r, j);
		uint32_t spot = *slot_spot(r, slot, j);
		int err;

		if (iov[j].iov_base)
			continue;
		err = chunk_create(r, cls, spot);
		if (err)
			return err;
		iov[j].iov_base = spot_addr(r, cls, spot);
	}
	return 0;
}

/* Gives back the first n spots a slot took: created ones as spares, the rest as holes. */
static void put_taken(struct mp_region *r, uint32_t slot, struct iovec *iov, uint32_t n)
{
	pthread_mutex_lock(&r->lock);
	for (uint32_t j = 0; j < n; j++) {
		if (iov[j].iov_base)
			spot_put_spare(r, chunk_cls(r, j), *slot_spot(r, slot, j), slot);
		else
			spot_unhole(r, chunk_cls(r, j), *slot_spot(r, slot, j), slot);
		*slot_spot(r, slot, j) = SPOT_NONE;
	}
	pthread_mutex_unlock(&r->lock);
}

int mp_region_slot_alloc(struct mp_region *r, uint32_t slot, struct iovec *iov, uint64_t limit)
{
	uint64_t more;
	uint32_t j;
	bool hole;
	int err;

	err = slot_check(r, slot, SLOT_EMPTY, "alloc");
	if (err)
		return err;
	pthread_mutex_lock(&r->lock);
	/* populated only changes under the lock: the check and the taking are one step. */
	more = new_bytes_for_slot(r);
	if (more && atomic_load(&r->mem.populated) + more > limit) {
		pthread_mutex_unlock(&r->lock);
		return -ENOSPC;
	}
	r->ahead |= more > 0;
	for (j = 0; j < r->nchunks; j++) {
		int cls = chunk_cls(r, j);

		err = spot_take(r, cls, slot, slot_spot(r, slot, j), &hole);
		if (err)
			break;
		iov[j].iov_base = hole ? NULL : spot_addr(r, cls, *slot_spot(r, slot, j));
	}
	pthread_mutex_unlock(&r->lock);
	if (!err)
		err = create_chunks(r, slot, iov);
	if (err) {
		put_taken(r, slot, iov, j);
		return err;
	}
	sort_spots(r, slot);
	for (j = 0; j < r->nchunks; j++) {
		int cls = chunk_cls(r, j);

		iov[j].iov_base = spot_addr(r, cls, *slot_spot(r, slot, j));
		iov[j].iov_len = r->cls[cls].size;
	}
	atomic_store(&r->slot_mem[slot], SLOT_HELD);
	return (int)r->nchunks;
}

int mp_region_slot_iov(struct mp_region *r, uint32_t slot, struct iovec *iov)
{
	int err = slot_check(r, slot, SLOT_HELD, "iov");

	if (err)
		return err;
	for (uint32_t j = 0; j < r->nchunks; j++) {
		int cls = chunk_cls(r, j);

		iov[j].iov_base = spot_addr(r, cls, *slot_spot(r, slot, j));
		iov[j].iov_len = r->cls[cls].size;
	}
	return (int)r->nchunks;
}

/* Where a chunk move stopped: the run that failed and the bytes of it that moved. */
struct move_fail {
	uint32_t chunk;
	uint64_t done;
};

/*
 * Moves chunks first..last-1 of a slot between the range and their spots,
 * merging runs whose spots are adjacent in the pool into one ioctl. Moves
 * into the range do not wake anyone (the caller wakes the slot once).
 */
static int move_chunks(struct mp_region *r, uint32_t slot, uint32_t first, uint32_t last,
		       bool into_range, struct move_fail *fail)
{
	uint32_t j = first;

	while (j < last) {
		int cls = chunk_cls(r, j);
		uint32_t k = j + 1;
		uint64_t len, done = 0;
		char *spot = spot_addr(r, cls, *slot_spot(r, slot, j));
		int err;

		while (k < last && chunk_cls(r, k) == cls &&
		       *slot_spot(r, slot, k) == *slot_spot(r, slot, k - 1) + 1)
			k++;
		len = (uint64_t)(k - j - 1) * MP_REGION_CHUNK + r->cls[cls].size;
		if (into_range)
			err = mp_uffd_move(r, r->uffd, chunk_dst(r, slot, j), spot, len,
					 UFFDIO_MOVE_MODE_DONTWAKE, &done);
		else
			err = mp_uffd_move(r, r->pool_uffd, spot, chunk_dst(r, slot, j), len,
					 0, &done);
		if (err) {
			fail->chunk = j;
			fail->done = done;
			return err;
		}
		j = k;
	}
	return 0;
}

/*
 * Undoes a failed move_chunks(): moves chunks 0..fail->chunk-1 and the
 * moved part of the failed run back where they came from, so the slot is
 * whole on its original side. Returns 0 or the error that made it lose data.
 */
static int move_rollback(struct mp_region *r, uint32_t slot, bool was_into_range,
			 const struct move_fail *fail)
{
	int cls = chunk_cls(r, fail->chunk);
	char *spot = spot_addr(r, cls, *slot_spot(r, slot, fail->chunk));
	char *dst = chunk_dst(r, slot, fail->chunk);
	struct move_fail again;
	int err;

	err = move_chunks(r, slot, 0, fail->chunk, !was_into_range, &again);
	if (err || !fail->done)
		return err;
	if (was_into_range)
		return mp_uffd_move(r, r->pool_uffd, spot, dst, fail->done, 0, NULL);
	return mp_uffd_move(r, r->uffd, dst, spot, fail->done, UFFDIO_MOVE_MODE_DONTWAKE, NULL);
}

int mp_region_slot_map(struct mp_region *r, uint32_t slot)
{
	struct move_fail fail = { 0, 0 };
	int err, back;

	err = slot_check(r, slot, SLOT_HELD, "map");
	if (err)
		return err;
	err = move_chunks(r, slot, 0, r->nchunks, true, &fail);
	if (err) {
		/* All or nothing: the slot stays held, its data intact; the caller may retry. */
		back = move_rollback(r, slot, true, &fail);
		if (back) {
			atomic_store(&r->slot_mem[slot], SLOT_MAPPED);
			return rlog_err(r, -EFAULT, "slot %u: map failed (%s) and so did the "
					"rollback (%s): slot data lost", slot, strerror(-err),
					strerror(-back));
		}
		if (err == -EEXIST) {
			/*
			 * Pages where the range should have none, over pages
			 * still in the spots (a move's uncounted pages are
			 * counted by mp_uffd_move()): a stray page, or a ledger
			 * error. The slot is lost, so the caller discards it
			 * rather than recycle spots that may have holes.
			 */
			atomic_store(&r->slot_mem[slot], SLOT_MAPPED);
			return rlog_err(r, -EFAULT, "slot %u: UFFDIO_MOVE into the range: %s: "
					"%llu of its %llu data pages are present there (the rest: "
					"poison markers); slot data lost", slot, strerror(-err),
					(unsigned long long)mp_region_pages_present(
					r->base + (uint64_t)slot * r->slot_bytes, r->data_bytes),
					(unsigned long long)(r->data_bytes / PAGE));
		}
		if (err != -EAGAIN)
			rlog_err(r, err, "slot %u: UFFDIO_MOVE into the range: %s (%s)", slot,
				 strerror(-err), mp_uffd_outcome_name(mp_uffd_classify(-err)));
		return err;
	}
	atomic_store(&r->slot_mem[slot], SLOT_MAPPED);
	return 0;
}

int mp_region_slot_unmap(struct mp_region *r, uint32_t slot)
{
	struct move_fail fail = { 0, 0 };
	int err, back;

	err = slot_check(r, slot, SLOT_MAPPED, "unmap");
	if (err)
		return err;
	err = move_chunks(r, slot, 0, r->nchunks, false, &fail);
	if (err) {
		if (mp_uffd_classify(-err) == MP_UFFD_GONE)
			return rlog_err(r, -EFAULT, "slot %u: unmap: pages missing from the range "
					"(zapped behind the pager's back): slot data lost", slot);
		back = move_rollback(r, slot, false, &fail);
		/* Whoever faulted on a chunk that moved out and back must not wait. */
		mp_uffd_wake(r, r->base + (uint64_t)slot * r->slot_bytes, r->data_bytes);
		if (back)
			return rlog_err(r, -EFAULT, "slot %u: unmap failed (%s) and so did the "
					"rollback (%s): slot data lost", slot, strerror(-err),
					strerror(-back));
		return err;
	}
	atomic_store(&r->slot_mem[slot], SLOT_HELD);
	return 0;
}

int mp_region_slot_free(struct mp_region *r, uint32_t slot)
{
	int err = slot_check(r, slot, SLOT_HELD, "free");

	if (err)
		return err;
	pthread_mutex_lock(&r->lock);
	for (uint32_t j = 0; j < r->nchunks; j++) {
		spot_put_spare(r, chunk_cls(r, j), *slot_spot(r, slot, j), slot);
		*slot_spot(r, slot, j) = SPOT_NONE;
	}
	atomic_store(&r->slot_mem[slot], SLOT_EMPTY);
	pthread_mutex_unlock(&r->lock);
	return 0;
}

int mp_region_slot_discard(struct mp_region *r, uint32_t slot)
{
	char *start;
	uint8_t st;

	if (slot >= r->nslots)
		return rlog_err(r, -EINVAL, "discard: slot %u out of range", slot);
	if (mp_region_on_handler(r))
		return rlog_err(r, -EDEADLK, "discard: slot %u: not on the handler thread", slot);
	st = atomic_load(&r->slot_mem[slot]);
	if (st == SLOT_EMPTY)
		return 0;
	start = r->base + (uint64_t)slot * r->slot_bytes;
	/*
	 * Nothing is moved back: the spots are zapped to holes anyway, and a
	 * move of a range with holes (UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES) can
	 * spin in the kernel forever. Linux's move_pages() keeps an -EAGAIN
	 * of one step (a PTE the application is zapping at that moment) as
	 * its error while it retries the same address, so a hole there is
	 * "moved" again and again: seen on 6.18 when the application zapped
	 * a slot as the pager discarded it (docs/region.md).
	 */
	pthread_mutex_lock(&r->lock);
	for (uint32_t j = 0; j < r->nchunks; j++) {
		spot_release(r, chunk_cls(r, j), *slot_spot(r, slot, j), slot);
		*slot_spot(r, slot, j) = SPOT_NONE;
	}
	atomic_store(&r->slot_mem[slot], SLOT_EMPTY);
	pthread_mutex_unlock(&r->lock);
	if (st == SLOT_MAPPED)
		madvise(start, r->slot_bytes, MADV_DONTNEED);
	return 0;
}

int mp_region_slot_poison(struct mp_region *r, uint32_t slot, uint64_t offset)
{
	char *start;
	uint64_t done, len;
	int err;

	if (slot >= r->nslots || offset >= r->slot_bytes)
		return rlog_err(r, -EINVAL, "poison: slot %u offset %llu out of range", slot,
				(unsigned long long)offset);
	offset &= ~(PAGE - 1);
	start = r->base + (uint64_t)slot * r->slot_bytes + offset;
	len = r->slot_bytes - offset;
	err = mp_uffd_poison(r, start, len, &done);
	if (err)
		return rlog_err(r, err, "slot %u: UFFDIO_POISON at +%llu: %s", slot,
				(unsigned long long)(offset + done), strerror(-err));
	return 0;
}

int mp_region_slot_clear(struct mp_region *r, uint32_t slot)
{
	if (slot >= r->nslots)
		return rlog_err(r, -EINVAL, "clear: slot %u out of range", slot);
	if (mp_region_on_handler(r))
		return rlog_err(r, -EDEADLK, "clear: slot %u: not on the handler thread", slot);
	if (atomic_load(&r->slot_mem[slot]) == SLOT_MAPPED)
		return rlog_err(r, -EINVAL, "clear: slot %u is mapped", slot);
	/* Zaps the poison markers; the REMOVE event this raises is read by the handler. */
	if (madvise(r->base + (uint64_t)slot * r->slot_bytes, r->slot_bytes, MADV_DONTNEED))
		return rlog_err(r, -errno, "clear: slot %u: madvise: %s", slot, strerror(errno));
	return 0;
}

int mp_region_slot_wake(struct mp_region *r, uint32_t slot)
{
	if (slot >= r->nslots)
		return rlog_err(r, -EINVAL, "wake: slot %u out of range", slot);
	return mp_uffd_wake(r, r->base + (uint64_t)slot * r->slot_bytes, r->slot_bytes);
}

bool mp_region_page_present(struct mp_region *r, uint32_t slot, uint64_t offset)
{
	if (slot >= r->nslots || offset >= r->slot_bytes)
		return false;
	return mp_region_pages_present(r->base + (uint64_t)slot * r->slot_bytes +
				       (offset & ~(PAGE - 1)), PAGE) == 1;
}

uint64_t mp_region_trim(struct mp_region *r, uint64_t keep_bytes)
{
	uint64_t released = 0;

	pthread_mutex_lock(&r->lock);
	for (int cls = 0; cls < NCLS; cls++) {
		struct spot_class *c = &r->cls[cls];

		while (c->nspare && atomic_load(&r->mem.spare) > keep_bytes) {
			uint32_t spot = c->spare[--c->nspare];

			mem_sub(&r->mem.spare, c->size);
			spot_release(r, cls, spot, OWNER_SPARE);
			released += c->size;
		}
	}
	pthread_mutex_unlock(&r->lock);
	return released;
}

/*
 * The class whose spare stack is short of want slots' chunks, full chunks
 * first, or -1. Called locked.
 */
static int short_class(const struct mp_region *r, uint32_t want)
{
	if (r->cls[CLS_FULL].nspare < (uint64_t)want * r->nfull)
		return CLS_FULL;
	if (r->tail_bytes && r->cls[CLS_TAIL].nspare < want)
		return CLS_TAIL;
	return -1;
}

int mp_region_grow_spares(struct mp_region *r, uint32_t want, uint64_t limit)
{
	struct spot_class *c;
	uint32_t spot;
	int cls, err;

	pthread_mutex_lock(&r->lock);
	cls = short_class(r, want);
	if (!r->ahead || r->growing || cls < 0) {
		pthread_mutex_unlock(&r->lock);
		return 0;
	}
	if (!r->cls[cls].nholes || atomic_load(&r->mem.populated) + r->cls[cls].size > limit) {
		/* The pool is as full as the bound lets it be: fills recycle from now on. */
		r->ahead = false;
		pthread_mutex_unlock(&r->lock);
		return 0;
	}
	c = &r->cls[cls];
	spot = c->holes[c->nholes - 1];
	err = spot_pass(r, cls, spot, OWNER_HOLE, OWNER_AHEAD);
	if (err) {
		pthread_mutex_unlock(&r->lock);
		return err;
	}
	c->nholes--;
	/* Counted at once, as a fill's new chunk is: the bound holds while it is made. */
	mem_add(&r->mem.populated, c->size);
	r->growing = true;
	pthread_mutex_unlock(&r->lock);
	err = chunk_create(r, cls, spot);
	pthread_mutex_lock(&r->lock);
	if (err)
		spot_unhole(r, cls, spot, OWNER_AHEAD);
	else
		spot_put_spare(r, cls, spot, OWNER_AHEAD);
	r->growing = false;
	pthread_mutex_unlock(&r->lock);
	return err ? err : 1;
}

/*
 * Unlocked (every demand fill asks): not one snapshot, but spare is read
 * after populated and clamped to it, so populated - spare never wraps.
 */
void mp_region_mem(struct mp_region *r, struct mp_region_mem *out)
{
	out->populated_bytes = atomic_load(&r->mem.populated);
	out->spare_bytes = MP_MIN(atomic_load(&r->mem.spare), out->populated_bytes);
	out->fresh_bytes = atomic_load(&r->mem.fresh);
	out->released_bytes = atomic_load(&r->mem.released);
}

void *mp_region_base(const struct mp_region *r)
{
	return r->base;
}

uint64_t mp_region_bytes(const struct mp_region *r)
{
	return r->bytes;
}

uint32_t mp_region_nslots(const struct mp_region *r)
{
	return r->nslots;
}

uint32_t mp_region_chunks(const struct mp_region *r)
{
	return r->nchunks;
}

void *mp_region_slot_addr(const struct mp_region *r, uint32_t slot)
{
	return slot < r->nslots ? r->base + (uint64_t)slot * r->slot_bytes : NULL;
}

int64_t mp_region_slot_of(const struct mp_region *r, const void *addr)
{
	uintptr_t a = (uintptr_t)addr, b = (uintptr_t)r->base;

	if (a < b || a >= b + r->bytes)
		return -1;
	return (int64_t)((a - b) / r->slot_bytes);
}

/*
 * Creation and teardown
 */

static int config_check(const struct mp_region_config *cfg)
{
	if (!cfg->nslots || !cfg->slot_bytes || cfg->slot_bytes % MP_REGION_CHUNK)
		return mp_err(-EINVAL, "region: slot size %llu is not a positive multiple of 2 MiB",
			      (unsigned long long)cfg->slot_bytes);
	if (!cfg->data_bytes || cfg->data_bytes % PAGE || cfg->data_bytes > cfg->slot_bytes)
		return mp_err(-EINVAL, "region: data size %llu must be page-aligned and in "
			      "(0, slot size %llu]", (unsigned long long)cfg->data_bytes,
			      (unsigned long long)cfg->slot_bytes);
	if ((uint64_t)cfg->nslots * cfg->slot_bytes / cfg->slot_bytes != cfg->nslots ||
	    (uint64_t)cfg->nslots * cfg->slot_bytes > (1ull << 46))
		return mp_err(-EINVAL, "region: %u slots of %llu bytes do not fit the address "
			      "space",
			      cfg->nslots, (unsigned long long)cfg->slot_bytes);
	return 0;
}

static int spots_init(struct mp_region *r)
{
	uint64_t off = 0;

	r->cls[CLS_FULL].size = MP_REGION_CHUNK;
	r->cls[CLS_FULL].count = r->nslots * r->nfull;
	r->cls[CLS_TAIL].size = r->tail_bytes;
	r->cls[CLS_TAIL].count = r->tail_bytes ? r->nslots : 0;
	for (int cls = 0; cls < NCLS; cls++) {
		struct spot_class *c = &r->cls[cls];

		/* A tail is below 2 MiB: at least one a page table, none across two. */
		c->per_pmd = c->size ? (uint32_t)(MP_REGION_CHUNK / c->size) : 1;
		c->spare = calloc(c->count + 1, sizeof(*c->spare));
		c->holes = calloc(c->count + 1, sizeof(*c->holes));
		c->owner = calloc(c->count + 1, sizeof(*c->owner));
		if (!c->spare || !c->holes || !c->owner)
			return -ENOMEM;
		/* Lowest spots on top: early fills get adjacent spots and merge their moves. */
		for (uint32_t i = 0; i < c->count; i++) {
			c->holes[i] = c->count - 1 - i;
			c->owner[i] = OWNER_HOLE;
		}
		c->nholes = c->count;
		off += (uint64_t)((c->count + c->per_pmd - 1) / c->per_pmd) * MP_REGION_CHUNK;
	}
	r->pool_bytes = MP_ALIGN_UP(off, MP_REGION_CHUNK);
	return 0;
}

int mp_region_create(const struct mp_region_config *cfg, const struct mp_region_ops *ops,
		     void *owner, struct mp_region **out)
{
	struct mp_region *r;
	enum uffd_how how = HOW_SYSCALL;
	uint64_t need = (1ull << _UFFDIO_MOVE) | (1ull << _UFFDIO_WAKE);
	int err;

	*out = NULL;
	err = config_check(cfg);
	if (err)
		return err;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	snprintf(r->name, sizeof(r->name), "%s", cfg->name ? cfg->name : "?");
	r->ops = *ops;
	r->owner = owner;
	r->nslots = cfg->nslots;
	r->slot_bytes = cfg->slot_bytes;
	r->data_bytes = cfg->data_bytes;
	r->nfull = (uint32_t)(cfg->data_bytes / MP_REGION_CHUNK);
	r->tail_bytes = cfg->data_bytes % MP_REGION_CHUNK;
	r->nchunks = r->nfull + (r->tail_bytes ? 1 : 0);
	r->numa_node = cfg->numa_node;
	r->bytes = (uint64_t)cfg->nslots * cfg->slot_bytes;
	r->uffd = r->pool_uffd = r->stop_efd = -1;
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->nursery_cv, NULL);

	err = -ENOMEM;
	r->slot_spots = malloc((uint64_t)r->nslots * r->nchunks * sizeof(*r->slot_spots));
	r->slot_mem = calloc(r->nslots, sizeof(*r->slot_mem));
	if (!r->slot_spots || !r->slot_mem)
		goto destroy;
	memset(r->slot_spots, 0xff, (uint64_t)r->nslots * r->nchunks * sizeof(*r->slot_spots));
	if (spots_init(r))
		goto destroy;

	err = mp_uffd_find_how(r, &how);
	if (err)
		goto destroy;
	r->user_mode_only = how == HOW_USER_ONLY;
	err = mp_uffd_probe(r, how, &r->features);
	if (err)
		goto destroy;
	err = r->uffd = mp_uffd_open(r, how, RANGE_FEATURES);
	if (err < 0)
		goto destroy;
	err = r->pool_uffd = mp_uffd_open(r, how, POOL_FEATURES);
	if (err < 0)
		goto destroy;

	err = -ENOMEM;
	r->base = map_aligned(r->bytes, MADV_HUGEPAGE);
	r->pool = map_aligned(r->pool_bytes, MADV_HUGEPAGE);
	r->nursery_bytes = NNURSERY * 2 * MP_REGION_CHUNK;
	r->nursery = map_aligned(r->nursery_bytes, 0);
	if (!r->base || !r->pool || !r->nursery) {
		rlog_err(r, -ENOMEM, "reserving %llu bytes of address space: %s",
			 (unsigned long long)(r->bytes + r->pool_bytes), strerror(errno));
		goto destroy;
	}
	/* Full chunks are born as THPs when the kernel has them; tail nurseries stay 4 KiB. */
	for (int i = 0; i < NNURSERY; i++) {
		char *place = r->nursery + (uint64_t)i * 2 * MP_REGION_CHUNK;

		madvise(place, MP_REGION_CHUNK, MADV_HUGEPAGE);
		madvise(place + MP_REGION_CHUNK, MP_REGION_CHUNK, MADV_NOHUGEPAGE);
	}
	r->cls[CLS_FULL].base = r->pool;
	r->cls[CLS_TAIL].base = r->pool + (uint64_t)r->cls[CLS_FULL].count * MP_REGION_CHUNK;
	/*
	 * Tail spots are not 2 MiB aligned: khugepaged would collapse two
	 * neighbours' pages into one THP, and every move of either then splits
	 * it; on 6.18 such a move once reported less than it moved (the pages
	 * were found in the range, missing from the spot). 4 KiB pages only.
	 */
	if (r->cls[CLS_TAIL].count)
		madvise(r->cls[CLS_TAIL].base, r->pool + r->pool_bytes - r->cls[CLS_TAIL].base,
			MADV_NOHUGEPAGE);
	place_on_node(r, r->nursery, r->nursery_bytes);

	err = mp_uffd_register(r, r->uffd, r->base, r->bytes, need | (1ull << _UFFDIO_POISON));
	if (err)
		goto destroy;
	err = mp_uffd_register(r, r->pool_uffd, r->pool, r->pool_bytes, need);
	if (err)
		goto destroy;
	err = mp_region_handler_start(r);
	if (err)
		goto destroy;
	rlog_debug(r, "range %p+%llu: %u slots of %llu bytes (%llu of data, %u chunks); pool "
		   "%p+%llu; features %#llx", r->base, (unsigned long long)r->bytes, r->nslots,
		   (unsigned long long)r->slot_bytes, (unsigned long long)r->data_bytes,
		   r->nchunks, r->pool, (unsigned long long)r->pool_bytes,
		   (unsigned long long)r->features);
	*out = r;
	return 0;

destroy:
	mp_region_destroy(r);
	return err;
}

void mp_region_stop(struct mp_region *r)
{
	if (r)
		mp_region_handler_stop(r);
}

void mp_region_destroy(struct mp_region *r)
{
	if (!r)
		return;
	mp_region_handler_stop(r);
	/*
	 * Closing the userfaultfds unregisters the ranges and releases any
	 * thread still blocked on them (the owner poisoned what must fail);
	 * only then is it safe to unmap without raising UNMAP events.
	 */
	if (r->uffd >= 0)
		close(r->uffd);
	if (r->pool_uffd >= 0)
		close(r->pool_uffd);
	if (r->base)
		munmap(r->base, r->bytes);
	if (r->pool)
		munmap(r->pool, r->pool_bytes);
	if (r->nursery)
		munmap(r->nursery, r->nursery_bytes);
	for (int cls = 0; cls < NCLS; cls++) {
		free(r->cls[cls].spare);
		free(r->cls[cls].holes);
		free(r->cls[cls].owner);
	}
	free(r->slot_spots);
	free((void *)r->slot_mem);
	pthread_cond_destroy(&r->nursery_cv);
	pthread_mutex_destroy(&r->lock);
	free(r);
}
