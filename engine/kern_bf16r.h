/* SPDX-License-Identifier: MIT */
/*
 * mp_f32_to_bf16() of 16 floats on AVX-512 (round to nearest even, NaNs
 * kept quiet) as 32-bit lanes: how the bf16-activation kernels (kern_amx.c,
 * kern_bf16.c) round, so both engines see the activations the scalar
 * reference of their tests does.
 */
#ifndef MP_KERN_BF16R_H
#define MP_KERN_BF16R_H

#include <immintrin.h>

static inline __attribute__((target("avx512f"))) __m512i mp_round_bf16(__m512 v)
{
	const __m512i u = _mm512_castps_si512(v);
	const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
	const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd,
							      _mm512_set1_epi32(0x7fff))), 16);
	const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u,
						      _mm512_set1_epi32(0x7fffffff)),
						      _mm512_set1_epi32(0x7f800000));

	return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

#endif /* MP_KERN_BF16R_H */
