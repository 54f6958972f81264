// SPDX-License-Identifier: MIT
/*
 * moepager loadgen: open-loop Poisson load on an OpenAI-style completions
 * server (libcurl's multi interface, one thread): streamed requests at
 * exponentially spaced arrival times whether or not earlier ones finished,
 * spread over models by power-law shares; reports throughput, TTFT, TPOT
 * and latency percentiles, SLO attainment and errors, and what the server's
 * /metrics counted meanwhile.
 */
#include <argp.h>
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loadgen/loadgen.h"

static struct lg_env {
	const char *url;
	double rate;
	double duration;
	const char *prompts;
	uint32_t prompt_chars;
	uint32_t max_tokens;
	double temperature;
	const char *mix;
	double mix_alpha;
	double slo_ttft_ms, slo_tpot_ms;
	uint64_t seed;
	double drain_s;
	bool json;
	bool ignore_eos;
	const char *pool;
	double retry_s;
} env;

enum {
	OPT_URL = 0x100, OPT_RATE, OPT_DURATION, OPT_PROMPTS, OPT_PROMPT_CHARS, OPT_MAX_TOKENS,
	OPT_TEMPERATURE, OPT_MIX, OPT_MIX_ALPHA, OPT_SLO_TTFT, OPT_SLO_TPOT, OPT_SEED, OPT_DRAIN,
	OPT_JSON, OPT_IGNORE_EOS, OPT_POOL, OPT_RETRY,
};

static const char doc[] =
	"Open-loop load on an OpenAI-style completions server: requests arrive as a\n"
	"Poisson process of --rate per second for --duration seconds, each streamed\n"
	"(server-sent events), whether or not the earlier ones finished. Prompts are\n"
	"texts of a file (fortune format, texts between lines of '%', else one per\n"
	"line; data/prompts/heldout-fortunes.txt ships with the project), cut to\n"
	"--prompt-chars. --mix A,B,C spreads requests over models with power-law\n"
	"shares (model i gets a share proportional to i^-alpha, as S-LoRA's\n"
	"workloads do); --mix power:ALPHA spreads them so over every model the\n"
	"server lists (its base, then its adapters). A request meets the SLO when\n"
	"its TTFT and TPOT are within the bounds given.\n"
	"\n"
	"Reports requests, completed, errors (5xx and failed connections; 503s also\n"
	"as rejected), throughput_tok_s, ttft_ms / tpot_ms / latency_ms (p50, p90,\n"
	"p99), slo_attainment, per-model counts, and the server's own counters over\n"
	"the run from its /metrics (hit rate, steps, scheduling and HTTP overhead).\n"
	"\n"
	"--pool FILE instead of --url spreads requests over several servers: FILE holds\n"
	"\"epoch N\" and then one URL per line, and whoever adds or removes servers\n"
	"rewrites it (a new file renamed over it, N growing); each request goes to the\n"
	"current epoch's server with the fewest requests in flight. With --retry-s S a\n"
	"request refused before its first token (no connection, 503, closed unanswered)\n"
	"is sent again, for up to S seconds after its arrival (docs/elastic.md).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager loadgen --url http://127.0.0.1:8080 --rate 2 --duration 60 \\\n"
	"      --prompts data/prompts/heldout-fortunes.txt --json\n"
	"  moepager loadgen --url http://127.0.0.1:8080 --rate 5 --duration 30 \\\n"
	"      --prompts p.txt --mix base,legal,code --mix-alpha 1 --slo-ttft-ms 500\n";

static const struct argp_option opts[] = {
	{ "url", OPT_URL, "URL", 0, "The server (e.g. http://127.0.0.1:8080; required)", 0 },
	{ "pool", OPT_POOL, "FILE", 0, "Servers to spread requests over (epoch file)", 0 },
	{ "retry-s", OPT_RETRY, "S", 0,
	  "Send a refused request again for up to S s after its arrival (default 0)", 0 },
	{ "rate", OPT_RATE, "R", 0, "Requests per second, on average (default 1)", 0 },
	{ "duration", OPT_DURATION, "S", 0, "Seconds of arrivals (default 30)", 0 },
	{ "prompts", OPT_PROMPTS, "FILE", 0, "Prompt texts (required)", 0 },
	{ "prompt-chars", OPT_PROMPT_CHARS, "N", 0, "Cut prompts to N bytes (default 200)", 0 },
	{ "max-tokens", OPT_MAX_TOKENS, "N", 0, "max_tokens of each request (default 64)", 0 },
	{ "ignore-eos", OPT_IGNORE_EOS, NULL, 0,
	  "Every request generates max_tokens (models that stop at other places compare fairly)",
	  0 },
	{ "temperature", OPT_TEMPERATURE, "T", 0, "temperature of each request (default 0)", 0 },
	{ "mix", OPT_MIX, "A,B,...", 0,
	  "Models to spread requests over, or power:ALPHA for all the server's (default)", 0 },
	{ "mix-alpha", OPT_MIX_ALPHA, "ALPHA", 0, "Power-law exponent of the shares (default 1)", 0 },
	{ "slo-ttft-ms", OPT_SLO_TTFT, "MS", 0, "TTFT bound of the SLO (default 1000)", 0 },
	{ "slo-tpot-ms", OPT_SLO_TPOT, "MS", 0, "TPOT bound of the SLO (default 200)", 0 },
	{ "seed", OPT_SEED, "N", 0, "Arrivals, prompts and models drawn from this seed (1)", 0 },
	{ "drain", OPT_DRAIN, "S", 0, "Seconds to wait for requests after the last (120)", 0 },
	{ "json", OPT_JSON, NULL, 0, "Print one JSON object", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case OPT_URL: env.url = arg; break;
	case OPT_POOL: env.pool = arg; break;
	case OPT_RETRY: return cli_opt_double(state, "--retry-s", arg, 0, 86400, &env.retry_s);
	case OPT_RATE: return cli_opt_double(state, "--rate", arg, 1e-3, 1e4, &env.rate);
	case OPT_DURATION:
		return cli_opt_double(state, "--duration", arg, 0.1, 86400, &env.duration);
	case OPT_PROMPTS: env.prompts = arg; break;
	case OPT_PROMPT_CHARS:
		return cli_opt_u32(state, "--prompt-chars", arg, 1, 1u << 20, &env.prompt_chars);
	case OPT_MAX_TOKENS:
		return cli_opt_u32(state, "--max-tokens", arg, 1, 1u << 20, &env.max_tokens);
	case OPT_TEMPERATURE:
		return cli_opt_double(state, "--temperature", arg, 0, 2, &env.temperature);
	case OPT_MIX:
		if (strncmp(arg, "power:", 6)) {
			env.mix = arg;
			break;
		}
		env.mix = NULL;
		return cli_opt_double(state, "--mix power:ALPHA", arg + 6, 0, 10, &env.mix_alpha);
	case OPT_MIX_ALPHA: return cli_opt_double(state, "--mix-alpha", arg, 0, 10, &env.mix_alpha);
	case OPT_SLO_TTFT:
		return cli_opt_double(state, "--slo-ttft-ms", arg, 0, 1e7, &env.slo_ttft_ms);
	case OPT_SLO_TPOT:
		return cli_opt_double(state, "--slo-tpot-ms", arg, 0, 1e7, &env.slo_tpot_ms);
	case OPT_IGNORE_EOS:
		env.ignore_eos = true;
		break;
	case OPT_SEED: return cli_opt_u64(state, "--seed", arg, 0, UINT64_MAX, &env.seed);
	case OPT_DRAIN: return cli_opt_double(state, "--drain", arg, 0, 86400, &env.drain_s);
	case OPT_JSON: env.json = true; break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.url == !env.pool)
			argp_error(state, "one of --url URL and --pool FILE is required");
		if (!env.prompts)
			argp_error(state, "--prompts FILE is required (e.g. "
				   "data/prompts/heldout-fortunes.txt)");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

static const struct argp argp = { opts, parse_arg, NULL, doc, NULL, NULL, NULL };

int cmd_loadgen(int argc, char **argv)
{
	struct lg_prompts prompts = { 0 };
	struct lg_models models = { 0 };
	struct lg_metrics before = { 0 }, after = { 0 };
	struct lg_run run = { 0 };
	struct lg_pool pool = { 0 };
	int err;

	memset(&env, 0, sizeof(env));
	env.rate = 1;
	env.duration = 30;
	env.prompt_chars = 200;
	env.max_tokens = 64;
	env.mix_alpha = 1;
	env.slo_ttft_ms = 1000;
	env.slo_tpot_ms = 200;
	env.seed = 1;
	env.drain_s = 120;
	if (argp_parse(&argp, argc, argv, 0, NULL, NULL))
		return 1;
	if (curl_global_init(CURL_GLOBAL_DEFAULT))
		return 1;
	err = lg_pool_init(&pool, env.url, env.pool);
	if (!err && !pool.ncur)
		err = cli_error(-EINVAL, "%s: the pool has no server yet", env.pool);
	if (!err)
		err = lg_read_prompts(env.prompts, env.prompt_chars, &prompts);
	/* The models from the first server of the pool that answers. */
	for (uint32_t i = 0; !err && i < pool.ncur; i++) {
		err = lg_models(pool.url[pool.cur[i]], env.mix, env.mix_alpha, &models);
		if (!err || i + 1 == pool.ncur)
			break;
		lg_models_free(&models);
		err = 0;
	}
	if (!err) {
		/* Several servers: their counters are each one's own (scrape them one by one). */
		if (!env.pool)
			lg_scrape(env.url, &before);
		run = (struct lg_run){
			.url = pool.url[pool.cur[0]], .rate = env.rate, .duration = env.duration,
			.max_tokens = env.max_tokens, .temperature = env.temperature,
			.ignore_eos = env.ignore_eos, .pool = &pool, .retry_s = env.retry_s,
			.seed = env.seed, .drain = env.drain_s, .prompts = &prompts,
			.models = &models,
		};
		err = lg_run(&run);
		if (!env.pool)
			lg_scrape(env.url, &after);
	}
	if (!err)
		lg_report(&run, &before, &after, env.slo_ttft_ms, env.slo_tpot_ms, env.json);
	lg_run_free(&run);
	lg_models_free(&models);
	lg_prompts_free(&prompts);
	lg_pool_free(&pool);
	curl_global_cleanup();
	return err ? 1 : 0;
}
