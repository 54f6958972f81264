/* SPDX-License-Identifier: MIT */
/*
 * Memory bandwidth probes for benchmarks: what the engine's threads read per
 * second, the bound a memory-bound decode step is compared with. Not part of
 * what an engine needs, so <moepager.h> does not include this header.
 */
#ifndef MOEPAGER_MEMBW_H
#define MOEPAGER_MEMBW_H

#include <moepager/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Memory read bandwidth with this engine's threads and kernels: timed
 * streaming read-sums over a buffer larger than the last-level cache, the
 * ceiling a memory-bound GEMV is held to. A probe keeps its buffer so that
 * single passes can be interleaved with the work they are compared with.
 */
struct mp_membw;

/*
 * Maps and fills `bytes` (0: 256 MiB, at least 4x the last-level cache) on
 * 2 MiB-aligned memory advised for transparent huge pages, as the engine's
 * resident weights are, and runs one untimed pass. Returns 0 and sets *out,
 * -EINVAL (under 1 MiB) or -ENOMEM.
 */
MP_API int mp_membw_open(struct mp_engine *e, uint64_t bytes, struct mp_membw **out);
/* One timed pass over the buffer: sets *gbps (1e9 bytes/s). Returns 0 or -errno. */
MP_API int mp_membw_sample(struct mp_membw *m, double *gbps);
/* One timed pass on the calling thread only (none of the pool's): sets *gbps. Returns 0. */
MP_API int mp_membw_sample_one(struct mp_membw *m, double *gbps);
/*
 * The compute probe beside the read one: one timed sample of the engine's
 * own bf16 product (its reference kernels' gemm) on a 64 x 2048 matrix in L2
 * against 6 vectors, the AVX-512 kernels' widest register tile, on every
 * thread of the pool; sets *gmacs to the multiply-adds (weight x
 * activation) per second, in 1e9. Its work over this rate is the fastest a
 * step can compute, as its bytes over the read bandwidth are the fastest it
 * can read (docs/engine.md "Session 34"). Returns 0 or -errno.
 */
MP_API int mp_membw_fma_sample(struct mp_membw *m, double *gmacs);
/* The same on the calling thread only: sets *gmacs. Returns 0. */
MP_API int mp_membw_fma_sample_one(struct mp_membw *m, double *gmacs);
MP_API uint64_t mp_membw_bytes(const struct mp_membw *m);
/*
 * The share (0..1) of the buffer's memory the kernel put on huge pages when
 * it was filled, as /proc/self/smaps counts it; -1 when smaps is unreadable.
 */
MP_API double mp_membw_huge_share(const struct mp_membw *m);
MP_API void mp_membw_close(struct mp_membw *m);

/* Opens a probe, takes the median of `runs` passes (0: 5, at most 101), closes it. */
MP_API int mp_engine_membw(struct mp_engine *e, uint64_t bytes, uint32_t runs, double *gbps);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_MEMBW_H */
