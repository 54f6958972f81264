// SPDX-License-Identifier: MIT
/*
 * moepager bench: prefetch and eviction policies against the baselines a user
 * would pick (mmap under a memory cgroup, per-expert O_DIRECT reads into an
 * LRU cache), replaying routing traces at several budgets.
 */
#include <argp.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <moepager.h>

#include "bench.h"
#include "cli.h"

#define MAX_LIST BENCH_MAX_LIST

static struct bench_opts env;

enum {
	OPT_MODEL = 0x100, OPT_TRACE, OPT_BUDGET, OPT_POLICIES, OPT_EVICT, OPT_TRAIN, OPT_JSON,
	OPT_CSV, OPT_PLOT, OPT_SIMULATE, OPT_DISTANCE, OPT_MAX_TOKENS,
	OPT_LOAD_COST, OPT_IO_CHANNELS, OPT_REPEAT, OPT_EMAP, OPT_NO_DROP, OPT_NO_ADMIT,
	OPT_NO_SEMANTIC, OPT_FILL_THREADS, OPT_GATES_MEMORY,
};

static const char doc[] =
	"Replays routing traces against a memory budget with each policy in turn and\n"
	"reports decode throughput, stalls and expert hit rates.\n"
	"\n"
	"The first --train-fraction of each trace's requests (FineMoE's 7:3 split; a\n"
	"one-request trace is split by tokens) warms the policies' state (the expert\n"
	"map store, transition counts, activation matrices) without timing; the\n"
	"rest is decoded and measured, one token per trace token, its routing forced\n"
	"to the trace's. Policies run one after another, --repeat N times in N\n"
	"rounds (round r starts at the r-th policy, so no policy always runs first\n"
	"or after the same one); before each run the page cache is dropped (root:\n"
	"echo 3 > /proc/sys/vm/drop_caches; otherwise reads are O_DIRECT and the\n"
	"mmap baseline says its cache was not dropped).\n"
	"\n"
	"--policies takes prefetch policies (none, nextlayer, eam, finemoe,\n"
	"finemoe+nextlayer, dependency, oracle), optionally with an eviction policy\n"
	"as PREFETCH:EVICT\n"
	"(lru, lfu, fifo, finemoe, coserve, belady, ema), and the baselines mmap (the\n"
	"model mmapped, the kernel's page cache limited by a memory cgroup (v1\n"
	"memory controller where mounted, else v2) to the budget plus what the\n"
	"process holds besides expert pages) and pread-lru (O_DIRECT reads of\n"
	"whole experts into an LRU cache of the budget, no prefetch). Without\n"
	"PREFETCH:EVICT or --evict each prefetch policy uses its paper's eviction:\n"
	"finemoe:finemoe (and finemoe+nextlayer), eam:lfu, dependency:coserve,\n"
	"oracle:belady, others lru.\n"
	"\n"
	"--simulate replays the traces through a cache model instead (no model\n"
	"file needed, budgets as percentages): hit rates within seconds, times in\n"
	"model units (one expert FFN = 1, one expert load = --load-cost).\n"
	"\n"
	"A trace that carries its token ids (tokens.R metadata, e.g. the trained\n"
	"model's) is decoded with those tokens, and with --model the prefetcher\n"
	"gets each token's embedding as its semantic vector (finemoe's search for\n"
	"the first d layers; --no-semantic: the previous iteration's map instead).\n"
	"Simulated with --model, such a trace also gives nextlayer its speculative\n"
	"gates: the model runs the trace's tokens (every expert in memory) and the\n"
	"next layer's router reads each layer's input, as in a real run.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager bench --simulate --trace gsm8k.csv,humaneval.csv --budget 25%,50% \\\n"
	"      --policies none,finemoe,oracle\n"
	"  moepager bench --model mixtral-mini.mpk --trace gsm8k.csv,humaneval.csv \\\n"
	"      --budget 50% --policies mmap,pread-lru,finemoe,oracle --json --plot out\n";

static const struct argp_option opts[] = {
	{ "model", OPT_MODEL, "FILE", 0,
	  "The .mpk model (--simulate: optional, for byte budgets and semantic vectors)", 0 },
	{ "trace", OPT_TRACE, "FILE[,FILE...]", 0, "moe-trace v1 files to replay (required)", 0 },
	{ "budget", OPT_BUDGET, "B[,B...]", 0,
	  "Expert memory: sizes (8G, 512M) or percentages of the expert bytes (default 50%)", 0 },
	{ "policies", OPT_POLICIES, "P[,P...]", 0,
	  "Policies to compare (default none,finemoe,oracle)", 0 },
	{ "evict", OPT_EVICT, "E", 0, "Eviction policy for every prefetch policy", 0 },
	{ "train-fraction", OPT_TRAIN, "F", 0,
	  "Share of requests that warm the policies (0.7)", 0 },
	{ "distance", OPT_DISTANCE, "D", 0, "Prefetch distance in layers (default 3)", 0 },
	{ "emap-capacity", OPT_EMAP, "C", 0, "Expert-map store records (default 1024)", 0 },
	{ "max-tokens", OPT_MAX_TOKENS, "N", 0, "Evaluate at most N tokens per evaluated request", 0 },
	{ "repeat", OPT_REPEAT, "N", 0,
	  "Run every cell N times, in N rounds over the policies; report the run with the "
	  "median tokens/s (default 1)", 0 },
	{ "no-drop-caches", OPT_NO_DROP, NULL, 0, "Do not drop the page cache between runs", 0 },
	{ "no-admit", OPT_NO_ADMIT, NULL, 0,
	  "Let prefetches evict experts predicted to be needed sooner", 0 },
	{ "no-semantic", OPT_NO_SEMANTIC, NULL, 0,
	  "Give the prefetcher no semantic vectors, even when the trace has token ids", 0 },
	{ "simulate", OPT_SIMULATE, NULL, 0, "Use the cache model instead of the engine", 0 },
	{ "load-cost", OPT_LOAD_COST, "X", 0,
	  "--simulate: one expert load in expert-FFN times (default 2)", 0 },
	{ "io-channels", OPT_IO_CHANNELS, "N", 0,
	  "--simulate: loads in flight at once, sharing nothing (default 1)", 0 },
	{ "gates-memory", OPT_GATES_MEMORY, "SIZE", 0,
	  "--simulate with --model: memory that keeps the layer inputs of speculative gates "
	  "between runs (default 1G); requests past it are computed again in every run", 0 },
	{ "fill-threads", OPT_FILL_THREADS, "N", 0,
	  "Real runs: the pager's fill threads, N - 1 of them for prefetches (default 2)", 0 },
	{ "json", OPT_JSON, NULL, 0, "Print {\"results\": [...]} on stdout", 0 },
	{ "csv", OPT_CSV, "FILE", 0, "Also write the results as CSV", 0 },
	{ "plot", OPT_PLOT, "DIR", 0, "Write SVG and PNG plots (gnuplot) into DIR", 0 },
	{ 0 },
};

static int split_list(char *s, char **out, uint32_t max, const char *what)
{
	uint32_t n = 0;

	for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
		if (n == max)
			return cli_error(-EINVAL, "more than %u %s", max, what);
		out[n++] = tok;
	}
	return (int)n;
}

static error_t parse_opt(int key, char *arg, struct argp_state *state)
{
	int n;

	switch (key) {
	case OPT_MODEL:
		env.model = arg;
		break;
	case OPT_TRACE:
		n = split_list(arg, env.traces, MAX_LIST, "traces");
		if (n <= 0)
			argp_error(state, "--trace needs at least one file");
		env.ntraces = (uint32_t)n;
		break;
	case OPT_BUDGET:
		n = split_list(arg, env.budgets, MAX_LIST, "budgets");
		if (n <= 0)
			argp_error(state, "--budget needs at least one value");
		env.nbudgets = (uint32_t)n;
		break;
	case OPT_POLICIES:
		n = split_list(arg, env.policies, MAX_LIST, "policies");
		if (n <= 0)
			argp_error(state, "--policies needs at least one name");
		env.npolicies = (uint32_t)n;
		break;
	case OPT_EVICT:
		env.evict = arg;
		break;
	case OPT_TRAIN: {
		char *end;

		errno = 0;
		env.train_fraction = strtod(arg, &end);
		if (errno || *end || !(env.train_fraction > 0 && env.train_fraction < 1))
			argp_error(state, "--train-fraction %s: not a number in (0, 1)", arg);
		break;
	}
	case OPT_LOAD_COST: {
		char *end;

		errno = 0;
		env.load_cost = strtod(arg, &end);
		if (errno || *end || !(env.load_cost > 0 && env.load_cost < 1e6))
			argp_error(state, "--load-cost %s: not a positive number", arg);
		break;
	}
	case OPT_REPEAT:
		cli_opt_u32(state, "--repeat", arg, 1, BENCH_MAX_REPEAT, &env.repeat);
		break;
	case OPT_IO_CHANNELS:
		cli_opt_u32(state, "--io-channels", arg, 1, 64, &env.io_channels);
		break;
	case OPT_FILL_THREADS:
		cli_opt_u32(state, "--fill-threads", arg, 1, 64, &env.fill_threads);
		break;
	case OPT_GATES_MEMORY:
		cli_opt_size(state, "--gates-memory", arg, &env.gates_memory);
		break;
	case OPT_DISTANCE:
		cli_opt_u32(state, "--distance", arg, 1, MP_MAX_LAYERS, &env.distance);
		break;
	case OPT_EMAP:
		cli_opt_u32(state, "--emap-capacity", arg, 1, 1u << 20, &env.emap_capacity);
		break;
	case OPT_MAX_TOKENS:
		cli_opt_u32(state, "--max-tokens", arg, 1, UINT32_MAX, &env.max_tokens);
		break;
	case OPT_NO_DROP:
		env.no_drop = true;
		break;
	case OPT_NO_ADMIT:
		env.no_admit = true;
		break;
	case OPT_NO_SEMANTIC:
		env.no_semantic = true;
		break;
	case OPT_SIMULATE:
		env.simulate = true;
		break;
	case OPT_JSON:
		env.json = true;
		break;
	case OPT_CSV:
		env.csv = arg;
		break;
	case OPT_PLOT:
		env.plot = arg;
		break;
	case ARGP_KEY_INIT:
		state->child_inputs[0] = &env.eng;
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.ntraces)
			argp_error(state, "--trace is required");
		if (!env.simulate && !env.model)
			argp_error(state, "--model is required (or --simulate)");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
static const struct argp argp = { opts, parse_opt, NULL, doc, children, NULL, NULL };

/* The eviction each prefetch policy's paper pairs it with. */
static const char *default_evict(const char *prefetch)
{
	if (!strcmp(prefetch, "finemoe") || !strcmp(prefetch, "finemoe+nextlayer"))
		return "finemoe";
	if (!strcmp(prefetch, "eam"))
		return "lfu";
	if (!strcmp(prefetch, "dependency"))
		return "coserve";
	if (!strcmp(prefetch, "oracle"))
		return "belady";
	return "lru";
}

/* Splits "PREFETCH[:EVICT]" (or a baseline name) into spec. Returns 0 or -EINVAL. */
static int parse_policy(const char *s, struct bench_spec *spec)
{
	const char *colon = strchr(s, ':');
	size_t n = colon ? (size_t)(colon - s) : strlen(s);

	memset(spec, 0, sizeof(*spec));
	if (n >= sizeof(spec->prefetch))
		return cli_error(-EINVAL, "policy name '%s' too long", s);
	memcpy(spec->prefetch, s, n);
	if (!strcmp(spec->prefetch, "mmap") || !strcmp(spec->prefetch, "pread-lru")) {
		if (colon)
			return cli_error(-EINVAL, "baseline %s takes no eviction policy",
				spec->prefetch);
		spec->baseline = spec->prefetch[0] == 'm' ? BENCH_MMAP : BENCH_PREAD;
		snprintf(spec->evict, sizeof(spec->evict), "%s",
			 spec->baseline == BENCH_MMAP ? "kernel" : "lru");
		return 0;
	}
	/* The library's error line names the policies (the baselines are in --help). */
	if (mp_prefetch_check_names(spec->prefetch, NULL))
		return cli_fail(-EINVAL, "unknown policy '%s'", spec->prefetch);
	snprintf(spec->evict, sizeof(spec->evict), "%s",
		 colon ? colon + 1 : env.evict ? env.evict : default_evict(spec->prefetch));
	if (mp_prefetch_check_names(NULL, spec->evict))
		return cli_fail(-EINVAL, NULL);
	return 0;
}

/* Budget string -> bytes (model known) and experts the cache holds. */
static int parse_budget(const char *s, uint64_t expert_bytes, uint64_t total_experts,
			uint64_t *bytes, uint32_t *experts)
{
	size_t n = strlen(s);

	if (expert_bytes) {
		int err = mp_budget_parse(s, expert_bytes * total_experts, bytes);

		if (err) {
			cli_fail(err, "--budget %s", s);
			return err;
		}
		*experts = (uint32_t)(*bytes / expert_bytes);
		return 0;
	}
	/* Simulated without a model: only percentages of the experts make sense. */
	if (n < 2 || s[n - 1] != '%')
		return cli_error(-EINVAL, "--budget %s: --simulate without --model takes "
			"percentages", s);
	char *end;
	double pct = strtod(s, &end);

	if (end != s + n - 1 || !(pct > 0 && pct <= 100))
		return cli_error(-EINVAL, "--budget %s: not a percentage in (0, 100]", s);
	*bytes = 0;
	*experts = (uint32_t)llround(pct / 100.0 * (double)total_experts);
	return 0;
}

/* One cell of the table, summed over the traces. */
static void add_result(struct bench_result *sum, const struct bench_result *r)
{
	sum->tokens += r->tokens;
	sum->seconds += r->seconds;
	sum->stall_seconds += r->stall_seconds;
	sum->uses += r->uses;
	sum->hits += r->hits;
	sum->prefetch_issued += r->prefetch_issued;
	sum->prefetch_used += r->prefetch_used;
	sum->prefetch_wasted += r->prefetch_wasted;
	sum->prefetch_late += r->prefetch_late;
	sum->miss_queued += r->miss_queued;
	sum->miss_predicted += r->miss_predicted;
	sum->miss_predicted_wasted += r->miss_predicted_wasted;
	sum->bytes_read += r->bytes_read;
	if (r->peak_rss > sum->peak_rss)
		sum->peak_rss = r->peak_rss;
	sum->events_dropped += r->events_dropped;
	sum->expired += r->expired;
	sum->policy_ns += r->policy_ns;
	if (r->emap_bytes > sum->emap_bytes)
		sum->emap_bytes = r->emap_bytes;
	if (r->emap_records > sum->emap_records)
		sum->emap_records = r->emap_records;
	if (r->load_ratio > 0)
		sum->load_ratio = r->load_ratio;
	sum->semantic |= r->semantic;
	if (r->fill_threads > sum->fill_threads)
		sum->fill_threads = r->fill_threads;
	sum->fresh_bytes += r->fresh_bytes;
	sum->fill_cpu_ns += r->fill_cpu_ns;
	if (r->cache_note[0])
		snprintf(sum->cache_note, sizeof(sum->cache_note), "%s", r->cache_note);
}

static int run_sim(const struct bench_spec *spec, struct mp_trace *t,
		   const struct bench_sem *sem, struct bench_look *look, uint32_t capacity,
		   uint64_t expert_bytes, struct bench_result *r)
{
	struct mp_sim_config c = {
		.trace = t, .train_fraction = env.train_fraction, .capacity = capacity,
		.prefetch = spec->prefetch, .evict = spec->evict, .distance = env.distance,
		.emap_capacity = env.emap_capacity, .load_cost = env.load_cost ?: 2.0,
		.dense_cost = 0.25, .io_channels = env.io_channels ?: 1, .no_admit = env.no_admit,
		.max_tokens = env.max_tokens,
	};
	struct mp_sim_result s;
	bool semantic = sem && !env.no_semantic && spec->baseline == BENCH_POLICY;
	int err;

	if (semantic)
		c.sem = (struct mp_sem_source){ bench_sem_dim(sem), bench_sem_fn, (void *)sem };
	if (look)
		c.spec = (struct mp_spec_source){ bench_look_fn, look };

	if (spec->baseline == BENCH_MMAP)
		return cli_error(-EINVAL, "--simulate has no model of the page cache: "
			"mmap needs a real run");
	if (spec->baseline == BENCH_PREAD) {
		c.prefetch = "none";
		c.evict = "lru";
	}
	err = mp_prefetch_simulate(&c, &s);
	if (err) {
		cli_fail(err, "simulate %s:%s", spec->prefetch, spec->evict);
		return err;
	}
	memset(r, 0, sizeof(*r));
	r->semantic = semantic;
	r->tokens = s.tokens;
	r->seconds = s.time;
	r->stall_seconds = s.stall;
	r->uses = s.uses;
	r->hits = s.hits;
	r->prefetch_issued = s.prefetch_loads;
	r->prefetch_used = s.prefetch_used;
	r->prefetch_wasted = s.prefetch_wasted;
	r->prefetch_late = s.late;
	r->miss_queued = s.miss_queued;
	r->miss_predicted = s.miss_predicted;
	r->miss_predicted_wasted = s.miss_predicted_wasted;
	r->bytes_read = (s.demand_loads + s.prefetch_loads) * (expert_bytes ? expert_bytes : 1);
	r->policy_ns = s.policy_ns;
	return 0;
}

/* One run of a policy at a budget: every trace in turn, their results summed into *sum. */
static int run_traces(const struct bench_spec *spec, struct mp_trace *const *traces,
		      struct bench_sem *const *sems, struct bench_look *const *looks,
		      struct mp_store *store, uint32_t capacity, uint64_t budget_bytes,
		      uint64_t expert_bytes, struct bench_result *sum)
{
	memset(sum, 0, sizeof(*sum));
	for (uint32_t t = 0; t < env.ntraces; t++) {
		struct bench_result r;
		int err = env.simulate ?
			  run_sim(spec, traces[t], sems[t], looks[t], capacity, expert_bytes, &r) :
			  bench_run_real(&env, spec, store, traces[t], env.traces[t], sems[t],
					 budget_bytes, &r);

		if (err)
			return err;
		add_result(sum, &r);
	}
	return 0;
}

/* Index of the run with the median throughput (the lower middle one for even counts). */
static uint32_t median_run(const double *tps, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		uint32_t below = 0, equal_before = 0;

		for (uint32_t j = 0; j < n; j++) {
			below += tps[j] < tps[i];
			equal_before += j < i && tps[j] == tps[i];
		}
		if (below + equal_before == (n - 1) / 2)
			return i;
	}
	return 0;
}

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 0.0;
}

static json_t *result_json(const struct bench_row *row)
{
	const struct bench_result *r = &row->r;
	json_t *o = json_object();

	json_object_set_new(o, "policy", json_string(row->spec.prefetch));
	json_object_set_new(o, "evict", json_string(row->spec.evict));
	json_object_set_new(o, "budget", json_string(row->budget));
	json_object_set_new(o, "budget_bytes", json_integer((json_int_t)row->budget_bytes));
	json_object_set_new(o, "decode_tokens_per_s",
			    json_real(r->seconds > 0 ? r->tokens / r->seconds : 0));
	json_object_set_new(o, "stall_ms_per_token",
			    json_real(r->tokens ? 1e3 * r->stall_seconds / r->tokens : 0));
	json_object_set_new(o, "hit_rate", json_real(ratio(r->hits, r->uses)));
	json_object_set_new(o, "prefetch_accuracy",
			    json_real(ratio(r->prefetch_used, r->prefetch_issued)));
	json_object_set_new(o, "prefetch_waste",
			    json_real(ratio(r->prefetch_wasted, r->prefetch_issued)));
	json_object_set_new(o, "bytes_read", json_integer((json_int_t)r->bytes_read));
	json_object_set_new(o, "peak_rss_bytes", json_integer((json_int_t)r->peak_rss));
	json_object_set_new(o, "tokens", json_integer((json_int_t)r->tokens));
	json_object_set_new(o, "expert_uses", json_integer((json_int_t)r->uses));
	json_object_set_new(o, "mode", json_string(env.simulate ? "simulated" : "measured"));
	json_object_set_new(o, "semantic", json_boolean(r->semantic));
	if (row->reps > 1) {
		json_t *runs = json_array(), *order = json_array();

		for (uint32_t i = 0; i < row->reps; i++) {
			json_array_append_new(runs, json_real(row->tps[i]));
			json_array_append_new(order, json_integer(row->order[i]));
		}
		json_object_set_new(o, "decode_tokens_per_s_runs", runs);
		/* Where each of those ran among the call's runs: rounds over the policies. */
		json_object_set_new(o, "runs_order", order);
	}
	if (row->spec.baseline == BENCH_POLICY) {
		/* The simulator times only the policy's calls; its decode time is model units. */
		json_object_set_new(o, "prefetch_policy_ms", json_real(r->policy_ns / 1e6));
		json_object_set_new(o, "prefetch_policy_ms_per_token",
				    json_real(r->tokens ? r->policy_ns / 1e6 / r->tokens : 0));
	}
	if (env.simulate && row->spec.baseline == BENCH_POLICY) {
		/* Misses by cause: late (being read), queued, predicted and not in, the rest. */
		json_object_set_new(o, "prefetch_late", json_integer((json_int_t)r->prefetch_late));
		json_object_set_new(o, "miss_queued", json_integer((json_int_t)r->miss_queued));
		json_object_set_new(o, "miss_predicted",
				    json_integer((json_int_t)r->miss_predicted));
		json_object_set_new(o, "miss_predicted_wasted",
				    json_integer((json_int_t)r->miss_predicted_wasted));
	}
	if (!env.simulate && row->spec.baseline == BENCH_POLICY) {
		json_object_set_new(o, "prefetch_policy_share",
				    json_real(r->seconds > 0 ? r->policy_ns / 1e9 / r->seconds : 0));
		json_object_set_new(o, "prefetch_events_dropped",
				    json_integer((json_int_t)r->events_dropped));
		json_object_set_new(o, "prefetch_expired", json_integer((json_int_t)r->expired));
		json_object_set_new(o, "prefetch_late", json_integer((json_int_t)r->prefetch_late));
		json_object_set_new(o, "emap_records", json_integer(r->emap_records));
		json_object_set_new(o, "emap_bytes", json_integer((json_int_t)r->emap_bytes));
		json_object_set_new(o, "load_ratio", json_real(r->load_ratio));
		json_object_set_new(o, "fill_threads", json_integer(r->fill_threads));
		/* Chunks the kernel zeroed for fills (the pool's growth), and what fills cost the CPUs. */
		json_object_set_new(o, "fresh_bytes", json_integer((json_int_t)r->fresh_bytes));
		json_object_set_new(o, "fill_cpu_ms_per_token",
				    json_real(r->tokens ? r->fill_cpu_ns / 1e6 / r->tokens : 0));
	}
	if (r->cache_note[0])
		json_object_set_new(o, "page_cache", json_string(r->cache_note));
	return o;
}

static void print_table(const struct bench_row *rows, uint32_t n, FILE *f)
{
	fprintf(f, "%-12s %-8s %-7s %10s %12s %7s %8s %7s %10s %10s\n", "policy", "evict",
		"budget", env.simulate ? "tok/unit" : "tok/s", env.simulate ? "stall/tok" :
		"stall ms/tok", "hit", "pf-acc", "pf-waste", "read MB", "peak RSS MB");
	for (uint32_t i = 0; i < n; i++) {
		const struct bench_result *r = &rows[i].r;

		fprintf(f, "%-12s %-8s %-7s %10.4f %12.2f %6.1f%% %7.1f%% %7.1f%% %10.0f %10.0f\n",
			rows[i].spec.prefetch, rows[i].spec.evict, rows[i].budget,
			r->seconds > 0 ? r->tokens / r->seconds : 0,
			r->tokens ? (env.simulate ? 1 : 1e3) * r->stall_seconds / r->tokens : 0,
			100 * ratio(r->hits, r->uses), 100 * ratio(r->prefetch_used,
								   r->prefetch_issued),
			100 * ratio(r->prefetch_wasted, r->prefetch_issued),
			r->bytes_read / 1e6, r->peak_rss / 1e6);
	}
}

static int write_csv(const struct bench_row *rows, uint32_t n)
{
	FILE *f = fopen(env.csv, "w");

	if (!f)
		return cli_error(-errno, "%s: %s", env.csv, strerror(errno));
	fprintf(f, "policy,evict,budget,budget_bytes,decode_tokens_per_s,stall_ms_per_token,"
		"hit_rate,prefetch_accuracy,prefetch_waste,bytes_read,peak_rss_bytes,tokens\n");
	for (uint32_t i = 0; i < n; i++) {
		const struct bench_result *r = &rows[i].r;

		fprintf(f, "%s,%s,%s,%llu,%.6f,%.6f,%.6f,%.6f,%.6f,%llu,%llu,%llu\n",
			rows[i].spec.prefetch, rows[i].spec.evict, rows[i].budget,
			(unsigned long long)rows[i].budget_bytes,
			r->seconds > 0 ? r->tokens / r->seconds : 0,
			r->tokens ? 1e3 * r->stall_seconds / r->tokens : 0,
			ratio(r->hits, r->uses), ratio(r->prefetch_used, r->prefetch_issued),
			ratio(r->prefetch_wasted, r->prefetch_issued),
			(unsigned long long)r->bytes_read, (unsigned long long)r->peak_rss,
			(unsigned long long)r->tokens);
	}
	if (fclose(f))
		return cli_error(-EIO, "%s: %s", env.csv, strerror(errno));
	return 0;
}

int cmd_bench(int argc, char **argv)
{
	static char default_budget[] = "50%";
	static char default_policies[] = "none,finemoe,oracle";
	struct mp_trace *traces[MAX_LIST] = { 0 };
	struct bench_sem *sems[MAX_LIST] = { 0 };
	struct bench_look *looks[MAX_LIST] = { 0 };
	struct bench_spec specs[MAX_LIST];
	struct bench_row *rows = NULL;
	struct bench_result *runs = NULL;	/* [policy][rep] of one budget */
	struct mp_store *store = NULL;
	uint64_t expert_bytes = 0;
	uint32_t nrows = 0, order = 0, reps;
	int err = 0;

	memset(&env, 0, sizeof(env));
	env.train_fraction = 0.7;
	env.gates_memory = 1ull << 30;
	if (argp_parse(&argp, argc, argv, 0, NULL, NULL))
		return 1;
	if (!env.nbudgets) {
		env.budgets[0] = default_budget;
		env.nbudgets = 1;
	}
	if (!env.npolicies) {
		split_list(default_policies, env.policies, MAX_LIST, "policies");
		env.npolicies = 3;
	}
	reps = env.repeat ? env.repeat : 1;
	if (env.evict && mp_prefetch_check_names(NULL, env.evict)) {
		cli_fail(-EINVAL, NULL);
		return 1;
	}
	for (uint32_t i = 0; i < env.npolicies; i++)
		if (parse_policy(env.policies[i], &specs[i]))
			return 1;
	if (env.model) {
		err = mp_store_open(env.model, &store);
		if (err) {
			cli_fail(err, "%s", env.model);
			return 1;
		}
		expert_bytes = mp_store_expert_bytes(store);
	}
	for (uint32_t i = 0; i < env.ntraces; i++) {
		err = mp_trace_open(env.traces[i], &traces[i]);
		if (err) {
			cli_fail(err, NULL);
			goto out;
		}
		if (store && (err = mp_trace_check_geometry(traces[i], mp_store_geometry(store)))) {
			cli_fail(err, "%s", env.traces[i]);
			goto out;
		}
		if (i && (mp_trace_layers(traces[i]) != mp_trace_layers(traces[0]) ||
			  mp_trace_experts(traces[i]) != mp_trace_experts(traces[0]))) {
			err = cli_error(-EINVAL, "%s: geometry differs from %s",
				env.traces[i], env.traces[0]);
			goto out;
		}
		/* Token ids, and with a model their embeddings: none is fine. */
		if (store && (err = bench_sem_open(store, traces[i], env.traces[i], &sems[i]))) {
			if (err != -ENOENT)
				goto out;
			err = 0;
		}
		/* The model runs the trace's tokens only if a simulated policy asks for gates. */
		if (env.simulate && sems[i] &&
		    (err = bench_look_open(store, traces[i], sems[i], &env.eng,
					   env.gates_memory / env.ntraces, env.train_fraction,
					   env.max_tokens, &looks[i])))
			goto out;
	}
	rows = calloc((size_t)env.nbudgets * env.npolicies, sizeof(*rows));
	runs = calloc((size_t)env.npolicies * reps, sizeof(*runs));
	if (!rows || !runs) {
		err = -ENOMEM;
		goto out;
	}
	for (uint32_t b = 0; b < env.nbudgets; b++) {
		uint64_t total = (uint64_t)mp_trace_layers(traces[0]) * mp_trace_experts(traces[0]);
		struct bench_row *brows = &rows[nrows];
		uint64_t bytes;
		uint32_t cap = 0;	/* set unless parse_budget() fails */

		err = parse_budget(env.budgets[b], expert_bytes, total, &bytes, &cap);
		if (err)
			goto out;
		for (uint32_t p = 0; p < env.npolicies; p++) {
			brows[p].spec = specs[p];
			brows[p].budget = env.budgets[b];
			brows[p].budget_bytes = bytes;
			brows[p].reps = reps;
		}
		nrows += env.npolicies;
		/*
		 * Round r runs every policy once, starting at policy r mod n: a disk
		 * cache below the guest's (a VM host's) outlives drop_caches, so a
		 * call's first run is its coldest and a run finds warm what the run
		 * before it read. In rounds no policy has all the first runs, and no
		 * policy always follows the same one (docs/prefetch.md, "moepager
		 * bench").
		 */
		for (uint32_t rep = 0; rep < reps; rep++) {
			for (uint32_t k = 0; k < env.npolicies; k++) {
				uint32_t p = (rep + k) % env.npolicies;
				struct bench_result *run = &runs[(size_t)p * reps + rep];
				struct bench_row *row = &brows[p];

				err = run_traces(&specs[p], traces, sems, looks, store, cap, bytes,
						 expert_bytes, run);
				if (err)
					goto out;
				row->tps[rep] = run->seconds > 0 ? run->tokens / run->seconds : 0;
				row->order[rep] = order++;
				if (!env.json)
					cli_say("%s:%s budget %s run %u/%u: %.4g %s", row->spec.prefetch,
						row->spec.evict, row->budget, rep + 1, reps,
						row->tps[rep], env.simulate ? "tok/unit" : "tok/s");
			}
		}
		/* Each row keeps its median run. */
		for (uint32_t p = 0; p < env.npolicies; p++)
			brows[p].r = runs[(size_t)p * reps + median_run(brows[p].tps, reps)];
	}
	if (env.json) {
		json_t *root = json_object(), *arr = json_array();

		for (uint32_t i = 0; i < nrows; i++)
			json_array_append_new(arr, result_json(&rows[i]));
		json_object_set_new(root, "results", arr);
		if (env.simulate) {
			uint64_t ran = 0;

			for (uint32_t i = 0; i < env.ntraces; i++)
				ran += bench_look_tokens(looks[i]);
			/* What the speculative gates cost: tokens the model ran for them. */
			json_object_set_new(root, "speculative_gate_tokens",
					    json_integer((json_int_t)ran));
		}
		json_dumpf(root, stdout, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
		fputc('\n', stdout);
		json_decref(root);
	} else {
		print_table(rows, nrows, stdout);
	}
	if (env.csv && (err = write_csv(rows, nrows)))
		goto out;
	if (env.plot) {
		err = bench_plot(&env, rows, nrows, traces);
		if (err)
			goto out;
		fprintf(env.json ? stderr : stdout,
			"plots: %s/{throughput,hit_rate,heatmap}.{svg,png}\n", env.plot);
	}
out:
	free(runs);
	free(rows);
	for (uint32_t i = 0; i < env.ntraces; i++) {
		bench_look_close(looks[i]);
		bench_sem_close(sems[i]);
		mp_trace_close(traces[i]);
	}
	mp_store_close(store);
	return err ? 1 : 0;
}
