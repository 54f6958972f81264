// SPDX-License-Identifier: MIT
/* Memory read bandwidth with an engine's threads: the ceiling a memory-bound GEMV is held to. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <moepager/membw.h>

#include "engine/engine_impl.h"
#include "base/base.h"

#define MEMBW_DEFAULT_BYTES	(256ull << 20)
#define MEMBW_MIN_BYTES		(1ull << 20)
#define MEMBW_DEFAULT_RUNS	5u
#define MEMBW_MAX_RUNS		101u
/* A chunk is big enough to stream, small enough to balance a slowed thread. */
#define MEMBW_CHUNK_BYTES	(4ull << 20)

struct mp_membw {
	struct engine_impl *ei;
	char *buf;
	uint64_t bytes;
	uint32_t nchunks;
	float *sums;		/* one per chunk, so the reads cannot be optimised away */
	double huge;		/* the buffer's share on huge pages, -1 unknown */
};

static int membw_chunk(void *arg, uint32_t chunk, uint32_t worker)
{
	struct mp_membw *m = arg;
	uint64_t c0 = (m->bytes * chunk / m->nchunks) & ~63ull;
	uint64_t c1 = (m->bytes * (chunk + 1) / m->nchunks) & ~63ull;

	if (chunk + 1 == m->nchunks)
		c1 = m->bytes;
	(void)worker;
	m->sums[chunk] = m->ei->kern->read_sum(m->buf + c0, c1 - c0);
	return 0;
}

int mp_membw_open(struct mp_engine *e, uint64_t bytes, struct mp_membw **out)
{
	long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
	struct mp_membw *m;
	int err;

	if (!e || !out)
		return mp_err(-EINVAL, "membw: NULL %s", e ? "out" : "engine");
	if (!bytes)
		bytes = MP_MAX(MEMBW_DEFAULT_BYTES, llc > 0 ? 4ull * (uint64_t)llc : 0);
	if (bytes < MEMBW_MIN_BYTES)
		return mp_err(-EINVAL, "membw: a %llu-byte buffer is under the 1 MiB minimum",
			      (unsigned long long)bytes);
	m = calloc(1, sizeof(*m));
	if (!m)
		return mp_err(-ENOMEM, "membw: out of memory");
	m->ei = engine_impl(e);
	m->bytes = MP_ALIGN_UP(bytes, 64);
	m->nchunks = (uint32_t)MP_MAX(e->threads,
				      (m->bytes + MEMBW_CHUNK_BYTES - 1) / MEMBW_CHUNK_BYTES);
	m->sums = calloc(m->nchunks, sizeof(float));
	/* Huge pages, as the resident weights get (mp_huge_map, the same call). */
	m->buf = mp_huge_map(m->bytes);
	if (!m->sums || !m->buf) {
		err = mp_err(-ENOMEM, "membw: cannot map %llu bytes",
			     (unsigned long long)m->bytes);
		goto free_probe;
	}
	/* Written, so no page is the shared zero page. */
	memset(m->buf, 1, m->bytes);
	m->huge = mp_huge_share(m->buf);
	/* An untimed pass warms the TLB and wakes the pool. */
	err = mp_pool_run(m->ei->pool, NULL, m->nchunks, membw_chunk, m);
	if (err)
		goto free_probe;
	*out = m;
	return 0;

free_probe:
	mp_huge_unmap(m->buf, m->bytes);
	free(m->sums);
	free(m);
	return err;
}

int mp_membw_sample(struct mp_membw *m, double *gbps)
{
	uint64_t t0 = mp_now_ns(), ns;
	int err = mp_pool_run(m->ei->pool, NULL, m->nchunks, membw_chunk, m);

	if (err)
		return err;
	ns = mp_now_ns() - t0;
	*gbps = (double)m->bytes / (double)(ns ? ns : 1);
	return 0;
}

/*
 * The calling thread alone: beside the pool's pass, it tells which of a
 * VM's read-bandwidth modes a sample fell in (two threads reading barely
 * more than one, or about twice as much); docs/engine.md "Session 32".
 */
int mp_membw_sample_one(struct mp_membw *m, double *gbps)
{
	uint64_t t0 = mp_now_ns(), ns;
	float s = m->ei->kern->read_sum(m->buf, m->bytes);

	ns = mp_now_ns() - t0;
	m->sums[0] += s;
	*gbps = (double)m->bytes / (double)(ns ? ns : 1);
	return 0;
}

uint64_t mp_membw_bytes(const struct mp_membw *m)
{
	return m->bytes;
}

double mp_membw_huge_share(const struct mp_membw *m)
{
	return m->huge;
}

void mp_membw_close(struct mp_membw *m)
{
	if (!m)
		return;
	mp_huge_unmap(m->buf, m->bytes);
	free(m->sums);
	free(m);
}

int mp_engine_membw(struct mp_engine *e, uint64_t bytes, uint32_t runs, double *gbps)
{
	double rates[MEMBW_MAX_RUNS];
	struct mp_membw *m;
	int err;

	if (!gbps)
		return mp_err(-EINVAL, "membw: NULL result");
	if (!runs)
		runs = MEMBW_DEFAULT_RUNS;
	if (runs > MEMBW_MAX_RUNS)
		return mp_err(-EINVAL, "membw: %u runs (at most %u)", runs, MEMBW_MAX_RUNS);
	err = mp_membw_open(e, bytes, &m);
	if (err)
		return err;
	for (uint32_t r = 0; r < runs && !err; r++)
		err = mp_membw_sample(m, &rates[r]);
	if (!err) {
		*gbps = mp_median(rates, runs);
	}
	mp_membw_close(m);
	return err;
}
