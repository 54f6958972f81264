// SPDX-License-Identifier: MIT
/* AVX-512 kernels (F+BW+VL): 16-lane f32 FMAs, bf16/f16/q8_0/q4_0 widened in registers, masked tails. */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels.h"

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

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

static inline TARGET __mmask16 tail_mask(uint32_t left)
{
	return (__mmask16)((1u << left) - 1);
}

/*
 * Four rows at a time, 32 columns per step: four FMA chains, one 16-lane
 * accumulator per row over 16-column blocks in order (the masked tail
 * last), which is exactly tile4x4()'s order: a product gives the same bits
 * whether its vector comes alone or in a batch, as batched decoding needs.
 * Four weight streams; x stays in L1/L2. The four rows are one
 * contiguous block, and each step prefetches its share of the next block:
 * rows are short (2 KiB for a 1024-wide bf16 row), too short for the
 * hardware prefetcher to ramp up on four interleaved streams (measured
 * here: ~0.6 of a read-sum's bandwidth without, ~1.0 with). Prefetches
 * past the last row do not fault, so they need no bound.
 */
#define DEFINE_GEMV(type)							\
static TARGET void gemv_##type(const void *w, uint32_t rows, uint32_t cols,	\
			       const float *x, float *y)			\
{										\
	const size_t rs = MP_ROW_##type(cols);					\
	uint32_t r = 0;								\
										\
	for (; r + 4 <= rows; r += 4) {						\
		const char *w0 = (const char *)w + r * rs;			\
		const char *w1 = w0 + rs, *w2 = w1 + rs, *w3 = w2 + rs;		\
		const char *next = w0 + 4 * rs;					\
		__m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;	\
		uint32_t c = 0;							\
										\
		for (; c + 32 <= cols; c += 32) {				\
			__m512 x0 = _mm512_loadu_ps(x + c);			\
			__m512 x1 = _mm512_loadu_ps(x + c + 16);		\
										\
			for (int l = 0; l < PF_LINES_##type; l++)		\
				_mm_prefetch(next + MP_PF_OFF(type, c) + 64 * l,		\
					     _MM_HINT_T0);				\
										\
			a0 = _mm512_fmadd_ps(ld_##type(w0, c), x0, a0);		\
			a1 = _mm512_fmadd_ps(ld_##type(w1, c), x0, a1);		\
			a2 = _mm512_fmadd_ps(ld_##type(w2, c), x0, a2);		\
			a3 = _mm512_fmadd_ps(ld_##type(w3, c), x0, a3);		\
			a0 = _mm512_fmadd_ps(ld_##type(w0, c + 16), x1, a0);	\
			a1 = _mm512_fmadd_ps(ld_##type(w1, c + 16), x1, a1);	\
			a2 = _mm512_fmadd_ps(ld_##type(w2, c + 16), x1, a2);	\
			a3 = _mm512_fmadd_ps(ld_##type(w3, c + 16), x1, a3);	\
		}								\
		for (; c < cols; c += 16) {					\
			__mmask16 m = cols - c >= 16 ? 0xffff : tail_mask(cols - c); \
			__m512 x0 = _mm512_maskz_loadu_ps(m, x + c);		\
										\
			a0 = _mm512_fmadd_ps(ldm_##type(w0, c, m), x0, a0);	\
			a1 = _mm512_fmadd_ps(ldm_##type(w1, c, m), x0, a1);	\
			a2 = _mm512_fmadd_ps(ldm_##type(w2, c, m), x0, a2);	\
			a3 = _mm512_fmadd_ps(ldm_##type(w3, c, m), x0, a3);	\
		}								\
		y[r] = _mm512_reduce_add_ps(a0);				\
		y[r + 1] = _mm512_reduce_add_ps(a1);				\
		y[r + 2] = _mm512_reduce_add_ps(a2);				\
		y[r + 3] = _mm512_reduce_add_ps(a3);				\
	}									\
	for (; r < rows; r++) {							\
		const char *w0 = (const char *)w + r * rs;			\
		__m512 a0 = _mm512_setzero_ps();				\
		uint32_t c = 0;							\
										\
		for (; c < cols; c += 16) {					\
			__mmask16 m = cols - c >= 16 ? 0xffff : tail_mask(cols - c); \
										\
			a0 = _mm512_fmadd_ps(ldm_##type(w0, c, m),		\
					     _mm512_maskz_loadu_ps(m, x + c), a0); \
		}								\
		y[r] = _mm512_reduce_add_ps(a0);				\
	}									\
}										\
										\
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

DEFINE_GEMV(f32)
DEFINE_GEMV(f16)
DEFINE_GEMV(bf16)
DEFINE_GEMV(q8_0)
DEFINE_GEMV(q4_0)

static TARGET void tile4x4(const float *w, size_t wstride, const float *x, size_t xstride,
			   uint32_t cols, float *y, size_t ystride)
{
	__m512 acc[4][4];

	for (int t = 0; t < 4; t++)
		for (int r = 0; r < 4; r++)
			acc[t][r] = _mm512_setzero_ps();
	for (uint32_t c = 0; c < cols; c += 16) {
		__mmask16 m = cols - c >= 16 ? 0xffff : tail_mask(cols - c);
		__m512 wv[4], xv;

		for (int r = 0; r < 4; r++)
			wv[r] = _mm512_maskz_loadu_ps(m, w + r * wstride + c);
		for (int t = 0; t < 4; t++) {
			xv = _mm512_maskz_loadu_ps(m, x + t * xstride + c);
			for (int r = 0; r < 4; r++)
				acc[t][r] = _mm512_fmadd_ps(wv[r], xv, acc[t][r]);
		}
	}
	for (int t = 0; t < 4; t++)
		for (int r = 0; r < 4; r++)
			y[t * ystride + r] = _mm512_reduce_add_ps(acc[t][r]);
}

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

MP_KERNELS_DEFINE(mp_kernels_avx512, "avx512");
