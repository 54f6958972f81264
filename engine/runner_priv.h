/* SPDX-License-Identifier: MIT */
/* The runner's state, shared by runner.c (weights, sequences, the API) and forward.c (a step). */
#ifndef MP_RUNNER_PRIV_H
#define MP_RUNNER_PRIV_H

#include <stdbool.h>
#include <stdint.h>

#include <moepager/engine.h>
#include <moepager/runner.h>
#include <moepager/source.h>
#include <moepager/store.h>
#include <moepager/trace.h>

struct layer_weights {
	const float *attn_norm;
	const void *wq, *wk, *wv, *wo;
	/* wq, wk and wv as one matrix when they lie end to end (one product), or NULL */
	const void *wqkv;
	const float *ffn_norm;
	const void *router;
	enum mp_dtype router_dtype;
	/* In the engine's packed layout (MP_RUNNER_PACK_DENSE): wq, wk, wv, wo (wqkv) together */
	bool attn_packed, router_packed;
};

/* One model's non-expert weights, read once (the runner's own model is models[0]). */
struct dense_set {
	struct mp_store *store;
	void *weights;
	size_t weights_len;
	const void *tok_embd, *output;
	enum mp_dtype embd_dtype, output_dtype;
	bool output_packed;			/* the LM head in the engine's packed layout */
	const float *output_norm;
	struct layer_weights *layers;
	uint64_t layer_bytes;			/* dense weight bytes one pass reads per layer */
};

/* One token stream: its own KV cache and position over the runner's weights. */
struct mp_seq {
	struct mp_runner *r;
	uint32_t request;		/* reported to the source with every route */
	uint32_t model;			/* its dense weights: r->models[model] */
	const uint32_t *const *map;	/* routed-id map per layer, or NULL */
	const struct mp_trace *trace;	/* forced routing of decode steps, or NULL */
	uint32_t trace_request;
	uint32_t max_seq;
	uint32_t pos, steps;
	/* KV cache: [layers][max_seq][kv_heads x head_dim] each, backed as it is written. */
	float *kcache, *vcache;
	size_t cache_len;
	float *logits;			/* of the last token a step ran for this sequence */
};

/* A batch item as a step runs it: where its tokens are in the step's rows. */
struct step_item {
	struct mp_seq *seq;
	const uint32_t *tokens;
	uint32_t first;			/* its first row */
	uint32_t n;
	bool decode;
};

/*
 * The items of a step that share a model, which are next to each other:
 * items [item, item + count), rows [first, first + rows). Dense products run
 * once per run with its model's weights; the experts once over every row.
 */
struct step_run {
	const struct dense_set *d;
	uint32_t item, count;
	uint32_t first, rows;
};

struct mp_runner {
	struct mp_store *store;
	struct mp_geometry g;
	struct mp_engine *e;
	const struct mp_expert_source_ops *src;
	void *src_ctx;
	struct mp_guard guard;
	const struct mp_guard *gp;		/* &guard, or NULL when the source has none */
	uint32_t max_seq;			/* a sequence's default KV cache length */
	uint32_t expert_rows;			/* expert ids the source takes per layer */
	uint32_t qdim, kvdim;
	struct mp_seq *seq0;			/* the sequence of the one-stream calls */

	/* Every non-expert tensor of each model, read once (models[0]: at open). */
	struct dense_set *models;
	uint32_t n_models;
	/* The model whose sequences alone a step may hold (mp_runner_activate()); -1: any. */
	int32_t active_model;
	uint64_t expert_bytes;
	bool experts_packed;			/* the source's experts: mp_engine_pack_expert()'s layout */
	/* Dense tensor bytes the source lent, read from files, and of those packed, every model's. */
	uint64_t dense_lent, dense_read, dense_packed;
	bool pack_dense;			/* MP_RUNNER_PACK_DENSE */

	/* Activations for up to cap rows (tokens) and cap_items items of a step. */
	uint32_t cap, cap_items;
	float *x, *xn, *q, *k, *v, *att, *tmp, *moe, *rlogits, *gw;
	float *qkv;				/* [cap][qdim + 2 kvdim]: wqkv's products */
	uint32_t *ids;
	const uint32_t **maps;			/* [cap]: each row's routed-id map of its layer */
	float *xg, *eo;				/* [cap x topk][hidden]: gathered inputs, outputs */
	uint32_t *row_of;			/* [cap x topk]: (token, choice) -> xg/eo row */
	uint32_t *count, *order, *offset;	/* [experts]: the step's expert groups */
	/* [experts], in order's order: a layer's packed experts' weights and rows, run at once */
	const void **ew;
	uint32_t *em;
	float *last, *lbuf;			/* [cap_items][hidden], [cap_items][vocab] */
	struct step_item *items;
	struct step_run *runs;			/* [cap_items] */
	uint32_t n_runs;

	struct mp_runner_stats st;
	bool layer_times;			/* MP_RUNNER_LAYER_TIMES */
	struct mp_runner_layer_times lt;	/* relaxed atomics: read from other threads */
	int32_t pass_hits;			/* this layer's, one-token steps; -1: not known */
};

/* forward.c: runs one step over items (validated); advances nothing on error. */
int mp_runner_forward(struct mp_runner *r, struct step_item *items, uint32_t count,
		      uint32_t rows);
/* forward.c: room for a step of rows tokens and count items. */
int mp_runner_reserve(struct mp_runner *r, uint32_t rows, uint32_t count);
void mp_runner_free_activations(struct mp_runner *r);

#endif /* MP_RUNNER_PRIV_H */
