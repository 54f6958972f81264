// SPDX-License-Identifier: MIT
/* The runner's, scheduler's, pager's and prefetcher's counters as Prometheus text (metrics.h). */
#include <math.h>

#include "serve/metrics.h"

void metrics_family(struct strbuf *o, const char *name, const char *type, const char *help)
{
	sb_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(struct strbuf *o, const char *name, const char *type, const char *help,
		const char *model, double v)
{
	metrics_family(o, name, type, help);
	sb_printf(o, "%s{model=\"%s\"} %.17g\n", name, model, v);
}

/* A histogram from per-bucket counts: cumulative _bucket lines, _sum and _count. */
static void histogram(struct strbuf *o, const char *name, const char *help, const char *model,
		      const uint64_t *count, const double *bounds, uint32_t n, double sum)
{
	uint64_t acc = 0;

	metrics_family(o, name, "histogram", help);
	for (uint32_t i = 0; i < n; i++) {
		acc += count[i];
		if (isinf(bounds[i]))
			sb_printf(o, "%s_bucket{model=\"%s\",le=\"+Inf\"} %llu\n", name, model,
				  (unsigned long long)acc);
		else
			sb_printf(o, "%s_bucket{model=\"%s\",le=\"%g\"} %llu\n", name, model,
				  bounds[i], (unsigned long long)acc);
	}
	sb_printf(o, "%s_sum{model=\"%s\"} %.17g\n%s_count{model=\"%s\"} %llu\n", name, model, sum,
		  name, model, (unsigned long long)acc);
}

/* A label value: backslash, quote and newline escaped, as the text format wants. */
static const char *label(const char *s, char *buf, size_t cap)
{
	size_t n = 0;

	for (; *s && n + 3 < cap; s++) {
		if (*s == '\\' || *s == '"' || *s == '\n')
			buf[n++] = '\\';
		buf[n++] = *s == '\n' ? 'n' : *s;
	}
	buf[n] = '\0';
	return buf;
}

void metrics_dense(struct strbuf *o, const char *name, uint64_t lent, uint64_t read)
{
	char buf[256];
	const char *model = label(name, buf, sizeof(buf));

	one(o, "moepager_runner_dense_lent_bytes", "gauge",
	    "Dense weight bytes the runner reads where its source holds them (a pager daemon's "
	    "memfd): no copy, nothing read", model, (double)lent);
	one(o, "moepager_runner_dense_read_bytes", "gauge",
	    "Dense weight bytes the runner read from the model files into its own memory", model,
	    (double)read);
}

void metrics_threads(struct strbuf *o, const char *name, uint32_t threads, uint64_t changes)
{
	char buf[256];
	const char *model = label(name, buf, sizeof(buf));

	one(o, "moepager_engine_threads", "gauge",
	    "Threads the engine's ops use now (POST /admin/threads changes them)", model,
	    (double)threads);
	one(o, "moepager_engine_thread_changes_total", "counter",
	    "Changes of the engine's threads made while serving", model, (double)changes);
}

void metrics_sched(struct strbuf *o, const char *name, const struct mp_sched_stats *s)
{
	char buf[256];
	const char *model = label(name, buf, sizeof(buf));
	static const char *const finish[] = { "length", "stop", "cancelled", "error", "shutdown" };
	double batch_bounds[MP_SCHED_BATCH_BUCKETS];

	for (uint32_t i = 0; i < MP_SCHED_BATCH_BUCKETS; i++)
		batch_bounds[i] = i + 1 < MP_SCHED_BATCH_BUCKETS ? (double)(1u << i) : INFINITY;
	metrics_family(o, "moepager_requests_total", "counter",
		       "Requests that ended, by how they ended.");
	for (uint32_t i = 0; i < 5; i++)
		sb_printf(o, "moepager_requests_total{model=\"%s\",finish=\"%s\"} %llu\n", model,
			  finish[i], (unsigned long long)s->finished[i]);
	one(o, "moepager_requests_rejected_total", "counter",
	    "Requests refused because the queue was full (HTTP 503).", model, (double)s->rejected);
	one(o, "moepager_prompt_tokens_total", "counter", "Prompt tokens run.", model,
	    (double)s->prompt_tokens);
	one(o, "moepager_generation_tokens_total", "counter", "Tokens generated.", model,
	    (double)s->tokens);
	one(o, "moepager_steps_total", "counter", "Batched runner steps.", model, (double)s->steps);
	one(o, "moepager_step_seconds_total", "counter", "Time in runner steps.", model,
	    s->step_seconds);
	one(o, "moepager_sched_seconds_total", "counter",
	    "The scheduler thread's own time between steps, asleep not counted (admitting, "
	    "opening sequences, sampling, the token and done callbacks).", model,
	    s->sched_seconds);
	one(o, "moepager_sched_cpu_seconds_total", "counter",
	    "The same as the scheduler thread's CPU time (not counting time it was preempted).",
	    model, s->sched_cpu_seconds);
	one(o, "moepager_sequences_reused_total", "counter",
	    "Requests that ran in a finished request's KV cache instead of a new one.", model,
	    (double)s->seqs_reused);
	one(o, "moepager_queue_length", "gauge", "Requests waiting to join the batch.", model,
	    s->queued);
	one(o, "moepager_running_requests", "gauge", "Requests in the running batch.", model,
	    s->running);
	one(o, "moepager_kv_cache_bytes", "gauge", "KV cache bytes reserved by running requests.",
	    model, (double)s->kv_bytes);
	histogram(o, "moepager_time_to_first_token_seconds", "Time to first token.", model,
		  s->ttft.count, mp_sched_hist_bounds(), MP_SCHED_HIST_BUCKETS, s->ttft.sum);
	histogram(o, "moepager_time_per_output_token_seconds",
		  "Time per output token after the first.", model, s->tpot.count,
		  mp_sched_hist_bounds(), MP_SCHED_HIST_BUCKETS, s->tpot.sum);
	histogram(o, "moepager_batch_size", "Sequences per runner step.", model, s->batch_size,
		  batch_bounds, MP_SCHED_BATCH_BUCKETS, (double)s->batch_seqs);
	one(o, "moepager_model_swaps_total", "counter",
	    "Dense weights swapped in because the queue's head was of another model.", model,
	    (double)s->swaps);
	one(o, "moepager_model_swap_seconds_total", "counter", "Time spent swapping them.",
	    model, s->swap_seconds);
	one(o, "moepager_model_switch_wait_seconds_total", "counter",
	    "Time heads of another model waited for the running batch to end before a swap.",
	    model, s->switch_wait_seconds);
	one(o, "moepager_model_grouped_total", "counter",
	    "Requests that passed an older head of another model (--group-ms).", model,
	    (double)s->grouped);
	one(o, "moepager_gathers_total", "counter",
	    "Times an empty batch waited for a burst's requests (--gather-us).", model,
	    (double)s->gathers);
	one(o, "moepager_gather_seconds_total", "counter",
	    "Time spent in those waits (part of their requests' time to first token).", model,
	    s->gather_seconds);
}

void metrics_multi(struct strbuf *o, const char *name, const struct mp_multi_stats *s)
{
	char buf[256];
	const char *model = label(name, buf, sizeof(buf));

	one(o, "moepager_multi_models", "gauge", "Model variants served together.", model,
	    s->models);
	one(o, "moepager_multi_owned_positions", "gauge",
	    "Positions whose owner's expert serves every model (held in memory).", model,
	    s->owned);
	one(o, "moepager_multi_owned_bytes", "gauge", "Memory holding the owned experts.", model,
	    (double)s->owned_bytes);
	one(o, "moepager_multi_owned_reads_total", "counter",
	    "Expert reads served from owned positions (no I/O).", model, (double)s->owned_reads);
	one(o, "moepager_multi_paged_reads_total", "counter",
	    "Expert reads of unowned positions, asked of the pager.", model,
	    (double)s->paged_reads);
	one(o, "moepager_multi_owned_routes_total", "counter",
	    "Routed experts (per token) at owned positions: hits with no I/O.", model,
	    (double)s->owned_routes);
}

void metrics_pager(struct strbuf *o, const char *name, const struct mp_pager_stats *s)
{
	char buf[256];
	const char *model = label(name, buf, sizeof(buf));
	uint64_t routed = s->hits + s->misses;

	one(o, "moepager_pager_hits_total", "counter",
	    "Routed experts that were in place when routed.", model, (double)s->hits);
	one(o, "moepager_pager_misses_total", "counter", "Routed experts that were not.", model,
	    (double)s->misses);
	one(o, "moepager_pager_hit_rate", "gauge", "hits / (hits + misses) since start.", model,
	    routed ? (double)s->hits / (double)routed : 0);
	metrics_family(o, "moepager_pager_faults_total", "counter",
		       "Demand faults by the tier that served them.");
	sb_printf(o, "moepager_pager_faults_total{model=\"%s\",tier=\"file\"} %llu\n"
		  "moepager_pager_faults_total{model=\"%s\",tier=\"host\"} %llu\n", model,
		  (unsigned long long)s->faults_file, model, (unsigned long long)s->faults_host);
	one(o, "moepager_pager_stall_seconds_total", "counter",
	    "Time threads spent blocked in faults, summed.", model, (double)s->stall_ns / 1e9);
	one(o, "moepager_pager_read_bytes_total", "counter", "Bytes read from the file tier.",
	    model, (double)s->bytes_file);
	one(o, "moepager_pager_resident_bytes", "gauge", "Expert bytes in memory.", model,
	    (double)s->resident_bytes);
	one(o, "moepager_pager_budget_bytes", "gauge", "The expert memory budget.", model,
	    (double)s->budget_bytes);
	one(o, "moepager_pager_evictions_total", "counter", "Experts dropped from memory.", model,
	    (double)s->evictions);
	one(o, "moepager_prefetch_issued_total", "counter", "Prefetches queued.", model,
	    (double)s->prefetch_issued);
	one(o, "moepager_prefetch_used_total", "counter", "Prefetched experts used.", model,
	    (double)s->prefetch_used);
	one(o, "moepager_prefetch_wasted_total", "counter", "Prefetched experts evicted unused.",
	    model, (double)s->prefetch_wasted);
	one(o, "moepager_prefetch_late_total", "counter",
	    "Prefetches a thread faulted on while they were read.", model,
	    (double)s->prefetch_late);
}

void metrics_prefetcher(struct strbuf *o, const char *name, const struct mp_prefetcher_stats *s)
{
	char buf[256];
	const char *model = label(name, buf, sizeof(buf));
	one(o, "moepager_prefetcher_events_total", "counter", "Routing events the prefetcher handled.",
	    model, (double)s->events);
	one(o, "moepager_prefetcher_dropped_total", "counter",
	    "Routing events lost to a full queue.", model, (double)s->dropped);
	one(o, "moepager_prefetcher_policy_seconds_total", "counter",
	    "Time the prefetch policy took on its thread.", model, (double)s->policy_ns / 1e9);
}

void metrics_adapters(struct strbuf *o, const char *name, const struct mp_adapters_stats *s)
{
	char buf[256];
	const char *model = label(name, buf, sizeof(buf));

	one(o, "moepager_adapters_loaded", "gauge", "Adapters that take requests.", model,
	    s->loaded);
	one(o, "moepager_adapters_draining", "gauge",
	    "Unloaded adapters still used by running requests.", model, s->draining);
	one(o, "moepager_adapters_held_bytes", "gauge",
	    "Memory held for the loaded adapters' experts.", model, (double)s->held_bytes);
	one(o, "moepager_adapters_expert_bytes", "gauge",
	    "Bytes of the loaded adapters' experts.", model, (double)s->adapter_bytes);
	one(o, "moepager_adapters_padded_bytes", "gauge",
	    "What a layout padded to E_max rows per adapter and layer would hold.", model,
	    (double)s->padded_bytes);
	one(o, "moepager_adapters_loads_total", "counter", "Adapters loaded.", model,
	    (double)s->loads);
	one(o, "moepager_adapters_unloads_total", "counter", "Adapters unloaded.", model,
	    (double)s->unloads);
	one(o, "moepager_adapters_load_errors_total", "counter", "Adapter loads refused.", model,
	    (double)s->load_errors);
	one(o, "moepager_adapters_requests_total", "counter", "Requests served by adapters.",
	    model, (double)s->requests);
}
