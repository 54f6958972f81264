// SPDX-License-Identifier: MIT
/*
 * Description: the scheduler: requests served together get their lone
 * tokens, the queue is bounded (-EAGAIN), cancel and close end requests and
 * free their sequences, a sequence reused in a finished one's KV cache gives
 * a fresh one's tokens (and reuse stays within its capacity), the KV budget holds and no request is overtaken,
 * a swapping runner's group time lets the active model's requests pass a
 * head of another model (within it) and not after it, finish reasons, a
 * failed step fails its requests and serving goes on, the
 * on_step hook comes after each step's tokens and before its done callbacks,
 * a call runs between two steps on the scheduler's thread (the engine's
 * threads changed under running requests), and the sampler.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "base/base.h"

#define MAXREQ 16
#define MAXTOK 64

struct fixture {
	struct mp_store *store;
	struct mp_resident *res;
	struct mp_engine *engine;
	uint32_t vocab;
};

static struct fixture fx;

/*
 * An expert source over the resident one that can hold the scheduler's
 * thread inside a step (to fill the queue deterministically) and fail a
 * layer's reads (to test a failing step).
 */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	bool hold;
	bool held;		/* the thread is inside the step, waiting */
	atomic_int fail_layer;	/* -1: none */
	atomic_uint slow_us;	/* sleep per expert read (slow steps) */
} gate = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false, -1, 0 };

static const void *gate_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	(void)ctx;
	pthread_mutex_lock(&gate.lock);
	while (gate.hold) {
		gate.held = true;
		pthread_cond_broadcast(&gate.cv);
		pthread_cond_wait(&gate.cv, &gate.lock);
	}
	gate.held = false;
	pthread_mutex_unlock(&gate.lock);
	if (atomic_load(&gate.slow_us))
		usleep(atomic_load(&gate.slow_us));
	return mp_resident_source_ops()->expert(fx.res, layer, expert);
}

static int gate_guard(void *ctx, int (*fn)(void *arg), void *arg)
{
	(void)ctx;
	return atomic_load(&gate.fail_layer) >= 0 ? -EIO : fn(arg);
}

static const struct mp_expert_source_ops gate_ops = {
	.expert = gate_expert,
	.guard = gate_guard,
};

static void hold(bool on)
{
	pthread_mutex_lock(&gate.lock);
	gate.hold = on;
	pthread_cond_broadcast(&gate.cv);
	pthread_mutex_unlock(&gate.lock);
}

static void wait_held(void)
{
	pthread_mutex_lock(&gate.lock);
	while (!gate.held)
		pthread_cond_wait(&gate.cv, &gate.lock);
	pthread_mutex_unlock(&gate.lock);
}

/* What one request saw. */
struct result {
	uint32_t tokens[MAXTOK];
	uint32_t n;
	int stop_after;		/* the token callback asks to stop after this many (0: never) */
	atomic_bool done;
	int why;
	int err;
	struct mp_sched_timing t;
	uint64_t first_ns, done_ns;	/* when its first token came, when it ended */
};

static int on_token(void *arg, uint32_t tok)
{
	struct result *r = arg;

	if (!r->n)
		r->first_ns = mp_now_ns();
	if (r->n < MAXTOK)
		r->tokens[r->n++] = tok;
	return r->stop_after && (int)r->n >= r->stop_after;
}

static void on_done(void *arg, enum mp_sched_finish why, int err,
		    const struct mp_sched_timing *t)
{
	struct result *r = arg;

	r->why = why;
	r->err = err;
	r->t = *t;
	r->done_ns = mp_now_ns();
	atomic_store(&r->done, true);
}

static void wait_done(struct result *r, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		uint64_t t0 = mp_now_ns();

		while (!atomic_load(&r[i].done)) {
			if (mp_now_ns() - t0 > 60ull * 1000 * 1000 * 1000)
				fail_msg("request %u did not end in 60 s", i);
			usleep(200);
		}
	}
}

static struct mp_runner *open_runner(const struct mp_expert_source_ops *ops, void *ctx)
{
	struct mp_runner_config rc = { .engine = fx.engine, .source = ops, .source_ctx = ctx };
	struct mp_runner *r;

	assert_int_equal(mp_runner_open(fx.store, &rc, &r), 0);
	return r;
}

static struct mp_sched *open_sched(struct mp_runner *r, uint32_t max_batch, uint32_t max_queue,
				   uint64_t kv_budget)
{
	struct mp_sched_config c = { .runner = r, .max_batch = max_batch, .max_queue = max_queue,
				     .kv_budget = kv_budget, .prefill_chunk = 5 };
	struct mp_sched *s;

	assert_int_equal(mp_sched_open(&c, &s), 0);
	return s;
}

static void prompt_of(uint32_t i, uint32_t *p, uint32_t n)
{
	for (uint32_t t = 0; t < n; t++)
		p[t] = (i * 53u + t * 17u + 3u) % fx.vocab;
}

static uint64_t submit(struct mp_sched *s, uint32_t i, uint32_t plen,
		       const struct mp_sched_params *params, struct result *r)
{
	struct mp_sched_callbacks cb = { on_token, on_done, r };
	uint32_t p[64];
	uint64_t id = 0;

	prompt_of(i, p, plen);
	assert_int_equal(mp_sched_submit(s, p, plen, params, &cb, &id), 0);
	assert_true(id > 0);
	return id;
}

static int group_setup(void **state)
{
	(void)state;
	t_log_capture();
	if (t_gen_tiny(t_path("tiny.mpk"), MP_DTYPE_BF16, 21) ||
	    mp_store_open(t_path("tiny.mpk"), &fx.store) ||
	    mp_resident_open(fx.store, NULL, NULL, &fx.res) ||
	    mp_engine_open("ref", &(struct mp_engine_config){ .threads = 2 }, &fx.engine))
		return -1;
	fx.vocab = mp_store_geometry(fx.store)->vocab;
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	mp_engine_close(fx.engine);
	mp_resident_close(fx.res);
	mp_store_close(fx.store);
	t_tmpdir_cleanup();
	return 0;
}

/* Greedy requests batched together produce what each produces alone. */
static void batched_requests_get_their_lone_tokens(void **state)
{
	struct mp_sched_params p = { .max_tokens = 12, .no_eos = true };
	struct mp_runner *r = open_runner(mp_resident_source_ops(), fx.res);
	static struct result alone[8], together[8];
	struct mp_sched_stats st;
	struct mp_sched *s;

	(void)state;
	memset(alone, 0, sizeof(alone));
	memset(together, 0, sizeof(together));
	s = open_sched(r, 1, 16, 0);
	for (uint32_t i = 0; i < 8; i++)
		submit(s, i, 3 + 2 * i, &p, &alone[i]);
	wait_done(alone, 8);
	mp_sched_close(s);
	s = open_sched(r, 8, 16, 0);
	for (uint32_t i = 0; i < 8; i++)
		submit(s, i, 3 + 2 * i, &p, &together[i]);
	wait_done(together, 8);
	mp_sched_stats(s, &st);
	for (uint32_t i = 0; i < 8; i++) {
		assert_int_equal(together[i].why, MP_FINISH_LENGTH);
		assert_int_equal(together[i].n, 12);
		assert_memory_equal(together[i].tokens, alone[i].tokens, 12 * sizeof(uint32_t));
		assert_true(together[i].t.first_token > 0);
		assert_int_equal(together[i].t.tokens, 12);
	}
	/* They did run together: fewer steps than one request after another. */
	assert_int_equal(st.tokens, 8 * 12);
	assert_int_equal(st.finished[MP_FINISH_LENGTH], 8);
	assert_true(st.steps < 8 * 12);
	assert_true(st.batch_seqs > st.steps);
	assert_int_equal(st.ttft.n, 8);
	assert_int_equal(st.tpot.n, 8);
	mp_sched_close(s);
	mp_runner_close(r);
}

/* The on_step hook's view: tokens since its last call, its calls, what done saw. */
static struct {
	atomic_uint pending;		/* tokens since the last on_step */
	atomic_uint calls;
	atomic_uint with_tokens;	/* calls that followed at least one token */
	atomic_uint tokens;		/* tokens the calls followed, in all */
	atomic_uint done_pending;	/* tokens not yet followed by on_step when a done came */
} hook;

static int hook_token(void *arg, uint32_t tok)
{
	atomic_fetch_add(&hook.pending, 1);
	return on_token(arg, tok);
}

static void hook_done(void *arg, enum mp_sched_finish why, int err,
		      const struct mp_sched_timing *t)
{
	atomic_fetch_add(&hook.done_pending, atomic_load(&hook.pending));
	on_done(arg, why, err, t);
}

static void hook_step(void *arg)
{
	unsigned n = atomic_exchange(&hook.pending, 0);

	assert_ptr_equal(arg, &hook);
	atomic_fetch_add(&hook.calls, 1);
	atomic_fetch_add(&hook.tokens, n);
	atomic_fetch_add(&hook.with_tokens, n > 0);
}

/*
 * on_step comes once per step, after its tokens and before its done
 * callbacks: a front end can wake what the tokens are for once per step.
 */
static void on_step_follows_each_steps_tokens_before_its_done_callbacks(void **state)
{
	struct mp_sched_params p = { .max_tokens = 7, .no_eos = true };
	struct mp_runner *r = open_runner(mp_resident_source_ops(), fx.res);
	struct mp_sched_config c = { .runner = r, .max_batch = 4, .prefill_chunk = 5,
				     .on_step = hook_step, .on_step_arg = &hook };
	static struct result res[6];
	struct mp_sched_stats st;
	struct mp_sched *s;

	(void)state;
	memset(res, 0, sizeof(res));
	memset(&hook, 0, sizeof(hook));
	assert_int_equal(mp_sched_open(&c, &s), 0);
	for (uint32_t i = 0; i < 6; i++) {
		struct mp_sched_callbacks cb = { hook_token, hook_done, &res[i] };
		uint32_t prompt[16];

		prompt_of(i, prompt, 3 + 2 * i);
		assert_int_equal(mp_sched_submit(s, prompt, 3 + 2 * i, &p, &cb, NULL), 0);
	}
	wait_done(res, 6);
	mp_sched_stats(s, &st);
	mp_sched_close(s);
	mp_runner_close(r);
	/* One call per step; every token was followed by one before any done came. */
	assert_int_equal(atomic_load(&hook.calls), st.steps);
	assert_int_equal(atomic_load(&hook.tokens), 6 * 7);
	assert_int_equal(atomic_load(&hook.pending), 0);
	assert_int_equal(atomic_load(&hook.done_pending), 0);
	/* Batched: fewer calls with tokens than tokens. */
	assert_true(atomic_load(&hook.with_tokens) < 6 * 7);
}

/*
 * A request run in the KV cache a longer one left (reused, not cleared)
 * produces the tokens it produces in a fresh cache, and the pool is used.
 */
static void a_reused_sequence_gives_a_fresh_ones_tokens(void **state)
{
	struct mp_sched_params longer = { .max_tokens = 20, .no_eos = true };
	struct mp_sched_params p = { .max_tokens = 12, .no_eos = true };
	struct mp_runner *r = open_runner(mp_resident_source_ops(), fx.res);
	static struct result first, reused, fresh;
	struct mp_sched_stats st;
	struct mp_sched *s;

	(void)state;
	memset(&first, 0, sizeof(first));
	memset(&reused, 0, sizeof(reused));
	memset(&fresh, 0, sizeof(fresh));
	s = open_sched(r, 1, 16, 0);
	submit(s, 9, 30, &longer, &first);
	wait_done(&first, 1);
	submit(s, 2, 5, &p, &reused);
	wait_done(&reused, 1);
	mp_sched_stats(s, &st);
	assert_int_equal(st.seqs_reused, 1);
	mp_sched_close(s);
	s = open_sched(r, 1, 16, 0);
	submit(s, 2, 5, &p, &fresh);
	wait_done(&fresh, 1);
	mp_sched_stats(s, &st);
	assert_int_equal(st.seqs_reused, 0);
	assert_int_equal(reused.n, 12);
	assert_int_equal(fresh.n, 12);
	assert_memory_equal(reused.tokens, fresh.tokens, 12 * sizeof(uint32_t));
	mp_sched_close(s);
	mp_runner_close(r);
}

/*
 * A source that keeps the requests whose maps it holds (seq_map), as a
 * prefetcher does; a request's done callback notes whether its map was
 * still held.
 */
static struct {
	uint32_t live[MAXREQ];
	uint32_t nlive, opens, closes;
} held;

static void held_seq_map(void *ctx, uint32_t request, const uint32_t *const *map)
{
	uint32_t i = 0;

	(void)ctx;
	while (i < held.nlive && held.live[i] != request)
		i++;
	if (map && i == held.nlive && held.nlive < MAXREQ) {
		held.live[held.nlive++] = request;
		held.opens++;
	} else if (!map && i < held.nlive) {
		held.live[i] = held.live[--held.nlive];
		held.closes++;
	}
}

static const void *held_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	return mp_resident_source_ops()->expert(ctx, layer, expert);
}

static const struct mp_expert_source_ops held_ops = {
	.expert = held_expert,
	.seq_map = held_seq_map,
};

struct map_result {
	struct result r;
	uint64_t id;
	bool held_at_done;
};

static void map_done(void *arg, enum mp_sched_finish why, int err,
		     const struct mp_sched_timing *t)
{
	struct map_result *m = arg;

	for (uint32_t i = 0; i < held.nlive; i++)
		m->held_at_done |= held.live[i] == (uint32_t)m->id;
	on_done(&m->r, why, err, t);
}

/*
 * A request's map is let go before its done callback (which may release the
 * adapter behind it), also when its sequence is kept for the next request,
 * and a reused sequence hands the source the next request's map.
 */
static void a_finished_requests_map_is_let_go_before_done(void **state)
{
	struct mp_runner *r = open_runner(&held_ops, fx.res);
	const uint32_t g_layers = mp_store_geometry(fx.store)->layers;
	uint32_t ident[MP_MAX_EXPERTS];
	const uint32_t *map[64] = { 0 };
	static struct map_result res[3];
	struct mp_sched_stats st;
	struct mp_sched *s;

	(void)state;
	memset(res, 0, sizeof(res));
	memset(&held, 0, sizeof(held));
	for (uint32_t e = 0; e < mp_store_geometry(fx.store)->experts; e++)
		ident[e] = e;
	for (uint32_t l = 0; l < g_layers; l++)
		map[l] = ident;
	s = open_sched(r, 1, 16, 0);
	for (uint32_t i = 0; i < 3; i++) {
		struct mp_sched_params p = { .max_tokens = 4, .no_eos = true,
					     .map = i < 2 ? map : NULL };
		struct mp_sched_callbacks cb = { on_token, map_done, &res[i] };
		uint32_t prompt[5];

		prompt_of(i, prompt, 5);
		assert_int_equal(mp_sched_submit(s, prompt, 5, &p, &cb, &res[i].id), 0);
		wait_done(&res[i].r, 1);
		assert_false(res[i].held_at_done);
		assert_int_equal(res[i].r.n, 4);
	}
	mp_sched_stats(s, &st);
	assert_int_equal(st.seqs_reused, 2);
	assert_int_equal(held.opens, 2);
	assert_int_equal(held.closes, 2);
	assert_int_equal(held.nlive, 0);
	mp_sched_close(s);
	mp_runner_close(r);
}

/* Reuse starts the sequence over within its capacity; a config it cannot take changes nothing. */
static void reuse_refuses_more_than_the_capacity_and_changes_nothing(void **state)
{
	struct mp_runner *r = open_runner(mp_resident_source_ops(), fx.res);
	struct mp_seq_config big = { .max_seq = 16 }, bad = { .max_seq = 4, .model = 5 };
	struct mp_seq_config ok = { .max_seq = 4, .request = 7 };
	uint32_t toks[3] = { 1, 2, 3 };
	struct mp_batch_item it;
	struct mp_seq *q;

	(void)state;
	assert_int_equal(mp_seq_open(r, &(struct mp_seq_config){ .max_seq = 8 }, &q), 0);
	it = (struct mp_batch_item){ q, toks, 3, MP_BATCH_PREFILL };
	assert_int_equal(mp_runner_batch(r, &it, 1), 0);
	assert_int_equal(mp_seq_pos(q), 3);
	assert_int_equal(mp_seq_reuse(q, &big), -EINVAL);
	assert_int_equal(mp_seq_reuse(q, &bad), -EINVAL);
	assert_int_equal(mp_seq_pos(q), 3);
	assert_int_equal(mp_seq_reuse(q, &ok), 0);
	assert_int_equal(mp_seq_pos(q), 0);
	assert_int_equal(mp_seq_capacity(q), 8);
	mp_seq_close(q);
	mp_runner_close(r);
}

static void full_queue_refuses_with_eagain_and_close_ends_every_request(void **state)
{
	struct mp_sched_params p = { .max_tokens = 4, .no_eos = true };
	struct mp_runner *r = open_runner(&gate_ops, NULL);
	struct mp_sched_callbacks cb;
	static struct result res[4];
	struct mp_sched_stats st;
	struct mp_sched *s;
	uint32_t prompt[3] = { 1, 2, 3 };
	uint64_t id;

	(void)state;
	memset(res, 0, sizeof(res));
	s = open_sched(r, 1, 2, 0);
	hold(true);
	submit(s, 0, 3, &p, &res[0]);
	wait_held();		/* request 0 runs, stuck in its first step */
	submit(s, 1, 3, &p, &res[1]);
	submit(s, 2, 3, &p, &res[2]);
	cb = (struct mp_sched_callbacks){ on_token, on_done, &res[3] };
	assert_int_equal(mp_sched_submit(s, prompt, 3, &p, &cb, &id), -EAGAIN);
	mp_sched_stats(s, &st);
	assert_int_equal(st.queued, 2);
	assert_int_equal(st.running, 1);
	assert_int_equal(st.rejected, 1);
	hold(false);
	mp_sched_close(s);
	/* Whatever did not finish ended as a shutdown; every done was called once. */
	for (uint32_t i = 0; i < 3; i++) {
		assert_true(atomic_load(&res[i].done));
		assert_true(res[i].why == MP_FINISH_LENGTH || res[i].why == MP_FINISH_SHUTDOWN);
	}
	assert_false(atomic_load(&res[3].done));
	mp_runner_close(r);
}

static void cancel_ends_a_waiting_or_running_request(void **state)
{
	struct mp_sched_params p = { .max_tokens = 30, .no_eos = true };
	struct mp_runner *r = open_runner(&gate_ops, NULL);
	static struct result res[3];
	struct mp_sched_stats st;
	struct mp_sched *s;
	uint64_t running, waiting;

	(void)state;
	memset(res, 0, sizeof(res));
	s = open_sched(r, 1, 4, 0);
	hold(true);
	running = submit(s, 0, 4, &p, &res[0]);
	wait_held();
	waiting = submit(s, 1, 4, &p, &res[1]);
	assert_int_equal(mp_sched_cancel(s, waiting), 0);
	assert_int_equal(mp_sched_cancel(s, running), 0);
	assert_int_equal(mp_sched_cancel(s, 999), -ENOENT);
	hold(false);
	wait_done(res, 2);
	assert_int_equal(res[0].why, MP_FINISH_CANCELLED);
	assert_int_equal(res[1].why, MP_FINISH_CANCELLED);
	assert_int_equal(res[1].n, 0);
	assert_true(res[0].n < 30);
	/* Serving goes on, with the freed place. */
	submit(s, 2, 4, &p, &res[2]);
	wait_done(&res[2], 1);
	assert_int_equal(res[2].why, MP_FINISH_LENGTH);
	assert_int_equal(mp_sched_drain(s, 5000), 0);
	mp_sched_stats(s, &st);
	assert_int_equal(st.finished[MP_FINISH_CANCELLED], 2);
	assert_int_equal(st.running + st.queued, 0);
	assert_int_equal(st.kv_bytes, 0);
	mp_sched_close(s);
	mp_runner_close(r);
}

static void finish_reasons_are_length_eos_and_stop(void **state)
{
	struct mp_runner *r = open_runner(mp_resident_source_ops(), fx.res);
	struct mp_sched *s = open_sched(r, 4, 8, 0);
	struct mp_sched_params p = { .max_tokens = 8, .no_eos = true };
	static struct result res[3];

	(void)state;
	memset(res, 0, sizeof(res));
	submit(s, 5, 4, &p, &res[0]);
	wait_done(res, 1);
	assert_int_equal(res[0].why, MP_FINISH_LENGTH);
	/* The same greedy request, with its third token as the end-of-sequence token. */
	p.no_eos = false;
	p.eos = res[0].tokens[2];
	submit(s, 5, 4, &p, &res[1]);
	res[2].stop_after = 5;
	p.no_eos = true;
	submit(s, 5, 4, &p, &res[2]);
	wait_done(res, 3);
	assert_int_equal(res[1].why, MP_FINISH_STOP);
	assert_true(res[1].n <= 3);
	assert_int_equal(res[1].tokens[res[1].n - 1], p.eos);
	assert_int_equal(res[2].why, MP_FINISH_STOP);
	assert_int_equal(res[2].n, 5);
	mp_sched_close(s);
	mp_runner_close(r);
}

/* Each request reserves half the budget and a bit: they run one at a time, in arrival order. */
static void kv_budget_holds_and_no_request_is_overtaken(void **state)
{
	struct mp_runner *r = open_runner(mp_resident_source_ops(), fx.res);
	struct mp_sched_params p = { .max_tokens = 10, .no_eos = true };
	uint64_t per = mp_seq_kv_bytes(r, 30 + 10);
	struct mp_sched *s = open_sched(r, 8, 8, per + per / 2);
	struct mp_sched_params small = { .max_tokens = 2, .no_eos = true };
	struct mp_sched_callbacks cb;
	static struct result res[4];
	uint32_t prompt[60] = { 0 };
	struct mp_sched_stats st;
	uint64_t id;

	(void)state;
	memset(res, 0, sizeof(res));
	submit(s, 0, 30, &p, &res[0]);
	submit(s, 1, 30, &p, &res[1]);
	/* A small one after them waits its turn, though it would fit beside the first. */
	submit(s, 2, 2, &small, &res[2]);
	cb = (struct mp_sched_callbacks){ on_token, on_done, &res[3] };
	t_log_reset();
	assert_int_equal(mp_sched_submit(s, prompt, 60, &p, &cb, &id), -EINVAL);
	assert_true(t_log_contains("above the budget"));
	wait_done(res, 3);
	/*
	 * The second joined only when the first had left (the budget holds one
	 * of them), and the small third, which would fit beside the first, did
	 * not overtake the second: it too started after the first had ended.
	 */
	assert_true(res[1].first_ns > res[0].done_ns);
	assert_true(res[2].first_ns > res[0].done_ns);
	assert_int_equal(res[0].n, 10);
	mp_sched_stats(s, &st);
	assert_int_equal(st.kv_bytes, 0);
	mp_sched_close(s);
	mp_runner_close(r);
}

/*
 * Models A (0, active) and B (1) of a swapping runner; while an A request
 * holds a step, a B request and then two A ones queue. Over a group time
 * the two A ones join at once, ahead of the B head, which is served after
 * them with one swap; with a group time the head has already waited out
 * (1 ns), none passes it: FIFO, a swap to B and one back.
 */
static void grouped_run(uint64_t group_ns, struct result *res, struct mp_sched_stats *st)
{
	struct mp_runner *r = open_runner(&gate_ops, NULL);
	struct mp_sched_params a = { .max_tokens = 6, .no_eos = true }, b = a;
	struct mp_sched_config c = { .runner = r, .max_batch = 4, .max_queue = 8,
				     .prefill_chunk = 5, .group_ns = group_ns };
	struct mp_sched *s;

	b.model = 1;
	assert_int_equal(mp_runner_add_model(r, fx.store), 1);
	assert_int_equal(mp_runner_activate(r, 0), 0);
	assert_int_equal(mp_sched_open(&c, &s), 0);
	memset(res, 0, 4 * sizeof(*res));
	hold(true);
	submit(s, 0, 8, &a, &res[0]);
	wait_held();
	submit(s, 1, 8, &b, &res[1]);
	submit(s, 2, 8, &a, &res[2]);
	submit(s, 3, 8, &a, &res[3]);
	hold(false);
	wait_done(res, 4);
	mp_sched_stats(s, st);
	mp_sched_close(s);
	mp_runner_close(r);
}

static void grouping_lets_the_active_models_requests_pass_within_its_time(void **state)
{
	static struct result res[4];
	struct mp_sched_stats st;

	(void)state;
	grouped_run(60ull * 1000 * 1000 * 1000, res, &st);
	for (uint32_t i = 2; i < 4; i++) {
		assert_true(res[i].first_ns < res[0].done_ns);	/* beside the first */
		assert_true(res[1].first_ns > res[i].done_ns);	/* the B head after them */
	}
	assert_int_equal(st.grouped, 2);
	assert_int_equal(st.swaps, 1);
	grouped_run(1, res, &st);
	for (uint32_t i = 2; i < 4; i++)
		assert_true(res[i].first_ns > res[1].done_ns);
	assert_true(res[1].first_ns > res[0].done_ns);
	assert_int_equal(st.grouped, 0);
	assert_int_equal(st.swaps, 2);
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(res[i].n, 6);
}

/*
 * switch_wait_seconds counts only a head of another model waiting for the
 * running batch: B submitted once A's request has ended swaps at once (no
 * wait); A submitted while B's request holds a step waits for it to end.
 */
static void a_switch_wait_counts_a_head_waiting_for_another_models_batch(void **state)
{
	struct mp_runner *r = open_runner(&gate_ops, NULL);
	struct mp_sched_params a = { .max_tokens = 4, .no_eos = true }, b = a;
	struct mp_sched_config c = { .runner = r, .max_batch = 4, .max_queue = 8,
				     .prefill_chunk = 5 };
	static struct result res[4];
	struct mp_sched_stats st;
	struct mp_sched *s;

	(void)state;
	b.model = 1;
	memset(res, 0, sizeof(res));
	assert_int_equal(mp_runner_add_model(r, fx.store), 1);
	assert_int_equal(mp_runner_activate(r, 0), 0);
	assert_int_equal(mp_sched_open(&c, &s), 0);
	submit(s, 0, 6, &a, &res[0]);
	wait_done(&res[0], 1);
	submit(s, 1, 6, &b, &res[1]);
	wait_done(&res[1], 1);
	mp_sched_stats(s, &st);
	assert_int_equal(st.swaps, 1);
	assert_true(st.switch_wait_seconds == 0);
	hold(true);
	submit(s, 2, 6, &b, &res[2]);
	wait_held();
	submit(s, 3, 6, &a, &res[3]);
	hold(false);
	wait_done(&res[2], 2);
	assert_true(res[3].first_ns > res[2].done_ns);
	mp_sched_stats(s, &st);
	assert_int_equal(st.swaps, 2);
	assert_true(st.switch_wait_seconds > 0);
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(res[i].n, 4);
	mp_sched_close(s);
	mp_runner_close(r);
}

static void a_failed_step_fails_its_requests_and_serving_goes_on(void **state)
{
	struct mp_runner *r = open_runner(&gate_ops, NULL);
	struct mp_sched *s = open_sched(r, 4, 8, 0);
	struct mp_sched_params p = { .max_tokens = 3, .no_eos = true };
	static struct result res[3];

	(void)state;
	memset(res, 0, sizeof(res));
	atomic_store(&gate.fail_layer, 1);
	submit(s, 0, 4, &p, &res[0]);
	submit(s, 1, 4, &p, &res[1]);
	wait_done(res, 2);
	for (uint32_t i = 0; i < 2; i++) {
		assert_int_equal(res[i].why, MP_FINISH_ERROR);
		assert_int_equal(res[i].err, -EIO);
	}
	atomic_store(&gate.fail_layer, -1);
	submit(s, 2, 4, &p, &res[2]);
	wait_done(&res[2], 1);
	assert_int_equal(res[2].why, MP_FINISH_LENGTH);
	mp_sched_close(s);
	mp_runner_close(r);
}

/* mp_sched_call()'s fn: changes the engine's threads, says where and when it ran. */
static struct {
	uint32_t threads;
	pthread_t thread;
	atomic_bool ran;
	struct mp_sched *s;
	int ret;
} call;

/* The thread of the last expert read: the scheduler's steps write it while the test reads. */
static pthread_t step_thread;
static pthread_mutex_t step_lock = PTHREAD_MUTEX_INITIALIZER;

static const void *step_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	pthread_mutex_lock(&step_lock);
	step_thread = pthread_self();
	pthread_mutex_unlock(&step_lock);
	return gate_expert(ctx, layer, expert);
}

static bool is_step_thread(pthread_t t)
{
	bool same;

	pthread_mutex_lock(&step_lock);
	same = pthread_equal(t, step_thread);
	pthread_mutex_unlock(&step_lock);
	return same;
}

static const struct mp_expert_source_ops step_ops = {
	.expert = step_expert,
	.guard = gate_guard,
};

static int change_threads(void *arg)
{
	(void)arg;
	call.thread = pthread_self();
	atomic_store(&call.ran, true);
	return mp_engine_set_threads(fx.engine, call.threads);
}

static void *caller(void *arg)
{
	(void)arg;
	call.ret = mp_sched_call(call.s, change_threads, NULL);
	return NULL;
}

/*
 * A call waits for the running step to end, runs on the scheduler's thread,
 * and the engine's threads change under running requests, which get the
 * tokens they get without the change; idle, a call runs at once.
 */
static void a_call_runs_between_steps_and_threads_change_under_requests(void **state)
{
	struct mp_sched_params p = { .max_tokens = 12, .no_eos = true };
	struct mp_runner *r = open_runner(&step_ops, NULL);
	static struct result base[4], res[4];
	struct mp_sched *s = open_sched(r, 4, 8, 0);
	pthread_t th;

	(void)state;
	memset(base, 0, sizeof(base));
	memset(res, 0, sizeof(res));
	for (uint32_t i = 0; i < 4; i++)
		submit(s, i, 5, &p, &base[i]);
	wait_done(base, 4);

	hold(true);
	for (uint32_t i = 0; i < 4; i++)
		submit(s, i, 5, &p, &res[i]);
	wait_held();
	call.threads = 3;
	call.s = s;
	assert_int_equal(pthread_create(&th, NULL, caller, NULL), 0);
	usleep(20000);
	assert_false(atomic_load(&call.ran));	/* the step still runs */
	hold(false);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(call.ret, 0);
	assert_true(is_step_thread(call.thread));
	assert_int_equal(fx.engine->threads, 3);
	wait_done(res, 4);
	for (uint32_t i = 0; i < 4; i++) {
		assert_int_equal(res[i].why, MP_FINISH_LENGTH);
		assert_int_equal(res[i].n, 12);
		assert_memory_equal(res[i].tokens, base[i].tokens, 12 * sizeof(uint32_t));
	}

	/* Idle: at once; fn's error is the result, and the engine keeps its threads. */
	call.threads = 0;
	assert_int_equal(mp_sched_call(s, change_threads, NULL), -EINVAL);
	assert_int_equal(fx.engine->threads, 3);
	call.threads = 2;
	assert_int_equal(mp_sched_call(s, change_threads, NULL), 0);
	assert_int_equal(fx.engine->threads, 2);
	assert_int_equal(mp_sched_call(s, NULL, NULL), -EINVAL);
	mp_sched_close(s);
	mp_runner_close(r);
}

static void bad_requests_are_refused_naming_the_field(void **state)
{
	struct mp_runner *r = open_runner(mp_resident_source_ops(), fx.res);
	struct mp_sched *s = open_sched(r, 2, 2, 0);
	struct result res = { 0 };
	struct mp_sched_callbacks cb = { on_token, on_done, &res };
	uint32_t prompt[2] = { 1, fx.vocab }, ok[1] = { 1 };
	uint32_t ctx = mp_store_geometry(fx.store)->max_seq;
	uint64_t id;

	(void)state;
	t_log_reset();
	assert_int_equal(mp_sched_submit(s, prompt, 2, NULL, &cb, &id), -EINVAL);
	assert_true(t_log_contains("prompt token 1 is id"));
	assert_int_equal(mp_sched_submit(s, ok, 0, NULL, &cb, &id), -EINVAL);
	assert_int_equal(mp_sched_submit(s, ok, 1, &(struct mp_sched_params){
		.temperature = -1 }, &cb, &id), -EINVAL);
	assert_true(t_log_contains("temperature"));
	assert_int_equal(mp_sched_submit(s, ok, 1, &(struct mp_sched_params){
		.max_tokens = ctx }, &cb, &id), -EINVAL);
	assert_true(t_log_contains("exceeds the context"));
	assert_int_equal(mp_sched_submit(s, ok, 1, &(struct mp_sched_params){
		.eos = fx.vocab }, &cb, &id), -EINVAL);
	assert_false(atomic_load(&res.done));
	assert_int_equal(mp_sched_drain(s, 1000), 0);
	assert_int_equal(mp_sched_submit(s, ok, 1, NULL, &cb, &id), -ESHUTDOWN);
	mp_sched_close(s);
	mp_runner_close(r);
}

static void sampler_is_greedy_at_zero_and_reproducible_with_a_seed(void **state)
{
	float logits[64];
	struct mp_sched_params greedy = { 0 }, hot = { .temperature = 1.0f, .seed = 7 };
	struct mp_sched_params k1 = { .temperature = 2.0f, .top_k = 1, .seed = 3 };
	struct mp_sched_params nucleus = { .temperature = 1.0f, .top_p = 0.01f, .seed = 5 };
	uint64_t a = 7, b = 7, c = 3, d = 5;
	uint32_t seen[64] = { 0 }, distinct = 0;

	(void)state;
	for (uint32_t i = 0; i < 64; i++)
		logits[i] = (float)((i * 37) % 64) / 16.0f;
	/* Token 19 has the largest logit ((19 * 37) % 64 = 63). */
	assert_int_equal(mp_sample(logits, 64, &greedy, &a), 19);
	for (int i = 0; i < 200; i++) {
		uint32_t x = mp_sample(logits, 64, &hot, &a), y = mp_sample(logits, 64, &hot, &b);

		assert_int_equal(x, y);
		assert_true(x < 64);
		distinct += !seen[x]++;
		assert_int_equal(mp_sample(logits, 64, &k1, &c), 19);
		assert_int_equal(mp_sample(logits, 64, &nucleus, &d), 19);
	}
	/* At temperature 1 over these logits it does draw more than one token. */
	assert_true(distinct > 3);
}

static struct mp_sched *open_gather(struct mp_runner *r, uint32_t max_batch, uint64_t gather_ns)
{
	struct mp_sched_config c = { .runner = r, .max_batch = max_batch, .prefill_chunk = 5,
				     .gather_ns = gather_ns };
	struct mp_sched *s;

	assert_int_equal(mp_sched_open(&c, &s), 0);
	return s;
}

/*
 * Requests that reach an idle scheduler one after another within gather_ns
 * of each other share their first step (the burst's prefills run together);
 * a full batch ends the wait at once; once steps have run, a lone request
 * waits at most a quarter of a mean step; 0 waits for nothing.
 */
static void a_burst_from_idle_shares_its_first_step(void **state)
{
	struct mp_sched_params p = { .max_tokens = 6, .no_eos = true };
	struct mp_runner *r = open_runner(mp_resident_source_ops(), fx.res);
	struct mp_sched_config bad = { .runner = r, .gather_ns = 2000000000ull };
	static struct result res[4];
	struct mp_sched_stats st, st2;
	struct mp_sched *s;

	(void)state;
	assert_int_equal(mp_sched_open(&bad, &s), -EINVAL);
	/* Three requests 10 ms apart: one prefill step for the three, then 5 decodes. */
	memset(res, 0, sizeof(res));
	s = open_gather(r, 4, 300000000ull);
	for (uint32_t i = 0; i < 3; i++) {
		if (i)
			usleep(10000);
		submit(s, i, 3, &p, &res[i]);
	}
	wait_done(res, 3);
	mp_sched_stats(s, &st);
	assert_int_equal(st.steps, p.max_tokens);
	assert_int_equal(st.batch_size[2], p.max_tokens);	/* every step of 3 sequences */
	assert_int_equal(st.gathers, 1);
	/*
	 * Quiet for gather_ns after the last: ~0.3 s, less by how late the
	 * scheduler's thread saw the first (loaded CI, sanitizers).
	 */
	assert_true(st.gather_seconds >= 0.1);
	/* A lone request after steps have run: a quarter of a mean step, not gather_ns. */
	submit(s, 3, 3, &p, &res[3]);
	wait_done(&res[3], 1);
	mp_sched_stats(s, &st2);
	mp_sched_close(s);
	assert_int_equal(st2.gathers, 2);
	assert_true(st2.gather_seconds - st.gather_seconds <
		    MP_MAX(0.25, st.step_seconds / (double)st.steps));
	/* max_batch requests waiting end the wait at once. */
	memset(res, 0, sizeof(res));
	s = open_gather(r, 2, 1000000000ull);
	submit(s, 0, 3, &p, &res[0]);
	submit(s, 1, 3, &p, &res[1]);
	wait_done(res, 2);
	mp_sched_stats(s, &st);
	mp_sched_close(s);
	assert_int_equal(st.steps, p.max_tokens);
	assert_true(st.gather_seconds < 0.5);
	/* 0: no wait. */
	memset(res, 0, sizeof(res));
	s = open_gather(r, 2, 0);
	submit(s, 0, 3, &p, &res[0]);
	wait_done(res, 1);
	mp_sched_stats(s, &st);
	mp_sched_close(s);
	mp_runner_close(r);
	assert_int_equal(st.gathers, 0);
	assert_true(st.gather_seconds == 0);
}

/*
 * Once steps have run, a burst is gathered while each request comes within a
 * quarter of a mean step of the last, however long the whole burst takes
 * (up to 4 x gather_ns): eight requests, each a twentieth of a mean step
 * after the last (0.35 steps in all), share their first step. Slow steps
 * (~0.2 s) and gaps a fifth of the quiet window give room on a loaded machine.
 */
static void a_burst_longer_than_a_quarter_step_is_gathered(void **state)
{
	struct mp_sched_params p = { .max_tokens = 2, .no_eos = true };
	struct mp_runner *r = open_runner(&gate_ops, NULL);
	static struct result res[10];
	struct mp_sched_stats st, st2;
	struct mp_sched *s;
	double step;

	(void)state;
	memset(res, 0, sizeof(res));
	/* Calibrates the sleep per expert read for ~0.2 s steps. */
	atomic_store(&gate.slow_us, 100);
	s = open_gather(r, 8, 0);
	submit(s, 0, 3, &p, &res[0]);
	wait_done(res, 1);
	mp_sched_stats(s, &st);
	mp_sched_close(s);
	step = st.step_seconds / (double)st.steps;
	atomic_store(&gate.slow_us, (unsigned)MP_MIN(100 * 0.2 / step, 200000.0));

	s = open_gather(r, 8, 100000000ull);
	submit(s, 1, 3, &p, &res[1]);
	wait_done(res + 1, 1);
	mp_sched_stats(s, &st);
	step = st.step_seconds / (double)st.steps;
	for (uint32_t i = 2; i < 10; i++) {
		if (i > 2)
			usleep((useconds_t)(step * 5e4));
		submit(s, i, 3, &p, &res[i]);
	}
	wait_done(res + 2, 8);
	atomic_store(&gate.slow_us, 0);
	mp_sched_stats(s, &st2);
	mp_sched_close(s);
	mp_runner_close(r);
	assert_int_equal(st2.steps - st.steps, p.max_tokens);
	assert_int_equal(st2.gathers, 2);
}

/* Holds the scheduler's thread (an mp_sched_call()) until the test lets it go. */
static struct {
	struct mp_sched *s;
	atomic_bool held, release;
} holding;

static int hold_thread(void *arg)
{
	(void)arg;
	atomic_store(&holding.held, true);
	while (!atomic_load(&holding.release))
		usleep(100);
	return 0;
}

static void *holder(void *arg)
{
	(void)arg;
	assert_int_equal(mp_sched_call(holding.s, hold_thread, NULL), 0);
	return NULL;
}

/*
 * No wait is counted that did not wait: max_batch requests found queued at
 * once start without one. A request queued behind a full batch has waited
 * already: when the batch empties it starts in the next step, not after a
 * gathering wait.
 */
static void a_request_queued_behind_a_full_batch_is_not_gathered(void **state)
{
	struct mp_sched_params p = { .max_tokens = 4, .no_eos = true };
	struct mp_runner *r = open_runner(mp_resident_source_ops(), fx.res);
	static struct result res[3];
	struct mp_sched_stats st;
	pthread_t th;

	(void)state;
	memset(res, 0, sizeof(res));
	holding.s = open_gather(r, 2, 200000000ull);
	atomic_store(&holding.held, false);
	atomic_store(&holding.release, false);
	assert_int_equal(pthread_create(&th, NULL, holder, NULL), 0);
	while (!atomic_load(&holding.held))
		usleep(100);
	for (uint32_t i = 0; i < 3; i++)
		submit(holding.s, i, 3, &p, &res[i]);
	atomic_store(&holding.release, true);
	assert_int_equal(pthread_join(th, NULL), 0);
	wait_done(res, 3);
	mp_sched_stats(holding.s, &st);
	mp_sched_close(holding.s);
	mp_runner_close(r);
	/* Two together for 4 steps, then the third alone for 4. */
	assert_int_equal(st.steps, 2 * p.max_tokens);
	assert_int_equal(st.batch_size[1], p.max_tokens);
	assert_int_equal(st.batch_size[0], p.max_tokens);
	assert_int_equal(st.gathers, 0);
	assert_true(st.gather_seconds == 0);
}

/*
 * The scheduler's CPU counter, its clock read around one gap in 32 at random, still
 * counts every gap: it grows while a request runs (never falls: a
 * Prometheus counter) and with a later request shorter than 32 steps.
 */
static void the_cpu_counter_grows_with_every_request(void **state)
{
	struct mp_sched_params p = { .max_tokens = 30, .no_eos = true };
	struct mp_runner *r = open_runner(mp_resident_source_ops(), fx.res);
	struct mp_sched *s = open_sched(r, 1, 4, 0);
	static struct result res[2];
	struct mp_sched_stats st;
	double last = 0, first;
	uint32_t reads = 0;

	(void)state;
	memset(res, 0, sizeof(res));
	submit(s, 0, 3, &p, &res[0]);
	while (!atomic_load(&res[0].done)) {
		mp_sched_stats(s, &st);
		assert_true(st.sched_cpu_seconds >= last);
		last = st.sched_cpu_seconds;
		reads++;
		usleep(100);
	}
	wait_done(res, 1);
	mp_sched_stats(s, &st);
	assert_true(st.sched_cpu_seconds >= last);
	first = st.sched_cpu_seconds;
	assert_true(first > 0);
	p.max_tokens = 3;
	submit(s, 1, 3, &p, &res[1]);
	wait_done(&res[1], 1);
	mp_sched_stats(s, &st);
	mp_sched_close(s);
	mp_runner_close(r);
	assert_int_equal(st.steps, 30 + 3);
	assert_true(st.sched_cpu_seconds > first);
	assert_true(reads > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(batched_requests_get_their_lone_tokens),
		cmocka_unit_test(a_reused_sequence_gives_a_fresh_ones_tokens),
		cmocka_unit_test(a_finished_requests_map_is_let_go_before_done),
		cmocka_unit_test(reuse_refuses_more_than_the_capacity_and_changes_nothing),
		cmocka_unit_test(full_queue_refuses_with_eagain_and_close_ends_every_request),
		cmocka_unit_test(cancel_ends_a_waiting_or_running_request),
		cmocka_unit_test(finish_reasons_are_length_eos_and_stop),
		cmocka_unit_test(kv_budget_holds_and_no_request_is_overtaken),
		cmocka_unit_test(grouping_lets_the_active_models_requests_pass_within_its_time),
		cmocka_unit_test(a_switch_wait_counts_a_head_waiting_for_another_models_batch),
		cmocka_unit_test(a_failed_step_fails_its_requests_and_serving_goes_on),
		cmocka_unit_test(bad_requests_are_refused_naming_the_field),
		cmocka_unit_test(sampler_is_greedy_at_zero_and_reproducible_with_a_seed),
		cmocka_unit_test(on_step_follows_each_steps_tokens_before_its_done_callbacks),
		cmocka_unit_test(a_call_runs_between_steps_and_threads_change_under_requests),
		cmocka_unit_test(a_burst_from_idle_shares_its_first_step),
		cmocka_unit_test(a_request_queued_behind_a_full_batch_is_not_gathered),
		cmocka_unit_test(a_burst_longer_than_a_quarter_step_is_gathered),
		cmocka_unit_test(the_cpu_counter_grows_with_every_request),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
