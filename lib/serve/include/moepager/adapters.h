/* SPDX-License-Identifier: MIT */
/*
 * Many expert adapters over one base model (ExpertWeave): a virtual expert
 * tensor of M + N * E_max rows per layer, the base's M experts then N
 * adapter slots of E_max rows; adapter i's fine-tuned experts are rows
 * M + i * E_max + d, and only rows of loaded adapters hold memory. Each
 * request of adapter i runs with i's routed-id maps (mp_seq_config.map),
 * which send a routed base id to its adapter row when the adapter replaced
 * it. Adapters load and unload at run time while requests are served: an
 * unloaded adapter takes no new request and its memory is freed when the
 * last request that uses it ends. docs/adapters.md.
 */
#ifndef MOEPAGER_ADAPTERS_H
#define MOEPAGER_ADAPTERS_H

#include <moepager/adapter.h>
#include <moepager/runner.h>
#include <moepager/source.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mp_adapters;

/* N when mp_adapters_config.slots is 0. */
#define MP_ADAPTERS_DEFAULT_SLOTS 32u

struct mp_adapters_config {
	struct mp_store *base;		/* borrowed: the model every adapter must be made for */
	/* Where the base's rows (< M) are: the resident store, the pager, a prefetcher. */
	const struct mp_expert_source_ops *source;
	void *source_ctx;
	uint32_t slots;			/* N: adapters loaded at once; 0: MP_ADAPTERS_DEFAULT_SLOTS */
	uint32_t e_max;			/* E_max: rows per slot and layer; 0: experts / 4 */
	/*
	 * The padded layout (the baseline ExpertWeave improves on): every slot
	 * of a loaded adapter holds E_max experts of memory in every layer.
	 */
	bool padded;
	/*
	 * May be NULL. Where the source pages rows (the pager's
	 * mp_pager_row_ops(), rows_ctx the pager, whose slots_per_layer must
	 * be at least mp_adapters_rows()): adapter rows are then bound to the
	 * adapter files' experts and paged like the base's, under the same
	 * budget, eviction and prefetch, and are asked of the source by row
	 * id; else they are read into host memory at load. Not with padded.
	 */
	const struct mp_row_ops *rows;
	void *rows_ctx;
	/*
	 * With rows: a request's acquire asks the source to read every row of
	 * its adapter that is not in memory, all at once ahead of its first
	 * step, rather than one demand read per layer as its routes reach them.
	 */
	bool warm_rows;
	MP_RESERVED(3);
};

/* Opens an empty set. Returns 0 and sets *out, -EINVAL (bad config) or -ENOMEM. */
MP_API int mp_adapters_open(const struct mp_adapters_config *cfg, struct mp_adapters **out);
/* Frees everything; no request may still run. NULL is allowed. */
MP_API void mp_adapters_close(struct mp_adapters *set);

/* Rows per layer of the virtual expert tensor, M + N * E_max: mp_runner_config.expert_rows. */
MP_API uint32_t mp_adapters_rows(const struct mp_adapters *set);
/* The source ops whose ctx is the set: rows < M from the base's source, the rest its own. */
MP_API const struct mp_expert_source_ops *mp_adapters_source_ops(void);

/*
 * Loads the adapter at path under name (NULL: the name it records) into a
 * free slot, reading and checking every expert, from any thread; requests
 * already running are not disturbed. Returns the slot index, or -EMEDIUMTYPE
 * (made for another base), -E2BIG (a layer replaces more than E_max
 * experts), -EEXIST (the name is taken), -ENOSPC (every slot is in use), or
 * the open/read error (-EBADMSG for a damaged expert), each logged with the
 * file and what is wrong.
 */
MP_API int mp_adapters_load(struct mp_adapters *set, const char *path, const char *name);
/*
 * Unloads the adapter called name: from now on it takes no request; its
 * memory is freed when the last request using it releases it. Returns 0 or
 * -ENOENT.
 */
MP_API int mp_adapters_unload(struct mp_adapters *set, const char *name);

/*
 * For a request of adapter name: its slot index and the per-layer maps to
 * put in mp_seq_config.map, valid until mp_adapters_release(set, index).
 * Returns the index, or -ENOENT when no adapter of that name is loaded.
 */
MP_API int mp_adapters_acquire(struct mp_adapters *set, const char *name,
			       const uint32_t *const **map);
MP_API void mp_adapters_release(struct mp_adapters *set, int index);

struct mp_adapters_stats {
	uint32_t loaded;		/* adapters that take requests now */
	uint32_t draining;		/* unloaded, still used by requests */
	uint32_t slots;			/* N */
	uint32_t e_max;
	uint64_t adapter_bytes;		/* bytes of the loaded adapters' experts */
	/* Memory held for them (pages, padding); paged: what they take when all are resident. */
	uint64_t held_bytes;
	uint64_t padded_bytes;		/* what a padded layout would hold: loaded x layers x E_max */
	double f_mem;			/* held / adapter bytes: ExpertWeave's fragmentation factor */
	uint64_t loads, unloads, load_errors;
	uint64_t requests;		/* acquired in all */
	double load_seconds;		/* spent loading, in all */
	MP_RESERVED(8);
};

MP_API void mp_adapters_stats(struct mp_adapters *set, struct mp_adapters_stats *out);

/*
 * Copies the name of the adapter in slot i into buf (MP_ADAPTER_NAME_MAX
 * bytes). Returns 0, or -ENOENT when the slot takes no request.
 */
MP_API int mp_adapters_name(struct mp_adapters *set, uint32_t i, char *buf);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_ADAPTERS_H */
