/* SPDX-License-Identifier: MIT */
/*
 * The OpenAI-style completion API of `moepager serve`: parsing and checking
 * a request body, the text a request generates (incremental decoding, stop
 * strings), and the JSON of responses, stream chunks and errors. No I/O:
 * the HTTP front end (http.c) and the fuzz target call these.
 */
#ifndef MP_SERVE_API_H
#define MP_SERVE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <moepager.h>

#include "serve/strbuf.h"

#define API_MAX_STOP 4
#define API_MAX_STOP_LEN 64
#define API_MAX_PROMPT_IDS (1u << 20)

/* POST /v1/completions, checked. */
struct api_request {
	char model[128];		/* "" when not given */
	char *prompt_text;		/* the prompt as text (owned), or NULL */
	uint32_t *prompt_ids;		/* the prompt as token ids (owned), or NULL */
	uint32_t nprompt_ids;
	uint32_t max_tokens;		/* 16 unless given */
	double temperature;		/* 1 unless given */
	double top_p;			/* 1 unless given */
	uint32_t top_k;			/* 0 (all) unless given: an extension */
	uint64_t seed;
	bool seed_set;
	bool stream;
	bool ignore_eos;		/* an extension: generate max_tokens whatever comes */
	char *stop[API_MAX_STOP];	/* owned */
	uint32_t nstop;
};

/* Why a request is refused: the HTTP status, the field, and a sentence. */
struct api_error {
	int status;
	char param[48];			/* "" when no one field is at fault */
	char message[320];
};

/*
 * Parses and checks a body. Returns 0 with *out filled (free it with
 * api_request_free()), or -EINVAL with *err saying which field and why
 * (status 400). Never reads past len.
 */
int api_parse_completion(const char *body, size_t len, struct api_request *out,
			 struct api_error *err);
void api_request_free(struct api_request *r);

/* POST /v1/adapters: {"file": "NAME.mpa", "name": "served-as"}, checked. */
struct api_adapter_load {
	char file[256];			/* a file name in the server's adapter directory */
	char name[64];			/* "" when not given: the name the adapter records */
};

/* Parses and checks a body: 0, or -EINVAL with *err naming the field (status 400). */
int api_parse_adapter_load(const char *body, size_t len, struct api_adapter_load *out,
			   struct api_error *err);

/* POST /admin/threads: {"threads": N}, N in [1, API_MAX_THREADS] (the engine's limit). */
#define API_MAX_THREADS 1024
int api_parse_threads(const char *body, size_t len, uint32_t *threads, struct api_error *err);

/* Fills err (status, param may be NULL) and returns -EINVAL, for `return api_fail(...)`. */
int api_fail(struct api_error *err, int status, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/*
 * The text a request generates, as it comes: the text of the tokens so far
 * as decoding them all at once gives it, handed out as deltas that never end
 * inside a UTF-8 character nor inside what may become a stop string, cut
 * before the first stop string. Each token decodes only from the last text
 * piece on (the anchor): text before it never changes, as only a run of
 * byte pieces (UTF-8 split over tokens) is decoded as a whole.
 */
struct textgen {
	const struct mp_tokenizer *tok;
	uint32_t *ids;
	uint32_t n, cap;
	char *text;			/* the decoded text */
	size_t len, text_cap;
	size_t dlen;			/* decoded bytes (len may be cut by a stop string) */
	uint32_t anchor;		/* ids[anchor] is a text piece (UINT32_MAX: none yet) */
	size_t anchor_at;		/* the text before it */
	bool anchor_space;		/* its leading space, which decoding from it drops */
	bool visible;			/* a piece with text came */
	size_t start;			/* where the generated text starts (after the prefix's) */
	size_t emitted;			/* bytes handed out (from text[0]) */
	const char *const *stop;
	uint32_t nstop;
	size_t hold;			/* longest stop string - 1: kept back until sure */
	bool stopped;			/* a stop string appeared: text ends before it */
};

/*
 * prefix: the prompt's last token (UINT32_MAX: none). The text is decoded
 * after it, so the first generated piece keeps its leading space as it
 * would in the whole text; its own text is not handed out. Returns 0 or
 * -ENOMEM.
 */
int textgen_init(struct textgen *g, const struct mp_tokenizer *tok, const char *const *stop,
		 uint32_t nstop, uint32_t prefix);
void textgen_fini(struct textgen *g);
/*
 * Adds a generated token. *delta and *dlen get the new text that may be handed
 * out now (possibly none). Returns 0, 1 when a stop string ended the text
 * (the caller stops the request), or -ENOMEM.
 */
int textgen_push(struct textgen *g, uint32_t id, const char **delta, size_t *dlen);
/* Appends id to a growing array (*n of *cap, doubled from 64). 0, or -ENOMEM. */
int ids_append(uint32_t **ids, uint32_t *n, uint32_t *cap, uint32_t id);
/* At the end: the text held back (none after a stop string ended it). */
void textgen_flush(struct textgen *g, const char **delta, size_t *dlen);

/* JSON bodies (malloc()ed strings, NULL when out of memory). */
char *api_error_json(const struct api_error *err, const char *type);
/*
 * A finished completion: the whole text, why it ended ("length", "stop"),
 * usage. ids (n of them, may be NULL) are added as choices[0].token_ids:
 * the completion of a model without a tokenizer, whose text is empty.
 */
char *api_completion_json(const char *id, long created, const char *model, const char *text,
			  size_t len, const char *finish, uint32_t prompt_tokens, uint32_t tokens,
			  const uint32_t *ids, uint32_t n);
/*
 * One server-sent event of a stream: "data: {chunk}\n\n"; finish and ids
 * may be NULL. The last chunk (finish set) carries the usage too, as OpenAI's
 * stream_options.include_usage would.
 */
char *api_chunk_sse(const char *id, long created, const char *model, const char *text,
		    size_t len, const char *finish, const uint32_t *ids, uint32_t n,
		    uint32_t prompt_tokens, uint32_t tokens);
/*
 * The same event for a token (text, or ids without a tokenizer; no finish),
 * without building JSON per token: prefix is api_chunk_prefix()'s start of
 * the request's every event (free() it), the rest is appended to o. Returns
 * 0, or -EINVAL with o unchanged when text is not UTF-8 (api_chunk_sse()
 * gives NULL then).
 */
char *api_chunk_prefix(const char *id, long created, const char *model);
int api_chunk_add(struct strbuf *o, const char *prefix, const char *text, size_t len,
		  const uint32_t *ids, uint32_t n);
/* DELETE /v1/adapters/NAME's answer: it takes no new request, those running finish. */
char *api_adapter_unloaded_json(const char *name);

/* GET /v1/models for names[0..n). */
char *api_models_json(const char *const *names, uint32_t n, long created);

#endif /* MP_SERVE_API_H */
