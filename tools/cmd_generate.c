// SPDX-License-Identifier: MIT
/* moepager generate: text in, text out, for a trained model and its tokenizer. */
#include <argp.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager.h>

#include "cli.h"
#include "text.h"

#define MIN_U32(a, b) ((a) < (b) ? (a) : (b))

static struct gen_env {
	const char *model;
	const char *tokenizer;
	const char *prompt;
	struct cli_engine_opts eng;
	uint32_t tokens;
	uint32_t top_k;
	uint64_t seed;
	double temperature;
	bool json;
} env;

enum { OPT_TOKENIZER = 0x100, OPT_PROMPT, OPT_TEMPERATURE, OPT_TOP_K, OPT_SEED, OPT_JSON };

static const char doc[] =
	"Continue a text prompt with a trained .mpk model (resident experts). The\n"
	"prompt is encoded as BOS + its pieces with the tokenizer beside the model\n"
	"(MODEL.tok, or --tokenizer); generation stops after --tokens tokens or at EOS.\n"
	"--temperature 0 decodes greedily; otherwise tokens are sampled from the top\n"
	"--top-k logits at that temperature with a generator seeded by --seed.\n"
	"Prints the prompt and its continuation; --json prints {prompt, text, ids}.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager generate --model build/data/models/tiny-real.mpk --prompt \"The best way to\"\n"
	"  moepager generate --model build/data/models/tiny-real.mpk --prompt \"Q:\" --temperature 0\n";

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0, "The .mpk model (required)", 0 },
	{ "tokenizer", OPT_TOKENIZER, "FILE", 0, "Tokenizer vocabulary (default MODEL.tok)", 0 },
	{ "prompt", OPT_PROMPT, "TEXT", 0, "Text to continue (default: none, just BOS)", 0 },
	{ "tokens", 'n', "N", 0, "Tokens to generate at most (default 64)", 0 },
	{ "temperature", OPT_TEMPERATURE, "T", 0, "Sampling temperature (default 0.8; 0 greedy)",
	  0 },
	{ "top-k", OPT_TOP_K, "K", 0, "Sample among the K likeliest tokens (default 40)", 0 },
	{ "seed", OPT_SEED, "N", 0, "Seed of the sampler (default 1)", 0 },
	{ "json", OPT_JSON, NULL, 0, "Print one JSON object", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	char *end;

	switch (key) {
	case 'm':
		env.model = arg;
		break;
	case OPT_TOKENIZER:
		env.tokenizer = arg;
		break;
	case OPT_PROMPT:
		env.prompt = arg;
		break;
	case 'n':
		cli_opt_u32(state, "--tokens", arg, 1, MP_MAX_SEQ, &env.tokens);
		break;
	case OPT_TEMPERATURE:
		errno = 0;
		env.temperature = strtod(arg, &end);
		if (errno || end == arg || *end || !(env.temperature >= 0.0) ||
		    env.temperature > 100.0)
			argp_error(state, "--temperature: '%s' is not a number in [0, 100]", arg);
		break;
	case OPT_TOP_K:
		cli_opt_u32(state, "--top-k", arg, 1, MP_MAX_VOCAB, &env.top_k);
		break;
	case OPT_SEED:
		cli_opt_u64(state, "--seed", arg, 0, UINT64_MAX, &env.seed);
		break;
	case OPT_JSON:
		env.json = true;
		break;
	case ARGP_KEY_INIT:
		state->child_inputs[0] = &env.eng;
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.model)
			argp_error(state, "--model FILE is required");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

/* xorshift64*: a uniform double in [0, 1). */
static double next_uniform(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return (double)((*s * 0x2545f4914f6cdd1dull) >> 11) * 0x1.0p-53;
}

/* Samples from the top_k logits at temperature (scratch holds vocab ids). */
static uint32_t sample(const float *logits, uint32_t vocab, uint32_t *scratch, uint64_t *rng)
{
	uint32_t k = MIN_U32(env.top_k, vocab);
	double max, sum = 0.0, u;

	/* Partial selection sort: the k largest logits to the front. */
	for (uint32_t i = 0; i < vocab; i++)
		scratch[i] = i;
	for (uint32_t i = 0; i < k; i++) {
		uint32_t best = i;

		for (uint32_t j = i + 1; j < vocab; j++)
			if (logits[scratch[j]] > logits[scratch[best]])
				best = j;
		uint32_t t = scratch[i];

		scratch[i] = scratch[best];
		scratch[best] = t;
	}
	max = logits[scratch[0]];
	for (uint32_t i = 0; i < k; i++)
		sum += exp((logits[scratch[i]] - max) / env.temperature);
	u = next_uniform(rng) * sum;
	for (uint32_t i = 0; i < k; i++) {
		u -= exp((logits[scratch[i]] - max) / env.temperature);
		if (u < 0)
			return scratch[i];
	}
	return scratch[k - 1];
}

/* Decodes ids into a malloc()ed string. */
static char *decode(const struct mp_tokenizer *tok, const uint32_t *ids, uint32_t n)
{
	int len = mp_tokenizer_decode(tok, ids, n, NULL, 0);
	char *text;

	if (len < 0)
		return NULL;
	text = malloc(len + 1);
	if (text)
		mp_tokenizer_decode(tok, ids, n, text, len + 1);
	return text;
}

static int print_result(const struct mp_tokenizer *tok, const uint32_t *ids, uint32_t n,
			uint32_t prompt_n)
{
	/* Decode the whole sequence: a continuation decoded alone would lose its first space. */
	char *full = decode(tok, ids, n), *head = decode(tok, ids, prompt_n);
	const char *cont;
	json_t *o = NULL, *a;
	int err = -ENOMEM;

	if (!full || !head)
		goto free_text;
	cont = strncmp(full, head, strlen(head)) ? full : full + strlen(head);
	if (!env.json) {
		printf("%s\n", full);
		err = 0;
		goto free_text;
	}
	a = json_array();
	for (uint32_t i = 0; a && i < n; i++)
		json_array_append_new(a, json_integer(ids[i]));
	o = json_pack("{s:s, s:s, s:o, s:I}", "prompt", env.prompt ? env.prompt : "",
		      "text", cont, "ids", a, "prompt_tokens", (json_int_t)prompt_n);
	if (o && !json_dumpf(o, stdout, JSON_INDENT(2))) {
		putchar('\n');
		err = 0;
	}
free_text:
	json_decref(o);
	free(full);
	free(head);
	return err;
}

int cmd_generate(int argc, char **argv)
{
	static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
	static const struct argp argp = { opts, parse_arg, NULL, doc, children, NULL, NULL };
	struct mp_engine_config ecfg = { 0 };
	struct mp_runner_config rcfg = { 0 };
	struct mp_store *store = NULL;
	struct mp_engine *engine = NULL;
	struct mp_resident *resident = NULL;
	struct mp_runner *runner = NULL;
	struct mp_tokenizer *tok = NULL;
	const struct mp_geometry *g;
	uint32_t *prompt = NULL, *ids = NULL, *scratch = NULL, prompt_n, n;
	uint64_t rng;
	int err;

	memset(&env, 0, sizeof(env));
	env.tokens = 64;
	env.top_k = 40;
	env.seed = 1;
	env.temperature = 0.8;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	rng = env.seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;

	err = mp_store_open(env.model, &store);
	if (err)
		goto fail;
	g = mp_store_geometry(store);
	err = text_tokenizer_open(env.tokenizer, env.model, g->vocab, &tok);
	if (err)
		goto cleanup;
	err = text_encode_prompt(tok, env.prompt ? env.prompt : "", &prompt, &prompt_n);
	if (err)
		goto fail;
	if (prompt_n >= g->max_seq) {
		err = cli_error(-EINVAL, "the prompt is %u tokens; the model holds %u", prompt_n,
				g->max_seq);
		goto cleanup;
	}
	env.tokens = MIN_U32(env.tokens, g->max_seq - prompt_n);
	ids = calloc(prompt_n + env.tokens, sizeof(*ids));
	scratch = calloc(g->vocab, sizeof(*scratch));
	if (!ids || !scratch) {
		err = cli_error(-ENOMEM, "out of memory");
		goto cleanup;
	}
	memcpy(ids, prompt, prompt_n * sizeof(*ids));

	ecfg.threads = env.eng.threads;
	err = mp_engine_open(env.eng.engine, &ecfg, &engine);
	if (!err)
		err = mp_resident_open(store, NULL, NULL, &resident);
	if (!err)
		err = cli_resident_pack(resident, engine, &rcfg.flags);
	if (err)
		goto fail;
	rcfg.engine = engine;
	rcfg.source = mp_resident_source_ops();
	rcfg.source_ctx = resident;
	rcfg.max_seq = prompt_n + env.tokens;
	err = mp_runner_open(store, &rcfg, &runner);
	if (!err)
		err = mp_runner_prefill(runner, prompt, prompt_n);
	for (n = prompt_n; !err && n < prompt_n + env.tokens;) {
		uint32_t next = env.temperature == 0.0 ? mp_runner_argmax(runner) :
			sample(mp_runner_logits(runner), g->vocab, scratch, &rng);

		if (next == mp_tokenizer_eos(tok))
			break;
		ids[n++] = next;
		if (n < prompt_n + env.tokens)
			err = mp_runner_step(runner, next);
	}
	if (err)
		goto fail;
	err = print_result(tok, ids, n, prompt_n);
	if (err)
		cli_fail(err, "writing the text");
	goto cleanup;

fail:
	cli_fail(err, NULL);
cleanup:
	mp_runner_close(runner);
	mp_resident_close(resident);
	mp_engine_close(engine);
	mp_tokenizer_close(tok);
	mp_store_close(store);
	free(prompt);
	free(ids);
	free(scratch);
	return err;
}
