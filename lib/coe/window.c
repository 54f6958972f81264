// SPDX-License-Identifier: MIT
/*
 * CoServe's decay-window search for the memory split (§4.4, Eqs. 1-3): how
 * many experts (models, by usage) to keep in memory, the rest of it going to
 * batch inference.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "coe/coe_priv.h"

/* Eq. 2: the line through the first n throughputs (x = 1..n), at x = n + 1. */
static double predict(const struct mp_coe_window_result *r, uint32_t n)
{
	double x[32], y[32], k, b;

	for (uint32_t i = 0; i < n; i++) {
		x[i] = i + 1;
		y[i] = r->steps[i].throughput;
	}
	if (coe_fit_line(x, y, n, &k, &b, NULL))
		return 0;
	return k * (n + 1) + b;
}

int mp_coe_decay_window(double w0, double margin, uint32_t max_experts, uint64_t seed,
			int (*measure)(void *arg, uint32_t n, double *thr), void *arg,
			struct mp_coe_window_result *out)
{
	double d = 1 - w0 / 100, lo = 0, hi = w0, w = w0;	/* Eq. 1 */
	uint32_t first, last, span;
	int err;

	if (!(w0 > 0 && w0 < 100) || !(margin > 0 && margin < 1) || !max_experts || !measure)
		return mp_err(-EINVAL, "decay window: need 0 < w0 < 100 (got %g), 0 < margin < 1 "
			      "(got %g), experts and a measure", w0, margin);
	memset(out, 0, sizeof(*out));
	for (;;) {
		struct mp_coe_window_step *st = &out->steps[out->n_steps];
		uint32_t n = (uint32_t)MP_MIN(lround(hi), (long)max_experts);

		st->lo = lo;
		st->hi = hi;
		err = measure(arg, n, &st->throughput);
		if (err)
			return err;
		out->n_steps++;
		if (out->n_steps >= 3) {
			st->predicted = predict(out, out->n_steps - 1);
			/* Eq. 3: the rise fell short of the line by more than the margin. */
			if (st->predicted > 0 &&
			    (st->predicted - st->throughput) / st->predicted > margin) {
				out->stopped = true;
				break;
			}
		}
		if (hi >= max_experts || out->n_steps == MP_ARRAY_SIZE(out->steps))
			break;
		w *= d;
		lo = hi;
		hi = MP_MIN(lo + w, (double)max_experts);
	}
	out->lo = lo;
	out->hi = hi;
	/* Values within the window differ little (the paper draws one at random). */
	first = (uint32_t)MP_MAX(ceil(lo), 1.0);
	last = (uint32_t)MP_MIN(lround(hi), (long)max_experts);
	span = last >= first ? last - first + 1 : 1;
	out->choice = MP_MIN(first + (uint32_t)(coe_mix(seed, 0x77) % span), max_experts);
	return 0;
}
