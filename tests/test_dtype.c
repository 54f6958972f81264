// SPDX-License-Identifier: MIT
/* Weight type conversions: exact round trips, round-to-nearest-even, subnormals, inf, NaN. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static float f32_of(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t bits_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static void sizes_names_and_parse(void **state)
{
	enum mp_dtype t;

	(void)state;
	assert_int_equal(mp_dtype_size(MP_DTYPE_F32), 4);
	assert_int_equal(mp_dtype_size(MP_DTYPE_F16), 2);
	assert_int_equal(mp_dtype_size(MP_DTYPE_BF16), 2);
	assert_int_equal(mp_dtype_size(MP_DTYPE_COUNT), 0);
	assert_null(mp_dtype_name(MP_DTYPE_COUNT));
	/* block types have no whole element size: callers must use mp_dtype_bytes() */
	assert_int_equal(mp_dtype_size(MP_DTYPE_Q8_0), 0);
	assert_int_equal(mp_dtype_size(MP_DTYPE_Q4_0), 0);
	assert_int_equal(mp_dtype_block(MP_DTYPE_BF16), 1);
	assert_int_equal(mp_dtype_block(MP_DTYPE_Q8_0), 32);
	assert_int_equal(mp_dtype_block(MP_DTYPE_Q4_0), 32);
	assert_int_equal(mp_dtype_block(MP_DTYPE_COUNT), 0);
	assert_int_equal(mp_dtype_bytes(MP_DTYPE_F32, 3), 12);
	assert_int_equal(mp_dtype_bytes(MP_DTYPE_Q8_0, 64), 68);
	assert_int_equal(mp_dtype_bytes(MP_DTYPE_Q4_0, 64), 36);
	assert_int_equal(mp_dtype_bytes(MP_DTYPE_Q8_0, 33), 0);	/* not whole blocks */
	assert_int_equal(mp_dtype_bytes(MP_DTYPE_F32, UINT64_MAX / 2), 0);	/* overflows */
	assert_int_equal(mp_dtype_bytes(MP_DTYPE_COUNT, 32), 0);
	assert_int_equal(mp_dtype_elems(MP_DTYPE_Q8_0, 68), 64);
	assert_int_equal(mp_dtype_elems(MP_DTYPE_Q4_0, 36), 64);
	assert_int_equal(mp_dtype_elems(MP_DTYPE_BF16, 6), 3);
	for (int i = 0; i < MP_DTYPE_COUNT; i++) {
		assert_int_equal(mp_dtype_parse(mp_dtype_name((enum mp_dtype)i), &t), 0);
		assert_int_equal(t, i);
	}
	t_log_reset();
	assert_int_equal(mp_dtype_parse("f8", &t), -EINVAL);
	assert_true(t_log_contains("unknown weight type 'f8'"));
	assert_int_equal(mp_dtype_parse(NULL, &t), -EINVAL);
}

/* Every bf16 and f16 value survives the trip through f32 bit for bit (NaNs stay NaN). */
static void every_half_value_round_trips(void **state)
{
	(void)state;
	for (uint32_t b = 0; b <= 0xffff; b++) {
		float f = mp_bf16_to_f32((uint16_t)b);
		uint16_t back = mp_f32_to_bf16(f);

		if ((b & 0x7fff) > 0x7f80) {
			assert_true(isnan(f));
			assert_true((back & 0x7fff) > 0x7f80);
			assert_int_equal(back & 0x8000, b & 0x8000);
		} else {
			assert_int_equal(back, b);
			assert_int_equal(bits_of(f), b << 16);
		}
	}
	for (uint32_t h = 0; h <= 0xffff; h++) {
		float f = mp_f16_to_f32((uint16_t)h);
		uint16_t back = mp_f32_to_f16(f);

		if ((h & 0x7fff) > 0x7c00) {
			assert_true(isnan(f));
			assert_true((back & 0x7fff) > 0x7c00);
		} else {
			assert_int_equal(back, h);
		}
	}
}

static void bf16_rounds_to_nearest_even(void **state)
{
	(void)state;
	/* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1.0) */
	assert_int_equal(mp_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
	/* 1 + 3 * 2^-8 is halfway between 0x3f81 and 0x3f82: to even */
	assert_int_equal(mp_f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);
	/* just above halfway rounds up, just below rounds down */
	assert_int_equal(mp_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
	assert_int_equal(mp_f32_to_bf16(1.0f + 0x1p-8f - 0x1p-20f), 0x3f80);
	assert_int_equal(mp_f32_to_bf16(-1.0f - 0x3p-8f), 0xbf82);
	/* the largest float rounds up into infinity; just below the tie it does not */
	assert_int_equal(mp_f32_to_bf16(FLT_MAX), 0x7f80);
	assert_int_equal(mp_f32_to_bf16(f32_of(0x7f7f7fffu)), 0x7f7f);
}

static void bf16_specials(void **state)
{
	uint16_t n;

	(void)state;
	assert_int_equal(mp_f32_to_bf16(INFINITY), 0x7f80);
	assert_int_equal(mp_f32_to_bf16(-INFINITY), 0xff80);
	assert_int_equal(mp_f32_to_bf16(0.0f), 0x0000);
	assert_int_equal(mp_f32_to_bf16(-0.0f), 0x8000);
	/* a NaN whose payload is only in the low bits must not become infinity */
	n = mp_f32_to_bf16(f32_of(0x7f800001u));
	assert_true((n & 0x7fff) > 0x7f80);
	n = mp_f32_to_bf16(f32_of(0xff800001u));
	assert_true((n & 0x7fff) > 0x7f80);
	assert_int_equal(n & 0x8000, 0x8000);
	/* f32 subnormals keep their top bits; ties go to even */
	assert_int_equal(mp_f32_to_bf16(f32_of(0x00010000u)), 0x0001);
	assert_int_equal(mp_f32_to_bf16(f32_of(0x00008000u)), 0x0000);
	assert_int_equal(mp_f32_to_bf16(f32_of(0x00018000u)), 0x0002);
	assert_int_equal(bits_of(mp_bf16_to_f32(0x0001)), 0x00010000u);
}

static void f16_rounds_to_nearest_even(void **state)
{
	(void)state;
	assert_int_equal(mp_f32_to_f16(1.0f), 0x3c00);
	/* ulp at 1 is 2^-10: half an ulp is a tie to even */
	assert_int_equal(mp_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	assert_int_equal(mp_f32_to_f16(1.0f + 0x3p-11f), 0x3c02);
	assert_int_equal(mp_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
	/* largest finite, the last value that rounds to it, the first that overflows */
	assert_int_equal(mp_f32_to_f16(65504.0f), 0x7bff);
	assert_int_equal(mp_f32_to_f16(65519.99f), 0x7bff);
	assert_int_equal(mp_f32_to_f16(65520.0f), 0x7c00);
	assert_int_equal(mp_f32_to_f16(-65520.0f), 0xfc00);
	assert_int_equal(mp_f32_to_f16(FLT_MAX), 0x7c00);
	/* rounding that carries into the exponent */
	assert_int_equal(mp_f32_to_f16(2047.5f), 0x6800);	/* 2048 */
}

static void f16_subnormals(void **state)
{
	(void)state;
	/* smallest subnormal 2^-24, largest 1023 * 2^-24, smallest normal 2^-14 */
	assert_int_equal(mp_f32_to_f16(0x1p-24f), 0x0001);
	assert_true(mp_f16_to_f32(0x0001) == 0x1p-24f);
	assert_true(mp_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
	assert_int_equal(mp_f32_to_f16(1023 * 0x1p-24f), 0x03ff);
	assert_int_equal(mp_f32_to_f16(0x1p-14f), 0x0400);
	/* halfway below the smallest normal rounds up into it (even) */
	assert_int_equal(mp_f32_to_f16(1023.5f * 0x1p-24f), 0x0400);
	/* ties between subnormals go to even; below half the smallest is zero */
	assert_int_equal(mp_f32_to_f16(0x1p-25f), 0x0000);
	assert_int_equal(mp_f32_to_f16(0x3p-25f), 0x0002);
	assert_int_equal(mp_f32_to_f16(0x1p-25f + 0x1p-35f), 0x0001);
	assert_int_equal(mp_f32_to_f16(1e-10f), 0x0000);
	assert_int_equal(mp_f32_to_f16(-1e-10f), 0x8000);
	assert_int_equal(mp_f32_to_f16(f32_of(1)), 0x0000);	/* f32 subnormal */
	assert_true(mp_f16_to_f32(0x8001) == -0x1p-24f);
}

static void f16_specials(void **state)
{
	uint16_t n;

	(void)state;
	assert_int_equal(mp_f32_to_f16(INFINITY), 0x7c00);
	assert_int_equal(mp_f32_to_f16(-INFINITY), 0xfc00);
	assert_int_equal(mp_f32_to_f16(-0.0f), 0x8000);
	assert_true(isinf(mp_f16_to_f32(0x7c00)) && mp_f16_to_f32(0x7c00) > 0);
	assert_true(isinf(mp_f16_to_f32(0xfc00)) && mp_f16_to_f32(0xfc00) < 0);
	assert_true(signbit(mp_f16_to_f32(0x8000)));
	n = mp_f32_to_f16(NAN);
	assert_true((n & 0x7fff) > 0x7c00);
	n = mp_f32_to_f16(f32_of(0x7f800001u));
	assert_true((n & 0x7fff) > 0x7c00);
	assert_true(isnan(mp_f16_to_f32(0x7c01)));
	assert_true(isnan(mp_f16_to_f32(0xfe00)));
}

/* The bulk conversions are the scalar ones applied to each element. */
static void bulk_matches_scalar(void **state)
{
	enum { N = 4099 };
	float *src = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
	uint16_t *h = malloc(N * sizeof(uint16_t));
	uint32_t x = 12345;

	(void)state;
	for (int i = 0; i < N; i++) {
		x = x * 1664525u + 1013904223u;
		src[i] = f32_of(x);	/* every kind of value: NaN, inf, subnormal */
	}
	for (int t = MP_DTYPE_F16; t <= MP_DTYPE_BF16; t++) {
		mp_dtype_from_f32((enum mp_dtype)t, src, h, N);
		mp_dtype_to_f32((enum mp_dtype)t, h, back, N);
		for (int i = 0; i < N; i++) {
			uint16_t want = t == MP_DTYPE_F16 ? mp_f32_to_f16(src[i])
							  : mp_f32_to_bf16(src[i]);
			float wf = t == MP_DTYPE_F16 ? mp_f16_to_f32(h[i]) : mp_bf16_to_f32(h[i]);

			assert_int_equal(h[i], want);
			assert_int_equal(bits_of(back[i]), bits_of(wf));
		}
	}
	mp_dtype_from_f32(MP_DTYPE_F32, src, back, N);
	assert_memory_equal(src, back, N * sizeof(float));
	free(src);
	free(back);
	free(h);
}

/* The f16 scale of block b (bytes long) at p. */
static uint16_t q_scale(const uint8_t *p, size_t b, size_t bytes)
{
	return (uint16_t)(p[b * bytes] | p[b * bytes + 1] << 8);
}

/*
 * Q8_0 is llama.cpp's quantize_row_q8_0_ref: d = max |x| / 127 stored as
 * f16, q = round(x / d) with ties away from zero; the value is q * d.
 */
static void q8_0_quantizes_as_llama_cpp_reference(void **state)
{
	float x[64], y[64];
	uint8_t q[68];

	(void)state;
	/* block 0: max |x| = 127, so d = 1 and q = round(x) */
	for (int j = 0; j < 32; j++)
		x[j] = (float)j - 16.0f;
	x[0] = -127.0f;
	x[1] = 2.5f;		/* a tie: away from zero (numpy's round would give 2) */
	x[2] = -2.5f;
	x[3] = 0.49f;
	/* block 1: all zero, d = 0 */
	memset(x + 32, 0, 32 * sizeof(float));
	mp_dtype_from_f32(MP_DTYPE_Q8_0, x, q, 64);
	assert_int_equal(q_scale(q, 0, 34), 0x3c00);	/* 1.0 */
	assert_int_equal((int8_t)q[2 + 0], -127);
	assert_int_equal((int8_t)q[2 + 1], 3);
	assert_int_equal((int8_t)q[2 + 2], -3);
	assert_int_equal((int8_t)q[2 + 3], 0);
	assert_int_equal((int8_t)q[2 + 31], 15);
	assert_int_equal(q_scale(q, 1, 34), 0);
	for (int j = 0; j < 32; j++)
		assert_int_equal(q[34 + 2 + j], 0);
	mp_dtype_to_f32(MP_DTYPE_Q8_0, q, y, 64);
	assert_true(y[0] == -127.0f && y[1] == 3.0f && y[31] == 15.0f && y[40] == 0.0f);
}

/*
 * Q4_0 is quantize_row_q4_0_ref: d = (the value of largest magnitude) / -8,
 * q = min(15, trunc(x / d + 8.5)); element j < 16 is the low nibble of byte
 * j, element 16 + j its high nibble; the value is (q - 8) * d.
 */
static void q4_0_quantizes_as_llama_cpp_reference(void **state)
{
	float x[32], y[32];
	uint8_t q[18];

	(void)state;
	for (int j = 0; j < 32; j++)
		x[j] = 0.0f;
	x[0] = -8.0f;		/* the largest magnitude, negative: d = 1 */
	x[1] = 7.4f;		/* 15.9 -> 15 */
	x[2] = 0.5f;		/* 9.0 -> 9: value 1 */
	x[3] = -0.5f;		/* 8.0 -> 8: value 0 */
	x[16] = 3.0f;		/* the high nibble of byte 0 */
	x[17] = 7.9f;		/* 16.4 -> 16 -> capped at 15 */
	mp_dtype_from_f32(MP_DTYPE_Q4_0, x, q, 32);
	assert_int_equal(q_scale(q, 0, 18), 0x3c00);
	assert_int_equal(q[2 + 0], 0 | 11 << 4);
	assert_int_equal(q[2 + 1], 15 | 15 << 4);
	assert_int_equal(q[2 + 2] & 15, 9);
	assert_int_equal(q[2 + 3] & 15, 8);
	mp_dtype_to_f32(MP_DTYPE_Q4_0, q, y, 32);
	assert_true(y[0] == -8.0f && y[1] == 7.0f && y[2] == 1.0f && y[3] == 0.0f);
	assert_true(y[16] == 3.0f && y[17] == 7.0f && y[4] == 0.0f);
	/* positive largest value: d = -1, and it comes back exactly */
	x[0] = 8.0f;
	mp_dtype_from_f32(MP_DTYPE_Q4_0, x, q, 32);
	assert_int_equal(q_scale(q, 0, 18), 0xbc00);	/* -1.0 */
	mp_dtype_to_f32(MP_DTYPE_Q4_0, q, y, 32);
	assert_true(y[0] == 8.0f && y[2] == -0.0f + 0.0f);
}

/*
 * Random rows survive the round trip within half a step of their block's
 * scale (q4_0: a step for its largest positive values); NaN and infinities quantize to defined bytes (never a crash or an
 * undefined conversion, which UBSan would report).
 */
static void block_round_trip_is_within_half_a_step(void **state)
{
	enum { N = 32 * 40 };
	const enum mp_dtype types[] = { MP_DTYPE_Q8_0, MP_DTYPE_Q4_0 };
	float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
	uint8_t *q = malloc(mp_dtype_bytes(MP_DTYPE_Q8_0, N));
	uint32_t r = 7;

	(void)state;
	for (size_t t = 0; t < 2; t++) {
		const size_t bb = mp_dtype_bytes(types[t], 32);

		for (int i = 0; i < N; i++) {
			r = r * 1664525u + 1013904223u;
			/* blocks of very different magnitudes */
			x[i] = ((float)(r >> 8) / 16777216.0f - 0.5f) * (float)(1 + i / 32);
		}
		mp_dtype_from_f32(types[t], x, q, N);
		mp_dtype_to_f32(types[t], q, y, N);
		for (int i = 0; i < N; i++) {
			float d = fabsf(mp_f16_to_f32(q_scale(q, (size_t)i / 32, bb)));

			/*
			 * half a step, plus the f16 rounding of d over at most 127
			 * steps; q4_0's quants are -8..7, so one of the values
			 * beyond 7.5 steps may be a whole step off
			 */
			float steps = types[t] == MP_DTYPE_Q4_0 && fabsf(x[i]) > 7.5f * d ? 1.0f
											 : 0.5f;

			assert_true(fabsf(x[i] - y[i]) <= d * steps + d * 127.0f * 0x1p-11f);
		}
		x[5] = NAN;
		x[40] = INFINITY;
		x[70] = -INFINITY;
		mp_dtype_from_f32(types[t], x, q, N);
		mp_dtype_to_f32(types[t], q, y, N);
	}
	free(x);
	free(y);
	free(q);
}

static int setup(void **state)
{
	(void)state;
	t_log_capture();
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(sizes_names_and_parse),
		cmocka_unit_test(every_half_value_round_trips),
		cmocka_unit_test(bf16_rounds_to_nearest_even),
		cmocka_unit_test(bf16_specials),
		cmocka_unit_test(f16_rounds_to_nearest_even),
		cmocka_unit_test(f16_subnormals),
		cmocka_unit_test(f16_specials),
		cmocka_unit_test(bulk_matches_scalar),
		cmocka_unit_test(q8_0_quantizes_as_llama_cpp_reference),
		cmocka_unit_test(q4_0_quantizes_as_llama_cpp_reference),
		cmocka_unit_test(block_round_trip_is_within_half_a_step),
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}
