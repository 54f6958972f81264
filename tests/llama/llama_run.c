// SPDX-License-Identifier: MIT
/*
 * Description: greedy decoding of a GGUF model by llama.cpp (the prebuilt
 * libraries of the npm package node-llama-cpp), to hold moepager's runner
 * and exported files to it.
 *
 *   llama_run -m MODEL.gguf -B BACKEND_DIR -p ID,ID,... -n N [-l LOGITS] [-t THREADS]
 *
 * Decodes the prompt in one batch, then N - 1 single tokens, each the
 * argmax of the last logits (ties: the lower id, as moepager's runner), and
 * prints "tokens: ID ID ..." (N ids), then "time: prompt_s S decode_s S
 * decode_tokens N" (the prompt's decode, and the single-token ones after
 * it, on CLOCK_MONOTONIC). -l writes each step's logits as raw
 * f32 (n_vocab floats per generated token), the layout of `moepager run
 * --dump-logits`. Attention runs as the runner's: f32 KV cache, no flash
 * attention. Exits 0, 1 on a llama.cpp failure, 2 on bad usage.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ggml-backend.h"
#include "llama.h"

struct opts {
	const char *model;
	const char *backends;
	const char *prompt;
	const char *logits;
	int n;
	int threads;
};

static void quiet_log(enum ggml_log_level level, const char *text, void *arg)
{
	(void)arg;
	if (level == GGML_LOG_LEVEL_ERROR)
		fputs(text, stderr);
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = (int)v;
	return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	int c;

	*o = (struct opts){ .threads = 1 };
	while ((c = getopt(argc, argv, "m:B:p:n:l:t:")) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'B': o->backends = optarg; break;
		case 'p': o->prompt = optarg; break;
		case 'l': o->logits = optarg; break;
		case 'n':
			if (parse_int(optarg, 1, 1 << 20, &o->n))
				return -1;
			break;
		case 't':
			if (parse_int(optarg, 1, 1024, &o->threads))
				return -1;
			break;
		default:
			return -1;
		}
	}
	return o->model && o->backends && o->prompt && o->n ? 0 : -1;
}

/* "1,2,3" into a new array; returns the count, or -1. */
static int parse_ids(const char *s, llama_token **out)
{
	int n = 1, k = 0;
	char *copy = strdup(s), *save = NULL;

	for (const char *p = s; *p; p++)
		n += *p == ',';
	*out = malloc(n * sizeof(**out));
	if (!copy || !*out)
		goto fail;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
		if (parse_int(t, 0, INT32_MAX, &(*out)[k++]))
			goto fail;
	free(copy);
	return k;
fail:
	free(copy);
	free(*out);
	return -1;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static llama_token argmax(const float *logits, int n)
{
	llama_token best = 0;

	for (int i = 1; i < n; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}

/* Decodes and prints; returns 0 or 1. */
static int generate(struct llama_context *ctx, int vocab, llama_token *prompt, int n_prompt,
		    const struct opts *o)
{
	FILE *dump = o->logits ? fopen(o->logits, "wb") : NULL;
	struct llama_batch batch = llama_batch_get_one(prompt, n_prompt);
	double t0 = now_s(), t1 = t0;
	llama_token tok;

	if (o->logits && !dump) {
		fprintf(stderr, "llama_run: %s: %s\n", o->logits, strerror(errno));
		return 1;
	}
	printf("tokens:");
	for (int i = 0; i < o->n; i++) {
		const float *logits;

		if (llama_decode(ctx, batch)) {
			fprintf(stderr, "llama_run: llama_decode failed at step %d\n", i);
			return 1;
		}
		if (i == 0)
			t1 = now_s();
		logits = llama_get_logits_ith(ctx, -1);
		if (dump && fwrite(logits, sizeof(float), vocab, dump) != (size_t)vocab) {
			fprintf(stderr, "llama_run: writing %s failed\n", o->logits);
			return 1;
		}
		tok = argmax(logits, vocab);
		printf(" %d", tok);
		batch = llama_batch_get_one(&tok, 1);
	}
	printf("\ntime: prompt_s %.6f decode_s %.6f decode_tokens %d\n", t1 - t0, now_s() - t1,
	       o->n - 1);
	return dump && fclose(dump) ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct llama_model_params mp;
	struct llama_context_params cp;
	struct llama_model *model;
	struct llama_context *ctx;
	llama_token *prompt = NULL;
	struct opts o;
	int n_prompt, rc;

	if (parse_opts(argc, argv, &o) || (n_prompt = parse_ids(o.prompt, &prompt)) <= 0) {
		fprintf(stderr, "usage: llama_run -m MODEL.gguf -B BACKEND_DIR -p ID,ID,... -n N "
			"[-l LOGITS] [-t THREADS]\n");
		return 2;
	}
	llama_log_set(quiet_log, NULL);
	/* a GGML_BACKEND_DL build registers no backend until they are loaded */
	ggml_backend_load_all_from_path(o.backends);
	llama_backend_init();
	mp = llama_model_default_params();
	mp.n_gpu_layers = 0;
	mp.use_extra_bufts = false;	/* no repacking: every type runs its plain CPU kernel */
	model = llama_model_load_from_file(o.model, mp);
	if (!model) {
		fprintf(stderr, "llama_run: llama.cpp cannot load %s\n", o.model);
		return 1;
	}
	cp = llama_context_default_params();
	cp.n_ctx = (uint32_t)(n_prompt + o.n + 16);
	cp.n_batch = cp.n_ubatch = (uint32_t)(n_prompt > 32 ? n_prompt : 32);
	cp.n_threads = cp.n_threads_batch = o.threads;
	/*
	 * An f32 KV cache and no flash attention, as the runner computes: the
	 * defaults (an f16 cache, CPU flash attention in f16) move f32 logits by
	 * ~1e-3, without them by ~4e-6.
	 */
	cp.type_k = cp.type_v = GGML_TYPE_F32;
	cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
	cp.no_perf = true;
	ctx = llama_init_from_model(model, cp);
	if (!ctx) {
		fprintf(stderr, "llama_run: no context for %s\n", o.model);
		llama_model_free(model);
		return 1;
	}
	rc = generate(ctx, llama_vocab_n_tokens(llama_model_get_vocab(model)), prompt, n_prompt,
		      &o);
	llama_free(ctx);
	llama_model_free(model);
	llama_backend_free();
	free(prompt);
	return rc;
}
