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

#define MAX_MODELS MP_CONSOL_MAX_MODELS

static struct eval_env {
	const char *models[MAX_MODELS];
	const char *files[MAX_MODELS];	/* each model's held-out text or ids */
	uint32_t n_models, n_files;
	bool text;			/* the files are --text (else --ids) */
	bool mixed;			/* both kinds given */
	const char *tokenizer;
	const char *consolidate;
	const char *budget;
	struct cli_engine_opts eng;
	uint32_t window;
	uint32_t max_windows;
	bool json;
} env;

enum {
	OPT_TOKENIZER = 0x100, OPT_TEXT, OPT_IDS, OPT_WINDOW, OPT_MAX_WINDOWS, OPT_JSON,
	OPT_CONSOLIDATE, OPT_BUDGET,
};

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
	"With --consolidate MAP, one --model per variant of the map (in its order) and\n"
	"one --text or --ids each (its own held-out text), every variant is scored\n"
	"alone and served consolidated (Multi-MoE, docs/multi.md: owned positions from\n"
	"their owner, the rest paged under --budget, default 100%), and the report gives\n"
	"both perplexities and their ratio (JSON: capacity, models[] with model, file,\n"
	"predicted, alone, consolidated, change).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager eval --model build/data/models/tiny-real.mpk --text heldout.txt\n"
	"  moepager eval --model build/data/models/tiny-real.mpk --ids heldout.ids --json\n"
	"  moepager eval --consolidate v.mpc --model a.mpk --ids a.ids --model b.mpk --ids b.ids\n";

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0, "The .mpk model (required; one per variant with --consolidate)",
	  0 },
	{ "tokenizer", OPT_TOKENIZER, "FILE", 0, "Tokenizer vocabulary (default MODEL.tok)", 0 },
	{ "text", OPT_TEXT, "FILE", 0, "Held-out text in fortune format", 0 },
	{ "ids", OPT_IDS, "FILE", 0, "Held-out token ids (little-endian uint16)", 0 },
	{ "window", OPT_WINDOW, "N", 0, "Tokens per window (default: the model's max_seq)", 0 },
	{ "max-windows", OPT_MAX_WINDOWS, "N", 0, "Score at most N windows (default all)", 0 },
	{ "json", OPT_JSON, NULL, 0, "Print one JSON object", 0 },
	{ "consolidate", OPT_CONSOLIDATE, "MAP", 0,
	  "Score each --model alone and consolidated with this .mpc map", 0 },
	{ "budget", OPT_BUDGET, "B", 0, "Expert budget of the consolidated runs (100%)", 0 },
	{ 0 },
};

static void add_file(struct argp_state *state, const char *path, bool text)
{
	if (env.n_files == MAX_MODELS)
		argp_error(state, "at most %u held-out files", MAX_MODELS);
	if (env.n_files && env.text != text)
		env.mixed = true;
	env.text = text;
	env.files[env.n_files++] = path;
}

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'm':
		if (env.n_models == MAX_MODELS)
			argp_error(state, "at most %u --model", MAX_MODELS);
		env.models[env.n_models++] = arg;
		break;
	case OPT_TOKENIZER:
		env.tokenizer = arg;
		break;
	case OPT_TEXT:
		add_file(state, arg, true);
		break;
	case OPT_IDS:
		add_file(state, arg, false);
		break;
	case OPT_CONSOLIDATE:
		env.consolidate = arg;
		break;
	case OPT_BUDGET:
		env.budget = arg;
		break;
	case OPT_WINDOW:
		cli_opt_u32(state, "--window", arg, 2, MP_MAX_SEQ, &env.window);
		break;
	case OPT_MAX_WINDOWS:
		cli_opt_u32(state, "--max-windows", arg, 1, UINT32_MAX, &env.max_windows);
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
		if (!env.n_models)
			argp_error(state, "--model FILE is required");
		if (env.mixed)
			argp_error(state, "give --text files or --ids files, not both");
		if (!env.consolidate && (env.n_models != 1 || env.n_files != 1))
			argp_error(state, "give one --model and exactly one of --text FILE and "
				   "--ids FILE (several need --consolidate MAP)");
		if (env.consolidate && env.n_files != env.n_models)
			argp_error(state, "--consolidate: one --text or --ids per --model (%u "
				   "models, %u files)", env.n_models, env.n_files);
		if (env.budget && !env.consolidate)
			argp_error(state, "--budget is for --consolidate");
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

/* Prints o (consumed) on stdout, indented. */
static int print_object(json_t *o)
{
	if (!o || json_dumpf(o, stdout, JSON_INDENT(2))) {
		json_decref(o);
		return cli_error(-ENOMEM, "out of memory building JSON");
	}
	putchar('\n');
	json_decref(o);
	return 0;
}

static int print_json(size_t tokens, const struct mp_eval_result *res, double secs)
{
	double nll = res->nll / res->predicted;
	json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:f, s:f, s:f}", "model", env.models[0],
			      "tokens", (json_int_t)tokens, "windows", (json_int_t)res->windows,
			      "predicted", (json_int_t)res->predicted, "nll", nll,
			      "perplexity", exp(nll), "seconds", secs);

	return print_object(o);
}

/* Model i's held-out tokens (its tokenizer for text). */
static int read_tokens(uint32_t i, struct mp_store *s, uint32_t **ids, size_t *n)
{
	struct mp_tokenizer *tok = NULL;
	uint32_t texts = 0;
	int err;

	if (!env.text)
		err = text_read_ids(env.files[i], ids, n);
	else if (!(err = text_tokenizer_open(env.tokenizer, env.models[i],
					     mp_store_geometry(s)->vocab, &tok)))
		err = text_encode_fortunes(tok, env.files[i], ids, n, &texts);
	mp_tokenizer_close(tok);
	if (!err && *n < env.window)
		err = cli_error(-EINVAL, "%s: %zu tokens do not fill one window of %u",
				env.files[i], *n, env.window);
	return err;
}

/*
 * One perplexity: a runner over s's dense weights reading experts from source
 * (map: rows), with the runner's flags (its dense copy packed or not).
 */
static int eval_with(struct mp_engine *e, struct mp_store *s, const struct mp_expert_source_ops *ops,
		     void *ctx, uint32_t rows, const uint32_t *const *map, uint32_t flags,
		     const uint32_t *ids, size_t n, struct mp_eval_result *res)
{
	struct mp_runner_config rc = { .engine = e, .source = ops, .source_ctx = ctx,
				       .max_seq = env.window, .expert_rows = rows, .map = map,
				       .flags = flags };
	struct mp_runner *r = NULL;
	int err = mp_runner_open(s, &rc, &r);

	if (!err)
		err = mp_eval_nll(r, mp_store_geometry(s)->vocab, ids, n, env.window,
				  env.max_windows, res);
	mp_runner_close(r);
	return err;
}

static int eval_alone(struct mp_engine *e, struct mp_store *s, const uint32_t *ids, size_t n,
		      struct mp_eval_result *res)
{
	struct mp_resident *resident = NULL;
	uint32_t flags = 0;
	int err = mp_resident_open(s, NULL, NULL, &resident);

	if (!err)
		err = cli_resident_pack(resident, e, &flags);
	if (!err)
		err = eval_with(e, s, mp_resident_source_ops(), resident, 0, NULL, flags, ids, n,
				res);
	mp_resident_close(resident);
	return err;
}

static int eval_single(struct mp_engine *e, struct mp_store *s)
{
	struct mp_eval_result res;
	uint32_t *ids = NULL;
	size_t n = 0;
	double t0;
	int err;

	err = read_tokens(0, s, &ids, &n);
	if (err)
		return err;
	t0 = now_s();
	err = eval_alone(e, s, ids, n, &res);
	if (!err && env.json)
		err = print_json(n, &res, now_s() - t0);
	else if (!err)
		printf("%s: %u windows of %u tokens, %llu predicted: nll %.5f, perplexity %.4f "
		       "(%.1f s)\n", env.models[0], res.windows, env.window,
		       (unsigned long long)res.predicted, res.nll / res.predicted,
		       exp(res.nll / res.predicted), now_s() - t0);
	free(ids);
	return err;
}

struct scored {
	struct mp_eval_result alone, cons;
};

static json_t *scored_json(uint32_t i, const struct scored *s)
{
	double a = s->alone.nll / s->alone.predicted, c = s->cons.nll / s->cons.predicted;

	return json_pack("{s:s, s:s, s:I, s:I, s:{s:f, s:f}, s:{s:f, s:f}, s:f}",
			 "model", env.models[i], "file", env.files[i],
			 "windows", (json_int_t)s->alone.windows,
			 "predicted", (json_int_t)s->alone.predicted,
			 "alone", "nll", a, "perplexity", exp(a),
			 "consolidated", "nll", c, "perplexity", exp(c),
			 "change", exp(c - a) - 1.0);
}

static int report(const struct mp_consolidation *map, const struct scored *s, double secs)
{
	json_t *o, *models = json_array();

	if (!env.json) {
		printf("%u models, %u of %u positions owned\n", env.n_models,
		       mp_consolidation_capacity(map),
		       mp_consolidation_layers(map) * mp_consolidation_experts(map));
		for (uint32_t i = 0; i < env.n_models; i++)
			printf("%s on %s: %llu predicted: perplexity alone %.4f, consolidated "
			       "%.4f (%+.2f %%)\n", env.models[i], env.files[i],
			       (unsigned long long)s[i].alone.predicted,
			       exp(s[i].alone.nll / s[i].alone.predicted),
			       exp(s[i].cons.nll / s[i].cons.predicted),
			       100 * (exp((s[i].cons.nll - s[i].alone.nll) / s[i].alone.predicted) -
				      1));
		return 0;
	}
	for (uint32_t i = 0; models && i < env.n_models; i++)
		json_array_append_new(models, scored_json(i, &s[i]));
	o = json_pack("{s:s, s:I, s:I, s:I, s:o, s:f}", "map", env.consolidate,
		      "capacity", (json_int_t)mp_consolidation_capacity(map),
		      "positions", (json_int_t)(mp_consolidation_layers(map) *
						mp_consolidation_experts(map)),
		      "window", (json_int_t)env.window, "models", models ? models : json_array(),
		      "seconds", secs);
	return print_object(o);
}

/* Model i alone and served consolidated (through the set over the pager), on its text. */
static int score(struct mp_engine *e, struct mp_store *const *stores, struct mp_multi *set,
		 uint32_t i, struct scored *out)
{
	uint32_t *ids = NULL;
	size_t n = 0;
	int err;

	err = read_tokens(i, stores[i], &ids, &n);
	if (!err)
		err = eval_alone(e, stores[i], ids, n, &out->alone);
	if (!err)
		err = eval_with(e, stores[i], mp_multi_source_ops(), set, mp_multi_rows(set),
				mp_multi_map(set, i), 0, ids, n, &out->cons);
	free(ids);
	return err;
}

static int eval_consolidated(struct mp_engine *e, struct mp_store *const *stores)
{
	struct mp_pager_config pc = { .budget = env.budget ? env.budget : "100%" };
	struct mp_multi_config mc = { .models = stores, .n = env.n_models,
				      .source = mp_pager_source_ops(),
				      .rows = mp_pager_row_ops() };
	struct mp_consolidation *map = NULL;
	struct scored s[MAX_MODELS];
	struct mp_multi *set = NULL;
	struct mp_pager *p = NULL;
	double t0 = now_s();
	int err;

	pc.slots_per_layer = env.n_models * mp_store_geometry(stores[0])->experts;
	err = mp_consolidation_open(env.consolidate, &map);
	if (!err)
		err = mp_pager_open(stores[0], &pc, &p);
	if (!err) {
		mc.map = map;
		mc.source_ctx = mc.rows_ctx = p;
		err = mp_multi_open(&mc, &set);
	}
	for (uint32_t i = 0; i < env.n_models && !err; i++)
		err = score(e, stores, set, i, &s[i]);
	if (!err)
		err = report(map, s, now_s() - t0);
	mp_multi_close(set);
	mp_pager_close(p);
	mp_consolidation_close(map);
	return err;
}

int cmd_eval(int argc, char **argv)
{
	static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
	static const struct argp argp = { opts, parse_arg, NULL, doc, children, NULL, NULL };
	struct mp_engine_config ecfg = { 0 };
	struct mp_store *stores[MAX_MODELS] = { 0 };
	struct mp_engine *engine = NULL;
	const struct mp_geometry *g;
	int err;

	memset(&env, 0, sizeof(env));
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	for (uint32_t i = 0; i < env.n_models && !err; i++)
		err = mp_store_open(env.models[i], &stores[i]);
	if (err)
		goto fail;
	g = mp_store_geometry(stores[0]);
	if (!env.window)
		env.window = g->max_seq;
	if (env.window > g->max_seq) {
		err = cli_error(-EINVAL, "--window %u exceeds the model's max_seq %u", env.window,
				g->max_seq);
		goto cleanup;
	}
	ecfg.threads = env.eng.threads;
	err = mp_engine_open(env.eng.engine, &ecfg, &engine);
	if (!err)
		err = env.consolidate ? eval_consolidated(engine, stores) :
					eval_single(engine, stores[0]);
	if (!err)
		goto cleanup;
fail:
	cli_fail(err, NULL);
cleanup:
	mp_engine_close(engine);
	for (uint32_t i = 0; i < env.n_models; i++)
		mp_store_close(stores[i]);
	return err;
}
