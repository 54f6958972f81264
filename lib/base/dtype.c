// SPDX-License-Identifier: MIT
/* Weight types: sizes, names, scalar/bulk conversions to and from f32, the block types' (de)quantizers. */
#include <math.h>
#include <string.h>

#include "base/base.h"

static const struct {
	const char *name;
	uint32_t block;		/* elements per block */
	uint32_t block_bytes;
} dtypes[MP_DTYPE_COUNT] = {
	[MP_DTYPE_F32] = { "f32", 1, 4 },
	[MP_DTYPE_F16] = { "f16", 1, 2 },
	[MP_DTYPE_BF16] = { "bf16", 1, 2 },
	[MP_DTYPE_Q8_0] = { "q8_0", MP_QBLOCK, 2 + MP_QBLOCK },
	[MP_DTYPE_Q4_0] = { "q4_0", MP_QBLOCK, 2 + MP_QBLOCK / 2 },
};

size_t mp_dtype_size(enum mp_dtype t)
{
	return (unsigned)t < MP_DTYPE_COUNT && dtypes[t].block == 1 ? dtypes[t].block_bytes : 0;
}

uint32_t mp_dtype_block(enum mp_dtype t)
{
	return (unsigned)t < MP_DTYPE_COUNT ? dtypes[t].block : 0;
}

uint64_t mp_dtype_bytes(enum mp_dtype t, uint64_t n)
{
	uint64_t bytes;

	if ((unsigned)t >= MP_DTYPE_COUNT || n % dtypes[t].block ||
	    __builtin_mul_overflow(n / dtypes[t].block, (uint64_t)dtypes[t].block_bytes, &bytes))
		return 0;
	return bytes;
}

uint64_t mp_dtype_elems(enum mp_dtype t, uint64_t bytes)
{
	if ((unsigned)t >= MP_DTYPE_COUNT)
		return 0;
	return bytes / dtypes[t].block_bytes * dtypes[t].block;
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
	return mp_err(-EINVAL, "unknown weight type '%s' (expected f32, f16, bf16, q8_0 or q4_0)",
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

/*
 * Block types. A block's value is (float)q * d in f32, the product
 * llama.cpp's dequantize_row_q8_0/_q4_0 compute: every path (these, the
 * engine's kernels) gives the same floats.
 */
#define Q8_0_BYTES	(2 + MP_QBLOCK)
#define Q4_0_BYTES	(2 + MP_QBLOCK / 2)

static float block_scale(const uint8_t *b)
{
	return mp_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
}

static void put_scale(uint8_t *b, float d)
{
	uint16_t h = mp_f32_to_f16(d);

	b[0] = (uint8_t)h;
	b[1] = (uint8_t)(h >> 8);
}

static void dequant_q8_0(const uint8_t *b, float *y)
{
	float d = block_scale(b);

	for (uint32_t j = 0; j < MP_QBLOCK; j++)
		y[j] = (float)(int8_t)b[2 + j] * d;
}

static void dequant_q4_0(const uint8_t *b, float *y)
{
	float d = block_scale(b);

	for (uint32_t j = 0; j < MP_QBLOCK / 2; j++) {
		y[j] = (float)((b[2 + j] & 15) - 8) * d;
		y[j + MP_QBLOCK / 2] = (float)((b[2 + j] >> 4) - 8) * d;
	}
}

/*
 * quantize_row_q8_0_ref: d = max |x| / 127, q = round(x / d) half away from
 * zero. The range checks only matter for NaN or infinite input (where a
 * float-to-int conversion would be undefined): finite input gives
 * llama.cpp's bytes.
 */
static void quant_q8_0(const float *x, uint8_t *b)
{
	float amax = 0.0f, d, id;

	for (uint32_t j = 0; j < MP_QBLOCK; j++)
		amax = fmaxf(amax, fabsf(x[j]));
	d = amax / 127.0f;
	id = d != 0.0f ? 1.0f / d : 0.0f;
	put_scale(b, d);
	for (uint32_t j = 0; j < MP_QBLOCK; j++) {
		float v = roundf(x[j] * id);

		b[2 + j] = (uint8_t)(int8_t)(v >= -127.0f && v <= 127.0f ? (int)v :
					     v > 0.0f ? 127 : v < 0.0f ? -127 : 0);
	}
}

/* quantize_row_q4_0_ref: d = (the value of largest magnitude) / -8, q = trunc(x / d + 8.5) capped at 15. */
static int nibble(float v)
{
	v += 8.5f;
	return v >= 0.0f && v < 15.0f ? (int)v : v >= 15.0f ? 15 : 0;
}

static void quant_q4_0(const float *x, uint8_t *b)
{
	float amax = 0.0f, max = 0.0f, d, id;

	for (uint32_t j = 0; j < MP_QBLOCK; j++) {
		if (amax < fabsf(x[j])) {
			amax = fabsf(x[j]);
			max = x[j];
		}
	}
	d = max / -8.0f;
	id = d != 0.0f ? 1.0f / d : 0.0f;
	put_scale(b, d);
	for (uint32_t j = 0; j < MP_QBLOCK / 2; j++)
		b[2 + j] = (uint8_t)(nibble(x[j] * id) | nibble(x[j + MP_QBLOCK / 2] * id) << 4);
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
	case MP_DTYPE_Q8_0:
		for (size_t i = 0; i + MP_QBLOCK <= n; i += MP_QBLOCK)
			dequant_q8_0((const uint8_t *)src + i / MP_QBLOCK * Q8_0_BYTES, dst + i);
		break;
	case MP_DTYPE_Q4_0:
		for (size_t i = 0; i + MP_QBLOCK <= n; i += MP_QBLOCK)
			dequant_q4_0((const uint8_t *)src + i / MP_QBLOCK * Q4_0_BYTES, dst + i);
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
	case MP_DTYPE_Q8_0:
		for (size_t i = 0; i + MP_QBLOCK <= n; i += MP_QBLOCK)
			quant_q8_0(src + i, (uint8_t *)dst + i / MP_QBLOCK * Q8_0_BYTES);
		break;
	case MP_DTYPE_Q4_0:
		for (size_t i = 0; i + MP_QBLOCK <= n; i += MP_QBLOCK)
			quant_q4_0(src + i, (uint8_t *)dst + i / MP_QBLOCK * Q4_0_BYTES);
		break;
	default:
		break;
	}
}
