// SPDX-License-Identifier: MIT
/* Fill workers: read an expert from its tier into pool chunks, verify its checksum, map it. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <moepager/store.h>
#include <moepager/pager.h>

#include "base/base.h"
#include "base/hash.h"
#include "pager/pager_priv.h"
#include "base/probes.h"
#include "tier/inject.h"

/* Pause between read attempts: long enough for a transient fault to pass, short for a reader. */
#define ATTEMPT_PAUSE_NS	(2ull * 1000 * 1000)
/* Reads again of a slot whose fill lost its pages in the map, before its readers get an error. */
#define MAP_LOST_REREADS	2

/* What the tier's callbacks share during one fill. */
struct fill_ctx {
	struct mp_hash *h;
	uint64_t got;
	const atomic_bool *cancel;
	struct mp_pager *p;
	struct slot *s;
	uint32_t slot;
	struct row_origin o;	/* where the bytes come from */
	struct mp_tier *tier;	/* and through which tier */
	bool reserved;		/* the fill's bytes are counted against the budget */
	int room_err;		/* why make_room() failed: not a read error, no retry */
};

/* A prefetch nobody waits for yet makes way while demand reads are running. */
static bool fill_yield(void *arg)
{
	struct fill_ctx *fh = arg;

	return !atomic_load(&fh->s->wanted) && atomic_load(&fh->p->demand_reads) > 0;
}

/* The tier hands bytes over in order while later requests are in flight: hash them now. */
static int fill_ready(void *arg, const void *buf, size_t len)
{
	struct fill_ctx *fh = arg;

	if (atomic_load(fh->cancel))
		return -ECANCELED;
	mp_hash_update(fh->h, buf, len);
	fh->got += len;
	return 0;
}

/* Counts the fill against the budget, evicting what it must first. Called unlocked. */
static int make_room(struct fill_ctx *fh)
{
	int err;

	if (fh->reserved)
		return 0;
	pthread_mutex_lock(&fh->p->lock);
	err = mp_pager_reserve(fh->p, fh->slot);
	if (!err) {
		/* An eviction deferred for this read: its room is coming back. */
		fh->s->fill_reserved = true;
		mp_pager_count_pending(fh->p, fh->s);
	}
	pthread_mutex_unlock(&fh->p->lock);
	fh->reserved = !err;
	fh->room_err = err;
	if (err == -EAGAIN && fh->p->refused)
		fh->p->refused(fh->p, fh->slot, fh->p->refused_arg);
	return err;
}

/* The read is in flight: evictions for its room overlap the device (tier.h issued). */
static int fill_issued(void *arg)
{
	return make_room(arg);
}

/*
 * The memory bound: pages held <= budget + spare_bytes. Read unlocked: a
 * budget changing meanwhile only moves when the eviction happens.
 */
uint64_t mp_pager_mem_limit(const struct mp_pager *p)
{
	return __atomic_load_n(&p->mem.budget, __ATOMIC_RELAXED) + p->mem.spare_bytes;
}

/*
 * Chunks to read into. A demand fill reads before it makes room in the
 * budget, and makes it while its read is in flight, so the eviction is off
 * the waiting thread's critical path: it reads into spare chunks, or new
 * ones while the memory held stays within the budget plus spare_bytes (the
 * victim's chunks then become the next fill's spare ones). A prefetch, or
 * a demand fill without that slack, makes room first, then takes chunks.
 * Returns the segments or -errno.
 */
static int take_chunks(struct worker *w, struct fill_ctx *fh, bool demand)
{
	struct mp_pager *p = w->p;
	int nseg, err;

	/* Fault injection's alloc:enomem rules refuse the memory here (0 otherwise). */
	nseg = mp_tier_inject_alloc(p->tier, fh->s->layer, fh->s->expert);
	if (nseg)
		return nseg;
	if (demand) {
		if (p->taking)
			p->taking(p, p->taking_arg);
		/* Spare chunks, or new ones within the bound (checked as they are taken). */
		nseg = mp_region_slot_alloc(p->region, fh->slot, w->iov, mp_pager_mem_limit(p));
		if (nseg != -ENOSPC)
			return nseg;
	}
	err = make_room(fh);
	if (err)
		return err;
	return mp_region_slot_alloc(p->region, fh->slot, w->iov, MP_REGION_NO_LIMIT);
}

static uint64_t iov_present(const struct iovec *iov, int n)
{
	uint64_t pages = 0;

	for (int i = 0; i < n; i++)
		pages += mp_region_pages_present(iov[i].iov_base, iov[i].iov_len);
	return pages;
}

/*
 * Reads the slot's expert into its chunks with up to read_attempts tries.
 * Every attempt is checked against the store's checksum, whatever the tier.
 * Returns 0 or the last attempt's error. Called unlocked.
 */
static int read_expert(struct worker *w, struct fill_ctx *fh, int nseg, bool prefetch)
{
	struct mp_pager *p = w->p;
	struct slot *s = fh->s;
	const struct row_origin *x = &fh->o;
	struct mp_tier *tier = fh->tier;
	struct mp_tier_read rd = {
		.layer = s->layer,
		.expert = x->expert,
		.offset = x->offset,
		.bytes = p->expert_bytes,
		.checksum = x->checksum,
		.iov = w->iov,
		.iovcnt = (unsigned)nseg,
		.io = w->io,
		.ready = fill_ready,
		.arg = fh,
		.cancel = &p->closing,
		.yield = prefetch ? fill_yield : NULL,
		.yield_arg = fh,
		.issued = fh->reserved ? NULL : fill_issued,
		.issued_arg = fh,
	};
	int err = 0;

	for (uint32_t attempt = 1; attempt <= p->read_attempts; attempt++) {
		uint64_t sum;

		mp_hash_reset(w->hash);
		fh->got = 0;
		err = mp_tier_read(tier, &rd);
		if (!err && fh->got != p->expert_bytes)
			err = mp_err(-ENODATA, "layer %u expert %u: tier %s delivered %llu of %llu "
				     "bytes", s->layer, s->expert, tier->name,
				     (unsigned long long)fh->got,
				     (unsigned long long)p->expert_bytes);
		if (!err) {
			sum = mp_hash_digest(w->hash);
			if (sum != x->checksum)
				err = mp_err(-EBADMSG, "layer %u expert %u: checksum mismatch "
					     "reading %s at offset %llu (stored %016llx, computed "
					     "%016llx)", s->layer, s->expert, tier->name,
					     (unsigned long long)x->offset,
					     (unsigned long long)x->checksum,
					     (unsigned long long)sum);
		}
		if (!err || err == -ECANCELED || fh->room_err || atomic_load(&p->closing))
			break;
		if (err == -EFAULT)
			plog_err(p, err, "layer %u expert %u: the read's destination is not all "
				 "there: %llu of %llu pages of its chunks present", s->layer,
				 s->expert, (unsigned long long)iov_present(w->iov, nseg),
				 (unsigned long long)(p->data_bytes / 4096));
		pthread_mutex_lock(&p->lock);
		p->st.read_errors++;
		pthread_mutex_unlock(&p->lock);
		plog_warn(p, "layer %u expert %u: read attempt %u of %u from %s failed: %s",
			  s->layer, s->expert, attempt, p->read_attempts, tier->name,
			  strerror(-err));
		if (attempt < p->read_attempts) {
			struct timespec ts = { 0, (long)(ATTEMPT_PAUSE_NS * attempt) };

			nanosleep(&ts, NULL);
		}
	}
	return err;
}

/* MAPPED but lost (zapped behind our back): drop what is left. Called locked. */
static void repair(struct mp_pager *p, uint32_t slot)
{
	struct slot *s = &p->slots[slot];

	s->state = ST_BUSY;
	s->busy_op = BUSY_DROP;
	pthread_mutex_unlock(&p->lock);
	mp_region_slot_discard(p->region, slot);
	pthread_mutex_lock(&p->lock);
	s->lost = false;
	s->state = ST_EMPTY;
	p->mem.mapped_n--;
	mp_pager_unreserve(p, slot);
	if (p->evict.ops->on_remove)
		p->evict.ops->on_remove(&p->evict, slot);
	s->refault = false;
	if (s->gone)
		mp_pager_release_waiters(p, s, -EFAULT);
}

void mp_pager_fill(struct worker *w, uint32_t slot, enum queue_class cls)
{
	struct mp_pager *p = w->p;
	struct slot *s = &p->slots[slot];
	struct fill_ctx fh = { .h = w->hash, .cancel = &p->closing, .p = p, .s = s,
				.slot = slot, .o = p->origin[slot],
				.tier = mp_pager_row_tier(p, slot) };
	uint64_t begin = mp_now_ns(), t_read, t_map;
	bool prefetch = cls == Q_PREFETCH, counted, map_lost = false;
	uint8_t pending;
	int nseg, err;

	s->state = ST_FILLING;
	s->prefetched = prefetch && !s->waiters;
	atomic_store(&s->wanted, !s->prefetched);
	p->q.fills++;
	pthread_mutex_unlock(&p->lock);

	if (!prefetch)
		atomic_fetch_add(&p->demand_reads, 1);
	nseg = take_chunks(w, &fh, !prefetch);
	t_read = mp_now_ns();
	err = nseg < 0 ? nseg : read_expert(w, &fh, nseg, prefetch);
	if (!prefetch)
		atomic_fetch_sub(&p->demand_reads, 1);
	t_map = mp_now_ns();
	/* A tier that never said its read was in flight: make room now. */
	if (!err)
		err = make_room(&fh);
	if (!err && atomic_load(&p->closing))
		err = -ESHUTDOWN;
	if (!err) {
		err = mp_region_slot_map(p->region, slot);
		map_lost = err == -EFAULT;
	}
	if (!err)
		plog_debug(p, "layer %u expert %u: %s fill: chunks (and budget) %.0f us, "
			   "read+verify (and budget) %.0f us (%.2f GB/s), map %.0f us", s->layer,
			   s->expert, prefetch ? "prefetch" : "demand",
			   (double)(t_read - begin) / 1e3, (double)(t_map - t_read) / 1e3,
			   (double)p->expert_bytes / (double)(t_map - t_read),
			   (double)(mp_now_ns() - t_map) / 1e3);

	/*
	 * The slot is FILLING: nobody else touches its chunks. Unlocked, as a
	 * discard of a slot the failed map left in the range zaps it, and the
	 * handler that must read that REMOVE event may be waiting for the lock.
	 */
	if (err && nseg > 0 && err != -EFAULT)
		mp_region_slot_free(p->region, slot);
	else if (err == -EFAULT)
		mp_region_slot_discard(p->region, slot);
	pthread_mutex_lock(&p->lock);
	s->fill_reserved = false;
	if (err) {
		mp_pager_count_pending(p, s);
		if (fh.reserved)
			mp_pager_unreserve(p, slot);
		goto failed;
	}
	s->state = ST_MAPPED;
	s->mapped_at = mp_now_ns();
	s->remaps = 0;
	p->mem.mapped_n++;
	p->st.bytes_file += p->expert_bytes;
	/* Prefetch reads may yield to these: only demand reads time the device. */
	if (!prefetch) {
		p->st.file_reads++;
		p->st.file_read_ns += t_map - t_read;
	}
	if (p->evict.ops->on_insert)
		p->evict.ops->on_insert(&p->evict, slot);
	if (s->waiters)
		s->demanded = true;
	mp_pager_release_waiters(p, s, 0);
	if (prefetch)
		MP_PROBE(prefetch_done, s->layer, s->expert, p->tier->number,
			 mp_now_ns() - s->prefetch_at, 0);
	p->q.fills--;
	/*
	 * The deferred eviction is this read's: taken off the slot now, as it
	 * may be evicted and read again (and marked again) while the lock is
	 * dropped for the wake. Its room stays counted as coming until then.
	 */
	pending = s->evict_pending;
	counted = s->drop_counted;
	s->evict_pending = PENDING_NONE;
	s->drop_counted = false;
	pthread_cond_broadcast(&p->state_cv);
	pthread_mutex_unlock(&p->lock);
	mp_region_slot_wake(p->region, slot);
	pthread_mutex_lock(&p->lock);
	/* Before the budget picks a victim: this one frees its share. */
	mp_pager_evict_pending(p, slot, pending, counted);
	if (p->mem.resident > p->mem.budget)
		mp_pager_enforce_budget(p);
	return;

failed:
	p->q.fills--;
	if (err == -ECANCELED)
		err = -ESHUTDOWN;
	if (prefetch)
		MP_PROBE(prefetch_done, s->layer, s->expert, p->tier->number,
			 mp_now_ns() - s->prefetch_at, err);
	s->prefetched = false;
	/*
	 * A prefetch refused admission (-EAGAIN from mp_pager_reserve()) read
	 * nothing, and the expert is fine: a thread that faulted on it after the
	 * refusal, before this lock, gets a demand fill, which is never refused.
	 */
	if (fh.room_err == -EAGAIN && s->waiters && !atomic_load(&p->closing)) {
		/* An eviction asked for meanwhile waits for that fill (a thread waits). */
		s->state = ST_EMPTY;
		mp_pager_demand_fill(p, slot);
		pthread_cond_broadcast(&p->state_cv);
		return;
	}
	/* Nothing was mapped: an eviction asked for during the read has nothing to do. */
	s->evict_pending = PENDING_NONE;
	/*
	 * The read was good, its map lost the pages (the region said why) and
	 * the discard above emptied the slot: a thread that waits gets a fresh
	 * read, as mp_pager_map_locked()'s lost slots do. Bounded: a slot that
	 * keeps losing its pages poisons its readers.
	 */
	if (map_lost && (s->waiters || cls == Q_DEMAND) && s->remaps < MAP_LOST_REREADS &&
	    !atomic_load(&p->closing)) {
		plog_warn(p, "layer %u expert %u: its pages were lost while mapped; reading it "
			  "again", s->layer, s->expert);
		s->remaps++;
		s->state = ST_EMPTY;
		s->demanded = true;
		mp_pager_enqueue(p, slot, Q_DEMAND, 0);
		pthread_cond_broadcast(&p->state_cv);
		return;
	}
	s->remaps = 0;
	/*
	 * A thread waits, or will (demand): poison, so it gets an error now
	 * rather than a fault that blocks forever. An unwanted prefetch just
	 * leaves the expert out; a later touch reads it again.
	 */
	if (s->waiters || cls == Q_DEMAND || err == -ESHUTDOWN) {
		plog_err(p, err, "layer %u expert %u: cannot be read (%s) after %.1f ms; its "
			 "readers get an error", s->layer, s->expert, strerror(-err),
			 (double)(mp_now_ns() - begin) / 1e6);
		mp_pager_poison_locked(p, slot, err);
	} else {
		s->state = ST_EMPTY;
		pthread_cond_broadcast(&p->state_cv);
	}
}

static void run_job(struct worker *w, uint32_t slot, enum queue_class cls)
{
	struct mp_pager *p = w->p;
	struct slot *s = &p->slots[slot];

	if (s->state == ST_MAPPED && s->lost) {
		repair(p, slot);
		if (s->gone || (!s->waiters && !s->demanded))
			return;
		cls = Q_DEMAND;
	}
	switch (s->state) {
	case ST_EMPTY:
		mp_pager_fill(w, slot, cls);
		break;
	case ST_HOST:
		/* A host-tier expert to map: routed, prefetched, or deferred by the handler. */
		if (cls == Q_PREFETCH)
			s->prefetched = !s->waiters;
		mp_pager_map_locked(p, slot);
		break;
	default:
		/* Resident, being read or poisoned since it was queued: nothing to do. */
		break;
	}
}

/*
 * While the pool fills up, an idle worker creates a spare chunk ahead of
 * need (up to spare_bytes of spares, within the memory bound), so the next
 * fill does not create its own before its read: on ds26 the pool's first
 * fill made demand fills spend 2.9 s creating chunks while reads waited
 * (docs/region.md). One chunk a call, so a job queued meanwhile waits for
 * at most one. Called locked; true when it created one.
 */
static bool grow_spares(struct mp_pager *p)
{
	uint32_t want = (uint32_t)MP_MIN(p->mem.spare_bytes / p->data_bytes, UINT32_MAX);
	int ret;

	if (!want || p->mem.no_ahead || p->broken || atomic_load(&p->closing))
		return false;
	pthread_mutex_unlock(&p->lock);
	ret = mp_region_grow_spares(p->region, want, mp_pager_mem_limit(p));
	pthread_mutex_lock(&p->lock);
	if (ret < 0)
		p->mem.no_ahead = true;
	return ret > 0;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct mp_pager *p = w->p;
	bool grow = true;	/* idle, it may create a spare chunk before it sleeps */
	sigset_t all;

	/* Application signals go to its own threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	/* Woken by each batch of completions, it must resubmit before the queue runs dry. */
	mp_thread_short_slice();
	pthread_mutex_lock(&p->lock);
	while (!atomic_load(&p->closing)) {
		enum queue_class cls;
		uint32_t slot;

		if (mp_pager_dequeue(p, &slot, &cls)) {
			/* It may drop the lock: a job queued meanwhile signalled nobody. */
			if (grow) {
				grow = grow_spares(p);
				continue;
			}
			pthread_cond_wait(&p->work_cv, &p->lock);
			grow = true;
			continue;
		}
		p->q.jobs++;
		run_job(w, slot, cls);
		p->q.jobs--;
		if (cls == Q_PREFETCH)
			p->q.prefetch_fills--;
		mp_pager_after_idle(p);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* A ring, destination segments and a hash state: what reading an expert takes. */
static int worker_init(struct mp_pager *p, struct worker *w, uint32_t id)
{
	w->p = p;
	w->id = id;
	w->iov = calloc(mp_region_chunks(p->region), sizeof(*w->iov));
	w->hash = mp_hash_new();
	if (!w->iov || !w->hash)
		return -ENOMEM;
	return mp_io_open(p->io_depth, &w->io);
}

static void worker_fini(struct worker *w)
{
	mp_io_close(w->io);
	free(w->iov);
	mp_hash_free(w->hash);
}

int mp_pager_workers_start(struct mp_pager *p)
{
	int err;

	if (p->caller_resolves) {
		err = worker_init(p, &p->caller, p->nworkers);
		if (err)
			return err;
	}
	p->workers = calloc(p->nworkers, sizeof(*p->workers));
	if (!p->workers)
		return -ENOMEM;
	for (uint32_t i = 0; i < p->nworkers; i++) {
		struct worker *w = &p->workers[i];
		char name[16];

		err = worker_init(p, w, i);
		if (err)
			return err;
		err = pthread_create(&w->thread, NULL, worker_main, w);
		if (err)
			return plog_err(p, -err, "starting fill worker %u: %s", i, strerror(err));
		w->started = true;
		snprintf(name, sizeof(name), "mp-fill%u", i % 100u);
		pthread_setname_np(w->thread, name);
	}
	return 0;
}

uint64_t mp_pager_fill_cpu_ns(struct mp_pager *p)
{
	uint64_t ns = 0;

	/* The workers array is fixed between start and stop, the span stats are read in. */
	for (uint32_t i = 0; p->workers && i < p->nworkers; i++) {
		struct timespec ts;
		clockid_t cid;

		if (!p->workers[i].started || pthread_getcpuclockid(p->workers[i].thread, &cid) ||
		    clock_gettime(cid, &ts))
			continue;
		ns += (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	}
	return ns;
}

void mp_pager_workers_stop(struct mp_pager *p)
{
	if (p->workers) {
		pthread_mutex_lock(&p->lock);
		pthread_cond_broadcast(&p->work_cv);
		pthread_cond_broadcast(&p->state_cv);
		pthread_mutex_unlock(&p->lock);
		for (uint32_t i = 0; i < p->nworkers; i++) {
			struct worker *w = &p->workers[i];

			if (w->started)
				pthread_join(w->thread, NULL);
			worker_fini(w);
		}
		free(p->workers);
		p->workers = NULL;
	}
	worker_fini(&p->caller);
	memset(&p->caller, 0, sizeof(p->caller));
}
