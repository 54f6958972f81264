// SPDX-License-Identifier: MIT
/*
 * moepager bench-adapters: many expert adapters over one base (ExpertWeave)
 * against the base alone, a padded layout and one merged model per
 * adapter, on the same request stream; latency alone and under a mixed
 * load, the bytes a step reads and their bound at the memory bandwidth of
 * the same run, and what rerouting costs.
 */
#include <argp.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/adapterbench.h"

static struct ab_opts env;

enum {
	OPT_ADAPTERS = 0x100, OPT_REPLICATE, OPT_SETUPS, OPT_BUDGET, OPT_REQUESTS, OPT_ALONE,
	OPT_RATE, OPT_MAX_TOKENS, OPT_PROMPT_TOKENS, OPT_MAX_BATCH, OPT_MIX_ALPHA, OPT_E_MAX,
	OPT_REPEAT, OPT_SEED, OPT_JSON, OPT_PREFETCH, OPT_PAGED_ROWS, OPT_NO_ROW_PREFETCH,
	OPT_WARM_ROWS,
};

static const char doc[] =
	"Serves one request stream (Poisson arrivals at --rate, each request of an\n"
	"adapter drawn by power-law shares: adapter i's share is proportional to\n"
	"(i + 1)^-ALPHA, random prompt ids, greedy, exactly --max-tokens tokens)\n"
	"with each setup:\n"
	"  weave   the base and every adapter in its slot (mp_adapters), rerouting\n"
	"  base    the same requests all served by the base: the floor\n"
	"  padded  weave with every slot backed to E_max rows in every layer\n"
	"  merged  one runner and scheduler per adapter over its merged model\n"
	"Phases: (1) --alone requests one at a time: median TTFT and TPOT; (2) the\n"
	"whole stream open-loop, continuous batching up to --max-batch: TTFT/TPOT\n"
	"p50/p90, tokens/s, the weight bytes a step reads and the TPOT they allow at\n"
	"the memory bandwidth sampled around the run; (3) one-runner setups:\n"
	"mp_reroute() over the [B, k] routed ids of recorded steps and the setup's\n"
	"expert lookups, as a share of the step. --replicate N loads the files\n"
	"round-robin under distinct names (legal#2): replicas are copies. Under\n"
	"--budget every setup's experts live in B bytes: weave's pager gets what the\n"
	"adapters leave, each merged model B / adapters; with --paged-rows weave's\n"
	"adapter rows are pager rows under the whole budget, and --prefetch POLICY\n"
	"puts a prefetcher over every pager (adapter rows predicted through each\n"
	"request's map unless --no-row-prefetch; --warm-rows reads a request's rows\n"
	"when it is admitted). Figures are medians over\n"
	"--repeat runs; ratios are against base.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager bench-adapters --model tiny-real.mpk --adapters adapters/ \\\n"
	"      --replicate 20 --rate 8 --requests 64 --json\n"
	"  moepager bench-adapters --model tiny-real.mpk --adapters adapters/ \\\n"
	"      --setups weave,merged --budget 40M\n";

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0, "The base model (.mpk, required)", 0 },
	{ "adapters", OPT_ADAPTERS, "DIR", 0, "Its adapters: every .mpa of DIR (required)", 0 },
	{ "replicate", OPT_REPLICATE, "N", 0, "Reach N adapters with copies (default: one per file)",
	  0 },
	{ "setups", OPT_SETUPS, "LIST", 0, "weave,base,padded,merged (default all)", 0 },
	{ "budget", OPT_BUDGET, "B", 0, "Page the experts under B bytes (8G, 40M, 50%)", 0 },
	{ "requests", OPT_REQUESTS, "N", 0, "Requests in the stream (default 64)", 0 },
	{ "alone", OPT_ALONE, "N", 0, "Requests timed one at a time (default 16)", 0 },
	{ "rate", OPT_RATE, "R", 0, "Arrivals per second (default 4)", 0 },
	{ "max-tokens", OPT_MAX_TOKENS, "N", 0, "Tokens each request generates (default 32)", 0 },
	{ "prompt-tokens", OPT_PROMPT_TOKENS, "N", 0, "Prompt tokens per request (default 32)", 0 },
	{ "max-batch", OPT_MAX_BATCH, "N", 0, "Sequences in a step at most (default 8)", 0 },
	{ "mix-alpha", OPT_MIX_ALPHA, "A", 0, "Power-law exponent of adapter shares (default 1)",
	  0 },
	{ "e-max", OPT_E_MAX, "N", 0,
	  "Rows per slot and layer (default: the most an adapter replaces in a layer)", 0 },
	{ "repeat", OPT_REPEAT, "N", 0, "Runs of each setup (default 3)", 0 },
	{ "seed", OPT_SEED, "N", 0, "Arrivals, adapters and prompts drawn from it (default 1)", 0 },
	{ "prefetch", OPT_PREFETCH, "POLICY", 0,
	  "Paged: a prefetcher over each pager (finemoe, nextlayer, ...)", 0 },
	{ "paged-rows", OPT_PAGED_ROWS, NULL, 0,
	  "Paged: weave's adapter rows are pager rows under the one budget", 0 },
	{ "no-row-prefetch", OPT_NO_ROW_PREFETCH, NULL, 0,
	  "Paged rows: the prefetcher predicts base rows only (the comparison)", 0 },
	{ "warm-rows", OPT_WARM_ROWS, NULL, 0,
	  "Paged rows: a request's adapter rows are read when it is admitted", 0 },
	{ "json", OPT_JSON, NULL, 0, "Print one JSON object", 0 },
	{ 0 },
};

static int parse_setups(const char *s, unsigned *mask)
{
	char *copy = strdup(s), *save = NULL;
	int err = copy ? 0 : -ENOMEM;

	*mask = 0;
	for (char *t = strtok_r(copy, ",", &save); t && !err; t = strtok_r(NULL, ",", &save)) {
		int k = 0;

		while (k < AB_KINDS && strcmp(t, ab_kind_names[k]))
			k++;
		if (k == AB_KINDS)
			err = -EINVAL;
		*mask |= 1u << k;
	}
	free(copy);
	return err ? err : *mask ? 0 : -EINVAL;
}

static int parse_num(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case OPT_REPLICATE:
		return cli_opt_u32(state, "--replicate", arg, 1, AB_MAX_ADAPTERS, &env.replicate);
	case OPT_REQUESTS: return cli_opt_u32(state, "--requests", arg, 1, 10000, &env.requests);
	case OPT_ALONE: return cli_opt_u32(state, "--alone", arg, 1, 10000, &env.alone);
	case OPT_MAX_TOKENS:
		return cli_opt_u32(state, "--max-tokens", arg, 2, 4096, &env.max_tokens);
	case OPT_PROMPT_TOKENS:
		return cli_opt_u32(state, "--prompt-tokens", arg, 1, 4096, &env.prompt_tokens);
	case OPT_MAX_BATCH: return cli_opt_u32(state, "--max-batch", arg, 1, 256, &env.max_batch);
	case OPT_E_MAX: return cli_opt_u32(state, "--e-max", arg, 1, MP_MAX_EXPERTS, &env.e_max);
	case OPT_REPEAT: return cli_opt_u32(state, "--repeat", arg, 1, AB_MAX_REPEAT, &env.repeat);
	case OPT_RATE: return cli_opt_double(state, "--rate", arg, 1e-3, 1e5, &env.rate);
	case OPT_MIX_ALPHA: return cli_opt_double(state, "--mix-alpha", arg, 0, 10, &env.mix_alpha);
	case OPT_SEED: return cli_opt_u64(state, "--seed", arg, 0, UINT64_MAX, &env.seed);
	}
	return ARGP_ERR_UNKNOWN;
}

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'm': env.model = arg; break;
	case OPT_ADAPTERS: env.adapters = arg; break;
	case OPT_BUDGET: env.budget = arg; break;
	case OPT_JSON: env.json = true; break;
	case OPT_PREFETCH: env.prefetch = arg; break;
	case OPT_PAGED_ROWS: env.paged_rows = true; break;
	case OPT_NO_ROW_PREFETCH: env.no_row_prefetch = true; break;
	case OPT_WARM_ROWS: env.warm_rows = true; break;
	case OPT_SETUPS:
		if (parse_setups(arg, &env.setups))
			argp_error(state, "--setups: '%s' is not a list of weave, base, padded, merged",
				   arg);
		break;
	case ARGP_KEY_INIT:
		state->child_inputs[0] = &env.eng;
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.model || !env.adapters)
			argp_error(state, "--model FILE and --adapters DIR are required");
		if (!env.budget && (env.prefetch || env.paged_rows))
			argp_error(state, "--prefetch and --paged-rows page the experts: give --budget");
		if (env.warm_rows && !env.paged_rows)
			argp_error(state, "--warm-rows reads paged rows ahead: give --paged-rows");
		if (env.no_row_prefetch && (!env.prefetch || !env.paged_rows))
			argp_error(state, "--no-row-prefetch compares prefetchers of paged rows: give "
				   "--prefetch and --paged-rows");
		break;
	default:
		return parse_num(key, arg, state);
	}
	return 0;
}

static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
static const struct argp argp = { opts, parse_arg, NULL, doc, children, NULL, NULL };

/* A setup's figures: each round's, their medians and paired ratios, what it holds. */
struct ab_row {
	bool ran, probed, has_stats;
	double runs[AB_MAX_REPEAT][F_COUNT];
	double fig[F_COUNT];
	double vs[F_COUNT];		/* median over rounds of the round's ratio to base */
	uint64_t memory;
	struct mp_adapters_stats stats;
};

/* Base first: the others are compared with it. */
static const enum ab_kind order[AB_KINDS] = { AB_BASE, AB_WEAVE, AB_PADDED, AB_MERGED };

/* One round: the alone requests over every setup in turn, then each setup's mix and probe. */
static int run_round(struct ab_setup **open, uint32_t n, struct ab_row *rows, uint32_t r)
{
	double figs[AB_KINDS][F_COUNT] = { { 0 } };
	int base = -1, err;

	for (uint32_t i = 0; i < n; i++)
		if (open[i]->kind == AB_BASE)
			base = (int)i;
	err = ab_run_alone(open, n, base, figs);
	for (uint32_t i = 0; i < n && !err; i++) {
		struct ab_row *row = &rows[open[i]->kind];

		err = ab_run_mixed(open[i], figs[i]);
		if (!err && row->probed)
			err = ab_run_probe(open[i], figs[i]);
		memcpy(row->runs[r], figs[i], sizeof(figs[i]));
	}
	return err;
}

static void medians(struct ab_row *rows)
{
	const struct ab_row *base = &rows[AB_BASE];
	double col[AB_MAX_REPEAT];

	for (int k = 0; k < AB_KINDS; k++)
		for (int f = 0; rows[k].ran && f < F_COUNT; f++) {
			for (uint32_t r = 0; r < env.repeat; r++)
				col[r] = rows[k].runs[r][f];
			rows[k].fig[f] = cli_median(col, env.repeat);
			for (uint32_t r = 0; base->ran && r < env.repeat; r++)
				col[r] = base->runs[r][f] > 0 ? rows[k].runs[r][f] / base->runs[r][f] : 0;
			rows[k].vs[f] = base->ran ? cli_median(col, env.repeat) : 0;
		}
}

/*
 * Deploys every setup at once (base, weave and padded share the resident
 * base), runs --repeat rounds, and takes them down: each round compares the
 * setups close together in time, so a machine whose load drifts drifts over
 * all of them alike.
 */
static int run_all(struct ab_bench *b, struct ab_row *rows)
{
	struct ab_setup setups[AB_KINDS], *open[AB_KINDS];
	uint32_t n = 0;
	int err = 0;

	for (int i = 0; i < AB_KINDS && !err; i++) {
		enum ab_kind k = order[i];

		if (!(env.setups & (1u << k)))
			continue;
		open[n] = &setups[n];
		err = ab_setup_open(b, k, open[n++]);
		rows[k].probed = open[n - 1]->n_inst == 1;
		rows[k].has_stats = open[n - 1]->set != NULL;
		rows[k].memory = open[n - 1]->memory;
		rows[k].stats = open[n - 1]->stats;
	}
	for (uint32_t r = 0; r < env.repeat && !err; r++)
		err = run_round(open, n, rows, r);
	for (uint32_t i = 0; i < n; i++) {
		rows[open[i]->kind].ran = !err;
		ab_setup_close(open[i]);
	}
	if (!err)
		medians(rows);
	return err;
}

static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0;
}

static double reroute_share(const double *f)
{
	return ratio((f[F_REROUTE_NS] + f[F_LOOKUP_NS]) / 1e6, f[F_PROBE_STEP_MS]);
}

/* The probe's full decode batches: the step time their bytes allow at the run's bandwidth. */
static double probe_bound_ms(const double *f)
{
	return f[F_PROBE_MEMBW] > 0 ? f[F_PROBE_BYTES] / (f[F_PROBE_MEMBW] * 1e9) * 1e3 : 0;
}

static json_t *p50_p90(double p50, double p90)
{
	return json_pack("{s:f, s:f}", "p50", p50, "p90", p90);
}

static json_t *row_json(const struct ab_row *row, const struct ab_row *base)
{
	const double *f = row->fig, *v = row->vs;
	json_t *o = json_pack(
		"{s:{s:f, s:f}, s:o, s:o, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:i}",
		"alone", "ttft_ms", f[F_ALONE_TTFT], "tpot_ms", f[F_ALONE_TPOT],
		"ttft_ms", p50_p90(f[F_TTFT50], f[F_TTFT90]),
		"tpot_ms", p50_p90(f[F_TPOT50], f[F_TPOT90]),
		"throughput_tok_s", f[F_TOK_S], "mean_batch", f[F_MEAN_BATCH],
		"step_ms", f[F_STEP_MS], "bytes_per_step", f[F_BYTES_STEP],
		"decode_bytes_per_step", f[F_DECODE_BYTES], "membw_gbps", f[F_MEMBW],
		"bound_tpot_ms", f[F_BOUND_MS], "tpot_bound_ratio", f[F_TPOT_BOUND],
		"memory_bytes", (json_int_t)row->memory, "errors", (int)f[F_ERRORS]);

	if (row->has_stats)
		json_object_update_new(o, json_pack("{s:f, s:I, s:I, s:I, s:i, s:i}",
			"f_mem", row->stats.f_mem, "adapter_bytes", (json_int_t)row->stats.adapter_bytes,
			"held_bytes", (json_int_t)row->stats.held_bytes,
			"padded_bytes", (json_int_t)row->stats.padded_bytes,
			"slots", (int)row->stats.slots, "e_max", (int)row->stats.e_max));
	if (env.budget)
		json_object_set_new(o, "paging", json_pack("{s:f, s:f, s:f, s:f}",
			"hit_rate", f[F_HIT_RATE], "prefetch_issued", f[F_PF_ISSUED],
			"prefetch_row_issued", f[F_PF_ROW_ISSUED], "prefetch_used", f[F_PF_USED]));
	if (row->probed)
		json_object_update_new(o, json_pack("{s:{s:f, s:f, s:f, s:f, s:f}, s:f, s:f, s:f}",
			"probe", "step_ms", f[F_PROBE_STEP_MS], "bytes_per_step", f[F_PROBE_BYTES],
			"membw_gbps", f[F_PROBE_MEMBW], "bound_ms", probe_bound_ms(f),
			"step_bound_ratio", ratio(f[F_PROBE_STEP_MS], probe_bound_ms(f)),
			"reroute_ns_per_step", f[F_REROUTE_NS], "lookup_ns_per_step", f[F_LOOKUP_NS],
			"reroute_share", reroute_share(f)));
	if (base->ran) {
		json_t *vs = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
			"alone_ttft", f[F_ALONE_TTFT_X], "alone_tpot", f[F_ALONE_TPOT_X],
			"ttft_p50", v[F_TTFT50], "tpot_p50", v[F_TPOT50], "throughput", v[F_TOK_S],
			"bytes_per_step", v[F_BYTES_STEP],
			"decode_bytes_per_step", v[F_DECODE_BYTES]);

		if (row->probed)
			json_object_set_new(vs, "probe_step", json_real(v[F_PROBE_STEP_MS]));
		json_object_set_new(o, "vs_base", vs);
	}
	return o;
}

static json_t *adapters_json(const struct ab_bench *b)
{
	json_t *a = json_array();

	for (uint32_t i = 0; a && i < b->n_adapters; i++) {
		const struct ab_file *f = &b->files[b->adapters[i].file];

		json_array_append_new(a, json_pack("{s:s, s:s, s:b, s:i, s:i}",
			"name", b->adapters[i].name, "file", f->path, "replica", i >= b->n_files,
			"experts", (int)f->experts, "max_per_layer", (int)f->max_per_layer));
	}
	return a;
}

static void print_json(const struct ab_bench *b, const struct ab_row *rows, const double *load)
{
	json_t *setups = json_object(), *o;

	for (int k = 0; k < AB_KINDS; k++)
		if (rows[k].ran)
			json_object_set_new(setups, ab_kind_names[k], row_json(&rows[k],
									 &rows[AB_BASE]));
	o = json_pack("{s:s, s:s, s:i, s:i, s:b, s:o, s:I, s:i, s:i, s:f, s:i, s:i, s:i, s:f, "
		      "s:i, s:I, s:i, s:o}",
		      "model", env.model, "adapters_dir", env.adapters,
		      "n_adapters", (int)b->n_adapters, "files", (int)b->n_files,
		      "replicas_are_copies", b->n_adapters > b->n_files, "adapters", adapters_json(b),
		      "budget_bytes", (json_int_t)b->budget, "requests", (int)env.requests,
		      "alone", (int)env.alone, "rate", env.rate, "max_tokens", (int)env.max_tokens,
		      "prompt_tokens", (int)env.prompt_tokens, "max_batch", (int)env.max_batch,
		      "mix_alpha", env.mix_alpha, "repeat", (int)env.repeat,
		      "seed", (json_int_t)env.seed, "threads", (int)b->engine->threads,
		      "setups", setups);
	json_object_set_new(o, "membw_gbps", json_real(rows[AB_BASE].ran ?
						      rows[AB_BASE].fig[F_MEMBW] : 0));
	/* The probe's buffer on huge pages, as the resident weights: the two read alike. */
	json_object_set_new(o, "membw_huge_share", json_real(mp_membw_huge_share(b->membw)));
	json_object_set_new(o, "loadavg", json_pack("[f, f]", load[0], load[1]));
	json_object_update_new(o, json_pack("{s:s?, s:b, s:b, s:b}", "prefetch", env.prefetch,
					    "paged_rows", env.paged_rows && env.budget,
					    "row_prefetch", env.prefetch && env.paged_rows &&
					    !env.no_row_prefetch,
					    "warm_rows", env.warm_rows && env.paged_rows &&
					    env.budget));
	json_dumpf(o, stdout, JSON_INDENT(1));
	putchar('\n');
	json_decref(o);
}

static void print_text(const struct ab_bench *b, const struct ab_row *rows)
{
	printf("%u adapters from %u file(s)%s, %u requests at %g/s, %s; x: against base\n",
	       b->n_adapters, b->n_files, b->n_adapters > b->n_files ? " (replicas are copies)" :
	       "", env.requests, env.rate, b->budget ? "paged" : "resident");
	for (int k = 0; k < AB_KINDS; k++) {
		const struct ab_row *r = &rows[k];
		const double *f = r->fig, *v = r->vs;

		if (!r->ran)
			continue;
		printf("%-7s alone: ttft %.2f ms (x%.3f), tpot %.2f ms (x%.3f) | mixed: ttft "
		       "%.1f/%.1f ms, tpot %.2f/%.2f ms (x%.3f), %.1f tok/s (x%.3f), batch %.1f, "
		       "%.1f MB/step (x%.3f), tpot/bound %.2f\n", ab_kind_names[k],
		       f[F_ALONE_TTFT], f[F_ALONE_TTFT_X], f[F_ALONE_TPOT], f[F_ALONE_TPOT_X],
		       f[F_TTFT50], f[F_TTFT90], f[F_TPOT50], f[F_TPOT90], v[F_TPOT50], f[F_TOK_S],
		       v[F_TOK_S], f[F_MEAN_BATCH], f[F_DECODE_BYTES] / 1e6, v[F_DECODE_BYTES],
		       f[F_TPOT_BOUND]);
		printf("        memory %.1f MB", r->memory / 1e6);
		if (r->has_stats)
			printf(", adapters %.1f MB held of %.1f padded, F_mem %.2f",
			       r->stats.held_bytes / 1e6, r->stats.padded_bytes / 1e6, r->stats.f_mem);
		if (b->budget)
			printf(" | hit rate %.3f, prefetches %.0f (adapter rows %.0f), used %.0f",
			       f[F_HIT_RATE], f[F_PF_ISSUED], f[F_PF_ROW_ISSUED], f[F_PF_USED]);
		if (r->probed)
			printf(" | full batch: step %.2f ms (x%.3f), %.2f x its bound, rerouting and "
			       "lookups %.4f%% of it", f[F_PROBE_STEP_MS], v[F_PROBE_STEP_MS],
			       ratio(f[F_PROBE_STEP_MS], probe_bound_ms(f)), 100 * reroute_share(f));
		putchar('\n');
	}
}

/* The 1-minute load average: how busy the (shared) machine was. */
static double loadavg(void)
{
	double l = 0;

	if (getloadavg(&l, 1) != 1)
		l = 0;
	return l;
}

int cmd_adapterbench(int argc, char **argv)
{
	struct ab_row rows[AB_KINDS] = { 0 };
	struct ab_bench b;
	double load[2];
	int err;

	memset(&env, 0, sizeof(env));
	env.requests = 64;
	env.alone = 16;
	env.rate = 4;
	env.max_tokens = 32;
	env.prompt_tokens = 32;
	env.max_batch = 8;
	env.mix_alpha = 1;
	env.repeat = 3;
	env.seed = 1;
	env.setups = (1u << AB_KINDS) - 1;
	if (argp_parse(&argp, argc, argv, 0, NULL, NULL))
		return 1;
	err = ab_bench_open(&b, &env);
	load[0] = loadavg();
	if (!err)
		err = run_all(&b, rows);
	load[1] = loadavg();
	if (!err && env.json)
		print_json(&b, rows, load);
	else if (!err)
		print_text(&b, rows);
	ab_bench_close(&b);
	return err ? 1 : 0;
}
