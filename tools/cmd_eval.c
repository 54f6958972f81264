// SPDX-License-Identifier: MIT
/* moepager eval: held-out perplexity of a trained model, computed by the C runner. */
#include <argp.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <moepager.h>

#include "cli.h"
#include "text.h"

static struct eval_env {
	const char *model;
	const char *tokenizer;
	const char *text;
	const char *ids;
	struct cli_engine_opts eng;
	uint32_t window;
	uint32_t max_windows;
	bool json;
} env;

enum { OPT_TOKENIZER = 0x100, OPT_TEXT, OPT_IDS, OPT_WINDOW, OPT_MAX_WINDOWS, OPT_JSON };

static const char doc[] =
	"Teacher-forced perplexity of an .mpk language model on held-out text, computed\n"
	"by the decoder runner (resident experts). The tokens are cut into windows of\n"
	"--window tokens, each run from an empty KV cache; every token but a window's\n"
	"first is scored. tools/train/evaluate.py computes the same figure in PyTorch.\n"
	"\n"
	"--text reads fortune(6) format (texts separated by lines holding only %) and\n"
	"encodes every text as BOS text EOS with the tokenizer beside the model\n"
	"(MODEL.tok, or --tokenizer); --ids reads the recipe's uint16 token stream.\n"
	"\n"
	"--json prints one object: model, tokens, windows, predicted, nll (mean per\n"
	"token, nats), perplexity, seconds.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager eval --model data/models/tiny-real.mpk --text heldout.txt\n"
	"  moepager eval --model data/models/tiny-real.mpk --ids heldout.ids --json\n";

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0, "The .mpk model (required)", 0 },
	{ "tokenizer", OPT_TOKENIZER, "FILE", 0, "Tokenizer vocabulary (default MODEL.tok)", 0 },
	{ "text", OPT_TEXT, "FILE", 0, "Held-out text in fortune format", 0 },
	{ "ids", OPT_IDS, "FILE", 0, "Held-out token ids (little-endian uint16)", 0 },
	{ "window", OPT_WINDOW, "N", 0, "Tokens per window (default: the model's max_seq)", 0 },
	{ "max-windows", OPT_MAX_WINDOWS, "N", 0, "Score at most N windows (default all)", 0 },
	{ "json", OPT_JSON, NULL, 0, "Print one JSON object", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'm':
		env.model = arg;
		break;
	case OPT_TOKENIZER:
		env.tokenizer = arg;
		break;
	case OPT_TEXT:
		env.text = arg;
		break;
	case OPT_IDS:
		env.ids = arg;
		break;
	case OPT_WINDOW:
		if (cli_parse_u32("--window", arg, 2, MP_MAX_SEQ, &env.window))
			argp_usage(state);
		break;
	case OPT_MAX_WINDOWS:
		if (cli_parse_u32("--max-windows", arg, 1, UINT32_MAX, &env.max_windows))
			argp_usage(state);
		break;
	case OPT_JSON:
		env.json = true;
		break;
	case ARGP_KEY_INIT:
		state->child_inputs[0] = &env.eng;
		break;
	case ARGP_KEY_ARG:
		argp_usage(state);
		break;
	case ARGP_KEY_END:
		if (!env.model)
			argp_error(state, "--model FILE is required");
		if (!env.text == !env.ids)
			argp_error(state, "give exactly one of --text FILE and --ids FILE");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int print_json(size_t tokens, const struct mp_eval_result *res, double secs)
{
	double nll = res->nll / res->predicted;
	json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:f, s:f, s:f}", "model", env.model,
			      "tokens", (json_int_t)tokens, "windows", (json_int_t)res->windows,
			      "predicted", (json_int_t)res->predicted, "nll", nll,
			      "perplexity", exp(nll), "seconds", secs);

	if (!o || json_dumpf(o, stdout, JSON_INDENT(2))) {
		json_decref(o);
		fprintf(stderr, "moepager eval: out of memory building JSON\n");
		return -ENOMEM;
	}
	putchar('\n');
	json_decref(o);
	return 0;
}

int cmd_eval(int argc, char **argv)
{
	static char prog[] = "moepager eval";
	static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
	static const struct argp argp = { opts, parse_arg, NULL, doc, children, NULL, NULL };
	struct mp_engine_config ecfg = { 0 };
	struct mp_runner_config rcfg = { 0 };
	struct mp_eval_result res;
	struct mp_store *store = NULL;
	struct mp_engine *engine = NULL;
	struct mp_resident *resident = NULL;
	struct mp_runner *runner = NULL;
	struct mp_tokenizer *tok = NULL;
	const struct mp_geometry *g;
	uint32_t *ids = NULL, texts = 0;
	size_t n = 0;
	double t0;
	int err;

	memset(&env, 0, sizeof(env));
	argv[0] = prog;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;

	err = mp_store_open(env.model, &store);
	if (err)
		goto fail;
	g = mp_store_geometry(store);
	if (!env.window)
		env.window = g->max_seq;
	if (env.window > g->max_seq) {
		fprintf(stderr, "moepager eval: --window %u exceeds the model's max_seq %u\n",
			env.window, g->max_seq);
		err = -EINVAL;
		goto cleanup;
	}
	if (env.text) {
		err = text_tokenizer_open(env.tokenizer, env.model, g->vocab, &tok);
		if (!err)
			err = text_encode_fortunes(tok, env.text, &ids, &n, &texts);
	} else {
		err = text_read_ids(env.ids, &ids, &n);
	}
	if (err)
		goto cleanup;
	if (n < env.window) {
		fprintf(stderr, "moepager eval: %zu tokens do not fill one window of %u\n", n,
			env.window);
		err = -EINVAL;
		goto cleanup;
	}

	ecfg.threads = env.eng.threads;
	err = mp_engine_open(env.eng.engine, &ecfg, &engine);
	if (!err)
		err = mp_resident_open(store, NULL, NULL, &resident);
	if (err)
		goto fail;
	rcfg.engine = engine;
	rcfg.source = mp_resident_source_ops();
	rcfg.source_ctx = resident;
	rcfg.max_seq = env.window;
	err = mp_runner_open(store, &rcfg, &runner);
	if (err)
		goto fail;

	t0 = now_s();
	err = mp_eval_nll(runner, g->vocab, ids, n, env.window, env.max_windows, &res);
	if (err)
		goto fail;
	if (env.json) {
		err = print_json(n, &res, now_s() - t0);
	} else {
		printf("%s: %u windows of %u tokens, %llu predicted: nll %.5f, perplexity %.4f "
		       "(%.1f s)\n", env.model, res.windows, env.window,
		       (unsigned long long)res.predicted, res.nll / res.predicted,
		       exp(res.nll / res.predicted), now_s() - t0);
	}
	goto cleanup;

fail:
	fprintf(stderr, "moepager eval: %s\n", mp_last_error());
cleanup:
	mp_runner_close(runner);
	mp_resident_close(resident);
	mp_engine_close(engine);
	mp_tokenizer_close(tok);
	mp_store_close(store);
	free(ids);
	return err;
}
