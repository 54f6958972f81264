// SPDX-License-Identifier: MIT
/* loadgen's report: throughput, TTFT/TPOT/latency percentiles, SLO attainment, server counters. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loadgen/loadgen.h"

static json_t *percentiles(const double *v, size_t n)
{
	return json_pack("{s:f, s:f, s:f, s:I}", "p50", cli_quantile(v, n, 0.50), "p90",
			 cli_quantile(v, n, 0.90), "p99", cli_quantile(v, n, 0.99), "n",
			 (json_int_t)n);
}

static double delta(const struct lg_metrics *b, const struct lg_metrics *a, size_t off)
{
	double x = *(const double *)((const char *)b + off);
	double y = *(const double *)((const char *)a + off);

	return x < 0 || y < 0 ? -1 : y - x;
}

#define D(field) delta(before, after, offsetof(struct lg_metrics, field))

/* a / step, or -1 when a counter is missing. */
static double share(double a, double b, double step)
{
	return step > 0 && a >= 0 && b >= 0 ? (a + b) / step : -1;
}

/*
 * What the server counted during the run (its /metrics before and after).
 * Shares are of the runner's step time: overhead_share the scheduler's own
 * wall time plus the HTTP handlers' (as before; wall time counts preemption
 * on a busy machine, and the handlers run beside the steps, on their own
 * thread); sched_share the scheduler's wall time alone, what every step
 * waits for; overhead_cpu_share the CPU time of the scheduler's own work
 * plus all of the HTTP thread's (sockets, libmicrohttpd, handlers): all the
 * serving costs besides the model.
 */
static json_t *server(const struct lg_metrics *before, const struct lg_metrics *after)
{
	double hits = D(hits), misses = D(misses), step = D(step_s), sched = D(sched_s);
	double http = D(http_s), bsum = D(batch_sum), bcount = D(batch_count);
	double sched_cpu = D(sched_cpu_s), thread_cpu = D(http_thread_cpu_s);

	if (!before->ok || !after->ok)
		return json_null();
	return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
			 "hit_rate", hits >= 0 && hits + misses > 0 ? hits / (hits + misses) : -1,
			 "steps", D(steps), "mean_batch", bcount > 0 ? bsum / bcount : -1,
			 "step_seconds", step, "sched_seconds", sched, "http_handler_seconds", http,
			 "sched_cpu_seconds", sched_cpu, "http_handler_cpu_seconds", D(http_cpu_s),
			 "http_thread_cpu_seconds", thread_cpu,
			 "overhead_share", share(sched, http, step),
			 "sched_share", share(sched, 0, step),
			 "overhead_cpu_share", share(sched_cpu, thread_cpu, step));
}

void lg_report(const struct lg_run *r, const struct lg_metrics *before,
	       const struct lg_metrics *after, double slo_ttft_ms, double slo_tpot_ms, bool json)
{
	double *ttft = calloc(r->n + 1, sizeof(double)), *tpot = calloc(r->n + 1, sizeof(double));
	double *lat = calloc(r->n + 1, sizeof(double));
	size_t nt = 0, np = 0, nl = 0, completed = 0, errors = 0, rejected = 0, met = 0;
	size_t retried = 0;
	uint64_t tokens = 0, per_req[64] = { 0 }, per_tok[64] = { 0 };
	json_t *o, *models = json_object();

	if (!ttft || !tpot || !lat || !models)
		goto out;
	for (uint32_t i = 0; i < r->n; i++) {
		const struct lg_req *q = &r->reqs[i];
		double f = (q->t_first - q->t_arrive) * 1e3, p = 0;

		per_req[q->model]++;
		retried += q->retries > 0;
		rejected += q->status == 503;
		if (q->error) {
			errors += q->status != 503;
			continue;
		}
		completed++;
		tokens += q->tokens;
		per_tok[q->model] += q->tokens;
		lat[nl++] = (q->t_end - q->t_arrive) * 1e3;
		if (q->t_first)
			ttft[nt++] = f;
		if (q->tokens > 1 && q->t_last > q->t_first) {
			p = (q->t_last - q->t_first) * 1e3 / (q->tokens - 1);
			tpot[np++] = p;
		}
		met += q->t_first && f <= slo_ttft_ms && p <= slo_tpot_ms;
	}
	for (uint32_t m = 0; m < r->models->n; m++)
		json_object_set_new(models, r->models->name[m],
				    json_pack("{s:I, s:I}", "requests", (json_int_t)per_req[m],
					      "tokens", (json_int_t)per_tok[m]));
	o = json_pack("{s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:o, s:o, s:o, s:f, s:{s:f, s:f}, "
		      "s:o, s:o, s:I}",
		      "requests", (json_int_t)r->n, "completed", (json_int_t)completed,
		      "errors", (json_int_t)errors, "rejected", (json_int_t)rejected,
		      "offered_rate", r->rate, "wall_s", r->wall,
		      "throughput_tok_s", r->wall > 0 ? (double)tokens / r->wall : 0,
		      "throughput_req_s", r->wall > 0 ? (double)completed / r->wall : 0,
		      "ttft_ms", percentiles(ttft, nt), "tpot_ms", percentiles(tpot, np),
		      "latency_ms", percentiles(lat, nl),
		      "slo_attainment", r->n ? (double)met / r->n : 0,
		      "slo", "ttft_ms", slo_ttft_ms, "tpot_ms", slo_tpot_ms,
		      "models", models, "server", server(before, after),
		      "retried", (json_int_t)retried);
	models = NULL;
	if (json) {
		json_dumpf(o, stdout, JSON_INDENT(1));
		putchar('\n');
	} else {
		printf("requests %u, completed %zu, errors %zu, rejected %zu over %.1f s\n"
		       "throughput %.1f tok/s, TTFT p50/p99 %.0f/%.0f ms, TPOT p50/p99 %.1f/%.1f ms, "
		       "SLO attainment %.1f %%\n", r->n, completed, errors, rejected, r->wall,
		       r->wall > 0 ? (double)tokens / r->wall : 0, cli_quantile(ttft, nt, 0.5),
		       cli_quantile(ttft, nt, 0.99), cli_quantile(tpot, np, 0.5),
		       cli_quantile(tpot, np, 0.99), r->n ? 100.0 * (double)met / r->n : 0);
	}
	json_decref(o);
out:
	json_decref(models);
	free(ttft);
	free(tpot);
	free(lat);
}
