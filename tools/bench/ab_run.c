// SPDX-License-Identifier: MIT
/*
 * bench-adapters' serving phases: the stream's requests one at a time, then
 * open-loop at their Poisson arrival times through each instance's
 * scheduler (continuous batching), timed token by token; the weight bytes
 * the steps read (runner counters) and the memory bandwidth around the run.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/adapterbench.h"

/* Requests still running in a run. */
struct track {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint32_t pending;
};

/*
 * One request of a run, as it went (ns on cli_now_ns()), and the weight
 * bytes its runner had read by its first and last token: the steps that
 * made its tokens after the first, whoever else they served.
 */
struct out {
	struct track *t;
	const struct mp_runner *runner;
	uint64_t t_submit, t_first, t_last;
	uint64_t b_first, b_last;
	uint32_t tokens;
	bool failed;
};

static uint64_t weight_bytes(const struct mp_runner *r)
{
	struct mp_runner_stats rs;

	mp_runner_stats(r, &rs);
	return rs.dense_bytes + rs.expert_bytes;
}

/* On the scheduler's thread, between steps: the runner's counters are still. */
static int on_token(void *arg, uint32_t token)
{
	struct out *o = arg;
	uint64_t now = cli_now_ns(), bytes = weight_bytes(o->runner);

	(void)token;
	if (!o->tokens++) {
		o->t_first = now;
		o->b_first = bytes;
	}
	o->t_last = now;
	o->b_last = bytes;
	return 0;
}

static void on_done(void *arg, enum mp_sched_finish why, int err,
		    const struct mp_sched_timing *timing)
{
	struct out *o = arg;

	(void)timing;
	pthread_mutex_lock(&o->t->lock);
	o->failed = why != MP_FINISH_LENGTH || err;
	o->t->pending--;
	pthread_cond_broadcast(&o->t->cond);
	pthread_mutex_unlock(&o->t->lock);
}

/* Request r of the stream, to its adapter's instance, greedy, exactly max_tokens tokens. */
static int submit(struct ab_setup *s, uint32_t r, struct out *o)
{
	const struct ab_opts *opt = s->b->o;
	const struct ab_req *q = &s->b->reqs[r];
	struct mp_sched_params p = { .max_tokens = opt->max_tokens, .no_eos = true,
				     .map = ab_setup_map(s, q->adapter) };
	struct mp_sched_callbacks cb = { on_token, on_done, o };
	uint64_t id;
	int err;

	o->runner = ab_setup_inst(s, q->adapter)->runner;
	pthread_mutex_lock(&o->t->lock);
	o->t->pending++;
	pthread_mutex_unlock(&o->t->lock);
	o->t_submit = cli_now_ns();
	err = mp_sched_submit(ab_setup_inst(s, q->adapter)->sched, q->prompt, opt->prompt_tokens,
			      &p, &cb, &id);
	if (err) {
		pthread_mutex_lock(&o->t->lock);
		o->t->pending--;
		pthread_mutex_unlock(&o->t->lock);
		o->failed = true;
		cli_error(0, "request %u: %s", r, strerror(-err));
	}
	return err;
}

static void wait_all(struct track *t)
{
	pthread_mutex_lock(&t->lock);
	while (t->pending)
		pthread_cond_wait(&t->cond, &t->lock);
	pthread_mutex_unlock(&t->lock);
}

static double ttft_ms(const struct out *o)
{
	return (double)(o->t_first - o->t_submit) / 1e6;
}

static double tpot_ms(const struct out *o)
{
	return o->tokens > 1 ? (double)(o->t_last - o->t_first) / 1e6 / (o->tokens - 1) : 0;
}

/* Request i on setup s, waited for: its TTFT and TPOT. */
static int run_one(struct ab_setup *s, uint32_t i, struct track *t, double *ttft, double *tpot)
{
	struct out o = { .t = t };
	int err = submit(s, i, &o);

	wait_all(t);
	*ttft = ttft_ms(&o);
	*tpot = tpot_ms(&o);
	return err ? err : o.failed ? -EIO : 0;
}

/* The median over requests of setup k's figure over base's for the same request. */
static double paired(const double *v, uint32_t n, uint32_t k, uint32_t base, uint32_t count)
{
	double r[count];

	for (uint32_t i = 0; i < count; i++)
		r[i] = v[(size_t)i * n + base] > 0 ? v[(size_t)i * n + k] / v[(size_t)i * n + base] : 0;
	return cli_median(r, count);
}

int ab_run_alone(struct ab_setup **s, uint32_t n, int base, double (*fig)[F_COUNT])
{
	const struct ab_opts *o = s[0]->b->o;
	const uint32_t count = o->alone < o->requests ? o->alone : o->requests;
	struct track t = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	double *ttft = calloc((size_t)count * n, sizeof(*ttft));
	double *tpot = calloc((size_t)count * n, sizeof(*tpot));
	int err = ttft && tpot ? 0 : -ENOMEM;

	/* Request i on every setup in turn, starting with a different one each time. */
	for (uint32_t i = 0; i < count && !err; i++)
		for (uint32_t j = 0; j < n && !err; j++) {
			uint32_t k = (i + j) % n;

			err = run_one(s[k], i, &t, &ttft[(size_t)i * n + k], &tpot[(size_t)i * n + k]);
		}
	for (uint32_t k = 0; k < n && !err; k++) {
		double v[count];

		for (uint32_t i = 0; i < count; i++)
			v[i] = ttft[(size_t)i * n + k];
		fig[k][F_ALONE_TTFT] = cli_median(v, count);
		for (uint32_t i = 0; i < count; i++)
			v[i] = tpot[(size_t)i * n + k];
		fig[k][F_ALONE_TPOT] = cli_median(v, count);
		if (base >= 0) {
			fig[k][F_ALONE_TTFT_X] = paired(ttft, n, k, (uint32_t)base, count);
			fig[k][F_ALONE_TPOT_X] = paired(tpot, n, k, (uint32_t)base, count);
		}
	}
	if (err)
		cli_error(0, "requests alone: %s",
			err == -EIO ? "a request failed" : strerror(-err));
	free(ttft);
	free(tpot);
	return err;
}

/* The counters of every instance, summed. */
struct counters {
	uint64_t bytes, steps, seqs;
	double step_s;
	uint64_t hits, misses, pf_issued, pf_row_issued, pf_used;	/* paged */
};

static void count(const struct ab_setup *s, struct counters *c)
{
	memset(c, 0, sizeof(*c));
	for (uint32_t i = 0; i < s->n_inst; i++) {
		struct mp_runner_stats rs;
		struct mp_sched_stats ss;

		mp_runner_stats(s->inst[i].runner, &rs);
		mp_sched_stats(s->inst[i].sched, &ss);
		c->bytes += rs.dense_bytes + rs.expert_bytes;
		c->steps += rs.steps;
		c->seqs += ss.batch_seqs;
		c->step_s += ss.step_seconds;
		if (s->inst[i].pager) {
			struct mp_pager_stats ps;

			mp_pager_stats(s->inst[i].pager, &ps);
			c->hits += ps.hits;
			c->misses += ps.misses;
			c->pf_issued += ps.prefetch_issued;
			c->pf_used += ps.prefetch_used;
		}
		if (s->inst[i].prefetcher) {
			struct mp_prefetcher_stats fs;

			mp_prefetcher_stats(s->inst[i].prefetcher, &fs);
			c->pf_row_issued += fs.row_issued;
		}
	}
}

static void sleep_until(uint64_t ns)
{
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ull),
			       .tv_nsec = (long)(ns % 1000000000ull) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/*
 * Each request's TPOT against the TPOT its steps' bytes allow at gbps: the
 * bytes its runner read from its first token to its last, over the tokens
 * after the first (the steps that made them, prefill chunks of others
 * included), give its bound; its ratio is its TPOT over that. Medians over
 * the requests that made two tokens or more.
 */
static void request_bounds(const struct out *outs, uint32_t n, double gbps, double *fig)
{
	double bytes[n], bound[n], ratio[n];
	uint32_t m = 0;

	for (uint32_t i = 0; i < n; i++) {
		const struct out *o = &outs[i];

		if (o->tokens < 2 || o->b_last <= o->b_first)
			continue;
		bytes[m] = (double)(o->b_last - o->b_first) / (o->tokens - 1);
		bound[m] = bytes[m] / (gbps * 1e9) * 1e3;
		ratio[m] = tpot_ms(o) / bound[m];
		m++;
	}
	fig[F_DECODE_BYTES] = m ? cli_median(bytes, m) : 0;
	fig[F_BOUND_MS] = m ? cli_median(bound, m) : 0;
	fig[F_TPOT_BOUND] = m ? cli_median(ratio, m) : 0;
}

/* Latency percentiles, throughput and what the steps read, of a finished mixed run. */
static void mixed_figures(struct ab_setup *s, const struct out *outs, uint64_t t0,
			  const struct counters *c0, const struct counters *c1, double *fig)
{
	uint32_t n = s->b->o->requests, failed = 0;
	double ttft[n], tpot[n];
	uint64_t tokens = 0, end = t0;
	double steps = (double)(c1->steps - c0->steps);

	for (uint32_t i = 0; i < n; i++) {
		ttft[i] = ttft_ms(&outs[i]);
		tpot[i] = tpot_ms(&outs[i]);
		tokens += outs[i].tokens;
		failed += outs[i].failed;
		if (outs[i].t_last > end)
			end = outs[i].t_last;
	}
	fig[F_TTFT50] = cli_quantile(ttft, n, 0.5);
	fig[F_TTFT90] = cli_quantile(ttft, n, 0.9);
	fig[F_TPOT50] = cli_quantile(tpot, n, 0.5);
	fig[F_TPOT90] = cli_quantile(tpot, n, 0.9);
	fig[F_TOK_S] = (double)tokens / ((double)(end - t0) / 1e9 -
					 s->b->reqs[0].t_arrive);
	fig[F_MEAN_BATCH] = steps ? (double)(c1->seqs - c0->seqs) / steps : 0;
	fig[F_STEP_MS] = steps ? (c1->step_s - c0->step_s) * 1e3 / steps : 0;
	fig[F_BYTES_STEP] = steps ? (double)(c1->bytes - c0->bytes) / steps : 0;
	request_bounds(outs, n, fig[F_MEMBW], fig);
	fig[F_ERRORS] = failed;
	fig[F_HIT_RATE] = c1->hits + c1->misses > c0->hits + c0->misses ?
			  (double)(c1->hits - c0->hits) /
			  (double)(c1->hits + c1->misses - c0->hits - c0->misses) : 0;
	fig[F_PF_ISSUED] = (double)(c1->pf_issued - c0->pf_issued);
	fig[F_PF_ROW_ISSUED] = (double)(c1->pf_row_issued - c0->pf_row_issued);
	fig[F_PF_USED] = (double)(c1->pf_used - c0->pf_used);
}

int ab_membw(struct mp_membw *m, double *gbps)
{
	double v[AB_MEMBW_SAMPLES];
	int err = 0;

	for (uint32_t i = 0; i < AB_MEMBW_SAMPLES && !err; i++)
		err = mp_membw_sample(m, &v[i]);
	if (!err)
		*gbps = cli_median(v, AB_MEMBW_SAMPLES);
	return err;
}

int ab_run_mixed(struct ab_setup *s, double *fig)
{
	const struct ab_bench *b = s->b;
	struct track t = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct out *outs = calloc(b->o->requests, sizeof(*outs));
	struct counters c0, c1;
	double bw[2];
	uint64_t t0;
	int err = outs ? ab_membw(b->membw, &bw[0]) : -ENOMEM;

	count(s, &c0);
	t0 = cli_now_ns();
	for (uint32_t i = 0; i < b->o->requests && !err; i++) {
		outs[i] = (struct out){ .t = &t };
		sleep_until(t0 + (uint64_t)(b->reqs[i].t_arrive * 1e9));
		err = submit(s, i, &outs[i]);
	}
	wait_all(&t);
	count(s, &c1);
	if (!err)
		err = ab_membw(b->membw, &bw[1]);
	if (!err) {
		fig[F_MEMBW] = (bw[0] + bw[1]) / 2;
		mixed_figures(s, outs, t0, &c0, &c1, fig);
	} else {
		cli_error(0, "%s setup, mixed load: %s", ab_kind_names[s->kind],
			  strerror(-err));
	}
	free(outs);
	return err;
}
