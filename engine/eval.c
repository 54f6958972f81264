// SPDX-License-Identifier: MIT
/* Teacher-forced negative log-likelihood of token windows through a runner. */
#include <math.h>

#include <moepager/runner.h>
#include <moepager/eval.h>

#include "base/base.h"

/* -ln softmax(logits)[target], in double with the max subtracted. */
static double token_nll(const float *logits, uint32_t vocab, uint32_t target)
{
	double max = logits[0], sum = 0.0;

	for (uint32_t i = 1; i < vocab; i++)
		max = fmax(max, logits[i]);
	for (uint32_t i = 0; i < vocab; i++)
		sum += exp((double)logits[i] - max);
	return log(sum) - ((double)logits[target] - max);
}

int mp_eval_nll(struct mp_runner *r, uint32_t vocab, const uint32_t *tokens, size_t n,
		uint32_t window, uint32_t max_windows, struct mp_eval_result *out)
{
	struct mp_eval_result res = { 0 };
	size_t windows;
	int err;

	if (!r || !tokens || !out || !vocab)
		return mp_err(-EINVAL, "eval: NULL %s", !r ? "runner" : !tokens ? "tokens" : "out");
	if (window < 2 || n < window)
		return mp_err(-EINVAL, "eval: %zu tokens cannot fill a window of %u (at least 2)",
			      n, window);
	windows = n / window;
	if (max_windows && windows > max_windows)
		windows = max_windows;
	for (size_t w = 0; w < windows; w++) {
		const uint32_t *tw = tokens + w * window;

		mp_runner_reset(r);
		for (uint32_t t = 0; t + 1 < window; t++) {
			const uint32_t next = tw[t + 1];

			err = mp_runner_step(r, tw[t]);
			if (err)
				return mp_err(err, "eval: window %zu token %u: runner step failed",
					      w, t);
			if (next >= vocab)
				return mp_err(-EINVAL, "eval: window %zu token %u is id %u, "
					      "vocabulary has %u", w, t + 1, next, vocab);
			res.nll += token_nll(mp_runner_logits(r), vocab, next);
			res.predicted++;
		}
		res.windows++;
	}
	*out = res;
	return 0;
}
