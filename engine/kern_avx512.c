// SPDX-License-Identifier: MIT
/* AVX-512 kernels (F+BW+VL): 16-lane f32 FMAs, bf16/f16/q8_0/q4_0 widened in registers, masked tails. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "engine/kernels.h"
#include "engine/kern_reduce.h"
#include "base/base.h"

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define UNROLL _Pragma("GCC unroll 8")
/* In the kernels' loops: a call there would spill every vector register (all caller-saved). */
#define ALWAYS_INLINE __attribute__((always_inline))

/*
 * Loads of 16 weights widened to f32. Masked loads do not touch (or fault
 * on) the lanes they leave out, so tails never read past a row.
 */
static inline TARGET __m512 ld_f32(const void *p, size_t i)
{
	return _mm512_loadu_ps((const float *)p + i);
}

static inline TARGET __m512 ldm_f32(const void *p, size_t i, __mmask16 m)
{
	return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

static inline TARGET __m512 widen_bf16_16(__m256i h)
{
	return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline TARGET __m512 ld_bf16(const void *p, size_t i)
{
	return widen_bf16_16(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
}

static inline TARGET __m512 ldm_bf16(const void *p, size_t i, __mmask16 m)
{
	return widen_bf16_16(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
}

static inline TARGET __m512 ld_f16(const void *p, size_t i)
{
	return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
}

static inline TARGET __m512 ldm_f16(const void *p, size_t i, __mmask16 m)
{
	return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
}

/*
 * The block types: 16 elements at i (a multiple of 16, so inside one
 * block), each (float)q * d as mp_dtype_to_f32() computes it. Rows are
 * whole blocks, so the masked loads below only ever see full masks (they
 * read all 16 elements and zero the lanes outside the mask).
 */
static inline TARGET __m512 block_scale(const uint8_t *b)
{
	uint16_t h;

	memcpy(&h, b, sizeof(h));
	return _mm512_set1_ps(_cvtsh_ss(h));
}

static inline TARGET __m512 ld_q8_0(const void *p, size_t i)
{
	const uint8_t *b = (const uint8_t *)p + i / MP_QBLOCK * MP_Q8_0_BYTES;
	__m128i q = _mm_loadu_si128((const __m128i *)(b + 2 + i % MP_QBLOCK));

	return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), block_scale(b));
}

static inline TARGET __m512 ldm_q8_0(const void *p, size_t i, __mmask16 m)
{
	return _mm512_maskz_mov_ps(m, ld_q8_0(p, i));
}

static inline TARGET __m512 ld_q4_0(const void *p, size_t i)
{
	const uint8_t *b = (const uint8_t *)p + i / MP_QBLOCK * MP_Q4_0_BYTES;
	/* q - 8 for each nibble value q: vpermps looks them up by an index's low 4 bits */
	const __m512 values = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
	/* elements 0-15 are the low nibbles of the block's 16 bytes, 16-31 the high ones */
	__m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));

	if (i % MP_QBLOCK >= MP_QBLOCK / 2)
		q = _mm512_srli_epi32(q, 4);
	return _mm512_mul_ps(_mm512_permutexvar_ps(q, values), block_scale(b));
}

static inline TARGET __m512 ldm_q4_0(const void *p, size_t i, __mmask16 m)
{
	return _mm512_maskz_mov_ps(m, ld_q4_0(p, i));
}

/* Cache lines that 32 columns of 4 rows span, for the prefetches. */
#define PF_LINES_f32	8
#define PF_LINES_f16	4
#define PF_LINES_bf16	4
#define PF_LINES_q8_0	3
#define PF_LINES_q4_0	2

/*
 * A tile's software prefetch: pf_at_T(w, rs) is where it starts for the
 * 4-row block at w (rows of rs bytes), and pf_T(pw, rs, c) runs at each
 * 32-column step c. The other types sweep the block MP_PF_AHEAD bytes on as
 * if it were one stream of 4 x rs bytes; the block is read as four streams,
 * so with rows over MP_PF_AHEAD / 4 the sweep reaches a row's first lines
 * after they are read (mixtral-mini's down rows are 7 KiB) and the leads
 * vary. bf16 (expert weights) prefetches the same columns of each of the
 * block's rows in the first whole block at least MP_PF_AHEAD bytes on: every
 * row the same lead, one line a row a step. Experts of mixtral-mini's shape
 * from memory, 2 threads: +7 % GB/s at 1 vector, +9-12 % at 2-8, +5 % at 16.
 */
#define DEFINE_PF_SWEEP(type)							\
static inline ALWAYS_INLINE TARGET const char *pf_at_##type(const char *w, size_t rs)	\
{										\
	(void)rs;								\
	return w + MP_PF_AHEAD;							\
}										\
										\
static inline ALWAYS_INLINE TARGET void pf_##type(const char *pw, size_t rs, uint32_t R,	\
						  uint32_t c)				\
{										\
	(void)rs;								\
	(void)R;								\
	for (int l = 0; l < PF_LINES_##type; l++)				\
		_mm_prefetch(pw + MP_PF_OFF(type, c) + 64 * l, _MM_HINT_T1);	\
}

DEFINE_PF_SWEEP(f32)
DEFINE_PF_SWEEP(f16)
DEFINE_PF_SWEEP(q8_0)
DEFINE_PF_SWEEP(q4_0)

static inline ALWAYS_INLINE TARGET const char *pf_at_bf16(const char *w, size_t rs)
{
	const size_t block = 4 * rs;

	/* No columns, no row to sweep (and no division by zero). */
	return block ? w + (MP_PF_AHEAD + block - 1) / block * block : w + MP_PF_AHEAD;
}

static inline ALWAYS_INLINE TARGET void pf_bf16(const char *pw, size_t rs, const uint32_t R,
					      uint32_t c)
{
	UNROLL for (uint32_t r = 0; r < R; r++)
		_mm_prefetch(pw + r * rs + (size_t)c * 2, _MM_HINT_T1);
}

static inline TARGET __mmask16 tail_mask(uint32_t left)
{
	return (__mmask16)((1u << left) - 1);
}

/*
 * Products of n vectors: every weight row is loaded (and widened) once per
 * group of up to TOKENS vectors, and each load feeds an FMA per vector of
 * the group. A register tile is 4 rows x T vectors (T <= TOKENS: 24
 * accumulators, the group's x and one widened weight register in 32), so a
 * 4-row block streams from memory once and is used by every vector while it
 * is in L1.
 *
 * Each product accumulates exactly as a lone vector's does, whatever n and
 * whichever group it falls in: one 16-lane accumulator per (row, vector)
 * over 32-column blocks in order (then 16-column ones, the masked tail
 * last), then one reduction. So a vector gets the same bits alone (n = 1)
 * and in a batch, which batched decoding needs. Each step prefetches the
 * weights about MP_PF_AHEAD bytes on into L2 (pf_T; first group only: the
 * others find the block in cache). Prefetches past the last row do not fault, so they
 * need no bound.
 *
 * bf16 takes a 32-column block as its 16 32-bit words: the even columns are
 * their low halves moved up, the odd ones their high halves with the low
 * ones masked off (one operation per 16 weights, against two to widen 16
 * in order), against vectors whose blocks xprep_bf16() split into even
 * then odd columns: 2-5 % more bandwidth at 4-8 vectors, none at 1-2
 * (expert FFNs of mixtral-mini's shape on the 2-core VM). The even ones are
 * the block's words shifted up 16 bits. (A load of the block 2 bytes back
 * with the odd lanes kept, which spared the Zen 4 VM's FMA port the shift,
 * crosses a cache line on every load: `ref` ran batch 1 at 0.35-0.45 of its
 * bound on Zen 5 against 0.71-0.86 with the shift; docs/engine.md, session 38.)
 *
 * A tile's 4 x T sums are taken together (mp_reduce_tile(), kern_reduce.h:
 * the pairing tree of _mm512_reduce_add_ps, transposed), the same bits.
 */
#define TOKENS 6

/* 32 columns at c of R rows against T vectors: two 16-column steps. */
#define DEFINE_STEP32(type)							\
static inline __attribute__((always_inline)) TARGET void			\
step32_##type(const char *w, size_t rs, const uint32_t R, const uint32_t T,	\
	      uint32_t cols, const float *x, uint32_t c, __m512 acc[][4])	\
{										\
	__m512 xv[TOKENS];							\
										\
	UNROLL for (uint32_t h = 0; h < 32; h += 16) {				\
		UNROLL for (uint32_t t = 0; t < T; t++)				\
			xv[t] = _mm512_loadu_ps(x + (size_t)t * cols + c + h);	\
		UNROLL for (uint32_t r = 0; r < R; r++) {			\
			__m512 wv = ld_##type(w + r * rs, c + h);		\
										\
			UNROLL for (uint32_t t = 0; t < T; t++)			\
				acc[t][r] = _mm512_fmadd_ps(wv, xv[t], acc[t][r]); \
		}								\
	}									\
}

DEFINE_STEP32(f32)
DEFINE_STEP32(f16)
DEFINE_STEP32(q8_0)
DEFINE_STEP32(q4_0)

/*
 * bf16's 32 columns: even ones, then odd ones (x as xprep_bf16() ordered it);
 * wc is row 0's column c, row r's is rs bytes on (row-major: a row; packed:
 * 64 bytes).
 */
static inline __attribute__((always_inline)) TARGET void
step32_bf16_at(const char *wc, size_t rs, const uint32_t R, const uint32_t T, uint32_t cols,
	       const float *x, uint32_t c, __m512 acc[][4])
{
	__m512 xv[TOKENS];

	UNROLL for (uint32_t t = 0; t < T; t++)
		xv[t] = _mm512_loadu_ps(x + (size_t)t * cols + c);
	UNROLL for (uint32_t r = 0; r < R; r++) {
		/* the even columns into the high halves by a shift, the low halves zeroed */
		__m512i q = _mm512_slli_epi32(_mm512_loadu_si512(wc + r * rs), 16);
		__m512 wv = _mm512_castsi512_ps(q);

		UNROLL for (uint32_t t = 0; t < T; t++)
			acc[t][r] = _mm512_fmadd_ps(wv, xv[t], acc[t][r]);
	}
	UNROLL for (uint32_t t = 0; t < T; t++)
		xv[t] = _mm512_loadu_ps(x + (size_t)t * cols + c + 16);
	UNROLL for (uint32_t r = 0; r < R; r++) {
		/* the odd 16-bit halves, the even ones zeroed: a k-mask, no vector register */
		__m512i q = _mm512_maskz_loadu_epi16(0xaaaaaaaau, wc + r * rs);
		__m512 wv = _mm512_castsi512_ps(q);

		UNROLL for (uint32_t t = 0; t < T; t++)
			acc[t][r] = _mm512_fmadd_ps(wv, xv[t], acc[t][r]);
	}
}

static inline __attribute__((always_inline)) TARGET void
step32_bf16(const char *w, size_t rs, const uint32_t R, const uint32_t T, uint32_t cols,
	    const float *x, uint32_t c, __m512 acc[][4])
{
	step32_bf16_at(w + (size_t)c * 2, rs, R, T, cols, x, c, acc);
}

/* Each 32-column block of every vector as its even columns, then its odd ones. */
static TARGET void xprep_bf16(const float *x, uint32_t n, uint32_t cols, float *out)
{
	const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
					       26, 28, 30);
	const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));

	for (uint32_t t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * cols;
		float *ot = out + (size_t)t * cols;
		uint32_t c = 0;

		for (; c + 32 <= cols; c += 32) {
			__m512 a = _mm512_loadu_ps(xt + c), b = _mm512_loadu_ps(xt + c + 16);

			_mm512_storeu_ps(ot + c, _mm512_permutex2var_ps(a, even, b));
			_mm512_storeu_ps(ot + c + 16, _mm512_permutex2var_ps(a, odd, b));
		}
		memcpy(ot + c, xt + c, (cols - c) * sizeof(float));
	}
}

/*
 * One vector (n = 1), bf16: a row at a time, read front to back, prefetched
 * MP_PF_AHEAD bytes on by one line a step (the next rows' lines once each).
 * The same sums as a 4-row tile's (one accumulator, the blocks in order, the
 * reduction of _mm512_reduce_add_ps), but one stream: the 4-row tile reads a
 * 4 KiB page as two or more interleaved streams (mixtral-mini's gate/up rows
 * are 2 KiB), which the hardware prefetcher follows badly. Measured on the
 * 2-vCPU EPYC VM, one thread, chunks of mixtral-mini's shapes (docs/engine.md
 * "Session 33"): pure reads in the tile's order 13.1 GB/s against 28-29 front
 * to back; this product 22.9 / 23.1 GB/s (gate-up / down chunks) against the
 * tile's 21.8 / 21.9, two threads in the fast mode 42-46 / 44-46 against
 * 40 / 40-42. A row at a time is bound by its one accumulator's FMA latency
 * (rows in pairs were no faster); with more vectors the tile's FMAs hide it.
 */
#define ROW_BY_ROW_f32	0
#define ROW_BY_ROW_f16	0
#define ROW_BY_ROW_bf16	1
#define ROW_BY_ROW_q8_0	0
#define ROW_BY_ROW_q4_0	0

#define DEFINE_GEMV_ROWS(type)							\
static inline __attribute__((always_inline)) TARGET void			\
gemv_rows_##type(const char *w, uint32_t rows, size_t rs, uint32_t cols,	\
		 const float *x, float *y)					\
{										\
	mp_pf_head(w, MP_MIN((size_t)rows * rs, (size_t)MP_PF_AHEAD));		\
	for (uint32_t r = 0; r < rows; r++) {					\
		const char *wr = w + r * rs;					\
										\
		tile_##type(wr, rs, 1, 1, cols, x, y + r, 1, wr + MP_PF_AHEAD);	\
	}									\
}

#define DEFINE_GEMM(type)							\
static inline __attribute__((always_inline)) TARGET void			\
tile_##type(const char *w, size_t rs, const uint32_t R, const uint32_t T,	\
	    uint32_t cols, const float *x, float *y, size_t ystride,		\
	    const char *pw)							\
{										\
	__m512 acc[TOKENS][4], xv[TOKENS];					\
	uint32_t c = 0;								\
										\
	UNROLL for (uint32_t t = 0; t < T; t++)					\
		UNROLL for (uint32_t r = 0; r < R; r++)				\
			acc[t][r] = _mm512_setzero_ps();			\
	for (; c + 32 <= cols; c += 32) {					\
		if (pw)								\
			pf_##type(pw, rs, R, c);				\
		step32_##type(w, rs, R, T, cols, x, c, acc);			\
	}									\
	for (; c < cols; c += 16) {						\
		__mmask16 m = cols - c >= 16 ? 0xffff : tail_mask(cols - c);	\
										\
		UNROLL for (uint32_t t = 0; t < T; t++)				\
			xv[t] = _mm512_maskz_loadu_ps(m, x + (size_t)t * cols + c); \
		UNROLL for (uint32_t r = 0; r < R; r++) {			\
			__m512 wv = ldm_##type(w + r * rs, c, m);		\
										\
			UNROLL for (uint32_t t = 0; t < T; t++)			\
				acc[t][r] = _mm512_fmadd_ps(wv, xv[t], acc[t][r]); \
		}								\
	}									\
	mp_store_tile(acc, R, T, y, ystride);					\
}										\
										\
DEFINE_GEMV_ROWS(type)								\
										\
static TARGET void gemm_##type(const void *w, uint32_t rows, uint32_t cols,	\
			       const float *x, uint32_t n, float *y, size_t ystride) \
{										\
	const size_t rs = MP_ROW_##type(cols);					\
	uint32_t r = 0;								\
										\
	if (ROW_BY_ROW_##type && n == 1) {					\
		gemv_rows_##type((const char *)w, rows, rs, cols, x, y);	\
		return;								\
	}									\
	if (rows >= 4)								\
		mp_pf_head(w, MP_MIN((size_t)rows * rs,				\
				     (size_t)(pf_at_##type(w, rs) - (const char *)w))); \
	for (; r + 4 <= rows; r += 4) {						\
		const char *wr = (const char *)w + r * rs;			\
										\
		for (uint32_t t = 0; t < n; t += TOKENS) {			\
			const float *xt = x + (size_t)t * cols;			\
			float *yt = y + t * ystride + r;			\
			const char *pw = t == 0 ? pf_at_##type(wr, rs) : NULL;	\
										\
			switch (n - t < TOKENS ? n - t : TOKENS) {	\
			case 1: tile_##type(wr, rs, 4, 1, cols, xt, yt, ystride, pw); break; \
			case 2: tile_##type(wr, rs, 4, 2, cols, xt, yt, ystride, pw); break; \
			case 3: tile_##type(wr, rs, 4, 3, cols, xt, yt, ystride, pw); break; \
			case 4: tile_##type(wr, rs, 4, 4, cols, xt, yt, ystride, pw); break; \
			case 5: tile_##type(wr, rs, 4, 5, cols, xt, yt, ystride, pw); break; \
			default: tile_##type(wr, rs, 4, 6, cols, xt, yt, ystride, pw); break; \
			}							\
		}								\
	}									\
	/* The last rows one by one, a vector at a time (odd shapes only). */	\
	for (; r < rows; r++)							\
		for (uint32_t t = 0; t < n; t++)				\
			tile_##type((const char *)w + r * rs, rs, 1, 1, cols,	\
				    x + (size_t)t * cols, y + t * ystride + r, ystride, NULL); \
}

/*
 * bf16 over packed weights (kernels.h, mp_pack_bf16()): R rows x T vectors
 * of the group at g, its 32-column blocks one R x 64-byte stretch after
 * another, so the tile reads one stream front to back, prefetched
 * MP_PF_AHEAD on by R lines a step (pf: the first group of vectors only,
 * and not for one vector), and MP_PF_NEAR on into L1 as well for three or
 * more (near; kernels.h). The same accumulators, the same blocks in the
 * same order, the same tail steps and reductions as tile_bf16() over the
 * row-major matrix: the same bits. One vector runs the 4-row tile too: four
 * sums hide the FMA latency that a row at a time waits on, and with no
 * prefetch the hardware's follows the one stream best. Experts of
 * mixtral-mini's shape from memory, one thread, GB/s (docs/engine.md
 * "Session 35"): one vector 26.4 unprefetched against 22.4 prefetched
 * (16 KiB on), 19.7-19.8 (4 or 32 KiB on, or into L3), and the row-major
 * row at a time's 23.0; 4 vectors 23.2 prefetched against 12.0 not.
 */
static inline ALWAYS_INLINE TARGET void ptile_bf16(const char *g, const uint32_t R,
						   const uint32_t T, uint32_t cols, const float *x,
						   float *y, size_t ystride, bool pf, bool near)
{
	const uint32_t nb = cols / 32;
	const size_t bs = (size_t)R * 64, ts = MP_ROW_bf16(cols % 32);
	const char *tail = g + nb * bs;
	__m512 acc[TOKENS][4], xv[TOKENS];
	uint32_t c = 0;

	UNROLL for (uint32_t t = 0; t < T; t++)
		UNROLL for (uint32_t r = 0; r < R; r++)
			acc[t][r] = _mm512_setzero_ps();
	for (uint32_t b = 0; b < nb; b++, c += 32) {
		const char *blk = g + b * bs;

		if (pf)
			UNROLL for (uint32_t r = 0; r < R; r++)
				_mm_prefetch(blk + MP_PF_AHEAD + r * 64, _MM_HINT_T1);
		if (near)
			UNROLL for (uint32_t r = 0; r < R; r++)
				_mm_prefetch(blk + MP_PF_NEAR + r * 64, _MM_HINT_T0);
		step32_bf16_at(blk, 64, R, T, cols, x, c, acc);
	}
	for (; c < cols; c += 16) {
		__mmask16 m = cols - c >= 16 ? 0xffff : tail_mask(cols - c);

		UNROLL for (uint32_t t = 0; t < T; t++)
			xv[t] = _mm512_maskz_loadu_ps(m, x + (size_t)t * cols + c);
		UNROLL for (uint32_t r = 0; r < R; r++) {
			__m512 wv = ldm_bf16(tail + r * ts, c - nb * 32, m);

			UNROLL for (uint32_t t = 0; t < T; t++)
				acc[t][r] = _mm512_fmadd_ps(wv, xv[t], acc[t][r]);
		}
	}
	mp_store_tile(acc, R, T, y, ystride);
}

static TARGET void gemm_packed_bf16(const void *w, uint32_t rows, uint32_t cols, const float *x,
				    uint32_t n, float *y, size_t ystride)
{
	const size_t rs = MP_ROW_bf16(cols);

	if (n > 1)
		mp_pf_head(w, MP_MIN((size_t)rows * rs, (size_t)MP_PF_AHEAD));
	for (uint32_t r = 0; r < rows; r += 4) {
		const char *g = (const char *)w + r * rs;

		if (rows - r < 4) {
			/* The last rows (odd shapes only), a vector at a time. */
			for (uint32_t t = 0; t < n; t++) {
				const float *xt = x + (size_t)t * cols;
				float *yt = y + t * ystride + r;

				switch (rows - r) {
				case 1: ptile_bf16(g, 1, 1, cols, xt, yt, ystride, false, false); break;
				case 2: ptile_bf16(g, 2, 1, cols, xt, yt, ystride, false, false); break;
				default: ptile_bf16(g, 3, 1, cols, xt, yt, ystride, false, false); break;
				}
			}
			break;
		}
		for (uint32_t t = 0; t < n; t += TOKENS) {
			const float *xt = x + (size_t)t * cols;
			float *yt = y + t * ystride + r;
			/* Three or more vectors prefetch MP_PF_NEAR on too (kernels.h). */
			const bool pf = t == 0 && n > 1, near = t == 0 && n > 2;

			switch (n - t < TOKENS ? n - t : TOKENS) {
			case 1: ptile_bf16(g, 4, 1, cols, xt, yt, ystride, pf, near); break;
			case 2: ptile_bf16(g, 4, 2, cols, xt, yt, ystride, pf, near); break;
			case 3: ptile_bf16(g, 4, 3, cols, xt, yt, ystride, pf, near); break;
			case 4: ptile_bf16(g, 4, 4, cols, xt, yt, ystride, pf, near); break;
			case 5: ptile_bf16(g, 4, 5, cols, xt, yt, ystride, pf, near); break;
			default: ptile_bf16(g, 4, 6, cols, xt, yt, ystride, pf, near); break;
			}
		}
	}
}

/* The same loads into f32 (mp_engine's to_f32). */
#define DEFINE_WIDEN(type)							\
static TARGET void widen_##type(const void *src, float *dst, size_t n)		\
{										\
	size_t i = 0;								\
										\
	for (; i + 16 <= n; i += 16)						\
		_mm512_storeu_ps(dst + i, ld_##type(src, i));			\
	if (i < n) {								\
		__mmask16 m = tail_mask((uint32_t)(n - i));			\
										\
		_mm512_mask_storeu_ps(dst + i, m, ldm_##type(src, i, m));	\
	}									\
}

#define DEFINE_TYPE(type) DEFINE_GEMM(type) DEFINE_WIDEN(type)

DEFINE_TYPE(f32)
DEFINE_TYPE(f16)
DEFINE_TYPE(bf16)
DEFINE_TYPE(q8_0)
DEFINE_TYPE(q4_0)

static TARGET float dot(const float *a, const float *b, uint32_t n)
{
	__m512 s0 = _mm512_setzero_ps(), s1 = s0;
	uint32_t i = 0;

	for (; i + 32 <= n; i += 32) {
		s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
		s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
	}
	for (; i < n; i += 16) {
		__mmask16 m = n - i >= 16 ? 0xffff : tail_mask(n - i);

		__m512 av = _mm512_maskz_loadu_ps(m, a + i);

		s0 = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, b + i), s0);
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

static TARGET void axpy(float a, const float *x, float *y, uint32_t n)
{
	__m512 av = _mm512_set1_ps(a);

	for (uint32_t i = 0; i < n; i += 16) {
		__mmask16 m = n - i >= 16 ? 0xffff : tail_mask(n - i);
		__m512 yv = _mm512_maskz_loadu_ps(m, y + i);

		_mm512_mask_storeu_ps(y + i, m,
				      _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), yv));
	}
}

static TARGET float read_sum(const void *buf, size_t bytes)
{
	const float *f = buf;
	__m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
	size_t n = bytes / sizeof(float), i = 0;

	for (; i + 64 <= n; i += 64) {
		s0 = _mm512_add_ps(s0, _mm512_loadu_ps(f + i));
		s1 = _mm512_add_ps(s1, _mm512_loadu_ps(f + i + 16));
		s2 = _mm512_add_ps(s2, _mm512_loadu_ps(f + i + 32));
		s3 = _mm512_add_ps(s3, _mm512_loadu_ps(f + i + 48));
	}
	for (; i < n; i += 16)
		s0 = _mm512_add_ps(s0, _mm512_loadu_ps(f + i));
	return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/*
 * expf() of 16 floats with glibc's bits: its algorithm (e_expf.c, the
 * build its ifunc picks on every CPU with FMA, so on all with AVX-512) in
 * double, 8 lanes a register, each step the same operation (the same FMAs)
 * as glibc's: x * 32 / ln 2 = k + r (k rounded to an integer by adding
 * 1.5 * 2^52), 2^(k / 32) as a table entry of 2^((k % 32) / 32) with k / 32
 * added to its exponent, 2^(r / 32) by a cubic, the product rounded to
 * float once. Lanes at |x| >= 88 (and NaN) take glibc's slow path there
 * (overflow, underflow, its error flags): they are passed to expf() itself.
 * Tested against expf() by test_engine (kernels_silu_mul_gives_the_bits_of_expf).
 * Provenance: the table and the cubic's coefficients are the published
 * constants of Arm's optimized-routines (math/exp2f_data.c, math/expf.c;
 * MIT OR Apache-2.0 WITH LLVM-exception), which glibc's expf ships too;
 * the code is ours.
 */
#define EXP_SLOW	0x42b00000u	/* |x|'s bits from which glibc leaves its fast path */

/* 2^(i / 32) - (i << 47) as bits: glibc's __exp2f_data.tab. */
static const uint64_t exp2_32[32] __attribute__((aligned(64))) = {
	0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
	0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
	0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
	0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
	0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
	0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
	0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
	0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

/* expf() of 8 floats on glibc's fast path; tab: exp2_32 in four registers. */
static inline ALWAYS_INLINE TARGET __m256 expf_8(__m256 x, const __m512i tab[4])
{
	const __m512d shift = _mm512_set1_pd(0x1.8p52), inv = _mm512_set1_pd(0x1.71547652b82fep+5);
	const __m512d xd = _mm512_cvtps_pd(x);
	__m512d kd = _mm512_fmadd_pd(inv, xd, shift);
	const __m512i ki = _mm512_castpd_si512(kd);
	__m512d r, z, r2, y;
	__m512i t;

	kd = _mm512_sub_pd(kd, shift);
	r = _mm512_fmsub_pd(inv, xd, kd);
	/* tab[ki % 32]: two 16-entry lookups, bit 4 picks one. */
	t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)),
				    _mm512_permutex2var_epi64(tab[0], ki, tab[1]),
				    _mm512_permutex2var_epi64(tab[2], ki, tab[3]));
	t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
	z = _mm512_fmadd_pd(_mm512_set1_pd(0x1.c6af84b912394p-20), r,
			    _mm512_set1_pd(0x1.ebfce50fac4f3p-13));
	r2 = _mm512_mul_pd(r, r);
	y = _mm512_fmadd_pd(_mm512_set1_pd(0x1.62e42ff0c52d6p-6), r, _mm512_set1_pd(1.0));
	y = _mm512_fmadd_pd(z, r2, y);
	return _mm512_cvtpd_ps(_mm512_mul_pd(y, _mm512_castsi512_pd(t)));
}

static inline ALWAYS_INLINE TARGET __m512 expf_16(__m512 x, const __m512i tab[4])
{
	const __m512i bits = _mm512_castps_si512(x);
	__mmask16 slow = _mm512_cmpge_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
						 _mm512_set1_epi32(EXP_SLOW));
	/* The halves by 64-bit lane moves: AVX-512 F has no 8-float insert or extract. */
	const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
	__m512 e = _mm512_castpd_ps(_mm512_insertf64x4(
		_mm512_castps_pd(_mm512_castps256_ps512(expf_8(_mm512_castps512_ps256(x), tab))),
		_mm256_castps_pd(expf_8(hi, tab)), 1));

	if (slow) {
		float xs[16], es[16];

		_mm512_storeu_ps(xs, x);
		_mm512_storeu_ps(es, e);
		for (; slow; slow &= slow - 1) {
			const int i = __builtin_ctz(slow);

			es[i] = expf(xs[i]);
		}
		e = _mm512_loadu_ps(es);
	}
	return e;
}

static TARGET void silu_mul(const float *g, const float *u, float *h, uint32_t n)
{
	const __m512i tab[4] = {
		_mm512_load_si512(exp2_32), _mm512_load_si512(exp2_32 + 8),
		_mm512_load_si512(exp2_32 + 16), _mm512_load_si512(exp2_32 + 24),
	};
	const __m512 one = _mm512_set1_ps(1.0f);

	for (uint32_t i = 0; i < n; i += 16) {
		const __mmask16 m = n - i >= 16 ? 0xffff : tail_mask(n - i);
		const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
		const __m512 e = expf_16(_mm512_castsi512_ps(_mm512_xor_si512(
			_mm512_castps_si512(gv), _mm512_set1_epi32((int)0x80000000u))), tab);

		/* g / (1 + e) * u: the scalar expression's operations, so its bits. */
		_mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)),
							      _mm512_maskz_loadu_ps(m, u + i)));
	}
}

/*
 * The argmax in two passes as the scalar table's (kern_scalar.c): 4 x 16
 * running maxima (the tail by a masked load whose other lanes keep the
 * maxima), then the first 16 holding a value equal to the largest. MAXPS(x,
 * m) is x > m ? x : m, the scan's select, a NaN x included (m is never
 * NaN); CMP_EQ_OQ is the scalar ==. The AMX and BF16 tables share it.
 */
static TARGET uint32_t argmax(const float *x, uint32_t n)
{
	__m512 m0, m1, m2, m3, mx;
	__mmask16 k;
	float max;
	uint32_t i = 0;

	if (!n || isnan(x[0]))
		return 0;
	m0 = m1 = m2 = m3 = _mm512_set1_ps(x[0]);
	for (; i + 64 <= n; i += 64) {
		m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
		m1 = _mm512_max_ps(_mm512_loadu_ps(x + i + 16), m1);
		m2 = _mm512_max_ps(_mm512_loadu_ps(x + i + 32), m2);
		m3 = _mm512_max_ps(_mm512_loadu_ps(x + i + 48), m3);
	}
	for (; i + 16 <= n; i += 16)
		m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
	if (i < n)
		m1 = _mm512_max_ps(_mm512_mask_loadu_ps(m1, (__mmask16)((1u << (n - i)) - 1), x + i),
				   m1);
	max = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
	mx = _mm512_set1_ps(max);
	for (i = 0; i + 16 <= n; i += 16) {
		k = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), mx, _CMP_EQ_OQ);
		if (k)
			return i + (uint32_t)__builtin_ctz(k);
	}
	k = _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1), x + i), mx,
			       _CMP_EQ_OQ) & (__mmask16)((1u << (n - i)) - 1);
	return i + (uint32_t)__builtin_ctz(k);
}

MP_KERNELS_DEFINE(mp_kernels_avx512, "avx512", xprep_bf16, gemm_packed_bf16);
/* These kernels with bf16 products on AMX (kern_amx.c): the opt-in bf16-activation path. */
MP_KERNELS_DEFINE_BF16(mp_kernels_amx, "amx", mp_amx_xprep_bf16, mp_amx_gemm_bf16, MP_AMX_GROUP,
		       NULL);
/* ... and on AVX512-BF16 (kern_bf16.c): vectors each on its own, as here. */
MP_KERNELS_DEFINE_BF16(mp_kernels_bf16, "avx512bf16", mp_bf16_xprep, mp_bf16_gemm, 0,
		       mp_bf16_gemm_packed);
