// SPDX-License-Identifier: MIT
/*
 * moepager bench-multi: several model variants under Poisson load (issue
 * 17, Multi-MoE's serving bench). N request streams, one per model, into
 * one FIFO queue; the variants served consolidated against one model at N
 * times the rate (the floor), a MIG-like split (N servers, each with 1/N of
 * the memory and of the file tier's bandwidth) and time-sharing (one model's
 * experts in memory at a time). Every setup runs in this process through
 * the server's backend (the scheduler, the runner, the pager): no HTTP.
 */
#include <argp.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <moepager.h>
#include <moepager/consolidate.h>

#include "cli.h"
#include "serve/backend.h"
#include "text.h"

#define MAX_RATES 8
#define MAX_REPEAT 9
#define MAX_PROMPTS 256
#define PAGE 4096u
#define MAX_MERGE 32
/* Hit buckets of the layer times: 0..k hits of a token's k experts. */
#define HIT_BUCKETS (MP_MAX_TOPK + 1)
#define N_DIAG 8

enum setup {
	S_SINGLE, S_CONSOL, S_MIXED, S_SPLIT, S_TIMESHARE, S_PAGED, S_CONSOL_ONE, N_SETUPS
};

static const char *const setup_names[N_SETUPS] = { "single", "consolidated", "mixed",
						   "split", "timeshare", "paged",
						   "consolidated-one" };

static struct mb_env {
	const char *models[MP_CONSOL_MAX_MODELS];
	uint32_t n;
	const char *map;
	const char *budget;
	const char *tokenizer;
	const char *prompts;
	const char *tmpdir;
	const char *prefetch;
	const char *prefetch_of[N_SETUPS];	/* --prefetch SETUP=POLICY; NULL: prefetch */
	const char *evict;
	const char *merge[MAX_MERGE];
	uint32_t nmerge;
	double rates[MAX_RATES];
	uint32_t nrates;
	bool setups[N_SETUPS];
	uint64_t io_rate;		/* bytes/s of the file tier; 0: no cap */
	uint32_t group_ms;		/* mp_sched_config.group_ns of the swapping setups */
	bool shared_store;		/* serve_local_config.shared_store */
	uint32_t requests;		/* per stream per run */
	uint32_t warmup;		/* requests per model before each run, not measured */
	uint32_t max_tokens;
	uint32_t prompt_tokens;
	uint32_t repeat;
	uint32_t max_batch;
	uint32_t threads;
	uint64_t seed;
	double timeout;
	bool json;
} env;

enum {
	OPT_MAP = 0x100, OPT_BUDGET, OPT_RATES, OPT_REQUESTS, OPT_MAX_TOKENS, OPT_PROMPTS,
	OPT_PROMPT_TOKENS, OPT_TOKENIZER, OPT_IO_RATE, OPT_SETUPS, OPT_REPEAT, OPT_MAX_BATCH,
	OPT_THREADS, OPT_SEED, OPT_TIMEOUT, OPT_TMPDIR, OPT_WARMUP, OPT_JSON, OPT_PREFETCH,
	OPT_MERGE, OPT_EVICT, OPT_GROUP, OPT_SHARED_STORE,
};

static const char doc[] =
	"N request streams, one per model, each Poisson at RATE requests/s, into one FIFO\n"
	"queue, for each RATE of --rates and each setup, --repeat times (setups in turn\n"
	"within a repeat, so drift hits them alike). The expert memory is the same in\n"
	"every setup, --budget of one model's experts (bytes or a percentage):\n"
	"\n"
	"  single        model 0 alone at N x RATE: the floor\n"
	"  consolidated  the N models over MAP (moepager consolidate): the owned\n"
	"                experts in memory, the rest paged under what is left; one\n"
	"                model's dense weights active, swapped when the head needs another\n"
	"  mixed         consolidated with every model's dense weights in use: batches\n"
	"                mix models, no swaps (serve --mixed-batches)\n"
	"  split         N servers, one per model, each with 1/N of the memory and\n"
	"                --io-rate / N (MIG-like); the streams do not share a queue\n"
	"  timeshare     the N models over a map that shares nothing; a switch to\n"
	"                another model evicts every expert (whole models swapped)\n"
	"  paged         consolidated with the owned experts paged under the whole\n"
	"                budget like the rest (serve --owned-paged): one row serves\n"
	"                every model at a shared position, memory follows use\n"
	"  consolidated-one  the consolidated server given the floor's arrivals (every\n"
	"                request of model 0): its memory without a model switch\n"
	"\n"
	"--io-rate caps the file tier's reads (docs/fault-injection.md, read:rate=) at\n"
	"that many bytes/s per server: the split's servers get 1/N each.\n"
	"\n"
	"--prefetch POLICY runs every setup's pager with that prefetcher (its\n"
	"predictions reach each request's own rows: other models' too); the\n"
	"consolidated setups' finemoe keeps a store per model, or one with\n"
	"--shared-store. --prefetch SETUP=POLICY (repeatable) sets one setup's,\n"
	"e.g. --prefetch consolidated=finemoe --prefetch single=none.\n"
	"\n"
	"--group MS: in the swapping setups, the active model's queued requests join\n"
	"ahead of an older head of another model while it has waited under MS ms (one\n"
	"swap serves more requests; the head is served within MS plus one batch).\n"
	"\n"
	"--json prints {models, map, budget_bytes, io_rate, requests, max_tokens, repeat,\n"
	"prefetch, prefetch_setups (the SETUP=POLICY ones, when given),\n"
	"results: [{setup, prefetch, rate, offered_rpm, ttft_s: {p50, p90}, turnaround_s: {p50, p90,\n"
	"mean}, throughput_rpm, saturated, swaps, swap_seconds, switch_wait_seconds,\n"
	"grouped, hit_rate, misses_per_token, bytes_file, layer_ms: {passes, attention,\n"
	"moe_by_hits: [{hits, passes, ms}]},\n"
	"runs: [{..., diag: {prefetch_issued, prefetch_used, prefetch_wasted,\n"
	"prefetch_late, evictions, refaults, predicted, hint_unmapped}}]}],\n"
	"compare: [{rate, consolidated_over_single, paged_over_single, paged_over_split,\n"
	"mixed_over_single, mixed_over_split, consolidated_over_split,\n"
	"consolidated_over_timeshare, consolidated_one_over_single, split_saturated}]}:\n"
	"medians over the repeats; ratios of turnaround p50 medians. saturated:\n"
	"throughput below 90 % of the load the arrivals offered (arrival_rpm: the\n"
	"requests over the time of the last arrival; offered_rpm is the nominal\n"
	"N x RATE). layer_ms: the steps of one token\n"
	"(batch of one) summed over the repeats: ms per layer of attention, and of the\n"
	"MoE part by how many of the token's experts were in memory (Multi-MoE's Table 1).\n"
	"\n"
	"--merge A.json B.json ... prints one JSON of several runs' (other rates or\n"
	"setups of the same models, map and parameters), the ratios taken again: a\n"
	"campaign too long for one sitting, run a rate at a time.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager bench-multi --model a.mpk --model b.mpk --model c.mpk --consolidate m.mpc\n"
	"      --budget 50% --rates 0.5,1,2 --io-rate 8M --json\n"
	"  moepager bench-multi --merge r1.json r2.json > all.json\n";

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0, "A model variant, in the map's order (2 or more)", 0 },
	{ "consolidate", OPT_MAP, "MAP", 0, "The models' consolidation map (required)", 0 },
	{ "budget", OPT_BUDGET, "B", 0, "Expert memory of every setup (default 50%)", 0 },
	{ "rates", OPT_RATES, "R[,R...]", 0, "Requests/s of each model's stream (default "
	  "0.5,1,2)", 0 },
	{ "requests", OPT_REQUESTS, "K", 0, "Requests per stream per run (default 8)", 0 },
	{ "warmup", OPT_WARMUP, "W", 0, "Requests per model, one at a time, before each run "
	  "(not measured; default 2)", 0 },
	{ "max-tokens", OPT_MAX_TOKENS, "T", 0, "Tokens each request generates (default 16)", 0 },
	{ "prompts", OPT_PROMPTS, "FILE", 0, "Prompts, one a line (default: random ids)", 0 },
	{ "prompt-tokens", OPT_PROMPT_TOKENS, "P", 0, "Random prompts' length (default 16)", 0 },
	{ "tokenizer", OPT_TOKENIZER, "FILE", 0, "Tokenizer of --prompts (default: beside "
	  "model 0)", 0 },
	{ "io-rate", OPT_IO_RATE, "BYTES", 0, "File tier bytes/s per server (default: no cap)",
	  0 },
	{ "setups", OPT_SETUPS, "LIST", 0, "Setups to run (default single,consolidated,mixed,"
	  "split,timeshare,paged; consolidated-one only when named)", 0 },
	{ "repeat", OPT_REPEAT, "N", 0, "Runs per setup and rate (default 3)", 0 },
	{ "max-batch", OPT_MAX_BATCH, "B", 0, "Sequences per batch (default 8)", 0 },
	{ "threads", OPT_THREADS, "T", 0, "Engine threads per server (default 1)", 0 },
	{ "seed", OPT_SEED, "S", 0, "Seed of the arrivals and prompts (default 1)", 0 },
	{ "timeout", OPT_TIMEOUT, "SECONDS", 0, "Give up on a run after this (default 300)", 0 },
	{ "tmpdir", OPT_TMPDIR, "DIR", 0, "Where time-sharing's map is written (default /tmp)",
	  0 },
	{ "prefetch", OPT_PREFETCH, "[SETUP=]POLICY", 0, "Prefetch policy of every setup's "
	  "pager (default none), or of one setup (repeatable)", 0 },
	{ "evict", OPT_EVICT, "POLICY", 0, "Eviction policy of every setup's pager (default: "
	  "the prefetch policy's, else lru)", 0 },
	{ "group", OPT_GROUP, "MS", 0, "Let the active model's requests pass an older head of "
	  "another model for up to MS ms (default 0: FIFO)", 0 },
	{ "shared-store", OPT_SHARED_STORE, NULL, 0, "With --prefetch: one trajectory store "
	  "for every model of a setup, not one per model", 0 },
	{ "merge", OPT_MERGE, NULL, 0, "Merge the --json outputs given as arguments", 0 },
	{ "json", OPT_JSON, NULL, 0, "Print one JSON object", 0 },
	{ 0 },
};

static int parse_rates(const char *s)
{
	char *copy = strdup(s), *save = NULL;
	int err = copy ? 0 : -ENOMEM;

	env.nrates = 0;
	for (char *t = strtok_r(copy, ",", &save); t && !err; t = strtok_r(NULL, ",", &save)) {
		if (env.nrates == MAX_RATES)
			err = -EINVAL;
		else
			err = cli_parse_double("--rates", t, 1e-3, 1e4, &env.rates[env.nrates++]);
	}
	free(copy);
	return err ? err : env.nrates ? 0 : -EINVAL;
}

/* For the parsers' errors: setup_names, as a user types them. */
#define SETUP_LIST "single, consolidated, mixed, split, timeshare, paged, consolidated-one"

/* The setup named by the len bytes at name, or N_SETUPS. */
static int setup_index(const char *name, size_t len)
{
	int i = 0;

	while (i < N_SETUPS && (len != strlen(setup_names[i]) ||
				strncmp(name, setup_names[i], len)))
		i++;
	return i;
}

static int parse_setups(const char *s)
{
	char *copy = strdup(s), *save = NULL;
	int err = copy ? 0 : -ENOMEM, n = 0;

	memset(env.setups, 0, sizeof(env.setups));
	for (char *t = strtok_r(copy, ",", &save); t && !err; t = strtok_r(NULL, ",", &save)) {
		int i = setup_index(t, strlen(t));

		if (i == N_SETUPS)
			err = -EINVAL;
		else
			env.setups[i] = true, n++;
	}
	free(copy);
	return err ? err : n ? 0 : -EINVAL;
}

/* --prefetch POLICY (every setup's) or SETUP=POLICY (that setup's). Returns 0 or -EINVAL. */
static int parse_prefetch(char *arg)
{
	char *eq = strchr(arg, '=');
	int i;

	if (!eq) {
		env.prefetch = arg;
		return 0;
	}
	i = setup_index(arg, (size_t)(eq - arg));
	if (i == N_SETUPS || !eq[1])
		return -EINVAL;
	env.prefetch_of[i] = eq + 1;
	return 0;
}

/* Setup s's prefetch policy (NULL: none). */
static const char *prefetch_of(enum setup s)
{
	return env.prefetch_of[s] ? env.prefetch_of[s] : env.prefetch;
}

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'm':
		if (env.n == MP_CONSOL_MAX_MODELS)
			argp_error(state, "at most %u models", MP_CONSOL_MAX_MODELS);
		env.models[env.n++] = arg;
		break;
	case OPT_MAP: env.map = arg; break;
	case OPT_BUDGET: env.budget = arg; break;
	case OPT_RATES:
		if (parse_rates(arg))
			argp_error(state, "--rates wants up to %u rates in [0.001, 10000] requests/s",
				   MAX_RATES);
		break;
	case OPT_REQUESTS:
		cli_opt_u32(state, "--requests", arg, 1, 4096, &env.requests);
		break;
	case OPT_MAX_TOKENS:
		cli_opt_u32(state, "--max-tokens", arg, 1, 4096, &env.max_tokens);
		break;
	case OPT_WARMUP:
		cli_opt_u32(state, "--warmup", arg, 0, 64, &env.warmup);
		break;
	case OPT_PROMPTS: env.prompts = arg; break;
	case OPT_PROMPT_TOKENS:
		cli_opt_u32(state, "--prompt-tokens", arg, 1, 4096, &env.prompt_tokens);
		break;
	case OPT_TOKENIZER: env.tokenizer = arg; break;
	case OPT_IO_RATE:
		cli_opt_size(state, "--io-rate", arg, &env.io_rate);
		if (!env.io_rate)
			argp_error(state, "--io-rate wants bytes per second above 0 (e.g. 8M)");
		break;
	case OPT_SETUPS:
		if (parse_setups(arg))
			argp_error(state, "--setups wants a list of " SETUP_LIST);
		break;
	case OPT_REPEAT:
		cli_opt_u32(state, "--repeat", arg, 1, MAX_REPEAT, &env.repeat);
		break;
	case OPT_MAX_BATCH:
		cli_opt_u32(state, "--max-batch", arg, 1, 256, &env.max_batch);
		break;
	case OPT_THREADS:
		cli_opt_u32(state, "--threads", arg, 1, 256, &env.threads);
		break;
	case OPT_SEED:
		cli_opt_u64(state, "--seed", arg, 0, UINT64_MAX, &env.seed);
		break;
	case OPT_TIMEOUT:
		cli_opt_double(state, "--timeout", arg, 1, 86400, &env.timeout);
		break;
	case OPT_TMPDIR: env.tmpdir = arg; break;
	case OPT_PREFETCH:
		if (parse_prefetch(arg))
			argp_error(state, "--prefetch wants POLICY or SETUP=POLICY, SETUP one of "
				   SETUP_LIST);
		break;
	case OPT_EVICT: env.evict = arg; break;
	case OPT_SHARED_STORE: env.shared_store = true; break;
	case OPT_GROUP:
		cli_opt_u32(state, "--group", arg, 0, 600000, &env.group_ms);
		break;
	case OPT_MERGE: env.nmerge = 1; break;
	case OPT_JSON: env.json = true; break;
	case ARGP_KEY_ARG:
		if (!env.nmerge || env.nmerge > MAX_MERGE)
			argp_error(state, "unexpected argument '%s'%s", arg, env.nmerge ?
				   ": at most 32 files to merge" : "");
		env.merge[env.nmerge++ - 1] = arg;
		break;
	case ARGP_KEY_END:
		if (env.nmerge == 1)
			argp_error(state, "--merge wants the JSON files to merge");
		if (env.nmerge)
			break;
		if (env.n < 2)
			argp_error(state, "give at least two --model FILE, in the map's order");
		if (!env.map)
			argp_error(state, "--consolidate MAP is required");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

static const struct argp argp = { opts, parse_arg, NULL, doc, NULL, NULL, NULL };

/*
 * One run: the arrivals, what each request took
 */

struct req {
	double at;			/* arrival, seconds from the run's start */
	uint32_t model;
	uint32_t prompt;		/* index into the prompts */
	double ttft, total;		/* from its submission (mp_sched_timing) */
	int state;			/* 0 waiting, 1 done, -1 failed or refused */
	struct run *run;
};

struct run {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint32_t pending;
};

struct prompts {
	uint32_t *ids[MAX_PROMPTS];
	uint32_t len[MAX_PROMPTS];
	uint32_t n;
};

/* What one setup gave at one rate in one run. */
struct outcome {
	double ttft_p50, ttft_p90, turn_p50, turn_p90, turn_mean, rpm, wall;
	double arrival_rpm;		/* the load these arrivals offered: n over the last one */
	uint32_t completed, failed;
	uint64_t swaps, grouped, hits, misses, bytes_file;
	uint64_t tokens;		/* run through the model: prompts' and generated */
	double swap_seconds, switch_wait_seconds;
	struct mp_runner_layer_times lt;	/* summed over the setup's servers */
	uint64_t diag[N_DIAG];			/* diag_names[]: the prefetcher's and eviction's */
};

/* What the prefetcher and the eviction did (docs/multi.md, "Why the learning prefetchers"). */
static const char *const diag_names[N_DIAG] = {
	"prefetch_issued", "prefetch_used", "prefetch_wasted", "prefetch_late",
	"evictions", "refaults", "predicted", "hint_unmapped",
};

static void diag_of(const struct serve_local_stats *st, uint64_t *v)
{
	const uint64_t x[N_DIAG] = {
		st->pager.prefetch_issued, st->pager.prefetch_used, st->pager.prefetch_wasted,
		st->pager.prefetch_late, st->pager.evictions, st->pager.refaults,
		st->prefetch.predicted, st->prefetch.hint_unmapped,
	};

	memcpy(v, x, sizeof(x));
}

static void req_done(void *arg, enum mp_sched_finish why, int err,
		     const struct mp_sched_timing *t)
{
	struct req *q = arg;
	struct run *r = q->run;

	pthread_mutex_lock(&r->lock);
	q->ttft = t ? t->first_token : 0;
	q->total = t ? t->total : 0;
	q->state = !err && (why == MP_FINISH_LENGTH || why == MP_FINISH_STOP) ? 1 : -1;
	if (!--r->pending)
		pthread_cond_broadcast(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

static int by_arrival(const void *a, const void *b)
{
	const struct req *x = a, *y = b;

	return x->at < y->at ? -1 : x->at > y->at;
}

/*
 * The arrivals: N Poisson streams of `rate`, model i's stream of model i,
 * merged in time order; for the floor, the same requests all of model 0
 * (the merged streams are one Poisson stream at N x rate). The same seed
 * gives every setup the same times and prompts.
 */
static uint32_t make_arrivals(struct req *reqs, double rate, bool single, uint64_t seed,
			      uint32_t nprompts)
{
	uint32_t n = 0;

	for (uint32_t s = 0; s < env.n; s++) {
		uint64_t st = seed * 1000003u + s + 1;
		double t = 0;

		for (uint32_t k = 0; k < env.requests; k++) {
			t += -log(cli_rand_unit(&st)) / rate;
			reqs[n] = (struct req){ .at = t, .model = single ? 0 : s,
						.prompt = (uint32_t)(cli_rand_unit(&st) * nprompts) %
							  nprompts };
			n++;
		}
	}
	qsort(reqs, n, sizeof(*reqs), by_arrival);
	return n;
}

static void sleep_until(uint64_t ns)
{
	uint64_t now = cli_now_ns();

	if (ns > now) {
		struct timespec ts = { .tv_sec = (time_t)((ns - now) / 1000000000ull),
				       .tv_nsec = (long)((ns - now) % 1000000000ull) };

		nanosleep(&ts, NULL);
	}
}

/* The backends of one setup, and which backend and model serve model i's stream. */
struct servers {
	struct serve_backend *b[MP_CONSOL_MAX_MODELS];
	uint32_t nb;
	const struct serve_model *m[MP_CONSOL_MAX_MODELS];	/* acquired, per model */
	struct serve_backend *of[MP_CONSOL_MAX_MODELS];
	struct outcome warm;		/* the counters' negated values after the warm-up */
};

static double quantile_of(struct req *reqs, uint32_t n, bool ttft, double q)
{
	double *v = malloc(sizeof(*v) * (n ? n : 1)), x;
	uint32_t k = 0;

	if (!v)
		return NAN;
	for (uint32_t i = 0; i < n; i++)
		if (reqs[i].state == 1)
			v[k++] = ttft ? reqs[i].ttft : reqs[i].total;
	x = k ? (q < 0 ? 0 : cli_quantile(v, k, q)) : NAN;
	if (k && q < 0) {
		for (uint32_t i = 0; i < k; i++)
			x += v[i] / k;
	}
	free(v);
	return x;
}

static int drive(struct servers *sv, struct req *reqs, uint32_t n, const struct prompts *pr,
		 struct outcome *o)
{
	struct run r = { .pending = n };
	struct mp_sched_params p = { .max_tokens = env.max_tokens, .no_eos = true };
	uint64_t t0 = cli_now_ns(), deadline;
	double last = 0;
	int err = 0;

	pthread_mutex_init(&r.lock, NULL);
	pthread_cond_init(&r.cond, NULL);
	for (uint32_t i = 0; i < n; i++) {
		struct mp_sched_callbacks cb = { .done = req_done, .arg = &reqs[i] };
		struct serve_backend *b = sv->of[reqs[i].model];
		uint64_t id;

		reqs[i].run = &r;
		sleep_until(t0 + (uint64_t)(reqs[i].at * 1e9));
		p.seed = i;
		err = b->ops->submit(b, sv->m[reqs[i].model], pr->ids[reqs[i].prompt],
				     pr->len[reqs[i].prompt], &p, &cb, &id);
		if (err) {
			/* Refused (a full queue): counted as failed, the run goes on. */
			pthread_mutex_lock(&r.lock);
			reqs[i].state = -1;
			r.pending--;
			pthread_mutex_unlock(&r.lock);
			err = 0;
		}
	}
	deadline = t0 + (uint64_t)(env.timeout * 1e9);
	pthread_mutex_lock(&r.lock);
	while (r.pending) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&r.cond, &r.lock, &ts);
		if (cli_now_ns() > deadline)
			break;
	}
	pthread_mutex_unlock(&r.lock);
	if (r.pending) {
		cli_say("%u requests still running after %.0f s; "
			"stopping the run", r.pending, env.timeout);
		for (uint32_t i = 0; i < sv->nb; i++)
			sv->b[i]->ops->stop(sv->b[i]);
		pthread_mutex_lock(&r.lock);
		while (r.pending)
			pthread_cond_wait(&r.cond, &r.lock);
		pthread_mutex_unlock(&r.lock);
		err = -ETIMEDOUT;
	}
	memset(o, 0, sizeof(*o));
	for (uint32_t i = 0; i < n; i++) {
		if (reqs[i].state == 1) {
			o->completed++;
			last = fmax(last, reqs[i].at + reqs[i].total);
		} else {
			o->failed++;
		}
	}
	o->wall = last;
	o->rpm = last > 0 ? o->completed / last * 60 : 0;
	o->arrival_rpm = n && reqs[n - 1].at > 0 ? n / reqs[n - 1].at * 60 : 0;
	o->ttft_p50 = quantile_of(reqs, n, true, 0.5);
	o->ttft_p90 = quantile_of(reqs, n, true, 0.9);
	o->turn_p50 = quantile_of(reqs, n, false, 0.5);
	o->turn_p90 = quantile_of(reqs, n, false, 0.9);
	o->turn_mean = quantile_of(reqs, n, false, -1);
	pthread_cond_destroy(&r.cond);
	pthread_mutex_destroy(&r.lock);
	return err;
}

/*
 * Setups
 */

struct plan {
	uint32_t topk;
	uint64_t budget;		/* expert memory of every setup */
	uint64_t owned;			/* the map's owned experts' memory */
	char share0[4200];		/* time-sharing's map: nothing shared */
	char dir[4096];
};

/* Setups that keep the owned experts outside the budget: consolidated(-one), mixed. */
static bool holds_owned(enum setup s)
{
	return s == S_CONSOL || s == S_CONSOL_ONE || s == S_MIXED;
}

/* Memory held outside the pager's budget. */
static uint64_t owned_outside(enum setup s, const struct plan *pl)
{
	return holds_owned(s) ? pl->owned : 0;
}

static void close_servers(struct servers *sv)
{
	for (uint32_t i = 0; i < env.n; i++)
		if (sv->m[i] && sv->of[i])
			sv->of[i]->ops->release(sv->of[i], sv->m[i]);
	for (uint32_t i = 0; i < sv->nb; i++)
		sv->b[i]->ops->close(sv->b[i]);
	memset(sv, 0, sizeof(*sv));
}

static int open_setup(enum setup s, const struct plan *pl, struct servers *sv)
{
	char budget[32], fault[64];
	struct serve_local_config c = {
		.model = env.models[0], .tokenizer = env.tokenizer, .budget = budget,
		.threads = env.threads, .prefetch = prefetch_of(s), .evict = env.evict,
		.sched = { .max_batch = env.max_batch, .max_queue = 4096,
			   .group_ns = (uint64_t)env.group_ms * 1000000 },
		.shared_store = env.shared_store,
		.layer_times = true,
	};
	uint32_t nb = s == S_SPLIT ? env.n : 1;
	uint64_t io = s == S_SPLIT ? env.io_rate / env.n : env.io_rate;
	int err = 0;

	memset(sv, 0, sizeof(*sv));
	snprintf(fault, sizeof(fault), "read:rate=%llu", (unsigned long long)(io ? io : 1));
	c.fault = env.io_rate ? fault : "";
	snprintf(budget, sizeof(budget), "%llu", (unsigned long long)(
		s == S_SPLIT ? pl->budget / env.n : pl->budget - owned_outside(s, pl)));
	if (holds_owned(s) || s == S_TIMESHARE || s == S_PAGED) {
		c.consolidate = s == S_TIMESHARE ? pl->share0 : env.map;
		c.mixed = s == S_MIXED;
		c.timeshare = s == S_TIMESHARE;
		c.owned_paged = s == S_PAGED;
		for (uint32_t i = 1; i < env.n; i++)
			c.more[i - 1] = env.models[i];
		c.n_more = env.n - 1;
	}
	for (uint32_t i = 0; i < nb && !err; i++) {
		if (s == S_SPLIT)
			c.model = env.models[i];
		err = serve_local_open(&c, &sv->b[i]);
		if (!err)
			sv->nb++;
	}
	for (uint32_t i = 0; i < env.n && !err; i++) {
		struct serve_backend *b = sv->b[nb == 1 ? 0 : i];
		/* The floor serves model 0 alone: every stream's requests are its. */
		char *name = nb == 1 && i && s != S_SINGLE ? serve_model_name(env.models[i])
							     : NULL;

		sv->of[i] = b;
		sv->m[i] = b->ops->acquire(b, name);
		if (!sv->m[i])
			err = -ENOENT;
		free(name);
	}
	if (err)
		close_servers(sv);
	return err;
}

/* Counters the measured run adds to: what the warm-up did is taken off. */
static void collect(struct servers *sv, struct outcome *o, int sign)
{
	for (uint32_t i = 0; i < sv->nb; i++) {
		struct serve_local_stats st;
		uint64_t d[N_DIAG];

		serve_local_stats(sv->b[i], &st);
		diag_of(&st, d);
		for (size_t j = 0; j < N_DIAG; j++)
			o->diag[j] += (uint64_t)sign * d[j];
		o->swaps += (uint64_t)sign * st.sched.swaps;
		o->grouped += (uint64_t)sign * st.sched.grouped;
		o->swap_seconds += sign * st.sched.swap_seconds;
		o->switch_wait_seconds += sign * st.sched.switch_wait_seconds;
		o->tokens += (uint64_t)sign * (st.sched.tokens + st.sched.prompt_tokens);
		/* Per routed expert of a token, as the pager counts: owned ones are hits. */
		o->hits += (uint64_t)sign * (st.pager.hits + st.multi.owned_routes);
		o->misses += (uint64_t)sign * st.pager.misses;
		o->bytes_file += (uint64_t)sign * st.pager.bytes_file;
		o->lt.attn_passes += (uint64_t)sign * st.layers.attn_passes;
		o->lt.attn_ns += (uint64_t)sign * st.layers.attn_ns;
		for (uint32_t h = 0; h < HIT_BUCKETS; h++) {
			o->lt.moe_passes[h] += (uint64_t)sign * st.layers.moe_passes[h];
			o->lt.moe_ns[h] += (uint64_t)sign * st.layers.moe_ns[h];
		}
	}
}

/* o's counters plus w's (the warm-up's, negated). */
static void add_counters(struct outcome *o, const struct outcome *w)
{
	o->swaps += w->swaps;
	o->grouped += w->grouped;
	o->swap_seconds += w->swap_seconds;
	o->switch_wait_seconds += w->switch_wait_seconds;
	o->tokens += w->tokens;
	o->hits += w->hits;
	o->misses += w->misses;
	o->bytes_file += w->bytes_file;
	for (size_t j = 0; j < N_DIAG; j++)
		o->diag[j] += w->diag[j];
	o->lt.attn_passes += w->lt.attn_passes;
	o->lt.attn_ns += w->lt.attn_ns;
	for (uint32_t h = 0; h < HIT_BUCKETS; h++) {
		o->lt.moe_passes[h] += w->lt.moe_passes[h];
		o->lt.moe_ns[h] += w->lt.moe_ns[h];
	}
}

/*
 * Each model's requests, one at a time, so every setup starts measured
 * with its memory holding what its steady state would (the owned experts
 * of the consolidated setup are read at open, outside the I/O cap).
 */
static int warm_up(struct servers *sv, const struct prompts *pr)
{
	struct req reqs[1];
	struct outcome o;
	int err = 0;

	for (uint32_t w = 0; w < env.warmup && !err; w++) {
		for (uint32_t i = 0; i < env.n && !err; i++) {
			reqs[0] = (struct req){ .model = i, .prompt = (w * env.n + i) % pr->n };
			err = drive(sv, reqs, 1, pr, &o);
			if (!err && o.failed)
				err = -EIO;
		}
	}
	if (err)
		cli_error(0, "the warm-up failed");
	memset(&sv->warm, 0, sizeof(sv->warm));
	collect(sv, &sv->warm, -1);
	return err;
}

static int run_one(enum setup s, const struct plan *pl, double rate, uint32_t rep,
		   const struct prompts *pr, struct outcome *o)
{
	struct req *reqs = calloc((size_t)env.n * env.requests, sizeof(*reqs));
	struct servers sv;
	uint32_t n;
	int err;

	if (!reqs)
		return -ENOMEM;
	n = make_arrivals(reqs, rate, s == S_SINGLE || s == S_CONSOL_ONE, env.seed + rep, pr->n);
	err = open_setup(s, pl, &sv);
	if (err) {
		cli_fail(err, "%s: cannot open", setup_names[s]);
		free(reqs);
		return err;
	}
	err = warm_up(&sv, pr);
	if (!err)
		err = drive(&sv, reqs, n, pr, o);
	collect(&sv, o, 1);
	add_counters(o, &sv.warm);
	close_servers(&sv);
	free(reqs);
	if (!env.json)
		fprintf(stderr, "%-12s rate %.3g/s run %u: %u done, %u failed, turnaround p50 "
			"%.3f s, TTFT p50 %.3f s, %.1f rpm, %llu swaps\n", setup_names[s], rate,
			rep + 1, o->completed, o->failed, o->turn_p50, o->ttft_p50, o->rpm,
			(unsigned long long)o->swaps);
	return err;
}

/* The memory of every setup, and time-sharing's nothing-shared map. */
static int make_plan(struct plan *pl)
{
	struct mp_store *st[MP_CONSOL_MAX_MODELS] = { 0 };
	struct mp_consolidation *map = NULL, *none = NULL;
	uint64_t stride, all;
	bool held = false;
	int err = 0;

	memset(pl, 0, sizeof(*pl));
	for (uint32_t i = 0; i < env.n && !err; i++)
		err = mp_store_open(env.models[i], &st[i]);
	if (!err)
		err = mp_consolidation_open(env.map, &map);
	if (!err)
		err = mp_consolidation_check(map, st, env.n);
	if (err)
		goto out;
	stride = (mp_store_expert_bytes(st[0]) + PAGE - 1) / PAGE * PAGE;
	all = (uint64_t)mp_store_geometry(st[0])->layers * mp_store_geometry(st[0])->experts *
	      mp_store_expert_bytes(st[0]);
	err = mp_budget_parse(env.budget, all, &pl->budget);
	if (err)
		goto out;
	pl->owned = mp_consolidation_capacity(map) * stride;
	pl->topk = mp_store_geometry(st[0])->topk;
	for (int s = 0; s < N_SETUPS; s++)
		held |= env.setups[s] && holds_owned((enum setup)s);
	if (pl->budget < stride || (held && pl->budget < pl->owned + stride) ||
	    (env.setups[S_SPLIT] && pl->budget / env.n < stride)) {
		err = cli_error(-EINVAL, "--budget %s (%llu bytes) must hold the map's %u owned "
				"experts and one more (consolidated, mixed), and one expert per "
				"split server", env.budget, (unsigned long long)pl->budget,
				mp_consolidation_capacity(map));
		goto out;
	}
	if (env.setups[S_TIMESHARE]) {
		snprintf(pl->dir, sizeof(pl->dir), "%s/moepager-bench-multi-XXXXXX",
			 env.tmpdir ? env.tmpdir : "/tmp");
		if (!mkdtemp(pl->dir)) {
			err = -errno;
			cli_error(0, "cannot make a directory in %s: %s",
				env.tmpdir ? env.tmpdir : "/tmp", strerror(errno));
			pl->dir[0] = 0;
			goto out;
		}
		snprintf(pl->share0, sizeof(pl->share0), "%s/share0.mpc", pl->dir);
		err = mp_consolidation_build(st, env.n, 0, NULL, NULL, &none);
		if (!err)
			err = mp_consolidation_write(none, pl->share0);
	}
out:
	if (err && err != -EINVAL)
		cli_fail(err, NULL);
	mp_consolidation_close(none);
	mp_consolidation_close(map);
	for (uint32_t i = 0; i < env.n; i++)
		mp_store_close(st[i]);
	return err;
}

static void drop_plan(struct plan *pl)
{
	if (pl->share0[0])
		unlink(pl->share0);
	if (pl->dir[0])
		rmdir(pl->dir);
}

/* The prompts: the file's lines tokenized, else random ids (the same for every setup). */
static int load_prompts(struct prompts *pr)
{
	struct mp_tokenizer *tok = NULL;
	struct mp_store *st = NULL;
	char line[4096];
	FILE *f = NULL;
	int err;

	memset(pr, 0, sizeof(*pr));
	err = mp_store_open(env.models[0], &st);
	if (err) {
		cli_fail(err, NULL);
		return err;
	}
	if (!env.prompts) {
		uint64_t s = env.seed + 77;

		for (pr->n = 0; pr->n < 16; pr->n++) {
			pr->ids[pr->n] = malloc(sizeof(uint32_t) * env.prompt_tokens);
			if (!pr->ids[pr->n]) {
				err = -ENOMEM;
				break;
			}
			pr->len[pr->n] = env.prompt_tokens;
			for (uint32_t j = 0; j < env.prompt_tokens; j++)
				pr->ids[pr->n][j] = (uint32_t)(cli_rand_unit(&s) *
						     mp_store_geometry(st)->vocab) %
						    mp_store_geometry(st)->vocab;
		}
		goto out;
	}
	err = text_tokenizer_open(env.tokenizer, env.models[0], mp_store_geometry(st)->vocab,
				  &tok);
	if (!err && !tok)
		err = cli_error(-EINVAL, "--prompts needs a tokenizer (--tokenizer, or "
				"MODEL.tok beside model 0)");
	f = err ? NULL : fopen(env.prompts, "r");
	if (!err && !f) {
		err = -errno;
		cli_error(0, "%s: %s", env.prompts, strerror(errno));
	}
	while (!err && pr->n < MAX_PROMPTS && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		if (!line[0])
			continue;
		err = text_encode_prompt(tok, line, &pr->ids[pr->n], &pr->len[pr->n]);
		if (!err && pr->len[pr->n] + env.max_tokens > mp_store_geometry(st)->max_seq)
			pr->len[pr->n] = mp_store_geometry(st)->max_seq > env.max_tokens ?
					 mp_store_geometry(st)->max_seq - env.max_tokens : 1;
		pr->n += !err;
	}
	if (!err && !pr->n)
		err = cli_error(-EINVAL, "%s holds no prompt", env.prompts);
out:
	if (f)
		fclose(f);
	mp_tokenizer_close(tok);
	mp_store_close(st);
	return err;
}

/*
 * Report
 */

static double med(struct outcome *o, uint32_t n, size_t off)
{
	double v[MAX_REPEAT];

	for (uint32_t i = 0; i < n; i++)
		v[i] = *(const double *)((const char *)&o[i] + off);
	return cli_median(v, n);
}

#define MED(o, n, field) med(o, n, offsetof(struct outcome, field))

static json_t *diag_json(const struct outcome *o)
{
	json_t *j = json_object();

	for (size_t i = 0; i < N_DIAG; i++)
		json_object_set_new(j, diag_names[i], json_integer((json_int_t)o->diag[i]));
	return j;
}

static json_t *run_json(const struct outcome *o)
{
	return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:i, s:I, s:f, s:f, s:I, "
			 "s:I, s:I, s:I, s:I, s:o}",
			 "ttft_p50", o->ttft_p50, "ttft_p90", o->ttft_p90, "turnaround_p50",
			 o->turn_p50, "turnaround_p90", o->turn_p90, "turnaround_mean",
			 o->turn_mean, "throughput_rpm", o->rpm, "arrival_rpm", o->arrival_rpm,
			 "wall_s", o->wall, "completed",
			 (int)o->completed, "failed", (int)o->failed, "swaps",
			 (json_int_t)o->swaps, "swap_seconds", o->swap_seconds,
			 "switch_wait_seconds", o->switch_wait_seconds, "grouped",
			 (json_int_t)o->grouped, "hits",
			 (json_int_t)o->hits, "misses", (json_int_t)o->misses, "tokens",
			 (json_int_t)o->tokens, "bytes_file",
			 (json_int_t)o->bytes_file, "diag", diag_json(o));
}

/* Multi-MoE's Table 1: ms per layer of one-token steps, attention and the MoE part by hits. */
static json_t *layers_json(const struct outcome *o, uint32_t n, uint32_t topk)
{
	struct mp_runner_layer_times t = { 0 };
	json_t *by = json_array();

	for (uint32_t i = 0; i < n; i++) {
		t.attn_passes += o[i].lt.attn_passes;
		t.attn_ns += o[i].lt.attn_ns;
		for (uint32_t h = 0; h <= topk; h++) {
			t.moe_passes[h] += o[i].lt.moe_passes[h];
			t.moe_ns[h] += o[i].lt.moe_ns[h];
		}
	}
	for (uint32_t h = 0; h <= topk; h++)
		json_array_append_new(by, json_pack("{s:i, s:I, s:o}", "hits", (int)h, "passes",
						    (json_int_t)t.moe_passes[h], "ms",
						    t.moe_passes[h] ? json_real((double)t.moe_ns[h] / 1e6 /
									(double)t.moe_passes[h]) :
								      json_null()));
	return json_pack("{s:I, s:o, s:o}", "passes", (json_int_t)t.attn_passes, "attention",
			 t.attn_passes ? json_real((double)t.attn_ns / 1e6 / (double)t.attn_passes) :
					 json_null(), "moe_by_hits", by);
}

static json_t *row_json(enum setup s, double rate, struct outcome *o, uint32_t n,
			const struct plan *pl)
{
	json_t *runs = json_array();
	double offered = rate * env.n * 60, rpm = MED(o, n, rpm);
	double arrived = MED(o, n, arrival_rpm);
	double hits = 0, uses = 0, misses = 0, tokens = 0;
	double swaps[MAX_REPEAT], grouped[MAX_REPEAT], bytes[MAX_REPEAT];

	for (uint32_t i = 0; i < n; i++) {
		json_array_append_new(runs, run_json(&o[i]));
		hits += (double)o[i].hits;
		uses += (double)(o[i].hits + o[i].misses);
		misses += (double)o[i].misses;
		tokens += (double)o[i].tokens;
		swaps[i] = (double)o[i].swaps;
		grouped[i] = (double)o[i].grouped;
		bytes[i] = (double)o[i].bytes_file;
	}
	return json_pack("{s:s, s:s?, s:f, s:f, s:f, s:{s:f, s:f}, s:{s:f, s:f, s:f}, s:f, s:b, "
			 "s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:o, s:o, s:I}",
			 "setup", setup_names[s], "prefetch", prefetch_of(s), "rate", rate,
			 "offered_rpm", offered,
			 "arrival_rpm", arrived,
			 "ttft_s", "p50", MED(o, n, ttft_p50), "p90", MED(o, n, ttft_p90),
			 "turnaround_s", "p50", MED(o, n, turn_p50), "p90", MED(o, n, turn_p90),
			 "mean", MED(o, n, turn_mean), "throughput_rpm", rpm, "saturated",
			 rpm < 0.9 * arrived, "swaps", cli_median(swaps, n), "swap_seconds",
			 MED(o, n, swap_seconds), "switch_wait_seconds",
			 MED(o, n, switch_wait_seconds), "grouped", cli_median(grouped, n),
			 "hit_rate", uses > 0 ? hits / uses : 0.0,
			 /* Experts read from the file tier per token the model ran. */
			 "misses_per_token", tokens > 0 ? misses / tokens : 0.0,
			 "bytes_file", cli_median(bytes, n), "layer_ms",
			 layers_json(o, n, pl->topk), "runs", runs, "owned_bytes",
			 (json_int_t)owned_outside(s, pl));
}

static json_t *ratio(double a, double b)
{
	return isfinite(a) && isfinite(b) && b > 0 ? json_real(a / b) : json_null();
}

/* The row of (setup, rate) in results, or NULL. */
static json_t *find_row(json_t *results, const char *setup, double rate)
{
	size_t i;
	json_t *r;

	json_array_foreach(results, i, r)
		if (!strcmp(json_string_value(json_object_get(r, "setup")) ?: "", setup) &&
		    json_number_value(json_object_get(r, "rate")) == rate)
			return r;
	return NULL;
}

/* Per rate (in the order the rows have them), the ratios of the turnaround p50 medians. */
static json_t *compare_json(json_t *results)
{
	json_t *compare = json_array(), *r;
	double seen[MAX_RATES * MAX_MERGE];
	uint32_t nseen = 0;
	size_t i;

	json_array_foreach(results, i, r) {
		double rate = json_number_value(json_object_get(r, "rate")), t[N_SETUPS];
		json_t *split;
		uint32_t k = 0;

		while (k < nseen && seen[k] != rate)
			k++;
		if (k < nseen || nseen == MAX_RATES * MAX_MERGE)
			continue;
		seen[nseen++] = rate;
		for (int s = 0; s < N_SETUPS; s++) {
			json_t *row = find_row(results, setup_names[s], rate);

			t[s] = row ? json_number_value(json_object_get(
					     json_object_get(row, "turnaround_s"), "p50")) : NAN;
		}
		split = find_row(results, setup_names[S_SPLIT], rate);
		json_array_append_new(compare, json_pack(
			"{s:f, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "rate", rate,
			"consolidated_over_single", ratio(t[S_CONSOL], t[S_SINGLE]),
			"paged_over_single", ratio(t[S_PAGED], t[S_SINGLE]),
			"paged_over_split", ratio(t[S_PAGED], t[S_SPLIT]),
			"mixed_over_single", ratio(t[S_MIXED], t[S_SINGLE]),
			"mixed_over_split", ratio(t[S_MIXED], t[S_SPLIT]),
			"consolidated_over_split", ratio(t[S_CONSOL], t[S_SPLIT]),
			"consolidated_over_timeshare", ratio(t[S_CONSOL], t[S_TIMESHARE]),
			"consolidated_one_over_single", ratio(t[S_CONSOL_ONE], t[S_SINGLE]),
			"split_saturated", split ? json_incref(json_object_get(split, "saturated")) :
						   json_null()));
	}
	return compare;
}

static void print_compare(json_t *compare)
{
	for (size_t i = 0; i < json_array_size(compare); i++) {
		json_t *c = json_array_get(compare, i);

		printf("rate %.3g/s per model: turnaround p50 consolidated/single %.3f, "
		       "paged/single %.3f, mixed/single %.3f, consolidated/split %.3f, "
		       "/timeshare %.3f\n",
		       json_real_value(json_object_get(c, "rate")),
		       json_number_value(json_object_get(c, "consolidated_over_single")),
		       json_number_value(json_object_get(c, "paged_over_single")),
		       json_number_value(json_object_get(c, "mixed_over_single")),
		       json_number_value(json_object_get(c, "consolidated_over_split")),
		       json_number_value(json_object_get(c, "consolidated_over_timeshare")));
	}
}

/* The parameters two runs to merge must share. */
static const char *const same_keys[] = { "models", "map", "budget_bytes", "owned_bytes",
					 "io_rate", "requests", "max_tokens", "max_batch",
					 "prefetch", "prefetch_setups", "evict", "group_ms",
					 "shared_store" };

/* --merge: one object of several runs' rows, the ratios taken again. */
static int merge(void)
{
	json_t *root = NULL, *results = json_array();
	int err = 0;

	for (uint32_t f = 0; f < env.nmerge - 1 && !err; f++) {
		json_error_t je;
		json_t *d = json_load_file(env.merge[f], 0, &je), *rows;
		size_t i;
		json_t *r;

		rows = d ? json_object_get(d, "results") : NULL;
		if (!json_is_array(rows))
			err = cli_error(-EINVAL, "%s: %s", env.merge[f],
					d ? "no results array: not a bench-multi --json output" :
					    je.text);
		for (size_t k = 0; !err && root && k < sizeof(same_keys) / sizeof(*same_keys); k++) {
			json_t *a = json_object_get(root, same_keys[k]);
			json_t *b = json_object_get(d, same_keys[k]);

			if ((!a && !b) || json_equal(a, b))
				continue;
			err = cli_error(-EINVAL, "%s: another %s than %s's: these runs "
					"do not compare", env.merge[f], same_keys[k], env.merge[0]);
		}
		json_array_foreach(rows, i, r) {
			if (err)
				break;
			if (!find_row(results, json_string_value(json_object_get(r, "setup")) ?: "",
				      json_number_value(json_object_get(r, "rate"))))
				continue;
			err = cli_error(-EINVAL, "%s: %s at rate %g is in an earlier "
					"file too", env.merge[f],
					json_string_value(json_object_get(r, "setup")),
					json_number_value(json_object_get(r, "rate")));
		}
		if (!err)
			json_array_extend(results, rows);
		if (!err && !root)
			root = json_incref(d);
		json_decref(d);
	}
	if (!err) {
		json_object_set(root, "results", results);
		json_object_set_new(root, "compare", compare_json(results));
		json_object_set_new(root, "merged", json_integer(env.nmerge - 1));
		json_dumpf(root, stdout, JSON_INDENT(1));
		putchar('\n');
	}
	json_decref(results);
	json_decref(root);
	return err ? 1 : 0;
}

int cmd_multibench(int argc, char **argv)
{
	static struct outcome o[N_SETUPS][MAX_RATES][MAX_REPEAT];
	json_t *results = json_array(), *compare;
	struct prompts pr;
	struct plan pl;
	int err;

	memset(&env, 0, sizeof(env));
	memset(&pl, 0, sizeof(pl));
	env.budget = "50%";
	env.requests = 8;
	env.warmup = 2;
	env.max_tokens = 16;
	env.prompt_tokens = 16;
	env.repeat = 3;
	env.max_batch = 8;
	env.threads = 1;
	env.seed = 1;
	env.timeout = 300;
	parse_rates("0.5,1,2");
	/* consolidated-one is a diagnosis, not one of issue 17's setups: named only. */
	for (int i = 0; i < N_SETUPS; i++)
		env.setups[i] = i != S_CONSOL_ONE;
	if (argp_parse(&argp, argc, argv, 0, NULL, NULL) || !results)
		return 1;
	if (env.nmerge) {
		json_decref(results);
		return merge();
	}
	err = load_prompts(&pr);
	if (!err)
		err = make_plan(&pl);
	for (uint32_t r = 0; r < env.nrates && !err; r++)
		for (uint32_t k = 0; k < env.repeat && !err; k++)
			for (int s = 0; s < N_SETUPS && !err; s++)
				if (env.setups[s])
					err = run_one(s, &pl, env.rates[r], k, &pr, &o[s][r][k]);
	drop_plan(&pl);
	for (uint32_t i = 0; i < pr.n; i++)
		free(pr.ids[i]);
	if (err) {
		json_decref(results);
		return 1;
	}
	for (uint32_t r = 0; r < env.nrates; r++)
		for (int s = 0; s < N_SETUPS; s++)
			if (env.setups[s])
				json_array_append_new(results, row_json(s, env.rates[r], o[s][r],
									env.repeat, &pl));
	compare = compare_json(results);
	if (env.json) {
		json_t *models = json_array();

		for (uint32_t i = 0; i < env.n; i++)
			json_array_append_new(models, json_string(env.models[i]));
		json_t *root = json_pack("{s:o, s:s, s:I, s:I, s:I, s:i, s:i, s:i, s:i, s:s?, s:s?, "
					 "s:i, s:b, s:o, s:o}",
					 "models", models, "map", env.map, "budget_bytes",
					 (json_int_t)pl.budget, "owned_bytes", (json_int_t)pl.owned,
					 "io_rate", (json_int_t)env.io_rate, "requests",
					 (int)env.requests, "max_tokens", (int)env.max_tokens,
					 "repeat", (int)env.repeat, "max_batch", (int)env.max_batch,
					 "prefetch", env.prefetch, "evict", env.evict, "group_ms",
					 (int)env.group_ms, "shared_store", env.shared_store, "results",
					 results, "compare",
					 compare);
		json_t *by = json_object();

		/* Only when given: runs without it still merge with earlier files. */
		for (int s = 0; s < N_SETUPS; s++)
			if (env.prefetch_of[s])
				json_object_set_new(by, setup_names[s],
						    json_string(env.prefetch_of[s]));
		if (json_object_size(by))
			json_object_set(root, "prefetch_setups", by);
		json_decref(by);

		json_dumpf(root, stdout, JSON_INDENT(1));
		putchar('\n');
		json_decref(root);
		return 0;
	}
	print_compare(compare);
	json_decref(results);
	json_decref(compare);
	return 0;
}
