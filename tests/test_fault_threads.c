// SPDX-License-Identifier: MIT
/* Description: threads vs a failing pager: one-expert budget, handler death, close, signals. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault_common.h"
#include "uffd/region_priv.h"

struct reader {
	struct mp_pager *p;
	unsigned seed;
	int iters;
	uint32_t layer;		/* for single reads */
	uint32_t expert;
	int ok;
	int bad;		/* wrong bytes: never allowed */
	int errors;
	int ret;		/* last result */
	atomic_bool started;
};

static void *read_random(void *arg)
{
	struct reader *r = arg;

	for (int i = 0; i < r->iters; i++) {
		uint32_t l = (uint32_t)rand_r(&r->seed) % fx.geo->layers;
		uint32_t e = (uint32_t)rand_r(&r->seed) % fx.geo->experts;

		r->ret = fx_read(r->p, l, e);
		r->ok += r->ret == 0;
		r->bad += r->ret == -EILSEQ;
		r->errors += r->ret && r->ret != -EILSEQ;
	}
	return NULL;
}

static void *read_one(void *arg)
{
	struct reader *r = arg;

	atomic_store(&r->started, true);
	r->ret = fx_read(r->p, r->layer, r->expert);
	return NULL;
}

static void one_expert_budget_serves_many_readers(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:delay=1ms:p=0.2", 3, 1, NULL);
	struct mp_pager_stats st;
	struct reader r[8];
	pthread_t th[8];

	(void)state;
	for (int i = 0; i < 8; i++) {
		r[i] = (struct reader){ .p = p, .seed = 101u + (unsigned)i, .iters = 40 };
		pthread_create(&th[i], NULL, read_random, &r[i]);
	}
	for (int i = 0; i < 8; i++) {
		if (!fx_join(th[i], 120000))
			fail_msg("reader %d made no progress in 120 s with a one-expert budget", i);
		assert_int_equal(r[i].bad, 0);
		assert_int_equal(r[i].errors, 0);
		assert_int_equal(r[i].ok, 40);
	}
	mp_pager_stats(p, &st);
	assert_true(st.resident_peak <= fx.xbytes);
	assert_int_equal(st.poisoned, 0);
	mp_pager_close(p);
}

static void wait_blocked(struct reader *r, int n)
{
	for (int i = 0; i < n; i++)
		while (!atomic_load(&r[i].started))
			usleep(1000);
	/* From started to blocked in the fault is a few microseconds; leave plenty. */
	usleep(100 * 1000);
}

/*
 * After a failed check: does what the pager should have done when its
 * handler went away (mark it broken, so nothing zaps the range and waits
 * for a REMOVE event nobody reads; poison the slot a reader is stuck on),
 * so the reader leaves and the pager can be closed for the next test.
 */
static void rescue(struct mp_pager *p, struct reader *r, pthread_t th)
{
	pthread_mutex_lock(&p->lock);
	p->broken = true;
	mp_pager_poison_locked(p, mp_pager_slot(p, r->layer, r->expert), -EPIPE);
	pthread_mutex_unlock(&p->lock);
	pthread_join(th, NULL);
}

/*
 * The handler thread exits on an error: here its poll reports POLLERR,
 * which is what the kernel answers for a userfaultfd that lost O_NONBLOCK.
 */
static void dying_handler_releases_faulting_threads_with_an_error(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:delay=300ms", 1, 16, NULL);
	struct reader r[4], late;
	pthread_t th[4], lt;
	int fl;

	(void)state;
	assert_int_equal(fx_read(p, 3, 7), 0);
	for (int i = 0; i < 4; i++) {
		r[i] = (struct reader){ .p = p, .layer = (uint32_t)i, .expert = 0, .ret = 1 };
		pthread_create(&th[i], NULL, read_one, &r[i]);
	}
	wait_blocked(r, 4);
	fx_log_reset();
	fl = fcntl(p->region->uffd, F_GETFL);
	assert_int_equal(fcntl(p->region->uffd, F_SETFL, fl & ~O_NONBLOCK), 0);
	/* A new fault wakes the handler's poll, which then fails. */
	late = (struct reader){ .p = p, .layer = 2, .expert = 5, .ret = 1 };
	pthread_create(&lt, NULL, read_one, &late);
	if (!fx_join(lt, 10000))
		fail_msg("a thread faulting as the handler died is still blocked after 10 s");
	assert_int_equal(late.ret, -EPIPE);
	for (int i = 0; i < 4; i++) {
		if (!fx_join(th[i], 10000))
			fail_msg("reader %d still blocked 10 s after the handler died", i);
		/* Their reads were under way and end normally, or they fail: never wrong bytes. */
		assert_true(r[i].ret == 0 || r[i].ret == -EPIPE);
	}
	assert_true(fx_log_contains("fault handler stopped"));
	/* Afterwards: mapped experts still read, the others fail at once instead of hanging. */
	assert_int_equal(fx_read(p, 3, 7), 0);
	assert_int_equal(fx_read(p, 1, 6), -EPIPE);
	assert_int_equal(mp_pager_prefetch(p, 1, 6, 0), -ESHUTDOWN);

	/* An expert evicted after the death must not turn into a fault nobody serves. */
	assert_int_equal(mp_pager_evict(p, 3, 7, 0), 0);
	late = (struct reader){ .p = p, .layer = 3, .expert = 7, .ret = 1 };
	pthread_create(&lt, NULL, read_one, &late);
	if (!fx_join(lt, 10000)) {
		rescue(p, &late, lt);
		mp_pager_close(p);
		fail_msg("an expert evicted after the handler died blocks its reader");
	}
	assert_int_equal(late.ret, -EPIPE);
	mp_pager_close(p);
}

static void cancelled_handler_releases_faulting_threads_with_an_error(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:delay=300ms", 1, 16, NULL);
	struct reader r[2], late;
	pthread_t th[2], lt;

	(void)state;
	for (int i = 0; i < 2; i++) {
		r[i] = (struct reader){ .p = p, .layer = (uint32_t)i, .expert = 1, .ret = 1 };
		pthread_create(&th[i], NULL, read_one, &r[i]);
	}
	wait_blocked(r, 2);
	fx_log_reset();
	assert_int_equal(pthread_cancel(p->region->thread), 0);
	usleep(50 * 1000);
	late = (struct reader){ .p = p, .layer = 2, .expert = 2, .ret = 1 };
	pthread_create(&lt, NULL, read_one, &late);
	if (!fx_join(lt, 10000)) {
		rescue(p, &late, lt);
		for (int i = 0; i < 2; i++)
			pthread_join(th[i], NULL);
		mp_pager_close(p);
		fail_msg("a fault taken after the handler was cancelled blocks forever");
	}
	/* Served (the handler ignored the cancel) or failed: never blocked, never wrong bytes. */
	assert_true(late.ret == 0 || (late.ret < 0 && late.ret != -EILSEQ));
	for (int i = 0; i < 2; i++) {
		assert_true(fx_join(th[i], 10000));
		assert_true(r[i].ret == 0 || (r[i].ret < 0 && r[i].ret != -EILSEQ));
	}
	mp_pager_close(p);
}

static void closing_with_faults_in_flight_releases_every_thread(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:delay=10s", 1, 16, NULL);
	struct reader r[5];
	pthread_t th[5];
	uint64_t t0;

	(void)state;
	/* Slow prefetches are queued and in flight too. */
	for (uint32_t e = 0; e < fx.geo->experts; e++)
		mp_pager_prefetch(p, 3, e, 1);
	for (int i = 0; i < 5; i++) {
		r[i] = (struct reader){ .p = p, .layer = (uint32_t)i % 3, .expert = (uint32_t)i,
					.ret = 1 };
		pthread_create(&th[i], NULL, read_one, &r[i]);
	}
	wait_blocked(r, 5);
	fx_log_reset();
	t0 = mp_now_ns();
	mp_pager_close(p);
	for (int i = 0; i < 5; i++) {
		if (!fx_join(th[i], 5000))
			fail_msg("reader %d still blocked 5 s after close", i);
		assert_int_equal(r[i].ret, -ESHUTDOWN);
	}
	/* Every read would take 10 s: close cancelled them rather than waiting. */
	assert_true(mp_now_ns() - t0 < 5000ull * 1000 * 1000);
	assert_true(fx_log_contains("closed while it was being read"));
}

static atomic_ulong signals_seen;

#define FAILS	200	/* failed reads of the expert before its rule runs out (the spec) */

struct churn {
	struct mp_pager *p;
	atomic_bool *stop;
	uint64_t ops;
	int bad;
};

/* Reads the one failing expert: errors are expected, wrong bytes never. */
static void *read_failing(void *arg)
{
	struct churn *c = arg;

	while (!atomic_load(c->stop)) {
		c->bad += fx_read(c->p, 1, 1) == -EILSEQ;
		c->ops++;
	}
	return NULL;
}

/* Asks for it again and again: each ask clears its poison first. */
static void *prefetch_failing(void *arg)
{
	struct churn *c = arg;

	while (!atomic_load(c->stop)) {
		mp_pager_prefetch(c->p, 1, 1, 1);
		c->ops++;
		sched_yield();
	}
	return NULL;
}

/*
 * Readers and prefetches clear an expert's poison while another failed
 * read is putting new markers in. A clear that zapped before those markers
 * went in would leave them on an empty slot: the next good read could not
 * be moved into the range (EEXIST) and its readers would get an error.
 */
static void clearing_poison_never_races_new_markers(void **state)
{
	struct mp_pager_config cfg;
	struct mp_fault_counts fc;
	struct mp_pager_stats st;
	struct churn c[4];
	pthread_t th[4];
	atomic_bool stop = false;
	struct mp_pager *p;
	uint64_t deadline = mp_now_ns() + 60ull * 1000 * 1000 * 1000;

	(void)state;
	mp_pager_config_init(&cfg);
	cfg.budget_bytes = 4 * fx.xbytes;
	cfg.read_attempts = 1;
	cfg.no_route_fill = true;
	fx_log_reset();
	p = fx_open(NULL, "read:eio:expert=1.1:count=200", 5, 0, &cfg);
	for (int i = 0; i < 4; i++) {
		c[i] = (struct churn){ .p = p, .stop = &stop };
		pthread_create(&th[i], NULL, i < 3 ? read_failing : prefetch_failing, &c[i]);
	}
	do {
		usleep(10 * 1000);
		fx_counts(p, &fc);
	} while (fc.eio < FAILS && mp_now_ns() < deadline);
	atomic_store(&stop, true);
	for (int i = 0; i < 4; i++) {
		if (!fx_join(th[i], 60000))
			fail_msg("thread %d still running 60 s after the stop: a hang", i);
		assert_int_equal(c[i].bad, 0);
	}
	assert_int_equal(fc.eio, FAILS);
	/* The rule has run out: one read clears the last poison, the next must succeed. */
	fx_read(p, 1, 1);
	assert_int_equal(fx_read(p, 1, 1), 0);
	mp_pager_stats(p, &st);
	print_message("%llu reads, %llu prefetches; %llu poisoned for %llu failed reads\n",
		      (unsigned long long)(c[0].ops + c[1].ops + c[2].ops),
		      (unsigned long long)c[3].ops, (unsigned long long)st.poisoned,
		      (unsigned long long)fc.eio);
	/* Every poison is one failed read: none came from markers left behind. */
	assert_true(st.poisoned <= fc.eio);
	assert_false(fx_log_contains("into the range"));
	mp_pager_close(p);
}

static void on_usr1(int sig)
{
	(void)sig;
	atomic_fetch_add(&signals_seen, 1);
}

static void signal_storm_during_faults_loses_no_wakeup(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:delay=2ms", 1, 2, NULL);
	struct sigaction sa, old;
	struct reader r = { .p = p, .seed = 5, .iters = 150 };
	pthread_t th;
	uint64_t sent = 0;

	(void)state;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;	/* no SA_RESTART: interrupted calls see EINTR */
	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
	atomic_store(&signals_seen, 0);
	pthread_create(&th, NULL, read_random, &r);
	/* A signal every ~50 us at the thread, while it faults on one expert after another. */
	while (pthread_tryjoin_np(th, NULL)) {
		pthread_kill(th, SIGUSR1);
		sent++;
		usleep(50);
		if (sent > 4000000)
			fail_msg("reader made no progress under the signal storm");
	}
	sigaction(SIGUSR1, &old, NULL);
	print_message("%llu signals sent, %lu handled during %d faulting reads\n",
		      (unsigned long long)sent, atomic_load(&signals_seen), r.iters);
	assert_int_equal(r.bad, 0);
	assert_int_equal(r.errors, 0);
	assert_int_equal(r.ok, r.iters);
	assert_true(atomic_load(&signals_seen) > 100);
	mp_pager_close(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(one_expert_budget_serves_many_readers),
		cmocka_unit_test(closing_with_faults_in_flight_releases_every_thread),
		cmocka_unit_test(signal_storm_during_faults_loses_no_wakeup),
		cmocka_unit_test(clearing_poison_never_races_new_markers),
		cmocka_unit_test(dying_handler_releases_faulting_threads_with_an_error),
		cmocka_unit_test(cancelled_handler_releases_faulting_threads_with_an_error),
	};

	if (getenv("T_FILTER"))
		cmocka_set_test_filter(getenv("T_FILTER"));
	return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
