// SPDX-License-Identifier: MIT
/*
 * moepager batchbench: batched decode throughput at several batch sizes,
 * against the bound memory bandwidth sets and the roof the engine's
 * multiply-add rate adds to it, both measured in the same run.
 */
#include <argp.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager.h>
#include <moepager/membw.h>

#include "cli.h"

#define MAX_SIZES 16
#define MAX_REPEAT 15

static struct bb_env {
	const char *model;
	struct cli_engine_opts eng;
	uint32_t sizes[MAX_SIZES];
	uint32_t nsizes;
	uint32_t tokens;
	uint32_t prompt;
	uint32_t repeat;
	uint32_t membw_every;
	const char *budget;
	const char *attach;
	bool json;
} env;

enum {
	OPT_BATCH = 0x100, OPT_TOKENS, OPT_PROMPT, OPT_REPEAT, OPT_BUDGET, OPT_ATTACH, OPT_JSON,
	OPT_MEMBW_EVERY,
};

static const char doc[] =
	"Decodes B sequences together (mp_runner_batch) for each batch size B and\n"
	"reports the aggregate decode tokens/s against the bound memory bandwidth sets:\n"
	"a step reads the dense weights once and each routed expert once for all the\n"
	"sequences that chose it, so its bytes (weight_bytes_per_step, from the\n"
	"runner's counters) over the read bandwidth of the engine's threads\n"
	"(membw_gbps, sampled before and after each run and, untimed, after every\n"
	"--membw-every decode steps inside it) give the fastest a step can be. On a\n"
	"VM whose read bandwidth changes from one second to the next, the samples\n"
	"inside the runs see what the steps saw (docs/engine.md \"Session 32\").\n"
	"Each sequence has its own random prompt (--prompt tokens) and decodes\n"
	"greedily for --tokens steps; figures are medians over --repeat runs.\n"
	"Beside the bytes, a step's multiply-adds (macs_per_step, from the runner's\n"
	"counters: the dense products and attention over every row, each routed\n"
	"expert over the rows that chose it) over the rate of the engine's own bf16\n"
	"product on weights in cache (fma_gmacs, sampled before and after each run)\n"
	"give the fastest it can compute; the roof is the slower of the two\n"
	"(roof_tok_s <= bound_tok_s), where a batch whose experts each get a few\n"
	"rows is held by the products, not the reads (docs/engine.md \"Session 34\").\n"
	"Experts are resident unless --budget pages them (then the bound is not the\n"
	"disk's, and the ratio says what paging costs) or --attach reads them, and the\n"
	"dense weights, in a pager daemon's memfds (warmed first: every expert the\n"
	"daemon holds is mapped before the runs).\n"
	"\n"
	"--json prints {model, threads, membw_gbps, membw_bytes, membw_huge_share,\n"
	"source, dense_packed_bytes,\n"
	"results: [{batch, tok_s, steps_s, weight_bytes_per_step, weights_gbps,\n"
	"membw_gbps, membw_min_gbps, membw_max_gbps, membw_samples, membw_1t_gbps,\n"
	"bound_tok_s, bound_ratio, macs_per_step, fma_gmacs, fma_1t_gmacs,\n"
	"compute_tok_s, roof_tok_s, roof_ratio, speedup}]}: a batch size's membw is the median of\n"
	"its samples before, inside and after its runs (min and max: their spread;\n"
	"membw_samples: how many), membw_1t the median of one sample a run on the\n"
	"calling thread alone (beside membw, it tells the VM's bandwidth mode: the\n"
	"threads reading barely more than one, or twice as much); membw_huge_share is\n"
	"the probe buffer's share on huge pages, as the resident weights'; speedup is\n"
	"tok_s over batch 1's; fma_gmacs is 1e9 multiply-adds a second with the\n"
	"engine's threads (fma_1t_gmacs: the calling thread alone, one a run),\n"
	"compute_tok_s the tokens/s it allows, roof_tok_s the lower of it and\n"
	"bound_tok_s, roof_ratio tok_s over roof_tok_s. dense_packed_bytes: the dense\n"
	"weights the runner keeps in the engine's packed layout (resident runs).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager batchbench --model mixtral-mini.mpk --batch 1,2,4,8,16 --json\n";

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0, "The .mpk model (required)", 0 },
	{ "batch", OPT_BATCH, "B[,B...]", 0, "Batch sizes (default 1,2,4,8,16)", 0 },
	{ "tokens", OPT_TOKENS, "N", 0, "Decode steps per run (default 32)", 0 },
	{ "prompt", OPT_PROMPT, "N", 0, "Prompt tokens of each sequence (default 16)", 0 },
	{ "repeat", OPT_REPEAT, "N", 0, "Runs per batch size (default 3)", 0 },
	{ "membw-every", OPT_MEMBW_EVERY, "N", 0,
	  "Sample the read bandwidth after every N decode steps, untimed (default 1; 0: only "
	  "before and after each run, as before session 32)", 0 },
	{ "budget", OPT_BUDGET, "B", 0, "Page the experts under this budget", 0 },
	{ "attach", OPT_ATTACH, "SOCKET", 0, "Read the weights from the pager daemon on SOCKET", 0 },
	{ "json", OPT_JSON, NULL, 0, "Print one JSON object", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'm': env.model = arg; break;
	case OPT_BATCH:
		cli_opt_u32_list(state, "--batch", arg, 1, 256, env.sizes, MAX_SIZES, &env.nsizes);
		break;
	case OPT_TOKENS:
		cli_opt_u32(state, "--tokens", arg, 1, 1u << 16, &env.tokens);
		break;
	case OPT_PROMPT:
		cli_opt_u32(state, "--prompt", arg, 1, 1u << 16, &env.prompt);
		break;
	case OPT_REPEAT:
		cli_opt_u32(state, "--repeat", arg, 1, MAX_REPEAT, &env.repeat);
		break;
	case OPT_MEMBW_EVERY:
		cli_opt_u32(state, "--membw-every", arg, 0, 1u << 16, &env.membw_every);
		break;
	case OPT_BUDGET: env.budget = arg; break;
	case OPT_ATTACH: env.attach = arg; break;
	case OPT_JSON: env.json = true; break;
	case ARGP_KEY_INIT:
		state->child_inputs[0] = &env.eng;
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.model)
			argp_error(state, "--model FILE is required");
		if (env.attach && env.budget)
			argp_error(state, "--attach reads the daemon's tier: no --budget with it");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
static const struct argp argp = { opts, parse_arg, NULL, doc, children, NULL, NULL };

struct bench {
	struct mp_store *store;
	struct mp_engine *engine;
	struct mp_resident *resident;
	struct mp_pager *pager;
	struct mp_attach *attach;
	struct mp_runner *runner;
	struct mp_membw *membw;
	uint32_t vocab;
};

struct one_run {
	double seconds;
	uint64_t bytes;		/* weight bytes the steps read */
	uint64_t macs;		/* multiply-adds the steps computed */
	uint64_t steps;
};

/*
 * B sequences: a prefill of random prompts, then `tokens` greedy steps, timed;
 * a bandwidth sample into bw[(*nb)++] after every env.membw_every steps, untimed.
 */
static int run_batch(struct bench *b, uint32_t B, uint32_t rep, struct one_run *out,
		     double *bw, uint32_t *nb)
{
	struct mp_batch_item items[256];
	uint32_t *prompt = malloc((size_t)env.prompt * sizeof(*prompt)), next[256];
	struct mp_seq *seq[256] = { 0 };
	struct mp_runner_stats s0, s1;
	uint64_t t0, ns = 0;
	int err = prompt ? 0 : -ENOMEM;

	for (uint32_t i = 0; i < B && !err; i++) {
		struct mp_seq_config sc = { .request = i, .max_seq = env.prompt + env.tokens + 1 };

		for (uint32_t t = 0; t < env.prompt; t++)
			prompt[t] = (uint32_t)((i * 7919u + rep * 104729u + t * 613u + 1) % b->vocab);
		err = mp_seq_open(b->runner, &sc, &seq[i]);
		if (!err)
			err = mp_runner_batch(b->runner, &(struct mp_batch_item){
				seq[i], prompt, env.prompt, MP_BATCH_PREFILL }, 1);
	}
	mp_runner_stats(b->runner, &s0);
	for (uint32_t step = 0; step < env.tokens && !err; step++) {
		t0 = cli_now_ns();
		for (uint32_t i = 0; i < B; i++) {
			next[i] = mp_logits_argmax(mp_seq_logits(seq[i]), b->vocab);
			items[i] = (struct mp_batch_item){ seq[i], &next[i], 1, MP_BATCH_DECODE };
		}
		err = mp_runner_batch(b->runner, items, B);
		ns += cli_now_ns() - t0;
		if (!err && env.membw_every && (step + 1) % env.membw_every == 0)
			err = mp_membw_sample(b->membw, &bw[(*nb)++]);
	}
	out->seconds = (double)ns / 1e9;
	mp_runner_stats(b->runner, &s1);
	out->bytes = (s1.dense_bytes - s0.dense_bytes) + (s1.expert_bytes - s0.expert_bytes);
	out->macs = (s1.dense_macs - s0.dense_macs) + (s1.expert_macs - s0.expert_macs);
	out->steps = s1.steps - s0.steps;
	for (uint32_t i = 0; i < B; i++)
		mp_seq_close(seq[i]);
	free(prompt);
	return err;
}

static int open_bench(struct bench *b)
{
	struct mp_engine_config ec = { .threads = env.eng.threads };
	struct mp_runner_config rc = { 0 };
	int err;

	err = mp_store_open(env.model, &b->store);
	if (!err)
		err = mp_engine_open(env.eng.engine ? env.eng.engine : "ref", &ec, &b->engine);
	if (!err && env.attach) {
		err = mp_attach_open(b->store, env.attach, &b->attach);
		if (!err)
			err = mp_attach_warm(b->attach, NULL);
		rc.source = mp_attach_source_ops();
		rc.source_ctx = b->attach;
	} else if (!err && env.budget) {
		err = mp_pager_open(b->store, &(struct mp_pager_config){ .budget = env.budget },
				    &b->pager);
		rc.source = mp_pager_source_ops();
		rc.source_ctx = b->pager;
	} else if (!err) {
		err = mp_resident_open(b->store, NULL, NULL, &b->resident);
		if (!err)
			err = cli_resident_pack(b->resident, b->engine, &rc.flags);
		rc.source = mp_resident_source_ops();
		rc.source_ctx = b->resident;
	}
	rc.engine = b->engine;
	if (!err)
		err = mp_runner_open(b->store, &rc, &b->runner);
	if (!err)
		err = mp_membw_open(b->engine, 0, &b->membw);
	if (!err)
		b->vocab = mp_store_geometry(b->store)->vocab;
	return err;
}

static void close_bench(struct bench *b)
{
	mp_membw_close(b->membw);
	mp_runner_close(b->runner);
	mp_pager_close(b->pager);
	mp_attach_close(b->attach);
	mp_resident_close(b->resident);
	mp_engine_close(b->engine);
	mp_store_close(b->store);
}

/* Bandwidth samples a batch size takes: around each run and inside it. */
static uint32_t samples_per_size(void)
{
	return env.repeat * (2 + (env.membw_every ? env.tokens / env.membw_every : 0));
}

/*
 * One batch size: repeat runs, membw sampled around and inside each (appended
 * to bw_all at *nbw) and the multiply-add rate around each; medians.
 */
static int measure(struct bench *b, uint32_t B, json_t *results, double *tok1, double *bw_all,
		   uint32_t *nbw)
{
	double tps[MAX_REPEAT], sps[MAX_REPEAT], bps[MAX_REPEAT], bw1[MAX_REPEAT];
	double mps[MAX_REPEAT], fma[2 * MAX_REPEAT], fma1[MAX_REPEAT];
	double *bw = bw_all + *nbw;
	uint32_t nb = 0;
	int err = 0;

	for (uint32_t r = 0; r < env.repeat && !err; r++) {
		struct one_run o;

		err = mp_membw_sample(b->membw, &bw[nb++]);
		if (!err)
			err = mp_membw_fma_sample(b->membw, &fma[2 * r]);
		if (!err)
			err = run_batch(b, B, r, &o, bw, &nb);
		if (!err)
			err = mp_membw_sample(b->membw, &bw[nb++]);
		if (!err)
			err = mp_membw_sample_one(b->membw, &bw1[r]);
		if (!err)
			err = mp_membw_fma_sample(b->membw, &fma[2 * r + 1]);
		if (!err)
			err = mp_membw_fma_sample_one(b->membw, &fma1[r]);
		if (err)
			break;
		sps[r] = (double)o.steps / o.seconds;
		tps[r] = sps[r] * B;
		bps[r] = (double)o.bytes / (double)o.steps;
		mps[r] = (double)o.macs / (double)o.steps;
	}
	if (err)
		return err;
	*nbw += nb;
	{
		double t = cli_median(tps, env.repeat), s = cli_median(sps, env.repeat);
		double bytes = cli_median(bps, env.repeat), membw = cli_median(bw, nb);
		double membw1 = cli_median(bw1, env.repeat);
		double bound = membw * 1e9 / bytes * B, bw_lo = bw[0], bw_hi = bw[0];
		/* The compute roof: the step's multiply-adds at the probe's rate. */
		double macs = cli_median(mps, env.repeat), rate = cli_median(fma, 2 * env.repeat);
		double compute = rate * 1e9 / macs * B, roof = compute < bound ? compute : bound;

		/* the samples' spread: how far the bound itself moves within a batch size */
		for (uint32_t i = 1; i < nb; i++) {
			bw_lo = bw[i] < bw_lo ? bw[i] : bw_lo;
			bw_hi = bw[i] > bw_hi ? bw[i] : bw_hi;
		}

		if (B == env.sizes[0])
			*tok1 = t / B;
		json_array_append_new(results, json_pack(
			"{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:f, s:f, s:f, s:f, "
			"s:f, s:f, s:f, s:f, s:f, s:f}", "batch",
			(int)B, "tok_s", t, "steps_s", s, "weight_bytes_per_step", bytes,
			"weights_gbps", bytes * s / 1e9, "membw_gbps", membw, "membw_min_gbps",
			bw_lo, "membw_max_gbps", bw_hi, "membw_samples", (int)nb, "membw_1t_gbps",
			membw1, "bound_tok_s", bound,
			"bound_ratio", t / bound, "macs_per_step", macs, "fma_gmacs", rate,
			"fma_1t_gmacs", cli_median(fma1, env.repeat), "compute_tok_s", compute,
			"roof_tok_s", roof, "roof_ratio", t / roof,
			"speedup", *tok1 > 0 ? t / *tok1 : 0));
		if (!env.json)
			printf("batch %3u: %8.1f tok/s  %7.2f steps/s  %7.1f MB/step  %5.1f GB/s of "
			       "%5.1f (1 thread %5.1f)  bound %.2f  %5.1f G MAC/s  roof %.2f  "
			       "x%.2f\n",
			       B, t, s, bytes / 1e6, bytes * s / 1e9, membw, membw1, t / bound, rate,
			       t / roof, *tok1 > 0 ? t / *tok1 : 0);
	}
	return 0;
}

int cmd_batchbench(int argc, char **argv)
{
	struct bench b = { 0 };
	json_t *results = json_array();
	uint32_t nbw = 0;
	double tok1 = 0, *bw;
	int err;

	memset(&env, 0, sizeof(env));
	env.tokens = 32;
	env.prompt = 16;
	env.repeat = 3;
	env.membw_every = 1;
	if (argp_parse(&argp, argc, argv, 0, NULL, NULL))
		return 1;
	if (!env.nsizes)
		cli_parse_u32_list("--batch", "1,2,4,8,16", 1, 256, env.sizes, MAX_SIZES, &env.nsizes);
	bw = calloc((size_t)env.nsizes * samples_per_size(), sizeof(*bw));
	err = results && bw ? open_bench(&b) : -ENOMEM;
	for (uint32_t i = 0; i < env.nsizes && !err; i++)
		err = measure(&b, env.sizes[i], results, &tok1, bw, &nbw);
	if (err) {
		cli_fail(err, NULL);
	} else if (env.json) {
		struct mp_runner_stats rs;
		json_t *o;

		mp_runner_stats(b.runner, &rs);
		o = json_pack("{s:s, s:i, s:f, s:I, s:f, s:s, s:I, s:o}", "model", env.model,
			      "threads", (int)b.engine->threads, "membw_gbps",
			      cli_median(bw, nbw), "membw_bytes",
			      (json_int_t)mp_membw_bytes(b.membw), "membw_huge_share",
			      mp_membw_huge_share(b.membw),
			      "source", env.attach ? "attached" : env.budget ? "paged" : "resident",
			      "dense_packed_bytes", (json_int_t)rs.dense_packed_bytes,
			      "results", results);

		results = NULL;
		json_dumpf(o, stdout, JSON_INDENT(1));
		putchar('\n');
		json_decref(o);
	}
	json_decref(results);
	close_bench(&b);
	free(bw);
	return err ? 1 : 0;
}
