// SPDX-License-Identifier: MIT
/* Sampling the next token: greedy, or softmax with temperature, top-k and top-p (nucleus). */
#include <math.h>
#include <stdlib.h>

#include <moepager/runner.h>
#include <moepager/serve.h>

#include "base/base.h"

/* splitmix64: one 64-bit state, a full-period stream; good enough to draw tokens. */
static uint64_t next_u64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(uint64_t *s)
{
	return (double)(next_u64(s) >> 11) * 0x1.0p-53;
}

struct cand {
	uint32_t id;
	float p;
};

static int by_p_desc(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;

	if (x->p != y->p)
		return x->p > y->p ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

uint32_t mp_sample(const float *logits, uint32_t vocab, const struct mp_sched_params *params,
		   uint64_t *rng)
{
	struct cand *c;
	double sum = 0, cut, acc = 0, u;
	float max = -INFINITY, t = params->temperature;
	uint32_t n = vocab, tok;

	if (!(t > 0) || vocab < 2)
		return mp_logits_argmax(logits, vocab);
	c = malloc(vocab * sizeof(*c));
	if (!c)
		return mp_logits_argmax(logits, vocab);	/* out of memory: greedy, never a failure */
	for (uint32_t i = 0; i < vocab; i++)
		max = fmaxf(max, logits[i]);
	for (uint32_t i = 0; i < vocab; i++) {
		c[i].id = i;
		c[i].p = expf((logits[i] - max) / t);
	}
	qsort(c, vocab, sizeof(*c), by_p_desc);
	if (params->top_k && params->top_k < n)
		n = params->top_k;
	for (uint32_t i = 0; i < n; i++)
		sum += c[i].p;
	/* The nucleus: the most likely tokens until their mass reaches top_p. */
	if (params->top_p > 0 && params->top_p < 1) {
		cut = params->top_p * sum;
		for (uint32_t i = 0; i < n; i++) {
			acc += c[i].p;
			if (acc >= cut) {
				n = i + 1;
				sum = acc;
				break;
			}
		}
	}
	u = next_unit(rng) * sum;
	acc = 0;
	tok = c[n - 1].id;
	for (uint32_t i = 0; i < n; i++) {
		acc += c[i].p;
		if (u < acc) {
			tok = c[i].id;
			break;
		}
	}
	free(c);
	return tok;
}
