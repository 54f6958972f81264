// SPDX-License-Identifier: MIT
/* Portable C kernels: the reference every vector path is tested against. */
#include <string.h>

#include "engine/kernels.h"

/* Partial sums per dot product, so the compiler can overlap the additions. */
#define LANES 8

static inline float load_f32(const void *w, size_t i)
{
	return ((const float *)w)[i];
}

static inline float load_f16(const void *w, size_t i)
{
	return mp_f16_to_f32(((const uint16_t *)w)[i]);
}

static inline float load_bf16(const void *w, size_t i)
{
	uint32_t u = (uint32_t)((const uint16_t *)w)[i] << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

#define load_q8_0 mp_q8_0_at
#define load_q4_0 mp_q4_0_at

/*
 * Each row is read once and dotted with every vector while it is in L1, in
 * the same order for each: a vector's products are the same bits alone and
 * in a batch.
 */
#define DEFINE_TYPE(type)							\
static void gemm_##type(const void *w, uint32_t rows, uint32_t cols, const float *x,	\
			uint32_t n, float *y, size_t ystride)			\
{										\
	for (uint32_t r = 0; r < rows; r++) {					\
		const char *row = (const char *)w + r * MP_ROW_##type(cols);	\
										\
		for (uint32_t t = 0; t < n; t++) {				\
			const float *xt = x + (size_t)t * cols;			\
			float acc[LANES] = { 0 };				\
			float sum = 0.0f;					\
			uint32_t c = 0;						\
										\
			for (; c + LANES <= cols; c += LANES)			\
				for (uint32_t l = 0; l < LANES; l++)		\
					acc[l] += load_##type(row, c + l) * xt[c + l]; \
			for (; c < cols; c++)					\
				acc[0] += load_##type(row, c) * xt[c];		\
			for (uint32_t l = 0; l < LANES; l++)			\
				sum += acc[l];					\
			y[t * ystride + r] = sum;				\
		}								\
	}									\
}										\
										\
static void widen_##type(const void *src, float *dst, size_t n)		\
{										\
	for (size_t i = 0; i < n; i++)						\
		dst[i] = load_##type(src, i);					\
}

DEFINE_TYPE(f32)
DEFINE_TYPE(f16)
DEFINE_TYPE(bf16)
DEFINE_TYPE(q8_0)
DEFINE_TYPE(q4_0)

static float dot(const float *a, const float *b, uint32_t n)
{
	float acc[LANES] = { 0 };
	float sum = 0.0f;
	uint32_t i = 0;

	for (; i + LANES <= n; i += LANES)
		for (uint32_t l = 0; l < LANES; l++)
			acc[l] += a[i + l] * b[i + l];
	for (; i < n; i++)
		acc[0] += a[i] * b[i];
	for (uint32_t l = 0; l < LANES; l++)
		sum += acc[l];
	return sum;
}

static void axpy(float a, const float *x, float *y, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		y[i] += a * x[i];
}

static float read_sum(const void *buf, size_t bytes)
{
	const float *f = buf;
	float acc[16] = { 0 };
	float sum = 0.0f;

	for (size_t i = 0; i < bytes / sizeof(float); i += 16)
		for (uint32_t l = 0; l < 16; l++)
			acc[l] += f[i + l];
	for (uint32_t l = 0; l < 16; l++)
		sum += acc[l];
	return sum;
}

void mp_silu_mul_scalar(const float *g, const float *u, float *h, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		h[i] = mp_silu_mul1(g[i], u[i]);
}

static void silu_mul(const float *g, const float *u, float *h, uint32_t n)
{
	mp_silu_mul_scalar(g, u, h, n);
}

/*
 * Two passes: the largest value over independent running maxima (no
 * dependence from one element to the next, so the compiler may vectorise
 * it), then the first index holding a value equal to it: the scan's index
 * (kernels.h). The maxima start at x[0], not NaN, and a NaN is never
 * greater, so max is one of the values and the second pass finds it.
 */
#define ARGMAX_LANES	16u

static uint32_t argmax(const float *x, uint32_t n)
{
	float m[ARGMAX_LANES], max;
	uint32_t i = 0;

	if (!n || isnan(x[0]))
		return 0;
	for (uint32_t j = 0; j < ARGMAX_LANES; j++)
		m[j] = x[0];
	for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
		for (uint32_t j = 0; j < ARGMAX_LANES; j++)
			m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
	max = m[0];
	for (uint32_t j = 1; j < ARGMAX_LANES; j++)
		max = m[j] > max ? m[j] : max;
	for (; i < n; i++)
		max = x[i] > max ? x[i] : max;
	for (i = 0; !(x[i] == max); i++)
		;
	return i;
}

MP_KERNELS_DEFINE(mp_kernels_scalar, "scalar", NULL, NULL);
