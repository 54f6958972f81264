/* SPDX-License-Identifier: MIT */
/*
 * Expert sources: where an engine finds an expert's bytes, and the routing it
 * reports before reading them. The runner consumes a source; the resident
 * store, the pager and the prefetcher provide one. The interface sits below
 * all of them so none needs to know the others.
 */
#ifndef MOEPAGER_SOURCE_H
#define MOEPAGER_SOURCE_H

#include <moepager/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The runner knows nothing of paging: it asks a source where an expert's
 * bytes are, tells it the routing of a layer before reading any of that
 * layer's experts, and reads experts only under the source's guard.
 */
/* The token id route() reports for prompt tokens (they have no trace index). */
#define MP_TOKEN_PROMPT UINT32_MAX

struct mp_tensor_info;

struct mp_expert_source_ops {
	/*
	 * Address of the expert's gate|up|down bytes as the .mpk lays them out
	 * (mp_store_expert_bytes() long), valid until the source is closed; or
	 * NULL after logging why (the runner fails the step with -EIO).
	 */
	const void *(*expert)(void *ctx, uint32_t layer, uint32_t expert);
	/*
	 * The experts (ids, gate weights; k of each) that token `token` of
	 * request `request` uses in `layer`, called before any of them is read.
	 * token counts decode steps as moe-trace counts generated tokens: step
	 * t (mp_runner_steps() before it) is token t, the trace token it
	 * replays. A batched prefill reports each prompt token of a layer, all
	 * as token MP_TOKEN_PROMPT (one iteration: the batch goes through the
	 * layers together), before the layer's experts run. Returns 0 or a
	 * negative errno, which aborts the step. May be NULL.
	 */
	int (*route)(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		     const uint32_t *ids, const float *weights, uint32_t k);
	/*
	 * Runs fn(arg) on the calling thread under a guard and returns its
	 * result, or a negative errno when the expert memory could not be read
	 * (e.g. -EIO after a SIGBUS on a poisoned page). Every read of expert
	 * bytes, on every engine thread, happens inside it. May be NULL.
	 */
	int (*guard)(void *ctx, int (*fn)(void *arg), void *arg);
	/*
	 * For prefetchers, during decode steps only: right before route() for
	 * the same (request, token, layer), this layer's router logits (experts
	 * floats; their softmax is the full gate distribution, computed even
	 * when a trace forces the route) and the normalised FFN input the
	 * router read (hidden floats). Both are valid during the call only.
	 * May be NULL.
	 */
	void (*gate)(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		     const float *logits, uint32_t experts, const float *x, uint32_t hidden);
	/*
	 * For prefetchers, during decode steps only: before the first layer of
	 * (request, token), the embedding layer's output for the step's input
	 * token (hidden floats, its row of tok_embd as f32): FineMoE's semantic
	 * vector. Valid during the call only. May be NULL.
	 */
	void (*embed)(void *ctx, uint32_t request, uint32_t token, const float *e,
		      uint32_t hidden);
	/*
	 * For prefetchers: request `request` routes through map
	 * (mp_seq_config.map: the row that layer l's routed expert e is read
	 * from is map[l][e], map[l] NULL for an unmapped layer), told when its
	 * sequence opens, before its first route(), and again with map NULL
	 * when it closes; the map stays valid in between. route() then reports
	 * rows: a prefetcher maps them back to the router's ids to learn, and
	 * its predictions forward to the rows this request will read (an entry
	 * past the source's rows, e.g. UINT32_MAX: an expert it need not fetch,
	 * which is in memory). Only for sequences opened with a map. May be NULL.
	 */
	void (*seq_map)(void *ctx, uint32_t request, const uint32_t *const *map);
	/*
	 * For statistics (the runner's per-layer times by hits): whether the
	 * expert is in memory now, so reading it waits for no tier (1), or
	 * not (0), or a negative errno when it cannot say. A snapshot, asked
	 * before route() reports it, only by a runner opened with
	 * MP_RUNNER_LAYER_TIMES. May be NULL.
	 */
	int (*resident)(void *ctx, uint32_t layer, uint32_t expert);
	/*
	 * Where the runner's model's non-expert tensor t (an entry of its
	 * store) already is in memory: t->bytes as the .mpk holds them, their
	 * checksum checked, read-only, 64-byte aligned, valid until the source
	 * is closed. The runner then reads the tensor there instead of reading
	 * its own copy from the file: a source that holds the dense weights
	 * for several processes (a pager daemon's) lends them. NULL (or the op
	 * NULL): the runner reads the file. Called at open only.
	 */
	const void *(*tensor)(void *ctx, const struct mp_tensor_info *t);
	/*
	 * Whether expert()'s bytes are not the file's but the engine's packed
	 * layout of them (mp_engine_pack_expert(), <moepager/engine.h>): 1, or 0.
	 * The runner then reads them with mp_engine_expert_ffn_packed(), and
	 * refuses an engine without that layout. Asked at open only. May be
	 * NULL (0): a pager's experts arrive in file order.
	 */
	int (*packed)(void *ctx);
	MP_RESERVED_OPS(7);
};

struct mp_store;
struct mp_adapter;

/*
 * Rows from other files: a source that pages (the pager) can back spare
 * rows of its range with an adapter's or a model variant's experts, so
 * they share its budget, eviction and prefetch. A layer above that must
 * not know the pager (the adapter set) reaches it through these; each is
 * the pager call of the same name (<moepager/pager.h>, mp_pager_row_ops()).
 */
struct mp_row_ops {
	/* A source id (>= 1) for the adapter or variant (borrowed until removed), or -errno. */
	int (*add_adapter)(void *ctx, struct mp_adapter *a);
	int (*add_store)(void *ctx, struct mp_store *s);
	/* 0, or -EBUSY while rows are bound to it. */
	int (*remove_source)(void *ctx, int source);
	/* Backs spare row (layer, row) with the source's expert (layer, expert). 0 or -errno. */
	int (*bind)(void *ctx, uint32_t layer, uint32_t row, int source, uint32_t expert);
	/* Drops the row's memory and makes it spare again. 0 or -errno. */
	int (*unbind)(void *ctx, uint32_t layer, uint32_t row);
	/* Reads a bound row ahead of its first use (mp_pager_prefetch()). May be NULL. */
	int (*prefetch)(void *ctx, uint32_t layer, uint32_t row, int priority);
	MP_RESERVED_OPS(4);
};

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_SOURCE_H */
