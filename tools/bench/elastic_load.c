// SPDX-License-Identifier: MIT
/*
 * moepager bench-elastic --load: engine processes (`moepager serve`) added
 * and removed while loadgen's Poisson load runs over them through an epoch
 * pool file (docs/elastic.md). Per setup: scale times, downtime, failed
 * requests, peak memory (the PSS of every process, sampled), bytes read from
 * disk by the scaling, and throughput and SLO attainment before, during and
 * after the change.
 */
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <moepager.h>

#include "bench/elastic.h"
#include "cli.h"
#include "loadgen/loadgen.h"

enum setup_kind { SHARED, SECOND_COPY, COLD_RESTART, NKINDS };
static const char *const kind_name[NKINDS] = { "shared", "second_copy", "cold_restart" };

#define MAX_PROCS 4
#define SAMPLE_MS 200

static double now_s(void)
{
	return (double)cli_now_ns() / 1e9;
}

static void sleep_until(double t)
{
	double d = t - now_s();

	if (d > 0) {
		struct timespec ts = { (time_t)d, (long)((d - (double)(time_t)d) * 1e9) };

		nanosleep(&ts, NULL);
	}
}

/* Bytes this process caused to be read from storage (O_DIRECT included, page-cache hits not). */
static uint64_t disk_read_of(pid_t pid)
{
	return eb_proc_number(pid, "io", "read_bytes: %llu");
}

/*
 * The memory sampler: the sum of the PSS of the live processes every
 * SAMPLE_MS (memfd pages counted once however many map them).
 */
struct sampler {
	pthread_mutex_t lock;
	pid_t pid[MAX_PROCS];
	uint64_t peak, last;
	bool stop;
	pthread_t th;
};

static uint64_t sample(struct sampler *s)
{
	uint64_t sum = 0;

	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < MAX_PROCS; i++)
		if (s->pid[i] > 0)
			sum += eb_memory_of(s->pid[i]);
	s->last = sum;
	if (sum > s->peak)
		s->peak = sum;
	pthread_mutex_unlock(&s->lock);
	return sum;
}

static void *sampler_main(void *arg)
{
	struct sampler *s = arg;
	struct timespec ts = { 0, SAMPLE_MS * 1000000L };

	for (;;) {
		bool stop;

		pthread_mutex_lock(&s->lock);
		stop = s->stop;
		pthread_mutex_unlock(&s->lock);
		if (stop)
			return NULL;
		sample(s);
		nanosleep(&ts, NULL);
	}
}

static void sampler_set(struct sampler *s, int slot, pid_t pid)
{
	pthread_mutex_lock(&s->lock);
	s->pid[slot] = pid;
	pthread_mutex_unlock(&s->lock);
}

/*
 * Servers and the pool
 */

struct server {
	pid_t pid;
	char port_file[96];
	char url[64];
	double t_spawn, t_ready;
};

/* Starts `moepager serve` (this binary): attached to sock, else paged under the budget. */
static int server_spawn(const struct el_config *c, const char *dir, const char *name,
			const char *sock, uint64_t epoch, struct server *s)
{
	char budget[32], threads[16], ep[24];

	snprintf(s->port_file, sizeof(s->port_file), "%s/%s.port", dir, name);
	snprintf(budget, sizeof(budget), "%llu", (unsigned long long)c->budget);
	snprintf(threads, sizeof(threads), "%u", c->threads);
	snprintf(ep, sizeof(ep), "%llu", (unsigned long long)epoch);
	unlink(s->port_file);
	s->t_spawn = now_s();
	s->pid = cli_spawn_self((const char *[]){ "serve", "--model", c->model, "--listen",
		"127.0.0.1:0", "--port-file", s->port_file, "--warm", "--epoch", ep,
		"--grace-ms", "600000", "--threads", threads, "--max-batch", "8",
		sock ? "--attach" : "--budget", sock ? sock : budget, NULL }, STDERR_FILENO);
	if (s->pid < 0) {
		int err = s->pid;

		s->pid = 0;
		return cli_error(err, "starting a server: %s", strerror(-err));
	}
	return 0;
}

/* Waits for the server's port file (it is written once warmed and listening). */
static int server_wait(struct server *s)
{
	unsigned port;
	/* Warming reads the budget's experts from a dropped page cache: minutes at worst. */
	int err = cli_serve_wait_port(s->pid, s->port_file, 600000, &port);

	if (err) {
		s->pid = 0;
		return err;
	}
	s->t_ready = now_s();
	snprintf(s->url, sizeof(s->url), "http://127.0.0.1:%u", port);
	return 0;
}

/* SIGTERM: the server stops admitting, finishes what it runs, exits. Returns the seconds. */
static double server_stop(struct server *s)
{
	double t = now_s();

	if (s->pid <= 0)
		return 0;
	cli_child_stop(s->pid);
	s->pid = 0;
	return now_s() - t;
}

struct epoch_mark {
	uint64_t epoch;
	double t;
	uint32_t servers;
};

struct pool_file {
	char path[96];
	uint64_t epoch;
	struct epoch_mark marks[8];
	uint32_t nmarks;
	double t0;
};

/* A new epoch: the file written beside and renamed over, so loadgen reads it whole. */
static int pool_publish(struct pool_file *p, const struct server *const *s, uint32_t n)
{
	char tmp[128];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", p->path);
	f = fopen(tmp, "we");
	if (!f)
		return -errno;
	fprintf(f, "epoch %llu\n", (unsigned long long)++p->epoch);
	for (uint32_t i = 0; i < n; i++)
		fprintf(f, "%s\n", s[i]->url);
	if (fclose(f) || rename(tmp, p->path))
		return -errno;
	if (p->nmarks < 8)
		p->marks[p->nmarks++] = (struct epoch_mark){ p->epoch, now_s() - p->t0, n };
	return 0;
}

/*
 * The load, on its own thread
 */

struct load {
	struct lg_run run;
	struct lg_pool pool;
	struct lg_models models;
	pthread_t th;
	int err;
};

static void *load_main(void *arg)
{
	struct load *l = arg;

	l->err = lg_run(&l->run);
	return NULL;
}

/* The load's pool (the file at path) and model (the store's file name without .mpk). */
static int load_prepare(struct load *l, const char *path, struct mp_store *st)
{
	char name[256], *base, *dot;
	int err = lg_pool_init(&l->pool, NULL, path);

	snprintf(name, sizeof(name), "%s", mp_store_path(st));
	base = strrchr(name, '/');
	base = base ? base + 1 : name;
	dot = strstr(base, ".mpk");
	if (dot)
		*dot = '\0';
	return err ? err : lg_models(NULL, base, 1, &l->models);
}

/* Starts the Poisson load of three phases on its thread (first is the first server's URL). */
static int load_start(const struct el_config *c, struct load *l, struct mp_store *st,
		      const char *first)
{
	l->run = (struct lg_run){
		.url = first, .rate = c->rate, .duration = 3 * c->phase, .drain = 600,
		.max_tokens = c->max_tokens, .ignore_eos = true, .seed = c->seed,
		.models = &l->models, .pool = &l->pool, .retry_s = c->retry_s,
		.prompt_ids = c->prompt_ids, .vocab = mp_store_geometry(st)->vocab,
	};
	return pthread_create(&l->th, NULL, load_main, l) ? -EAGAIN : 0;
}

static void load_free(struct load *l)
{
	lg_run_free(&l->run);
	lg_models_free(&l->models);
	lg_pool_free(&l->pool);
	free(l);
}

/* Share of a request's tokens inside [a, b): spread evenly from its first to its last token. */
static double tokens_in(const struct lg_req *q, double a, double b)
{
	double lo = q->t_first, hi = q->t_last;

	if (q->error || !q->tokens)
		return 0;
	if (hi <= lo)
		return q->t_end >= a && q->t_end < b ? q->tokens : 0;
	lo = lo > a ? lo : a;
	hi = hi < b ? hi : b;
	return hi > lo ? q->tokens * (hi - lo) / (q->t_last - q->t_first) : 0;
}

static json_t *window_json(const struct el_config *c, const struct lg_run *r, double a, double b)
{
	uint32_t n = 0, met = 0, failed = 0;
	double tok = 0;

	for (uint32_t i = 0; i < r->n; i++) {
		const struct lg_req *q = &r->reqs[i];
		double f = (q->t_first - q->t_arrive) * 1e3, p = 0;

		tok += tokens_in(q, a, b);
		if (q->t_arrive < a || q->t_arrive >= b)
			continue;
		n++;
		failed += q->error;
		if (q->tokens > 1 && q->t_last > q->t_first)
			p = (q->t_last - q->t_first) * 1e3 / (q->tokens - 1);
		met += !q->error && q->t_first && f <= c->slo_ttft_ms && p <= c->slo_tpot_ms;
	}
	return json_pack("{s:f, s:f, s:f, s:I, s:I, s:f}", "from_s", a, "to_s", b,
			 "throughput_tok_s", b > a ? tok / (b - a) : 0, "requests", (json_int_t)n,
			 "failed", (json_int_t)failed, "slo_attainment", n ? (double)met / n : 1.0);
}

struct outcome {
	double scale_up_s, scale_down_s, downtime_s, during_tok_s;
	uint64_t disk, peak, before, after;
	uint32_t failed, retried, requests;
	struct lg_metrics nb;	/* the new server's /metrics once ready: where its start went */
};

/*
 * The new server's start: exec to main (start_s: the binary, its libraries,
 * the port file's poll), main to listening (open_s), of which warming
 * (warm_s); and its dense weights, lent by a daemon or read from the file.
 */
static json_t *new_server_json(const struct outcome *o)
{
	const struct lg_metrics *m = &o->nb;

	return json_pack("{s:f, s:f, s:f, s:I, s:I}", "start_s", o->scale_up_s - m->ready_s,
			 "open_s", m->ready_s - m->warm_s, "warm_s", m->warm_s,
			 "dense_lent_bytes", (json_int_t)m->dense_lent,
			 "dense_read_bytes", (json_int_t)m->dense_read);
}

static json_t *outcome_json(const struct el_config *c, const struct outcome *o,
			    const struct lg_run *r, const struct pool_file *pf, double t_up,
			    double t_down)
{
	json_t *marks = json_array(), *w;
	uint64_t larger = o->before > o->after ? o->before : o->after;

	for (uint32_t i = 0; i < pf->nmarks; i++)
		json_array_append_new(marks, json_pack("{s:I, s:f, s:I}", "epoch",
						       (json_int_t)pf->marks[i].epoch, "t_s",
						       pf->marks[i].t, "servers",
						       (json_int_t)pf->marks[i].servers));
	/*
	 * The same windows for every setup, a phase each: the change starts at
	 * the second (a cold restart's downtime falls in it, a scale-up's
	 * second server and its leaving too); "scaling" is from the command
	 * to the last server's exit or the new server in the pool.
	 */
	w = json_pack("{s:o, s:o, s:o, s:o}", "before", window_json(c, r, 0, c->phase),
		      "during", window_json(c, r, c->phase, 2 * c->phase),
		      "after", window_json(c, r, 2 * c->phase, 3 * c->phase),
		      "scaling", window_json(c, r, t_up, t_down));
	return json_pack("{s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:o, s:o, s:o}",
			 "scale_up_s", o->scale_up_s, "scale_down_s", o->scale_down_s,
			 "downtime_s", o->downtime_s, "failed_requests", (json_int_t)o->failed,
			 "retried_requests", (json_int_t)o->retried,
			 "requests", (json_int_t)o->requests,
			 "peak_memory_bytes", (json_int_t)o->peak,
			 "memory_before_bytes", (json_int_t)o->before,
			 "memory_after_bytes", (json_int_t)o->after,
			 "peak_to_larger_of_before_after", larger ? (double)o->peak / larger : 0,
			 "disk_bytes_read", (json_int_t)o->disk, "windows", w, "epochs", marks,
			 "new_server", new_server_json(o));
}

/* The pager daemon of the shared setup, warmed: every expert the budget holds in its memfd. */
static pid_t start_daemon(const struct el_config *c, const char *sock)
{
	pid_t d = cli_start_pagerd(c->model, sock, c->budget, c->pages);
	int err;

	if (d < 0)
		return d;
	err = eb_warm_tier(sock);
	if (err) {
		cli_child_stop(d);
		return err;
	}
	return d;
}

/*
 * One setup: server A under load for a phase; then the change (shared and
 * second_copy: B joins, and after half a phase A drains and leaves;
 * cold_restart: A drains and leaves, then B starts); then a phase after it.
 */
static int run_setup(const struct el_config *c, enum setup_kind k, const char *dir,
		     struct mp_store *st, json_t **out, struct outcome *o)
{
	struct server a = { 0 }, b = { 0 };
	const struct server *both[2] = { &a, &b };
	const struct server *only_a[1] = { &a }, *only_b[1] = { &b };
	struct sampler sm = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct pool_file pf = { 0 };
	struct load *l = calloc(1, sizeof(*l));
	char sock[96];
	uint64_t io0 = 0;
	double t0, t_up = 0, t_down = 0;
	pid_t d = 0;
	bool sampling = false, loading = false;
	int err;

	if (!l)
		return -ENOMEM;
	memset(o, 0, sizeof(*o));
	snprintf(sock, sizeof(sock), "%s/pagerd.sock", dir);
	snprintf(pf.path, sizeof(pf.path), "%s/pool", dir);
	cli_drop_caches(c->fd);
	if (k == SHARED) {
		d = start_daemon(c, sock);
		if (d < 0) {
			free(l);
			return (int)d;
		}
	}
	err = server_spawn(c, dir, "a", k == SHARED ? sock : NULL, 1, &a);
	if (!err)
		err = server_wait(&a);
	if (!err)
		err = pool_publish(&pf, only_a, 1);
	if (!err)
		err = load_prepare(l, pf.path, st);
	if (err)
		goto out;
	sm.pid[0] = d;
	sm.pid[1] = a.pid;
	if (!pthread_create(&sm.th, NULL, sampler_main, &sm))
		sampling = true;
	t0 = now_s();
	pf.t0 = t0;
	pf.marks[0].t = 0;	/* epoch 1 holds from the load's start */
	err = load_start(c, l, st, a.url);
	if (err)
		goto out;
	loading = true;
	sleep_until(t0 + c->phase);
	o->before = sample(&sm);
	t_up = now_s() - t0;
	if (k == COLD_RESTART) {
		double t_cmd = now_s();

		/* No server in the pool: requests wait (retry) until B is in. */
		err = pool_publish(&pf, NULL, 0);
		o->scale_down_s = server_stop(&a);
		sampler_set(&sm, 1, 0);
		cli_drop_caches(c->fd);
		if (!err)
			err = server_spawn(c, dir, "b", NULL, 2, &b);
		sampler_set(&sm, 2, b.pid);
		if (!err)
			err = server_wait(&b);
		o->disk = disk_read_of(b.pid);
		if (!err)
			lg_scrape(b.url, &o->nb);
		if (!err)
			err = pool_publish(&pf, only_b, 1);
		o->scale_up_s = b.t_ready - b.t_spawn;
		o->downtime_s = b.t_ready - t_cmd;
		t_down = now_s() - t0;
	} else {
		io0 = disk_read_of(a.pid) + (d > 0 ? disk_read_of(d) : 0);
		err = server_spawn(c, dir, "b", k == SHARED ? sock : NULL, 2, &b);
		sampler_set(&sm, 2, b.pid);
		if (!err)
			err = server_wait(&b);
		o->disk = disk_read_of(b.pid) + disk_read_of(a.pid) +
			  (d > 0 ? disk_read_of(d) : 0) - io0;
		if (!err)
			lg_scrape(b.url, &o->nb);
		o->scale_up_s = b.t_ready - b.t_spawn;
		if (!err)
			err = pool_publish(&pf, both, 2);
		/* A leaves after half a phase, or once B is ready if that took longer. */
		sleep_until(t0 + 1.5 * c->phase);
		sample(&sm);
		/* The pool without A first: then A drains what it was sent and exits. */
		if (!err)
			err = pool_publish(&pf, only_b, 1);
		o->scale_down_s = server_stop(&a);
		sampler_set(&sm, 1, 0);
		t_down = now_s() - t0;
	}
	if (err)
		goto out;
	sleep_until(t0 + 3 * c->phase);
	o->after = sample(&sm);
out:
	if (loading) {
		pthread_join(l->th, NULL);
		err = err ? err : l->err;
	}
	if (sampling) {
		pthread_mutex_lock(&sm.lock);
		sm.stop = true;
		pthread_mutex_unlock(&sm.lock);
		pthread_join(sm.th, NULL);
	}
	o->peak = sm.peak;
	server_stop(&a);
	server_stop(&b);
	if (d > 0)
		cli_child_stop(d);
	if (!err) {
		for (uint32_t i = 0; i < l->run.n; i++) {
			o->failed += l->run.reqs[i].error;
			o->retried += l->run.reqs[i].retries > 0;
		}
		o->requests = l->run.n;
		*out = outcome_json(c, o, &l->run, &pf, t_up, t_down);
		{
			json_t *w = json_object_get(json_object_get(*out, "windows"), "during");

			o->during_tok_s = json_real_value(json_object_get(w, "throughput_tok_s"));
		}
	}
	load_free(l);
	unlink(pf.path);
	unlink(a.port_file);
	unlink(b.port_file);
	return err;
}

/* A run's temporary directory (dir: a mkdtemp() template), its store and libcurl. */
static int run_begin(const struct el_config *c, char *dir, struct mp_store **st)
{
	int err;

	if (!mkdtemp(dir))
		return -errno;
	err = mp_store_open(c->model, st);
	return err ? err : curl_global_init(CURL_GLOBAL_DEFAULT) ? -EIO : 0;
}

/* Undoes run_begin(), whatever of it was done. */
static void run_end(struct mp_store *st, const char *dir)
{
	curl_global_cleanup();
	mp_store_close(st);
	rmdir(dir);
}

/* The load both scenarios put on their servers, for the report. */
static json_t *load_json(const struct el_config *c)
{
	return json_pack("{s:f, s:f, s:I, s:I, s:f, s:f, s:f, s:s}", "rate", c->rate, "phase_s",
			 c->phase, "max_tokens", (json_int_t)c->max_tokens, "prompt_ids",
			 (json_int_t)c->prompt_ids, "slo_ttft_ms", c->slo_ttft_ms, "slo_tpot_ms",
			 c->slo_tpot_ms, "retry_s", c->retry_s, "shared_pages", c->pages);
}

int el_run_loaded(const struct el_config *c, json_t **out)
{
	struct outcome o[NKINDS];
	json_t *res = json_object(), *sj[NKINDS] = { 0 };
	struct mp_store *st = NULL;
	char dir[] = "/tmp/moepager-elastic-XXXXXX";
	int err;

	if (!res)
		return -ENOMEM;
	err = run_begin(c, dir, &st);
	for (int k = 0; !err && k < NKINDS; k++)
		err = run_setup(c, (enum setup_kind)k, dir, st, &sj[k], &o[k]);
	for (int k = 0; !err && k < NKINDS; k++) {
		const struct outcome *cold = &o[COLD_RESTART];

		json_object_set_new(sj[k], "scale_up_to_cold_restart",
				    json_real(cold->scale_up_s > 0 ? o[k].scale_up_s /
					      cold->scale_up_s : 0));
		json_object_set_new(sj[k], "during_throughput_to_cold_restart",
				    json_real(cold->during_tok_s > 0 ? o[k].during_tok_s /
					      cold->during_tok_s : 0));
		json_object_set_new(res, kind_name[k], sj[k]);
		sj[k] = NULL;
	}
	for (int k = 0; k < NKINDS; k++)
		json_decref(sj[k]);
	if (!err) {
		json_t *load = load_json(c);

		json_object_set_new(load, "threads_per_server", json_integer(c->threads));
		json_object_set_new(res, "load", load);
		*out = res;
		res = NULL;
	}
	json_decref(res);
	run_end(st, dir);
	return err;
}

/*
 * --threads-to N: one server's engine threads changed in place under the
 * load (POST /admin/threads), --threads -> N at the second phase and back at
 * the third; against the same load on a server whose threads never change.
 */

struct thread_change {
	uint32_t from, to, seen;	/* seen: moepager_engine_threads after the answer */
	double t_s, command_s;		/* when it was sent (from the load's start), its answer */
	long status;
};

/* POST /admin/threads {"threads": to}; then what /metrics shows. */
static void change_threads(const char *url, uint32_t to, double t0, struct thread_change *ch)
{
	char body[48];
	struct lg_metrics m;
	json_t *j;
	char *ans;

	snprintf(body, sizeof(body), "{\"threads\": %u}", to);
	ch->to = to;
	ch->t_s = now_s() - t0;
	ans = lg_post(url, "/admin/threads", body, &ch->status);
	ch->command_s = now_s() - t0 - ch->t_s;
	j = ans ? json_loads(ans, 0, NULL) : NULL;
	ch->from = (uint32_t)json_integer_value(json_object_get(j, "previous"));
	json_decref(j);
	free(ans);
	lg_scrape(url, &m);
	ch->seen = m.engine_threads > 0 ? (uint32_t)m.engine_threads : 0;
}

static json_t *threads_json(const struct el_config *c, const struct lg_run *r,
			    const struct thread_change *ch, uint32_t nch)
{
	json_t *changes = json_array(), *w;
	uint32_t failed = 0, retried = 0;

	for (uint32_t i = 0; i < r->n; i++) {
		failed += r->reqs[i].error;
		retried += r->reqs[i].retries > 0;
	}
	for (uint32_t i = 0; i < nch; i++)
		json_array_append_new(changes, json_pack(
			"{s:I, s:I, s:I, s:I, s:f, s:f}", "from", (json_int_t)ch[i].from,
			"to", (json_int_t)ch[i].to, "threads_seen", (json_int_t)ch[i].seen,
			"status", (json_int_t)ch[i].status, "t_s", ch[i].t_s,
			"command_s", ch[i].command_s));
	w = json_pack("{s:o, s:o, s:o}", "before", window_json(c, r, 0, c->phase),
		      "during", window_json(c, r, c->phase, 2 * c->phase),
		      "after", window_json(c, r, 2 * c->phase, 3 * c->phase));
	return json_pack("{s:I, s:I, s:I, s:o, s:o}", "failed_requests", (json_int_t)failed,
			 "retried_requests", (json_int_t)retried, "requests", (json_int_t)r->n,
			 "windows", w, "changes", changes);
}

/* One server on the shared tier under the load; change: its threads go to N and back. */
static int run_threads_setup(const struct el_config *c, bool change, const char *dir,
			     struct mp_store *st, json_t **out)
{
	const struct server *only_a[1];
	struct thread_change ch[2] = { 0 };
	struct pool_file pf = { 0 };
	struct load *l = calloc(1, sizeof(*l));
	struct server a = { 0 };
	char sock[96];
	double t0;
	pid_t d;
	int err;

	if (!l)
		return -ENOMEM;
	only_a[0] = &a;
	snprintf(sock, sizeof(sock), "%s/pagerd.sock", dir);
	snprintf(pf.path, sizeof(pf.path), "%s/pool", dir);
	d = start_daemon(c, sock);
	if (d < 0) {
		free(l);
		return (int)d;
	}
	err = server_spawn(c, dir, "a", sock, 1, &a);
	if (!err)
		err = server_wait(&a);
	if (!err)
		err = pool_publish(&pf, only_a, 1);
	if (!err)
		err = load_prepare(l, pf.path, st);
	t0 = now_s();
	if (!err)
		err = load_start(c, l, st, a.url);
	if (err)
		goto out;
	if (change) {
		sleep_until(t0 + c->phase);
		change_threads(a.url, c->threads_to, t0, &ch[0]);
		sleep_until(t0 + 2 * c->phase);
		change_threads(a.url, c->threads, t0, &ch[1]);
	}
	pthread_join(l->th, NULL);
	err = l->err;
	if (!err)
		*out = threads_json(c, &l->run, ch, change ? 2 : 0);
out:
	server_stop(&a);
	cli_child_stop(d);
	load_free(l);
	unlink(pf.path);
	unlink(a.port_file);
	return err;
}

int el_run_threads(const struct el_config *c, json_t **out)
{
	static const char *const names[2] = { "fixed", "in_place" };
	json_t *res = json_object(), *sj[2] = { 0 };
	struct mp_store *st = NULL;
	char dir[] = "/tmp/moepager-elastic-XXXXXX";
	int err;

	if (!res)
		return -ENOMEM;
	err = run_begin(c, dir, &st);
	for (int k = 0; !err && k < 2; k++)
		err = run_threads_setup(c, k == 1, dir, st, &sj[k]);
	if (!err) {
		double f = json_real_value(json_object_get(json_object_get(json_object_get(
				sj[0], "windows"), "during"), "throughput_tok_s"));
		double p = json_real_value(json_object_get(json_object_get(json_object_get(
				sj[1], "windows"), "during"), "throughput_tok_s"));

		json_t *load = load_json(c);

		json_object_set_new(sj[1], "during_throughput_to_fixed", json_real(f > 0 ? p / f : 0));
		json_object_set_new(load, "threads", json_integer(c->threads));
		json_object_set_new(load, "threads_to", json_integer(c->threads_to));
		json_object_set_new(res, "load", load);
		for (int k = 0; k < 2; k++) {
			json_object_set_new(res, names[k], sj[k]);
			sj[k] = NULL;
		}
		*out = res;
		res = NULL;
	}
	for (int k = 0; k < 2; k++)
		json_decref(sj[k]);
	json_decref(res);
	run_end(st, dir);
	return err;
}
