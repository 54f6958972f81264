// SPDX-License-Identifier: MIT
/*
 * The HTTP front end (see http.h). Threads: the HTTP thread (http_loop())
 * runs libmicrohttpd in its external epoll mode and so the handlers; the
 * backend's scheduler thread delivers tokens through callbacks; the main
 * thread ticks the janitor.
 *
 * A completion is a reference-counted struct req: one reference for the
 * connection, one for the scheduler until done, one for a stream's reader.
 * A request waiting for tokens is suspended (MHD_suspend_connection() with
 * req->lock held, from an MHD callback); a callback takes it off the parked
 * list (unpark(), req->lock held) and hands it to the HTTP thread (hand()),
 * which resumes it (MHD_resume_connection() with no lock held): a resume
 * can never come before its suspend, and libmicrohttpd's locks never nest
 * inside ours the other way round. A suspended connection cannot complete,
 * so its fd and req stay valid until the resume.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve/api.h"
#include "serve/http.h"
#include "serve/metrics.h"
#include "cli.h"
#include "text.h"

#if MHD_VERSION < 0x00097002
typedef int mhd_result;
#else
typedef enum MHD_Result mhd_result;
#endif

enum endpoint { EP_COMPLETIONS, EP_MODELS, EP_HEALTH, EP_METRICS, EP_ADAPTERS, EP_THREADS,
		EP_OTHER, EP_COUNT };

static const char *const ep_name[EP_COUNT] = {
	"/v1/completions", "/v1/models", "/health", "/metrics", "/v1/adapters", "/admin/threads",
	"other",
};
static const int codes[] = { 200, 201, 400, 401, 404, 405, 409, 413, 500, 503 };
#define NCODES (sizeof(codes) / sizeof(codes[0]))

/* A connection, for the janitor: how long it has been sending its request. */
enum phase { PH_HEADERS = 0, PH_BODY, PH_BUSY };

struct conn {
	struct conn *prev, *next;
	int fd;
	enum phase phase;
	uint64_t since;
	bool shut;
};

struct req {
	struct http_server *h;
	pthread_mutex_t lock;
	int refs;
	struct MHD_Connection *c;	/* NULL once the connection is done */
	int fd;
	struct strbuf body;
	bool too_big;
	bool answered;			/* the final handler call has run */
	bool submitted, finished, suspended, stream;
	bool ended;			/* the last events (or the whole body) are in out */
	atomic_bool gone;		/* the client left */
	const struct serve_model *m;	/* acquired from the backend, released with the req */
	enum endpoint admin;		/* EP_ADAPTERS or EP_THREADS (a POST); a completion: 0 */
	struct api_adapter_load load;	/* adapters: what to load */
	uint32_t threads, threads_before;	/* threads: asked for, had */
	struct api_error admin_err;	/* admin: why it failed (err < 0) */
	struct api_request api;
	uint64_t id;
	struct textgen tg;
	struct strbuf out;		/* stream: bytes to send; else the finished body */
	char cmpl_id[32];
	char *sse_prefix;		/* stream: every token event's start (api_chunk_prefix) */
	long created;
	uint32_t prompt_tokens, tokens;
	enum mp_sched_finish why;
	int err;
	struct req *pprev, *pnext;	/* the parked list, under h->lock */
	struct req *wnext;		/* the step's resumes (h->wake), under h->lock */
	struct MHD_Connection *wc;	/* the connection to resume then */
	/*
	 * Stream: flushed, a token was handed since the last read that found
	 * no bytes before any had gone (sent): until the first text goes, each
	 * token is handed at once, not at the tick (a first token may give no
	 * text: a lone leading space, a character's first bytes).
	 */
	bool flushed, sent;
	/*
	 * defer: no stop strings, so on_token() only keeps the ids (pend) and
	 * the HTTP thread makes their text and events (push_deferred()).
	 * text_over: the text has ended (out of memory), the request stops.
	 */
	bool defer, text_over;
	uint32_t *pend;
	uint32_t npend, pend_cap;
};

struct http_server {
	struct http_config cfg;
	struct serve_backend *b;
	struct MHD_Daemon *d;
	uint16_t port;
	pthread_mutex_t lock;		/* conns, parked, counters */
	struct conn *conns;
	struct req *parked;
	/*
	 * Streams a step gave a token, handed to the HTTP thread after the
	 * step (wake_step()), which resumes them: one eventfd write per step
	 * on the scheduler's thread, not one libmicrohttpd resume (and its
	 * eventfd write) per stream. per_step: the backend calls wake_step();
	 * else each token resumes. handed: the write is made, not yet read.
	 */
	struct req *wake;
	bool per_step, handed;
	/*
	 * The streams' flush tick (stream_interval_us), the scheduler's thread's
	 * alone (on_token(), wake_step()): a step's tokens go when the interval
	 * has passed since the last step whose tokens went (tick_ns), every
	 * stream's together, so one wake-up of this thread (and of the clients)
	 * carries them all. Decided once a step, at its first token that may
	 * wait (tick_step: the step it was decided for).
	 */
	uint64_t tick_ns, steps, tick_step;
	bool tick_due;
	bool step_hands;		/* on_token() handed a stream this step */
	int efd;			/* the HTTP thread's wake-up: handed streams, stop */
	int ep;				/* the HTTP thread's epoll: efd and libmicrohttpd's */
	pthread_t thread;
	bool thread_started;
	atomic_bool stop;
	/*
	 * The listening socket is taken back (MHD_quiesce_daemon()) on the HTTP
	 * thread: libmicrohttpd's epoll set is not to be changed while that
	 * thread runs MHD_run(). 0: not asked, 1: asked, 2: done (lsock set).
	 */
	atomic_int quiesce;
	MHD_socket lsock;
	atomic_bool draining;
	atomic_uint suspended;
	atomic_uint live;		/* reqs allocated */
	atomic_uint loaders;		/* admin requests running on their threads */
	atomic_uint cut_short;
	atomic_uint_fast64_t resumes;	/* connections resumed: wake-ups of this thread's work */
	atomic_uint_fast64_t next_cmpl;
	uint64_t count[EP_COUNT][NCODES];
	uint64_t slow_closed;
	atomic_uint_fast64_t handler_ns;
	atomic_uint_fast64_t handler_cpu_ns;
	/* libmicrohttpd's polling thread's CPU clock, taken in its first handler call. */
	atomic_bool have_mhd_clock;
	clockid_t mhd_clock;
	char markers[EP_COUNT];		/* *con_cls of the requests without a body of their own */
};

static uint64_t now_ns(void)
{
	return cli_now_ns();
}

/* Why a generation failed, for its client: the cause when it is the pager daemon's death. */
static const char *failure_text(int err)
{
	if (err == -ENOTCONN)
		return "generation failed: the pager daemon this server is attached to is gone; "
		       "its experts cannot be read";
	return "generation failed: the model's weights could not be read";
}

/*
 * Answers
 */

static void count(struct http_server *h, enum endpoint ep, unsigned status)
{
	pthread_mutex_lock(&h->lock);
	for (size_t i = 0; i < NCODES; i++)
		if (codes[i] == (int)status)
			h->count[ep][i]++;
	pthread_mutex_unlock(&h->lock);
}

/* A 503 says when to come back, a 401 what credentials the server takes. */
static mhd_result answer(struct http_server *h, struct MHD_Connection *c, enum endpoint ep,
			 unsigned status, const char *type, char *body)
{
	struct MHD_Response *r;
	mhd_result ret;

	if (!body)
		return MHD_NO;		/* out of memory: the connection closes */
	r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	if (status == 503)
		MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
	else if (status == 401)
		MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	count(h, ep, status);
	return ret;
}

static mhd_result answer_json(struct http_server *h, struct MHD_Connection *c, enum endpoint ep,
			      unsigned status, char *body)
{
	return answer(h, c, ep, status, "application/json", body);
}

/* An error as OpenAI's API gives it: {"error": {message, type, param, code}}. */
static mhd_result answer_error(struct http_server *h, struct MHD_Connection *c, enum endpoint ep,
			       const struct api_error *e)
{
	const char *type = e->status == 503 ? "server_busy" : e->status >= 500 ? "server_error" :
			   e->status == 404 ? "not_found_error" :
			   e->status == 401 ? "authentication_error" : "invalid_request_error";

	return answer(h, c, ep, e->status, "application/json", api_error_json(e, type));
}

static mhd_result fail(struct http_server *h, struct MHD_Connection *c, enum endpoint ep,
		       unsigned status, const char *param, const char *msg)
{
	struct api_error e;

	api_fail(&e, (int)status, param, "%s", msg);
	return answer_error(h, c, ep, &e);
}

/*
 * Requests: references, parking
 */

static void req_unref(struct req *q)
{
	int left;

	pthread_mutex_lock(&q->lock);
	left = --q->refs;
	pthread_mutex_unlock(&q->lock);
	if (left)
		return;
	atomic_fetch_sub(&q->h->live, 1);
	if (q->m)
		q->h->b->ops->release(q->h->b, q->m);
	sb_free(&q->body);
	sb_free(&q->out);
	textgen_fini(&q->tg);
	free(q->sse_prefix);
	free(q->pend);
	api_request_free(&q->api);
	pthread_mutex_destroy(&q->lock);
	free(q);
}

/* Suspends q's connection until a callback resumes it. From an MHD callback, q->lock held. */
static void park(struct req *q)
{
	struct http_server *h = q->h;

	q->suspended = true;
	atomic_fetch_add(&h->suspended, 1);
	pthread_mutex_lock(&h->lock);
	q->pprev = NULL;
	q->pnext = h->parked;
	if (h->parked)
		h->parked->pprev = q;
	h->parked = q;
	pthread_mutex_unlock(&h->lock);
	MHD_suspend_connection(q->c);
}

/* Takes q off the parked list; true when the caller must resume it. q->lock held. */
static bool unpark(struct req *q)
{
	struct http_server *h = q->h;

	if (!q->suspended)
		return false;
	q->suspended = false;
	pthread_mutex_lock(&h->lock);
	if (q->pprev)
		q->pprev->pnext = q->pnext;
	else
		h->parked = q->pnext;
	if (q->pnext)
		q->pnext->pprev = q->pprev;
	pthread_mutex_unlock(&h->lock);
	return true;
}

/*
 * Hands q, unpark()ed (so still suspended: valid), to the HTTP thread,
 * which resumes its connection c (resume_handed()). now: it must wake for
 * it; else the step's end wakes it (wake_step()). q->lock held. Returns
 * true when the caller must wake it (wake_loop(), after unlocking).
 */
static bool hand(struct req *q, struct MHD_Connection *c, bool now)
{
	struct http_server *h = q->h;
	bool sig;

	q->wc = c;
	pthread_mutex_lock(&h->lock);
	q->wnext = h->wake;
	h->wake = q;
	sig = now && !h->handed;
	h->handed |= sig;
	pthread_mutex_unlock(&h->lock);
	return sig;
}

static void wake_loop(struct http_server *h)
{
	uint64_t one = 1;

	if (write(h->efd, &one, sizeof(one)) != sizeof(one))
		cli_say("waking the HTTP thread: %s", strerror(errno));
}

/* The HTTP thread: resumes a connection unpark() released. No lock held. */
static void resume(struct http_server *h, struct MHD_Connection *c)
{
	MHD_resume_connection(c);
	atomic_fetch_sub(&h->suspended, 1);
	atomic_fetch_add(&h->resumes, 1);
}

/*
 * The scheduler's callbacks (its thread)
 */

static const char *finish_name(enum mp_sched_finish why)
{
	return why == MP_FINISH_LENGTH ? "length" : "stop";
}

/*
 * Whether a stream's bytes go now: its first token (and each next one
 * until one has given text: sse_read()), and then on the
 * server's tick, at most once per stream_interval_us for all streams
 * together; between, a step's token waits in q->out for a later one's
 * (on_done() sends the rest). A token waits at most until the first step
 * that ends past the interval. Without a per-step hook every token goes.
 * q->lock held.
 */
static bool flush_due(struct req *q)
{
	struct http_server *h = q->h;

	if (!q->suspended)
		return false;	/* the reader is running: it takes the bytes */
	if (!h->cfg.stream_interval_us || !h->per_step || !q->flushed) {
		q->flushed = true;
		return true;
	}
	if (h->tick_step != h->steps) {
		h->tick_step = h->steps;
		h->tick_due = now_ns() - h->tick_ns >= h->cfg.stream_interval_us * 1000ull;
	}
	return h->tick_due;
}

/*
 * A token into the text and, for a stream, its event in q->out (none when
 * it gave no text yet). Returns 1 when the text has ended (a stop string, or
 * out of memory: the text ends there rather than lose a piece), else 0.
 * q->lock held.
 */
static int push_token(struct req *q, uint32_t tok)
{
	const char *delta = NULL;
	size_t len = 0;
	int stop = 0;

	/* The end-of-sequence token ends the text; it is not part of it. */
	if (tok != q->m->eos || q->api.ignore_eos)
		stop = textgen_push(&q->tg, tok, &delta, &len);
	if (stop < 0) {
		stop = 1;
		q->text_over = true;
	}
	if (q->stream && (len || !q->m->tok)) {
		/* A model without a tokenizer streams its token ids; text not UTF-8 is dropped. */
		api_chunk_add(&q->out, q->sse_prefix, delta, len, q->m->tok ? NULL : &tok, 1);
	}
	return stop;
}

/*
 * The HTTP thread: the text and events of the tokens on_token() deferred,
 * in their order, so the bytes are those it would have made itself. After
 * the text has ended (out of memory) the rest is dropped; on_token() stops
 * the request at its next token. q->lock held.
 */
static void push_deferred(struct req *q)
{
	for (uint32_t i = 0; i < q->npend && !q->text_over; i++)
		push_token(q, q->pend[i]);
	q->npend = 0;
}

/*
 * A request without stop strings only keeps the id (defer): its text and
 * events are made by the HTTP thread when it sends them (push_deferred()),
 * off this thread, whose time is taken from every step, and several steps'
 * tokens in one go. With stop strings the text is made here: a stop string
 * ends the request at the token that completes it.
 */
static int on_token(void *arg, uint32_t tok)
{
	struct req *q = arg;
	struct MHD_Connection *c;
	bool wake;
	int stop;

	pthread_mutex_lock(&q->lock);
	c = q->c;
	q->tokens++;
	if (q->text_over)
		stop = 1;
	else if (q->defer)
		/* Out of memory: end it, its text whole. */
		stop = ids_append(&q->pend, &q->npend, &q->pend_cap, tok) ? 1 : 0;
	else
		stop = push_token(q, tok);
	/* A stream's reader waits for bytes; a whole answer waits for on_done(). */
	wake = false;
	if (q->stream && flush_due(q) && unpark(q)) {
		wake = hand(q, c, !q->h->per_step);
		q->h->step_hands = true;
	}
	pthread_mutex_unlock(&q->lock);
	if (wake)
		wake_loop(q->h);
	return stop;
}

/*
 * After a step (the backend's on_step hook, the scheduler's thread): hands
 * the streams its tokens went to to the HTTP thread, which resumes them
 * (resume_handed()), with one eventfd write. Each stays suspended until
 * then, so its connection and req are valid.
 */
static void wake_step(void *arg)
{
	struct http_server *h = arg;
	bool write_it;

	if (h->tick_due)
		h->tick_ns = now_ns();	/* this step's tokens went */
	h->tick_due = false;
	h->steps++;
	/* Nothing this step's tokens handed: no lock (the HTTP thread's too) to take. */
	if (!h->step_hands)
		return;
	h->step_hands = false;
	pthread_mutex_lock(&h->lock);
	write_it = h->wake && !h->handed;
	h->handed |= write_it;
	pthread_mutex_unlock(&h->lock);
	if (write_it)
		wake_loop(h);
}

/*
 * The HTTP thread: resumes the connections handed to it, in one go. Only
 * this thread resumes, so it knows when libmicrohttpd has one to run again.
 * Returns how many.
 */
static uint32_t resume_handed(struct http_server *h)
{
	struct req *list;
	uint32_t k = 0;

	pthread_mutex_lock(&h->lock);
	list = h->wake;
	h->wake = NULL;
	h->handed = false;	/* a write made after this wakes it once more, harmlessly */
	pthread_mutex_unlock(&h->lock);
	while (list) {
		struct req *q = list;

		list = q->wnext;	/* before the resume, after which q may go */
		resume(h, q->wc);
		k++;
	}
	return k;
}

/*
 * What a finished request sends: the stream's last events, or the whole
 * body. Built by the HTTP thread when it answers, not by the scheduler's
 * in on_done(), whose time is taken from every step. q->lock held.
 */
static void finish_body(struct req *q)
{
	const char *rest;
	size_t len;
	char *s;

	if (q->ended || !q->finished || q->why == MP_FINISH_CANCELLED)
		return;
	q->ended = true;
	push_deferred(q);
	textgen_flush(&q->tg, &rest, &len);
	if (!q->stream) {
		s = api_completion_json(q->cmpl_id, q->created, q->m->name,
					q->tg.text ? q->tg.text + q->tg.start : NULL,
					q->tg.len - q->tg.start, finish_name(q->why),
					q->prompt_tokens, q->tokens, q->m->tok ? NULL : q->tg.ids,
					q->tg.n);
		if (s)
			sb_add(&q->out, s, strlen(s));
		free(s);
		return;
	}
	if (q->why == MP_FINISH_ERROR || q->why == MP_FINISH_SHUTDOWN) {
		struct api_error e;

		api_fail(&e, q->why == MP_FINISH_SHUTDOWN ? 503 : 500, NULL, "%s",
			 q->why == MP_FINISH_SHUTDOWN ? "the server is shutting down" :
			 failure_text(q->err));
		s = api_error_json(&e, "server_error");
		if (s)
			sb_printf(&q->out, "data: %s\n\n", s);
		free(s);
	} else {
		s = api_chunk_sse(q->cmpl_id, q->created, q->m->name, rest, len,
				  finish_name(q->why), NULL, 0, q->prompt_tokens, q->tokens);
		if (s)
			sb_add(&q->out, s, strlen(s));
		free(s);
	}
	sb_add(&q->out, "data: [DONE]\n\n", 14);
}

static void on_done(void *arg, enum mp_sched_finish why, int err, const struct mp_sched_timing *t)
{
	struct req *q = arg;
	struct MHD_Connection *c;
	bool wake;

	(void)t;
	if (why == MP_FINISH_SHUTDOWN)
		atomic_fetch_add(&q->h->cut_short, 1);
	pthread_mutex_lock(&q->lock);
	c = q->c;
	q->finished = true;
	q->why = why;
	q->err = err;
	wake = unpark(q) && hand(q, c, true);
	pthread_mutex_unlock(&q->lock);
	if (wake)
		wake_loop(q->h);
	req_unref(q);
}

/*
 * POST /v1/completions
 */

/* The prompt as token ids: the request's, or its text through the model's tokenizer. */
static int prompt_ids(struct req *q, uint32_t **ids, uint32_t *n, struct api_error *e)
{
	const struct serve_model *m = q->m;

	if (q->api.prompt_ids) {
		for (uint32_t i = 0; i < q->api.nprompt_ids; i++)
			if (q->api.prompt_ids[i] >= m->vocab)
				return api_fail(e, 400, "prompt", "prompt[%u] = %u is not a token "
						"of model %s (vocabulary %u)", i,
						q->api.prompt_ids[i], m->name, m->vocab);
		*ids = q->api.prompt_ids;
		*n = q->api.nprompt_ids;
		return 0;
	}
	if (!m->tok)
		return api_fail(e, 400, "prompt", "model %s has no tokenizer: send the prompt "
				"as an array of token ids", m->name);
	if (text_encode_prompt(m->tok, q->api.prompt_text, ids, n))
		return api_fail(e, 400, "prompt", "the prompt could not be tokenized");
	return 0;
}

static int check_and_submit(struct req *q, struct api_error *e)
{
	struct mp_sched_callbacks cb = { on_token, on_done, q };
	struct mp_sched_params p = { .max_tokens = q->api.max_tokens,
				     .temperature = (float)q->api.temperature,
				     .top_p = (float)q->api.top_p, .top_k = q->api.top_k };
	uint32_t *ids, n;
	int err;

	q->m = q->h->b->ops->acquire(q->h->b, q->api.model);
	if (!q->m)
		return api_fail(e, 404, "model", "model '%s' is not served here (GET /v1/models)",
				q->api.model);
	err = prompt_ids(q, &ids, &n, e);
	if (err)
		return err;
	q->prompt_tokens = n;
	if (n > q->m->context || q->api.max_tokens > q->m->context - n) {
		err = api_fail(e, 400, n > q->m->context ? "prompt" : "max_tokens",
			       "the prompt has %u tokens and max_tokens is %u: more than the "
			       "context of %u tokens", n, q->api.max_tokens, q->m->context);
		goto out;
	}
	p.seed = q->api.seed_set ? q->api.seed : now_ns() ^ (uint64_t)q->id;
	p.eos = q->m->eos;
	p.no_eos = q->api.ignore_eos || q->m->eos == UINT32_MAX;
	if (textgen_init(&q->tg, q->m->tok, (const char *const *)q->api.stop, q->api.nstop,
			 ids[n - 1]) ||
	    (q->api.stream &&
	     !(q->sse_prefix = api_chunk_prefix(q->cmpl_id, q->created, q->m->name)))) {
		err = api_fail(e, 500, NULL, "out of memory");
		goto out;
	}
	/*
	 * Set before the scheduler can call back: its first token may come
	 * before submit returns, and a stream's token must find q->stream set.
	 */
	pthread_mutex_lock(&q->lock);
	q->refs++;		/* the scheduler's, until done */
	q->stream = q->api.stream;
	q->defer = !q->api.nstop;
	q->submitted = true;
	pthread_mutex_unlock(&q->lock);
	err = q->h->b->ops->submit(q->h->b, q->m, ids, n, &p, &cb, &q->id);
	if (err) {
		pthread_mutex_lock(&q->lock);
		q->refs--;
		q->submitted = false;
		pthread_mutex_unlock(&q->lock);
		if (err == -EAGAIN || err == -ESHUTDOWN)
			api_fail(e, 503, NULL, "%s", err == -EAGAIN ? "the queue is full: retry "
				 "later" : "the server is shutting down");
		else
			api_fail(e, 400, NULL, "%s", mp_last_error());
	}
out:
	if (ids != q->api.prompt_ids)
		free(ids);
	return err;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct req *q = cls;
	size_t n;

	(void)pos;
	pthread_mutex_lock(&q->lock);
	push_deferred(q);
	finish_body(q);
	if (q->out.len) {
		n = max < q->out.len ? max : q->out.len;
		memcpy(buf, q->out.s, n);
		sb_consume(&q->out, n);
		q->sent = true;
		pthread_mutex_unlock(&q->lock);
		return (ssize_t)n;
	}
	if (q->finished || atomic_load(&q->gone)) {
		bool ok = q->finished && q->why != MP_FINISH_CANCELLED;

		pthread_mutex_unlock(&q->lock);
		return ok ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
	}
	/* No text yet: the next token is handed at once too (flush_due()). */
	if (!q->sent)
		q->flushed = false;
	park(q);
	pthread_mutex_unlock(&q->lock);
	return 0;
}

static void sse_release(void *cls)
{
	req_unref(cls);
}

static mhd_result start_stream(struct req *q, struct MHD_Connection *c)
{
	struct MHD_Response *r;
	mhd_result ret;

	pthread_mutex_lock(&q->lock);
	q->refs++;		/* the reader's */
	pthread_mutex_unlock(&q->lock);
	r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, q, sse_release);
	if (!r) {
		req_unref(q);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
	ret = MHD_queue_response(c, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	count(q->h, EP_COMPLETIONS, 200);
	return ret;
}

/* The finished body of a request that waited (or finished before it could). */
static mhd_result answer_finished(struct req *q, struct MHD_Connection *c)
{
	char *body;

	if (q->why == MP_FINISH_CANCELLED)
		return MHD_NO;
	if (q->why == MP_FINISH_ERROR || q->why == MP_FINISH_SHUTDOWN) {
		struct api_error e;

		api_fail(&e, q->why == MP_FINISH_SHUTDOWN ? 503 : 500, NULL, "%s",
			 q->why == MP_FINISH_SHUTDOWN ? "the server is shutting down" :
			 failure_text(q->err));
		return answer_error(q->h, c, EP_COMPLETIONS, &e);
	}
	finish_body(q);
	body = q->out.s ? strndup(q->out.s, q->out.len) : NULL;
	return answer_json(q->h, c, EP_COMPLETIONS, 200, body);
}

/* A request called again after a resume: it has finished, or its client left. */
static mhd_result resumed(struct req *q, struct MHD_Connection *c,
			  mhd_result (*answer_done)(struct req *, struct MHD_Connection *))
{
	mhd_result ret = MHD_YES;

	pthread_mutex_lock(&q->lock);
	if (atomic_load(&q->gone))
		ret = MHD_NO;
	else if (q->finished)
		ret = answer_done(q, c);
	else
		park(q);
	pthread_mutex_unlock(&q->lock);
	return ret;
}

static mhd_result completion(struct req *q, struct MHD_Connection *c)
{
	struct api_error e;
	mhd_result ret = MHD_YES;

	if (q->answered)
		return resumed(q, c, answer_finished);
	q->answered = true;
	if (q->too_big)
		return fail(q->h, c, EP_COMPLETIONS, 413, NULL, "the body is too large");
	if (atomic_load(&q->h->draining))
		return fail(q->h, c, EP_COMPLETIONS, 503, NULL, "the server is shutting down");
	if (api_parse_completion(q->body.s ? q->body.s : "", q->body.len, &q->api, &e) ||
	    check_and_submit(q, &e))
		return answer_error(q->h, c, EP_COMPLETIONS, &e);
	if (q->stream)
		return start_stream(q, c);
	pthread_mutex_lock(&q->lock);
	if (q->finished)
		ret = answer_finished(q, c);
	else
		park(q);
	pthread_mutex_unlock(&q->lock);
	return ret;
}

/*
 * POST /v1/adapters and POST /admin/threads: a load reads MBs to GBs, a
 * thread change waits for the scheduler's step to end, so each runs on a
 * thread of its own while the connection is suspended; requests keep being
 * served.
 */

/* The admin request's work, on its thread: 0, or -errno with q->admin_err filled. */
static int admin_work(struct req *q)
{
	struct serve_backend *b = q->h->b;
	char why[256] = "";
	int err;

	if (q->admin == EP_THREADS) {
		err = b->ops->set_threads(b, q->threads, &q->threads_before, why, sizeof(why));
		if (err)
			api_fail(&q->admin_err, err == -ESHUTDOWN ? 503 : err == -EINVAL ? 400 : 500,
				 "threads", "%s", why);
		return err;
	}
	err = b->ops->adapter_load(b, q->load.file, q->load.name[0] ? q->load.name : NULL, why,
				   sizeof(why));
	if (err)
		api_fail(&q->admin_err, err == -EEXIST || err == -ENOSPC ? 409 :
			 err == -ENOENT ? 404 : 400, "file", "%s", why);
	return err;
}

static void *admin_thread(void *arg)
{
	struct req *q = arg;
	struct http_server *h = q->h;
	struct MHD_Connection *c;
	bool wake;
	int err = admin_work(q);

	pthread_mutex_lock(&q->lock);
	q->err = err;
	q->finished = true;
	c = q->c;
	wake = unpark(q) && hand(q, c, true);
	pthread_mutex_unlock(&q->lock);
	if (wake)
		wake_loop(h);
	atomic_fetch_sub(&h->loaders, 1);
	req_unref(q);
	return NULL;
}

/* The answer to a finished admin request. q->lock held. */
static mhd_result answer_admin(struct req *q, struct MHD_Connection *c)
{
	char *j;

	if (q->err)
		return answer_error(q->h, c, q->admin, &q->admin_err);
	if (q->admin == EP_ADAPTERS)
		return answer_json(q->h, c, EP_ADAPTERS, 201,
				   q->h->b->ops->adapters_json(q->h->b));
	if (asprintf(&j, "{\"threads\":%u,\"previous\":%u}", q->threads, q->threads_before) < 0)
		j = NULL;
	return answer_json(q->h, c, EP_THREADS, 200, j);
}

/* Checks and parses an admin request's body: 0, or -EINVAL with e filled. */
static int admin_parse(struct req *q, struct api_error *e)
{
	const struct serve_backend_ops *ops = q->h->b->ops;
	const char *body = q->body.s ? q->body.s : "";

	if (q->admin == EP_THREADS) {
		if (!ops->set_threads)
			return api_fail(e, 404, NULL, "this server cannot change its threads");
		return api_parse_threads(body, q->body.len, &q->threads, e);
	}
	if (!ops->adapter_load)
		return api_fail(e, 404, NULL, "this server serves no adapters (start it with "
				"--adapters DIR)");
	return api_parse_adapter_load(body, q->body.len, &q->load, e);
}

static mhd_result admin_post(struct req *q, struct MHD_Connection *c)
{
	struct http_server *h = q->h;
	struct api_error e;
	pthread_t th;

	if (q->answered)
		return resumed(q, c, answer_admin);
	q->answered = true;
	if (q->too_big)
		return fail(h, c, q->admin, 413, NULL, "the body is too large");
	if (atomic_load(&h->draining))
		return fail(h, c, q->admin, 503, NULL, "the server is shutting down");
	if (admin_parse(q, &e))
		return answer_error(h, c, q->admin, &e);
	pthread_mutex_lock(&q->lock);
	q->refs++;		/* the admin thread's */
	atomic_fetch_add(&h->loaders, 1);
	if (pthread_create(&th, NULL, admin_thread, q)) {
		q->refs--;
		atomic_fetch_sub(&h->loaders, 1);
		pthread_mutex_unlock(&q->lock);
		return fail(h, c, q->admin, 500, NULL, "cannot start the admin thread");
	}
	pthread_detach(th);
	/* The loader takes q->lock to finish: it resumes after this suspend, never before. */
	park(q);
	pthread_mutex_unlock(&q->lock);
	return MHD_YES;
}

/*
 * The handler
 */

/* The adapter named in DELETE /v1/adapters/NAME, or NULL for another URL. */
static const char *adapter_in_url(const char *url)
{
	size_t n = strlen(ep_name[EP_ADAPTERS]);

	if (strncmp(url, ep_name[EP_ADAPTERS], n) || url[n] != '/' || !url[n + 1])
		return NULL;
	return url + n + 1;
}

static enum endpoint route(const char *method, const char *url, bool *method_ok)
{
	static const char *const methods[EP_COUNT][2] = {
		{ "POST" }, { "GET" }, { "GET" }, { "GET" }, { "GET", "POST" }, { "POST" }, { NULL },
	};

	if (adapter_in_url(url)) {
		*method_ok = !strcmp(method, "DELETE");
		return EP_ADAPTERS;
	}
	for (int ep = 0; ep < EP_OTHER; ep++) {
		if (strcmp(url, ep_name[ep]))
			continue;
		*method_ok = !strcmp(method, methods[ep][0]) ||
			     (methods[ep][1] && !strcmp(method, methods[ep][1]));
		return (enum endpoint)ep;
	}
	*method_ok = true;
	return EP_OTHER;
}

static struct conn *conn_of(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

static void set_phase(struct http_server *h, struct MHD_Connection *c, enum phase ph)
{
	struct conn *k;

	pthread_mutex_lock(&h->lock);
	k = conn_of(c);
	if (k) {
		k->phase = ph;
		k->since = now_ns();
	}
	pthread_mutex_unlock(&h->lock);
}

/* GET /v1/adapters, DELETE /v1/adapters/NAME. */
static mhd_result adapters_answer(struct http_server *h, struct MHD_Connection *c,
				  const char *url)
{
	const char *name = adapter_in_url(url);
	struct api_error e;
	int err;

	if (!h->b->ops->adapters_json)
		return fail(h, c, EP_ADAPTERS, 404, NULL, "this server serves no adapters (start it "
			    "with --adapters DIR)");
	if (!name)
		return answer_json(h, c, EP_ADAPTERS, 200, h->b->ops->adapters_json(h->b));
	err = h->b->ops->adapter_unload(h->b, name);
	if (err) {
		api_fail(&e, 404, "name", "no adapter named '%.200s' is loaded", name);
		return answer_error(h, c, EP_ADAPTERS, &e);
	}
	return answer_json(h, c, EP_ADAPTERS, 200, api_adapter_unloaded_json(name));
}

static mhd_result simple_get(struct http_server *h, struct MHD_Connection *c, enum endpoint ep,
			     const char *url)
{
	const char *names[64];
	char buf[64][SERVE_NAME_MAX];
	struct strbuf o;
	uint32_t n;

	switch (ep) {
	case EP_HEALTH:
		if (atomic_load(&h->draining))
			return fail(h, c, ep, 503, NULL, "draining");
		return answer_json(h, c, ep, 200, strdup("{\"status\":\"ok\"}"));
	case EP_MODELS:
		n = h->b->ops->list(h->b, buf, 64);
		for (uint32_t i = 0; i < n; i++)
			names[i] = buf[i];
		return answer_json(h, c, ep, 200, api_models_json(names, n, time(NULL)));
	case EP_ADAPTERS:
		return adapters_answer(h, c, url);
	case EP_METRICS:
		sb_init(&o);
		http_metrics(h, &o);
		if (o.oom) {
			sb_free(&o);
			return MHD_NO;
		}
		return answer(h, c, ep, 200, "text/plain; version=0.0.4; charset=utf-8", o.s);
	default:
		return fail(h, c, ep, 404, NULL, "no such endpoint (POST /v1/completions, GET "
			    "/v1/models, /health, /metrics, GET/POST /v1/adapters, DELETE "
			    "/v1/adapters/NAME, POST /admin/threads)");
	}
}

/* Compares in time independent of where a and b differ, so a wrong key leaks nothing. */
static bool same_secret(const char *a, const char *b)
{
	size_t na = strlen(a), nb = strlen(b);
	unsigned char d = na != nb;

	for (size_t i = 0; i < na; i++)
		d |= (unsigned char)a[i] ^ (unsigned char)b[nb ? i % nb : 0];
	return !d;
}

/* With --api-key every endpoint but GET /health wants "Authorization: Bearer KEY". */
static bool authorized(struct http_server *h, struct MHD_Connection *c, enum endpoint ep)
{
	static const char bearer[] = "Bearer ";
	const char *v;

	if (!h->cfg.api_key || ep == EP_HEALTH)
		return true;
	v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (!v || strncasecmp(v, bearer, sizeof(bearer) - 1))
		return false;
	return same_secret(v + sizeof(bearer) - 1, h->cfg.api_key);
}

static mhd_result first_call(struct http_server *h, struct MHD_Connection *c, const char *url,
			     const char *method, void **con_cls)
{
	const char *len = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
						      MHD_HTTP_HEADER_CONTENT_LENGTH);
	bool method_ok;
	enum endpoint ep = route(method, url, &method_ok);
	const union MHD_ConnectionInfo *ci;
	struct req *q;

	set_phase(h, c, PH_BODY);
	if (!method_ok) {
		*con_cls = &h->markers[EP_OTHER];
		return fail(h, c, ep, 405, NULL, "method not allowed on this endpoint");
	}
	if (!authorized(h, c, ep)) {
		*con_cls = &h->markers[EP_OTHER];
		return fail(h, c, ep, 401, "Authorization", "this server wants its API key: "
			    "send the header 'Authorization: Bearer KEY'");
	}
	if (ep != EP_COMPLETIONS && ep != EP_THREADS &&
	    !(ep == EP_ADAPTERS && !strcmp(method, "POST"))) {
		/* Answered on the next call: one queued now would close the connection. */
		*con_cls = &h->markers[ep];
		return MHD_YES;
	}
	if (len && strtoull(len, NULL, 10) > h->cfg.max_body) {
		*con_cls = &h->markers[EP_OTHER];
		return fail(h, c, ep, 413, NULL, "the body is too large");
	}
	q = calloc(1, sizeof(*q));
	if (!q)
		return MHD_NO;
	q->h = h;
	q->admin = ep == EP_COMPLETIONS ? 0 : ep;
	q->refs = 1;		/* the connection's */
	q->c = c;
	ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	q->fd = ci ? ci->connect_fd : -1;
	q->created = time(NULL);
	snprintf(q->cmpl_id, sizeof(q->cmpl_id), "cmpl-%llu",
		 (unsigned long long)atomic_fetch_add(&h->next_cmpl, 1));
	pthread_mutex_init(&q->lock, NULL);
	sb_init(&q->body);
	sb_init(&q->out);
	atomic_fetch_add(&h->live, 1);
	*con_cls = q;
	return MHD_YES;
}

static mhd_result on_request(void *cls, struct MHD_Connection *c, const char *url,
			     const char *method, const char *version, const char *upload,
			     size_t *upload_size, void **con_cls)
{
	struct http_server *h = cls;
	uint64_t t0 = now_ns(), c0 = cli_clock_ns(CLOCK_THREAD_CPUTIME_ID);
	mhd_result ret;
	struct req *q;

	(void)version;
	if (!atomic_load(&h->have_mhd_clock) && !pthread_getcpuclockid(pthread_self(),
								       &h->mhd_clock))
		atomic_store(&h->have_mhd_clock, true);
	if (!*con_cls) {
		ret = first_call(h, c, url, method, con_cls);
	} else if ((char *)*con_cls >= h->markers && (char *)*con_cls < h->markers + EP_COUNT) {
		ret = MHD_YES;
		if (*upload_size)
			*upload_size = 0;	/* a body nobody asked for */
		else
			ret = simple_get(h, c, (enum endpoint)((char *)*con_cls - h->markers), url);
	} else if (*upload_size) {
		q = *con_cls;
		if (q->body.len + *upload_size > h->cfg.max_body)
			q->too_big = true;
		else
			sb_add(&q->body, upload, *upload_size);
		*upload_size = 0;
		/* Past twice the limit it is not a client that will read a 413. */
		ret = q->body.len + *upload_size > 2ull * h->cfg.max_body ? MHD_NO : MHD_YES;
	} else {
		set_phase(h, c, PH_BUSY);
		q = *con_cls;
		ret = q->admin ? admin_post(q, c) : completion(q, c);
	}
	atomic_fetch_add(&h->handler_cpu_ns, cli_clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0);
	atomic_fetch_add(&h->handler_ns, now_ns() - t0);
	return ret;
}

/* A request is over (answered, or its connection failed). */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct http_server *h = cls;
	struct req *q = *con_cls;
	bool cancel;

	(void)toe;
	set_phase(h, c, PH_HEADERS);
	if (!q || ((char *)q >= h->markers && (char *)q < h->markers + EP_COUNT))
		return;
	*con_cls = NULL;
	pthread_mutex_lock(&q->lock);
	q->c = NULL;
	cancel = q->submitted && !q->finished;
	if (cancel)
		atomic_store(&q->gone, true);
	pthread_mutex_unlock(&q->lock);
	if (cancel)
		h->b->ops->cancel(h->b, q->m, q->id);
	req_unref(q);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	struct http_server *h = cls;
	const union MHD_ConnectionInfo *ci;
	struct conn *k;

	pthread_mutex_lock(&h->lock);
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		k = calloc(1, sizeof(*k));
		ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
		if (k) {
			k->fd = ci ? ci->connect_fd : -1;
			k->since = now_ns();
			k->next = h->conns;
			if (h->conns)
				h->conns->prev = k;
			h->conns = k;
		}
		*socket_context = k;
	} else if ((k = *socket_context)) {
		/* Unlinked before MHD closes the fd: the janitor never shuts a reused one. */
		if (k->prev)
			k->prev->next = k->next;
		else
			h->conns = k->next;
		if (k->next)
			k->next->prev = k->prev;
		free(k);
		*socket_context = NULL;
	}
	pthread_mutex_unlock(&h->lock);
}

/*
 * Metrics, the janitor, start and stop
 */

void http_metrics(struct http_server *h, struct strbuf *o)
{
	metrics_family(o, "moepager_http_requests_total", "counter",
		       "HTTP requests answered, by endpoint and status.");
	pthread_mutex_lock(&h->lock);
	for (int ep = 0; ep < EP_COUNT; ep++)
		for (size_t i = 0; i < NCODES; i++)
			if (h->count[ep][i])
				sb_printf(o, "moepager_http_requests_total{endpoint=\"%s\","
					  "code=\"%d\"} %llu\n", ep_name[ep], codes[i],
					  (unsigned long long)h->count[ep][i]);
	sb_printf(o, "# HELP moepager_http_slow_connections_closed_total Connections closed "
		  "for sending their request too slowly.\n# TYPE "
		  "moepager_http_slow_connections_closed_total counter\n"
		  "moepager_http_slow_connections_closed_total %llu\n",
		  (unsigned long long)h->slow_closed);
	pthread_mutex_unlock(&h->lock);
	metrics_family(o, "moepager_serve_epoch", "gauge",
		       "The pool epoch this server joined at (--epoch; docs/elastic.md).");
	sb_printf(o, "moepager_serve_epoch %llu\n", (unsigned long long)h->cfg.epoch);
	metrics_family(o, "moepager_serve_draining", "gauge",
		       "1 once the server drains (SIGTERM): no new request is admitted.");
	sb_printf(o, "moepager_serve_draining %d\n", atomic_load(&h->draining) ? 1 : 0);
	metrics_family(o, "moepager_serve_ready_seconds", "gauge",
		       "From the process's start to listening, the experts warmed.");
	sb_printf(o, "moepager_serve_ready_seconds %.6f\n", h->cfg.ready_s);
	metrics_family(o, "moepager_serve_warm_seconds", "gauge",
		       "Of those, warming the experts and the dense weights (--warm).");
	sb_printf(o, "moepager_serve_warm_seconds %.6f\n", h->cfg.warm_s);
	metrics_family(o, "moepager_http_handler_seconds_total", "counter",
		       "Time in the HTTP handlers (parsing, tokenizing, answering).");
	sb_printf(o, "moepager_http_handler_seconds_total %.9f\n",
		  (double)atomic_load(&h->handler_ns) / 1e9);
	metrics_family(o, "moepager_http_handler_cpu_seconds_total", "counter",
		       "The same as CPU time of the thread running them.");
	sb_printf(o, "moepager_http_handler_cpu_seconds_total %.9f\n",
		  (double)atomic_load(&h->handler_cpu_ns) / 1e9);
	metrics_family(o, "moepager_http_resumes_total", "counter",
		       "Suspended connections resumed: a stream's new tokens (one write for "
		       "those of --stream-interval-us), an answer's end.");
	sb_printf(o, "moepager_http_resumes_total %llu\n",
		  (unsigned long long)atomic_load(&h->resumes));
	metrics_family(o, "moepager_http_thread_cpu_seconds_total", "counter",
		       "CPU time of the HTTP thread (sockets, parsing, handlers, answers).");
	sb_printf(o, "moepager_http_thread_cpu_seconds_total %.9f\n",
		  atomic_load(&h->have_mhd_clock) ? (double)cli_clock_ns(h->mhd_clock) / 1e9 : 0);
	h->b->ops->metrics(h->b, o);
}

/* Connections past their deadline for headers or body are shut (MHD then closes them). */
static void close_slow(struct http_server *h, uint64_t now)
{
	uint64_t hdr = (uint64_t)h->cfg.header_timeout_s * 1000000000ull;
	uint64_t body = (uint64_t)h->cfg.body_timeout_s * 1000000000ull;

	for (struct conn *k = h->conns; k; k = k->next) {
		uint64_t limit = k->phase == PH_HEADERS ? hdr : k->phase == PH_BODY ? body : 0;

		if (!limit || k->shut || k->fd < 0 || now - k->since <= limit)
			continue;
		shutdown(k->fd, SHUT_RDWR);
		k->shut = true;
		h->slow_closed++;
	}
}

/*
 * A suspended connection is not watched by MHD: a client that left while
 * its request waited is found here (a readable socket that reads 0 bytes)
 * and its request cancelled, which resumes the connection to close it.
 */
static uint32_t find_gone(struct http_server *h, struct req **gone, uint32_t cap)
{
	uint32_t n = 0;
	char c;

	for (struct req *q = h->parked; q && n < cap; q = q->pnext) {
		if (q->fd < 0 || atomic_load(&q->gone))
			continue;
		if (recv(q->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) != 0)
			continue;
		atomic_store(&q->gone, true);
		gone[n++] = q;
	}
	return n;
}

void http_tick(struct http_server *h)
{
	struct req *gone[64];
	uint64_t ids[64];
	const struct serve_model *ms[64];
	uint32_t n;

	pthread_mutex_lock(&h->lock);
	close_slow(h, now_ns());
	n = find_gone(h, gone, 64);
	/* Parked requests stay valid while parked; their ids are all a cancel needs. */
	for (uint32_t i = 0; i < n; i++) {
		ids[i] = gone[i]->id;
		ms[i] = gone[i]->m;
	}
	pthread_mutex_unlock(&h->lock);
	for (uint32_t i = 0; i < n; i++)
		if (ms[i])
			h->b->ops->cancel(h->b, ms[i], ids[i]);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	if (getenv("MOEPAGER_DEBUG"))
		vfprintf(stderr, fmt, ap);
}

/*
 * The HTTP thread: libmicrohttpd's work (sockets, handlers, answers) and
 * the resumes steps hand over; it sleeps in epoll_wait() on both, no longer
 * than libmicrohttpd's next timeout.
 */
static void *http_loop(void *arg)
{
	struct http_server *h = arg;
	struct epoll_event ev[4];
	struct sched_param sp = { 0 };

	/*
	 * SCHED_BATCH: a woken batch thread does not preempt the running one.
	 * Woken by a step's end (wake_step()'s eventfd write), this thread
	 * preempted the scheduler's on its core, and the next step waited for
	 * its whole pass (resumes, send()s): ~8 us of a 200 us step at 1
	 * stream, ~60 of 1 ms at 8. Now it runs when a core is free or at the
	 * tick. Not fatal: a thread of normal policy only costs time.
	 */
	if (pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp))
		cli_say("the HTTP thread's SCHED_BATCH: not set");
	while (!atomic_load(&h->stop)) {
		MHD_UNSIGNED_LONG_LONG to;
		int ms = 1000, n;
		uint64_t v;

		if (MHD_get_timeout(h->d, &to) == MHD_YES && to < 1000)
			ms = (int)to;
		n = epoll_wait(h->ep, ev, 4, ms);
		if (n < 0 && errno != EINTR) {
			cli_say("epoll_wait: %s", strerror(errno));
			usleep(1000);	/* not a busy loop if it keeps failing */
		}
		for (int i = 0; i < n; i++)
			if (ev[i].data.fd == h->efd && read(h->efd, &v, sizeof(v)) < 0 &&
			    errno != EAGAIN)
				cli_say("the HTTP thread's eventfd: %s",
					strerror(errno));
		/*
		 * A connection resumed is run by the libmicrohttpd call after
		 * the one that takes it back (MHD_get_timeout() does not count
		 * it: without the second call it waits for the timeout).
		 */
		if (resume_handed(h))
			MHD_run(h->d);
		MHD_run(h->d);
		if (atomic_load(&h->quiesce) == 1) {
			h->lsock = MHD_quiesce_daemon(h->d);
			atomic_store(&h->quiesce, 2);
		}
	}
	return NULL;
}

/* The HTTP thread's eventfd and epoll set, and the thread. 0, or -errno after saying why. */
static int loop_start(struct http_server *h)
{
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);
	struct epoll_event ev = { .events = EPOLLIN };
	int err;

	h->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	h->ep = epoll_create1(EPOLL_CLOEXEC);
	if (!di || h->efd < 0 || h->ep < 0)
		goto fail;
	ev.data.fd = h->efd;
	if (epoll_ctl(h->ep, EPOLL_CTL_ADD, h->efd, &ev))
		goto fail;
	ev.data.fd = di->epoll_fd;
	if (epoll_ctl(h->ep, EPOLL_CTL_ADD, di->epoll_fd, &ev))
		goto fail;
	err = pthread_create(&h->thread, NULL, http_loop, h);
	if (err) {
		errno = err;
		goto fail;
	}
	pthread_setname_np(h->thread, "serve-http");
	h->thread_started = true;
	return 0;
fail:
	err = -(errno ? errno : EINVAL);
	return cli_error(err, "starting the HTTP thread: %s", strerror(-err));
}

/* Stops the HTTP thread (libmicrohttpd is stopped after it) and closes its fds. */
static void loop_stop(struct http_server *h)
{
	if (h->thread_started) {
		atomic_store(&h->stop, true);
		wake_loop(h);
		pthread_join(h->thread, NULL);
		h->thread_started = false;
	}
	if (h->efd >= 0)
		close(h->efd);
	if (h->ep >= 0)
		close(h->ep);
	h->efd = h->ep = -1;
}

int http_start(const struct http_config *cfg, struct serve_backend *b, struct http_server **out)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(cfg->port) };
	const union MHD_DaemonInfo *di;
	struct http_server *h;

	if (inet_pton(AF_INET, cfg->host, &sin.sin_addr) != 1) {
		return cli_error(-EINVAL, "--listen: '%s' is not an IPv4 address", cfg->host);
	}
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->cfg = *cfg;
	h->cfg.max_connections = cfg->max_connections ? cfg->max_connections : 256;
	h->cfg.max_body = cfg->max_body ? cfg->max_body : 1u << 20;
	h->cfg.idle_timeout_s = cfg->idle_timeout_s ? cfg->idle_timeout_s : 15;
	h->cfg.header_timeout_s = cfg->header_timeout_s ? cfg->header_timeout_s : 10;
	h->cfg.body_timeout_s = cfg->body_timeout_s ? cfg->body_timeout_s : 30;
	h->b = b;
	h->next_cmpl = 1;
	h->efd = h->ep = -1;
	h->tick_ns = now_ns();
	h->tick_step = UINT64_MAX;	/* not decided for step 0 */
	pthread_mutex_init(&h->lock, NULL);
	/* Before any request can come (the threads MHD starts see it set). */
	if (b->ops->on_step) {
		h->per_step = true;
		b->ops->on_step(b, wake_step, h);
	}
	/*
	 * Each connection's memory pool (headers, the response's write buffer):
	 * libmicrohttpd mmap()s one above 32 KiB, so every request paid fresh
	 * page faults and an munmap() (a TLB shootdown of the other cores) on
	 * the HTTP thread; at 32 KiB it is malloc()ed, reused from the heap.
	 */
	h->d = MHD_start_daemon(MHD_USE_ERROR_LOG | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME, 0,
				NULL, NULL,
				on_request, h,
				MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
				MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)h->cfg.idle_timeout_s,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned int)h->cfg.max_connections,
				MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(32u << 10),
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
				MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
				MHD_OPTION_END);
	if (!h->d) {
		cli_error(-EADDRINUSE, "cannot listen on %s:%u: %s", cfg->host, cfg->port,
			  strerror(errno ? errno : EADDRINUSE));
		if (b->ops->on_step)
			b->ops->on_step(b, NULL, NULL);
		pthread_mutex_destroy(&h->lock);
		free(h);
		return -EADDRINUSE;
	}
	if (loop_start(h)) {
		loop_stop(h);
		MHD_stop_daemon(h->d);
		if (b->ops->on_step)
			b->ops->on_step(b, NULL, NULL);
		pthread_mutex_destroy(&h->lock);
		free(h);
		return -EAGAIN;
	}
	di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
	h->port = di ? di->port : cfg->port;
	*out = h;
	return 0;
}

uint16_t http_port(const struct http_server *h)
{
	return h->port;
}

/* Waits up to ms for cond(h) to hold, polling. */
static bool wait_until(struct http_server *h, bool (*cond)(struct http_server *), uint32_t ms)
{
	for (uint32_t t = 0; !cond(h); t += 10) {
		if (t >= ms)
			return false;
		usleep(10000);
	}
	return true;
}

static bool no_loads(struct http_server *h)
{
	return !atomic_load(&h->loaders);
}

static bool none_suspended(struct http_server *h)
{
	return !atomic_load(&h->suspended);
}

/* Every request answered: nothing left busy on a connection. */
static bool none_busy(struct http_server *h)
{
	bool busy = false;

	pthread_mutex_lock(&h->lock);
	for (struct conn *k = h->conns; k && !busy; k = k->next)
		busy = k->phase == PH_BUSY;
	pthread_mutex_unlock(&h->lock);
	return !busy;
}

static bool quiesced(struct http_server *h)
{
	return atomic_load(&h->quiesce) == 2;
}

/* Takes the listening socket back from libmicrohttpd, on the thread that runs it. */
static MHD_socket quiesce(struct http_server *h)
{
	if (!h->thread_started)
		return MHD_quiesce_daemon(h->d);
	h->lsock = MHD_INVALID_SOCKET;
	atomic_store(&h->quiesce, 1);
	wake_loop(h);
	if (!wait_until(h, quiesced, 5000))
		return MHD_INVALID_SOCKET;	/* still listening: stopped with the daemon */
	return h->lsock;
}

uint32_t http_stop(struct http_server *h, uint32_t grace_ms)
{
	MHD_socket lsock = quiesce(h);
	uint32_t cut;

	/* New connections are refused at once instead of waiting in the backlog. */
	if (lsock != MHD_INVALID_SOCKET)
		shutdown(lsock, SHUT_RDWR);
	atomic_store(&h->draining, true);
	h->b->ops->drain(h->b, grace_ms);
	/* What still runs ends with an error its client is sent. */
	h->b->ops->stop(h->b);
	/* The scheduler has stopped: its last step's streams are handed to the HTTP thread. */
	if (h->b->ops->on_step)
		h->b->ops->on_step(h->b, NULL, NULL);
	wait_until(h, no_loads, 60000);
	wait_until(h, none_suspended, 5000);
	wait_until(h, none_busy, 5000);
	/*
	 * MHD must not stop with a suspended connection: wait_until made sure
	 * there is none. The backend goes after MHD, whose requests hold its
	 * models until they are freed.
	 */
	loop_stop(h);
	if (none_suspended(h) && no_loads(h)) {
		MHD_stop_daemon(h->d);
		h->b->ops->close(h->b);
	}
	if (lsock != MHD_INVALID_SOCKET)
		close(lsock);
	cut = atomic_load(&h->cut_short);
	if (atomic_load(&h->live))
		cli_say("%u requests still held at exit",
			atomic_load(&h->live));
	pthread_mutex_destroy(&h->lock);
	free(h);
	return cut;
}
