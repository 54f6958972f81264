// SPDX-License-Identifier: MIT
/*
 * moepager bench-serve: what serving costs per step. The same requests are
 * decoded by the runner alone (no HTTP, no scheduler) and through a
 * `moepager serve` child driven by C concurrent streaming clients; the
 * overhead is the served step period, as the clients see it, less the
 * runner's own step time at the same batch size.
 */
#include <argp.h>
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <moepager.h>

#include "cli.h"
#include "loadgen/loadgen.h"

#define MAX_CONC 8
#define SB_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SB_MAX(a, b) ((a) > (b) ? (a) : (b))
#define MAX_REPEAT 15

static struct sb_env {
	const char *model;
	struct cli_engine_opts eng;
	uint32_t conc[MAX_CONC];
	uint32_t nconc, max_conc;
	uint32_t tokens, prompt, repeat, rounds;
	/* The server's --gather-us and --stream-interval-us; NULL: its defaults. */
	char *gather, *stream;
	const char *server_exe;		/* NULL: this binary */
	bool clients_idle;		/* the clients at SCHED_IDLE once a round's requests are sent */
	bool json;
} env;

enum { OPT_CONC = 0x100, OPT_TOKENS, OPT_PROMPT, OPT_REPEAT, OPT_ROUNDS, OPT_JSON, OPT_GATHER,
       OPT_STREAM, OPT_CLIENTS_IDLE, OPT_SERVER };

static const char doc[] =
	"Measures the HTTP and scheduling overhead of `moepager serve` per step. For\n"
	"each concurrency C and repeat, the same C requests (--prompt random token ids\n"
	"each, --tokens greedy tokens, the end-of-sequence token ignored) are decoded\n"
	"(1) by the runner alone: the C prompts prefilled in one step, then --tokens - 1\n"
	"steps of the C sequences decoding together, each mp_runner_batch() call timed\n"
	"(the argmax between them is not); and (2) through a `moepager serve` child\n"
	"(resident; the same engine, threads and build) by C streaming clients (libcurl,\n"
	"this process) sent at once, timed from the first request sent to the last\n"
	"stream's [DONE]. A run is --rounds such rounds, one after the other, each\n"
	"with its own prompts. Per step is per the runner's steps alone (--tokens a\n"
	"round): overhead_us = (served - alone) / steps, overhead_share = (served -\n"
	"alone) / alone. Everything serving adds counts: the HTTP requests and their parsing,\n"
	"the scheduler (admission, sampling, text, events), the HTTP thread (wake-ups,\n"
	"send), the loopback sockets and the clients' own CPU on the same machine.\n"
	"The server's /metrics give where it goes (server: its steps, mean batch, and\n"
	"per step its runner time and the scheduler's and HTTP thread's time), and\n"
	"client_cpu_us is the clients' CPU time per step (this process's thread).\n"
	"The clients share the machine's cores with the server, which a deployment's\n"
	"remote clients do not: with --clients-idle each round's requests are sent at\n"
	"once and the clients then run at SCHED_IDLE (only on a core nothing else\n"
	"wants), so the served time is mostly the server's own; server_cpu_share is\n"
	"the server's scheduler and HTTP thread CPU per step over the step alone.\n"
	"Figures are medians over --repeat runs, alone and served alternating, after\n"
	"a warm-up run of each (the sequences' KV caches touched, the server's pooled).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager bench-serve --model build/data/models/tiny-real.mpk --concurrency 1,4,8 --json\n";

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0, "The .mpk model (required; resident)", 0 },
	{ "concurrency", OPT_CONC, "C[,C...]", 0, "Concurrent requests (default 1,4,8; at most 8 "
	  "values)", 0 },
	{ "tokens", OPT_TOKENS, "N", 0, "Tokens each request generates (default 128)", 0 },
	{ "prompt", OPT_PROMPT, "N", 0, "Prompt tokens of each request (default 16, at most 64)", 0 },
	{ "repeat", OPT_REPEAT, "N", 0, "Runs per concurrency (default 3)", 0 },
	{ "rounds", OPT_ROUNDS, "N", 0, "Rounds of C requests in a run, one after the other "
	  "(default 10)", 0 },
	{ "json", OPT_JSON, NULL, 0, "Print one JSON object", 0 },
	{ "gather-us", OPT_GATHER, "US", 0, "The server's --gather-us (default: serve's)", 0 },
	{ "stream-interval-us", OPT_STREAM, "US", 0,
	  "The server's --stream-interval-us (default: serve's)", 0 },
	{ "clients-idle", OPT_CLIENTS_IDLE, NULL, 0, "Once a round's requests are sent, run the "
	  "clients at SCHED_IDLE (default: as the server)", 0 },
	{ "server", OPT_SERVER, "EXE", 0, "The moepager binary that serves (default: this one; "
	  "another build's, to compare them under the same clients)", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'm': env.model = arg; break;
	case OPT_CONC:
		cli_opt_u32_list(state, "--concurrency", arg, 1, 64, env.conc, MAX_CONC, &env.nconc);
		break;
	case OPT_TOKENS:
		cli_opt_u32(state, "--tokens", arg, 8, 1u << 16, &env.tokens);
		break;
	case OPT_PROMPT:
		cli_opt_u32(state, "--prompt", arg, 1, 64, &env.prompt);
		break;
	case OPT_REPEAT:
		cli_opt_u32(state, "--repeat", arg, 1, MAX_REPEAT, &env.repeat);
		break;
	case OPT_ROUNDS:
		cli_opt_u32(state, "--rounds", arg, 1, 1000, &env.rounds);
		break;
	case OPT_JSON: env.json = true; break;
	case OPT_CLIENTS_IDLE: env.clients_idle = true; break;
	case OPT_SERVER:
		if (access(arg, X_OK))
			argp_error(state, "--server: '%s': %s", arg, strerror(errno));
		env.server_exe = arg;
		break;
	case OPT_GATHER:
	case OPT_STREAM: {
		uint32_t us;

		cli_opt_u32(state, key == OPT_GATHER ? "--gather-us" : "--stream-interval-us", arg,
			    0, key == OPT_GATHER ? 100000 : 1000000, &us);
		*(key == OPT_GATHER ? &env.gather : &env.stream) = arg;
		break;
	}
	case ARGP_KEY_INIT:
		state->child_inputs[0] = &env.eng;
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.model)
			argp_error(state, "--model FILE is required");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
static const struct argp argp = { opts, parse_arg, NULL, doc, children, NULL, NULL };

/* Request i's prompt of run rep: the same ids for the runner alone and the server. */
static void prompt_of(uint32_t i, uint32_t rep, uint32_t vocab, uint32_t *ids)
{
	for (uint32_t t = 0; t < env.prompt; t++)
		ids[t] = (i * 7919u + rep * 104729u + t * 613u + 1) % vocab;
}

/*
 * The runner alone
 */

struct alone {
	struct mp_store *store;
	struct mp_engine *engine;
	struct mp_resident *resident;
	struct mp_runner *runner;
	struct mp_seq *seq[64];
	uint32_t vocab, context;
};

static int alone_open(struct alone *a)
{
	struct mp_engine_config ec = { .threads = env.eng.threads };
	struct mp_runner_config rc = { 0 };
	int err;

	err = mp_store_open(env.model, &a->store);
	if (!err)
		err = mp_engine_open(env.eng.engine ? env.eng.engine : "ref", &ec, &a->engine);
	if (!err)
		err = mp_resident_open(a->store, NULL, NULL, &a->resident);
	/* As the served backend keeps them, so alone and served run the same kernels. */
	if (!err)
		err = cli_resident_pack(a->resident, a->engine, &rc.flags);
	rc.source = mp_resident_source_ops();
	rc.source_ctx = a->resident;
	rc.engine = a->engine;
	if (!err)
		err = mp_runner_open(a->store, &rc, &a->runner);
	if (!err) {
		a->vocab = mp_store_geometry(a->store)->vocab;
		a->context = mp_store_geometry(a->store)->max_seq;
	}
	/* Sequences of the whole context, reused run after run, as the scheduler's are. */
	for (uint32_t i = 0; i < env.max_conc && !err; i++)
		err = mp_seq_open(a->runner, &(struct mp_seq_config){ .request = i + 1,
				  .max_seq = a->context }, &a->seq[i]);
	return err;
}

static void alone_close(struct alone *a)
{
	for (uint32_t i = 0; i < env.max_conc; i++)
		mp_seq_close(a->seq[i]);
	mp_runner_close(a->runner);
	mp_resident_close(a->resident);
	mp_engine_close(a->engine);
	mp_store_close(a->store);
}

/*
 * C prompts prefilled in one step, then tokens - 1 decode steps of C, greedy;
 * *us: the time in the runner (the argmax is left out: served, it is the
 * scheduler's, and counts as overhead).
 */
static int alone_run(struct alone *a, uint32_t C, uint32_t rep, double *us)
{
	struct mp_batch_item items[64];
	uint32_t prompts[64][64], next[64];
	uint64_t ns = 0;
	int err = 0;

	for (uint32_t i = 0; i < C && !err; i++) {
		prompt_of(i, rep, a->vocab, prompts[i]);
		err = mp_seq_reuse(a->seq[i], &(struct mp_seq_config){ .request = i + 1 });
		items[i] = (struct mp_batch_item){ a->seq[i], prompts[i], env.prompt,
						   MP_BATCH_PREFILL };
	}
	for (uint32_t s = 0; s < env.tokens && !err; s++) {
		uint64_t t0;

		for (uint32_t i = 0; i < C && s; i++) {
			next[i] = mp_logits_argmax(mp_seq_logits(a->seq[i]), a->vocab);
			items[i] = (struct mp_batch_item){ a->seq[i], &next[i], 1, MP_BATCH_DECODE };
		}
		t0 = cli_now_ns();
		err = mp_runner_batch(a->runner, items, C);
		ns += cli_now_ns() - t0;
	}
	if (err)
		cli_fail(err, "the runner alone");
	*us = (double)ns / 1e3;
	return err;
}

/*
 * The server and its clients
 */

struct server {
	pid_t pid;
	char dir[48];		/* mkdtemp(): the port file's, not a guessable /tmp name */
	char port_file[64];
	char url[64];
};

static int server_start(struct server *s, uint32_t threads)
{
	char th[16], mb[16];
	/* th and mb are filled in below; the optional arguments go after the 13 fixed ones. */
	const char *args[20] = { "serve", "--model", env.model, "--listen", "127.0.0.1:0",
		"--port-file", s->port_file, "--threads", th, "--max-batch", mb, "--engine",
		env.eng.engine ? env.eng.engine : "ref" };
	uint32_t na = 13;
	unsigned port;
	int err;

	snprintf(s->dir, sizeof(s->dir), "/tmp/moepager-bench-serve.XXXXXX");
	if (!mkdtemp(s->dir)) {
		err = -errno;
		cli_error(0, "mkdtemp %s: %s", s->dir, strerror(-err));
		s->dir[0] = 0;
		return err;
	}
	snprintf(s->port_file, sizeof(s->port_file), "%s/port", s->dir);
	snprintf(th, sizeof(th), "%u", threads);
	snprintf(mb, sizeof(mb), "%u", SB_MAX(env.max_conc, 8u));
	if (env.gather) {
		args[na++] = "--gather-us";
		args[na++] = env.gather;
	}
	if (env.stream) {
		args[na++] = "--stream-interval-us";
		args[na++] = env.stream;
	}
	s->pid = cli_spawn(env.server_exe, args, STDERR_FILENO);
	if (s->pid < 0) {
		err = s->pid;
		s->pid = 0;
		return cli_error(err, "starting the server: %s", strerror(-err));
	}
	err = cli_serve_wait_port(s->pid, s->port_file, 120000, &port);
	if (err) {
		s->pid = 0;
		return err;
	}
	snprintf(s->url, sizeof(s->url), "http://127.0.0.1:%u", port);
	return 0;
}

/* SIGTERM; true when it exited 0. */
static bool server_stop(struct server *s)
{
	int status = s->pid > 0 ? cli_child_stop(s->pid) : -ECHILD;

	s->pid = 0;
	if (s->dir[0]) {
		unlink(s->port_file);
		rmdir(s->dir);
	}
	return status >= 0 && WIFEXITED(status) && !WEXITSTATUS(status);
}

/* A stream: its request's body, and the stream's last bytes (it ends with [DONE]). */
struct stream {
	CURL *h;
	char *body;
	char tail[16];
	size_t ntail;
	bool done;
	double t_end;		/* us, cli_now_ns(): the stream's last bytes */
};

/* No JSON is parsed, to take as little of the machine's CPU as a client can. */
static size_t on_data(char *data, size_t size, size_t nmemb, void *arg)
{
	static const char done[] = "data: [DONE]\n\n";
	struct stream *st = arg;
	size_t len = size * nmemb, keep = SB_MIN(len, sizeof(st->tail) - 1);

	st->t_end = (double)cli_now_ns() / 1e3;
	if (st->ntail + keep > sizeof(st->tail) - 1) {
		size_t drop = st->ntail + keep - (sizeof(st->tail) - 1);

		memmove(st->tail, st->tail + drop, st->ntail - drop);
		st->ntail -= drop;
	}
	memcpy(st->tail + st->ntail, data + len - keep, keep);
	st->ntail += keep;
	st->done = st->ntail >= sizeof(done) - 1 &&
		   !memcmp(st->tail + st->ntail - (sizeof(done) - 1), done, sizeof(done) - 1);
	return len;
}

static int stream_start(CURLM *m, struct stream *st, const char *url, const uint32_t *ids,
			struct curl_slist *hdrs)
{
	json_t *p = json_array(), *j;

	for (uint32_t k = 0; p && k < env.prompt; k++)
		json_array_append_new(p, json_integer(ids[k]));
	j = json_pack("{s:o, s:i, s:i, s:b, s:b}", "prompt", p, "max_tokens", (int)env.tokens,
		      "temperature", 0, "stream", 1, "ignore_eos", 1);
	st->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	st->h = curl_easy_init();
	if (!st->body || !st->h)
		return -ENOMEM;
	curl_easy_setopt(st->h, CURLOPT_URL, url);
	curl_easy_setopt(st->h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(st->h, CURLOPT_POSTFIELDS, st->body);
	curl_easy_setopt(st->h, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(st->h, CURLOPT_WRITEDATA, st);
	curl_easy_setopt(st->h, CURLOPT_NOSIGNAL, 1L);
	lg_auth(st->h);
	curl_easy_setopt(st->h, CURLOPT_TCP_NODELAY, 1L);
	/* A server that stalls fails the run instead of hanging it. */
	curl_easy_setopt(st->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(st->h, CURLOPT_LOW_SPEED_TIME, 60L);
	curl_multi_add_handle(m, st->h);
	return 0;
}

/* Whether every stream's request body has gone (the server may have them all). */
static bool sent_all(const struct stream *st, uint32_t C)
{
	for (uint32_t i = 0; i < C; i++) {
		curl_off_t up = 0;

		curl_easy_getinfo(st[i].h, CURLINFO_SIZE_UPLOAD_T, &up);
		if (up < (curl_off_t)strlen(st[i].body))
			return false;
	}
	return true;
}

/*
 * --clients-idle: this thread (one of its own per round) at SCHED_IDLE once
 * the round's requests are sent, as remote clients send theirs at once and
 * then take none of the server's cores. 0 or -errno.
 */
static int go_idle(void)
{
	int err = sched_setscheduler(0, SCHED_IDLE, &(struct sched_param){ 0 }) ? -errno : 0;

	if (err)
		cli_error(0, "--clients-idle: %s", strerror(-err));
	return err;
}

/*
 * C streams sent at once; *us: from sending them to the last one's [DONE].
 * With --clients-idle, the rest of the round runs at SCHED_IDLE once they
 * are sent (on a thread of the round's own).
 */
static int served_run(const char *base, uint32_t C, uint32_t rep, uint32_t vocab, double *us)
{
	struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
	struct stream st[64] = { 0 };
	CURLM *m = curl_multi_init();
	double t0 = 0, end = 0;
	char url[128];
	int running = 1, err = m && hdrs ? 0 : -ENOMEM;
	bool idle = !env.clients_idle;

	snprintf(url, sizeof(url), "%s/v1/completions", base);
	for (uint32_t i = 0; i < C && !err; i++) {
		uint32_t ids[64];

		prompt_of(i, rep, vocab, ids);
		if (!i)
			t0 = (double)cli_now_ns() / 1e3;
		err = stream_start(m, &st[i], url, ids, hdrs);
	}
	while (!err && running) {
		curl_multi_perform(m, &running);
		if (!idle && sent_all(st, C)) {
			err = go_idle();
			idle = true;
		}
		if (running && !err)
			curl_multi_poll(m, NULL, 0, 100, NULL);
	}
	if (!err && !idle)
		err = cli_error(-EIO, "--clients-idle: the requests were never all sent");
	for (uint32_t i = 0; i < C; i++) {
		long status = 0;

		if (st[i].h)
			curl_easy_getinfo(st[i].h, CURLINFO_RESPONSE_CODE, &status);
		if (!err && (status != 200 || !st[i].done))
			err = cli_error(-EIO, "stream %u of %u failed (HTTP %ld%s)",
				i, C, status, st[i].done ? "" : ", no [DONE]");
		end = SB_MAX(end, st[i].t_end);
		if (st[i].h)
			curl_multi_remove_handle(m, st[i].h);
		curl_easy_cleanup(st[i].h);
		free(st[i].body);
	}
	curl_multi_cleanup(m);
	curl_slist_free_all(hdrs);
	*us = end - t0;
	return err;
}

/*
 * The runs and the report
 */

struct one {
	double alone_us, served_us;	/* the whole run's */
	double client_cpu_us;		/* this thread's CPU while served: the clients' */
	struct lg_metrics before, after;
};

/* This thread's CPU time (user + system): the clients run on it. */
static double thread_cpu_us(void)
{
	return (double)cli_clock_ns(CLOCK_THREAD_CPUTIME_ID) / 1e3;
}

/* The server's counter at off, per step of the run, in us. */
static double per_step(const struct one *o, size_t off)
{
	double steps = o->after.steps - o->before.steps;
	double a = *(const double *)((const char *)&o->after + off);
	double b = *(const double *)((const char *)&o->before + off);

	return steps > 0 ? (a - b) / steps * 1e6 : 0;
}

#define SRV(field) offsetof(struct lg_metrics, field)

static json_t *run_json(const struct one *o)
{
	double steps = o->after.steps - o->before.steps;
	double bc = o->after.batch_count - o->before.batch_count;
	double gathers = o->after.gathers - o->before.gathers;

	double n = (double)env.tokens * env.rounds;	/* the runner's steps alone */

	/* The server's own threads' CPU beside the runner's, per step. */
	double cpu = per_step(o, SRV(sched_cpu_s)) + per_step(o, SRV(http_thread_cpu_s));

	return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
			 "s:f}}",
			 "client_cpu_us", o->client_cpu_us / n,
			 "alone_step_us", o->alone_us / n,
			 "served_step_us", o->served_us / n,
			 "overhead_us", (o->served_us - o->alone_us) / n,
			 "overhead_share", (o->served_us - o->alone_us) / o->alone_us,
			 "server_cpu_share", cpu / (o->alone_us / n),
			 "server", "steps", steps,
			 "mean_batch", bc > 0 ? (o->after.batch_sum - o->before.batch_sum) / bc : 0,
			 "step_us", per_step(o, SRV(step_s)),
			 "sched_wall_us", per_step(o, SRV(sched_s)),
			 "sched_cpu_us", per_step(o, SRV(sched_cpu_s)),
			 "http_thread_cpu_us", per_step(o, SRV(http_thread_cpu_s)),
			 "resumes_per_step", steps > 0 ? (o->after.resumes - o->before.resumes) /
							 steps : 0,
			 "gathers", gathers,
			 "gather_us", gathers > 0 ? (o->after.gather_s - o->before.gather_s) /
						    gathers * 1e6 : 0);
}

/* Medians over the runs of each figure of run_json(). */
static json_t *result_json(uint32_t C, const struct one *runs, uint32_t n)
{
	static const char *const top[] = { "alone_step_us", "served_step_us", "overhead_us",
					   "overhead_share", "server_cpu_share", "client_cpu_us" };
	static const char *const srv[] = { "steps", "mean_batch", "step_us", "sched_wall_us",
					   "sched_cpu_us", "http_thread_cpu_us", "resumes_per_step",
					   "gathers", "gather_us" };
	json_t *rj = json_array(), *o = json_pack("{s:i}", "concurrency", (int)C);
	json_t *so = json_object();
	double v[MAX_REPEAT];

	for (uint32_t i = 0; i < n; i++)
		json_array_append_new(rj, run_json(&runs[i]));
	for (size_t k = 0; k < sizeof(top) / sizeof(top[0]); k++) {
		for (uint32_t i = 0; i < n; i++)
			v[i] = json_real_value(json_object_get(json_array_get(rj, i), top[k]));
		json_object_set_new(o, top[k], json_real(cli_median(v, n)));
	}
	for (size_t k = 0; k < sizeof(srv) / sizeof(srv[0]); k++) {
		for (uint32_t i = 0; i < n; i++)
			v[i] = json_real_value(json_object_get(json_object_get(
				json_array_get(rj, i), "server"), srv[k]));
		json_object_set_new(so, srv[k], json_real(cli_median(v, n)));
	}
	json_object_set_new(o, "server", so);
	json_object_set_new(o, "runs", rj);
	return o;
}

/* A served round (round UINT32_MAX: the warm-up's), on the clients' thread. */
struct served {
	const char *url;
	uint32_t C, vocab, round;
	double us, cpu_us;	/* the round's time and the clients' CPU time */
	int err;
};

static void *served_round(void *arg)
{
	struct served *sv = arg;

	sv->cpu_us = -thread_cpu_us();
	sv->err = served_run(sv->url, sv->C, sv->round, sv->vocab, &sv->us);
	sv->cpu_us += thread_cpu_us();
	return NULL;
}

/* Runs a round here, or on a fresh thread with --clients-idle (no policy to restore). */
static int serve_round(struct served *sv, uint32_t round)
{
	pthread_t t;
	int err;

	sv->round = round;
	sv->us = sv->cpu_us = 0;
	if (!env.clients_idle) {
		served_round(sv);
		return sv->err;
	}
	err = pthread_create(&t, NULL, served_round, sv);
	if (err)
		return cli_error(-err, "the clients' thread: %s", strerror(err));
	pthread_join(t, NULL);
	return sv->err;
}

/* One concurrency: a warm-up of each, then repeat runs alternating alone and served. */
static int measure(struct alone *a, struct server *s, uint32_t C, json_t *results)
{
	struct one runs[MAX_REPEAT] = { 0 };
	struct served sv = { .url = s->url, .C = C, .vocab = a->vocab };
	double us;
	int err = alone_run(a, C, UINT32_MAX, &us);

	if (!err)
		err = serve_round(&sv, UINT32_MAX);
	for (uint32_t r = 0; r < env.repeat && !err; r++) {
		struct one *o = &runs[r];

		for (uint32_t k = 0; k < env.rounds && !err; k++) {
			err = alone_run(a, C, r * env.rounds + k, &us);
			o->alone_us += us;
		}
		lg_scrape(s->url, &o->before);
		for (uint32_t k = 0; k < env.rounds && !err; k++) {
			err = serve_round(&sv, r * env.rounds + k);
			o->served_us += sv.us;
			o->client_cpu_us += sv.cpu_us;
		}
		lg_scrape(s->url, &o->after);
		if (!err && (!o->before.ok || !o->after.ok))
			err = cli_error(-EIO, "no /metrics from the server");
	}
	if (err)
		return err;
	json_array_append_new(results, result_json(C, runs, env.repeat));
	if (!env.json) {
		json_t *last = json_array_get(results, json_array_size(results) - 1);

		printf("C %2u: alone %8.1f us/step, served %8.1f, overhead %7.1f us (%.2f %%)\n",
		       C, json_real_value(json_object_get(last, "alone_step_us")),
		       json_real_value(json_object_get(last, "served_step_us")),
		       json_real_value(json_object_get(last, "overhead_us")),
		       100 * json_real_value(json_object_get(last, "overhead_share")));
	}
	return 0;
}

int cmd_servebench(int argc, char **argv)
{
	struct alone a = { 0 };
	struct server s = { 0 };
	json_t *results = json_array();
	bool clean = false;
	int err;

	memset(&env, 0, sizeof(env));
	env.tokens = 128;
	env.prompt = 16;
	env.repeat = 3;
	env.rounds = 10;
	if (argp_parse(&argp, argc, argv, 0, NULL, NULL))
		return 1;
	if (!env.nconc)
		cli_parse_u32_list("--concurrency", "1,4,8", 1, 64, env.conc, MAX_CONC, &env.nconc);
	for (uint32_t i = 0; i < env.nconc; i++)
		env.max_conc = SB_MAX(env.max_conc, env.conc[i]);
	err = results ? alone_open(&a) : -ENOMEM;
	if (err)
		cli_fail(err, NULL);
	else if (env.prompt + env.tokens > a.context)
		err = cli_error(-EINVAL, "--prompt + --tokens exceed the context of %u", a.context);
	if (!err)
		err = server_start(&s, a.engine->threads);
	for (uint32_t i = 0; i < env.nconc && !err; i++)
		err = measure(&a, &s, env.conc[i], results);
	clean = server_stop(&s);
	if (!err && env.json) {
		json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:b, s:o}", "model",
				      env.model, "clients", env.clients_idle ? "idle" : "normal",
				      "engine", env.eng.engine ? env.eng.engine : "ref",
				      "threads", (int)a.engine->threads, "tokens", (int)env.tokens,
				      "prompt", (int)env.prompt, "repeat", (int)env.repeat, "rounds",
				      (int)env.rounds, "server_exit_clean", clean, "results", results);

		results = NULL;
		json_dumpf(o, stdout, JSON_INDENT(1));
		putchar('\n');
		json_decref(o);
	}
	json_decref(results);
	alone_close(&a);
	return err ? 1 : 0;
}
