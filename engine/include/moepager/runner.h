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
/*
 * Rewrites every expert in place in e's packed layout (mp_engine_pack_expert()),
 * which its kernels read as one stream a tile: the same products, the same
 * bits. The source then reports them packed, and a runner over it must use
 * an engine with the layout (mp_engine_packs()). Returns 0 (also when
 * already packed), -EOPNOTSUPP (e has no layout for the model's weights:
 * nothing changed), -EINVAL or -ENOMEM (each expert is packed whole or not
 * at all; should one fail after others were packed, the source serves no
 * expert any more: -EIO). Call before opening a runner over r.
 */
MP_API int mp_resident_pack(struct mp_resident *r, struct mp_engine *e);
/* The source ops whose ctx is an mp_resident. */
MP_API const struct mp_expert_source_ops *mp_resident_source_ops(void);

/*
 * Runner
 */
struct mp_runner;

enum mp_runner_flags {
	/*
	 * Time the layers of one-token steps (mp_runner_layer_times()): two
	 * clock reads a layer and, with a source that has a resident op, one
	 * residency query per routed expert (a pager answers under its lock).
	 * For benchmarks (bench-multi's table); off, nothing is timed or asked.
	 */
	MP_RUNNER_LAYER_TIMES = 1u << 0,
	/*
	 * Keep the runner's own copies of the dense matrices (Q, K, V, O, the
	 * router, the LM head; mp_runner_add_model()'s models' too) in the
	 * engine's packed layout where it has one for their type
	 * (mp_engine_packs(); else they stay row-major), rewritten once at
	 * open after their checksums, and read with mp_engine_matmul_packed():
	 * the same bits, each tile's rows one stream. Tensors the source lends
	 * (mp_expert_source_ops.tensor) are read where and as they are. The
	 * runner's copies are its own, so this never changes what another
	 * reader sees (mp_runner_stats.dense_packed_bytes says what was packed).
	 */
	MP_RUNNER_PACK_DENSE = 1u << 1,
};

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
	/*
	 * Expert ids the source takes per layer (>= the model's experts): the
	 * rows a routed-id map (mp_seq_config.map) may send a token to, such as
	 * adapters' or other models' experts in the pager's spare slots. 0: the
	 * model's experts.
	 */
	uint32_t expert_rows;
	uint32_t flags;			/* enum mp_runner_flags */
	/* The routed-id map of the one-stream calls' sequence (mp_seq_config.map); may be NULL. */
	const uint32_t *const *map;
	MP_RESERVED(6);
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
/* The argmax of vocab logits (lowest id on ties): greedy decoding's next token. */
MP_API uint32_t mp_logits_argmax(const float *logits, uint32_t vocab);
/* The model's geometry. */
MP_API const struct mp_geometry *mp_runner_geometry(const struct mp_runner *r);
/* Tokens in the KV cache, and decode steps run, since open or reset. */
MP_API uint32_t mp_runner_pos(const struct mp_runner *r);
MP_API uint32_t mp_runner_steps(const struct mp_runner *r);
/* Empties the KV cache and the step count (the stats stay). */
MP_API void mp_runner_reset(struct mp_runner *r);

/*
 * Sequences and batched steps
 *
 * The calls above run the runner's own sequence. For many at once (continuous
 * batching), open a sequence per stream: each has its own KV cache, position
 * and decode step count over the runner's shared weights. mp_runner_batch()
 * runs one step over several of them: each item adds prompt tokens (a
 * prefill chunk, any number) or one decode token. Dense products run once
 * over every row of the step and each routed expert is read once for all
 * the rows that chose it; a sequence gets exactly the bits it gets alone
 * (the engines' products are batch-invariant), so greedy tokens match.
 * Routing is reported per row with the sequence's own request id.
 * Sequences join and leave between steps; one runner steps on one thread.
 */
struct mp_seq;

struct mp_seq_config {
	uint32_t request;		/* request id reported to the source with every route */
	uint32_t max_seq;		/* KV cache length; 0: the runner's (at most max_seq) */
	/*
	 * Forced routing of decode steps (may be NULL), as in mp_runner_config:
	 * decode step t uses trace token t of trace_request.
	 */
	const struct mp_trace *trace;	/* borrowed */
	uint32_t trace_request;
	/*
	 * Routed-id map (may be NULL, borrowed): the expert e that layer l's
	 * router picks for this sequence is reported and read as expert
	 * map[l][e] (< mp_runner_config.expert_rows): an adapter's fine-tuned
	 * expert, or another model's at a shared position. The gate weights
	 * stay the router's. map[l] may be NULL (that layer unmapped).
	 */
	const uint32_t *const *map;
	/* Whose dense weights it runs with: 0, the runner's own model, or mp_runner_add_model()'s. */
	uint32_t model;
	uint32_t reserved32;		/* zero */
	MP_RESERVED(4);
};

/*
 * Several models of one architecture in one runner (Multi-MoE's variants):
 * reads another model's non-expert weights (embedding, attention, norms,
 * routers, head) into memory, for sequences opened with mp_seq_config.model
 * = the returned index. A batch may mix models: each model's dense products
 * run over its own sequences' rows, the experts over every row at once
 * (another model's experts are other rows of the source, reached through
 * the sequence's map). Returns the index (>= 1), -EINVAL naming the
 * geometry field that differs, -ENOMEM, or the read error.
 */
MP_API int mp_runner_add_model(struct mp_runner *r, struct mp_store *s);
/* Models the runner holds dense weights for (1 + those added). */
MP_API uint32_t mp_runner_models(const struct mp_runner *r);

/*
 * Multi-MoE's swap: from now on a step may hold only model's sequences
 * (others fail with -EINVAL until their model is activated). Its steps read
 * its dense weights where mp_runner_add_model() put them, in host memory,
 * as they would unswapped: nothing is copied or read. Returns 0 or -EINVAL
 * (bad model).
 */
MP_API int mp_runner_activate(struct mp_runner *r, uint32_t model);
/* The active model, or -1 when none was activated (a step may mix models). */
MP_API int mp_runner_active(const struct mp_runner *r);

/* Returns 0 and sets *out, -EINVAL (bad config, a trace that does not fit) or -ENOMEM. */
MP_API int mp_seq_open(struct mp_runner *r, const struct mp_seq_config *cfg, struct mp_seq **out);
MP_API void mp_seq_close(struct mp_seq *s);
/*
 * Starts another stream in s as mp_seq_open() would with cfg (position 0,
 * cfg's request, model, map and trace), keeping its KV cache's memory: no
 * mapping, page faults nor zeroing per request. The source's seq_map op
 * sees a close of the old request's map and an open of cfg's. cfg->max_seq
 * may not exceed the capacity, which stays. Returns 0, or -EINVAL with s
 * unchanged.
 */
MP_API int mp_seq_reuse(struct mp_seq *s, const struct mp_seq_config *cfg);
/* Logits of the sequence's last token run (vocab long). */
MP_API const float *mp_seq_logits(const struct mp_seq *s);
/* Tokens in its KV cache, decode steps run, and the cache's length in tokens. */
MP_API uint32_t mp_seq_pos(const struct mp_seq *s);
MP_API uint32_t mp_seq_steps(const struct mp_seq *s);
MP_API uint32_t mp_seq_capacity(const struct mp_seq *s);
/* Empties the sequence (its cache pages go back to the kernel) for another stream. */
MP_API void mp_seq_reset(struct mp_seq *s);
/* KV cache bytes that tokens positions of one sequence hold. */
MP_API uint64_t mp_seq_kv_bytes(const struct mp_runner *r, uint32_t tokens);

enum mp_batch_kind {
	MP_BATCH_PREFILL = 0,	/* prompt tokens: routed as MP_TOKEN_PROMPT, no decode step */
	MP_BATCH_DECODE = 1,	/* one generated token: decode step mp_seq_steps() */
};

struct mp_batch_item {
	struct mp_seq *seq;
	const uint32_t *tokens;
	uint32_t n;		/* tokens; 1 for a decode */
	uint32_t kind;		/* enum mp_batch_kind */
};

/*
 * Runs one step over count items (each a different sequence) and leaves each
 * sequence's logits of its last token. Every item is checked first: a
 * refused batch changes nothing. Returns 0, -EINVAL (a bad item, naming it;
 * token id >= vocab), -ENOSPC (an item overflows its KV cache), -ERANGE (a
 * traced sequence past its trace), or an op/source error naming layer and
 * expert, after which no sequence has advanced.
 */
MP_API int mp_runner_batch(struct mp_runner *r, const struct mp_batch_item *items,
			   uint32_t count);

/*
 * Batched rerouting: a step's n x k routed ids, each row by its own map (an
 * adapter's table; NULL: the base, unchanged), in place:
 * ids[t * k + j] = maps[t][ids[t * k + j]]. What the runner applies to each
 * sequence's rows; exposed for tests and other schedulers.
 */
MP_API void mp_reroute(uint32_t *ids, uint32_t n, uint32_t k, const uint32_t *const *maps);

/*
 * ExpertWeave's rerouting table of adapter `index` at one layer: the
 * identity over the base's `experts` ids, except each fine-tuned expert
 * ids[d] (n of them, ascending, n <= e_max), which goes to row
 * experts + index * e_max + d (the adapter's slots after the base's).
 * table gets `experts` entries. Returns 0, or -EINVAL (n > e_max, ids not
 * ascending or out of range).
 */
MP_API int mp_reroute_table(uint32_t experts, uint32_t e_max, uint32_t index, const uint32_t *ids,
			    uint32_t n, uint32_t *table);

struct mp_runner_stats {
	uint64_t tokens;		/* tokens run (prompt and decode) */
	uint64_t dense_bytes;		/* non-expert weight bytes the engine read */
	uint64_t expert_bytes;		/* expert weight bytes the engine read */
	uint64_t expert_calls;		/* expert FFNs run (one per expert per step) */
	uint64_t route_calls;		/* routing decisions reported to the source */
	uint64_t trace_overrides;	/* trace experts differ from the router's */
	uint64_t steps;			/* forward passes (a batch is one) */
	uint64_t model_runs;		/* dense passes: one per model in each step */
	/*
	 * Non-expert tensor bytes the runner reads where its source holds
	 * them (mp_expert_source_ops.tensor: no copy, nothing read), and bytes
	 * it read from the model files into its own memory, at open and
	 * mp_runner_add_model(). Not reset by mp_runner_stats_reset().
	 */
	uint64_t dense_lent_bytes;
	uint64_t dense_read_bytes;
	/*
	 * Multiply-adds (weight x activation, one per product term) the steps
	 * computed: dense_macs of the dense products (Q/K/V/O, the router, the
	 * LM head) and attention's scores and weighted sums, expert_macs of
	 * the routed experts' three matrices, each over the rows that chose it.
	 * With the byte counters, what a step's compute roof is made of.
	 */
	uint64_t dense_macs;
	uint64_t expert_macs;
	/* Of dense_read_bytes, those kept in the engine's packed layout (MP_RUNNER_PACK_DENSE). */
	uint64_t dense_packed_bytes;
	MP_RESERVED(1);
};

MP_API void mp_runner_stats(const struct mp_runner *r, struct mp_runner_stats *out);
/* Zeroes the counters and the layer times. */
MP_API void mp_runner_stats_reset(struct mp_runner *r);

/*
 * Time per layer of the steps that run one token (one sequence's decode:
 * Multi-MoE's batch of one, its Table 1): attention, and the MoE part
 * (norm, router, routing report, expert reads and FFNs) by how many of
 * the token's k routed experts were in memory when routed (the source's
 * resident op; without one, only attention is counted). Counted only with
 * MP_RUNNER_LAYER_TIMES (else all zero), by the thread that steps; a
 * snapshot may be taken from another.
 */
struct mp_runner_layer_times {
	uint64_t attn_passes;
	uint64_t attn_ns;
	uint64_t moe_passes[MP_MAX_TOPK + 1];	/* [hits] */
	uint64_t moe_ns[MP_MAX_TOPK + 1];
	MP_RESERVED(4);		/* zero; room to grow without a new size */
};

MP_API void mp_runner_layer_times(const struct mp_runner *r, struct mp_runner_layer_times *out);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_RUNNER_H */
