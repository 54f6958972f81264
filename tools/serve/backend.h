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

struct serve_backend_ops {
	const char *name;
	/* The models it serves: index i < count, or NULL past the last. */
	const struct serve_model *(*model)(struct serve_backend *b, uint32_t i);
	/* mp_sched_submit() semantics, for model m. */
	int (*submit)(struct serve_backend *b, const struct serve_model *m, const uint32_t *prompt,
		      uint32_t n, const struct mp_sched_params *params,
		      const struct mp_sched_callbacks *cb, uint64_t *id);
	/* mp_sched_cancel() semantics. */
	int (*cancel)(struct serve_backend *b, const struct serve_model *m, uint64_t id);
	/* Appends its metric families in Prometheus text format. */
	void (*metrics)(struct serve_backend *b, struct strbuf *out);
	/* Stops admitting, waits for what runs (mp_sched_drain() semantics). */
	int (*drain)(struct serve_backend *b, uint32_t timeout_ms);
	/* Ends what still runs (MP_FINISH_SHUTDOWN) and frees everything. */
	void (*close)(struct serve_backend *b);
};

struct serve_backend {
	const struct serve_backend_ops *ops;
};

/* Finds the model called name ("" or NULL: the first). */
const struct serve_model *serve_model_find(struct serve_backend *b, const char *name);

/* The local backend: one .mpk model, resident or paged, with its scheduler. */
struct serve_local_config {
	const char *model;		/* .mpk path */
	const char *name;		/* model id served (NULL: the file's name without .mpk) */
	const char *tokenizer;		/* .tok path (NULL: beside the model, else ids only) */
	const char *budget;		/* NULL: resident, every expert in memory */
	const char *prefetch;		/* prefetch policy (paged only); NULL: none */
	const char *evict;		/* eviction policy; NULL: the prefetch policy's default */
	const char *engine;
	uint32_t threads;
	struct mp_sched_config sched;	/* without the runner */
};

int serve_local_open(const struct serve_local_config *cfg, struct serve_backend **out);

#endif /* MP_SERVE_BACKEND_H */
