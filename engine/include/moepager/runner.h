/* SPDX-License-Identifier: MIT */
/*
 * The MoE decoder runner: a Mixtral-style forward pass over an .mpk model,
 * with expert weights fetched through a source (resident memory or a pager).
 */
#ifndef MOEPAGER_RUNNER_H
#define MOEPAGER_RUNNER_H

#include <moepager/common.h>
#include <moepager/engine.h>
#include <moepager/source.h>
#include <moepager/store.h>
#include <moepager/trace.h>

#ifdef __cplusplus
extern "C" {
#endif

/* All experts read into ordinary memory (the --resident baseline). */
struct mp_resident;

/*
 * Reads every expert of s with mp_store_read_expert() (checksums checked)
 * into anonymous memory. progress (may be NULL) gets bytes read and the
 * total. Returns 0 and sets *out, -ENOMEM, or the read error.
 */
MP_API int mp_resident_open(struct mp_store *s,
			    void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg,
			    struct mp_resident **out);
MP_API void mp_resident_close(struct mp_resident *r);
/* The source ops whose ctx is an mp_resident. */
MP_API const struct mp_expert_source_ops *mp_resident_source_ops(void);

/*
 * Runner
 */
struct mp_runner;

struct mp_runner_config {
	struct mp_engine *engine;			/* borrowed */
	const struct mp_expert_source_ops *source;	/* borrowed */
	void *source_ctx;
	/* KV cache length; 0: the model's max_seq (at most that). */
	uint32_t max_seq;
	/*
	 * Forced routing (may be NULL): decode step t (the t-th call of
	 * mp_runner_step() since open or reset) uses the experts, and the gate
	 * weights when the trace has them (else the softmax of this model's
	 * router logits over those experts), of trace token t of `request`.
	 * The router is still computed. Prompt tokens are routed by the router.
	 * A step past the trace's last token fails with -ERANGE.
	 */
	const struct mp_trace *trace;			/* borrowed */
	/* Request id reported to the source, and the trace request replayed. */
	uint32_t request;
	MP_RESERVED(8);
};

/*
 * Reads every non-expert tensor of s into memory and allocates the KV cache.
 * Returns 0 and sets *out, -EINVAL (bad config; a trace whose layers,
 * experts or top-k differ from the model, or that lacks the request),
 * -ENOMEM, or the read error.
 */
MP_API int mp_runner_open(struct mp_store *s, const struct mp_runner_config *cfg,
			  struct mp_runner **out);
MP_API void mp_runner_close(struct mp_runner *r);

/*
 * Runs n prompt tokens in one batched pass (matmuls over all n, the KV
 * cache filled at positions pos..pos+n-1) and leaves the logits of the
 * last one. Returns 0, -EINVAL (token id >= vocab), -ENOSPC (KV cache
 * full), or an op/source error naming layer and expert.
 */
MP_API int mp_runner_prefill(struct mp_runner *r, const uint32_t *tokens, uint32_t n);
/* One decode step: token at the next position; leaves its logits. Errors as prefill, -ERANGE. */
MP_API int mp_runner_step(struct mp_runner *r, uint32_t token);

/* Logits of the last token run (vocab long), and their argmax (lowest id on ties). */
MP_API const float *mp_runner_logits(const struct mp_runner *r);
MP_API uint32_t mp_runner_argmax(const struct mp_runner *r);
/* Tokens in the KV cache, and decode steps run, since open or reset. */
MP_API uint32_t mp_runner_pos(const struct mp_runner *r);
MP_API uint32_t mp_runner_steps(const struct mp_runner *r);
/* Empties the KV cache and the step count (the stats stay). */
MP_API void mp_runner_reset(struct mp_runner *r);

struct mp_runner_stats {
	uint64_t tokens;		/* tokens run (prompt and decode) */
	uint64_t dense_bytes;		/* non-expert weight bytes the engine read */
	uint64_t expert_bytes;		/* expert weight bytes the engine read */
	uint64_t expert_calls;		/* expert FFNs run (one per expert per batch) */
	uint64_t route_calls;		/* routing decisions reported to the source */
	uint64_t trace_overrides;	/* trace experts differ from the router's */
	MP_RESERVED(8);
};

MP_API void mp_runner_stats(const struct mp_runner *r, struct mp_runner_stats *out);
MP_API void mp_runner_stats_reset(struct mp_runner *r);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_RUNNER_H */
