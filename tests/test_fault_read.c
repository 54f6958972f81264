// SPDX-License-Identifier: MIT
/* Description: failing, short, corrupt, slow reads under a pager: retries, errors, no bad bytes. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault_common.h"

static void transient_eio_is_retried_and_served_right(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:eio:expert=1.2:count=2", 1, 4, NULL);
	struct mp_pager_stats st;
	struct mp_fault_counts c;

	(void)state;
	/* Two failed attempts, the third (of the default three) succeeds. */
	assert_int_equal(fx_read(p, 1, 2), 0);
	fx_counts(p, &c);
	mp_pager_stats(p, &st);
	assert_int_equal(c.eio, 2);
	assert_int_equal(st.read_errors, 2);
	assert_int_equal(st.poisoned, 0);
	assert_int_equal(mp_pager_residency(p, 1, 2), MP_RES_MAPPED);
	mp_pager_close(p);
}

static void random_eio_on_every_expert_is_retried_to_right_bytes(void **state)
{
	struct mp_pager_config cfg;
	struct mp_pager_stats st;
	struct mp_fault_counts c;
	struct mp_pager *p;

	(void)state;
	mp_pager_config_init(&cfg);
	cfg.budget_bytes = 3 * fx.xbytes;
	cfg.no_route_fill = true;
	/* p=0.3 per attempt, 10 attempts: an expert fails all of them with p 6e-6. */
	cfg.read_attempts = 10;
	p = fx_open(NULL, "read:eio:p=0.3", 5, 0, &cfg);
	for (int pass = 0; pass < 3; pass++)
		for (uint32_t l = 0; l < fx.geo->layers; l++)
			for (uint32_t e = 0; e < fx.geo->experts; e++)
				assert_int_equal(fx_read(p, l, e), 0);
	fx_counts(p, &c);
	mp_pager_stats(p, &st);
	assert_true(c.eio > 0);
	assert_int_equal(st.read_errors, c.eio);
	assert_int_equal(st.poisoned, 0);
	mp_pager_close(p);
}

struct reader {
	struct mp_pager *p;
	uint32_t layer;
	uint32_t expert;
	int ret;
};

static void *guarded_read(void *arg)
{
	struct reader *r = arg;

	r->ret = fx_read(r->p, r->layer, r->expert);
	return NULL;
}

static void persistent_eio_errors_naming_layer_and_expert(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:eio:expert=1.1", 1, 4, NULL);
	struct mp_pager_stats st;
	struct reader r[6];
	pthread_t th[6];

	(void)state;
	fx_log_reset();
	assert_int_equal(fx_read(p, 1, 1), -EIO);
	assert_true(fx_log_contains("layer 1 expert 1"));
	assert_true(fx_log_contains("fault injection: layer 1 expert 1: EIO"));
	mp_pager_stats(p, &st);
	assert_int_equal(st.read_errors, MP_PAGER_DEFAULT_READ_ATTEMPTS);
	assert_int_equal(st.poisoned, 1);

	/* Every thread touching it at once leaves with the error; none stays blocked. */
	for (int i = 0; i < 6; i++) {
		r[i] = (struct reader){ p, 1, 1, 1 };
		pthread_create(&th[i], NULL, guarded_read, &r[i]);
	}
	for (int i = 0; i < 6; i++) {
		if (!fx_join(th[i], 10000))
			fail_msg("reader %d still blocked after 10 s on a failing expert", i);
		assert_int_equal(r[i].ret, -EIO);
	}
	/* The rest of the model is unaffected, and the failing expert keeps failing. */
	for (uint32_t e = 0; e < fx.geo->experts; e++)
		assert_int_equal(fx_read(p, 0, e), 0);
	assert_int_equal(fx_read(p, 1, 1), -EIO);
	mp_pager_close(p);
}

static void short_reads_are_completed_by_reading_again(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:short:every=2", 1, 2, NULL);
	struct mp_pager_stats st;
	struct mp_fault_counts c;

	(void)state;
	for (uint32_t l = 0; l < fx.geo->layers; l++)
		for (uint32_t e = 0; e < fx.geo->experts; e++)
			assert_int_equal(fx_read(p, l, e), 0);
	fx_counts(p, &c);
	mp_pager_stats(p, &st);
	/*
	 * Reads 2, 4, 6, ... were short: the first expert read whole, every
	 * other one came short first and was read again.
	 */
	assert_int_equal(c.short_reads, fx.geo->layers * fx.geo->experts - 1);
	assert_int_equal(st.read_errors, c.short_reads);
	assert_int_equal(st.poisoned, 0);
	mp_pager_close(p);
}

static void persistent_short_read_is_an_error_not_short_bytes(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:short:expert=3.0", 1, 2, NULL);

	(void)state;
	fx_log_reset();
	assert_int_equal(fx_read(p, 3, 0), -ENODATA);
	assert_true(fx_log_contains("layer 3 expert 0"));
	assert_true(fx_log_contains("delivered"));
	assert_int_equal(fx_read(p, 3, 1), 0);
	mp_pager_close(p);
}

static void corruption_is_caught_by_the_checksum_and_never_served(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:corrupt:expert=0.2", 1, 4, NULL);
	struct mp_fault_counts c;

	(void)state;
	for (int i = 0; i < 3; i++) {
		fx_log_reset();
		assert_int_equal(fx_read(p, 0, 2), -EBADMSG);
		assert_true(fx_log_contains("layer 0 expert 2: checksum mismatch"));
		assert_int_not_equal(mp_pager_residency(p, 0, 2), MP_RES_MAPPED);
	}
	fx_counts(p, &c);
	assert_int_equal(c.corrupt, 3 * MP_PAGER_DEFAULT_READ_ATTEMPTS);
	assert_int_equal(fx_read(p, 0, 3), 0);
	mp_pager_close(p);
}

static void transient_corruption_is_read_again(void **state)
{
	struct mp_pager_config cfg;
	struct mp_fault_counts c;
	struct mp_pager *p;

	(void)state;
	mp_pager_config_init(&cfg);
	cfg.budget_bytes = 2 * fx.xbytes;
	cfg.no_route_fill = true;
	cfg.read_attempts = 12;
	p = fx_open(NULL, "read:corrupt:p=0.4", 3, 0, &cfg);
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t l = 0; l < fx.geo->layers; l++)
			for (uint32_t e = 0; e < fx.geo->experts; e++)
				assert_int_equal(fx_read(p, l, e), 0);
	fx_counts(p, &c);
	assert_true(c.corrupt > 0);
	mp_pager_close(p);
}

/* A pager under the fault rules spec: 16 experts of budget, two fill threads (one for prefetch). */
static struct mp_pager *two_fillers(const char *spec, bool route_fill)
{
	struct mp_pager_config cfg;

	mp_pager_config_init(&cfg);
	cfg.budget_bytes = 16 * fx.xbytes;
	cfg.no_route_fill = !route_fill;
	cfg.fill_threads = 2;
	return fx_open(NULL, spec, 1, 0, &cfg);
}

static void latency_spikes_leave_demand_first_and_no_deadlock(void **state)
{
	struct mp_pager *p;
	uint32_t mapped = 0;

	(void)state;
	/* Every layer-0 read takes 300 ms; the others are fast. */
	p = two_fillers("read:delay=300ms:layer=0", false);
	for (uint32_t e = 0; e < fx.geo->experts; e++)
		assert_int_equal(mp_pager_prefetch(p, 0, e, 10), 1);
	/* Demand overtakes the eight slow prefetches queued before it. */
	for (uint32_t e = 0; e < 4; e++)
		assert_int_equal(fx_read(p, 2, e), 0);
	for (uint32_t e = 0; e < fx.geo->experts; e++)
		mapped += mp_pager_residency(p, 0, e) == MP_RES_MAPPED;
	assert_true(mapped < fx.geo->experts / 2);
	assert_int_equal(mp_pager_wait_idle(p, 20000), 0);
	for (uint32_t e = 0; e < fx.geo->experts; e++)
		assert_int_equal(mp_pager_residency(p, 0, e), MP_RES_MAPPED);
	mp_pager_close(p);
}

/*
 * Routing to an expert whose prefetch is queued makes it a demand read at
 * once: it does not wait behind the prefetches queued before it (every
 * layer-0 read takes 200 ms; one prefetch is read at a time).
 */
static void a_routed_expert_overtakes_the_queued_prefetches(void **state)
{
	struct mp_pager_stats st;
	struct mp_pager *p;
	uint32_t last, mapped = 0;

	(void)state;
	p = two_fillers("read:delay=200ms:layer=0", true);
	last = fx.geo->experts - 1;
	for (uint32_t e = 0; e <= last; e++)
		assert_int_equal(mp_pager_prefetch(p, 0, e, 10), 1);
	assert_int_equal(mp_pager_route(p, 0, 0, 0, &last, NULL, 1), 0);
	assert_int_equal(fx_read(p, 0, last), 0);
	for (uint32_t e = 0; e < last; e++)
		mapped += mp_pager_residency(p, 0, e) == MP_RES_MAPPED;
	assert_true(mapped < last / 2);
	mp_pager_stats(p, &st);
	assert_int_equal(st.prefetch_used, 0);
	assert_int_equal(mp_pager_wait_idle(p, 20000), 0);
	mp_pager_close(p);
}

/*
 * The engine routes to an expert whose prefetch is still being read (every
 * layer-1 read takes 500 ms, ample for a loaded CI): a late prefetch, counted once, though the
 * route's note of the use leaves the fault that follows nothing to tell.
 */
static void a_prefetch_routed_while_read_is_late(void **state)
{
	struct mp_pager_stats st;
	struct mp_pager *p;
	uint32_t id = 1;

	(void)state;
	p = two_fillers("read:delay=500ms:layer=1", true);
	assert_int_equal(mp_pager_prefetch(p, 1, id, 1), 1);
	for (int i = 0; mp_pager_residency(p, 1, id) != MP_RES_FILLING; i++) {
		assert_true(i < 5000);
		usleep(1000);
	}
	assert_int_equal(mp_pager_route(p, 0, 0, 1, &id, NULL, 1), 0);
	assert_int_equal(fx_read(p, 1, id), 0);
	mp_pager_stats(p, &st);
	assert_int_equal(st.prefetch_issued, 1);
	assert_int_equal(st.prefetch_late, 1);
	assert_int_equal(st.prefetch_used, 1);
	assert_int_equal(st.misses, 1);
	mp_pager_close(p);
}

struct spiky {
	struct mp_pager *p;
	unsigned seed;
	int bad;
	int reads;
};

static void *read_spiky(void *arg)
{
	struct spiky *s = arg;

	for (int i = 0; i < 60; i++) {
		uint32_t l = (uint32_t)rand_r(&s->seed) % fx.geo->layers;
		uint32_t e = (uint32_t)rand_r(&s->seed) % fx.geo->experts;

		s->bad += fx_read(s->p, l, e) != 0;
		s->reads++;
	}
	return NULL;
}

static void random_latency_spikes_with_many_readers_finish(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:delay=20ms:p=0.3;read:delay=1ms", 9, 3, NULL);
	struct mp_fault_counts c;
	struct spiky s[4];
	pthread_t th[4];

	(void)state;
	for (int i = 0; i < 4; i++) {
		s[i] = (struct spiky){ .p = p, .seed = 11u * (unsigned)i + 1 };
		pthread_create(&th[i], NULL, read_spiky, &s[i]);
	}
	for (int i = 0; i < 4; i++) {
		if (!fx_join(th[i], 60000))
			fail_msg("reader %d made no progress in 60 s under latency spikes", i);
		assert_int_equal(s[i].bad, 0);
		assert_int_equal(s[i].reads, 60);
	}
	fx_counts(p, &c);
	assert_true(c.delays > 0);
	mp_pager_close(p);
}

static void tier_enomem_is_reported_not_fatal(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:enomem:expert=2.5", 1, 4, NULL);
	struct mp_pager_stats st;

	(void)state;
	fx_log_reset();
	assert_int_equal(fx_read(p, 2, 5), -ENOMEM);
	assert_true(fx_log_contains("layer 2 expert 5"));
	assert_true(fx_log_contains("lack of memory"));
	for (uint32_t e = 0; e < fx.geo->experts; e++)
		if (e != 5)
			assert_int_equal(fx_read(p, 2, e), 0);
	mp_pager_stats(p, &st);
	assert_int_equal(st.poisoned, 1);
	mp_pager_close(p);
}

static void transient_tier_enomem_is_retried(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:enomem:count=2", 1, 4, NULL);

	(void)state;
	assert_int_equal(fx_read(p, 0, 0), 0);
	assert_int_equal(fx_read(p, 0, 1), 0);
	mp_pager_close(p);
}

static void alloc_enomem_is_reported_not_fatal(void **state)
{
	struct mp_pager *p = fx_open(NULL, "alloc:enomem:after=3:count=2", 1, 8, NULL);
	struct mp_fault_counts c;
	int errs = 0;

	(void)state;
	fx_log_reset();
	/* Allocations 4 and 5 are refused: those experts error, the others read. */
	for (uint32_t e = 0; e < 6; e++) {
		int ret = fx_read(p, 1, e);

		assert_true(ret == 0 || ret == -ENOMEM);
		errs += ret == -ENOMEM;
	}
	fx_counts(p, &c);
	assert_int_equal(c.alloc_enomem, 2);
	assert_int_equal(errs, 2);
	assert_true(fx_log_contains("memory for the expert refused"));
	/* Not fatal: the refused experts read once memory is given again. */
	for (uint32_t e = 0; e < 6; e++)
		assert_int_equal(fx_read(p, 1, e), 0);
	mp_pager_close(p);
}

static void pager_reads_the_fault_environment(void **state)
{
	struct mp_pager_config cfg;
	struct mp_pager *p = NULL;

	(void)state;
	mp_pager_config_init(&cfg);
	cfg.budget_bytes = 2 * fx.xbytes;
	setenv(MP_FAULT_ENV, "read:eio:expert=0.1", 1);
	fx_log_reset();
	assert_int_equal(mp_pager_open(fx.store, &cfg, &p), 0);
	unsetenv(MP_FAULT_ENV);
	assert_true(mp_tier_is_fault(p->tier));
	assert_int_equal(fx_read(p, 0, 1), -EIO);
	assert_int_equal(fx_read(p, 0, 0), 0);
	mp_pager_close(p);

	/* A bad spec fails the open, naming the variable, the rule and the position. */
	setenv(MP_FAULT_ENV, "read:eio:p=2", 1);
	fx_log_reset();
	assert_int_equal(mp_pager_open(fx.store, &cfg, &p), -EINVAL);
	unsetenv(MP_FAULT_ENV);
	assert_null(p);
	assert_true(fx_log_contains("MOEPAGER_FAULT: rule 1 'read:eio:p=2', position 12"));

	/* The config's spec and seed. */
	cfg.fault = "read:corrupt:expert=3.3";
	cfg.fault_seed = 99;
	assert_int_equal(mp_pager_open(fx.store, &cfg, &p), 0);
	assert_int_equal(fx_read(p, 3, 3), -EBADMSG);
	assert_int_equal(fx_read(p, 3, 2), 0);
	mp_pager_close(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(transient_eio_is_retried_and_served_right),
		cmocka_unit_test(random_eio_on_every_expert_is_retried_to_right_bytes),
		cmocka_unit_test(persistent_eio_errors_naming_layer_and_expert),
		cmocka_unit_test(short_reads_are_completed_by_reading_again),
		cmocka_unit_test(persistent_short_read_is_an_error_not_short_bytes),
		cmocka_unit_test(corruption_is_caught_by_the_checksum_and_never_served),
		cmocka_unit_test(transient_corruption_is_read_again),
		cmocka_unit_test(latency_spikes_leave_demand_first_and_no_deadlock),
		cmocka_unit_test(random_latency_spikes_with_many_readers_finish),
		cmocka_unit_test(a_routed_expert_overtakes_the_queued_prefetches),
		cmocka_unit_test(a_prefetch_routed_while_read_is_late),
		cmocka_unit_test(tier_enomem_is_reported_not_fatal),
		cmocka_unit_test(transient_tier_enomem_is_retried),
		cmocka_unit_test(alloc_enomem_is_reported_not_fatal),
		cmocka_unit_test(pager_reads_the_fault_environment),
	};

	return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
