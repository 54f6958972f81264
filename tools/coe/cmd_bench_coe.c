// SPDX-License-Identifier: MIT
/* moepager bench-coe: CoServe against Samba-CoE's baselines and its own ablation (docs/coe.md). */
#include <argp.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager.h>

#include "cli.h"
#include "coe/coe_tool.h"

#define MAX_POLICIES 16
#define MAX_ROUNDS 32

static struct {
	const char *coe, *profile, *budget, *policies;
	uint32_t requests, executors, threads, tokens, max_batch, repeat;
	uint64_t interval_us, seed, batch_memory;
	bool json, no_drop;
	struct cli_engine_opts eng;
} env;

enum {
	OPT_PROFILE = 0x100, OPT_BUDGET, OPT_POLICIES, OPT_REQUESTS, OPT_INTERVAL, OPT_EXECUTORS,
	OPT_TOKENS, OPT_MAX_BATCH, OPT_BATCH_MEMORY, OPT_NO_DROP, OPT_SEED, OPT_THREADS, OPT_REPEAT,
};

static const char doc[] =
	"Run one board (requests to classifiers drawn from the CoE's start probabilities,\n"
	"one every --interval-us; a clean classification goes on to its detector) under\n"
	"each policy, over the same executors and the same budget, on a fresh pager\n"
	"whose page cache was dropped (the pager reads with O_DIRECT): CoServe, Samba-CoE\n"
	"(FCFS+LRU, one executor with all the threads), its FIFO variant, Samba-CoE\n"
	"Parallel (round robin, LRU), and the ablation none / em / em-ra. Every policy\n"
	"starts from the same pool: the most used models that fit (CoServe's initializer;\n"
	"Samba-CoE keeps its frequent experts in fast memory too), not counted.\n"
	"\n"
	"--json prints {\"policies\": {NAME: {throughput_rps, switches, loads_file,\n"
	"loads_host, ...}}, \"coserve_vs_samba\": {throughput_x, switch_reduction}}; with\n"
	"--repeat N the policies run N rounds, interleaved: medians, each round's values,\n"
	"and the median of each round's ratio.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager bench-coe --coe coe/coe.json --profile coe/profile.json \\\n"
	"      --budget 10% --interval-us 400 --repeat 3 --json\n";

static const struct argp_option opts[] = {
	{ "coe", 'c', "FILE", 0, "The CoE manifest (required)", 0 },
	{ "profile", OPT_PROFILE, "FILE", 0, "coe-profile's output (K, B, loads, max batch)", 0 },
	{ "budget", OPT_BUDGET, "SIZE", 0, "Model bytes in memory: 10% (default), 512M, ...", 0 },
	{ "policies", OPT_POLICIES, "LIST", 0, "Policies to run (default: all)", 0 },
	{ "requests", OPT_REQUESTS, "N", 0, "Requests on the board (default 2500)", 0 },
	{ "interval-us", OPT_INTERVAL, "US", 0, "Between arrivals (default 4000)", 0 },
	{ "executors", OPT_EXECUTORS, "N", 0, "Executors (default 2)", 0 },
	{ "threads", OPT_THREADS, "N", 0, "Engine threads per executor (default 1)", 0 },
	{ "tokens", OPT_TOKENS, "N", 0, "Tokens per request (default: the profile's, else 4)", 0 },
	{ "max-batch", OPT_MAX_BATCH, "N", 0, "Batch cap (default: the profile's)", 0 },
	{ "batch-memory", OPT_BATCH_MEMORY, "SIZE", 0, "Memory for batch items (default: any)", 0 },
	{ "seed", OPT_SEED, "N", 0, "The board's seed (default 1)", 0 },
	{ "repeat", OPT_REPEAT, "N", 0, "Rounds of every policy, interleaved; medians (default 1)",
	  0 },
	{ "no-drop", OPT_NO_DROP, NULL, 0, "Keep the page cache", 0 },
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
	case OPT_BUDGET: env.budget = arg; break;
	case OPT_POLICIES: env.policies = arg; break;
	case OPT_NO_DROP: env.no_drop = true; break;
	case OPT_REQUESTS: cli_opt_u32(state, "--requests", arg, 1, 1u << 24, &env.requests); break;
	case OPT_INTERVAL: cli_opt_u64(state, "--interval-us", arg, 0, 10000000, &env.interval_us);
		break;
	case OPT_EXECUTORS: cli_opt_u32(state, "--executors", arg, 0, 256, &env.executors); break;
	case OPT_THREADS: cli_opt_u32(state, "--threads", arg, 1, 256, &env.threads); break;
	case OPT_TOKENS: cli_opt_u32(state, "--tokens", arg, 1, 4096, &env.tokens); break;
	case OPT_MAX_BATCH: cli_opt_u32(state, "--max-batch", arg, 1, 4096, &env.max_batch); break;
	case OPT_BATCH_MEMORY: cli_opt_size(state, "--batch-memory", arg, &env.batch_memory);
		break;
	case OPT_SEED: cli_opt_u64(state, "--seed", arg, 0, UINT64_MAX, &env.seed); break;
	case OPT_REPEAT: cli_opt_u32(state, "--repeat", arg, 1, MAX_ROUNDS, &env.repeat); break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.coe)
			argp_error(state, "--coe FILE is required");
		if (!env.executors)
			argp_error(state, "--executors 0: at least one executor runs requests");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

/*
 * Where the executors' time went (each executor's makespan: inference,
 * stalls on weights, waiting for room, an empty queue, the rest scheduling
 * and the pager's management under the lock) and whether prefetches were in
 * time (the pager's counters: a late one was faulted on while being read).
 */
static json_t *time_json(const struct coe_run_opts *o, const struct mp_coe_sched_stats *st,
			 const struct mp_pager_stats *pst)
{
	uint32_t execs = o->pol->single ? 1 : o->executors;

	return json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:I}",
		"executors", (int)execs,
		"executor_s", execs * (st->makespan_ns / 1e9),
		"infer_s", st->infer_ns / 1e9,
		"stall_s", st->stall_ns / 1e9,
		"wait_room_s", st->wait_room_ns / 1e9,
		"idle_s", st->idle_ns / 1e9,
		"sched_s", st->sched_ns / 1e9,
		"manage_s", st->manage_ns / 1e9,
		"prefetched", (json_int_t)st->prefetched,
		"prefetch_issued", (json_int_t)pst->prefetch_issued,
		"prefetch_used", (json_int_t)pst->prefetch_used,
		"prefetch_late", (json_int_t)pst->prefetch_late,
		"file_reads", (json_int_t)pst->file_reads);
}

static json_t *policy_json(const struct coe_run_opts *o, const struct mp_coe_sched_stats *st,
			   const struct mp_pager_stats *pst)
{
	double secs = st->makespan_ns / 1e9;
	json_t *j;

	j = json_pack("{s:s, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, "
			 "s:f, s:f, s:f, s:I, s:I, s:s, s:I}",
		"what", o->pol->what,
		"throughput_rps", secs > 0 ? st->requests / secs : 0,
		"switches", (json_int_t)st->switches,
		"loads_file", (json_int_t)st->loads_file,
		"loads_host", (json_int_t)st->loads_host,
		"requests", (json_int_t)st->requests,
		"runs", (json_int_t)st->runs,
		"batches", (json_int_t)st->batches,
		"warm_loads", (json_int_t)st->warm_loads,
		"evictions", (json_int_t)st->evictions,
		"makespan_s", secs,
		"mean_batch", st->batches ? (double)st->runs / st->batches : 0,
		"sched_s", st->sched_ns / 1e9,
		"infer_s", st->infer_ns / 1e9,
		"sched_to_infer", st->infer_ns ? (double)st->sched_ns / st->infer_ns : 0,
		"manage_share", st->makespan_ns ? (double)st->manage_ns / st->makespan_ns : 0,
		"stall_s", st->stall_ns / 1e9,
		"bytes_loaded", (json_int_t)st->bytes_loaded,
		"pager_bytes_file", (json_int_t)pst->bytes_file,
		"cache", o->cache_mode,
		"output_hash", (json_int_t)(st->output_hash >> 1));
	json_object_set_new(j, "time", time_json(o, st, pst));
	/* A switch beyond a model's first load is one a perfect schedule would not make. */
	json_object_set_new(j, "distinct_loads", json_integer((json_int_t)st->distinct_loads));
	/* Models run that the warm start had not loaded: no schedule switches fewer times. */
	json_object_set_new(j, "cold_models", json_integer((json_int_t)st->cold_models));
	json_object_set_new(j, "file_read_s", json_real(pst->file_read_ns / 1e9));
	/* Experts the pager dropped: the pool's evictions' slots, and any its own budget took. */
	json_object_set_new(j, "pager_evictions", json_integer((json_int_t)pst->evictions));
	return j;
}

static int load_profile(struct mp_coe_profile *pr)
{
	int err;

	if (!env.profile)
		return 0;
	err = mp_coe_profile_load(env.profile, pr);
	if (err)
		cli_fail(err, NULL);
	return err;
}

struct results {
	const struct coe_policy *pol[MAX_POLICIES];
	uint32_t n;
	double thr[MAX_POLICIES][MAX_ROUNDS];
	double sw[MAX_POLICIES][MAX_ROUNDS];
	double cold[MAX_POLICIES][MAX_ROUNDS];
	json_t *last[MAX_POLICIES];	/* the last round's object */
};

static int parse_policies(struct results *res)
{
	char buf[512], *save = NULL, *tok;

	snprintf(buf, sizeof(buf), "%s", env.policies ? env.policies :
		 "coserve,samba,fifo,parallel,none,em,em-ra");
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (res->n == MAX_POLICIES || !(res->pol[res->n] = coe_policy_find(tok)))
			return cli_error(-EINVAL, "unknown policy '%s'", tok);
		res->n++;
	}
	return 0;
}

/* Runs the policies round after round (interleaved, so the machine's moods spread evenly). */
static int run_rounds(struct mp_coe *c, struct coe_run_opts *o,
		      const struct mp_coe_request *reqs, uint32_t n, struct results *res)
{
	for (uint32_t r = 0; r < env.repeat; r++) {
		for (uint32_t i = 0; i < res->n; i++) {
			struct mp_coe_sched_stats st;
			struct mp_pager_stats pst;
			int err;

			o->pol = res->pol[i];
			err = coe_run(c, o, reqs, n, &st, &pst);
			if (err)
				return err;
			res->thr[i][r] = st.makespan_ns ? st.requests / (st.makespan_ns / 1e9) : 0;
			res->sw[i][r] = (double)st.switches;
			res->cold[i][r] = (double)st.cold_models;
			json_decref(res->last[i]);
			res->last[i] = policy_json(o, &st, &pst);
			if (!env.json)
				printf("%-9s %8.1f req/s  switches %5llu (cold models %llu)  mean batch "
				       "%5.2f  sched/infer %.4f  manage %.3f s  makespan %.2f s\n",
				       o->pol->name, res->thr[i][r], (unsigned long long)st.switches,
				       (unsigned long long)st.cold_models,
				       st.batches ? (double)st.runs / st.batches : 0,
				       st.infer_ns ? (double)st.sched_ns / st.infer_ns : 0,
				       st.manage_ns / 1e9, st.makespan_ns / 1e9);
		}
	}
	return 0;
}

static json_t *runs_array(const double *v, uint32_t n)
{
	json_t *a = json_array();

	for (uint32_t i = 0; i < n; i++)
		json_array_append_new(a, json_real(v[i]));
	return a;
}

/* The median of n values (copied: v stays as it is). */
static double median_of(const double *v, uint32_t n)
{
	double s[MAX_ROUNDS];

	memcpy(s, v, n * sizeof(*s));
	return cli_median(s, n);
}

/* Medians over the rounds; CoServe against Samba-CoE as the median of each round's ratio. */
static void add_results(json_t *root, struct results *res)
{
	json_t *pols = json_object();
	int cs = -1, sb = -1;

	for (uint32_t i = 0; i < res->n; i++) {
		json_t *o = res->last[i];

		json_object_set_new(o, "throughput_rps", json_real(median_of(res->thr[i],
								env.repeat)));
		json_object_set_new(o, "switches", json_integer((json_int_t)median_of(res->sw[i],
								env.repeat)));
		json_object_set_new(o, "throughput_rps_runs", runs_array(res->thr[i], env.repeat));
		json_object_set_new(o, "switches_runs", runs_array(res->sw[i], env.repeat));
		json_object_set_new(pols, res->pol[i]->name, o);
		res->last[i] = NULL;
		cs = !strcmp(res->pol[i]->name, "coserve") ? (int)i : cs;
		sb = !strcmp(res->pol[i]->name, "samba") ? (int)i : sb;
	}
	json_object_set_new(root, "policies", pols);
	if (cs >= 0 && sb >= 0) {
		double tx[MAX_ROUNDS], sr[MAX_ROUNDS], bound[MAX_ROUNDS];

		for (uint32_t r = 0; r < env.repeat; r++) {
			tx[r] = res->thr[sb][r] > 0 ? res->thr[cs][r] / res->thr[sb][r] : 0;
			sr[r] = res->sw[sb][r] > 0 ? 1 - res->sw[cs][r] / res->sw[sb][r] : 0;
			/* The most any schedule could cut: down to the board's cold models. */
			bound[r] = res->sw[sb][r] > 0 ? 1 - res->cold[cs][r] / res->sw[sb][r] : 0;
		}
		json_object_set_new(root, "coserve_vs_samba", json_pack("{s:f, s:f, s:f, s:o, s:o}",
			"throughput_x", median_of(tx, env.repeat), "switch_reduction",
			median_of(sr, env.repeat), "switch_reduction_bound",
			median_of(bound, env.repeat), "throughput_x_runs", runs_array(tx, env.repeat),
			"switch_reduction_runs", runs_array(sr, env.repeat)));
	}
}

int cmd_bench_coe(int argc, char **argv)
{
	static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
	static const struct argp argp = { opts, parse_arg, NULL, doc, children, NULL, NULL };
	struct mp_coe_profile pr = { 0 };
	struct mp_coe_request *reqs = NULL;
	struct coe_run_opts o = { 0 };
	struct results res = { 0 };
	json_t *root = NULL;
	struct mp_coe *c;
	int n, err;

	memset(&env, 0, sizeof(env));
	env.executors = 2;
	env.threads = 1;
	env.requests = 2500;
	env.interval_us = 4000;
	env.seed = 1;
	env.repeat = 1;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	err = mp_coe_open(env.coe, &c);
	if (err) {
		cli_fail(err, NULL);
		return err;
	}
	err = load_profile(&pr);
	if (!err)
		err = coe_parse_budget(c, env.budget ? env.budget : "10%", &o.budget);
	if (err)
		goto close;
	n = mp_coe_workload(c, &(struct mp_coe_workload_config){ .requests = env.requests,
			    .interval_ns = env.interval_us ? env.interval_us * 1000 : 1,
			    .seed = env.seed }, &reqs);
	if (n < 0) {
		err = n;
		goto close;
	}
	o = (struct coe_run_opts){ .executors = env.executors, .threads = env.threads,
		.tokens = env.tokens ? env.tokens : pr.tokens, .budget = o.budget,
		.batch_memory = env.batch_memory, .max_batch = env.max_batch,
		.profile = env.profile ? &pr : NULL, .engine = env.eng.engine,
		.drop_cache = !env.no_drop };
	root = json_object();
	err = parse_policies(&res);
	if (!err)
		err = run_rounds(c, &o, reqs, (uint32_t)n, &res);
	json_object_set_new(root, "board", json_pack("{s:i, s:I, s:I, s:i, s:i, s:i, s:i}",
			    "requests", n, "interval_us", (json_int_t)env.interval_us, "budget_bytes",
			    (json_int_t)o.budget, "models", (int)mp_coe_model_count(c), "executors",
			    (int)env.executors, "threads", (int)env.threads, "rounds",
			    (int)env.repeat));
	if (!err)
		add_results(root, &res);
	for (uint32_t i = 0; i < res.n; i++)
		json_decref(res.last[i]);
	if (!err && env.json) {
		json_dumpf(root, stdout, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
		putchar('\n');
	}
	json_decref(root);
close:
	free(reqs);
	mp_coe_profile_free(&pr);
	mp_coe_close(c);
	return err;
}
