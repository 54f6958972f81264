// SPDX-License-Identifier: MIT
/*
 * Description: stress: threads x random experts x a small, changing budget x transient faults,
 * every byte read checked against the store's checksums, for $MOEPAGER_STRESS_SECONDS (10) per case.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault_common.h"

#define READERS		4
#define MAX_BUDGET	8	/* experts */
/*
 * Transient faults of every kind; with 8 attempts per read an expert fails
 * them all with p < 1e-10, so any error below is a bug, not bad luck.
 */
#define DEFAULT_SPEC	"read:eio:p=0.03;read:short:p=0.02;read:corrupt:p=0.02;" \
			"read:delay=2ms:p=0.05"

struct stressor {
	struct mp_pager *p;
	uint64_t deadline;
	unsigned seed;
	uint64_t reads;
	uint64_t routes;
	uint64_t prefetches;
	uint64_t evictions;
	uint64_t wrong;		/* bytes that did not match the checksum */
	uint64_t errors;
	int first_err;
};

struct touch {
	const uint8_t *x;
	uint64_t bytes;
	uint64_t sum;
	uint64_t first;		/* touched first: faults start anywhere in the expert */
};

static int touch_then_check(void *arg)
{
	const struct touch *t = arg;
	volatile uint8_t b = t->x[t->first];

	(void)b;
	return mp_checksum(t->x, t->bytes) == t->sum ? 0 : -EILSEQ;
}

static void *reader(void *arg)
{
	struct stressor *w = arg;
	struct mp_store *s = mp_pager_store(w->p);
	const struct mp_geometry *geo = mp_store_geometry(s);
	uint64_t xbytes = mp_store_expert_bytes(s);

	while (mp_now_ns() < w->deadline) {
		uint32_t op = (uint32_t)rand_r(&w->seed) % 100;
		uint32_t l = (uint32_t)rand_r(&w->seed) % geo->layers;
		uint32_t e = (uint32_t)rand_r(&w->seed) % geo->experts;
		int ret = 0;

		if (op < 80) {
			struct touch t = {
				.x = mp_pager_expert(w->p, l, e),
				.bytes = xbytes,
				.sum = mp_store_expert(s, l, e)->checksum,
				.first = (uint64_t)rand_r(&w->seed) % xbytes,
			};

			ret = mp_pager_guard(w->p, touch_then_check, &t);
			w->reads++;
		} else if (op < 90) {
			uint32_t other = (uint32_t)rand_r(&w->seed) % (geo->experts - 1);
			uint32_t ids[2] = { e, (e + 1 + other) % geo->experts };
			/* As an engine does: route, then ask the source (the caller path reads). */
			struct touch t = {
				.bytes = xbytes,
				.sum = mp_store_expert(s, l, ids[1])->checksum,
			};

			ret = mp_pager_route(w->p, 0, (uint32_t)w->routes, l, ids, NULL, 2);
			t.x = mp_pager_source_ops()->expert(w->p, l, ids[1]);
			if (!ret)
				ret = mp_pager_guard(w->p, touch_then_check, &t);
			w->routes++;
		} else if (op < 95) {
			ret = mp_pager_prefetch(w->p, l, e, rand_r(&w->seed) % 4);
			ret = ret < 0 ? ret : 0;
			w->prefetches++;
		} else {
			unsigned flags = (rand_r(&w->seed) % 2 ? MP_EVICT_KEEP_HOST : 0) |
					 (rand_r(&w->seed) % 2 ? MP_EVICT_DEFER : 0);

			ret = mp_pager_evict(w->p, l, e, flags);
			/* Not resident, pinned or being read, or evicted when read: all normal. */
			ret = ret == -ENOENT || ret == -EBUSY || ret == 1 ? 0 : ret;
			w->evictions++;
		}
		if (ret == -EILSEQ) {
			w->wrong++;
		} else if (ret) {
			w->errors++;
			if (!w->first_err)
				w->first_err = ret;
		}
	}
	return NULL;
}

struct budgeter {
	struct mp_pager *p;
	uint64_t xbytes;
	uint64_t deadline;
	unsigned seed;
	uint64_t changes;
	int err;
};

static void *change_budget(void *arg)
{
	struct budgeter *b = arg;

	while (mp_now_ns() < b->deadline) {
		uint64_t experts = 1 + (uint64_t)rand_r(&b->seed) % MAX_BUDGET;
		int err = mp_pager_set_budget(b->p, experts * b->xbytes);

		if (err && !b->err)
			b->err = err;
		b->changes++;
		usleep(1000 + (useconds_t)(rand_r(&b->seed) % 30000));
	}
	return NULL;
}

/*
 * Readers, routes, prefetches and evictions of random experts of store s under
 * a changing budget of a few experts, resolved as resolve says.
 */
static void stress(struct mp_store *s, uint32_t resolve)
{
	const char *env_s = getenv("MOEPAGER_STRESS_SECONDS");
	const char *spec = getenv("MOEPAGER_STRESS_FAULT");
	double seconds = env_s ? atof(env_s) : 10.0;
	struct mp_pager_config cfg;
	struct stressor w[READERS];
	struct budgeter b;
	pthread_t th[READERS], bt;
	struct mp_pager_stats st;
	struct mp_fault_counts c;
	struct mp_pager *p;
	uint64_t deadline, reads = 0, pending_drop;

	if (!spec)
		spec = DEFAULT_SPEC;
	mp_pager_config_init(&cfg);
	cfg.budget_bytes = 2 * mp_store_expert_bytes(s);
	cfg.read_attempts = 8;
	cfg.fill_threads = 3;
	cfg.resolve = resolve;
	p = fx_open(s, spec, 2024, 0, &cfg);
	deadline = mp_now_ns() + (uint64_t)(seconds * 1e9);
	for (int i = 0; i < READERS; i++) {
		w[i] = (struct stressor){ .p = p, .deadline = deadline,
					  .seed = 17u * (unsigned)i + 3 };
		pthread_create(&th[i], NULL, reader, &w[i]);
	}
	b = (struct budgeter){ .p = p, .xbytes = mp_store_expert_bytes(s), .deadline = deadline,
			       .seed = 99 };
	pthread_create(&bt, NULL, change_budget, &b);
	for (int i = 0; i < READERS; i++)
		if (!fx_join(th[i], (uint32_t)(seconds * 1000) + 60000))
			fail_msg("reader %d still running 60 s past the deadline: a hang", i);
	assert_true(fx_join(bt, 60000));
	mp_pager_stats(p, &st);
	fx_counts(p, &c);
	for (int i = 0; i < READERS; i++) {
		print_message("reader %d: %llu checked reads, %llu routes, %llu prefetches, %llu "
			      "evictions, %llu wrong, %llu errors (%s)\n", i,
			      (unsigned long long)w[i].reads, (unsigned long long)w[i].routes,
			      (unsigned long long)w[i].prefetches,
			      (unsigned long long)w[i].evictions, (unsigned long long)w[i].wrong,
			      (unsigned long long)w[i].errors,
			      w[i].first_err ? strerror(-w[i].first_err) : "-");
		reads += w[i].reads;
	}
	print_message("%llu budget changes; pager: %llu file faults, %llu host faults, %llu "
		      "evictions, %llu read errors, %llu poisoned; injected: %llu EIO, %llu short, "
		      "%llu corrupt, %llu delays over %llu tier reads\n",
		      (unsigned long long)b.changes, (unsigned long long)st.faults_file,
		      (unsigned long long)st.faults_host, (unsigned long long)st.evictions,
		      (unsigned long long)st.read_errors, (unsigned long long)st.poisoned,
		      (unsigned long long)c.eio, (unsigned long long)c.short_reads,
		      (unsigned long long)c.corrupt, (unsigned long long)c.delays,
		      (unsigned long long)c.reads);
	for (int i = 0; i < READERS; i++) {
		assert_int_equal(w[i].wrong, 0);
		assert_int_equal(w[i].errors, 0);
		assert_true(w[i].reads > 0);
	}
	assert_int_equal(b.err, 0);
	assert_true(st.faults_file > 0);
	assert_int_equal(st.poisoned, 0);
	/*
	 * Every injected EIO and short read failed its attempt; a flipped bit
	 * did too unless the same attempt also ended in EIO or short.
	 */
	assert_true(st.read_errors >= c.eio + c.short_reads);
	assert_true(st.read_errors <= c.eio + c.short_reads + c.corrupt);
	assert_true(reads > 0);
	/* Every deferred drop's room came back or was given up: none still counted as coming. */
	assert_int_equal(mp_pager_wait_idle(p, 10000), 0);
	pthread_mutex_lock(&p->lock);
	pending_drop = p->mem.pending_drop;
	pthread_mutex_unlock(&p->lock);
	assert_int_equal(pending_drop, 0);
	mp_pager_close(p);
}

/* The tiny model's experts, 2 MiB chunks: faults resolve them, the engine's way reads them. */
static void threads_random_experts_and_budgets_never_see_wrong_bytes(void **state)
{
	(void)state;
	stress(fx.store, MP_RESOLVE_FAULT);
}

/*
 * Experts of 1.5 MiB, each one chunk short of 2 MiB, many to a layer (a CoE
 * container's shape), read on the asking thread: the path bench-coe's
 * executors take, where a pool chunk once ended up owned twice.
 */
static void small_experts_on_the_caller_path_never_see_wrong_bytes(void **state)
{
	const char *path = t_path("small-experts.mpk");
	struct mp_geometry g;
	struct mp_store *s;

	(void)state;
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	g.layers = 1;
	g.experts = 48;
	g.topk = 2;
	g.hidden = 512;
	g.ffn = 512;
	g.dtype = MP_DTYPE_BF16;
	assert_int_equal(mp_gen_model(path, &g, 5, "small-experts", NULL, NULL), 0);
	assert_int_equal(mp_store_open(path, &s), 0);
	assert_int_equal(mp_store_expert_bytes(s), 1536 * 1024);
	stress(s, MP_RESOLVE_CALLER);
	mp_store_close(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(threads_random_experts_and_budgets_never_see_wrong_bytes),
		cmocka_unit_test(small_experts_on_the_caller_path_never_see_wrong_bytes),
	};

	return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
