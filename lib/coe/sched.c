// SPDX-License-Identifier: MIT
/*
 * CoServe's dependency-aware scheduler (§4.2): executors, each a thread with
 * its own engine and queue, over one model pool. A request is assigned to
 * the queue that keeps the longest predicted finish time lowest (ties: the
 * least added latency; no load cost when its model is resident or already
 * queued there), arranged behind the queue's requests of the same model,
 * and run in batches the splitter cuts (the profile's largest useful batch,
 * and what the batch memory holds). While a batch runs, the models of the
 * queue's coming groups are loaded, as far ahead as a load takes. A
 * finished model's output picks the next model of the request's chain,
 * which is scheduled the same way.
 * The baselines (FCFS, round robin, LRU, FIFO) are the same machine with
 * those parts switched off.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "coe/exec.h"
#include "coe/pool.h"
#include "coe/queue.h"

#define DEFAULT_MAX_BATCH	8u
#define DEFAULT_TOKENS		4u
#define MAX_HELD		16u	/* models an executor holds for its coming groups */
#define LOOKAHEAD		(2 * MAX_HELD)	/* coming groups prefetch looks at */

struct executor {
	struct mp_coe_sched *s;
	uint32_t idx;
	pthread_t thread;
	bool started;
	struct coe_exec *ex;
	struct coe_queue q;
	uint32_t held[MAX_HELD];	/* models loaded (or kept) for coming groups */
	uint32_t n_held;
	uint64_t *ids;			/* a batch's request ids and outputs */
	uint32_t *out;
	struct creq **batch;
};

struct mp_coe_sched {
	struct mp_coe *c;
	struct mp_pager *p;
	struct mp_coe_sched_config cfg;
	uint32_t *cap;			/* per executor x arch: the splitter's batch cap */
	double *T, *add;		/* per executor: assign's scratch */
	/*
	 * Per model: requests waiting that will run it (queued for it, the
	 * queues count those) or may (queued for or running on a preliminary
	 * model: its output may lead here). Eviction spares these.
	 */
	uint32_t *wanted;
	bool *warm_set;			/* per model: in memory when the run started */
	bool *ran;			/* per model: a batch ran on it */
	uint64_t reserve;		/* bytes prefetches leave for the executors' demand loads */
	pthread_mutex_t lock;
	pthread_cond_t work_cv;		/* executors: a request queued, or stop */
	pthread_cond_t room_cv;		/* a model released: room may be made */
	pthread_cond_t done_cv;		/* every chain finished */
	struct executor *ex;
	struct coe_pool pool;
	uint32_t rr;
	uint64_t outstanding;		/* chains not finished */
	bool stop;
	uint64_t t0, last_done;
	struct mp_coe_sched_stats st;
	int err;
};

/*
 * Costs from the profile (or unit costs without one)
 */

struct cost {
	double k, b, load;
};

static struct cost cost_of(const struct mp_coe_sched *s, uint32_t arch)
{
	const struct mp_coe_perf *e = mp_coe_profile_find(s->cfg.profile, s->cfg.threads, arch);

	if (!e)
		return (struct cost){ 1, 1, 10 };
	/* A fit on a noisy machine can cross zero: no part of a latency is negative. */
	return (struct cost){ MP_MAX(e->k_ns, 0.0), MP_MAX(e->b_ns, 0.0), e->load_file_ns };
}

static uint32_t batch_cap(const struct mp_coe_sched *s, const struct coe_exec *ex, uint32_t arch)
{
	const struct mp_coe_perf *e = mp_coe_profile_find(s->cfg.profile, s->cfg.threads, arch);
	uint32_t cap = s->cfg.max_batch ? s->cfg.max_batch : e ? e->max_batch : DEFAULT_MAX_BATCH;

	if (s->cfg.batch_memory) {
		/* The batch memory is shared by the executors running at once. */
		uint64_t item = e ? e->item_bytes : coe_exec_item_bytes(ex, arch);
		uint64_t fit = s->cfg.batch_memory / s->cfg.executors / (item ? item : 1);

		cap = (uint32_t)MP_MIN((uint64_t)cap, MP_MAX(fit, 1));
	}
	return MP_MAX(cap, 1u);
}

/* The latency a request of model m adds to executor x's queue (CoServe §4.2). */
static double added_latency(const struct mp_coe_sched *s, const struct executor *x, uint32_t m)
{
	uint32_t arch = s->c->models[m].arch;
	struct cost k = cost_of(s, arch);
	uint32_t queued = x->q.count[m];
	/* It joins a queued batch of its model, or starts one (paying B). */
	double exec = k.k + (queued % s->cap[x->idx * s->c->n_archs + arch] ? 0 : k.b);
	/* No load when the model is in memory or a request queued here loads it first. */
	double sw = s->pool.resident[m] || queued ? 0 : k.load;

	return exec + sw;
}

uint32_t coe_assign_pick(const double *T, const double *add, uint32_t n)
{
	double top1 = -1, top2 = -1, best_span = 0;
	uint32_t best = 0, first = 0;

	for (uint32_t i = 0; i < n; i++) {
		if (T[i] > top1) {
			top2 = top1;
			top1 = T[i];
			first = i;
		} else if (T[i] > top2) {
			top2 = T[i];
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		/* The total time is the longest queue's: this one's with the request, or another. */
		double span = MP_MAX(T[i] + add[i], i == first ? top2 : top1);

		if (!i || span < best_span || (span == best_span && add[i] < add[best])) {
			best = i;
			best_span = span;
		}
	}
	return best;
}

/* Request assigning (round robin for the baselines). Sets r->pred. */
static struct executor *assign(struct mp_coe_sched *s, struct creq *r)
{
	uint32_t n = s->cfg.executors, best;

	if (s->cfg.assign == MP_COE_ASSIGN_RR || n == 1) {
		struct executor *x = &s->ex[s->rr++ % n];

		r->pred = added_latency(s, x, r->model);
		return x;
	}
	for (uint32_t i = 0; i < n; i++) {
		s->T[i] = s->ex[i].q.T;
		s->add[i] = added_latency(s, &s->ex[i], r->model);
	}
	best = coe_assign_pick(s->T, s->add, n);
	r->pred = s->add[best];
	return &s->ex[best];
}

/* Assigns and arranges a request of model m (called locked). */
static int submit_locked(struct mp_coe_sched *s, uint32_t id, uint32_t m)
{
	uint64_t t0 = mp_now_ns();
	struct creq *r = calloc(1, sizeof(*r));
	struct executor *x;

	if (!r)
		return mp_err(-ENOMEM, "coe scheduler: out of memory");
	r->id = id;
	r->model = m;
	x = assign(s, r);
	coe_queue_add(&x->q, r, s->cfg.arrange, s->pool.resident[m]);
	coe_want_next(s->c, s->wanted, m, 1);
	pthread_cond_broadcast(&s->work_cv);
	s->st.sched_ns += mp_now_ns() - t0;
	return 0;
}

/*
 * Executors
 */

/* Takes the head group's first requests (one model) up to the splitter's cap. */
static uint32_t take_batch(struct mp_coe_sched *s, struct executor *x)
{
	uint32_t m = x->q.head->model, n = 0;
	uint32_t cap = s->cap[x->idx * s->c->n_archs + s->c->models[m].arch];

	while (x->q.head && x->q.head->model == m && n < cap)
		x->batch[n++] = coe_queue_pop(&x->q);
	return n;
}

/* Acquires the batch's model, waiting while every resident model is in use. */
static int acquire_demand(struct mp_coe_sched *s, uint32_t m)
{
	uint64_t t0 = mp_now_ns(), waited = 0, managed = s->pool.manage_ns;
	int ret;

	while ((ret = coe_pool_acquire(&s->pool, m, true)) == -ENOSPC && !s->stop) {
		uint64_t w = mp_now_ns();

		pthread_cond_wait(&s->room_cv, &s->lock);
		waited += mp_now_ns() - w;
	}
	/* The pager's part (evicting, starting reads) counts as expert management. */
	s->st.wait_room_ns += waited;
	s->st.sched_ns += mp_now_ns() - t0 - waited - (s->pool.manage_ns - managed);
	return ret;
}

static bool is_held(const struct executor *x, uint32_t m)
{
	for (uint32_t i = 0; i < x->n_held; i++)
		if (x->held[i] == m)
			return true;
	return false;
}

/* Gives up the hold on m (its group's batch took a reference of its own). */
static void unhold(struct mp_coe_sched *s, struct executor *x, uint32_t m)
{
	for (uint32_t i = 0; i < x->n_held; i++) {
		if (x->held[i] == m) {
			x->held[i] = x->held[--x->n_held];
			coe_pool_release(&s->pool, m);
			return;
		}
	}
}

uint32_t coe_prefetch_due(const double *work, const double *load, uint32_t n, double ahead)
{
	uint32_t i;

	for (i = 0; i < n && ahead <= load[i]; i++)
		ahead += work[i];
	return i;
}

/*
 * Prefetch (called locked when a batch of `running` starts): holds the
 * models of the queue's coming groups in order, loading the missing ones
 * as prefetches, so the disk keeps reading while there is work ahead. A
 * prefetch only takes the room of models no request wants and less used
 * than its own (coe_pool_acquire()): a group it cannot load now loads when
 * it is due or its batch starts. A model already in memory is held (kept
 * from eviction until its group runs) when its group is due
 * (coe_prefetch_due()). Holds leave `reserve` bytes of the budget, so every
 * executor's demand load finds room.
 */
static void prefetch_ahead(struct mp_coe_sched *s, struct executor *x, uint32_t running,
			   uint32_t n_running)
{
	struct cost k = cost_of(s, s->c->models[running].arch);
	double work[LOOKAHEAD], load[LOOKAHEAD];
	uint32_t model[LOOKAHEAD], n = 0, due;

	for (struct creq *r = x->q.head; r && n < LOOKAHEAD; n++) {
		struct cost g = cost_of(s, s->c->models[r->model].arch);
		uint32_t cnt = 0;

		model[n] = r->model;
		for (; r && r->model == model[n]; r = r->next)
			cnt++;
		work[n] = g.k * cnt + g.b;
		load[n] = g.load;
	}
	due = coe_prefetch_due(work, load, n, k.k * n_running + k.b);
	for (uint32_t i = 0; i < n && x->n_held < MAX_HELD; i++) {
		uint32_t g = model[i];

		if (g == running || is_held(x, g) || (i >= due && s->pool.resident[g]))
			continue;
		if (s->pool.in_use_bytes + (s->pool.in_use[g] ? 0 : coe_model_bytes(s->c, g)) +
		    s->reserve > s->pool.budget)
			break;
		if (coe_pool_acquire(&s->pool, g, false) < 0)
			break;
		x->held[x->n_held++] = g;
	}
}

/* After a batch (locked): each request's next model, or the end of its chain. */
static void finish_batch(struct mp_coe_sched *s, struct executor *x, uint32_t n, uint32_t m,
			 int err, bool acquired)
{
	uint64_t now = mp_now_ns();

	for (uint32_t i = 0; i < n; i++) {
		struct creq *r = x->batch[i];
		int next = err ? -ENOENT : mp_coe_next(s->c, m, r->id, x->out[i]);

		coe_want_next(s->c, s->wanted, m, -1);
		s->st.runs += !err;
		s->ran[m] |= !err;
		s->st.failed += !!err;
		if (!err)
			s->st.output_hash += coe_mix(coe_mix(r->id, m), x->out[i]);
		if (next >= 0 && !submit_locked(s, r->id, (uint32_t)next)) {
			free(r);
			continue;
		}
		s->st.requests++;
		s->last_done = now;
		if (!--s->outstanding)
			pthread_cond_broadcast(&s->done_cv);
		free(r);
	}
	if (acquired)
		coe_pool_release(&s->pool, m);
	pthread_cond_broadcast(&s->room_cv);
}

/* Runs one batch of model m unlocked: the whole model in, then the runner. */
static int run_batch(struct mp_coe_sched *s, struct executor *x, uint32_t m, uint32_t n)
{
	uint64_t t0 = mp_now_ns(), t1, t2;
	int err;

	for (uint32_t i = 0; i < n; i++)
		x->ids[i] = x->batch[i]->id;
	err = coe_model_touch(s->c, s->p, m);
	t1 = mp_now_ns();
	if (!err)
		err = coe_exec_run(x->ex, m, x->ids, n, x->out);
	t2 = mp_now_ns();
	pthread_mutex_lock(&s->lock);
	s->st.stall_ns += t1 - t0;
	s->st.infer_ns += t2 - t1;
	s->st.batches++;
	return err;
}

static void *executor_main(void *arg)
{
	struct executor *x = arg;
	struct mp_coe_sched *s = x->s;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		uint32_t m, n;
		uint64_t t0;
		bool acquired;
		int err;

		t0 = mp_now_ns();
		while (!x->q.head && !s->stop)
			pthread_cond_wait(&s->work_cv, &s->lock);
		/* Before the first arrival and after the last completion it is no one's idle. */
		if (s->t0 && s->outstanding)
			s->st.idle_ns += mp_now_ns() - MP_MAX(t0, s->t0);
		if (s->stop)
			break;
		t0 = mp_now_ns();
		m = x->q.head->model;
		n = take_batch(s, x);
		s->st.sched_ns += mp_now_ns() - t0;
		err = acquire_demand(s, m);
		acquired = err >= 0;
		t0 = mp_now_ns();
		if (acquired) {
			unhold(s, x, m);
			x->q.running = (int)m;
		}
		if (err >= 0 && s->cfg.prefetch) {
			uint64_t managed = s->pool.manage_ns;

			prefetch_ahead(s, x, m, n);
			t0 += s->pool.manage_ns - managed;
		}
		s->st.sched_ns += mp_now_ns() - t0;
		pthread_mutex_unlock(&s->lock);
		if (err >= 0)
			err = run_batch(s, x, m, n);
		else
			pthread_mutex_lock(&s->lock);
		if (err < 0 && !s->err)
			s->err = err;
		finish_batch(s, x, n, m, err < 0 ? err : 0, acquired);
		x->q.running = -1;
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/*
 * Lifetime
 */

static int open_executor(struct mp_coe_sched *s, uint32_t i)
{
	struct executor *x = &s->ex[i];
	uint32_t maxcap = 1;
	int err;

	x->s = s;
	x->idx = i;
	if (coe_queue_init(&x->q, s->c->n_models, s->wanted))
		return -ENOMEM;
	/* The runners' sequences cover the profile's caps before the memory cap cuts them. */
	for (uint32_t a = 0; a < s->c->n_archs; a++) {
		const struct mp_coe_perf *e = mp_coe_profile_find(s->cfg.profile, s->cfg.threads, a);

		maxcap = MP_MAX(maxcap, s->cfg.max_batch ? s->cfg.max_batch :
					e ? e->max_batch : DEFAULT_MAX_BATCH);
	}
	err = coe_exec_open(s->c, s->p, s->cfg.engine, s->cfg.threads, maxcap, s->cfg.tokens,
			    &x->ex);
	if (err)
		return err;
	for (uint32_t a = 0; a < s->c->n_archs; a++)
		s->cap[i * s->c->n_archs + a] = MP_MIN(batch_cap(s, x->ex, a), maxcap);
	x->ids = calloc(maxcap, sizeof(*x->ids));
	x->out = calloc(maxcap, sizeof(*x->out));
	x->batch = calloc(maxcap, sizeof(*x->batch));
	return x->ids && x->out && x->batch ? 0 : -ENOMEM;
}

static int check_config(struct mp_coe_sched *s)
{
	uint64_t largest = 0, pinned = 0;

	if (!s->cfg.executors || s->cfg.executors > 256)
		return mp_err(-EINVAL, "coe scheduler: %u executors (1 to 256)", s->cfg.executors);
	for (uint32_t m = 0; m < s->c->n_models; m++) {
		largest = MP_MAX(largest, coe_model_bytes(s->c, m));
		pinned += s->c->models[m].pinned ? coe_model_bytes(s->c, m) : 0;
	}
	/* Prefetches leave room for a demand load per executor (and the pinned are in use). */
	s->reserve = (uint64_t)s->cfg.executors * largest;
	/* Each executor runs one model and may need room for its next, beside the pinned. */
	if (s->pool.budget < 2ull * s->cfg.executors * largest + pinned)
		return mp_err(-EINVAL, "coe scheduler: a budget of %llu bytes cannot hold two "
			      "models of %llu bytes per executor (%u executors) and the %llu bytes "
			      "pinned", (unsigned long long)s->pool.budget,
			      (unsigned long long)largest, s->cfg.executors,
			      (unsigned long long)pinned);
	if (s->pool.budget > mp_pager_budget(s->p))
		return mp_err(-EINVAL, "coe scheduler: budget %llu above the pager's %llu",
			      (unsigned long long)s->pool.budget,
			      (unsigned long long)mp_pager_budget(s->p));
	return 0;
}

static void warm(struct mp_coe_sched *s)
{
	if (!s->cfg.no_warm)
		coe_pool_warm(&s->pool);
	mp_pager_wait_idle(s->p, 600000);
	/* The pinned and warm models are loaded before the run: not switches. */
	s->st.warm_loads = s->pool.loads;
	s->pool.loads = s->pool.loads_file = s->pool.loads_host = s->pool.bytes_loaded = 0;
	s->pool.prefetched = s->pool.distinct = 0;
	memset(s->pool.loaded_once, 0, s->c->n_models * sizeof(*s->pool.loaded_once));
	memcpy(s->warm_set, s->pool.resident, s->c->n_models * sizeof(*s->warm_set));
}

int mp_coe_sched_open(struct mp_coe *c, struct mp_pager *p,
		      const struct mp_coe_sched_config *cfg, struct mp_coe_sched **out)
{
	struct mp_coe_sched *s;
	int err;

	if (!c || !p || !cfg || !out)
		return mp_err(-EINVAL, "coe scheduler: NULL argument");
	err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved), "coe sched config");
	if (err)
		return err;
	if (!cfg->executors)
		return mp_err(-EINVAL, "coe scheduler: zero executors (at least one runs requests)");
	s = calloc(1, sizeof(*s));
	if (!s)
		return mp_err(-ENOMEM, "coe scheduler: out of memory");
	s->c = c;
	s->p = p;
	s->cfg = *cfg;
	s->cfg.threads = cfg->threads ? cfg->threads : 1;
	s->cfg.tokens = cfg->tokens ? cfg->tokens : DEFAULT_TOKENS;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->work_cv, NULL);
	pthread_cond_init(&s->room_cv, NULL);
	pthread_cond_init(&s->done_cv, NULL);
	err = coe_pool_init(&s->pool, c, p, cfg->evict, cfg->budget ? cfg->budget :
			    mp_pager_budget(p));
	if (!err)
		err = check_config(s);
	if (err)
		goto close;
	s->ex = calloc(cfg->executors, sizeof(*s->ex));
	s->cap = calloc((size_t)cfg->executors * c->n_archs, sizeof(*s->cap));
	s->T = calloc(cfg->executors, sizeof(*s->T));
	s->add = calloc(cfg->executors, sizeof(*s->add));
	s->wanted = calloc(c->n_models, sizeof(*s->wanted));
	s->warm_set = calloc(c->n_models, sizeof(*s->warm_set));
	s->ran = calloc(c->n_models, sizeof(*s->ran));
	s->pool.wanted = s->wanted;
	if (!s->ex || !s->cap || !s->T || !s->add || !s->wanted || !s->warm_set || !s->ran) {
		err = mp_err(-ENOMEM, "coe scheduler: out of memory");
		goto close;
	}
	for (uint32_t i = 0; i < cfg->executors && !err; i++)
		err = open_executor(s, i);
	if (!err)
		err = coe_pool_pin(&s->pool);
	if (err)
		goto close;
	warm(s);
	for (uint32_t i = 0; i < cfg->executors && !err; i++) {
		err = -pthread_create(&s->ex[i].thread, NULL, executor_main, &s->ex[i]);
		s->ex[i].started = !err;
	}
	if (err) {
		mp_err(err, "coe scheduler: cannot start an executor thread");
		goto close;
	}
	*out = s;
	return 0;
close:
	mp_coe_sched_close(s);
	return err;
}

static void sleep_until(uint64_t t)
{
	uint64_t now = mp_now_ns();
	struct timespec ts;

	if (t <= now)
		return;
	ts.tv_sec = (time_t)((t - now) / 1000000000ull);
	ts.tv_nsec = (long)((t - now) % 1000000000ull);
	nanosleep(&ts, NULL);
}

int mp_coe_sched_run(struct mp_coe_sched *s, const struct mp_coe_request *reqs, uint32_t n)
{
	int err = 0;

	for (uint32_t i = 0; i < n; i++)
		if (reqs[i].model >= s->c->n_models)
			return mp_err(-EINVAL, "coe scheduler: request %u: model %u out of range",
				      reqs[i].id, reqs[i].model);
	/* Locked: executors read it to count their idle time. */
	pthread_mutex_lock(&s->lock);
	s->t0 = mp_now_ns();
	pthread_mutex_unlock(&s->lock);
	for (uint32_t i = 0; i < n && !err; i++) {
		sleep_until(s->t0 + reqs[i].arrival_ns);
		pthread_mutex_lock(&s->lock);
		s->outstanding++;
		err = submit_locked(s, reqs[i].id, reqs[i].model);
		if (err)
			s->outstanding--;
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_lock(&s->lock);
	while (s->outstanding)
		pthread_cond_wait(&s->done_cv, &s->lock);
	s->st.makespan_ns = s->last_done > s->t0 ? s->last_done - s->t0 : 0;
	err = err ? err : s->err;
	pthread_mutex_unlock(&s->lock);
	return err;
}

void mp_coe_sched_stats(struct mp_coe_sched *s, struct mp_coe_sched_stats *out)
{
	pthread_mutex_lock(&s->lock);
	*out = s->st;
	out->switches = s->pool.loads;
	out->loads_file = s->pool.loads_file;
	out->loads_host = s->pool.loads_host;
	out->bytes_loaded = s->pool.bytes_loaded;
	out->evictions = s->pool.evictions;
	out->manage_ns = s->pool.manage_ns;
	out->prefetched = s->pool.prefetched;
	out->distinct_loads = s->pool.distinct;
	out->cold_models = 0;
	for (uint32_t m = 0; m < s->c->n_models; m++)
		out->cold_models += s->ran[m] && !s->warm_set[m];
	memset(out->reserved, 0, sizeof(out->reserved));
	pthread_mutex_unlock(&s->lock);
}

void mp_coe_sched_close(struct mp_coe_sched *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	s->stop = true;
	pthread_cond_broadcast(&s->work_cv);
	pthread_cond_broadcast(&s->room_cv);
	pthread_mutex_unlock(&s->lock);
	for (uint32_t i = 0; s->ex && i < s->cfg.executors; i++) {
		struct executor *x = &s->ex[i];

		if (x->started)
			pthread_join(x->thread, NULL);
		coe_exec_close(x->ex);
		coe_queue_fini(&x->q);
		free(x->ids);
		free(x->out);
		free(x->batch);
	}
	coe_pool_fini(&s->pool);
	pthread_cond_destroy(&s->work_cv);
	pthread_cond_destroy(&s->room_cv);
	pthread_cond_destroy(&s->done_cv);
	pthread_mutex_destroy(&s->lock);
	free(s->ex);
	free(s->cap);
	free(s->T);
	free(s->add);
	free(s->wanted);
	free(s->warm_set);
	free(s->ran);
	free(s);
}
