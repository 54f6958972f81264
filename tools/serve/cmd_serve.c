// SPDX-License-Identifier: MIT
/* moepager serve: an OpenAI-style HTTP server over a model, with continuous batching. */
#include <argp.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <moepager.h>

#include "cli.h"
#include "serve/backend.h"
#include "serve/http.h"

#define TICK_MS 200
#define MAX_LISTED 256

static struct serve_env {
	struct serve_local_config local;
	struct cli_engine_opts eng;
	struct http_config http;
	const char *listen;
	const char *port_file;
	const char *api_key_file;
	char *api_key_buf;		/* the key read from api_key_file */
	uint32_t grace_ms;
} env;

enum {
	OPT_NAME = 0x100, OPT_TOKENIZER, OPT_BUDGET, OPT_PREFETCH, OPT_EVICT, OPT_LISTEN,
	OPT_PORT_FILE, OPT_MAX_BATCH, OPT_MAX_QUEUE, OPT_KV_BUDGET, OPT_PREFILL_CHUNK,
	OPT_STEP_TOKENS, OPT_GRACE, OPT_MAX_BODY, OPT_MAX_CONNECTIONS, OPT_REQUEST_TIMEOUT,
	OPT_IDLE_TIMEOUT, OPT_ADAPTERS, OPT_ADAPTER_SLOTS, OPT_ADAPTER_ROWS, OPT_ADAPTERS_PADDED,
	OPT_ATTACH,
	OPT_CONSOLIDATE, OPT_EPOCH, OPT_WARM,
	OPT_MIXED, OPT_OWNED_PAGED, OPT_GROUP_MS, OPT_WARM_ROWS, OPT_GATHER_US, OPT_STREAM_US,
	OPT_SHARED_STORE, OPT_API_KEY, OPT_API_KEY_FILE,
};

static const char doc[] =
	"Serves a model over HTTP with OpenAI's completions API: POST /v1/completions\n"
	"(prompt as text through the model's tokenizer, or as token ids; max_tokens,\n"
	"temperature, top_p, top_k, seed, stop, stream as server-sent events), GET\n"
	"/v1/models, GET /health and GET /metrics (Prometheus text). Requests are\n"
	"decoded together (continuous batching) up to --max-batch sequences and\n"
	"--kv-budget bytes of KV cache; up to --max-queue more wait, in order; past\n"
	"that a request gets 503 with Retry-After. SIGTERM or SIGINT: new requests\n"
	"get 503, running ones have --grace-ms to finish, the rest end with an error.\n"
	"\n"
	"With --budget the experts are paged under it (docs/region.md), with\n"
	"--prefetch a policy that follows each request (docs/prefetch.md); without\n"
	"it every expert is read into memory first; with --attach SOCKET they come from\n"
	"a pager daemon's host tier, shared with every process attached to it (moepager\n"
	"pagerd). docs/serve.md has the details.\n"
	"\n"
	"With --adapters DIR every expert adapter (.mpa) in DIR is served as a model of\n"
	"its own name over the base (ExpertWeave, docs/adapters.md): a request's\n"
	"\"model\" picks the base or an adapter, and batches mix them. POST\n"
	"/v1/adapters {\"file\": \"x.mpa\"} loads one more from DIR, DELETE\n"
	"/v1/adapters/NAME unloads one (its running requests finish), GET /v1/adapters\n"
	"lists them with the memory they hold.\n"
	"\n"
	"With several --model and --consolidate MAP (from `moepager consolidate`, the\n"
	"models in its order) the variants are served together (Multi-MoE,\n"
	"docs/multi.md): a request's \"model\" picks one; at a position the map gives an\n"
	"owner, every model uses the owner's expert, held in memory; elsewhere each\n"
	"model pages its own under --budget. One model's dense weights are active at a\n"
	"time, swapped from memory when the queue's head needs another; with\n"
	"--mixed-batches every model's are in use and batches mix models. With\n"
	"--owned-paged the owners' experts are paged under --budget like the rest\n"
	"(one row serves every model at a shared position), not held outside it.\n"
	"Its prefetch policy is finemoe unless --prefetch (or $MOEPAGER_PREFETCH)\n"
	"says otherwise: each model's requests are predicted from its own\n"
	"trajectories (--shared-store: one store) and the rows of the models not\n"
	"running are evicted first.\n"
	"With --group-ms MS the active model's queued requests pass an older head of\n"
	"another model while it has waited under MS ms (fewer swaps; it is served\n"
	"within MS plus one batch).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager serve --model build/data/models/tiny-real.mpk\n"
	"  moepager serve --model mixtral-mini.mpk --budget 50% --prefetch finemoe \\\n"
	"      --listen 127.0.0.1:0 --port-file /tmp/port\n"
	"  curl -s localhost:8080/v1/completions -d '{\"prompt\": \"Hello\", \"max_tokens\": 20}'\n";

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0,
	  "The .mpk model (required); again for each other variant with --consolidate", 0 },
	{ "name", OPT_NAME, "ID", 0, "Model id clients ask for (default: the file's name)", 0 },
	{ "tokenizer", OPT_TOKENIZER, "FILE", 0,
	  "Tokenizer (default MODEL.tok when it exists; else prompts are token ids)", 0 },
	{ "budget", OPT_BUDGET, "B", 0, "Page the experts under this budget (8G, 40%)", 0 },
	{ "attach", OPT_ATTACH, "SOCKET", 0,
	  "Read the experts from the pager daemon on SOCKET (moepager pagerd)", 0 },
	{ "warm", OPT_WARM, NULL, 0,
	  "Before listening, map what the daemon holds (--attach) or read as many experts "
	  "as --budget holds", 0 },
	{ "epoch", OPT_EPOCH, "N", 0,
	  "The pool epoch this server joins at, shown in /metrics (docs/elastic.md)", 0 },
	{ "prefetch", OPT_PREFETCH, "POLICY", 0, "Prefetch policy when paged (default none; "
	  "with --consolidate finemoe)", 0 },
	{ "evict", OPT_EVICT, "POLICY", 0, "Eviction policy (default: the prefetch policy's)", 0 },
	{ "listen", OPT_LISTEN, "HOST:PORT", 0, "Address (default 127.0.0.1:8080; port 0: any)", 0 },
	{ "port-file", OPT_PORT_FILE, "FILE", 0, "Write the port listened on to FILE", 0 },
	{ "max-batch", OPT_MAX_BATCH, "N", 0, "Sequences decoded together (default 8)", 0 },
	{ "max-queue", OPT_MAX_QUEUE, "N", 0, "Requests waiting at most (default 64)", 0 },
	{ "kv-budget", OPT_KV_BUDGET, "SIZE", 0, "KV cache bytes of the running batch", 0 },
	{ "prefill-chunk", OPT_PREFILL_CHUNK, "N", 0, "Prompt tokens per sequence and step", 0 },
	{ "step-tokens", OPT_STEP_TOKENS, "N", 0, "Tokens per step at most (default 512)", 0 },
	{ "gather-us", OPT_GATHER_US, "US", 0,
	  "With the batch empty, a request waits while more come within US us (and a "
	  "quarter of a mean step) of the last, at most 4 x US in all, so a burst's "
	  "prefills share a step (default 500; 0: none)", 0 },
	{ "stream-interval-us", OPT_STREAM_US, "US", 0,
	  "Streams' tokens are sent at most once per US us, every stream's together (the "
	  "first and the last at once); those of the steps between go in one write "
	  "(default 1000; 0: every step)",
	  0 },
	{ "api-key", OPT_API_KEY, "KEY", 0,
	  "Serve only requests with 'Authorization: Bearer KEY' (GET /health is open to all; "
	  "the key shows in ps: prefer --api-key-file; default: $MOEPAGER_API_KEY, which "
	  "loadgen and the benches send)", 0 },
	{ "api-key-file", OPT_API_KEY_FILE, "FILE", 0, "--api-key, read from FILE's first line", 0 },
	{ "grace-ms", OPT_GRACE, "MS", 0, "Time running requests get at shutdown (10000)", 0 },
	{ "max-body", OPT_MAX_BODY, "SIZE", 0, "Largest request body (default 1M)", 0 },
	{ "max-connections", OPT_MAX_CONNECTIONS, "N", 0, "Open connections at most (256)", 0 },
	{ "request-timeout", OPT_REQUEST_TIMEOUT, "S", 0,
	  "Seconds a client has to send a request's headers, and again its body (10)", 0 },
	{ "idle-timeout", OPT_IDLE_TIMEOUT, "S", 0, "Seconds a silent connection stays open (15)", 0 },
	{ "adapters", OPT_ADAPTERS, "DIR", 0, "Serve the expert adapters (.mpa) in DIR too", 0 },
	{ "adapter-slots", OPT_ADAPTER_SLOTS, "N", 0, "Adapters loaded at once at most (32)", 0 },
	{ "adapter-rows", OPT_ADAPTER_ROWS, "E", 0,
	  "Experts an adapter may replace per layer (default: the most DIR's adapters do)", 0 },
	{ "adapters-padded", OPT_ADAPTERS_PADDED, NULL, 0,
	  "Hold every adapter's E rows in every layer (a baseline for benchmarks)", 0 },
	{ "warm-rows", OPT_WARM_ROWS, NULL, 0,
	  "Paged adapters: read a request's adapter rows all at once when it is admitted", 0 },
	{ "consolidate", OPT_CONSOLIDATE, "MAP", 0,
	  "Serve the --model variants together with this .mpc map (needs --budget)", 0 },
	{ "mixed-batches", OPT_MIXED, NULL, 0,
	  "With --consolidate: every model's dense weights in use, batches mix models, no "
	  "swaps", 0 },
	{ "owned-paged", OPT_OWNED_PAGED, NULL, 0,
	  "With --consolidate: the owned experts are paged under --budget, not held", 0 },
	{ "shared-store", OPT_SHARED_STORE, NULL, 0,
	  "With --consolidate: the prefetcher keeps one trajectory store for every model, not "
	  "one per model", 0 },
	{ "group-ms", OPT_GROUP_MS, "MS", 0,
	  "With --consolidate: the active model's requests may pass an older head of another "
	  "model for up to MS ms (default 0: FIFO)", 0 },
	{ 0 },
};

static int parse_listen(const char *s, struct http_config *h)
{
	static char host[64];
	const char *colon = strrchr(s, ':');
	uint32_t port;

	if (!colon || (size_t)(colon - s) >= sizeof(host) ||
	    cli_parse_u32("--listen", colon + 1, 0, 65535, &port))
		return -EINVAL;
	snprintf(host, sizeof(host), "%.*s", (int)(colon - s), s);
	h->host = host;
	h->port = (uint16_t)port;
	return 0;
}

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	struct mp_sched_config *sc = &env.local.sched;
	uint64_t size;

	switch (key) {
	case 'm':
		if (!env.local.model)
			env.local.model = arg;
		else if (env.local.n_more + 1 < MP_CONSOL_MAX_MODELS)
			env.local.more[env.local.n_more++] = arg;
		else
			argp_error(state, "at most %u --model", MP_CONSOL_MAX_MODELS);
		break;
	case OPT_CONSOLIDATE: env.local.consolidate = arg; break;
	case OPT_MIXED: env.local.mixed = true; break;
	case OPT_OWNED_PAGED: env.local.owned_paged = true; break;
	case OPT_SHARED_STORE: env.local.shared_store = true; break;
	case OPT_GROUP_MS:
		cli_opt_u64(state, "--group-ms", arg, 0, 600000, &size);
		sc->group_ns = size * 1000000;
		break;
	case OPT_GATHER_US:
		cli_opt_u64(state, "--gather-us", arg, 0, 100000, &size);
		sc->gather_ns = size * 1000;
		break;
	case OPT_STREAM_US:
		cli_opt_u32(state, "--stream-interval-us", arg, 0, 1000000,
			    &env.http.stream_interval_us);
		break;
	case OPT_NAME: env.local.name = arg; break;
	case OPT_TOKENIZER: env.local.tokenizer = arg; break;
	case OPT_BUDGET: env.local.budget = arg; break;
	case OPT_ATTACH: env.local.attach = arg; break;
	case OPT_WARM: env.local.warm = true; break;
	case OPT_EPOCH:
		cli_opt_u64(state, "--epoch", arg, 0, UINT64_MAX, &env.http.epoch);
		break;
	case OPT_PREFETCH: env.local.prefetch = arg; break;
	case OPT_EVICT: env.local.evict = arg; break;
	case OPT_LISTEN: env.listen = arg; break;
	case OPT_PORT_FILE: env.port_file = arg; break;
	case OPT_API_KEY: env.http.api_key = arg; break;
	case OPT_API_KEY_FILE: env.api_key_file = arg; break;
	case OPT_MAX_BATCH:
		cli_opt_u32(state, "--max-batch", arg, 1, 256, &sc->max_batch);
		break;
	case OPT_MAX_QUEUE:
		cli_opt_u32(state, "--max-queue", arg, 1, 1u << 20, &sc->max_queue);
		break;
	case OPT_KV_BUDGET:
		cli_opt_size(state, "--kv-budget", arg, &sc->kv_budget);
		break;
	case OPT_PREFILL_CHUNK:
		cli_opt_u32(state, "--prefill-chunk", arg, 1, 1u << 20, &sc->prefill_chunk);
		break;
	case OPT_STEP_TOKENS:
		cli_opt_u32(state, "--step-tokens", arg, 1, 1u << 20, &sc->step_tokens);
		break;
	case OPT_GRACE:
		cli_opt_u32(state, "--grace-ms", arg, 0, 3600000, &env.grace_ms);
		break;
	case OPT_MAX_BODY:
		cli_opt_size(state, "--max-body", arg, &size);
		if (size < 1024 || size > (1u << 30))
			argp_error(state, "--max-body must be in [1K, 1G]");
		env.http.max_body = (uint32_t)size;
		break;
	case OPT_MAX_CONNECTIONS:
		cli_opt_u32(state, "--max-connections", arg, 1, 65536, &env.http.max_connections);
		break;
	case OPT_REQUEST_TIMEOUT:
		cli_opt_u32(state, "--request-timeout", arg, 1, 3600, &env.http.header_timeout_s);
		env.http.body_timeout_s = env.http.header_timeout_s;
		break;
	case OPT_ADAPTERS: env.local.adapters = arg; break;
	case OPT_ADAPTERS_PADDED: env.local.adapters_padded = true; break;
	case OPT_WARM_ROWS: env.local.warm_rows = true; break;
	case OPT_ADAPTER_SLOTS:
		cli_opt_u32(state, "--adapter-slots", arg, 1, 4096, &env.local.adapter_slots);
		break;
	case OPT_ADAPTER_ROWS:
		cli_opt_u32(state, "--adapter-rows", arg, 1, 4096, &env.local.adapter_rows);
		break;
	case OPT_IDLE_TIMEOUT:
		cli_opt_u32(state, "--idle-timeout", arg, 1, 3600, &env.http.idle_timeout_s);
		break;
	case ARGP_KEY_INIT:
		state->child_inputs[0] = &env.eng;
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.local.model)
			argp_error(state, "--model FILE is required");
		if (parse_listen(env.listen ? env.listen : "127.0.0.1:8080", &env.http))
			argp_error(state, "--listen wants HOST:PORT, e.g. 127.0.0.1:8080");
		if ((env.local.prefetch || env.local.evict) && !env.local.budget)
			argp_error(state, "--prefetch and --evict need --budget (paged experts)");
		if (env.local.attach && env.local.budget)
			argp_error(state, "--attach and --budget exclude each other (the daemon's "
				   "budget holds)");
		if (env.local.mixed && !env.local.consolidate)
			argp_error(state, "--mixed-batches needs --consolidate MAP");
		if (env.local.owned_paged && !env.local.consolidate)
			argp_error(state, "--owned-paged needs --consolidate MAP");
		if (sc->group_ns && (!env.local.consolidate || env.local.mixed))
			argp_error(state, "--group-ms needs --consolidate MAP and no --mixed-batches");
		if (env.http.api_key && env.api_key_file)
			argp_error(state, "--api-key or --api-key-file, not both");
		if (env.local.n_more && !env.local.consolidate)
			argp_error(state, "several --model need --consolidate MAP");
		if (env.local.consolidate && (!env.local.budget || env.local.adapters))
			argp_error(state, "--consolidate needs --budget (unowned experts are paged) "
				   "and no --adapters");
		/* What the consolidated server pages is predicted per model (docs/multi.md). */
		if (env.local.consolidate && !env.local.prefetch && !getenv("MOEPAGER_PREFETCH"))
			env.local.prefetch = "finemoe";
		if ((env.local.adapter_slots || env.local.adapter_rows ||
		     env.local.adapters_padded) && !env.local.adapters)
			argp_error(state, "--adapter-slots, --adapter-rows and --adapters-padded "
				   "need --adapters DIR");
		if (env.local.warm_rows && (!env.local.adapters || !env.local.budget ||
					    env.local.adapters_padded))
			argp_error(state, "--warm-rows needs --adapters DIR paged under --budget "
				   "(not --adapters-padded)");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
static const struct argp argp = { opts, parse_arg, NULL, doc, children, NULL, NULL };

/* Writes the port atomically (a temporary file renamed), so a waiting test reads it whole. */
static int write_port(const char *path, uint16_t port)
{
	char tmp[4096];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f || fprintf(f, "%u\n", port) < 0 || fclose(f) || rename(tmp, path)) {
		int err = -errno;

		return cli_error(err, "writing %s: %s", path, strerror(-err));
	}
	return 0;
}

/* Waits for SIGTERM/SIGINT, ticking the janitor. Returns the signal. */
static int wait_signal(struct http_server *h, const sigset_t *set)
{
	struct timespec tick = { 0, TICK_MS * 1000000L };

	for (;;) {
		int sig = sigtimedwait(set, NULL, &tick);

		if (sig > 0)
			return sig;
		http_tick(h);
	}
}

/*
 * The key must go into a header as it is: printable ASCII, no spaces. A
 * file's key is its first line. Returns 0, or -EINVAL after saying why.
 */
static int check_api_key(void)
{
	const char *k, *from = env.api_key_file ? env.api_key_file : "--api-key";
	size_t len;

	if (env.api_key_file) {
		if (cli_read_file(env.api_key_file, &env.api_key_buf, &len))
			return -EINVAL;
		env.api_key_buf[strcspn(env.api_key_buf, "\r\n")] = 0;
		env.http.api_key = env.api_key_buf;
	} else if (!env.http.api_key) {
		k = getenv("MOEPAGER_API_KEY");
		env.http.api_key = k && *k ? k : NULL;
		from = "$MOEPAGER_API_KEY";
	}
	k = env.http.api_key;
	for (len = 0; k && k[len]; len++) {
		if (k[len] < 0x21 || k[len] > 0x7e)
			return cli_error(-EINVAL, "%s: the API key has a byte 0x%02x at %zu: "
					 "printable ASCII without spaces only", from,
					 (unsigned char)k[len], len);
	}
	if (k && len < 8)
		return cli_error(-EINVAL, "%s: the API key has %zu characters; 8 at least", from,
				 len);
	return 0;
}

/* Serves until SIGTERM or SIGINT: 0, or 1 after saying what failed. */
static int serve(uint64_t t0)
{
	static char names[1 + MAX_LISTED][SERVE_NAME_MAX];
	struct serve_backend *b;
	struct http_server *h;
	uint32_t cut, n;
	sigset_t set;
	int err;

	env.local.engine = env.eng.engine;
	env.local.threads = env.eng.threads;
	/* Every thread created from here on inherits the mask: signals come to sigtimedwait(). */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	err = serve_local_open(&env.local, &b);
	if (err) {
		cli_fail(err, "%s", env.local.model);
		return 1;
	}
	env.http.ready_s = (double)(cli_now_ns() - t0) / 1e9;
	env.http.warm_s = *env.local.warm_s;
	err = http_start(&env.http, b, &h);
	if (err) {
		b->ops->close(b);
		return 1;
	}
	n = b->ops->list(b, names, 1 + MAX_LISTED);
	printf("moepager serve: model %s at http://%s:%u/v1", names[0], env.http.host,
	       http_port(h));
	if (n > 1)
		printf(" (and %u adapter%s)", n - 1, n > 2 ? "s" : "");
	if (env.local.warm)
		printf(", %u experts warmed in %.3f s", *env.local.warmed, *env.local.warm_s);
	printf(", ready in %.3f s, epoch %llu%s\n", env.http.ready_s,
	       (unsigned long long)env.http.epoch, env.http.api_key ? ", API key required" : "");
	fflush(stdout);
	if (env.port_file && write_port(env.port_file, http_port(h))) {
		http_stop(h, 0);
		return 1;
	}
	err = wait_signal(h, &set);
	cli_say("%s: draining (up to %u ms)", strsignal(err),
		env.grace_ms);
	cut = http_stop(h, env.grace_ms);
	cli_say("stopped; %u request(s) cut short", cut);
	return 0;
}

int cmd_serve(int argc, char **argv)
{
	uint64_t t0 = cli_now_ns();
	uint32_t warmed = 0;
	double warm_s = 0;
	int ret;

	memset(&env, 0, sizeof(env));
	env.local.warmed = &warmed;
	env.local.warm_s = &warm_s;
	env.grace_ms = 10000;
	env.local.sched.gather_ns = 500000;
	env.http.stream_interval_us = 1000;
	if (argp_parse(&argp, argc, argv, 0, NULL, NULL) || check_api_key())
		ret = 1;
	else
		ret = serve(t0);
	free(env.api_key_buf);
	return ret;
}
