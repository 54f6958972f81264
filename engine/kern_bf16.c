// SPDX-License-Identifier: MIT
/*
 * bf16 products on AVX512-BF16 (VDPBF16PS) over activations rounded to
 * bf16: the opt-in kernels of engine ref-bf16. One instruction multiplies
 * 32 bf16 weights, as loaded from the row-major matrix (no widening), by 32
 * bf16 activations and adds the pairs into 16 f32 lanes: a quarter of the
 * f32 path's vector work per weight, where 4-16 vectors are FMA-bound.
 */
#include <immintrin.h>

#include "engine/kernels.h"
#include "engine/kern_bf16r.h"
#include "engine/kern_reduce.h"
#include "base/base.h"

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define UNROLL _Pragma("GCC unroll 8")
/* In the kernels' loops: a call there would spill every vector register (all caller-saved). */
#define ALWAYS_INLINE __attribute__((always_inline))

/*
 * A register tile is ROWS weight rows x up to TOKENS vectors: 24
 * accumulators, the vectors' 32 columns and one weight register in 32, as
 * the AVX-512 kernel (kern_avx512.c), whose 4-row blocks stream best here.
 */
#define ROWS	MP_KERN_ROWS
#define TOKENS	6

/* acc += the 16 pair sums of 32 weights by 32 activations (bf16 products exact in f32). */
static inline ALWAYS_INLINE TARGET __m512 dp(__m512 acc, __m512i w, __m512i x)
{
	return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);
}

/*
 * The columns past the last whole 32-column block (cols % 32 of them, at
 * tw + r * ts for row r), added to acc by masked loads: zeros past the
 * row, which add nothing. tile()'s and seg()'s last step.
 */
static inline ALWAYS_INLINE TARGET void tail_block(__m512 acc[][ROWS], const uint32_t R,
						   const uint32_t T, uint32_t cols,
						   const uint16_t *x, size_t xs, const char *tw,
						   size_t ts)
{
	const uint32_t c = cols / 32 * 32;
	const __mmask32 m = (__mmask32)((1ull << (cols - c)) - 1);
	__m512i xv[TOKENS];

	if (c == cols)
		return;
	UNROLL for (uint32_t t = 0; t < T; t++)
		xv[t] = _mm512_maskz_loadu_epi16(m, x + t * xs + c);
	UNROLL for (uint32_t r = 0; r < R; r++) {
		const __m512i wv = _mm512_maskz_loadu_epi16(m, tw + r * ts);

		UNROLL for (uint32_t t = 0; t < T; t++)
			acc[t][r] = dp(acc[t][r], wv, xv[t]);
	}
}

/*
 * R rows x T vectors: one accumulator per (row, vector) over the 32-column
 * blocks in order, the last, short one by masked loads (zeros past the
 * row, which add nothing), then one reduction. A sum's order is its own
 * whatever R, T and the other vectors are, so a vector's products are the
 * same bits alone and in any batch. Row r's 32-column block b is at
 * w + r * rs + b * bs (row-major: bs 64; packed, kernels.h: rs 64, bs R x 64),
 * its columns past the last whole block at tw + r * ts. pw: where to
 * prefetch into L2, rows [0, pl) of each block there on the same lead
 * (NULL: not); pn: the same for all R rows into L1 (NULL: not).
 */
static inline ALWAYS_INLINE TARGET void tile(const char *w, size_t rs, size_t bs, const char *tw,
					     size_t ts, const uint32_t R, const uint32_t T,
					     uint32_t cols, const uint16_t *x, size_t xs, float *y,
					     size_t ystride, const char *pw, const uint32_t pl,
					     const char *pn)
{
	__m512 acc[TOKENS][ROWS];
	__m512i xv[TOKENS];
	uint32_t c = 0;
	size_t b = 0;

	UNROLL for (uint32_t t = 0; t < T; t++)
		UNROLL for (uint32_t r = 0; r < R; r++)
			acc[t][r] = _mm512_setzero_ps();
	for (; c + 32 <= cols; c += 32, b++) {
		/* rows [0, pl) of the block on the same lead, as pf_bf16 does; then L1's */
		if (pw)
			UNROLL for (uint32_t r = 0; r < pl; r++)
				_mm_prefetch(pw + r * rs + b * bs, _MM_HINT_T1);
		if (pn)
			UNROLL for (uint32_t r = 0; r < R; r++)
				_mm_prefetch(pn + r * rs + b * bs, _MM_HINT_T0);
		UNROLL for (uint32_t t = 0; t < T; t++)
			xv[t] = _mm512_loadu_si512(x + t * xs + c);
		UNROLL for (uint32_t r = 0; r < R; r++) {
			const __m512i wv = _mm512_loadu_si512(w + r * rs + b * bs);

			UNROLL for (uint32_t t = 0; t < T; t++)
				acc[t][r] = dp(acc[t][r], wv, xv[t]);
		}
	}
	tail_block(acc, R, T, cols, x, xs, tw, ts);
	mp_store_tile(acc, R, T, y, ystride);
}

/*
 * Over seven or more vectors a packed 4-row group is read in segments of
 * SEG 32-column blocks, every group of TOKENS vectors over a segment before
 * the next, the accumulators kept between segments in sv (L1): the first
 * group's prefetches then go out evenly instead of in bursts a group in
 * ceil(n / 6) (docs/engine.md "Session 38"). Each accumulator still adds
 * its blocks in order: the same sums as tile()'s. SEG_T: vectors a pass.
 */
#define SEG	4u
#define SEG_T	48u

/* Blocks [b0, b1) of packed group g for T vectors: from zero if first; if last the tail, then the sums. */
static inline ALWAYS_INLINE TARGET void seg(const char *g, const char *tw, size_t ts,
					    const uint32_t T, uint32_t cols, uint32_t b0,
					    uint32_t b1, bool first, bool last, const uint16_t *x,
					    size_t xs, float *y, size_t ystride, const char *pn,
					    __m512 *sv)
{
	__m512 acc[TOKENS][ROWS];
	__m512i xv[TOKENS];

	UNROLL for (uint32_t t = 0; t < T; t++)
		UNROLL for (uint32_t r = 0; r < ROWS; r++)
			acc[t][r] = first ? _mm512_setzero_ps() : sv[t * ROWS + r];
	for (uint32_t b = b0; b < b1; b++) {
		if (pn)
			UNROLL for (uint32_t r = 0; r < ROWS; r++)
				_mm_prefetch(pn + r * 64 + b * 256, _MM_HINT_T0);
		UNROLL for (uint32_t t = 0; t < T; t++)
			xv[t] = _mm512_loadu_si512(x + t * xs + b * 32);
		UNROLL for (uint32_t r = 0; r < ROWS; r++) {
			const __m512i wv = _mm512_loadu_si512(g + r * 64 + b * 256);

			UNROLL for (uint32_t t = 0; t < T; t++)
				acc[t][r] = dp(acc[t][r], wv, xv[t]);
		}
	}
	if (!last) {
		UNROLL for (uint32_t t = 0; t < T; t++)
			UNROLL for (uint32_t r = 0; r < ROWS; r++)
				sv[t * ROWS + r] = acc[t][r];
		return;
	}
	tail_block(acc, ROWS, T, cols, x, xs, tw, ts);
	mp_store_tile(acc, ROWS, T, y, ystride);
}

/*
 * Packed group g (its tail at tw, ts apart) for n <= SEG_T vectors at x, a
 * segment at a time; pn: the first group's L1 prefetches (NULL: none).
 */
static TARGET void group_segs(const char *g, const char *tw, size_t ts, uint32_t cols,
			      const uint16_t *x, size_t xs, uint32_t n, float *y,
			      size_t ystride, const char *pn)
{
	const uint32_t nb = cols / 32;
	__m512 sv[(SEG_T + TOKENS - 1) / TOKENS * TOKENS * ROWS];

	for (uint32_t b0 = 0;; b0 += SEG) {
		const uint32_t b1 = MP_MIN(nb, b0 + SEG);
		const bool first = b0 == 0, last = b1 == nb;

		for (uint32_t t = 0; t < n; t += TOKENS) {
			const uint16_t *xt = x + t * xs;
			float *yt = y + t * ystride;
			const char *p = t == 0 ? pn : NULL;
			__m512 *s = sv + t * ROWS;

			switch (n - t < TOKENS ? n - t : TOKENS) {
			case 1: seg(g, tw, ts, 1, cols, b0, b1, first, last, xt, xs, yt, ystride, p, s); break;
			case 2: seg(g, tw, ts, 2, cols, b0, b1, first, last, xt, xs, yt, ystride, p, s); break;
			case 3: seg(g, tw, ts, 3, cols, b0, b1, first, last, xt, xs, yt, ystride, p, s); break;
			case 4: seg(g, tw, ts, 4, cols, b0, b1, first, last, xt, xs, yt, ystride, p, s); break;
			case 5: seg(g, tw, ts, 5, cols, b0, b1, first, last, xt, xs, yt, ystride, p, s); break;
			default: seg(g, tw, ts, 6, cols, b0, b1, first, last, xt, xs, yt, ystride, p, s); break;
			}
		}
		if (last)
			return;
	}
}

/*
 * Each vector's cols activations rounded to bf16 as mp_f32_to_bf16() does,
 * in column order, into the first half of its cols floats at out (so
 * x + t * cols of the result is vector t's, as the engine's blocks expect).
 */
TARGET void mp_bf16_xprep(const float *x, uint32_t n, uint32_t cols, float *out)
{
	for (uint32_t t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * cols;
		uint16_t *o = (uint16_t *)(out + (size_t)t * cols);

		for (uint32_t c = 0; c < cols; c += 32) {
			const uint32_t left = cols - c < 32 ? cols - c : 32;
			const uint32_t lo = left < 16 ? left : 16, hi = left - lo;
			const __m512 a = _mm512_maskz_loadu_ps((__mmask16)((1u << lo) - 1), xt + c);
			const __m512 b = _mm512_maskz_loadu_ps((__mmask16)((1u << hi) - 1),
							       xt + c + 16);
			const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(
					_mm512_cvtepi32_epi16(mp_round_bf16(a))),
					_mm512_cvtepi32_epi16(mp_round_bf16(b)), 1);

			_mm512_mask_storeu_epi16(o + c, (__mmask32)((1ull << left) - 1), h);
		}
	}
}

/* Bytes before a row's columns past its last whole 32-column block. */
#define TAIL(cols)	((size_t)(cols) / 32 * 64)

/* Where a 4-row block at w prefetches: the first whole block MP_PF_AHEAD bytes on. */
static const char *pf_at(const char *w, size_t rs)
{
	const size_t block = ROWS * rs;

	return block ? w + (MP_PF_AHEAD + block - 1) / block * block : w;
}

/*
 * y[t * ystride + r] for the n vectors mp_bf16_xprep() rounded at x: each
 * 4-row block is read from memory once (prefetched by the first group of
 * vectors) and used by every group of up to TOKENS while in L1. One vector
 * (n = 1) goes a row at a time, front to back, prefetched MP_PF_AHEAD on by
 * one line a step, as the AVX-512 kernel's gemv_rows_bf16() does (a 4-row
 * tile reads mixtral-mini's 2 KiB rows as interleaved streams in a page,
 * which the hardware prefetcher follows badly; docs/engine.md "Session 33"):
 * the same sums, one accumulator over the blocks in order and the
 * reduction mp_reduce_tile() matches, so a vector alone and in a batch
 * still agree bit for bit.
 */
TARGET void mp_bf16_gemm(const void *w, uint32_t rows, uint32_t cols, const float *x,
			 uint32_t n, float *y, size_t ystride)
{
	const size_t rs = MP_ROW_bf16(cols), xs = (size_t)cols * 2;
	const uint16_t *xb = (const uint16_t *)x;
	uint32_t r = 0;

	if (n == 1) {
		mp_pf_head(w, MP_MIN((size_t)rows * rs, (size_t)MP_PF_AHEAD));
		for (; r < rows; r++) {
			const char *wr = (const char *)w + r * rs;

			tile(wr, rs, 64, wr + TAIL(cols), rs, 1, 1, cols, xb, xs, y + r, 1,
			     wr + MP_PF_AHEAD, 1, NULL);
		}
		return;
	}
	if (rows >= ROWS)
		mp_pf_head(w, MP_MIN((size_t)rows * rs, (size_t)(pf_at(w, rs) - (const char *)w)));
	for (; r + ROWS <= rows; r += ROWS) {
		const char *wr = (const char *)w + r * rs, *tw = wr + TAIL(cols);

		for (uint32_t t = 0; t < n; t += TOKENS) {
			const uint16_t *xt = xb + t * xs;
			float *yt = y + t * ystride + r;
			const char *pw = t == 0 ? pf_at(wr, rs) : NULL;

			switch (n - t < TOKENS ? n - t : TOKENS) {
			case 1: tile(wr, rs, 64, tw, rs, ROWS, 1, cols, xt, xs, yt, ystride, pw, ROWS,
				     NULL); break;
			case 2: tile(wr, rs, 64, tw, rs, ROWS, 2, cols, xt, xs, yt, ystride, pw, ROWS,
				     NULL); break;
			case 3: tile(wr, rs, 64, tw, rs, ROWS, 3, cols, xt, xs, yt, ystride, pw, ROWS,
				     NULL); break;
			case 4: tile(wr, rs, 64, tw, rs, ROWS, 4, cols, xt, xs, yt, ystride, pw, ROWS,
				     NULL); break;
			case 5: tile(wr, rs, 64, tw, rs, ROWS, 5, cols, xt, xs, yt, ystride, pw, ROWS,
				     NULL); break;
			default: tile(wr, rs, 64, tw, rs, ROWS, 6, cols, xt, xs, yt, ystride, pw, ROWS,
				      NULL); break;
			}
		}
	}
	/* The last rows one by one, a vector at a time (odd shapes only). */
	for (; r < rows; r++) {
		const char *wr = (const char *)w + r * rs;

		for (uint32_t t = 0; t < n; t++)
			tile(wr, rs, 64, wr + TAIL(cols), rs, 1, 1, cols, xb + t * xs, xs,
			     y + t * ystride + r, ystride, NULL, 0, NULL);
	}
}

/*
 * The same products over packed weights (kernels.h): each group of 4 rows is
 * one stream, its blocks R x 64 bytes apart, prefetched by the vectors'
 * count (kernels.h: two MP_PF_AHEAD on, more MP_PF_NEAR_BF16 on only),
 * seven or more a segment at a time (group_segs()); one vector runs the
 * 4-row tile too (four sums, one stream, left to the hardware's
 * prefetcher, as kern_avx512.c's
 * gemm_packed_bf16()). The same sums in the same order as mp_bf16_gemm()'s:
 * the same bits.
 */
TARGET void mp_bf16_gemm_packed(const void *w, uint32_t rows, uint32_t cols, const float *x,
				uint32_t n, float *y, size_t ystride)
{
	const size_t rs = MP_ROW_bf16(cols), xs = (size_t)cols * 2, ts = MP_ROW_bf16(cols % 32);
	const uint16_t *xb = (const uint16_t *)x;
	/* Two vectors prefetch a block's first line far on, more every line near on (kernels.h). */
	const bool near = n > 2;

	if (n > 1)
		mp_pf_head(w, MP_MIN((size_t)rows * rs, (size_t)(near ? MP_PF_NEAR_BF16 : MP_PF_AHEAD)));
	for (uint32_t r = 0; r < rows; r += ROWS) {
		const uint32_t R = rows - r < ROWS ? rows - r : ROWS;
		const char *g = (const char *)w + r * rs, *tw = g + (size_t)(cols / 32) * R * 64;
		const char *pw = n == 2 ? g + MP_PF_AHEAD : NULL;
		const char *pn = near ? g + MP_PF_NEAR_BF16 : NULL;

		if (R < ROWS) {
			/* The last rows (odd shapes only), a vector at a time. */
			for (uint32_t t = 0; t < n; t++) {
				const uint16_t *xt = xb + t * xs;
				float *yt = y + t * ystride + r;

				/* (no prefetch: the matrix ends here) */
				switch (R) {
				case 1: tile(g, 64, 64, tw, ts, 1, 1, cols, xt, xs, yt, ystride, NULL, 0,
					     NULL); break;
				case 2: tile(g, 64, 128, tw, ts, 2, 1, cols, xt, xs, yt, ystride, NULL, 0,
					     NULL); break;
				default: tile(g, 64, 192, tw, ts, 3, 1, cols, xt, xs, yt, ystride, NULL,
					      0, NULL); break;
				}
			}
			break;
		}
		if (n > TOKENS) {
			for (uint32_t t = 0; t < n; t += SEG_T)
				group_segs(g, tw, ts, cols, xb + t * xs, xs, MP_MIN(SEG_T, n - t),
					   y + t * ystride + r, ystride, t == 0 ? pn : NULL);
			continue;
		}
		switch (n) {
		case 1: tile(g, 64, 256, tw, ts, ROWS, 1, cols, xb, xs, y + r, ystride, NULL, 0, NULL); break;
		case 2: tile(g, 64, 256, tw, ts, ROWS, 2, cols, xb, xs, y + r, ystride, pw, 1, NULL); break;
		case 3: tile(g, 64, 256, tw, ts, ROWS, 3, cols, xb, xs, y + r, ystride, NULL, 0, pn); break;
		case 4: tile(g, 64, 256, tw, ts, ROWS, 4, cols, xb, xs, y + r, ystride, NULL, 0, pn); break;
		case 5: tile(g, 64, 256, tw, ts, ROWS, 5, cols, xb, xs, y + r, ystride, NULL, 0, pn); break;
		default: tile(g, 64, 256, tw, ts, ROWS, 6, cols, xb, xs, y + r, ystride, NULL, 0, pn); break;
		}
	}
}
