// SPDX-License-Identifier: MIT
/*
 * Memory read bandwidth with an engine's threads: the ceiling a memory-bound
 * GEMV is held to; and beside it the rate of the engine's own bf16 product on
 * weights in cache, the ceiling a compute-bound one is held to.
 */
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
/*
 * The compute probe: a bf16 matrix of FMA_ROWS x FMA_COLS (256 KiB, in L2)
 * against FMA_VECTORS vectors, the AVX-512 kernels' widest register tile
 * (4 rows x 6 vectors), so the product runs at its best multiply-add rate;
 * FMA_CALLS products a thread a sample (8e8 multiply-adds, ~15 ms).
 */
#define FMA_ROWS		64u
#define FMA_COLS		2048u
#define FMA_VECTORS		6u
#define FMA_CALLS		1024u

struct mp_membw {
	struct engine_impl *ei;
	char *buf;
	uint64_t bytes;
	uint32_t nchunks;
	float *sums;		/* one per chunk, so the reads cannot be optimised away */
	double huge;		/* the buffer's share on huge pages, -1 unknown */
	/* The compute probe's weights, prepared vectors and one output block per chunk. */
	uint16_t *fw;
	float *fx;
	float *fy;
	uint32_t fchunks;
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

/* FMA_CALLS products of the probe's matrix, into the chunk's own outputs. */
static int fma_chunk(void *arg, uint32_t chunk, uint32_t worker)
{
	struct mp_membw *m = arg;
	float *y = m->fy + (size_t)chunk * FMA_VECTORS * FMA_ROWS;

	(void)worker;
	for (uint32_t i = 0; i < FMA_CALLS; i++)
		m->ei->kern->gemm[MP_DTYPE_BF16](m->fw, FMA_ROWS, FMA_COLS, m->fx, FMA_VECTORS,
						 y, FMA_ROWS);
	return 0;
}

/*
 * Weights and activations in (-1, 1), no subnormals (which some units take
 * slowly), from a fixed LCG; the activations put in the kernel's order.
 */
static int fma_fill(struct mp_membw *m)
{
	const size_t nx = (size_t)FMA_VECTORS * FMA_COLS;
	float *x = malloc(nx * sizeof(*x));
	uint32_t s = 12345;

	if (!x)
		return -ENOMEM;
	for (size_t i = 0; i < (size_t)FMA_ROWS * FMA_COLS; i++) {
		s = s * 1664525u + 1013904223u;
		m->fw[i] = mp_f32_to_bf16((float)(s >> 8) / (float)(1u << 23) - 1.0f);
	}
	for (size_t i = 0; i < nx; i++) {
		s = s * 1664525u + 1013904223u;
		x[i] = (float)(s >> 8) / (float)(1u << 23) - 1.0f;
	}
	if (m->ei->kern->xprep[MP_DTYPE_BF16])
		m->ei->kern->xprep[MP_DTYPE_BF16](x, FMA_VECTORS, FMA_COLS, m->fx);
	else
		memcpy(m->fx, x, nx * sizeof(*x));
	free(x);
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
	m->fchunks = e->threads;
	m->fw = aligned_alloc(64, (size_t)FMA_ROWS * FMA_COLS * sizeof(*m->fw));
	m->fx = aligned_alloc(64, (size_t)FMA_VECTORS * FMA_COLS * sizeof(*m->fx));
	m->fy = calloc((size_t)m->fchunks * FMA_VECTORS * FMA_ROWS, sizeof(*m->fy));
	/* Huge pages, as the resident weights get (mp_huge_map, the same call). */
	m->buf = mp_huge_map(m->bytes);
	if (!m->buf) {
		err = mp_err(-ENOMEM, "membw: cannot map %llu bytes",
			     (unsigned long long)m->bytes);
		goto free_probe;
	}
	if (!m->sums || !m->fw || !m->fx || !m->fy || fma_fill(m)) {
		err = mp_err(-ENOMEM, "membw: out of memory for the probes' sums and %u x %u FMA matrix",
			     FMA_ROWS, FMA_COLS);
		goto free_probe;
	}
	/* Written, so no page is the shared zero page. */
	memset(m->buf, 1, m->bytes);
	m->huge = mp_huge_share(m->buf);
	/* An untimed pass warms the TLB and wakes the pool. */
	err = mp_pool_run(m->ei->pool, NULL, m->nchunks, membw_chunk, m);
	if (!err)
		err = mp_pool_run(m->ei->pool, NULL, m->fchunks, fma_chunk, m);
	if (err)
		goto free_probe;
	*out = m;
	return 0;

free_probe:
	mp_huge_unmap(m->buf, m->bytes);
	free(m->sums);
	free(m->fw);
	free(m->fx);
	free(m->fy);
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

/* Multiply-adds of a sample's products on `chunks` threads, over ns: 1e9 a second. */
static double fma_rate(uint32_t chunks, uint64_t ns)
{
	const double macs = (double)chunks * FMA_CALLS * FMA_ROWS * FMA_COLS * FMA_VECTORS;

	return macs / (double)(ns ? ns : 1);
}

int mp_membw_fma_sample(struct mp_membw *m, double *gmacs)
{
	uint64_t t0 = mp_now_ns();
	int err = mp_pool_run(m->ei->pool, NULL, m->fchunks, fma_chunk, m);

	if (err)
		return err;
	*gmacs = fma_rate(m->fchunks, mp_now_ns() - t0);
	return 0;
}

int mp_membw_fma_sample_one(struct mp_membw *m, double *gmacs)
{
	uint64_t t0 = mp_now_ns();

	fma_chunk(m, 0, 0);
	*gmacs = fma_rate(1, mp_now_ns() - t0);
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
	free(m->fw);
	free(m->fx);
	free(m->fy);
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
