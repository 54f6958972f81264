// SPDX-License-Identifier: MIT
/* Weight types: sizes, names and scalar/bulk conversions to and from f32. */
#include <string.h>

#include "base/base.h"

static const struct {
	const char *name;
	size_t size;
} dtypes[MP_DTYPE_COUNT] = {
	[MP_DTYPE_F32] = { "f32", 4 },
	[MP_DTYPE_F16] = { "f16", 2 },
	[MP_DTYPE_BF16] = { "bf16", 2 },
};

size_t mp_dtype_size(enum mp_dtype t)
{
	return (unsigned)t < MP_DTYPE_COUNT ? dtypes[t].size : 0;
}

const char *mp_dtype_name(enum mp_dtype t)
{
	return (unsigned)t < MP_DTYPE_COUNT ? dtypes[t].name : NULL;
}

int mp_dtype_parse(const char *name, enum mp_dtype *out)
{
	for (unsigned i = 0; i < MP_DTYPE_COUNT; i++) {
		if (name && !strcmp(name, dtypes[i].name)) {
			*out = (enum mp_dtype)i;
			return 0;
		}
	}
	return mp_err(-EINVAL, "unknown weight type '%s' (expected f32, f16 or bf16)",
		      name ? name : "(null)");
}

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

float mp_bf16_to_f32(uint16_t b)
{
	return bits_f32((uint32_t)b << 16);
}

uint16_t mp_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)	/* NaN: keep it a quiet NaN */
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);		/* round to nearest even */
	return (uint16_t)(u >> 16);
}

float mp_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;

	if (exp == 0x1f)
		return bits_f32(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		/* zero or subnormal: value = man * 2^-24 */
		float v = (float)man * (1.0f / 16777216.0f);

		return sign ? -v : v;
	}
	return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t mp_f32_to_f16(float f)
{
	uint32_t u = f32_bits(f);
	uint32_t sign = (u >> 16) & 0x8000;
	uint32_t abs = u & 0x7fffffffu;

	if (abs > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00);	/* NaN */
	if (abs >= 0x477ff000u)				/* rounds to >= 65520: inf */
		return (uint16_t)(sign | 0x7c00);
	if (abs < 0x38800000u) {
		/* result is subnormal in f16: scale so the rounding happens in f32 */
		float v = bits_f32(abs) * 16777216.0f;	/* 2^24 */
		uint32_t m = (uint32_t)v;
		float rem = v - (float)m;

		if (rem > 0.5f || (rem == 0.5f && (m & 1)))
			m++;
		return (uint16_t)(sign | m);
	}
	/* normal: rebias exponent, round mantissa to 10 bits, nearest even */
	uint32_t r = abs - (112u << 23);
	r += 0xfffu + ((r >> 13) & 1);
	return (uint16_t)(sign | (r >> 13));
}

void mp_dtype_to_f32(enum mp_dtype t, const void *src, float *dst, size_t n)
{
	const uint16_t *h = src;

	switch (t) {
	case MP_DTYPE_F32:
		memcpy(dst, src, n * sizeof(float));
		break;
	case MP_DTYPE_F16:
		for (size_t i = 0; i < n; i++)
			dst[i] = mp_f16_to_f32(h[i]);
		break;
	case MP_DTYPE_BF16:
		for (size_t i = 0; i < n; i++)
			dst[i] = mp_bf16_to_f32(h[i]);
		break;
	default:
		break;
	}
}

void mp_dtype_from_f32(enum mp_dtype t, const float *src, void *dst, size_t n)
{
	uint16_t *h = dst;

	switch (t) {
	case MP_DTYPE_F32:
		memcpy(dst, src, n * sizeof(float));
		break;
	case MP_DTYPE_F16:
		for (size_t i = 0; i < n; i++)
			h[i] = mp_f32_to_f16(src[i]);
		break;
	case MP_DTYPE_BF16:
		for (size_t i = 0; i < n; i++)
			h[i] = mp_f32_to_bf16(src[i]);
		break;
	default:
		break;
	}
}
