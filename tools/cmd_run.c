// SPDX-License-Identifier: MIT
/* moepager run: greedy decoding of a model, resident or paged, with throughput in JSON. */
#include <argp.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <moepager.h>
#include <moepager/membw.h>

#include "cli.h"
#include "run_record.h"
#include "text.h"

#define MAX_REPEAT 100u

static struct run_env {
	const char *model;
	const char *trace;
	struct cli_engine_opts eng;
	const char *engine_dir;
	const char *prefetch;
	const char *emap;
	const char *evict;
	const char *dump_logits;
	const char *prompt_text;
	const char *tokenizer;
	uint32_t prompt_tokens;
	uint32_t tokens;
	uint32_t warmup;
	uint32_t request;
	uint32_t repeat;
	uint64_t seed;
	const char *budget;
	const char *attach;
	uint64_t membw_bytes;
	bool warm_all;
	bool record_alternate;
	bool resident;
	bool json;
} env;

enum {
	OPT_PROMPT_TOKENS = 0x100, OPT_TOKENS, OPT_TRACE, OPT_REQUEST, OPT_BUDGET, OPT_PREFETCH,
	OPT_EVICT, OPT_RESIDENT, OPT_WARMUP, OPT_ENGINE_DIR, OPT_JSON,
	OPT_DUMP_LOGITS, OPT_SEED, OPT_MEMBW_BYTES, OPT_WARM_ALL, OPT_REPEAT, OPT_PROMPT,
	OPT_TOKENIZER, OPT_RECORD_ALTERNATE, OPT_EMAP, OPT_ATTACH,
};

static const char doc[] =
	"Greedy decoding of an .mpk model: a batched prefill of the prompt, then\n"
	"--warmup decode steps that are not measured, then --tokens measured ones.\n"
	"The prompt is --prompt-tokens ids drawn from --seed, or --prompt TEXT encoded\n"
	"with the model's tokenizer (then the text is printed, and is \"text\" in the\n"
	"JSON). With --trace, decode\n"
	"step t uses the experts (and gate weights) of trace token t of --request;\n"
	"the prompt is routed by the model's router. Experts are resident (all read\n"
	"into memory first, the upper bound) unless --budget pages them, or --attach\n"
	"reads them from a pager daemon's host tier (moepager pagerd; mode \"attached\",\n"
	"its paging counters are the daemon's, not this run's).\n"
	"\n"
	"--json prints one object: decode_tokens_per_s, prefill_tokens_per_s,\n"
	"token_ms_p50/p99, tokens (every generated id: the prefill's, warmup's,\n"
	"measured steps'), weights_gbps (weight bytes the engine read per second of\n"
	"decode less the fault stalls), membw_gbps (median memory read bandwidth of\n"
	"one pass after each measured step, in this process), the paging counters\n"
	"of the measured steps (resident: hit_rate 1, no faults; stall_ms_per_token\n"
	"sums the engine threads' waits) and peak_rss_bytes\n"
	"(taken when measuring starts, before the bandwidth probe's buffer).\n"
	"With --repeat, rates are medians over the repetitions, token_ms_p50/p99\n"
	"cover every measured step, and tokens are the first repetition's (the\n"
	"others must reproduce them: \"deterministic\").\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager run --model tiny.mpk --tokens 16\n"
	"  moepager run --model mixtral-mini.mpk --resident --warmup 2 --tokens 16 \\\n"
	"      --trace gsm8k.csv --request 0 --json\n"
	"  moepager run --model tiny.mpk --engine openblas --threads 2 --json\n";

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0, "The .mpk model (required)", 0 },
	{ "prompt-tokens", OPT_PROMPT_TOKENS, "N", 0, "Prompt length (default 16)", 0 },
	{ "prompt", OPT_PROMPT, "TEXT", 0,
	  "Prompt text, encoded with the model's tokenizer (MODEL.tok beside it); the "
	  "generated text is printed", 0 },
	{ "tokenizer", OPT_TOKENIZER, "FILE", 0, "Tokenizer for --prompt (default: MODEL.tok)", 0 },
	{ "tokens", 'n', "N", 0, "Measured decode steps (default 32)", 0 },
	{ "warmup", OPT_WARMUP, "N", 0, "Decode steps before measuring (default 0)", 0 },
	{ "seed", OPT_SEED, "N", 0, "Seed of the prompt ids (default 1)", 0 },
	{ "repeat", OPT_REPEAT, "N", 0,
	  "Run prefill and decode N times (cache reset between); report medians", 0 },
	{ "record-alternate", OPT_RECORD_ALTERNATE, NULL, 0,
	  "Record the trajectory through BPF in every second repetition (--repeat >= 2) and "
	  "report the recording's cost", 0 },
	{ "trace", OPT_TRACE, "FILE", 0, "Replay the routing of a moe-trace v1 file", 0 },
	{ "request", OPT_REQUEST, "R", 0, "Trace request to replay (default 0)", 0 },
	{ "resident", OPT_RESIDENT, NULL, 0, "All experts in memory (the default)", 0 },
	{ "budget", OPT_BUDGET, "SIZE", 0,
	  "Page experts in this much memory (\"8G\", \"40%\" of the experts)", 0 },
	{ "attach", OPT_ATTACH, "SOCKET", 0,
	  "Read experts from the pager daemon on SOCKET (moepager pagerd): its host tier, "
	  "shared with every process attached, under its budget", 0 },
	{ "evict", OPT_EVICT, "POLICY", 0, "Eviction policy, paged (default lru)", 0 },
	{ "prefetch", OPT_PREFETCH, "POLICY", 0,
	  "Prefetch policy, paged (default: no prefetcher); see moepager bench --help", 0 },
	{ "emap", OPT_EMAP, "FILE", 0,
	  "finemoe: its expert-map store, loaded at start when FILE exists, saved at exit", 0 },
	{ "warm-all", OPT_WARM_ALL, NULL, 0,
	  "Paged: read every expert the budget holds before decoding", 0 },
	{ "engine-dir", OPT_ENGINE_DIR, "DIR", 0, "Directory searched first for engine plug-ins",
	  0 },
	{ "json", OPT_JSON, NULL, 0, "Print one JSON object", 0 },
	{ "membw-bytes", OPT_MEMBW_BYTES, "BYTES", 0,
	  "Buffer of the bandwidth probe (default 256M, at least 4x the LLC)", 0 },
	{ "dump-logits", OPT_DUMP_LOGITS, "FILE", 0,
	  "Write the raw f32 logits of every generated token (vocab floats each)", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'm':
		env.model = arg;
		break;
	case OPT_PROMPT_TOKENS:
		cli_opt_u32(state, "--prompt-tokens", arg, 1, MP_MAX_SEQ, &env.prompt_tokens);
		break;
	case 'n':
		cli_opt_u32(state, "--tokens", arg, 0, MP_MAX_SEQ, &env.tokens);
		break;
	case OPT_WARMUP:
		cli_opt_u32(state, "--warmup", arg, 0, MP_MAX_SEQ, &env.warmup);
		break;
	case OPT_RECORD_ALTERNATE:
		env.record_alternate = true;
		break;
	case OPT_REPEAT:
		cli_opt_u32(state, "--repeat", arg, 1, MAX_REPEAT, &env.repeat);
		break;
	case OPT_SEED:
		cli_opt_u64(state, "--seed", arg, 0, UINT64_MAX, &env.seed);
		break;
	case OPT_TRACE:
		env.trace = arg;
		break;
	case OPT_PROMPT:
		env.prompt_text = arg;
		break;
	case OPT_TOKENIZER:
		env.tokenizer = arg;
		break;
	case OPT_REQUEST:
		cli_opt_u32(state, "--request", arg, 0, UINT32_MAX, &env.request);
		break;
	case OPT_RESIDENT:
		env.resident = true;
		break;
	case OPT_BUDGET:
		env.budget = arg;
		break;
	case OPT_ATTACH:
		env.attach = arg;
		break;
	case OPT_WARM_ALL:
		env.warm_all = true;
		break;
	case OPT_PREFETCH:
		env.prefetch = arg;
		break;
	case OPT_EVICT:
		env.evict = arg;
		break;
	case OPT_EMAP:
		env.emap = arg;
		break;
	case OPT_ENGINE_DIR:
		env.engine_dir = arg;
		break;
	case OPT_JSON:
		env.json = true;
		break;
	case OPT_MEMBW_BYTES:
		cli_opt_size(state, "--membw-bytes", arg, &env.membw_bytes);
		if (env.membw_bytes < (1u << 20))
			argp_error(state, "--membw-bytes must be at least 1M");
		break;
	case OPT_DUMP_LOGITS:
		env.dump_logits = arg;
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
		if ((env.resident && env.budget) || (env.attach && (env.resident || env.budget)))
			argp_error(state, "--resident, --budget and --attach exclude each other");
		if ((env.prefetch || env.evict || env.warm_all) && !env.budget)
			argp_error(state, "--prefetch, --evict, --warm-all need --budget (paged)");
		if (env.emap && !env.prefetch)
			argp_error(state, "--emap needs --prefetch (finemoe keeps an expert-map store)");
		if (env.record_alternate && env.repeat < 2)
			argp_error(state, "--record-alternate needs --repeat 2 or more");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

static volatile sig_atomic_t stop_requested;

static void on_sigint(int sig)
{
	(void)sig;
	stop_requested = 1;
}

/* Everything the run opens, so one cleanup path closes it. */
struct run {
	struct mp_store *store;
	struct mp_trace *trace;
	struct mp_engine *engine;
	struct mp_resident *resident;
	struct mp_pager *pager;
	struct mp_attach *attach;	/* with --attach */
	struct mp_prefetcher *prefetcher;
	bool semantic;			/* the prefetcher gets the token embeddings */
	struct mp_runner *runner;
	struct mp_membw *membw;
	FILE *dump;
	struct mp_tokenizer *tok;	/* with --prompt */
	struct run_record rec;		/* with --record-alternate */
	uint32_t *prompt;
	uint32_t *generated;
	double *step_ms;
	double *membw_gbps;
	uint64_t rss;			/* peak RSS when measuring started */
};

/* Paging counters summed over the measured steps (resident: nothing is paged). */
struct paging {
	uint64_t hits, misses, demand_faults, bytes_read, bytes_host, evictions, stall_ns;
	uint64_t caller_stall_ns;	/* of stall_ns (cli_engine_stall_s()) */
};

/* One repetition's figures. */
struct rep {
	double prefill_tps, tps, weights_gbps, membw, ratio;
};

struct results {
	uint32_t generated, measured, samples, tokens_requested, reps;
	bool deterministic;
	uint64_t weight_bytes, trace_overrides;
	struct paging pg;
	struct rep *rep;
};

static void on_load_progress(uint64_t done, uint64_t total, void *arg)
{
	(void)arg;
	cli_progress("load experts", done, total);
}

static void decode_progress(uint32_t done, uint32_t total)
{
	if (!cli_progress_enabled())
		return;
	fprintf(stderr, "\rdecode: %u / %u tokens", done, total);
	fflush(stderr);
}

/* Prompt ids from a seeded xorshift: the same prompt for the same seed and vocabulary. */
static void make_prompt(uint32_t *ids, uint32_t n, uint64_t seed, uint32_t vocab)
{
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;

	for (uint32_t i = 0; i < n; i++) {
		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		ids[i] = (uint32_t)((s >> 11) % vocab);
	}
}

static int dump_logits(struct run *r, uint32_t vocab)
{
	if (!r->dump)
		return 0;
	if (fwrite(mp_runner_logits(r->runner), sizeof(float), vocab, r->dump) != vocab)
		return cli_fail(-EIO, "writing %s", env.dump_logits);
	return 0;
}

static json_t *json_ids(const uint32_t *ids, uint32_t n)
{
	json_t *a = json_array();

	for (uint32_t i = 0; a && i < n; i++)
		json_array_append_new(a, json_integer(ids[i]));
	return a;
}

static uint64_t peak_rss_bytes(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru))
		return 0;
	return (uint64_t)ru.ru_maxrss * 1024;	/* Linux reports KiB */
}

/* Bandwidth passes: one per measured step, and at least this many per repetition. */
#define MIN_MEMBW_SAMPLES 5u

/* The trace, checked against the model; the measured steps cut to what it holds. */
static int open_trace(struct run *r, const struct mp_geometry *g)
{
	uint32_t have;
	int err = mp_trace_open(env.trace, &r->trace);

	if (!err)
		err = mp_trace_check_geometry(r->trace, g);
	if (err)
		return err;
	if (env.request >= mp_trace_requests(r->trace))
		return cli_error(-EINVAL, "%s has %u requests; --request %u is not one",
				 env.trace, mp_trace_requests(r->trace), env.request);
	/* Stop at the trace's end rather than wrap: a wrapped trace would repeat itself. */
	have = mp_trace_tokens(r->trace, env.request);
	if (env.warmup >= have)
		return cli_error(-EINVAL, "request %u of %s has %u tokens, not more than "
				 "--warmup %u", env.request, env.trace, have, env.warmup);
	if (env.warmup + env.tokens > have) {
		cli_say("request %u of %s has %u tokens: measuring %u "
			"decode steps, not %u", env.request, env.trace, have,
			have - env.warmup, env.tokens);
		env.tokens = have - env.warmup;
	}
	return 0;
}

/* Queues every expert (as many as the budget holds) and waits for the reads. */
static int warm_all(struct mp_pager *p, const struct mp_geometry *g)
{
	uint64_t fit = mp_pager_budget(p) / mp_store_expert_bytes(mp_pager_store(p));
	uint64_t n = 0;

	for (uint32_t l = 0; l < g->layers && n < fit; l++) {
		for (uint32_t e = 0; e < g->experts && n < fit; e++, n++) {
			int err = mp_pager_prefetch(p, l, e, 0);

			if (err < 0)
				return err;
		}
	}
	return mp_pager_wait_idle(p, 600000);
}

/*
 * A prefetcher between the runner and the pager. With a trace, the future it
 * may know (oracle, belady) is the decode steps of every repetition, in order.
 * Without one the model routes its own tokens, and each token's embedding is
 * the iteration's semantic vector (a forced route has nothing to do with it).
 */
static int open_prefetcher(struct run *r)
{
	struct mp_prefetcher_config cfg = { .policy = env.prefetch, .trace = r->trace,
					    .emap_path = env.emap };
	struct mp_replay_seg *segs;
	int err;

	r->semantic = !r->trace;
	if (r->semantic)
		cfg.sem.dim = mp_store_geometry(r->store)->hidden;
	err = mp_prefetcher_open(r->pager, &cfg, &r->prefetcher);
	if (err || !r->trace)
		return err;
	segs = calloc(env.repeat, sizeof(*segs));
	if (!segs)
		return -ENOMEM;
	for (uint32_t i = 0; i < env.repeat; i++)
		segs[i] = (struct mp_replay_seg){ env.request, 0, env.warmup + env.tokens };
	err = mp_prefetcher_set_future(r->prefetcher, segs, env.repeat);
	free(segs);
	return err;
}

/* The expert source: all experts read into memory, or a pager within the budget. */
static int open_source(struct run *r, struct mp_runner_config *rcfg)
{
	struct mp_pager_config pcfg;
	int err;

	if (env.attach) {
		err = mp_attach_open(r->store, env.attach, &r->attach);
		rcfg->source = mp_attach_source_ops();
		rcfg->source_ctx = r->attach;
		return err;
	}
	if (!env.budget) {
		err = mp_resident_open(r->store, cli_progress_enabled() ? on_load_progress : NULL,
				       NULL, &r->resident);
		cli_progress_end();
		if (!err)
			err = cli_resident_pack(r->resident, r->engine, &rcfg->flags);
		rcfg->source = mp_resident_source_ops();
		rcfg->source_ctx = r->resident;
		return err;
	}
	err = mp_prefetch_check_names(env.prefetch, env.evict);
	if (err)
		return err;
	mp_pager_config_init(&pcfg);
	pcfg.budget = env.budget;
	pcfg.eviction = env.evict;
	err = mp_pager_open(r->store, &pcfg, &r->pager);
	if (err)
		return err;
	rcfg->source = mp_pager_source_ops();
	rcfg->source_ctx = r->pager;
	if (env.prefetch) {
		err = open_prefetcher(r);
		if (err)
			return err;
		rcfg->source = mp_prefetcher_source_ops();
		rcfg->source_ctx = r->prefetcher;
	}
	if (env.warm_all)
		err = warm_all(r->pager, mp_store_geometry(r->store));
	return err;
}

/*
 * Measuring starts: the counters are zeroed, the peak RSS is taken (before
 * the bandwidth probe maps its buffer, which is not the run's memory; decode
 * steps add only KV cache pages after this), and the probe is opened.
 */
static int start_measuring(struct run *r)
{
	mp_runner_stats_reset(r->runner);
	if (r->membw)
		return 0;
	r->rss = peak_rss_bytes();
	return mp_membw_open(r->engine, env.membw_bytes, &r->membw);
}

/* The pager's counters now (all zero when resident). */
static void paging_now(struct run *r, struct paging *pg)
{
	struct mp_pager_stats ps;

	memset(pg, 0, sizeof(*pg));
	if (!r->pager)
		return;
	mp_pager_stats(r->pager, &ps);
	pg->hits = ps.hits;
	pg->misses = ps.misses;
	pg->demand_faults = ps.faults_file + ps.faults_host;
	pg->bytes_read = ps.bytes_file;
	pg->bytes_host = ps.bytes_host;
	pg->evictions = ps.evictions;
	pg->stall_ns = ps.stall_ns;
	pg->caller_stall_ns = ps.caller_stall_ns;
}

/* sum += now - before, field by field. */
static void paging_add(struct paging *sum, const struct paging *before, const struct paging *now)
{
	sum->hits += now->hits - before->hits;
	sum->misses += now->misses - before->misses;
	sum->demand_faults += now->demand_faults - before->demand_faults;
	sum->bytes_read += now->bytes_read - before->bytes_read;
	sum->bytes_host += now->bytes_host - before->bytes_host;
	sum->evictions += now->evictions - before->evictions;
	sum->stall_ns += now->stall_ns - before->stall_ns;
	sum->caller_stall_ns += now->caller_stall_ns - before->caller_stall_ns;
}

static void close_run(struct run *r)
{
	mp_membw_close(r->membw);
	mp_runner_close(r->runner);
	/* The engine's threads are idle: no one touches expert memory any more. */
	mp_prefetcher_close(r->prefetcher);
	mp_pager_close(r->pager);
	mp_attach_close(r->attach);
	mp_resident_close(r->resident);
	mp_engine_close(r->engine);
	mp_trace_close(r->trace);
	mp_store_close(r->store);
	mp_tokenizer_close(r->tok);
	if (r->dump)
		fclose(r->dump);
	free(r->prompt);
	free(r->generated);
	free(r->step_ms);
	free(r->membw_gbps);
}

/* The median over repetitions of one figure. */
static double rep_median(const struct results *res, size_t field)
{
	double v[MAX_REPEAT];

	for (uint32_t i = 0; i < res->reps; i++)
		v[i] = *(const double *)((const char *)&res->rep[i] + field);
	return cli_median(v, res->reps);
}

/*
 * --record-alternate: even repetitions ran unrecorded, odd ones recorded.
 * Medians of each, and the median of the ratios of neighbouring pairs (the
 * figure least moved by a machine whose speed wanders between repetitions).
 */
static json_t *json_record(const struct run *r, const struct results *res)
{
	double off[MAX_REPEAT], on[MAX_REPEAT], ratio[MAX_REPEAT];
	uint32_t noff = 0, non = 0, nratio = 0;
	double moff, mon;

	for (uint32_t i = 0; i < res->reps; i++) {
		if (i % 2)
			on[non++] = res->rep[i].tps;
		else
			off[noff++] = res->rep[i].tps;
		if (i % 2)
			ratio[nratio++] = res->rep[i].tps / res->rep[i - 1].tps;
	}
	moff = cli_median(off, noff);
	mon = cli_median(on, non);
	return json_pack("{s:s, s:f, s:f, s:f, s:f, s:I, s:I}",
			 "source", mp_traj_source_name(r->rec.source),
			 "unrecorded_tokens_per_s", moff, "recorded_tokens_per_s", mon,
			 "ratio_of_medians", moff > 0 ? mon / moff : 0.0,
			 "median_pair_ratio", cli_median(ratio, nratio),
			 "records", (json_int_t)r->rec.records, "dropped", (json_int_t)r->rec.dropped);
}

static json_t *json_reps(const struct results *res)
{
	json_t *a = json_array();

	for (uint32_t i = 0; a && i < res->reps; i++)
		json_array_append_new(a, json_pack("{s:f, s:f, s:f, s:f, s:f}",
						   "prefill_tokens_per_s", res->rep[i].prefill_tps,
						   "decode_tokens_per_s", res->rep[i].tps,
						   "weights_gbps", res->rep[i].weights_gbps,
						   "membw_gbps", res->rep[i].membw,
						   "weights_membw_ratio", res->rep[i].ratio));
	return a;
}

/*
 * The prompt and the generated ids as text (with --prompt), malloc()ed;
 * NULL without a tokenizer. Decoded together so the pieces join as trained.
 */
static char *generated_text(const struct run *r, const struct results *res)
{
	size_t n = (size_t)env.prompt_tokens + res->generated;
	uint32_t *ids;
	char *text = NULL;
	int len;

	if (!r->tok || !(ids = malloc(n * sizeof(*ids))))
		return NULL;
	memcpy(ids, r->prompt, env.prompt_tokens * sizeof(*ids));
	memcpy(ids + env.prompt_tokens, r->generated, res->generated * sizeof(*ids));
	len = mp_tokenizer_decode(r->tok, ids, n, NULL, 0);
	if (len >= 0 && (text = malloc((size_t)len + 1)))
		mp_tokenizer_decode(r->tok, ids, n, text, (size_t)len + 1);
	free(ids);
	return text;
}

/* The prefetcher's own figures, since it opened. */
static json_t *json_prefetch(struct run *r)
{
	struct mp_prefetcher_stats st;

	mp_prefetcher_stats(r->prefetcher, &st);
	return json_pack("{s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}",
			 "policy", env.prefetch, "semantic", r->semantic,
			 "events", (json_int_t)st.events, "dropped", (json_int_t)st.dropped,
			 "iterations", (json_int_t)st.iterations,
			 "predicted", (json_int_t)st.predicted, "issued", (json_int_t)st.issued,
			 "expired", (json_int_t)st.expired,
			 "emap_records", (json_int_t)st.emap_records,
			 "emap_bytes", (json_int_t)st.emap_bytes, "load_ratio",
			 (double)st.load_ratio);
}

static int print_results(struct run *r, struct results *res)
{
	const struct mp_geometry *g = mp_store_geometry(r->store);
	const char *mode = r->pager ? "paged" : r->attach ? "attached" : "resident";
	const struct paging *pg = &res->pg;
	uint64_t routed = pg->hits + pg->misses;
	double hit_rate = r->pager ? (routed ? (double)pg->hits / (double)routed : 1.0) : 1.0;
	double stall_ms = res->measured ? pg->stall_ns / 1e6 / res->measured : 0.0;
	double tps = rep_median(res, offsetof(struct rep, tps));
	double prefill_tps = rep_median(res, offsetof(struct rep, prefill_tps));
	double weights_gbps = rep_median(res, offsetof(struct rep, weights_gbps));
	double ratio = rep_median(res, offsetof(struct rep, ratio));
	double membw = cli_median(r->membw_gbps, res->samples);
	double p50, p99;
	char *text = generated_text(r, res);
	json_t *o;

	p50 = cli_quantile(r->step_ms, res->measured, 0.50);
	p99 = cli_quantile(r->step_ms, res->measured, 0.99);
	if (!env.json) {
		printf("%s: %s, %s engine (%s, %u threads), %s, %u repetition(s)\n", env.model,
		       mp_dtype_name(g->dtype), mp_engine_name(r->engine),
		       mp_engine_isa(r->engine), r->engine->threads, mode, res->reps);
		printf("prefill %u tokens: %.1f tokens/s\n", env.prompt_tokens, prefill_tps);
		printf("decode %u tokens after %u warmup: %.2f tokens/s, p50 %.2f ms, "
		       "p99 %.2f ms\n", env.tokens, env.warmup, tps, p50, p99);
		printf("weights %.2f GB/s, memory read bandwidth %.2f GB/s (ratio %.2f)\n",
		       weights_gbps, membw, ratio);
		printf("hit rate %.3f, %llu demand faults, stall %.2f ms/token, peak RSS %.0f MB\n",
		       hit_rate, (unsigned long long)pg->demand_faults, stall_ms, r->rss / 1e6);
		if (env.record_alternate) {
			json_t *rec = json_record(r, res);

			printf("recording (%s): %.2f tokens/s recorded, %.2f unrecorded, "
			       "median pair ratio %.3f, %lld records, %lld dropped\n",
			       json_string_value(json_object_get(rec, "source")),
			       json_real_value(json_object_get(rec, "recorded_tokens_per_s")),
			       json_real_value(json_object_get(rec, "unrecorded_tokens_per_s")),
			       json_real_value(json_object_get(rec, "median_pair_ratio")),
			       json_integer_value(json_object_get(rec, "records")),
			       json_integer_value(json_object_get(rec, "dropped")));
			json_decref(rec);
		}
		if (text)
			printf("%s\n", text);
		free(text);
		return 0;
	}
	o = json_pack("{s:s, s:s, s:s, s:s, s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:i}",
		      "model", env.model, "engine", mp_engine_name(r->engine),
		      "isa", mp_engine_isa(r->engine), "mode", mode,
		      "threads", (json_int_t)r->engine->threads, "dtype", mp_dtype_name(g->dtype),
		      "prompt_tokens", (json_int_t)env.prompt_tokens,
		      "warmup_tokens", (json_int_t)env.warmup,
		      "decode_tokens", (json_int_t)env.tokens,
		      "tokens_requested", (json_int_t)res->tokens_requested,
		      "request", (json_int_t)env.request, "repeat", (json_int_t)res->reps);
	if (!o)
		return -ENOMEM;
	json_object_set_new(o, "trace", env.trace ? json_string(env.trace) : json_null());
	json_object_set_new(o, "interrupted", json_boolean(stop_requested));
	json_object_set_new(o, "deterministic", json_boolean(res->deterministic));
	json_object_set_new(o, "prefill_tokens_per_s", json_real(prefill_tps));
	json_object_set_new(o, "decode_tokens_per_s", json_real(tps));
	json_object_set_new(o, "token_ms_p50", json_real(p50));
	json_object_set_new(o, "token_ms_p99", json_real(p99));
	json_object_set_new(o, "prompt", json_ids(r->prompt, env.prompt_tokens));
	json_object_set_new(o, "tokens", json_ids(r->generated, res->generated));
	if (text)
		json_object_set_new(o, "text", json_string(text));
	free(text);
	json_object_set_new(o, "hit_rate", json_real(hit_rate));
	json_object_set_new(o, "demand_faults", json_integer((json_int_t)pg->demand_faults));
	json_object_set_new(o, "stall_ms_per_token", json_real(stall_ms));
	json_object_set_new(o, "bytes_read", json_integer((json_int_t)pg->bytes_read));
	json_object_set_new(o, "bytes_host", json_integer((json_int_t)pg->bytes_host));
	json_object_set_new(o, "evictions", json_integer((json_int_t)pg->evictions));
	json_object_set_new(o, "budget_bytes",
			    json_integer((json_int_t)(r->pager ? mp_pager_budget(r->pager) :
						      mp_store_total_expert_bytes(r->store))));
	json_object_set_new(o, "peak_rss_bytes", json_integer((json_int_t)r->rss));
	json_object_set_new(o, "weights_bytes_per_token",
			    json_integer((json_int_t)(res->measured ?
						      res->weight_bytes / res->measured : 0)));
	json_object_set_new(o, "weights_gbps", json_real(weights_gbps));
	json_object_set_new(o, "membw_gbps", json_real(membw));
	json_object_set_new(o, "membw_samples", json_integer(res->samples));
	json_object_set_new(o, "weights_membw_ratio", json_real(ratio));
	json_object_set_new(o, "trace_overrides", json_integer((json_int_t)res->trace_overrides));
	json_object_set_new(o, "repeats", json_reps(res));
	if (r->prefetcher)
		json_object_set_new(o, "prefetch", json_prefetch(r));
	if (env.record_alternate)
		json_object_set_new(o, "record", json_record(r, res));
	json_dumpf(o, stdout, JSON_COMPACT);
	printf("\n");
	json_decref(o);
	return 0;
}

/*
 * One repetition: prefill, warmup and measured decode steps, a bandwidth
 * pass after each measured step (both then see the same machine, which on a
 * shared one matters). The first repetition's tokens (and logits) are kept;
 * later ones must reproduce them.
 */
static int generate(struct run *r, struct results *res)
{
	const uint32_t vocab = mp_store_geometry(r->store)->vocab;
	const uint32_t steps = env.warmup + env.tokens;
	struct rep *rep = &res->rep[res->reps];
	struct paging pg0, pg1;
	struct mp_runner_stats st;
	uint32_t first_sample = res->samples, n = 0, measured = 0;
	uint32_t last, *gen = r->generated;
	double decode_s = 0, compute_s;
	uint64_t t0 = cli_now_ns();
	bool keep = res->reps == 0;
	int err = mp_runner_prefill(r->runner, r->prompt, env.prompt_tokens);

	rep->prefill_tps = env.prompt_tokens / ((double)(cli_now_ns() - t0) / 1e9);
	if (err)
		return err;
	last = mp_runner_argmax(r->runner);
	if (keep)
		gen[n] = last;
	res->deterministic &= gen[n] == last;
	n++;
	err = keep ? dump_logits(r, vocab) : 0;
	for (uint32_t s = 0; !err && s < steps && !stop_requested; s++) {
		double ms;

		if (s == env.warmup) {
			err = start_measuring(r);
			paging_now(r, &pg0);
			if (err)
				break;
		}
		t0 = cli_now_ns();
		err = mp_runner_step(r->runner, last);
		ms = (double)(cli_now_ns() - t0) / 1e6;
		if (err)
			break;
		last = mp_runner_argmax(r->runner);
		if (keep)
			gen[n] = last;
		res->deterministic &= gen[n] == last;
		n++;
		if (s >= env.warmup) {
			r->step_ms[res->measured + measured++] = ms;
			decode_s += ms / 1e3;
			err = mp_membw_sample(r->membw, &r->membw_gbps[res->samples++]);
		}
		if (!err && keep)
			err = dump_logits(r, vocab);
		decode_progress(s + 1, steps);
	}
	if (cli_progress_enabled())
		fprintf(stderr, "\n");
	if (!err && !measured) {
		err = start_measuring(r);
		paging_now(r, &pg0);
	}
	while (!err && res->samples - first_sample < MIN_MEMBW_SAMPLES)
		err = mp_membw_sample(r->membw, &r->membw_gbps[res->samples++]);
	if (err)
		return err;
	mp_runner_stats(r->runner, &st);
	paging_now(r, &pg1);
	paging_add(&res->pg, &pg0, &pg1);
	if (keep)
		res->generated = n;
	res->measured += measured;
	res->weight_bytes += st.dense_bytes + st.expert_bytes;
	res->trace_overrides += st.trace_overrides;
	/* Compute time: the decode wall time less the time lost to the pager's waits. */
	compute_s = decode_s - cli_engine_stall_s(pg1.stall_ns - pg0.stall_ns,
						  pg1.caller_stall_ns - pg0.caller_stall_ns,
						  r->engine->threads);
	rep->tps = decode_s > 0 ? measured / decode_s : 0.0;
	rep->weights_gbps = compute_s > 0 ? (st.dense_bytes + st.expert_bytes) / compute_s / 1e9 :
			    0.0;
	/* Sorting this repetition's samples in place is fine: the overall median sorts all. */
	rep->membw = cli_median(r->membw_gbps + first_sample, res->samples - first_sample);
	rep->ratio = rep->membw > 0 ? rep->weights_gbps / rep->membw : 0.0;
	res->reps++;
	return 0;
}

int cmd_run(int argc, char **argv)
{
	static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
	static const struct argp argp = { opts, parse_arg, NULL, doc, children, NULL, NULL };
	struct mp_engine_config ecfg = { 0 };
	struct mp_runner_config rcfg = { 0 };
	struct results res = { 0 };
	struct run r = { 0 };
	const struct mp_geometry *g;
	uint32_t steps;
	int err;

	memset(&env, 0, sizeof(env));
	env.prompt_tokens = 16;
	env.tokens = 32;
	env.seed = 1;
	env.repeat = 1;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	res.tokens_requested = env.tokens;

	err = mp_store_open(env.model, &r.store);
	if (err)
		goto fail;
	g = mp_store_geometry(r.store);
	if (env.prompt_text) {
		err = text_tokenizer_open(env.tokenizer, env.model, g->vocab, &r.tok);
		if (!err)
			err = text_encode_prompt(r.tok, env.prompt_text, &r.prompt, &env.prompt_tokens);
		if (err)
			goto fail;
	}
	if (env.trace) {
		err = open_trace(&r, g);
		if (err)
			goto fail;
	}
	steps = env.warmup + env.tokens;
	if ((uint64_t)env.prompt_tokens + steps > g->max_seq) {
		err = cli_error(-EINVAL, "%u prompt tokens + %u decode steps exceed the model's "
				"max_seq %u", env.prompt_tokens, steps, g->max_seq);
		goto fail;
	}
	ecfg.threads = env.eng.threads;
	ecfg.plugin_dir = env.engine_dir;
	err = mp_engine_open(env.eng.engine, &ecfg, &r.engine);
	if (!err)
		err = open_source(&r, &rcfg);
	if (err)
		goto fail;
	rcfg.engine = r.engine;
	rcfg.max_seq = env.prompt_tokens + steps;
	rcfg.trace = r.trace;
	rcfg.request = env.request;
	err = mp_runner_open(r.store, &rcfg, &r.runner);
	if (err)
		goto fail;

	if (!r.prompt)
		r.prompt = calloc(env.prompt_tokens, sizeof(*r.prompt));
	r.generated = calloc(steps + 1, sizeof(*r.generated));
	r.step_ms = calloc((size_t)env.repeat * env.tokens + 1, sizeof(*r.step_ms));
	r.membw_gbps = calloc((size_t)env.repeat * (env.tokens + MIN_MEMBW_SAMPLES),
			      sizeof(*r.membw_gbps));
	res.rep = calloc(env.repeat, sizeof(*res.rep));
	if (!r.prompt || !r.generated || !r.step_ms || !r.membw_gbps || !res.rep) {
		err = -ENOMEM;
		goto fail;
	}
	if (env.dump_logits) {
		r.dump = fopen(env.dump_logits, "wb");
		if (!r.dump) {
			err = cli_fail(-errno, "%s", env.dump_logits);
			goto fail;
		}
	}
	if (!r.tok)
		make_prompt(r.prompt, env.prompt_tokens, env.seed, g->vocab);
	signal(SIGINT, on_sigint);
	res.deterministic = true;
	for (uint32_t i = 0; !err && i < env.repeat && (!i || !stop_requested); i++) {
		bool record = env.record_alternate && i % 2;

		if (i)
			mp_runner_reset(r.runner);
		if (record)
			err = run_record_begin(&r.rec);
		if (!err)
			err = generate(&r, &res);
		if (record)
			run_record_end(&r.rec);
	}
	if (!err)
		err = print_results(&r, &res);
	if (err)
		goto fail;
	free(res.rep);
	close_run(&r);
	return 0;

fail:
	cli_fail(err, NULL);
	free(res.rep);
	close_run(&r);
	return err;
}
