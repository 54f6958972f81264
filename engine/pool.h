/* SPDX-License-Identifier: MIT */
/* A persistent thread pool that runs one batch of chunks at a time, cheaply woken. */
#ifndef MP_POOL_H
#define MP_POOL_H

#include <stdint.h>

#include <moepager/engine.h>

struct mp_pool;

/*
 * Starts threads - 1 workers (the caller of mp_pool_run() is worker 0).
 * Returns 0, -EINVAL (threads 0 or above 1024) or the pthread error.
 */
int mp_pool_create(uint32_t threads, struct mp_pool **out);
/* Stops and joins the workers. NULL is allowed. */
void mp_pool_destroy(struct mp_pool *p);
uint32_t mp_pool_threads(const struct mp_pool *p);

/*
 * Runs fn(ctx, chunk, worker) for every chunk in [0, nchunks), each under g
 * when g is not NULL, and returns when all have finished: 0, or the first
 * error a chunk (or its guard) returned; chunks not started after an error
 * are skipped. One caller at a time.
 */
int mp_pool_run(struct mp_pool *p, const struct mp_guard *g, uint32_t nchunks, mp_chunk_fn fn,
		void *ctx);

#endif /* MP_POOL_H */
