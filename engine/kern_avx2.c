// SPDX-License-Identifier: MIT
/* AVX2+FMA+F16C kernels: 8-lane f32 FMAs, bf16/f16/q8_0/q4_0 widened in registers, scalar tails. */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))

static inline TARGET __m256 ld_f32(const void *p, size_t i)
{
	return _mm256_loadu_ps((const float *)p + i);
}

static inline TARGET __m256 ld_bf16(const void *p, size_t i)
{
	__m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));

	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline TARGET __m256 ld_f16(const void *p, size_t i)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}

/*
 * The block types: 8 elements at i (a multiple of 8, so inside one block),
 * each (float)q * d as mp_dtype_to_f32() computes it. A row is whole blocks.
 */
static inline TARGET __m256 block_scale(const uint8_t *b)
{
	uint16_t h;

	memcpy(&h, b, sizeof(h));
	return _mm256_set1_ps(_cvtsh_ss(h));
}

static inline TARGET __m256 ld_q8_0(const void *p, size_t i)
{
	const uint8_t *b = (const uint8_t *)p + i / MP_QBLOCK * MP_Q8_0_BYTES;
	__m128i q = _mm_loadl_epi64((const __m128i *)(b + 2 + i % MP_QBLOCK));

	return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), block_scale(b));
}

static inline TARGET __m256 ld_q4_0(const void *p, size_t i)
{
	const uint8_t *b = (const uint8_t *)p + i / MP_QBLOCK * MP_Q4_0_BYTES;
	const uint32_t j = i % MP_QBLOCK;
	/* elements 0-15 are the low nibbles of the block's 16 bytes, 16-31 the high ones */
	__m128i q = _mm_loadl_epi64((const __m128i *)(b + 2 + j % (MP_QBLOCK / 2)));

	if (j >= MP_QBLOCK / 2)
		q = _mm_srli_epi16(q, 4);
	q = _mm_and_si128(q, _mm_set1_epi8(15));
	return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(q),
								 _mm256_set1_epi32(8))),
			     block_scale(b));
}

/* Scalar loads for the tails (AVX2 has no masked 16-bit loads). */
static inline float sc_f32(const void *p, size_t i)
{
	return ((const float *)p)[i];
}

static inline float sc_bf16(const void *p, size_t i)
{
	uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline TARGET float sc_f16(const void *p, size_t i)
{
	return _cvtsh_ss(((const uint16_t *)p)[i]);
}

/* Tails never meet the block types (rows are whole blocks), but the macros name them. */
#define sc_q8_0 mp_q8_0_at
#define sc_q4_0 mp_q4_0_at

/* Cache lines that 16 columns of 4 rows span, for the prefetches. */
#define PF_LINES_f32	4
#define PF_LINES_f16	2
#define PF_LINES_bf16	2
#define PF_LINES_q8_0	2
#define PF_LINES_q4_0	2

static inline TARGET float hsum(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/*
 * Products of n vectors: every weight row is loaded (and widened) once per
 * group of up to TOKENS vectors, each load feeding an FMA per vector of the
 * group (a register tile of 4 rows x T vectors: 8 accumulators, the group's
 * x and one widened weight register in 16).
 *
 * Each product accumulates exactly as a lone vector's does, whatever n and
 * whichever group it falls in: one 8-lane accumulator per (row, vector)
 * over 8-column blocks in order, its horizontal sum, then the scalar tail
 * in order. So a vector gets the same bits alone (n = 1) and in a batch,
 * which batched decoding needs. The first group prefetches MP_PF_AHEAD
 * bytes on, as in kern_avx512.c.
 */
#define TOKENS 2

#define UNROLL _Pragma("GCC unroll 8")

#define DEFINE_GEMM(type)							\
static inline __attribute__((always_inline)) TARGET void			\
tile_##type(const char *w, size_t rs, const uint32_t R, const uint32_t T,	\
	    uint32_t cols, const float *x, float *y, size_t ystride, bool pf)	\
{										\
	const uint32_t vcols = cols & ~7u, pcols = cols & ~15u;			\
	__m256 acc[TOKENS][4], xv[TOKENS];					\
	uint32_t c = 0;								\
										\
	UNROLL for (uint32_t t = 0; t < T; t++)					\
		UNROLL for (uint32_t r = 0; r < R; r++)				\
			acc[t][r] = _mm256_setzero_ps();			\
	for (; c < vcols; c += 8) {						\
		if (pf && c < pcols && !(c & 8))				\
			for (int l = 0; l < PF_LINES_##type; l++)		\
				_mm_prefetch(w + MP_PF_OFF(type, c) + MP_PF_AHEAD + \
					     64 * l, _MM_HINT_T1);		\
		UNROLL for (uint32_t t = 0; t < T; t++)				\
			xv[t] = _mm256_loadu_ps(x + (size_t)t * cols + c);	\
		UNROLL for (uint32_t r = 0; r < R; r++) {			\
			__m256 wv = ld_##type(w + r * rs, c);			\
										\
			UNROLL for (uint32_t t = 0; t < T; t++)			\
				acc[t][r] = _mm256_fmadd_ps(wv, xv[t], acc[t][r]); \
		}								\
	}									\
	UNROLL for (uint32_t t = 0; t < T; t++) {				\
		const float *xt = x + (size_t)t * cols;				\
										\
		UNROLL for (uint32_t r = 0; r < R; r++) {			\
			const char *wr = w + r * rs;				\
			float s = hsum(acc[t][r]);				\
										\
			for (c = vcols; c < cols; c++)				\
				s += sc_##type(wr, c) * xt[c];			\
			y[t * ystride + r] = s;					\
		}								\
	}									\
}										\
										\
static TARGET void gemm_##type(const void *w, uint32_t rows, uint32_t cols,	\
			       const float *x, uint32_t n, float *y, size_t ystride) \
{										\
	const size_t rs = MP_ROW_##type(cols);					\
	uint32_t r = 0;								\
										\
	for (; r + 4 <= rows; r += 4) {						\
		const char *wr = (const char *)w + r * rs;			\
										\
		for (uint32_t t = 0; t < n; t += TOKENS) {			\
			const float *xt = x + (size_t)t * cols;			\
			float *yt = y + t * ystride + r;			\
										\
			if (n - t == 1)						\
				tile_##type(wr, rs, 4, 1, cols, xt, yt, ystride, t == 0); \
			else							\
				tile_##type(wr, rs, 4, 2, cols, xt, yt, ystride, t == 0); \
		}								\
	}									\
	/* The last rows one by one, a vector at a time (odd shapes only). */	\
	for (; r < rows; r++)							\
		for (uint32_t t = 0; t < n; t++)				\
			tile_##type((const char *)w + r * rs, rs, 1, 1, cols,	\
				    x + (size_t)t * cols, y + t * ystride + r, ystride, false); \
}

/* The same loads into f32 (mp_engine's to_f32). */
#define DEFINE_WIDEN(type)							\
static TARGET void widen_##type(const void *src, float *dst, size_t n)		\
{										\
	size_t i = 0;								\
										\
	for (; i + 8 <= n; i += 8)						\
		_mm256_storeu_ps(dst + i, ld_##type(src, i));			\
	for (; i < n; i++)							\
		dst[i] = sc_##type(src, i);					\
}

#define DEFINE_TYPE(type) DEFINE_GEMM(type) DEFINE_WIDEN(type)

DEFINE_TYPE(f32)
DEFINE_TYPE(f16)
DEFINE_TYPE(bf16)
DEFINE_TYPE(q8_0)
DEFINE_TYPE(q4_0)

static TARGET float dot(const float *a, const float *b, uint32_t n)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = s0;
	uint32_t i = 0;
	float s;

	for (; i + 16 <= n; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
	}
	s = hsum(_mm256_add_ps(s0, s1));
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

static TARGET void axpy(float a, const float *x, float *y, uint32_t n)
{
	__m256 av = _mm256_set1_ps(a);
	uint32_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i),
							_mm256_loadu_ps(y + i)));
	for (; i < n; i++)
		y[i] += a * x[i];
}

static TARGET float read_sum(const void *buf, size_t bytes)
{
	const float *f = buf;
	__m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
	size_t n = bytes / sizeof(float), i = 0;

	for (; i + 32 <= n; i += 32) {
		s0 = _mm256_add_ps(s0, _mm256_loadu_ps(f + i));
		s1 = _mm256_add_ps(s1, _mm256_loadu_ps(f + i + 8));
		s2 = _mm256_add_ps(s2, _mm256_loadu_ps(f + i + 16));
		s3 = _mm256_add_ps(s3, _mm256_loadu_ps(f + i + 24));
	}
	for (; i < n; i += 8)
		s0 = _mm256_add_ps(s0, _mm256_loadu_ps(f + i));
	return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

/* SwiGLU: the scalar loop (AVX-512's computes expf's bits 16 lanes at a time). */
static void silu_mul(const float *g, const float *u, float *h, uint32_t n)
{
	mp_silu_mul_scalar(g, u, h, n);
}

/*
 * The argmax in two passes as the scalar table's (kern_scalar.c): 4 x 8
 * running maxima, then the first block of 8 holding a value equal to the
 * largest. MAXPS(x, m) is x > m ? x : m, the scan's select, a NaN x
 * included (m is never NaN); CMPEQ_OQ is the scalar ==.
 */
static TARGET uint32_t argmax(const float *x, uint32_t n)
{
	__m256 m0, m1, m2, m3, mx;
	float t[8], max;
	uint32_t i = 0;

	if (!n || isnan(x[0]))
		return 0;
	m0 = m1 = m2 = m3 = _mm256_set1_ps(x[0]);
	for (; i + 32 <= n; i += 32) {
		m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
		m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
		m2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), m2);
		m3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), m3);
	}
	for (; i + 8 <= n; i += 8)
		m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
	_mm256_storeu_ps(t, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
	max = t[0];
	for (uint32_t j = 1; j < 8; j++)
		max = t[j] > max ? t[j] : max;
	for (; i < n; i++)
		max = x[i] > max ? x[i] : max;
	mx = _mm256_set1_ps(max);
	for (i = 0; i + 8 <= n; i += 8) {
		int k = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mx, _CMP_EQ_OQ));

		if (k)
			return i + (uint32_t)__builtin_ctz((unsigned)k);
	}
	for (; !(x[i] == max); i++)
		;
	return i;
}

MP_KERNELS_DEFINE(mp_kernels_avx2, "avx2", NULL, NULL);
