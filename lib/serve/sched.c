// SPDX-License-Identifier: MIT
/*
 * The scheduler: a bounded FIFO of waiting requests, a running batch of up
 * to max_batch sequences, and one thread that steps the runner over them.
 * Each step runs every decoding sequence's next token and, in what room the
 * step has left, chunks of the joining sequences' prompts; a sequence joins
 * when the batch has a place and the KV budget its prompt + max_tokens, in
 * arrival order, so no request waits behind a later one.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include <moepager/runner.h>
#include <moepager/serve.h>

#include "base/base.h"

#define DEFAULT_MAX_BATCH	8u
#define DEFAULT_MAX_QUEUE	64u
#define DEFAULT_PREFILL_CHUNK	128u
#define DEFAULT_STEP_TOKENS	512u
#define DEFAULT_MAX_TOKENS	16u
#define MAX_BATCH		256u

enum req_state { R_QUEUED = 0, R_PREFILL, R_DECODE };

struct req {
	uint64_t id;
	uint32_t *prompt;
	uint32_t n;
	struct mp_sched_params p;
	struct mp_sched_callbacks cb;
	uint64_t rng;
	enum req_state state;
	bool cancel;			/* asked for under the lock; acted on by the thread */
	struct mp_seq *seq;
	uint32_t fed;			/* prompt tokens run */
	uint32_t generated;
	uint32_t next;			/* the token its next decode runs */
	uint64_t kv;			/* KV bytes reserved while it runs */
	uint64_t seq_kv;		/* cache bytes its sequence touched before (reused) */
	uint64_t t_submit, t_join, t_first, t_last;
	uint64_t t_switch;		/* as head, first waited for another model's batch; 0: never */
	struct req *link;		/* the queue's */
};

struct mp_sched {
	struct mp_sched_config cfg;
	struct mp_runner *r;
	uint32_t vocab;
	uint32_t context;		/* the model's max_seq */

	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t work;		/* the thread: a request, a cancel, close */
	pthread_cond_t idle;		/* drain: nothing waits or runs */

	/* Under lock. */
	struct req *qhead, *qtail;
	uint32_t nq;
	struct req **run;		/* the running batch (the thread changes it, under lock) */
	uint32_t nrun;
	uint64_t next_id;
	uint64_t kv_used;
	uint64_t t_step_end;		/* the last step's end (gather(): who waited already) */
	bool draining, stopping;
	struct mp_sched_stats st;
	/* mp_sched_call(): one call at a time, run by the thread between two steps. */
	int (*call_fn)(void *arg);
	void *call_arg;
	int call_ret;
	bool call_busy, call_done;
	pthread_cond_t called;		/* the caller: its call ran (or never will) */

	/* The thread's own. */
	struct mp_batch_item *items;
	struct req **item_req;
	/*
	 * Finished requests' sequences, reused by the next ones: a KV cache
	 * mapped, faulted in and unmapped per request cost more than the
	 * scheduler's per-step work. At most max_batch, each of the model's
	 * context; under a KV budget the pages they hold stay within it.
	 */
	struct mp_seq **pool;
	uint64_t *pool_kv;		/* bytes of cache each pooled one has touched */
	uint32_t npool;
	uint64_t pooled_kv;
	uint64_t reused;		/* copied into st.seqs_reused under lock */
};

static const double hist_bounds[MP_SCHED_HIST_BUCKETS] = {
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, INFINITY,
};

const double *mp_sched_hist_bounds(void)
{
	return hist_bounds;
}

static void hist_add(struct mp_sched_hist *h, double v)
{
	uint32_t b = 0;

	while (b + 1 < MP_SCHED_HIST_BUCKETS && v > hist_bounds[b])
		b++;
	h->count[b]++;
	h->sum += v;
	h->n++;
}

static double seconds(uint64_t ns)
{
	return (double)ns / 1e9;
}

/* The calling thread's CPU time: unlike the wall clock, it stops while the thread is preempted. */
static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * The thread's CPU time between steps (sched_cpu_seconds). A read of the
 * clock is a system call that takes the run queue's lock, 1-4 us on this
 * VM (docs/serve.md, s29), on the critical path of steps of ~125 us, so
 * only one gap in CPU_EVERY is read, drawn at random, and each gap not
 * read counts as the recent mean of those read (est). Drawn at random and
 * not every CPU_EVERY-th: a request of a multiple of CPU_EVERY tokens
 * ended in a read gap every time, and its end (on_done(), its sequence
 * pooled: tens of us) stood for CPU_EVERY gaps (docs/serve.md, s32). The
 * rare costly work is read exactly where it runs: the requests a step
 * ended (special, taken out of the gap holding it) and the gap after an
 * idle wait (the joins). The reads lie outside the runner's wall time; a
 * read gap holds a read's own cost (the first read's return, the second's
 * entry: what two reads back to back differ by, calib), taken out of the
 * mean and counted as the reads' cost, 2 x calib, where they happen.
 * Thread only.
 */
#define CPU_EVERY	32u

struct cpu_gap {
	uint64_t mark;			/* the clock as the gap began, when valid */
	bool valid;
	bool exact;			/* this gap is read and stands for itself alone */
	uint64_t special;		/* ns of this gap counted already (requests ended) */
	uint64_t est;			/* ns: the mean gap, from those read (1/4 each) */
	uint64_t calib;			/* ns two reads back to back differ by (the least of a few) */
	uint64_t rng;			/* xorshift64: which gaps are read */
};

static void cpu_gap_init(struct cpu_gap *g)
{
	uint64_t a, b;

	g->calib = UINT64_MAX;
	for (int i = 0; i < 8; i++) {
		a = thread_cpu_ns();
		b = thread_cpu_ns();
		g->calib = MP_MIN(g->calib, b - a);
	}
	g->rng = mp_now_ns() | 1;
	g->mark = thread_cpu_ns();
	g->valid = g->exact = true;
}

/* Whether the gap after this step is read: one in CPU_EVERY, at random. */
static bool cpu_gap_draw(struct cpu_gap *g)
{
	g->rng ^= g->rng << 13;
	g->rng ^= g->rng >> 7;
	g->rng ^= g->rng << 17;
	return g->rng % CPU_EVERY == 0;
}

/* A gap ends at CPU clock c (read when g->valid) or unread: counted. Under lock. */
static void cpu_gap_end(struct mp_sched *s, struct cpu_gap *g, bool read, uint64_t c)
{
	uint64_t d;

	if (read && g->valid) {
		d = c - g->mark;
		d = d > g->calib + g->special ? d - g->calib - g->special : 0;
		s->st.sched_cpu_seconds += seconds(d + 2 * g->calib);
		if (!g->exact)
			g->est = g->est - g->est / 4 + d / 4;
	} else {
		s->st.sched_cpu_seconds += seconds(g->est);
	}
	g->special = 0;
	g->valid = g->exact = false;
}

/*
 * Work of the current gap read exactly (c0, c1 around it: their own cost,
 * calib inside, calib outside, counted with it). Under lock.
 */
static void cpu_gap_special(struct mp_sched *s, struct cpu_gap *g, uint64_t c0, uint64_t c1)
{
	uint64_t d = c1 - c0 + g->calib;

	s->st.sched_cpu_seconds += seconds(d);
	g->special += d;
}

static int check_config(const struct mp_sched_config *c)
{
	int err = mp_check_reserved(c->reserved, MP_ARRAY_SIZE(c->reserved), "scheduler config");

	if (err)
		return err;
	if (!c->runner)
		return mp_err(-EINVAL, "scheduler: no runner");
	if (c->max_batch > MAX_BATCH)
		return mp_err(-EINVAL, "scheduler: max_batch %u above %u", c->max_batch, MAX_BATCH);
	if (c->step_tokens && c->step_tokens < (c->max_batch ? c->max_batch : DEFAULT_MAX_BATCH))
		return mp_err(-EINVAL, "scheduler: step_tokens %u below max_batch: a step must hold "
			      "every decode", c->step_tokens);
	if (c->gather_ns > 1000000000u)
		return mp_err(-EINVAL, "scheduler: gather_ns %llu above 1 s",
			      (unsigned long long)c->gather_ns);
	return 0;
}

static void *loop(void *arg);

static void sched_free(struct mp_sched *s)
{
	for (uint32_t i = 0; i < s->npool; i++)
		mp_seq_close(s->pool[i]);
	free(s->pool);
	free(s->pool_kv);
	free(s->run);
	free(s->items);
	free(s->item_req);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->work);
	pthread_cond_destroy(&s->idle);
	pthread_cond_destroy(&s->called);
	free(s);
}

int mp_sched_open(const struct mp_sched_config *cfg, struct mp_sched **out)
{
	struct mp_sched *s;
	int err;

	if (!cfg || !out)
		return mp_err(-EINVAL, "scheduler: NULL %s", cfg ? "out" : "config");
	*out = NULL;
	err = check_config(cfg);
	if (err)
		return err;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->cfg = *cfg;
	s->cfg.max_batch = cfg->max_batch ? cfg->max_batch : DEFAULT_MAX_BATCH;
	s->cfg.max_queue = cfg->max_queue ? cfg->max_queue : DEFAULT_MAX_QUEUE;
	s->cfg.prefill_chunk = cfg->prefill_chunk ? cfg->prefill_chunk : DEFAULT_PREFILL_CHUNK;
	s->cfg.step_tokens = cfg->step_tokens ? cfg->step_tokens :
			     MP_MAX(DEFAULT_STEP_TOKENS, s->cfg.max_batch);
	s->r = cfg->runner;
	s->vocab = mp_runner_geometry(s->r)->vocab;
	s->context = mp_runner_geometry(s->r)->max_seq;
	s->st.max_batch = s->cfg.max_batch;
	s->next_id = 1;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->idle, NULL);
	pthread_cond_init(&s->called, NULL);
	s->run = calloc(s->cfg.max_batch, sizeof(*s->run));
	s->items = calloc(s->cfg.max_batch, sizeof(*s->items));
	s->item_req = calloc(s->cfg.max_batch, sizeof(*s->item_req));
	s->pool = calloc(s->cfg.max_batch, sizeof(*s->pool));
	s->pool_kv = calloc(s->cfg.max_batch, sizeof(*s->pool_kv));
	if (!s->run || !s->items || !s->item_req || !s->pool || !s->pool_kv) {
		sched_free(s);
		return -ENOMEM;
	}
	err = -pthread_create(&s->thread, NULL, loop, s);
	if (err) {
		sched_free(s);
		return mp_err(err, "scheduler: cannot start its thread");
	}
	s->started = true;
	*out = s;
	return 0;
}

/*
 * Submitting and cancelling
 */

static int check_request(const struct mp_sched *s, uint32_t n, const struct mp_sched_params *p,
			 uint32_t max_tokens)
{
	uint64_t kv;

	if (p->temperature < 0 || !(p->temperature <= 100))
		return mp_err(-EINVAL, "request: temperature %g out of [0, 100]",
			      (double)p->temperature);
	if (p->top_p < 0 || !(p->top_p <= 1))
		return mp_err(-EINVAL, "request: top_p %g out of [0, 1]", (double)p->top_p);
	if (!p->no_eos && p->eos >= s->vocab)
		return mp_err(-EINVAL, "request: eos %u is not a token (vocabulary %u)", p->eos,
			      s->vocab);
	if (max_tokens > s->context || n > s->context - max_tokens)
		return mp_err(-EINVAL, "request: prompt of %u tokens + max_tokens %u exceeds the "
			      "context of %u", n, max_tokens, s->context);
	kv = mp_seq_kv_bytes(s->r, n + max_tokens);
	if (s->cfg.kv_budget && kv > s->cfg.kv_budget)
		return mp_err(-EINVAL, "request: prompt of %u tokens + max_tokens %u needs %llu "
			      "bytes of KV cache, above the budget of %llu", n, max_tokens,
			      (unsigned long long)kv, (unsigned long long)s->cfg.kv_budget);
	if (p->model >= mp_runner_models(s->r) || p->reserved32)
		return mp_err(-EINVAL, "request: model %u, the runner has %u%s", p->model,
			      mp_runner_models(s->r), p->reserved32 ? "; reserved32 must be 0" : "");
	return mp_check_reserved(p->reserved, MP_ARRAY_SIZE(p->reserved), "request params");
}

static struct req *req_new(const uint32_t *prompt, uint32_t n, const struct mp_sched_params *p,
			   const struct mp_sched_callbacks *cb)
{
	struct req *q = calloc(1, sizeof(*q));

	if (!q)
		return NULL;
	q->prompt = malloc(n * sizeof(*prompt));
	if (!q->prompt) {
		free(q);
		return NULL;
	}
	memcpy(q->prompt, prompt, n * sizeof(*prompt));
	q->n = n;
	q->p = *p;
	if (!q->p.max_tokens)
		q->p.max_tokens = DEFAULT_MAX_TOKENS;
	q->rng = p->seed;
	q->cb = *cb;
	q->t_submit = mp_now_ns();
	return q;
}

int mp_sched_submit(struct mp_sched *s, const uint32_t *prompt, uint32_t n,
		    const struct mp_sched_params *params, const struct mp_sched_callbacks *cb,
		    uint64_t *id)
{
	static const struct mp_sched_params greedy;
	const struct mp_sched_params *p = params ? params : &greedy;
	uint32_t max_tokens = p->max_tokens ? p->max_tokens : DEFAULT_MAX_TOKENS;
	struct req *q;
	int err;

	if (!s || !prompt || !n || !cb || !cb->done)
		return mp_err(-EINVAL, "request: %s", !s ? "no scheduler" : !prompt || !n ?
			      "empty prompt" : "no done callback");
	for (uint32_t i = 0; i < n; i++)
		if (prompt[i] >= s->vocab)
			return mp_err(-EINVAL, "request: prompt token %u is id %u, vocabulary has "
				      "%u", i, prompt[i], s->vocab);
	err = check_request(s, n, p, max_tokens);
	if (err)
		return err;
	q = req_new(prompt, n, p, cb);
	if (!q)
		return mp_err(-ENOMEM, "request: out of memory for a prompt of %u tokens", n);
	q->kv = mp_seq_kv_bytes(s->r, n + q->p.max_tokens);
	pthread_mutex_lock(&s->lock);
	if (s->draining || s->stopping) {
		err = -ESHUTDOWN;
	} else if (s->nq >= s->cfg.max_queue) {
		s->st.rejected++;
		err = -EAGAIN;
	} else {
		q->id = s->next_id++;
		if (s->qtail)
			s->qtail->link = q;
		else
			s->qhead = q;
		s->qtail = q;
		s->nq++;
		s->st.submitted++;
		if (id)
			*id = q->id;
		pthread_cond_signal(&s->work);
	}
	pthread_mutex_unlock(&s->lock);
	if (err) {
		free(q->prompt);
		free(q);
	}
	return err;
}

int mp_sched_cancel(struct mp_sched *s, uint64_t id)
{
	int err = -ENOENT;

	pthread_mutex_lock(&s->lock);
	for (struct req *q = s->qhead; q && err; q = q->link)
		if (q->id == id) {
			q->cancel = true;
			err = 0;
		}
	for (uint32_t i = 0; i < s->nrun && err; i++)
		if (s->run[i]->id == id) {
			s->run[i]->cancel = true;
			err = 0;
		}
	if (!err)
		pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->lock);
	return err;
}

/*
 * The thread
 */

/*
 * Keeps a finished request's sequence, its map let go, for the next one, or
 * closes it (the pool is full, the KV budget would be exceeded, or its step
 * failed). Thread only.
 */
static void pool_put(struct mp_sched *s, struct req *q, bool ok)
{
	struct mp_seq *seq = q->seq;
	uint64_t kv;

	if (!seq)
		return;
	/* The pages a sequence touched stay: count the most it ever held. */
	kv = MP_MAX(q->seq_kv, mp_seq_kv_bytes(s->r, mp_seq_pos(seq)));
	if (!ok || s->npool == s->cfg.max_batch ||
	    (s->cfg.kv_budget && s->pooled_kv + kv > s->cfg.kv_budget) ||
	    /* Kept with no request's map: done may release the adapter behind it. */
	    mp_seq_reuse(seq, &(struct mp_seq_config){ .request = (uint32_t)q->id })) {
		mp_seq_close(seq);
		return;
	}
	s->pool_kv[s->npool] = kv;
	s->pooled_kv += kv;
	s->pool[s->npool++] = seq;
}

/* A sequence for cfg: a pooled one reused, else a new one of the model's context. Thread only. */
static int pool_get(struct mp_sched *s, const struct mp_seq_config *cfg, struct req *q)
{
	struct mp_seq_config c = *cfg;
	int err;

	if (s->npool) {
		struct mp_seq *seq = s->pool[s->npool - 1];

		err = mp_seq_reuse(seq, cfg);
		if (err)
			return err;
		s->npool--;
		s->pooled_kv -= s->pool_kv[s->npool];
		s->reused++;
		q->seq = seq;
		q->seq_kv = s->pool_kv[s->npool];
		return 0;
	}
	/* The whole context, so that any later request fits: only touched pages are backed. */
	c.max_seq = s->context;
	return mp_seq_open(s->r, &c, &q->seq);
}

/* Finishes a request that has left the queue and the batch: done, then freed. Unlocked. */
static void finish(struct mp_sched *s, struct req *q, enum mp_sched_finish why, int err)
{
	uint64_t now = mp_now_ns();
	struct mp_sched_timing t = {
		.queued = q->t_join ? seconds(q->t_join - q->t_submit) : seconds(now - q->t_submit),
		.first_token = q->t_first ? seconds(q->t_first - q->t_submit) : 0,
		.total = seconds(now - q->t_submit),
		.prompt_tokens = q->n,
		.tokens = q->generated,
	};

	/* Put away first: done may release what the sequence borrowed (its adapter's maps). */
	pool_put(s, q, why != MP_FINISH_ERROR);
	q->cb.done(q->cb.arg, why, err, &t);
	free(q->prompt);
	free(q);
}

/* Counts how a request ended and the latency it had. Under lock. */
static void account(struct mp_sched *s, const struct req *q, enum mp_sched_finish why)
{
	s->st.finished[why]++;
	if (q->t_first)
		hist_add(&s->st.ttft, seconds(q->t_first - q->t_submit));
	if (q->generated > 1)
		hist_add(&s->st.tpot, seconds(q->t_last - q->t_first) / (q->generated - 1));
}

/* Takes the running request i out of the batch (freeing its KV reservation). Under lock. */
static struct req *unrun(struct mp_sched *s, uint32_t i)
{
	struct req *q = s->run[i];

	s->kv_used -= q->kv;
	s->run[i] = s->run[--s->nrun];
	return q;
}

/*
 * Moves what is cancelled (or everything, when closing) out of the queue
 * and the batch into *out. Under lock.
 */
static void reap(struct mp_sched *s, bool all, struct req **out)
{
	struct req **pp = &s->qhead, *prev = NULL;

	while (*pp) {
		struct req *q = *pp;

		if (!all && !q->cancel) {
			prev = q;
			pp = &q->link;
			continue;
		}
		*pp = q->link;
		if (s->qtail == q)
			s->qtail = prev;
		s->nq--;
		q->link = *out;
		*out = q;
	}
	for (uint32_t i = 0; i < s->nrun;) {
		if (!all && !s->run[i]->cancel) {
			i++;
			continue;
		}
		struct req *q = unrun(s, i);

		q->link = *out;
		*out = q;
	}
}

/*
 * Swapping runner: the head may join when it is of the active model, or,
 * once the batch is empty, after its model is activated. Called locked.
 */
static bool head_model_ready(struct mp_sched *s)
{
	int active = mp_runner_active(s->r);
	uint64_t t0;

	if (active < 0 || s->qhead->p.model == (uint32_t)active)
		return true;
	if (s->nrun) {
		/* The clock only once per waiting head: this runs at every step it waits. */
		if (!s->qhead->t_switch)
			s->qhead->t_switch = mp_now_ns();
		return false;
	}
	t0 = mp_now_ns();
	if (s->qhead->t_switch)
		s->st.switch_wait_seconds += seconds(t0 - s->qhead->t_switch);
	/* A refused swap (no such model) lets it join anyway: its step fails it, nobody hangs. */
	if (mp_runner_activate(s->r, s->qhead->p.model))
		return true;
	if (s->cfg.on_swap)
		s->cfg.on_swap(s->cfg.on_swap_arg, s->qhead->p.model);
	s->st.swaps++;
	s->st.swap_seconds += seconds(mp_now_ns() - t0);
	return true;
}

/* Unlinks q, whose predecessor in the queue is prev (NULL: the head), into the batch. Locked. */
static void join(struct mp_sched *s, struct req *prev, struct req *q)
{
	if (prev)
		prev->link = q->link;
	else
		s->qhead = q->link;
	if (s->qtail == q)
		s->qtail = prev;
	s->nq--;
	q->link = NULL;
	q->state = R_PREFILL;
	q->t_join = mp_now_ns();
	s->kv_used += q->kv;
	s->run[s->nrun++] = q;
}

/*
 * group_ns: the head waits for another model; the active model's queued
 * requests join ahead of it, in order, while it has waited less than
 * group_ns, so it is served within group_ns plus one batch. Called locked.
 */
static void admit_group(struct mp_sched *s)
{
	int active = mp_runner_active(s->r);
	struct req *prev = s->qhead, *q;

	if (!s->cfg.group_ns || active < 0 || !s->qhead ||
	    s->qhead->p.model == (uint32_t)active ||
	    mp_now_ns() - s->qhead->t_submit >= s->cfg.group_ns)
		return;
	while ((q = prev->link) && s->nrun < s->cfg.max_batch) {
		if (q->p.model != (uint32_t)active) {
			prev = q;
			continue;
		}
		if (s->cfg.kv_budget && s->kv_used + q->kv > s->cfg.kv_budget)
			break;
		join(s, prev, q);
		s->st.grouped++;
	}
}

/* The realtime clock (the conditions') ns from now. */
static void deadline_at(struct timespec *ts, uint64_t ns)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += (time_t)(ns / 1000000000u);
	ts->tv_nsec += (long)(ns % 1000000000u);
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/*
 * The batch is empty and a request waits: waits while more keep coming
 * (each within gather_ns of the last, or of the start of the wait) so a
 * burst's prefills share a step. Once steps have run, that quiet window is
 * at most a quarter of a mean step (what a late request would lose: a step
 * of its own); the whole wait is at most 4 x gather_ns and ends once
 * max_batch wait. A head queued before the last step ended (behind a full
 * batch or the KV budget, or while the last sequences ran their last step)
 * has waited already: no wait then. Called locked;
 * returns the time it slept, and counts a wait only when it slept.
 */
static uint64_t gather(struct mp_sched *s)
{
	uint64_t t0, quiet = s->cfg.gather_ns, end, waited;
	bool slept = false;

	if (!s->cfg.gather_ns || !s->qhead || s->nrun || s->qhead->t_submit < s->t_step_end)
		return 0;
	t0 = mp_now_ns();
	if (s->st.steps)
		quiet = MP_MIN(quiet, (uint64_t)(s->st.step_seconds / (double)s->st.steps * 0.25e9));
	end = t0 + 4 * s->cfg.gather_ns;
	for (;;) {
		uint64_t now = mp_now_ns(), until;
		struct timespec ts;

		if (!s->qtail || s->nq >= s->cfg.max_batch || s->stopping || s->draining ||
		    s->call_fn)
			break;
		until = MP_MIN(MP_MAX(s->qtail->t_submit, t0) + quiet, end);
		if (now >= until)
			break;
		deadline_at(&ts, until - now);
		pthread_cond_timedwait(&s->work, &s->lock, &ts);
		slept = true;
	}
	if (!slept)
		return 0;
	waited = mp_now_ns() - t0;
	s->st.gathers++;
	s->st.gather_seconds += seconds(waited);
	return waited;
}

/* Heads of the queue join the batch while it has a place and the KV budget room. Under lock. */
static void admit(struct mp_sched *s)
{
	while (s->qhead && s->nrun < s->cfg.max_batch &&
	       (!s->cfg.kv_budget || s->kv_used + s->qhead->kv <= s->cfg.kv_budget) &&
	       head_model_ready(s))
		join(s, NULL, s->qhead);
	admit_group(s);
}

/* The step's items: every decode, then prompt chunks in the room left. Thread only. */
static uint32_t build(struct mp_sched *s, struct req **run, uint32_t nrun)
{
	uint32_t n = 0, rows = 0;

	for (uint32_t i = 0; i < nrun; i++) {
		struct req *q = run[i];

		if (q->state != R_DECODE)
			continue;
		s->items[n] = (struct mp_batch_item){ q->seq, &q->next, 1, MP_BATCH_DECODE };
		s->item_req[n++] = q;
		rows++;
	}
	for (uint32_t i = 0; i < nrun && rows < s->cfg.step_tokens; i++) {
		struct req *q = run[i];
		uint32_t c = MP_MIN(MP_MIN(q->n - q->fed, s->cfg.prefill_chunk),
				    s->cfg.step_tokens - rows);

		if (q->state != R_PREFILL)
			continue;
		s->items[n] = (struct mp_batch_item){ q->seq, q->prompt + q->fed, c,
						      MP_BATCH_PREFILL };
		s->item_req[n++] = q;
		rows += c;
	}
	return n;
}

/*
 * After a step, the item's request: its next token when it has logits to
 * sample (a decode, or the prompt's last chunk). Returns a finish reason,
 * or -1 while it goes on. Thread only, unlocked.
 */
static int advance(struct mp_sched *s, struct req *q, const struct mp_batch_item *it)
{
	uint32_t tok;
	uint64_t now;

	if (it->kind == MP_BATCH_PREFILL) {
		q->fed += it->n;
		if (q->fed < q->n)
			return -1;
	}
	tok = mp_sample(mp_seq_logits(q->seq), s->vocab, &q->p, &q->rng);
	now = mp_now_ns();
	if (!q->t_first)
		q->t_first = now;
	q->t_last = now;
	q->generated++;
	q->state = R_DECODE;
	q->next = tok;
	if (q->cb.token && q->cb.token(q->cb.arg, tok))
		return MP_FINISH_STOP;
	if (!q->p.no_eos && tok == q->p.eos)
		return MP_FINISH_STOP;
	if (q->generated >= q->p.max_tokens)
		return MP_FINISH_LENGTH;
	return -1;
}

/* Opens the sequences of requests that just joined. Thread only, unlocked. */
static int open_seqs(struct mp_sched *s, struct req **run, uint32_t nrun)
{
	for (uint32_t i = 0; i < nrun; i++) {
		struct req *q = run[i];
		struct mp_seq_config sc = { .request = (uint32_t)q->id,
					    .max_seq = q->n + q->p.max_tokens, .map = q->p.map,
					    .model = q->p.model };
		int err;

		if (q->seq)
			continue;
		err = pool_get(s, &sc, q);
		if (err)
			return err;
	}
	return 0;
}

/* Bucket of a step of n sequences: ceil(log2(n)), capped. */
static uint32_t batch_bucket(uint32_t n)
{
	uint32_t b = n <= 1 ? 0 : 32u - (uint32_t)__builtin_clz(n - 1);

	return MP_MIN(b, MP_SCHED_BATCH_BUCKETS - 1u);
}

struct step_out {
	struct req **done;		/* [max_batch] requests that ended */
	int *why;
	uint32_t ndone;
	uint32_t items, rows, tokens;
	double seconds;			/* in the runner */
	/* The clocks (wall, this thread's CPU) as the runner began and ended. */
	uint64_t t0, t1, c0, c1;
	bool cpu0, cpu1;		/* c0, c1 to be read (struct cpu_gap) */
	int err;
};

/* One step over the batch; ended requests go to out->done with their reasons. Unlocked. */
static void step(struct mp_sched *s, struct req **run, uint32_t nrun, struct step_out *out)
{
	out->ndone = out->items = out->rows = out->tokens = 0;
	out->seconds = 0;
	out->err = open_seqs(s, run, nrun);
	if (!out->err)
		out->items = build(s, run, nrun);
	/* The CPU clock's reads are the thread's own work: outside the runner's time. */
	if (out->cpu0)
		out->c0 = thread_cpu_ns();
	out->t0 = mp_now_ns();
	if (!out->err)
		out->err = mp_runner_batch(s->r, s->items, out->items);
	out->t1 = mp_now_ns();
	if (out->cpu1)
		out->c1 = thread_cpu_ns();
	out->seconds = seconds(out->t1 - out->t0);
	if (out->err)
		return;
	for (uint32_t i = 0; i < out->items; i++) {
		uint32_t before = s->item_req[i]->generated;
		int w = advance(s, s->item_req[i], &s->items[i]);

		out->tokens += s->item_req[i]->generated - before;
		out->rows += s->items[i].n;
		if (w >= 0) {
			out->done[out->ndone] = s->item_req[i];
			out->why[out->ndone++] = w;
		}
	}
}

/* Folds a step into the counters and takes its ended requests out of the batch. Under lock. */
static void settle(struct mp_sched *s, struct req **run, uint32_t nrun, struct step_out *out)
{
	s->st.step_seconds += out->seconds;
	s->st.seqs_reused = s->reused;
	if (!out->err) {
		s->st.steps++;
		s->st.tokens += out->tokens;
		s->st.batch_seqs += out->items;
		s->st.batch_rows += out->rows;
		s->st.batch_size[batch_bucket(out->items)]++;
		for (uint32_t i = 0; i < out->items; i++) {
			const struct mp_batch_item *it = &s->items[i];

			if (it->kind == MP_BATCH_PREFILL)
				s->st.prompt_tokens += it->n;
		}
	} else {
		/* A failed step fails every request in it (it may have read a poisoned expert). */
		out->ndone = 0;
		for (uint32_t i = 0; i < nrun; i++) {
			out->done[out->ndone] = run[i];
			out->why[out->ndone++] = MP_FINISH_ERROR;
		}
	}
	for (uint32_t i = 0; i < out->ndone; i++) {
		struct req *q = out->done[i];

		for (uint32_t j = 0; j < s->nrun; j++)
			if (s->run[j] == q) {
				unrun(s, j);
				break;
			}
		account(s, q, out->why[i]);
	}
}

static void finish_list(struct mp_sched *s, struct req *list, enum mp_sched_finish why, int err)
{
	while (list) {
		struct req *next = list->link;

		finish(s, list, why, err);
		list = next;
	}
}

/* Ends what reap() took: counted under lock, finished (callbacks) unlocked. */
static void reap_and_finish(struct mp_sched *s, bool all)
{
	enum mp_sched_finish why = all ? MP_FINISH_SHUTDOWN : MP_FINISH_CANCELLED;
	struct req *list = NULL;

	reap(s, all, &list);
	if (!list)
		return;
	for (struct req *q = list; q; q = q->link)
		account(s, q, why);
	pthread_mutex_unlock(&s->lock);
	finish_list(s, list, why, all ? -ESHUTDOWN : -ECANCELED);
	pthread_mutex_lock(&s->lock);
}

/* Runs a pending mp_sched_call() (no step runs: the thread is here). Called locked. */
static void run_call(struct mp_sched *s)
{
	int (*fn)(void *) = s->call_fn;

	s->call_fn = NULL;
	pthread_mutex_unlock(&s->lock);
	s->call_ret = fn(s->call_arg);
	pthread_mutex_lock(&s->lock);
	s->call_done = true;
	pthread_cond_broadcast(&s->called);
}

static void *loop(void *arg)
{
	struct mp_sched *s = arg;
	struct req **run = calloc(s->cfg.max_batch, sizeof(*run));
	struct step_out out = {
		.done = calloc(s->cfg.max_batch, sizeof(*out.done)),
		.why = calloc(s->cfg.max_batch, sizeof(*out.why)),
	};

	/*
	 * The thread's own work is what lies between one runner call and the
	 * next (the wall clock is read as the runner begins and ends, the CPU
	 * clock around one gap in CPU_EVERY), less the time it sleeps waiting.
	 */
	uint64_t t_mark = mp_now_ns();
	struct cpu_gap cg = { 0 };

	/*
	 * gather()'s waits are a quarter step, tens of us on a small model:
	 * the default 50 us timer slack would more than double them.
	 */
	prctl(PR_SET_TIMERSLACK, 1000UL);
	cpu_gap_init(&cg);
	pthread_mutex_lock(&s->lock);
	while (run && out.done && out.why) {
		uint64_t c0, c1;
		uint32_t nrun;

		reap_and_finish(s, s->stopping);
		if (s->stopping)
			break;
		if (s->call_fn) {
			run_call(s);
			continue;
		}
		t_mark += gather(s);	/* an empty batch's; asleep: not the thread's work */
		admit(s);
		if (!s->nrun) {
			uint64_t t = mp_now_ns(), c = thread_cpu_ns();

			s->st.sched_seconds += seconds(t - t_mark);
			cpu_gap_end(s, &cg, true, c);
			pthread_cond_broadcast(&s->idle);
			pthread_cond_wait(&s->work, &s->lock);
			t_mark = mp_now_ns();
			cg.mark = c;	/* CPU time asleep is none; waking is the thread's work */
			cg.valid = cg.exact = true;
			continue;
		}
		nrun = s->nrun;
		memcpy(run, s->run, nrun * sizeof(*run));
		pthread_mutex_unlock(&s->lock);

		out.cpu0 = cg.valid;
		out.cpu1 = cpu_gap_draw(&cg);
		step(s, run, nrun, &out);
		if (s->cfg.on_step)
			s->cfg.on_step(s->cfg.on_step_arg);
		pthread_mutex_lock(&s->lock);
		s->st.sched_seconds += seconds(out.t0 - t_mark);
		cpu_gap_end(s, &cg, out.cpu0, out.c0);
		t_mark = out.t1;
		cg.mark = out.c1;
		cg.valid = out.cpu1;
		s->t_step_end = out.t1;
		settle(s, run, nrun, &out);
		if (!out.ndone)
			continue;	/* the lock kept: most steps end no request */
		pthread_mutex_unlock(&s->lock);
		c0 = thread_cpu_ns();
		for (uint32_t i = 0; i < out.ndone; i++)
			finish(s, out.done[i], out.why[i], out.why[i] == MP_FINISH_ERROR ? out.err : 0);
		c1 = thread_cpu_ns();
		pthread_mutex_lock(&s->lock);
		cpu_gap_special(s, &cg, c0, c1);
	}
	/* Out of memory for the thread's own arrays: nothing can run, so nothing may wait. */
	s->stopping = true;
	reap_and_finish(s, true);
	pthread_cond_broadcast(&s->idle);
	pthread_cond_broadcast(&s->called);	/* a call still pending never runs */
	pthread_mutex_unlock(&s->lock);
	free(run);
	free(out.done);
	free(out.why);
	return NULL;
}

/*
 * Draining, closing, statistics
 */

int mp_sched_drain(struct mp_sched *s, uint32_t timeout_ms)
{
	struct timespec ts;
	int err = 0;

	deadline_at(&ts, (uint64_t)timeout_ms * 1000000u);
	pthread_mutex_lock(&s->lock);
	s->draining = true;
	pthread_cond_signal(&s->work);
	while ((s->nq || s->nrun) && !s->stopping && !err)
		if (pthread_cond_timedwait(&s->idle, &s->lock, &ts) == ETIMEDOUT)
			err = -ETIMEDOUT;
	if (s->nq || s->nrun)
		err = -ETIMEDOUT;
	pthread_mutex_unlock(&s->lock);
	return err;
}

void mp_sched_close(struct mp_sched *s)
{
	if (!s)
		return;
	if (s->started) {
		pthread_mutex_lock(&s->lock);
		s->stopping = true;
		pthread_cond_signal(&s->work);
		pthread_mutex_unlock(&s->lock);
		pthread_join(s->thread, NULL);
	}
	sched_free(s);
}

int mp_sched_call(struct mp_sched *s, int (*fn)(void *arg), void *arg)
{
	bool ran;
	int ret;

	if (!s || !fn)
		return mp_err(-EINVAL, "scheduler call: NULL %s", s ? "function" : "scheduler");
	pthread_mutex_lock(&s->lock);
	while (s->call_busy && !s->stopping)
		pthread_cond_wait(&s->called, &s->lock);
	if (s->stopping) {
		pthread_mutex_unlock(&s->lock);
		return mp_err(-ESHUTDOWN, "scheduler call: closing, the function did not run");
	}
	s->call_busy = true;
	s->call_done = false;
	s->call_fn = fn;
	s->call_arg = arg;
	pthread_cond_signal(&s->work);
	/* Taken (call_fn cleared) means running: wait for it even if stopping meanwhile. */
	while (!s->call_done && !(s->stopping && s->call_fn))
		pthread_cond_wait(&s->called, &s->lock);
	ran = s->call_done;
	ret = s->call_ret;
	s->call_fn = NULL;
	s->call_busy = false;
	pthread_cond_broadcast(&s->called);
	pthread_mutex_unlock(&s->lock);
	if (!ran)
		return mp_err(-ESHUTDOWN, "scheduler call: closing, the function did not run");
	return ret;
}

void mp_sched_stats(struct mp_sched *s, struct mp_sched_stats *out)
{
	pthread_mutex_lock(&s->lock);
	*out = s->st;
	out->queued = s->nq;
	out->running = s->nrun;
	out->kv_bytes = s->kv_used;
	pthread_mutex_unlock(&s->lock);
}
