// SPDX-License-Identifier: MIT
/*
 * loadgen's open-loop run: a libcurl multi handle, requests added at their
 * Poisson arrival times whatever the others are doing, each stream's
 * server-sent events timed as they arrive; then the report.
 */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loadgen/loadgen.h"

/* A request in flight: its easy handle, the bytes of an event not yet whole. */
struct flight {
	struct lg_run *run;
	struct lg_req *r;
	CURL *h;
	struct curl_slist *hdrs;
	char *body;
	char *buf;
	size_t len, cap;
	bool done_seen;		/* data: [DONE] */
	double t0;		/* the run's start, monotonic seconds */
};

static double now_s(void)
{
	return (double)cli_now_ns() / 1e9;
}

/* One event's JSON: its first token time, and the usage of the last chunk. */
static void on_event(struct flight *f, const char *data, size_t len)
{
	double t = now_s() - f->t0;
	json_t *j, *usage, *choice;

	if (len == 6 && !memcmp(data, "[DONE]", 6)) {
		f->done_seen = true;
		return;
	}
	j = json_loadb(data, len, 0, NULL);
	if (!j || json_object_get(j, "error")) {
		f->r->error = true;
		json_decref(j);
		return;
	}
	choice = json_array_get(json_object_get(j, "choices"), 0);
	/*
	 * Every chunk comes right after a token (text held back for a stop
	 * string comes later, with a later token): the first and last time a
	 * token's effect was seen. A one-token completion sends only the last.
	 */
	if (choice) {
		if (!f->r->t_first)
			f->r->t_first = t;
		f->r->t_last = t;
	}
	usage = json_object_get(j, "usage");
	if (usage)
		f->r->tokens = (uint32_t)json_integer_value(json_object_get(usage,
								       "completion_tokens"));
	json_decref(j);
}

/* Splits the stream into "data: ..." events (each ends with a blank line). */
static size_t on_data(char *data, size_t size, size_t n, void *arg)
{
	struct flight *f = arg;
	size_t add = size * n;
	char *ev;

	if (f->len + add + 1 > f->cap) {
		size_t cap = (f->len + add + 1) * 2;
		char *b = realloc(f->buf, cap);

		if (!b)
			return 0;
		f->buf = b;
		f->cap = cap;
	}
	memcpy(f->buf + f->len, data, add);
	f->len += add;
	f->buf[f->len] = '\0';
	while ((ev = strstr(f->buf, "\n\n"))) {
		size_t used = (size_t)(ev - f->buf) + 2;

		if (!strncmp(f->buf, "data: ", 6))
			on_event(f, f->buf + 6, (size_t)(ev - f->buf) - 6);
		memmove(f->buf, f->buf + used, f->len - used + 1);
		f->len -= used;
	}
	return add;
}

/* The request's prompt as JSON: a text of the file, or prompt_ids token ids. */
static json_t *prompt_of(struct lg_run *run, struct lg_req *r, uint64_t *rng)
{
	json_t *ids;
	uint64_t h;

	if (r->prompt < 0)
		r->prompt = (int)((uint32_t)(cli_rand_unit(rng) * (1u << 30)) & 0x3fffffff);
	if (!run->prompt_ids)
		return json_string(run->prompts->text[(uint32_t)r->prompt % run->prompts->n]);
	ids = json_array();
	h = (uint64_t)r->prompt;
	for (uint32_t k = 0; ids && k < run->prompt_ids; k++)
		json_array_append_new(ids, json_integer((json_int_t)(uint32_t)(cli_rand_unit(&h) *
								    run->vocab) % run->vocab));
	return ids;
}

static struct flight *start(struct lg_run *run, CURLM *m, struct lg_req *r, uint64_t *rng,
			    double t0, int backend)
{
	bool first = r->prompt < 0;
	json_t *prompt = prompt_of(run, r, rng);
	struct flight *f = calloc(1, sizeof(*f));
	double u = first ? cli_rand_unit(rng) : 0;
	char url[2048];
	json_t *j;

	if (!f || !prompt) {
		json_decref(prompt);
		free(f);
		return NULL;
	}
	r->flight = f;
	if (first)
		r->model = cli_power_pick(run->models->cdf, run->models->n, u);
	r->backend = backend;
	r->epoch = run->pool->epoch;
	run->pool->inflight[backend]++;
	run->pool->sent[backend]++;
	j = json_pack("{s:s, s:o, s:i, s:f, s:b, s:b}", "model", run->models->name[r->model],
		      "prompt", prompt, "max_tokens", (int)run->max_tokens, "temperature",
		      run->temperature, "stream", 1, "ignore_eos", run->ignore_eos);
	f->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	f->run = run;
	f->r = r;
	f->t0 = t0;
	f->h = curl_easy_init();
	f->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
	if (!f->body || !f->h || !f->hdrs) {
		r->error = true;
		return f;
	}
	snprintf(url, sizeof(url), "%s/v1/completions", run->pool->url[backend]);
	curl_easy_setopt(f->h, CURLOPT_URL, url);
	curl_easy_setopt(f->h, CURLOPT_HTTPHEADER, f->hdrs);
	curl_easy_setopt(f->h, CURLOPT_POSTFIELDS, f->body);
	curl_easy_setopt(f->h, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(f->h, CURLOPT_WRITEDATA, f);
	curl_easy_setopt(f->h, CURLOPT_PRIVATE, f);
	curl_easy_setopt(f->h, CURLOPT_NOSIGNAL, 1L);
	lg_auth(f->h);
	curl_multi_add_handle(m, f->h);
	return f;
}

/*
 * Not admitted, so safe to send again: no connection, a 503 (full queue,
 * draining), or the connection closed before any answer (a kept-alive
 * connection to a server that went away).
 */
static bool refused(const struct flight *f, CURLcode rc)
{
	if (f->r->t_first || f->done_seen)
		return false;
	return rc == CURLE_COULDNT_CONNECT || rc == CURLE_GOT_NOTHING || rc == CURLE_SEND_ERROR ||
	       rc == CURLE_RECV_ERROR || (rc == CURLE_OK && f->r->status == 503);
}

/* Ends a request's flight. Returns true when the request is to be sent again. */
static bool finish(CURLM *m, struct flight *f, CURLcode rc, double t0)
{
	struct lg_req *r = f->r;
	struct lg_run *run = f->run;
	bool again = false;

	r->t_end = now_s() - t0;
	r->flight = NULL;
	if (f->h)
		curl_easy_getinfo(f->h, CURLINFO_RESPONSE_CODE, &r->status);
	if (rc != CURLE_OK || r->status != 200 || !f->done_seen)
		r->error = true;
	if (r->error && refused(f, rc) && r->t_end < r->t_arrive + run->retry_s) {
		again = true;
		r->error = false;
		r->status = 0;
		r->retries++;
		r->retry_at = r->t_end + 0.02;
	}
	if (r->backend >= 0 && run->pool->inflight[r->backend])
		run->pool->inflight[r->backend]--;
	if (f->h)
		curl_multi_remove_handle(m, f->h);
	curl_easy_cleanup(f->h);
	curl_slist_free_all(f->hdrs);
	free(f->body);
	free(f->buf);
	free(f);
	return again;
}

/* Requests whose curl transfer ended; those to be sent again go to pend[]. */
static uint32_t reap(CURLM *m, double t0, struct lg_run *run, uint32_t *pend, uint32_t *npend)
{
	uint32_t n = 0;
	CURLMsg *msg;
	int left;

	while ((msg = curl_multi_info_read(m, &left))) {
		struct flight *f;
		uint32_t i;

		if (msg->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&f);
		i = (uint32_t)(f->r - run->reqs);
		if (finish(m, f, msg->data.result, t0))
			pend[(*npend)++] = i;
		n++;
	}
	return n;
}

/* Exponential gaps of mean 1/rate up to duration: the arrival times. */
static int plan(struct lg_run *r, uint64_t *rng)
{
	uint32_t cap = (uint32_t)(r->rate * r->duration * 2 + 64);
	double t = 0;

	r->reqs = calloc(cap, sizeof(*r->reqs));
	if (!r->reqs)
		return -ENOMEM;
	for (;;) {
		t += -log(cli_rand_unit(rng)) / r->rate;
		if (t >= r->duration)
			break;
		if (r->n == cap) {
			struct lg_req *q = realloc(r->reqs, 2 * cap * sizeof(*q));

			if (!q)
				return -ENOMEM;
			memset(q + cap, 0, cap * sizeof(*q));
			r->reqs = q;
			cap *= 2;
		}
		r->reqs[r->n++].t_arrive = t;
	}
	return 0;
}

/*
 * Sends request i to the current epoch's least busy backend: true when it
 * is in flight (or failed for good), false when it waits (no backend now).
 */
static bool send_one(struct lg_run *r, CURLM *m, uint32_t i, uint64_t *rng, double t0,
		     uint32_t *active)
{
	struct lg_req *q = &r->reqs[i];
	struct flight *f;
	int b;

	lg_pool_refresh(r->pool);
	b = lg_pool_pick(r->pool);
	if (b < 0) {
		if (now_s() - t0 < q->t_arrive + r->retry_s) {
			q->retry_at = now_s() - t0 + 0.02;
			return false;
		}
		q->error = true;
		return true;
	}
	f = start(r, m, q, rng, t0, b);
	if (f && f->h && f->body && f->hdrs)
		(*active)++;
	else if (f)
		finish(m, f, CURLE_OUT_OF_MEMORY, t0);
	else
		q->error = true;
	return true;
}

int lg_run(struct lg_run *r)
{
	uint64_t rng = r->seed ^ 0x6c6f616467656e00ull;
	uint32_t next = 0, active = 0, npend = 0, *pend = NULL;
	CURLM *m = curl_multi_init();
	struct lg_pool one;
	double t0, now;
	int err = m ? plan(r, &rng) : -ENOMEM;

	if (!err && !r->pool) {
		err = lg_pool_init(&one, r->url, NULL);
		r->pool = &one;
	}
	if (!err) {
		pend = calloc(r->n + 1, sizeof(*pend));
		err = pend ? 0 : -ENOMEM;
	}
	if (err) {
		cli_error(0, "out of memory");
		curl_multi_cleanup(m);
		free(pend);
		if (r->pool == &one)
			lg_pool_free(&one);
		r->pool = NULL;
		return err;
	}
	for (uint32_t i = 0; i < r->n; i++) {
		r->reqs[i].prompt = -1;
		r->reqs[i].backend = -1;
	}
	curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, 1024L);
	t0 = now_s();
	r->t0 = t0;
	for (;;) {
		int running, wait_ms;
		uint32_t keep = 0;

		now = now_s() - t0;
		/* Sent again first: they arrived earlier. */
		for (uint32_t k = 0; k < npend; k++) {
			uint32_t i = pend[k];

			if (r->reqs[i].retry_at > now || !send_one(r, m, i, &rng, t0, &active))
				pend[keep++] = i;
		}
		npend = keep;
		while (next < r->n && r->reqs[next].t_arrive <= now) {
			if (!send_one(r, m, next, &rng, t0, &active))
				pend[npend++] = next;
			next++;
		}
		curl_multi_perform(m, &running);
		active -= reap(m, t0, r, pend, &npend);
		if (next == r->n && !active && !npend)
			break;
		if (next == r->n && now > r->duration + r->drain) {
			cli_say("%u request(s) still running after "
				"--drain %g s: counted as errors", active + npend, r->drain);
			break;
		}
		wait_ms = next < r->n ? (int)((r->reqs[next].t_arrive - now) * 1000) : 50;
		if (npend)
			wait_ms = wait_ms > 20 ? 20 : wait_ms;
		curl_multi_poll(m, NULL, 0, wait_ms < 0 ? 0 : wait_ms > 50 ? 50 : wait_ms, NULL);
	}
	/* What still runs or waits is abandoned: its request is an error. */
	for (uint32_t i = 0; i < next; i++)
		if (r->reqs[i].flight)
			finish(m, r->reqs[i].flight, CURLE_OPERATION_TIMEDOUT, t0);
	for (uint32_t k = 0; k < npend; k++)
		r->reqs[pend[k]].error = true;
	r->wall = now_s() - t0;
	curl_multi_cleanup(m);
	free(pend);
	if (r->pool == &one) {
		lg_pool_free(&one);
		r->pool = NULL;
	}
	return 0;
}

void lg_run_free(struct lg_run *r)
{
	free(r->reqs);
	r->reqs = NULL;
	r->n = 0;
}
