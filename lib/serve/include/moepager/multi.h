/* SPDX-License-Identifier: MIT */
/*
 * Several fine-tuned variants of one model served together (Multi-MoE):
 * rows m * E + e of every layer are model m's expert e. At a position a
 * consolidation map (.mpc) gives an owner Y, every model's requests use Y's
 * expert, held in host memory from the start (no I/O); at a position no
 * model owns, each model uses its own expert, paged under the pager's
 * budget (model 0's are the pager's own rows, the others' are bound to
 * their files). With MP_MULTI_OWNED_PAGED the owners' experts are pager
 * rows too: one row serves every model at a shared position, and the
 * budget holds whichever rows are in use. Each model's requests run with its routed-id map
 * (mp_seq_config.map) and its dense weights (mp_seq_config.model).
 * docs/multi.md.
 */
#ifndef MOEPAGER_MULTI_H
#define MOEPAGER_MULTI_H

#include <moepager/consolidate.h>
#include <moepager/runner.h>
#include <moepager/source.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mp_multi;

enum mp_multi_flags {
	/* Owned positions' experts are paged under the budget, not held outside it. */
	MP_MULTI_OWNED_PAGED = 1u << 0,
};

struct mp_multi_config {
	/* The map's models in its order (borrowed); models[0] is the pager's store. */
	struct mp_store *const *models;
	uint32_t n;
	uint32_t flags;				/* enum mp_multi_flags */
	const struct mp_consolidation *map;	/* borrowed */
	/* The pager's source (or a prefetcher's over it): where paged rows are read. */
	const struct mp_expert_source_ops *source;
	void *source_ctx;
	/* The pager's rows (mp_pager_row_ops(); slots_per_layer >= n x experts). */
	const struct mp_row_ops *rows;
	void *rows_ctx;
	MP_RESERVED(4);
};

/*
 * Reads every owned position's expert from its owner (checked against its
 * checksum) and binds the other models' unowned experts in the pager (with
 * MP_MULTI_OWNED_PAGED: binds every owner's owned experts too, reads none).
 * Returns 0 and sets *out, -EMEDIUMTYPE when the models are not the map's,
 * -EINVAL (bad config, slots too few), -ENOMEM, or the read error.
 */
MP_API int mp_multi_open(const struct mp_multi_config *cfg, struct mp_multi **out);
/* Unbinds the rows and frees the owned experts; no request may still run. NULL is allowed. */
MP_API void mp_multi_close(struct mp_multi *m);

/* Rows per layer the source takes: n x experts (mp_runner_config.expert_rows). */
MP_API uint32_t mp_multi_rows(const struct mp_multi *m);
/* Model i's per-layer routed-id maps for mp_seq_config.map (valid until close), or NULL. */
MP_API const uint32_t *const *mp_multi_map(const struct mp_multi *m, uint32_t i);
/*
 * The map the source's prefetcher is given for model i's requests (owned
 * rows in memory as UINT32_MAX), for mp_prefetcher_set_models(); NULL
 * past the models.
 */
MP_API const uint32_t *const *mp_multi_prefetch_map(const struct mp_multi *m, uint32_t i);
/* The source whose ctx is the set: owned rows from host memory, the rest from cfg.source. */
MP_API const struct mp_expert_source_ops *mp_multi_source_ops(void);

struct mp_multi_stats {
	uint32_t models;
	uint32_t owned;			/* positions with an owner (C) */
	uint64_t owned_bytes;		/* host memory holding their experts */
	uint32_t bound;			/* pager rows bound to the other models' experts */
	uint32_t reserved32;
	uint64_t owned_reads;		/* expert reads served from owned rows */
	uint64_t paged_reads;		/* expert reads asked of the pager */
	/*
	 * Routed experts at owned positions, per token as the pager counts its
	 * hits and misses (a read above serves every token of a step routed
	 * to the expert).
	 */
	uint64_t owned_routes;
	MP_RESERVED(3);
};

MP_API void mp_multi_stats(struct mp_multi *m, struct mp_multi_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_MULTI_H */
