/* SPDX-License-Identifier: MIT */
/*
 * Serving: a scheduler that runs many requests over one runner with
 * continuous batching. Requests wait in a bounded FIFO queue, join the
 * running batch between steps while it has room (sequences and KV bytes),
 * prefill in chunks beside the others' decodes, sample their tokens, and
 * leave when done. One thread steps the runner; callers submit from any
 * thread and hear back through callbacks. docs/serve.md.
 */
#ifndef MOEPAGER_SERVE_H
#define MOEPAGER_SERVE_H

#include <moepager/common.h>
#include <moepager/runner.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mp_sched;

struct mp_sched_config {
	struct mp_runner *runner;	/* borrowed; only the scheduler steps it once open */
	uint32_t max_batch;		/* sequences in the running batch; 0: 8 */
	uint32_t max_queue;		/* requests waiting to join; 0: 64 */
	/*
	 * KV cache bytes the running sequences may hold, counting each one's
	 * prompt + max_tokens positions from the start; 0: no limit besides
	 * max_batch. A request that alone exceeds it is refused.
	 */
	uint64_t kv_budget;
	uint32_t prefill_chunk;		/* prompt tokens a sequence runs per step; 0: 128 */
	uint32_t step_tokens;		/* tokens per step at most (decodes go first); 0: 512 */
	/*
	 * Called from the scheduler's thread, locked, right after a swap
	 * activated model (its time counts in swap_seconds): e.g. evicting the
	 * other models' experts to serve them one at a time. NULL: nothing.
	 */
	void (*on_swap)(void *arg, uint32_t model);
	void *on_swap_arg;
	/*
	 * Called from the scheduler's thread, unlocked, after each step's token
	 * callbacks and before its done callbacks: e.g. to wake what a step's
	 * tokens are for once per step, not once per token. NULL: nothing.
	 */
	void (*on_step)(void *arg);
	void *on_step_arg;
	/*
	 * Swapping runner: while the queue's head (of another model) has
	 * waited less than this, queued requests of the active model join
	 * ahead of it, in order, so one swap serves more of them; once it
	 * has waited this long, none pass it and it is served next. 0: FIFO.
	 */
	uint64_t group_ns;
	/*
	 * A burst: requests that come one after another while the batch is
	 * empty. The first waits until none has come for this long or for a
	 * quarter of a mean step, the shorter (no longer than 4x this in all,
	 * nor once max_batch wait), so their prefills share one step instead
	 * of the first running alone. A head queued before the last step ended
	 * does not wait. 0: a request starts at once.
	 */
	uint64_t gather_ns;
	MP_RESERVED(2);
};

/* How a request samples its tokens. A zeroed struct means greedy, 16 tokens. */
struct mp_sched_params {
	uint32_t max_tokens;		/* tokens to generate at most; 0: 16 */
	float temperature;		/* 0: greedy (argmax); else softmax(logits / t) */
	float top_p;			/* nucleus: the smallest set of mass >= top_p; 0 or 1: all */
	uint32_t top_k;			/* the k most likely tokens only; 0: all */
	uint64_t seed;			/* the sampler's random stream */
	uint32_t eos;			/* generating it ends the request (it is kept); see below */
	bool no_eos;			/* no end-of-sequence token */
	/*
	 * The sequence's routed-id maps (mp_seq_config.map; NULL: the base's
	 * experts), borrowed until the done callback: an adapter's
	 * (mp_adapters_acquire()).
	 */
	const uint32_t *const *map;
	/*
	 * The runner's model whose dense weights it runs with
	 * (mp_runner_add_model()); 0: the runner's own. When the runner swaps
	 * (mp_runner_activate() called before mp_sched_open()), the batch holds
	 * one model's requests: the queue's head of another model waits until
	 * the batch is empty, then that model is activated (a swap).
	 */
	uint32_t model;
	uint32_t reserved32;		/* zero */
	MP_RESERVED(2);
};

enum mp_sched_finish {
	MP_FINISH_LENGTH = 0,		/* max_tokens generated */
	MP_FINISH_STOP,			/* the eos token, or the token callback asked to stop */
	MP_FINISH_CANCELLED,		/* mp_sched_cancel() */
	MP_FINISH_ERROR,		/* a step failed (err says why: e.g. -EIO from a tier) */
	MP_FINISH_SHUTDOWN,		/* mp_sched_close() while it waited or ran */
};

/* What a request took, in seconds from its submission. */
struct mp_sched_timing {
	double queued;			/* until it joined the batch */
	double first_token;		/* until its first token (TTFT) */
	double total;			/* until it ended */
	uint32_t prompt_tokens;
	uint32_t tokens;		/* generated */
};

struct mp_sched_callbacks {
	/*
	 * A generated token, on the scheduler's thread: must not block. Return
	 * non-zero to end the request now (e.g. a stop string matched), after
	 * which no other token comes. May be NULL.
	 */
	int (*token)(void *arg, uint32_t token);
	/* The request ended, exactly once, after its last token, on any thread. */
	void (*done)(void *arg, enum mp_sched_finish why, int err,
		     const struct mp_sched_timing *timing);
	void *arg;
};

/*
 * Opens a scheduler over cfg->runner and starts its thread. Returns 0 and
 * sets *out, -EINVAL (bad config) or -ENOMEM.
 */
MP_API int mp_sched_open(const struct mp_sched_config *cfg, struct mp_sched **out);

/*
 * Queues a request: prompt (n >= 1 tokens, copied) and how to sample. cb's
 * callbacks are called on the scheduler's thread from then on, done once.
 * Returns 0 and sets *id, -EINVAL (no prompt, a prompt + max_tokens beyond
 * the context or the KV budget, bad params: the message names the field),
 * -EAGAIN (the queue is full: try again later) or -ESHUTDOWN (draining or
 * closing). On an error no callback is called.
 */
MP_API int mp_sched_submit(struct mp_sched *s, const uint32_t *prompt, uint32_t n,
			   const struct mp_sched_params *params,
			   const struct mp_sched_callbacks *cb, uint64_t *id);

/*
 * Ends a request (waiting or running) with MP_FINISH_CANCELLED before its
 * next step; its sequence is freed. Returns 0, or -ENOENT when it is not
 * there (already done).
 */
MP_API int mp_sched_cancel(struct mp_sched *s, uint64_t id);

/*
 * Stops admitting new requests (submit returns -ESHUTDOWN) and waits until
 * every queued and running request has ended, or timeout_ms passes.
 * Returns 0 or -ETIMEDOUT.
 */
MP_API int mp_sched_drain(struct mp_sched *s, uint32_t timeout_ms);

/*
 * Runs fn(arg) on the scheduler's thread between two steps (at once if it
 * is idle), so fn may change what the steps use (the runner's engine
 * threads: mp_engine_set_threads()) with no step running; requests wait
 * meanwhile, none is dropped. Waits for it and returns fn's result, or
 * -ESHUTDOWN when the scheduler is stopping (fn did not run), -EINVAL.
 * One call runs at a time; others wait their turn. Not from fn or a
 * callback, and not concurrently with mp_sched_close(), which frees s (a
 * server orders the two as it does its other calls on s).
 */
MP_API int mp_sched_call(struct mp_sched *s, int (*fn)(void *arg), void *arg);

/* Stops the thread; what still waits or runs ends with MP_FINISH_SHUTDOWN. NULL is allowed. */
MP_API void mp_sched_close(struct mp_sched *s);

/* Bucket upper bounds of the latency histograms, in seconds (the last is +Inf). */
#define MP_SCHED_HIST_BUCKETS 16
#define MP_SCHED_BATCH_BUCKETS 10
MP_API const double *mp_sched_hist_bounds(void);

struct mp_sched_hist {
	uint64_t count[MP_SCHED_HIST_BUCKETS];	/* per bucket, not cumulative */
	double sum;
	uint64_t n;
};

struct mp_sched_stats {
	uint64_t submitted;		/* accepted by mp_sched_submit() */
	uint64_t rejected;		/* refused for a full queue */
	uint64_t finished[5];		/* by enum mp_sched_finish */
	uint64_t prompt_tokens;		/* run in prefills */
	uint64_t tokens;		/* generated */
	uint64_t steps;			/* runner steps */
	uint64_t batch_rows;		/* tokens over all steps (rows / steps: mean step size) */
	uint64_t batch_seqs;		/* sequences over all steps */
	double step_seconds;		/* in mp_runner_batch() */
	double sched_seconds;		/* the thread's own work around the steps */
	uint32_t queued;		/* waiting now */
	uint32_t running;		/* in the batch now */
	uint64_t kv_bytes;		/* reserved by the running sequences now */
	uint32_t max_batch;
	struct mp_sched_hist ttft;	/* time to first token */
	struct mp_sched_hist tpot;	/* time per output token after the first */
	/* Steps by sequences in them: bucket i counts sizes in (2^(i-1), 2^i], the last more. */
	uint64_t batch_size[MP_SCHED_BATCH_BUCKETS];
	uint64_t swaps;			/* models activated when the queue's head needed another */
	double swap_seconds;		/* spent activating them */
	/* The same in the thread's CPU time (not preempted): one gap in 32 read, at random. */
	double sched_cpu_seconds;
	uint64_t seqs_reused;		/* sequences opened in a finished one's KV cache */
	uint64_t grouped;		/* requests that joined ahead of an older head (group_ns) */
	uint64_t gathers;		/* waits of an empty batch for a burst (gather_ns) */
	double gather_seconds;		/* spent in them (part of their requests' TTFT) */
	/*
	 * Swapping runner: time heads of another model waited for the running
	 * batch to end before their swap (the queueing FIFO model switches add).
	 */
	double switch_wait_seconds;
};

/* A snapshot of the counters. */
MP_API void mp_sched_stats(struct mp_sched *s, struct mp_sched_stats *out);

/*
 * The sampler alone (what the scheduler does to a sequence's logits): the
 * next token of vocab logits under params with the random state *rng
 * (seed it with params->seed; it advances). Greedy when temperature is 0.
 */
MP_API uint32_t mp_sample(const float *logits, uint32_t vocab, const struct mp_sched_params *params,
			  uint64_t *rng);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_SERVE_H */
