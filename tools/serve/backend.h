/* SPDX-License-Identifier: MIT */
/*
 * What `moepager serve`'s HTTP front end serves requests with: a backend,
 * behind a small vtable. The local backend (backend_local.c) runs one model
 * from an .mpk through a scheduler; others (several models sharing experts,
 * adapters) plug in the same way. The front end holds no model logic.
 */
#ifndef MP_SERVE_BACKEND_H
#define MP_SERVE_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include <moepager.h>

#include "serve/strbuf.h"

/* A model the backend serves, as the front end sees it. */
struct serve_model {
	const char *name;
	const struct mp_tokenizer *tok;	/* NULL: prompts as token ids only */
	uint32_t vocab;
	uint32_t context;		/* prompt + max_tokens at most */
	uint32_t bos, eos;		/* control tokens (UINT32_MAX: none) */
};

struct serve_backend;

#define SERVE_NAME_MAX 64

struct serve_backend_ops {
	const char *name;
	/*
	 * The model called name ("" or NULL: the default one), valid and served
	 * to this caller until release(), even if it is unloaded meanwhile; or
	 * NULL when no such model is served now. From any one thread.
	 */
	const struct serve_model *(*acquire)(struct serve_backend *b, const char *name);
	void (*release)(struct serve_backend *b, const struct serve_model *m);
	/* Copies the names of the models served now into names (at most max); returns how many. */
	uint32_t (*list)(struct serve_backend *b, char (*names)[SERVE_NAME_MAX], uint32_t max);
	/* mp_sched_submit() semantics, for model m (acquired). */
	int (*submit)(struct serve_backend *b, const struct serve_model *m, const uint32_t *prompt,
		      uint32_t n, const struct mp_sched_params *params,
		      const struct mp_sched_callbacks *cb, uint64_t *id);
	/* mp_sched_cancel() semantics. */
	int (*cancel)(struct serve_backend *b, const struct serve_model *m, uint64_t id);
	/* Appends its metric families in Prometheus text format. */
	void (*metrics)(struct serve_backend *b, struct strbuf *out);
	/* Stops admitting, waits for what runs (mp_sched_drain() semantics). */
	int (*drain)(struct serve_backend *b, uint32_t timeout_ms);
	/* Ends what still waits or runs (MP_FINISH_SHUTDOWN); nothing is admitted after. */
	void (*stop)(struct serve_backend *b);
	/*
	 * Has fn(arg) called on the scheduler's thread after each step's token
	 * callbacks (mp_sched_config.on_step); fn NULL: no more calls, and none
	 * runs once this returns. NULL op: no such hook.
	 */
	void (*on_step)(struct serve_backend *b, void (*fn)(void *arg), void *arg);
	/*
	 * Changes the engine's threads in place between two scheduler steps
	 * (mp_sched_call(), mp_engine_set_threads()): what runs finishes its
	 * step, what waits waits the change. Blocks for a step at most: call it
	 * off the HTTP thread. *before gets the count it had. 0 or -errno with
	 * the reason in why. NULL op: not supported.
	 */
	int (*set_threads)(struct serve_backend *b, uint32_t threads, uint32_t *before,
			   char *why, size_t len);
	/* Frees everything, once nobody holds a model (stops first if need be). */
	void (*close)(struct serve_backend *b);
	/*
	 * Adapters (NULL when the backend serves none). load: the adapter file
	 * `file` (a name inside the backend's adapter directory) as model name
	 * (NULL: the name it records); may take long, call it off the HTTP
	 * thread. 0 or -errno with the reason in why. unload: from now on name
	 * takes no request (mp_adapters_unload()). adapters_json: the loaded
	 * adapters and the memory they hold, as a JSON object (free()).
	 */
	int (*adapter_load)(struct serve_backend *b, const char *file, const char *name,
			    char *why, size_t len);
	int (*adapter_unload)(struct serve_backend *b, const char *name);
	char *(*adapters_json)(struct serve_backend *b);
};

struct serve_backend {
	const struct serve_backend_ops *ops;
};

/* The local backend: one .mpk model, resident or paged, with its scheduler. */
struct serve_local_config {
	const char *model;		/* .mpk path */
	const char *name;		/* model id served (NULL: the file's name without .mpk) */
	const char *tokenizer;		/* .tok path (NULL: beside the model, else ids only) */
	const char *budget;		/* NULL: resident, every expert in memory */
	const char *attach;		/* a pager daemon's socket: its shared host tier */
	const char *prefetch;		/* prefetch policy (paged only); NULL: none */
	const char *evict;		/* eviction policy; NULL: the prefetch policy's default */
	const char *engine;
	uint32_t threads;
	/*
	 * Warm before serving: attached, map what the daemon holds (nothing read
	 * from disk); paged, read as many experts as the budget holds. *warmed
	 * gets how many, *warm_s the seconds it took (docs/elastic.md).
	 */
	bool warm;
	uint32_t *warmed;
	double *warm_s;
	struct mp_sched_config sched;	/* without the runner */
	/* Adapters: every .mpa in this directory is loaded at start (NULL: no adapters). */
	const char *adapters;
	uint32_t adapter_slots;		/* N; 0: 32 */
	uint32_t adapter_rows;		/* E_max; 0: the most any adapter in the directory needs */
	bool adapters_padded;		/* the padded layout (a baseline for benchmarks) */
	bool warm_rows;			/* paged: read a request's adapter rows when it is admitted */
	/*
	 * Model variants served together (Multi-MoE, docs/multi.md): model is
	 * the first, more[0..n_more) the others, in the order of the map at
	 * consolidate (needs budget). NULL: one model.
	 */
	const char *consolidate;
	const char *more[MP_CONSOL_MAX_MODELS - 1];
	uint32_t n_more;
	/*
	 * Time-sharing (a baseline of `moepager bench-multi`): a swap to another
	 * model evicts every expert the pager holds, so one model's experts are
	 * in memory at a time.
	 */
	bool timeshare;
	/*
	 * Every model's dense weights stay in use (they are in memory anyway):
	 * batches mix models and nothing is swapped, so a request of another
	 * model never waits for the batch to empty. Default: one active, swapped.
	 */
	bool mixed;
	/*
	 * The owned positions' experts are paged under the budget like the
	 * rest (MP_MULTI_OWNED_PAGED), instead of held in memory outside it.
	 */
	bool owned_paged;
	/*
	 * With a prefetcher: one trajectory store for every model (session
	 * 27's), instead of one per model (mp_prefetcher_set_models()).
	 */
	bool shared_store;
	/* The pager's fault spec (docs/fault-injection.md), e.g. an I/O cap "read:rate=8M". */
	const char *fault;
	/* Time one-token steps' layers by hits (MP_RUNNER_LAYER_TIMES; bench-multi's table). */
	bool layer_times;
};

/* A model's name as the API lists it: its file's name without the directory and ".mpk". */
char *serve_model_name(const char *path);
int serve_local_open(const struct serve_local_config *cfg, struct serve_backend **out);

/* The local backend's counters (a benchmark's view): zero where it has no such part. */
struct serve_local_stats {
	struct mp_sched_stats sched;
	struct mp_pager_stats pager;
	struct mp_multi_stats multi;
	struct mp_runner_layer_times layers;
	struct mp_prefetcher_stats prefetch;	/* zero without a prefetcher */
};

void serve_local_stats(struct serve_backend *b, struct serve_local_stats *out);

#endif /* MP_SERVE_BACKEND_H */
