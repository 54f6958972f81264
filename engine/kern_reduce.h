/* SPDX-License-Identifier: MIT */
/*
 * The sums of a 4-row tile's 16-lane accumulators, several at once, in the
 * pairing tree of GCC's _mm512_reduce_add_ps (lane i + lane i + 8, then
 * j + j + 4, then k + k + 2, then 0 + 1): every sum is the bits of its own
 * _mm512_reduce_add_ps whichever sums it is taken with, so a vector's
 * products stay the same alone and in a batch. 16 sums take 30 shuffles and
 * 15 adds against 16 x (4 + 4); 4 take 9 and 5 against 4 x (4 + 4).
 */
#ifndef MP_KERN_REDUCE_H
#define MP_KERN_REDUCE_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define MP_RED_TARGET __attribute__((target("avx512f"), always_inline))
#define MP_RED_UNROLL _Pragma("GCC unroll 16")

/* Lanes 0-7 the halves' sums of a (lane i + lane i + 8), lanes 8-15 those of b. */
static inline MP_RED_TARGET __m512 mp_red_halves(__m512 a, __m512 b)
{
	return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)),
			     _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)));
}

/* From two mp_red_halves(): quarter k the sums j + j + 4 of the k-th of their four inputs. */
static inline MP_RED_TARGET __m512 mp_red_quarters(__m512 x, __m512 y)
{
	return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)),
			     _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)));
}

/* The sums of a[0..3], in order. */
static inline MP_RED_TARGET __m128 mp_reduce4(const __m512 a[4])
{
	const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
	__m512 c = mp_red_quarters(mp_red_halves(a[0], a[1]), mp_red_halves(a[2], a[3]));

	/* in each quarter: k + k + 2, then 0 + 1 */
	c = _mm512_add_ps(c, _mm512_permute_ps(c, _MM_SHUFFLE(1, 0, 3, 2)));
	c = _mm512_add_ps(c, _mm512_permute_ps(c, _MM_SHUFFLE(2, 3, 0, 1)));
	return _mm512_castps512_ps128(_mm512_permutexvar_ps(first, c));
}

/* Lane 4 q + n: the sum of a[4 n + q] (a 4 x 4 transpose of a's order). */
static inline MP_RED_TARGET __m512 mp_reduce16(const __m512 a[16])
{
	__m512 c[4], d[2];

	MP_RED_UNROLL for (int n = 0; n < 4; n++)
		c[n] = mp_red_quarters(mp_red_halves(a[4 * n], a[4 * n + 1]),
				       mp_red_halves(a[4 * n + 2], a[4 * n + 3]));
	/* in each quarter: elements 0, 1 of c[2m]'s input and of c[2m + 1]'s: k + k + 2 */
	MP_RED_UNROLL for (int m = 0; m < 2; m++) {
		const __m512d x = _mm512_castps_pd(c[2 * m]), y = _mm512_castps_pd(c[2 * m + 1]);

		d[m] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
				     _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
	}
	/* 0 + 1 */
	return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
			     _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/*
 * y[t * ystride + r] = the sum of acc[t][r] for t < T, r < 4: the first 4
 * vectors' 16 sums together, the others 4 at a time.
 */
static inline MP_RED_TARGET void mp_reduce_tile(__m512 acc[][4], uint32_t T, float *y,
						size_t ystride)
{
	uint32_t t = 0;

	if (T >= 4) {
		__m512 a[16], s;

		MP_RED_UNROLL for (uint32_t r = 0; r < 4; r++)
			MP_RED_UNROLL for (uint32_t v = 0; v < 4; v++)
				a[4 * r + v] = acc[v][r];
		s = mp_reduce16(a);
		_mm_storeu_ps(y, _mm512_castps512_ps128(s));
		_mm_storeu_ps(y + ystride, _mm512_extractf32x4_ps(s, 1));
		_mm_storeu_ps(y + 2 * ystride, _mm512_extractf32x4_ps(s, 2));
		_mm_storeu_ps(y + 3 * ystride, _mm512_extractf32x4_ps(s, 3));
		t = 4;
	}
	MP_RED_UNROLL for (; t < T; t++)
		_mm_storeu_ps(y + t * ystride, mp_reduce4(acc[t]));
}

/*
 * A tile's R x T sums into y[t * ystride + r], each the bits of its own
 * _mm512_reduce_add_ps: 4 rows at once by mp_reduce_tile(), fewer one by one.
 */
static inline MP_RED_TARGET void mp_store_tile(__m512 acc[][4], const uint32_t R,
					       const uint32_t T, float *y, size_t ystride)
{
	if (R == 4) {
		mp_reduce_tile(acc, T, y, ystride);
		return;
	}
	MP_RED_UNROLL for (uint32_t t = 0; t < T; t++)
		MP_RED_UNROLL for (uint32_t r = 0; r < R; r++)
			y[t * ystride + r] = _mm512_reduce_add_ps(acc[t][r]);
}

#endif /* MP_KERN_REDUCE_H */
