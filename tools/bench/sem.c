// SPDX-License-Identifier: MIT
/*
 * moepager bench: the token ids a trace carries (tokens.R) and the model's
 * embedding of each, FineMoE's semantic vector of a trace token, the same
 * vector the runner gives the prefetcher when it runs that token.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

struct bench_sem {
	const struct mp_trace *t;
	uint32_t hidden;
	uint32_t vocab;
	enum mp_dtype dtype;
	size_t row_bytes;
	char *table;		/* tok_embd as the file stores it */
	uint32_t **ids;		/* [request][token] */
	uint32_t nreq;
};

void bench_sem_close(struct bench_sem *b)
{
	if (!b)
		return;
	for (uint32_t r = 0; b->ids && r < b->nreq; r++)
		free(b->ids[r]);
	free(b->ids);
	free(b->table);
	free(b);
}

static int read_ids(struct bench_sem *b, const char *trace_path)
{
	for (uint32_t r = 0; r < b->nreq; r++) {
		int err;

		b->ids[r] = malloc(((size_t)mp_trace_tokens(b->t, r) + 1) * sizeof(uint32_t));
		if (!b->ids[r])
			return -ENOMEM;
		err = mp_trace_token_ids(b->t, r, b->ids[r]);
		if (err) {
			cli_fail(err, "%s", trace_path);
			return err == -ENOENT ? -EINVAL : err;
		}
		for (uint32_t i = 0; i < mp_trace_tokens(b->t, r); i++) {
			if (b->ids[r][i] >= b->vocab)
				return cli_error(-EINVAL, "%s: request %u token %u is id %u, "
						 "the model's vocabulary has %u", trace_path, r, i,
						 b->ids[r][i], b->vocab);
		}
	}
	return 0;
}

int bench_sem_open(struct mp_store *s, const struct mp_trace *t, const char *trace_path,
		   struct bench_sem **out)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	const struct mp_tensor_info *emb = mp_store_tensor(s, "tok_embd");
	struct bench_sem *b;
	int err;

	*out = NULL;
	/* A trace without token ids has no semantic vectors: not an error, nothing to say. */
	if (!mp_trace_meta(t, "tokens.0"))
		return -ENOENT;
	if (!emb || emb->bytes != mp_dtype_bytes(emb->dtype, (uint64_t)g->vocab * g->hidden))
		return cli_error(-EINVAL, "%s: no %u x %u tok_embd tensor",
				 mp_store_path(s), g->vocab, g->hidden);
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->t = t;
	b->hidden = g->hidden;
	b->vocab = g->vocab;
	b->dtype = emb->dtype;
	b->row_bytes = mp_dtype_bytes(emb->dtype, g->hidden);
	b->nreq = mp_trace_requests(t);
	b->ids = calloc(b->nreq, sizeof(*b->ids));
	err = -ENOMEM;
	if (!b->ids)
		goto fail;
	err = read_ids(b, trace_path);
	if (err)
		goto fail;
	b->table = malloc(emb->bytes);
	err = -ENOMEM;
	if (!b->table)
		goto fail;
	err = mp_store_read_tensor(s, emb, b->table);
	if (err) {
		cli_fail(err, "%s", mp_store_path(s));
		goto fail;
	}
	*out = b;
	return 0;
fail:
	bench_sem_close(b);
	return err;
}

uint32_t bench_sem_dim(const struct bench_sem *b)
{
	return b->hidden;
}

uint32_t bench_sem_token(const struct bench_sem *b, uint32_t request, uint32_t token)
{
	return b->ids[request][token];
}

int bench_sem_fn(void *arg, uint32_t request, uint32_t token, float *out)
{
	const struct bench_sem *b = arg;

	if (request >= b->nreq || token >= mp_trace_tokens(b->t, request))
		return -ERANGE;
	mp_dtype_to_f32(b->dtype, b->table + (size_t)b->ids[request][token] * b->row_bytes, out,
			b->hidden);
	return 0;
}
