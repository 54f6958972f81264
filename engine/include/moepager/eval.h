/* SPDX-License-Identifier: MIT */
/*
 * Language-model quality of a runner: teacher-forced negative
 * log-likelihood (perplexity) of a token sequence.
 */
#ifndef MOEPAGER_EVAL_H
#define MOEPAGER_EVAL_H

#include <moepager/common.h>
#include <moepager/runner.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mp_eval_result {
	double nll;		/* sum of -ln p(token) over the predicted tokens */
	uint64_t predicted;	/* tokens predicted */
	uint32_t windows;	/* windows run */
};

/*
 * Cuts tokens into consecutive windows of `window` tokens (a last partial
 * window is dropped) and runs each from an empty KV cache, one decode step
 * per token: the logits after token t of a window score token t + 1. Adds
 * -ln softmax(logits)[token t + 1] (in double) over tokens 1..window-1 of
 * every window. vocab is the model's vocabulary (the logits' length);
 * max_windows 0 runs all. Perplexity is exp(nll / predicted). The training
 * recipe (tools/train/train.py: heldout_nll) computes the same windows.
 * Returns 0, -EINVAL (NULL argument, window < 2, fewer tokens than one
 * window, a token id outside the vocabulary), or the runner's error (e.g.
 * -ENOSPC when window exceeds its KV cache).
 */
MP_API int mp_eval_nll(struct mp_runner *r, uint32_t vocab, const uint32_t *tokens, size_t n,
		       uint32_t window, uint32_t max_windows, struct mp_eval_result *out);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_EVAL_H */
