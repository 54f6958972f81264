// SPDX-License-Identifier: MIT
/* moepager coe-window: CoServe's decay-window search for the memory split (docs/coe.md). */
#include <argp.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager.h>

#include "cli.h"
#include "coe/coe_tool.h"

static struct {
	const char *coe, *profile;
	uint64_t memory;
	double w0, margin;
	uint32_t requests, executors, threads;
	uint64_t interval_us;
	bool json;
	struct cli_engine_opts eng;
} env;

enum { OPT_PROFILE = 0x100, OPT_MEMORY, OPT_W0, OPT_MARGIN, OPT_REQUESTS, OPT_EXECUTORS,
       OPT_INTERVAL };

static const char doc[] =
	"Split --memory between models and batch inference as CoServe's §4.4 does:\n"
	"windows over the models sorted by usage, [0, W0], then each next one as long as\n"
	"the last times 1 - W0/100 (W0 = 15: [0,15], [15,27.75], [27.75,38.59], ...); at\n"
	"each window's upper bound the sample board runs under CoServe with that many\n"
	"models' bytes as the budget and the rest as batch memory; the slide stops when\n"
	"the throughput falls short of the line through the earlier ones by more than\n"
	"--margin. A model count is drawn within the last window.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager coe-window --coe coe/coe.json --profile coe/profile.json \\\n"
	"      --memory 700M --requests 600 --json\n";

static const struct argp_option opts[] = {
	{ "coe", 'c', "FILE", 0, "The CoE manifest (required)", 0 },
	{ "profile", OPT_PROFILE, "FILE", 0, "coe-profile's output (required)", 0 },
	{ "memory", OPT_MEMORY, "SIZE", 0, "Memory for models and batch items (required)", 0 },
	{ "w0", OPT_W0, "N", 0, "Initial window (default 15)", 0 },
	{ "margin", OPT_MARGIN, "F", 0, "Stop margin (default 0.05)", 0 },
	{ "requests", OPT_REQUESTS, "N", 0, "Requests of the sample board (default 500)", 0 },
	{ "interval-us", OPT_INTERVAL, "US", 0, "Between arrivals (default 4000)", 0 },
	{ "executors", OPT_EXECUTORS, "N", 0, "Executors (default 2)", 0 },
	{ "json", 'j', NULL, 0, "Print JSON", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case ARGP_KEY_INIT:
		state->child_inputs[0] = &env.eng;
		break;
	case 'c': env.coe = arg; break;
	case 'j': env.json = true; break;
	case OPT_PROFILE: env.profile = arg; break;
	case OPT_MEMORY: cli_opt_size(state, "--memory", arg, &env.memory); break;
	case OPT_W0: cli_opt_double(state, "--w0", arg, 0, 1e9, &env.w0); break;
	case OPT_MARGIN: cli_opt_double(state, "--margin", arg, 0, 1, &env.margin); break;
	case OPT_REQUESTS: cli_opt_u32(state, "--requests", arg, 1, 1u << 24, &env.requests); break;
	case OPT_INTERVAL: cli_opt_u64(state, "--interval-us", arg, 0, 10000000, &env.interval_us);
		break;
	case OPT_EXECUTORS: cli_opt_u32(state, "--executors", arg, 1, 256, &env.executors); break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.coe || !env.profile || !env.memory)
			argp_error(state, "--coe, --profile and --memory are required");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

struct window_ctx {
	struct mp_coe *c;
	struct coe_run_opts o;
	struct mp_coe_request *reqs;
	uint32_t n;
	uint64_t *top;		/* bytes of the k most used models, k = 1..models */
};

static int cmp_usage(const void *a, const void *b)
{
	double x = ((const struct mp_coe_model_info *)a)->usage;
	double y = ((const struct mp_coe_model_info *)b)->usage;

	return x > y ? -1 : x < y;
}

static int sorted_bytes(struct window_ctx *w)
{
	uint32_t n = mp_coe_model_count(w->c);
	struct mp_coe_model_info *mi = calloc(n, sizeof(*mi));

	w->top = calloc(n + 1, sizeof(*w->top));
	if (!mi || !w->top) {
		free(mi);
		return -ENOMEM;
	}
	for (uint32_t m = 0; m < n; m++)
		mp_coe_model(w->c, m, &mi[m]);
	qsort(mi, n, sizeof(*mi), cmp_usage);
	for (uint32_t k = 1; k <= n; k++)
		w->top[k] = w->top[k - 1] + mi[k - 1].bytes;
	free(mi);
	return 0;
}

static int measure(void *arg, uint32_t k, double *thr)
{
	struct window_ctx *w = arg;
	struct mp_coe_sched_stats st;
	struct mp_pager_stats pst;
	int err;

	*thr = 0;
	if (w->top[k] >= env.memory)
		return 0;		/* no memory left for a batch: nothing runs */
	w->o.budget = w->top[k];
	w->o.batch_memory = env.memory - w->top[k];
	err = coe_run(w->c, &w->o, w->reqs, w->n, &st, &pst);
	/* A budget below what the executors hold at once cannot run at all. */
	if (err == -EINVAL)
		return 0;
	if (!err)
		*thr = st.requests / (st.makespan_ns / 1e9);
	if (!env.json)
		fprintf(stderr, "  %u models: %.1f req/s\n", k, *thr);
	return err;
}

static void print_result(const struct mp_coe_window_result *r)
{
	json_t *steps = json_array();

	for (uint32_t i = 0; i < r->n_steps; i++)
		json_array_append_new(steps, json_pack("{s:f, s:f, s:f, s:f}", "lo", r->steps[i].lo,
			"hi", r->steps[i].hi, "throughput_rps", r->steps[i].throughput, "predicted",
			r->steps[i].predicted));
	if (env.json) {
		json_t *o = json_pack("{s:o, s:f, s:f, s:i, s:b}", "steps", steps, "lo", r->lo,
				      "hi", r->hi, "choice", (int)r->choice, "stopped", r->stopped);

		json_dumpf(o, stdout, JSON_INDENT(1));
		putchar('\n');
		json_decref(o);
		return;
	}
	json_decref(steps);
	printf("window [%.2f, %.2f]%s: load %u models\n", r->lo, r->hi,
	       r->stopped ? " (throughput fell short of the line)" : "", r->choice);
}

int cmd_coe_window(int argc, char **argv)
{
	static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
	static const struct argp argp = { opts, parse_arg, NULL, doc, children, NULL, NULL };
	struct mp_coe_profile pr = { 0 };
	struct mp_coe_window_result r;
	struct window_ctx w = { 0 };
	int n, err;

	memset(&env, 0, sizeof(env));
	env.w0 = 15;
	env.margin = 0.05;
	env.requests = 500;
	env.interval_us = 4000;
	env.executors = 2;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	err = mp_coe_open(env.coe, &w.c);
	if (err) {
		cli_fail(err, NULL);
		return err;
	}
	err = mp_coe_profile_load(env.profile, &pr);
	if (!err)
		err = sorted_bytes(&w);
	n = err ? err : mp_coe_workload(w.c, &(struct mp_coe_workload_config){
		.requests = env.requests, .interval_ns = env.interval_us ? env.interval_us * 1000 : 1 },
		&w.reqs);
	if (n < 0) {
		err = n;
		cli_fail(err, NULL);
		goto close;
	}
	w.n = (uint32_t)n;
	w.o = (struct coe_run_opts){ .pol = coe_policy_find("coserve"), .executors = env.executors,
				     .threads = 1, .tokens = pr.tokens, .profile = &pr,
				     .engine = env.eng.engine, .drop_cache = true };
	err = mp_coe_decay_window(env.w0, env.margin, mp_coe_model_count(w.c), 1, measure, &w, &r);
	if (err)
		cli_fail(err, NULL);
	else
		print_result(&r);
close:
	free(w.reqs);
	free(w.top);
	mp_coe_profile_free(&pr);
	mp_coe_close(w.c);
	return err;
}
