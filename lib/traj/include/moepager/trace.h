/* SPDX-License-Identifier: MIT */
/*
 * Routing traces in moe-trace v1 (docs/moe-trace.md): which experts each
 * (request, token, layer) used, with optional gate weights.
 */
#ifndef MOEPAGER_TRACE_H
#define MOEPAGER_TRACE_H

#include <moepager/common.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mp_trace;

/*
 * Parses a moe-trace v1 file. Returns 0 and sets *out, or a negative errno
 * with a message giving the line number and the reason: -EPROTO (not a
 * moe-trace v1 file), -EINVAL (malformed row: column count, id out of range,
 * missing layer, non-consecutive token, metadata disagreeing with rows).
 * Also -ENOMEM, and the open()/read() errno for a file that cannot be read.
 * Messages read "FILE:LINE: reason".
 */
MP_API int mp_trace_open(const char *path, struct mp_trace **out);
/* Parses a trace held in memory (len bytes); name is used in messages. */
MP_API int mp_trace_parse(const char *buf, size_t len, const char *name, struct mp_trace **out);
MP_API void mp_trace_close(struct mp_trace *t);

MP_API uint32_t mp_trace_layers(const struct mp_trace *t);
MP_API uint32_t mp_trace_experts(const struct mp_trace *t);
MP_API uint32_t mp_trace_topk(const struct mp_trace *t);
MP_API uint32_t mp_trace_requests(const struct mp_trace *t);
/* Tokens of request r (0 when r is out of range). */
MP_API uint32_t mp_trace_tokens(const struct mp_trace *t, uint32_t request);
/* True when the trace carries gate weights. */
MP_API bool mp_trace_has_weights(const struct mp_trace *t);
/* Metadata value for key ("name", "model", ...), or NULL. */
MP_API const char *mp_trace_meta(const struct mp_trace *t, const char *key);
/*
 * The token ids of request r from its "tokens.R" metadata (docs/moe-trace.md):
 * mp_trace_tokens(t, r) ids, the input token of each routed position, into
 * ids. Returns 0, -ENOENT (the trace has no tokens.R), or -EINVAL (r out of
 * range; a value that is not a list of exactly that many ids: the message
 * says which).
 */
MP_API int mp_trace_token_ids(const struct mp_trace *t, uint32_t r, uint32_t *ids);

/*
 * The routing of (request, token, layer): topk expert ids, and their gate
 * weights (NULL when the trace has none). Returns 0 or -ERANGE.
 */
MP_API int mp_trace_route(const struct mp_trace *t, uint32_t request, uint32_t token,
			  uint32_t layer, const uint32_t **ids, const float **weights);

/*
 * The full gate distribution of (request, token, layer), when the trace
 * carries the optional p0..p{E-1} columns: mp_trace_experts() values,
 * indexed by expert id. NULL when it has none or the position is outside
 * the trace.
 */
MP_API const float *mp_trace_probs(const struct mp_trace *t, uint32_t request, uint32_t token,
				   uint32_t layer);

/*
 * Checks that a trace fits a model: same layers, same experts per layer and
 * same top-k. Returns 0 or -EINVAL with a message naming the mismatch.
 */
MP_API int mp_trace_check_geometry(const struct mp_trace *t, const struct mp_geometry *g);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_TRACE_H */
