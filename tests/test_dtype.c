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
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}
