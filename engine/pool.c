// SPDX-License-Identifier: MIT
/* Persistent thread pool: one atomic store publishes a job; workers spin, then futex-wait. */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <moepager/engine.h>

#include "base/base.h"
#include "engine/pool.h"

#define POOL_MAX_THREADS	1024u
/*
 * Pauses a worker spins on the job word before it sleeps: ~50-100 us, long
 * enough to bridge the serial work between two ops of a decode step without
 * a futex round trip, short enough not to burn a shared CPU while idle.
 */
#define WORKER_SPINS		4096u
/* The caller waits at most one chunk's time for the others; spin a while first. */
#define CALLER_SPINS		16384u
#define CLAIM_CLOSED		0xffffffffu
/*
 * Both spins yield the CPU every this many pauses (a few us): with fewer cores
 * than runnable threads, a pager fill thread woken on a spinning pool
 * thread's CPU runs at once instead of after the spin; with nothing else
 * runnable sched_yield() returns at once. 64 measured best of 0/64/256 on
 * tiny-real (docs/prefetch.md), resident decode unchanged.
 */
#define SPIN_YIELD_EVERY	64u

struct worker {
	struct mp_pool *pool;
	uint32_t index;
	pthread_t tid;
};

struct mp_pool {
	uint32_t threads;
	uint32_t started;		/* workers running (threads - 1 once created) */
	uint32_t gen_local;		/* caller's copy of gen */
	struct worker *workers;

	/* The job; written by the caller only while no chunk of it can be claimed. */
	mp_chunk_fn fn;
	void *ctx;
	struct mp_guard guard;
	bool guarded;
	_Atomic uint32_t nchunks;

	/*
	 * (generation << 32) | next chunk. A worker claims a chunk by CAS on
	 * this word with the generation it was woken for, so a worker late for
	 * one job can never claim a chunk of the next.
	 */
	_Alignas(64) _Atomic uint64_t claim;
	_Alignas(64) _Atomic uint32_t gen;	/* futex word the workers sleep on */
	_Atomic uint32_t sleepers;
	_Atomic bool stop;
	_Alignas(64) _Atomic uint32_t done;	/* chunks finished; futex word of the caller */
	_Atomic uint32_t caller_waiting;
	_Atomic int err;			/* first chunk error of the job */
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static inline void spin_pause(uint32_t i)
{
	if (i % SPIN_YIELD_EVERY == SPIN_YIELD_EVERY - 1)
		sched_yield();
	else
		cpu_relax();
}

static void futex_wait(_Atomic uint32_t *word, uint32_t val)
{
	/* EAGAIN (word changed) and EINTR just send the caller back to its check. */
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word, int n)
{
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

struct chunk_call {
	mp_chunk_fn fn;
	void *ctx;
	uint32_t chunk;
	uint32_t worker;
};

static int chunk_trampoline(void *arg)
{
	struct chunk_call *c = arg;

	return c->fn(c->ctx, c->chunk, c->worker);
}

static int run_one(mp_chunk_fn fn, void *ctx, const struct mp_guard *g, uint32_t chunk,
		   uint32_t worker)
{
	struct chunk_call c = { fn, ctx, chunk, worker };

	if (!g)
		return fn(ctx, chunk, worker);
	return g->wrap(g->wctx, chunk_trampoline, &c);
}

/* Claims and runs chunks of job generation gen until none are left. */
static void run_chunks(struct mp_pool *p, uint32_t gen, uint32_t worker)
{
	for (;;) {
		uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
		uint32_t idx, n;
		int ret = 0;

		do {
			idx = (uint32_t)c;
			n = atomic_load_explicit(&p->nchunks, memory_order_relaxed);
			if ((uint32_t)(c >> 32) != gen || idx >= n)
				return;
		} while (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1,
								memory_order_acq_rel,
								memory_order_acquire));

		/* The claim pins the job: the caller rewrites it only after this chunk is done. */
		if (!atomic_load_explicit(&p->err, memory_order_relaxed))
			ret = run_one(p->fn, p->ctx, p->guarded ? &p->guard : NULL, idx, worker);
		if (ret) {
			int zero = 0;

			atomic_compare_exchange_strong(&p->err, &zero, ret < 0 ? ret : -EIO);
		}
		if (atomic_fetch_add(&p->done, 1) + 1 == n &&
		    atomic_load(&p->caller_waiting))
			futex_wake(&p->done, 1);
	}
}

static uint32_t wait_for_job(struct mp_pool *p, uint32_t seen)
{
	uint32_t g;

	for (uint32_t i = 0; i < WORKER_SPINS; i++) {
		g = atomic_load_explicit(&p->gen, memory_order_acquire);
		if (g != seen)
			return g;
		spin_pause(i);
	}
	/* sleepers is raised before the last check so the publisher's wake cannot be missed. */
	atomic_fetch_add(&p->sleepers, 1);
	while ((g = atomic_load(&p->gen)) == seen)
		futex_wait(&p->gen, seen);
	atomic_fetch_sub(&p->sleepers, 1);
	return g;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct mp_pool *p = w->pool;
	uint32_t seen = 0;

	for (;;) {
		seen = wait_for_job(p, seen);
		if (atomic_load(&p->stop))
			break;
		run_chunks(p, seen, w->index);
	}
	return NULL;
}

static void publish(struct mp_pool *p, uint32_t gen)
{
	atomic_store(&p->gen, gen);
	if (atomic_load(&p->sleepers))
		futex_wake(&p->gen, INT_MAX);
}

int mp_pool_create(uint32_t threads, struct mp_pool **out)
{
	struct mp_pool *p;
	int err;

	if (!threads || threads > POOL_MAX_THREADS)
		return mp_err(-EINVAL, "thread pool: %u threads is outside [1, %u]", threads,
			      POOL_MAX_THREADS);
	p = aligned_alloc(64, MP_ALIGN_UP(sizeof(*p), 64));
	if (!p)
		return mp_err(-ENOMEM, "thread pool: out of memory");
	memset(p, 0, sizeof(*p));
	p->threads = threads;
	atomic_init(&p->claim, (uint64_t)CLAIM_CLOSED);
	p->workers = calloc(threads, sizeof(*p->workers));
	if (!p->workers) {
		err = mp_err(-ENOMEM, "thread pool: out of memory for %u workers", threads);
		goto free_pool;
	}
	for (uint32_t i = 1; i < threads; i++) {
		p->workers[i].pool = p;
		p->workers[i].index = i;
		err = -pthread_create(&p->workers[i].tid, NULL, worker_main, &p->workers[i]);
		if (err) {
			mp_err(err, "thread pool: starting worker %u of %u: %s", i, threads,
			       strerror(-err));
			goto stop_workers;
		}
		p->started++;
	}
	*out = p;
	return 0;

stop_workers:
	mp_pool_destroy(p);
	return err;
free_pool:
	free(p);
	return err;
}

void mp_pool_destroy(struct mp_pool *p)
{
	if (!p)
		return;
	atomic_store(&p->stop, true);
	publish(p, ++p->gen_local);
	for (uint32_t i = 1; i <= p->started; i++)
		pthread_join(p->workers[i].tid, NULL);
	free(p->workers);
	free(p);
}

uint32_t mp_pool_threads(const struct mp_pool *p)
{
	return p->threads;
}

int mp_pool_run(struct mp_pool *p, const struct mp_guard *g, uint32_t nchunks, mp_chunk_fn fn,
		void *ctx)
{
	uint32_t gen, spins = 0;
	int err;

	if (!nchunks)
		return 0;
	if (p->threads == 1 || nchunks == 1) {
		/* Nothing to share: skip the wake-up and run inline. */
		for (uint32_t i = 0; i < nchunks; i++) {
			err = run_one(fn, ctx, g, i, 0);
			if (err)
				return err < 0 ? err : -EIO;
		}
		return 0;
	}

	p->fn = fn;
	p->ctx = ctx;
	p->guarded = g != NULL;
	if (g)
		p->guard = *g;
	atomic_store_explicit(&p->nchunks, nchunks, memory_order_relaxed);
	atomic_store_explicit(&p->done, 0, memory_order_relaxed);
	atomic_store_explicit(&p->err, 0, memory_order_relaxed);
	gen = ++p->gen_local;
	atomic_store_explicit(&p->claim, (uint64_t)gen << 32, memory_order_release);
	publish(p, gen);

	run_chunks(p, gen, 0);

	while (atomic_load_explicit(&p->done, memory_order_acquire) != nchunks) {
		if (spins < CALLER_SPINS) {
			spin_pause(spins++);
			continue;
		}
		atomic_store(&p->caller_waiting, 1);
		uint32_t d = atomic_load(&p->done);

		if (d != nchunks)
			futex_wait(&p->done, d);
		atomic_store(&p->caller_waiting, 0);
	}
	/* Close the job so a worker late to it cannot claim a chunk of the next one. */
	atomic_store_explicit(&p->claim, ((uint64_t)gen << 32) | CLAIM_CLOSED,
			      memory_order_release);
	return atomic_load(&p->err);
}
