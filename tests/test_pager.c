// SPDX-License-Identifier: MIT
/* Description: the pager over the tiny model: bytes, budget, eviction, prefetch, guard, close. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <moepager/source.h>

#include "helpers.h"
#include "base/base.h"
#include "pager/hooks.h"
#include "pager/pager_priv.h"
#include "uffd/compat.h"
#include "uffd/region_priv.h"
#include "tier/inject.h"
#include "tier/tier.h"

static struct mp_store *store;
static const struct mp_geometry *geo;
static uint64_t xbytes;		/* bytes of one expert */
static uint8_t **expected;	/* every expert's bytes, read with pread */
static struct mp_store *variant;	/* rows from other sources: opened by open_sources() */
static struct mp_adapter *adapter;

/*
 * A test tier wrapped around the file tier: fails, corrupts or delays
 * reads of chosen experts, like the fault-injection layer will.
 */
struct test_tier {
	struct mp_tier t;
	struct mp_tier *lower;
	atomic_int fail_layer;		/* -1: every layer */
	atomic_int fail_expert;
	atomic_int mode;		/* 0 pass, 1 EIO, 2 corrupt */
	atomic_uint delay_ms;
	atomic_int hold;		/* expert (layer x experts + e) whose reads wait; -1: none */
	atomic_int reads;
	atomic_int order[64];		/* expert (layer x experts + e) of each read, in order */
	atomic_int gate_layer;		/* reads of this layer and later wait for a pass; -1: none */
	atomic_int passes;		/* gated reads to let through */
	atomic_int cancelled;		/* reads stopped by rd->cancel */
	_Atomic pid_t reader[64];	/* thread that last read expert layer x experts + e */
	struct mp_pager *pager;		/* with watch >= 0: */
	atomic_int watch;		/* expert (layer x experts + e) whose read is watched */
	atomic_int mapped_at_watch;	/* experts mapped when that read began */
	atomic_bool track_peak;		/* record the pool's populated bytes as reads end: */
	_Atomic uint64_t peak_populated;
};

enum { PASS = 0, FAIL_EIO = 1, CORRUPT = 2, STRAY = 3 };

struct corrupt_arg {
	mp_io_ready_fn ready;
	void *arg;
	bool done;
};

static int corrupt_ready(void *arg, const void *buf, size_t len)
{
	struct corrupt_arg *c = arg;

	if (!c->done && len) {
		((uint8_t *)buf)[len / 2] ^= 0x5a;
		c->done = true;
	}
	return c->ready(c->arg, buf, len);
}

/*
 * Puts a copy of the expert's second page into the range before the fill
 * maps it, a page no move brought: the map meets it (EEXIST over the page
 * still in its spot) and the region calls the slot's data lost. The copy
 * holds the right bytes, as a reader may see it before the discard.
 */
static int put_stray_page(struct test_tier *tt, uint32_t layer, uint32_t expert)
{
	static uint8_t page[4096] __attribute__((aligned(4096)));
	struct mp_pager *p = tt->pager;
	uint32_t slot = layer * mp_pager_slots_per_layer(p) + expert;
	struct uffdio_copy c = {
		.dst = (uintptr_t)mp_region_slot_addr(p->region, slot) + 4096,
		.src = (uintptr_t)page,
		.len = 4096,
		.mode = UFFDIO_COPY_MODE_DONTWAKE,
	};

	memcpy(page, expected[layer * geo->experts + expert] + 4096, sizeof(page));
	if (ioctl(p->region->uffd, UFFDIO_COPY, &c))
		return mp_err(-errno, "test tier: a stray page into layer %u expert %u: %s",
			      layer, expert, strerror(errno));
	return 0;
}

static int test_tier_read(struct mp_tier *t, const struct mp_tier_read *rd)
{
	struct test_tier *tt = container_of(t, struct test_tier, t);
	int fl = atomic_load(&tt->fail_layer), fe = atomic_load(&tt->fail_expert);
	bool match = (fl < 0 || (uint32_t)fl == rd->layer) &&
		     (fe < 0 || (uint32_t)fe == rd->expert);
	unsigned delay = atomic_load(&tt->delay_ms);
	int n = atomic_fetch_add(&tt->reads, 1), gate;

	if (n < 64)
		atomic_store(&tt->order[n], (int)(rd->layer * geo->experts + rd->expert));
	while ((gate = atomic_load(&tt->gate_layer)) >= 0 && rd->layer >= (uint32_t)gate) {
		int k = atomic_load(&tt->passes);

		if (k > 0 && atomic_compare_exchange_weak(&tt->passes, &k, k - 1))
			break;
		if (rd->cancel && atomic_load(rd->cancel)) {
			atomic_fetch_add(&tt->cancelled, 1);
			return -ECANCELED;
		}
		usleep(1000);
	}
	if (rd->layer * geo->experts + rd->expert < 64)
		atomic_store(&tt->reader[rd->layer * geo->experts + rd->expert], gettid());
	if (atomic_load(&tt->watch) == (int)(rd->layer * geo->experts + rd->expert)) {
		struct mp_pager_stats st;

		mp_pager_stats(tt->pager, &st);
		atomic_store(&tt->mapped_at_watch, (int)st.mapped_experts);
	}
	/* Delayed by delay_ms, and held while the test holds this expert. */
	for (unsigned i = 0; i < delay || atomic_load(&tt->hold) == (int)(rd->layer *
								     geo->experts + rd->expert); i++) {
		if (rd->cancel && atomic_load(rd->cancel)) {
			atomic_fetch_add(&tt->cancelled, 1);
			return -ECANCELED;
		}
		usleep(1000);
	}
	if (atomic_load(&tt->track_peak)) {
		struct mp_region_mem m;
		uint64_t peak = atomic_load(&tt->peak_populated);

		mp_region_mem(tt->pager->region, &m);
		while (m.populated_bytes > peak &&
		       !atomic_compare_exchange_weak(&tt->peak_populated, &peak, m.populated_bytes))
			;
	}
	if (match && atomic_load(&tt->mode) == FAIL_EIO)
		return mp_err(-EIO, "test tier: layer %u expert %u: injected EIO", rd->layer,
			      rd->expert);
	if (match && atomic_load(&tt->mode) == CORRUPT) {
		struct corrupt_arg c = { rd->ready, rd->arg, false };
		struct mp_tier_read r = *rd;

		r.ready = corrupt_ready;
		r.arg = &c;
		return mp_tier_read(tt->lower, &r);
	}
	if (match && atomic_load(&tt->mode) == STRAY) {
		int err = mp_tier_read(tt->lower, rd), once = STRAY;

		/* Once: the read again finds the range as it should be. */
		if (!err && atomic_compare_exchange_strong(&tt->mode, &once, PASS))
			err = put_stray_page(tt, rd->layer, rd->expert);
		return err;
	}
	return mp_tier_read(tt->lower, rd);
}

static void test_tier_destroy(struct mp_tier *t)
{
	struct test_tier *tt = container_of(t, struct test_tier, t);

	mp_tier_destroy(tt->lower);
	tt->lower = NULL;
}

static const struct mp_tier_ops test_tier_ops = {
	.name = "test",
	.read = test_tier_read,
	.destroy = test_tier_destroy,
};

static struct test_tier ttier;

static int wrap(void *arg, struct mp_tier *lower, struct mp_tier **out)
{
	struct test_tier *tt = arg;

	tt->t.ops = &test_tier_ops;
	snprintf(tt->t.name, sizeof(tt->t.name), "test");
	tt->t.number = 2;
	tt->lower = lower;
	atomic_store(&tt->fail_layer, -1);
	atomic_store(&tt->fail_expert, -1);
	atomic_store(&tt->mode, PASS);
	atomic_store(&tt->delay_ms, 0);
	atomic_store(&tt->hold, -1);
	atomic_store(&tt->reads, 0);
	atomic_store(&tt->gate_layer, -1);
	atomic_store(&tt->passes, 0);
	atomic_store(&tt->cancelled, 0);
	atomic_store(&tt->watch, -1);
	atomic_store(&tt->track_peak, false);
	atomic_store(&tt->peak_populated, 0);
	*out = &tt->t;
	return 0;
}

static const struct mp_pager_hooks hooks = { .wrap_tier = wrap, .arg = &ttier };

/*
 * How a behaviour runs: an eviction policy, and the way the experts are
 * reached and resolved (the kernel selftests' memory types, here):
 * MP_RESOLVE_FAULT touches them and the fault path brings them in;
 * MP_RESOLVE_CALLER asks for them as the runner does, reporting the routing
 * and then asking the pager's source, which resolves them on the asking thread.
 */
struct mode {
	const char *policy;
	uint32_t resolve;
};

static uint32_t resolve_now;	/* of the pager open_pager() opened last */

static struct mp_pager *open_pager_cfg(uint64_t budget_experts, const struct mode *m,
				       struct mp_pager_config *cfg)
{
	struct mp_pager *p = NULL;
	int err;

	cfg->budget_bytes = budget_experts * xbytes;
	cfg->eviction = m ? m->policy : NULL;
	cfg->resolve = m ? m->resolve : MP_RESOLVE_FAULT;
	/* Touches fault on their own; the engine's way reports routing, which starts reads. */
	cfg->no_route_fill = cfg->resolve != MP_RESOLVE_CALLER;
	resolve_now = cfg->resolve;
	err = mp_pager_open_hooked(store, cfg, &hooks, &p);
	if (err == -EPERM || err == -EOPNOTSUPP) {
		print_message("userfaultfd unavailable: %s\n", mp_last_error());
		exit(t_require_all() ? 1 : T_EXIT_SKIP);
	}
	assert_int_equal(err, 0);
	return p;
}

static struct mp_pager *open_pager(uint64_t budget_experts, const struct mode *m)
{
	struct mp_pager_config cfg;

	mp_pager_config_init(&cfg);
	return open_pager_cfg(budget_experts, m, &cfg);
}

/* An expert, reached the way the current mode reaches experts (struct mode). */
static const uint8_t *get(struct mp_pager *p, uint32_t l, uint32_t e)
{
	if (resolve_now != MP_RESOLVE_CALLER)
		return mp_pager_expert(p, l, e);
	if (mp_pager_route(p, 0, 0, l, &e, NULL, 1))
		return NULL;
	return mp_pager_source_ops()->expert(p, l, e);
}

/*
 * A demand fault count: exact when touches fault; asked for the engine's
 * way, an expert a fill thread mapped before the request came (route_fill)
 * cost no fault.
 */
static void assert_faults(uint64_t got, uint64_t want)
{
	if (resolve_now == MP_RESOLVE_CALLER)
		assert_true(got <= want);
	else
		assert_int_equal(got, want);
}

static int group_setup(void **state)
{
	const char *path;

	(void)state;
	t_log_capture();
	path = t_path("tiny.mpk");
	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 42), 0);
	assert_int_equal(mp_store_open(path, &store), 0);
	geo = mp_store_geometry(store);
	xbytes = mp_store_expert_bytes(store);
	expected = calloc(geo->layers * geo->experts, sizeof(*expected));
	for (uint32_t l = 0; l < geo->layers; l++) {
		for (uint32_t e = 0; e < geo->experts; e++) {
			uint8_t *b = malloc(xbytes);

			assert_int_equal(mp_store_read_expert(store, l, e, b), 0);
			expected[l * geo->experts + e] = b;
		}
	}
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	for (uint32_t i = 0; i < geo->layers * geo->experts; i++)
		free(expected[i]);
	free(expected);
	mp_store_close(store);
	mp_store_close(variant);
	mp_adapter_close(adapter);
	t_tmpdir_cleanup();
	return 0;
}

static const uint8_t *want(uint32_t l, uint32_t e)
{
	return expected[l * geo->experts + e];
}

static void every_expert_reads_back_under_two_expert_budget(void **state)
{
	struct mp_pager *p = open_pager(2, *state);
	struct mp_pager_stats st;
	uint32_t n = geo->layers * geo->experts, absent = 0;

	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t l = 0; l < geo->layers; l++) {
			for (uint32_t e = 0; e < geo->experts; e++) {
				/* A frequency policy may keep an old expert (e.g. 0.0) throughout. */
				absent += mp_pager_residency(p, l, e) != MP_RES_MAPPED;
				assert_memory_equal(get(p, l, e), want(l, e), xbytes);
			}
		}
	}
	mp_pager_stats(p, &st);
	/* Each touch of an expert not in memory is one file-tier fault: constant eviction. */
	assert_true(absent >= 2 * n - 2);
	assert_faults(st.faults_file, absent);
	assert_int_equal(st.faults_host, 0);
	assert_int_equal(st.evictions, absent - 2);
	assert_int_equal(st.bytes_file, absent * xbytes);
	assert_true(st.resident_peak <= 2 * xbytes);
	assert_int_equal(st.resident_experts, 2);
	assert_true(mp_pager_stats_quantile(&st, 0.5) > 0);
	mp_pager_close(p);
}

struct reader {
	struct mp_pager *p;
	unsigned seed;
	int iters;
	int bad;
	atomic_bool *stop;
};

static void *read_random(void *arg)
{
	struct reader *r = arg;

	for (int i = 0; i < r->iters && !(r->stop && atomic_load(r->stop)); i++) {
		uint32_t l = (uint32_t)rand_r(&r->seed) % geo->layers;
		/* Overlap: few experts, many threads. */
		uint32_t e = (uint32_t)rand_r(&r->seed) % 3;
		const uint8_t *x = get(r->p, l, e);

		if (memcmp(x, want(l, e), xbytes))
			r->bad++;
	}
	return NULL;
}

static void threads_reading_overlapping_experts_see_file_bytes(void **state)
{
	struct mp_pager *p = open_pager(3, *state);
	struct reader r[4];
	pthread_t th[4];

	for (int i = 0; i < 4; i++) {
		r[i] = (struct reader){ .p = p, .seed = 7u + (unsigned)i, .iters = 300 };
		pthread_create(&th[i], NULL, read_random, &r[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(r[i].bad, 0);
	}
	mp_pager_close(p);
}

struct sampler {
	struct mp_pager *p;
	atomic_bool stop;
	uint64_t max_resident;
	uint64_t samples;
};

static void *sample_budget(void *arg)
{
	struct sampler *s = arg;
	struct mp_pager_stats st;

	while (!atomic_load(&s->stop)) {
		mp_pager_stats(s->p, &st);
		s->max_resident = MP_MAX(s->max_resident, st.resident_bytes);
		s->samples++;
	}
	return NULL;
}

static void budget_is_never_exceeded_while_threads_read(void **state)
{
	struct mp_pager *p = open_pager(2, *state);
	struct sampler s = { .p = p };
	struct reader r[3];
	pthread_t th[3], sm;
	struct mp_pager_stats st;

	pthread_create(&sm, NULL, sample_budget, &s);
	for (int i = 0; i < 3; i++) {
		r[i] = (struct reader){ .p = p, .seed = 100u + (unsigned)i, .iters = 200 };
		pthread_create(&th[i], NULL, read_random, &r[i]);
	}
	for (int i = 0; i < 3; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(r[i].bad, 0);
	}
	atomic_store(&s.stop, true);
	pthread_join(sm, NULL);
	mp_pager_stats(p, &st);
	assert_true(s.samples > 100);
	assert_true(s.max_resident <= 2 * xbytes);
	assert_true(st.resident_peak <= 2 * xbytes);
	assert_true(st.evictions > 0);
	mp_pager_close(p);
}

static void prefetch_then_read_causes_no_demand_fault(void **state)
{
	struct mp_pager *p = open_pager(8, *state);
	struct mp_pager_stats st;
	uint32_t ids[2] = { 1, 2 };

	for (uint32_t e = 0; e < 4; e++)
		assert_int_equal(mp_pager_prefetch(p, 1, e, (int)e), 1);
	/* Already queued or resident: nothing new. */
	assert_int_equal(mp_pager_prefetch(p, 1, 0, 9), 0);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	for (uint32_t e = 0; e < 4; e++)
		assert_int_equal(mp_pager_residency(p, 1, e), MP_RES_MAPPED);
	assert_int_equal(mp_pager_route(p, 0, 0, 1, ids, NULL, 2), 0);
	for (uint32_t e = 0; e < 4; e++)
		assert_memory_equal(get(p, 1, e), want(1, e), xbytes);
	mp_pager_stats(p, &st);
	assert_int_equal(st.faults_file, 0);
	assert_int_equal(st.faults_host, 0);
	assert_int_equal(st.fault_waits, 0);
	assert_int_equal(st.prefetch_issued, 4);
	/* The engine's way reports a routing for each of the 4 reads too. */
	assert_int_equal(st.prefetch_used, resolve_now == MP_RESOLVE_CALLER ? 4 : 2);
	assert_int_equal(st.hits, resolve_now == MP_RESOLVE_CALLER ? 6 : 2);
	assert_int_equal(st.misses, 0);
	mp_pager_close(p);
}

/*
 * mp_pager_evict() until it is not -EBUSY, for 2 s at most: the API lets an
 * eviction without MP_EVICT_DEFER fail while the kernel holds the pages
 * briefly (seen once in 3,440 loaded ASan runs right after a fault).
 */
static int evict_soon(struct mp_pager *p, uint32_t layer, uint32_t expert, unsigned flags)
{
	int err;

	for (int i = 0; (err = mp_pager_evict(p, layer, expert, flags)) == -EBUSY && i < 2000; i++)
		usleep(1000);
	return err;
}

static void host_tier_refault_returns_right_bytes(void **state)
{
	struct mp_pager *p = open_pager(4, *state);
	struct mp_pager_stats st;

	assert_memory_equal(get(p, 2, 3), want(2, 3), xbytes);
	assert_int_equal(evict_soon(p, 2, 3, MP_EVICT_KEEP_HOST), 0);
	assert_int_equal(mp_pager_residency(p, 2, 3), MP_RES_HOST);
	assert_memory_equal(get(p, 2, 3), want(2, 3), xbytes);
	assert_int_equal(mp_pager_residency(p, 2, 3), MP_RES_MAPPED);
	mp_pager_stats(p, &st);
	assert_faults(st.faults_file, 1);
	assert_faults(st.faults_host, 1);
	assert_int_equal(st.evictions_view, 1);
	assert_int_equal(st.evictions, 0);
	assert_int_equal(st.bytes_host, xbytes);
	/* Dropped for good, it comes back from the file. */
	assert_int_equal(evict_soon(p, 2, 3, 0), 0);
	assert_int_equal(mp_pager_evict(p, 2, 3, 0), -ENOENT);
	assert_memory_equal(get(p, 2, 3), want(2, 3), xbytes);
	mp_pager_stats(p, &st);
	assert_faults(st.faults_file, 2);
	assert_int_equal(st.bytes_file, 2 * xbytes);
	mp_pager_close(p);
}

struct evictor {
	struct mp_pager *p;
	atomic_bool stop;
	atomic_int evicted;
};

static void *evict_loop(void *arg)
{
	struct evictor *ev = arg;

	while (!atomic_load(&ev->stop)) {
		if (!mp_pager_evict(ev->p, 0, 5, (ev->evicted & 1) ? MP_EVICT_KEEP_HOST : 0))
			ev->evicted++;
		usleep(50);
	}
	return NULL;
}

static void evicting_an_expert_being_read_refaults_right_bytes(void **state)
{
	struct mp_pager *p = open_pager(4, *state);
	struct evictor ev = { .p = p };
	struct mp_pager_stats st;
	pthread_t th;
	uint64_t t0;
	int bad = 0;

	pthread_create(&th, NULL, evict_loop, &ev);
	t0 = mp_now_ns();
	/* 300 ms at least, and until the evictor has had its turns (a loaded machine starves it). */
	for (uint64_t dt = 0; dt < 60ull * 1000 * 1000 * 1000; dt = mp_now_ns() - t0) {
		bad += memcmp(get(p, 0, 5), want(0, 5), xbytes) != 0;
		if (dt > 300ull * 1000 * 1000 && atomic_load(&ev.evicted) > 10) {
			mp_pager_stats(p, &st);
			if (st.faults_file + st.faults_host > 10)
				break;
		}
	}
	atomic_store(&ev.stop, true);
	pthread_join(th, NULL);
	mp_pager_stats(p, &st);
	assert_int_equal(bad, 0);
	assert_true(ev.evicted > 10);
	assert_true(st.faults_file + st.faults_host > 10);
	mp_pager_close(p);
}

struct racer {
	struct mp_pager *p;
	pthread_barrier_t *go;
	int same;
};

static void *race_one(void *arg)
{
	struct racer *r = arg;
	const uint8_t *x = get(r->p, 3, 1);

	pthread_barrier_wait(r->go);
	r->same = !memcmp(x, want(3, 1), xbytes);
	return NULL;
}

static void racing_faults_on_one_expert_read_it_once(void **state)
{
	struct mp_pager *p = open_pager(4, *state);
	struct mp_pager_stats st;
	pthread_barrier_t go;
	struct racer r[8];
	pthread_t th[8];

	atomic_store(&ttier.delay_ms, 50);
	pthread_barrier_init(&go, NULL, 8);
	for (int i = 0; i < 8; i++) {
		r[i] = (struct racer){ .p = p, .go = &go };
		pthread_create(&th[i], NULL, race_one, &r[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(r[i].same, 1);
	}
	atomic_store(&ttier.delay_ms, 0);
	pthread_barrier_destroy(&go);
	mp_pager_stats(p, &st);
	/* Eight threads, one fault episode, one read: the rest waited on it. */
	assert_int_equal(st.faults_file, 1);
	assert_int_equal(st.bytes_file, xbytes);
	assert_int_equal(atomic_load(&ttier.reads), 1);
	assert_true(st.fault_waits >= 2 && st.fault_waits <= 8);
	assert_true(st.stall_ns >= st.fault_waits * 10ull * 1000 * 1000);
	/* Every wait counted once, and as the asking thread's only when asked for. */
	assert_int_equal(st.caller_stall_ns,
			 resolve_now == MP_RESOLVE_CALLER ? st.stall_ns : 0);
	mp_pager_close(p);
}

static void application_zap_of_a_mapped_expert_reads_it_again(void **state)
{
	struct mp_pager *p = open_pager(4, *state);
	const uint8_t *x = get(p, 1, 6);
	struct mp_pager_stats st;

	assert_memory_equal(x, want(1, 6), xbytes);
	/* The pages are freed behind the pager's back (a REMOVE event it is told of). */
	assert_int_equal(madvise((void *)x, xbytes, MADV_DONTNEED), 0);
	assert_memory_equal(x, want(1, 6), xbytes);
	/*
	 * The REMOVE event comes before the kernel's zap, and the pager starts
	 * the read again on the event: the pages may be back before this touch
	 * (no fault, the read's accounting still to come), or land before the
	 * zap and be read a third time on the touch. Either way: read again.
	 */
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	mp_pager_stats(p, &st);
	assert_true(st.bytes_file >= 2 * xbytes);
	assert_int_equal(st.resident_bytes, xbytes);
	assert_int_equal(mp_pager_residency(p, 1, 6), MP_RES_MAPPED);
	mp_pager_close(p);
}

/*
 * A fill whose read is good but whose map meets a page in the range that no
 * read put there loses the pages (the region cannot trust the slot's spots,
 * so they are discarded): the thread waiting for the expert gets it read
 * again, never an error or wrong bytes.
 */
static void a_fill_whose_map_loses_the_pages_reads_it_again(void **state)
{
	struct mp_pager *p = open_pager(4, *state);
	struct mp_pager_stats st;
	const uint8_t *x;

	ttier.pager = p;
	atomic_store(&ttier.fail_layer, 2);
	atomic_store(&ttier.fail_expert, 3);
	atomic_store(&ttier.mode, STRAY);
	t_log_reset();
	x = get(p, 2, 3);
	assert_non_null(x);
	assert_memory_equal(x, want(2, 3), xbytes);
	assert_int_equal(atomic_load(&ttier.mode), PASS);
	assert_true(t_log_contains("slot data lost"));
	assert_true(t_log_contains("layer 2 expert 3: its pages were lost while mapped; "
				   "reading it again"));
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	mp_pager_stats(p, &st);
	assert_int_equal(st.poisoned, 0);
	assert_int_equal(st.resident_bytes, xbytes);
	assert_int_equal(mp_pager_residency(p, 2, 3), MP_RES_MAPPED);
	mp_pager_close(p);
}

static void shrinking_the_budget_evicts_down_to_it(void **state)
{
	struct mp_pager *p = open_pager(8, *state);
	struct mp_pager_stats st;

	for (uint32_t e = 0; e < 6; e++)
		assert_memory_equal(get(p, 3, e), want(3, e), xbytes);
	mp_pager_stats(p, &st);
	assert_int_equal(st.resident_bytes, 6 * xbytes);
	assert_int_equal(mp_pager_set_budget(p, 2 * xbytes), 0);
	mp_pager_stats(p, &st);
	assert_int_equal(st.resident_bytes, 2 * xbytes);
	assert_int_equal(st.evictions, 4);
	assert_int_equal(mp_pager_budget(p), 2 * xbytes);
	t_log_reset();
	assert_int_equal(mp_pager_set_budget(p, xbytes - 1), -EINVAL);
	assert_true(t_log_contains("below one expert"));
	/* Still serving, within the new budget. */
	assert_memory_equal(get(p, 3, 7), want(3, 7), xbytes);
	mp_pager_stats(p, &st);
	assert_true(st.resident_bytes <= 2 * xbytes);
	mp_pager_close(p);
}

struct shrinker {
	struct mp_pager *p;
	pthread_barrier_t *go;
	uint64_t budget, resident;
	int ret;
};

static void *shrink(void *arg)
{
	struct shrinker *s = arg;
	struct mp_pager_stats st;

	pthread_barrier_wait(s->go);
	s->ret = mp_pager_set_budget(s->p, s->budget);
	mp_pager_stats(s->p, &st);
	s->resident = st.resident_bytes;
	return NULL;
}

/*
 * Two threads shrink the budget at once (or a fill thread enforces it while
 * the owner shrinks): each counts the other's evictions in flight as done,
 * yet neither returns before they are, so the budget holds on return.
 */
static void concurrent_shrinks_each_return_within_the_budget(void **state)
{
	struct mp_pager *p = open_pager(8, NULL);
	pthread_barrier_t go;

	(void)state;
	pthread_barrier_init(&go, NULL, 2);
	for (int round = 0; round < 40; round++) {
		struct shrinker s[2] = { { p, &go, 2 * xbytes, 0, 1 },
					 { p, &go, 3 * xbytes, 0, 1 } };
		pthread_t th[2];

		assert_int_equal(mp_pager_set_budget(p, 8 * xbytes), 0);
		for (uint32_t e = 0; e < 8; e++)
			assert_memory_equal(get(p, (uint32_t)round % 4, e),
					    want((uint32_t)round % 4, e), xbytes);
		for (int i = 0; i < 2; i++)
			pthread_create(&th[i], NULL, shrink, &s[i]);
		for (int i = 0; i < 2; i++) {
			pthread_join(th[i], NULL);
			assert_int_equal(s[i].ret, 0);
			/* Whichever budget was set last, each return sees at most the larger one. */
			assert_true(s[i].resident <= 3 * xbytes);
		}
	}
	pthread_barrier_destroy(&go);
	mp_pager_close(p);
}

/* With 2 slots of budget: A, B, use A, then C. LRU drops B, FIFO drops A. */
static void lru_and_fifo_pick_their_victims(void **state)
{
	const char *names[2] = { "lru", "fifo" };
	uint32_t a = 0;

	(void)state;
	for (int i = 0; i < 2; i++) {
		struct mp_pager *p = open_pager(2, &(struct mode){ names[i], MP_RESOLVE_FAULT });

		assert_memory_equal(mp_pager_expert(p, 0, 0), want(0, 0), xbytes);
		assert_memory_equal(mp_pager_expert(p, 0, 1), want(0, 1), xbytes);
		assert_int_equal(mp_pager_route(p, 0, 0, 0, &a, NULL, 1), 0);
		assert_memory_equal(mp_pager_expert(p, 0, 2), want(0, 2), xbytes);
		if (i == 0) {
			assert_int_equal(mp_pager_residency(p, 0, 0), MP_RES_MAPPED);
			assert_int_equal(mp_pager_residency(p, 0, 1), MP_RES_NONE);
		} else {
			assert_int_equal(mp_pager_residency(p, 0, 0), MP_RES_NONE);
			assert_int_equal(mp_pager_residency(p, 0, 1), MP_RES_MAPPED);
		}
		mp_pager_close(p);
	}
}

struct toucher {
	struct mp_pager *p;
	uint32_t expert;
	bool ok;
};

static void *touch_expert(void *arg)
{
	struct toucher *t = arg;

	t->ok = !memcmp(mp_pager_expert(t->p, 0, t->expert), want(0, t->expert), xbytes);
	return NULL;
}

/*
 * As many prefetch reads as the pager runs at once (one fill thread stays
 * free for demand) are held at the test tier's gate when a thread faults:
 * the next read is the faulting expert's, before the 24 prefetches still
 * queued. Exact, whatever the scheduler does (it counted reads after
 * 200 ms ones before, which a thread descheduled that long could fail).
 * With a free fill thread no prefetch read is let through: a pass made the
 * next prefetch's read race the demand's (dequeued first, its read started
 * after the next prefetch's on a descheduled thread: 20 in 1,680 runs).
 */
static void demand_fault_goes_before_queued_prefetches(void **state)
{
	struct mp_pager *p = open_pager(32, NULL);
	struct toucher t = { .p = p, .expert = 0 };
	struct mp_pager_stats st;
	int queued = 0, busy;
	pthread_t th;

	(void)state;
	atomic_store(&ttier.gate_layer, 1);
	for (uint32_t l = 1; l < geo->layers; l++)
		for (uint32_t e = 0; e < geo->experts; e++)
			queued += mp_pager_prefetch(p, l, e, 1);
	assert_int_equal(queued, (int)((geo->layers - 1) * geo->experts));
	busy = (int)MP_MIN(p->q.max_prefetch_fills, p->nworkers);
	while (atomic_load(&ttier.reads) < busy)
		usleep(1000);
	pthread_create(&th, NULL, touch_expert, &t);
	do {
		usleep(1000);
		mp_pager_stats(p, &st);
	} while (!st.faults_file);
	/*
	 * The fault is queued. A free fill thread reads it while every prefetch
	 * read is held; with none, one prefetch read must end first, and its
	 * thread takes the demand before the queued prefetches.
	 */
	if (busy == (int)p->nworkers)
		atomic_store(&ttier.passes, 1);
	while (atomic_load(&ttier.reads) <= busy)
		usleep(1000);
	assert_int_equal(atomic_load(&ttier.order[busy]), 0);
	pthread_join(th, NULL);
	assert_true(t.ok);
	mp_pager_stats(p, &st);
	assert_int_equal(st.faults_file, 1);
	atomic_store(&ttier.gate_layer, -1);
	assert_int_equal(mp_pager_wait_idle(p, 10000), 0);
	mp_pager_close(p);
}

struct guarded {
	struct mp_pager *p;
	uint32_t layer;
	uint32_t expert;
	int ret;
	int same;
};

static int read_expert_fn(void *arg)
{
	struct guarded *g = arg;

	g->same = !memcmp(mp_pager_expert(g->p, g->layer, g->expert), want(g->layer, g->expert),
			  xbytes);
	return 0;
}

static void poisoned_expert_errors_through_guard_then_retries(void **state)
{
	struct mp_pager *p = open_pager(4, NULL);
	struct guarded g = { .p = p, .layer = 1, .expert = 1 };
	struct mp_pager_stats st;

	(void)state;
	atomic_store(&ttier.fail_layer, 1);
	atomic_store(&ttier.fail_expert, 1);
	atomic_store(&ttier.mode, FAIL_EIO);
	t_log_reset();
	assert_int_equal(mp_pager_guard(p, read_expert_fn, &g), -EIO);
	assert_true(t_log_contains("layer 1 expert 1"));
	assert_true(t_log_contains("Input/output error"));
	mp_pager_stats(p, &st);
	assert_int_equal(st.poisoned, 1);
	assert_int_equal(st.read_errors, MP_PAGER_DEFAULT_READ_ATTEMPTS);
	/* Still failing: the next access reads again (every attempt again) and fails again. */
	assert_int_equal(mp_pager_guard(p, read_expert_fn, &g), -EIO);
	mp_pager_stats(p, &st);
	assert_int_equal(st.read_errors, 2 * MP_PAGER_DEFAULT_READ_ATTEMPTS);
	/* The tier recovers: the next access succeeds with the right bytes. */
	atomic_store(&ttier.mode, PASS);
	g.same = 0;
	assert_int_equal(mp_pager_guard(p, read_expert_fn, &g), 0);
	assert_int_equal(g.same, 1);
	/* Other experts never noticed. */
	g.expert = 2;
	assert_int_equal(mp_pager_guard(p, read_expert_fn, &g), 0);
	assert_int_equal(g.same, 1);
	mp_pager_close(p);
}

static atomic_int foreign_sigbus;

static int touch_nothing(void *arg)
{
	(void)arg;
	return 0;
}

static void foreign_on_sigbus(int sig)
{
	(void)sig;
	atomic_fetch_add(&foreign_sigbus, 1);
	_exit(99);	/* a poisoned touch that reached it would only fault again */
}

/*
 * A SIGBUS handler installed after the pager's (a test harness, a runtime)
 * is put back behind the guard's: by the next pager open, and by one of any
 * 64 guard entries of a thread (HOOK_RECHECK in guard.c). Without either,
 * the poisoned touch would reach the foreign handler.
 */
static void a_later_sigbus_handler_is_put_behind_the_guard(void **state)
{
	struct sigaction sa = { .sa_handler = foreign_on_sigbus }, old;
	struct mp_pager *p = open_pager(4, NULL), *q;
	struct guarded g = { .p = p, .layer = 1, .expert = 1 };
	struct mp_pager_config cfg;

	(void)state;
	sigemptyset(&sa.sa_mask);
	atomic_store(&ttier.fail_layer, 1);
	atomic_store(&ttier.fail_expert, 1);
	atomic_store(&ttier.mode, FAIL_EIO);
	assert_int_equal(mp_pager_guard(p, read_expert_fn, &g), -EIO);
	/* Replaced, then 64 guard entries touching nothing: ours again, in front. */
	assert_int_equal(sigaction(SIGBUS, &sa, &old), 0);
	for (int i = 0; i < 64; i++)
		assert_int_equal(mp_pager_guard(p, touch_nothing, NULL), 0);
	assert_int_equal(mp_pager_guard(p, read_expert_fn, &g), -EIO);
	/* Replaced, then another pager opened (without the test tier: it has one): ours again. */
	assert_int_equal(sigaction(SIGBUS, &sa, NULL), 0);
	mp_pager_config_init(&cfg);
	assert_int_equal(mp_pager_open(store, &cfg, &q), 0);
	assert_int_equal(mp_pager_guard(p, read_expert_fn, &g), -EIO);
	assert_int_equal(atomic_load(&foreign_sigbus), 0);
	atomic_store(&ttier.mode, PASS);
	mp_pager_close(q);
	mp_pager_close(p);
	sigaction(SIGBUS, &old, NULL);
}

static atomic_int chained_sigbus;

static void count_sigbus(int sig)
{
	(void)sig;
	atomic_fetch_add(&chained_sigbus, 1);
}

/*
 * A harness that saves the handler with signal() and puts it back with
 * signal() (cmocka does, around every test) installs the guard's own
 * handler without SA_SIGINFO. The next open must take it for ours and keep
 * chaining to the handler before it, not to itself with no siginfo.
 */
static void our_handler_put_back_by_signal_still_chains_to_the_one_before(void **state)
{
	struct sigaction sa = { .sa_handler = count_sigbus }, old;
	struct mp_pager_config cfg;
	struct mp_pager *p, *q;
	void (*back)(int);

	(void)state;
	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGBUS, &sa, &old), 0);
	mp_pager_config_init(&cfg);
	assert_int_equal(mp_pager_open(store, &cfg, &p), 0);	/* ours in front of count_sigbus */
	back = signal(SIGBUS, SIG_IGN);
	assert_ptr_not_equal(back, SIG_ERR);
	assert_ptr_not_equal(back, count_sigbus);
	assert_ptr_not_equal(signal(SIGBUS, back), SIG_ERR);
	assert_int_equal(mp_pager_open(store, &cfg, &q), 0);
	/* A SIGBUS that is not a guarded fault reaches count_sigbus, once. */
	atomic_store(&chained_sigbus, 0);
	assert_int_equal(raise(SIGBUS), 0);
	assert_int_equal(atomic_load(&chained_sigbus), 1);
	mp_pager_close(q);
	mp_pager_close(p);
	sigaction(SIGBUS, &old, NULL);
}

static void corrupt_read_is_caught_by_checksum_never_served(void **state)
{
	struct mp_pager *p = open_pager(4, NULL);
	struct guarded g = { .p = p, .layer = 2, .expert = 6 };

	(void)state;
	atomic_store(&ttier.fail_layer, 2);
	atomic_store(&ttier.fail_expert, 6);
	atomic_store(&ttier.mode, CORRUPT);
	t_log_reset();
	assert_int_equal(mp_pager_guard(p, read_expert_fn, &g), -EBADMSG);
	assert_true(t_log_contains("layer 2 expert 6: checksum mismatch"));
	assert_int_equal(g.same, 0);
	atomic_store(&ttier.mode, PASS);
	assert_int_equal(mp_pager_guard(p, read_expert_fn, &g), 0);
	assert_int_equal(g.same, 1);
	mp_pager_close(p);
}

static int read_slowly_fn(void *arg)
{
	struct guarded *g = arg;
	const volatile uint8_t *x = mp_pager_expert(g->p, g->layer, g->expert);

	g->same = x[0] == want(g->layer, g->expert)[0];
	return 0;
}

static void *guarded_reader(void *arg)
{
	struct guarded *g = arg;

	g->ret = mp_pager_guard(g->p, read_slowly_fn, g);
	return NULL;
}

static void close_with_faults_in_flight_releases_every_thread(void **state)
{
	struct mp_pager *p = open_pager(8, NULL);
	struct guarded g[4];
	pthread_t th[4];
	int errors = 0;

	(void)state;
	/* Reads take 10 s: every reader is blocked in its fault when close starts. */
	atomic_store(&ttier.delay_ms, 10000);
	for (int i = 0; i < 4; i++) {
		g[i] = (struct guarded){ .p = p, .layer = (uint32_t)i, .expert = 4, .ret = 1 };
		pthread_create(&th[i], NULL, guarded_reader, &g[i]);
	}
	while (atomic_load(&ttier.reads) < 2)
		usleep(1000);
	usleep(50 * 1000);
	t_log_reset();
	mp_pager_close(p);
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		errors += g[i].ret == -ESHUTDOWN;
	}
	/* Each reader got an error; the reads in flight were cancelled, not waited for. */
	assert_int_equal(errors, 4);
	assert_int_equal(atomic_load(&ttier.cancelled), 2);
	assert_true(t_log_contains("closed while it was being read"));
	atomic_store(&ttier.delay_ms, 0);
}

static int count_fds(void)
{
	int n = 0;

	for (int fd = 0; fd < 4096; fd++)
		n += fcntl(fd, F_GETFD) != -1;
	return n;
}

/* True when some mapping of /proc/self/maps overlaps [a, a+len). */
static bool mapped_anywhere(const void *a, uint64_t len)
{
	uintptr_t lo = (uintptr_t)a, hi = lo + len;
	unsigned long s, e;
	char line[512];
	bool hit = false;
	FILE *f = fopen("/proc/self/maps", "r");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx", &s, &e) == 2 && s < hi && e > lo)
			hit = true;
	if (f)
		fclose(f);
	return hit;
}

static int count_threads(void)
{
	char line[256];
	int n = -1;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "Threads:", 8))
			n = atoi(line + 8);
	if (f)
		fclose(f);
	return n;
}

static void close_leaves_no_fd_thread_or_mapping(void **state)
{
	int fds = count_fds(), threads = count_threads();
	struct mp_pager *p = open_pager(2, NULL);
	struct mp_region *r = p->region;
	void *range = r->base, *pool = r->pool, *nursery = r->nursery;
	uint64_t range_len = r->bytes, pool_len = r->pool_bytes, nursery_len = r->nursery_bytes;

	(void)state;
	assert_memory_equal(mp_pager_expert(p, 1, 2), want(1, 2), xbytes);
	assert_int_equal(mp_pager_prefetch(p, 2, 2, 0), 1);
	assert_true(count_fds() > fds);
	assert_true(mapped_anywhere(range, range_len));
	assert_int_equal(count_threads(), threads + 3);
	mp_pager_close(p);
	assert_int_equal(count_fds(), fds);
	assert_false(mapped_anywhere(range, range_len));
	assert_false(mapped_anywhere(pool, pool_len));
	assert_false(mapped_anywhere(nursery, nursery_len));
	assert_int_equal(count_threads(), threads);
}

static int touch_addr_fn(void *arg)
{
	return *(const volatile uint8_t *)arg;
}

static void access_outside_any_expert_is_an_error_not_a_hang(void **state)
{
	struct mp_pager *p = open_pager(2, NULL);
	const uint8_t *x = mp_pager_expert(p, 1, 3);
	const uint8_t *spare = (const uint8_t *)mp_region_slot_addr(p->region,
								   mp_pager_slot(p, 1, geo->experts));

	(void)state;
	t_log_reset();
	/* The padding between an expert's last byte and the next slot. */
	assert_int_equal(mp_pager_guard(p, touch_addr_fn, (void *)(x + p->data_bytes + 64)),
			 -EFAULT);
	assert_true(t_log_contains("past the end of layer 1 expert 3"));
	/* A slot no expert lives in (room for adapters). */
	assert_int_equal(mp_pager_guard(p, touch_addr_fn, (void *)spare), -EFAULT);
	assert_true(t_log_contains("holds no expert"));
	/* The expert itself is fine. */
	assert_memory_equal(x, want(1, 3), xbytes);
	mp_pager_close(p);
}

/*
 * Demand reads and the budget
 */

/* Once spare chunks exist, a demand fill's eviction waits until its read is in flight. */
static void demand_fill_evicts_while_its_read_is_in_flight(void **state)
{
	struct mp_pager *p = open_pager(2, NULL);

	(void)state;
	ttier.pager = p;
	/* 0.0 and 0.1 fill the budget; 0.2 evicts 0.0 first (no spare chunk yet). */
	for (uint32_t e = 0; e < 3; e++)
		assert_memory_equal(mp_pager_expert(p, 0, e), want(0, e), xbytes);
	atomic_store(&ttier.watch, 3);
	assert_memory_equal(mp_pager_expert(p, 0, 3), want(0, 3), xbytes);
	/* 0.1 and 0.2 were both still mapped when 0.3's read began, 0.3 in their place now. */
	assert_int_equal(atomic_load(&ttier.mapped_at_watch), 2);
	assert_int_equal(mp_pager_residency(p, 0, 3), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, 0, 1) + mp_pager_residency(p, 0, 2),
			 MP_RES_MAPPED + MP_RES_NONE);
	atomic_store(&ttier.watch, -1);
	mp_pager_close(p);
}

/*
 * An eviction keeps its victim's chunks as spares while the memory held
 * stays within budget + spare_bytes: refilling that room zeroes no new
 * pages (trimming the spares to spare_bytes released one here).
 */
static void evictions_keep_spares_within_the_memory_bound(void **state)
{
	struct mp_pager *p = open_pager(4, NULL);
	struct mp_region_mem a, b;
	struct mp_pager_stats st, st0;

	(void)state;
	/* Spares created ahead by idle workers would be new pages too. */
	pthread_mutex_lock(&p->lock);
	p->mem.no_ahead = true;
	pthread_mutex_unlock(&p->lock);
	for (uint32_t e = 0; e < 4; e++)
		assert_memory_equal(mp_pager_expert(p, 0, e), want(0, e), xbytes);
	for (uint32_t e = 0; e < 3; e++)
		assert_int_equal(evict_soon(p, 0, e, 0), 0);
	mp_region_mem(p->region, &a);
	mp_pager_stats(p, &st0);
	/* The pager's counter is the region's: four experts' chunks made, none given back. */
	assert_int_equal(st0.fresh_bytes, a.fresh_bytes);
	assert_true(st0.fresh_bytes >= 4 * p->data_bytes);
	assert_int_equal(st0.released_bytes, 0);
	for (uint32_t e = 4; e < 7; e++)
		assert_memory_equal(mp_pager_expert(p, 0, e), want(0, e), xbytes);
	mp_region_mem(p->region, &b);
	assert_int_equal(b.fresh_bytes, a.fresh_bytes);
	mp_pager_stats(p, &st);
	assert_int_equal(st.fresh_bytes, st0.fresh_bytes);
	/* The fill threads' clocks: they ran, and a clock does not go back. */
	assert_true(st0.fill_cpu_ns > 0);
	assert_true(st.fill_cpu_ns >= st0.fill_cpu_ns);
	assert_true(st.memory_bytes <= st.budget_bytes + p->mem.spare_bytes +
				       4 * (p->data_bytes - xbytes));
	mp_pager_close(p);
}

/* Demand fills held together where they take their chunks (the pager's test seam). */
struct takers {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	int n, want;
};

static void hold_takers(struct mp_pager *p, void *arg)
{
	struct takers *t = arg;
	struct timespec until;

	(void)p;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 2;
	pthread_mutex_lock(&t->lock);
	t->n++;
	pthread_cond_broadcast(&t->cv);
	while (t->n < t->want && pthread_cond_timedwait(&t->cv, &t->lock, &until) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&t->lock);
}

/*
 * Concurrent demand fills that each find room for one more expert's new
 * chunks must not all take them: the bound (budget + spare_bytes) is
 * checked where the chunks are taken. Checked apart from the taking, four
 * fills held between the two went three experts over it.
 */
static void concurrent_fills_never_exceed_the_memory_bound(void **state)
{
	struct takers t = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 4 };
	struct toucher tt[4];
	struct mp_pager_config cfg;
	struct mp_pager *p;
	pthread_t th[4];

	(void)state;
	mp_pager_config_init(&cfg);
	cfg.fill_threads = 4;
	p = open_pager_cfg(4, NULL, &cfg);
	for (uint32_t e = 0; e < 4; e++)
		assert_memory_equal(mp_pager_expert(p, 0, e), want(0, e), xbytes);
	ttier.pager = p;
	atomic_store(&ttier.delay_ms, 50);
	atomic_store(&ttier.track_peak, true);
	p->taking_arg = &t;
	p->taking = hold_takers;
	for (uint32_t i = 0; i < 4; i++) {
		tt[i] = (struct toucher){ p, 4 + i, false };
		assert_int_equal(pthread_create(&th[i], NULL, touch_expert, &tt[i]), 0);
	}
	for (uint32_t i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_true(tt[i].ok);
	}
	assert_int_equal(t.n, 4);
	assert_true(atomic_load(&ttier.peak_populated) > 0);
	assert_true(atomic_load(&ttier.peak_populated) <= mp_pager_mem_limit(p));
	atomic_store(&ttier.track_peak, false);
	atomic_store(&ttier.delay_ms, 0);
	mp_pager_close(p);
}

static void count_creation(struct mp_region *r, void *arg)
{
	(void)r;
	atomic_fetch_add((atomic_int *)arg, 1);
}

/*
 * While the pool fills up, idle workers create spare chunks ahead, so the
 * next fill reads into them instead of creating its own before its read.
 */
static void idle_workers_create_spares_ahead_of_the_next_fill(void **state)
{
	struct mp_pager *p = open_pager(8, NULL);
	struct mp_region_mem m;
	atomic_int created = 0;

	(void)state;
	assert_memory_equal(mp_pager_expert(p, 0, 0), want(0, 0), xbytes);
	for (int i = 0; i < 2000; i++) {
		mp_region_mem(p->region, &m);
		if (m.spare_bytes >= p->mem.spare_bytes)
			break;
		usleep(1000);
	}
	assert_true(m.spare_bytes >= p->mem.spare_bytes);
	assert_true(m.populated_bytes <= mp_pager_mem_limit(p));
	/* Off now, so that a chunk created here can only be the fill's own. */
	pthread_mutex_lock(&p->lock);
	p->mem.no_ahead = true;
	pthread_mutex_unlock(&p->lock);
	p->region->creating_arg = &created;
	p->region->creating = count_creation;
	assert_memory_equal(mp_pager_expert(p, 0, 1), want(0, 1), xbytes);
	assert_int_equal(atomic_load(&created), 0);
	p->region->creating = NULL;
	mp_pager_close(p);
}

/* A smaller budget lowers the bound on spares too, when it evicts nothing. */
static void a_smaller_budget_gives_spares_back(void **state)
{
	struct mp_pager *p = open_pager(4, NULL);
	struct mp_pager_stats st;

	(void)state;
	for (uint32_t e = 0; e < 4; e++)
		assert_memory_equal(mp_pager_expert(p, 0, e), want(0, e), xbytes);
	for (uint32_t e = 0; e < 4; e++)
		assert_int_equal(evict_soon(p, 0, e, 0), 0);
	mp_pager_stats(p, &st);
	assert_true(st.memory_bytes >= 4 * xbytes);	/* kept as spares */
	assert_int_equal(mp_pager_set_budget(p, p->expert_bytes), 0);
	mp_pager_stats(p, &st);
	assert_true(st.memory_bytes <= st.budget_bytes + p->mem.spare_bytes +
				       4 * (p->data_bytes - xbytes));
	for (uint32_t e = 0; e < 2; e++)
		assert_memory_equal(mp_pager_expert(p, 0, e), want(0, e), xbytes);
	mp_pager_close(p);
}

/*
 * Engine requests resolved on the asking thread (MP_RESOLVE_CALLER)
 */

static struct mp_pager *open_caller(uint64_t budget_experts, uint32_t fill_threads)
{
	struct mp_pager_config cfg;

	mp_pager_config_init(&cfg);
	cfg.fill_threads = fill_threads;
	return open_pager_cfg(budget_experts, &(struct mode){ NULL, MP_RESOLVE_CALLER }, &cfg);
}

/* Holds the read of expert l.e, asked for as a prefetch, until let_go(); waits for it to begin. */
static void hold_prefetch(struct mp_pager *p, uint32_t l, uint32_t e)
{
	int reads = atomic_load(&ttier.reads);

	atomic_store(&ttier.hold, (int)(l * geo->experts + e));
	assert_int_equal(mp_pager_prefetch(p, l, e, 0), 1);
	while (atomic_load(&ttier.reads) == reads)
		usleep(100);
	assert_int_equal(mp_pager_residency(p, l, e), MP_RES_FILLING);
}

/*
 * Keeps the only fill thread reading expert 0.0 (a prefetch) until the test
 * lets it go (ttier.hold = -1); every other read takes delay_ms. Waits for
 * the read to begin, not for a state: a thread descheduled for a while would
 * miss a short one (a hang, before).
 */
static void occupy_the_fill_thread(struct mp_pager *p, unsigned delay_ms)
{
	atomic_store(&ttier.delay_ms, delay_ms);
	hold_prefetch(p, 0, 0);
}

static void let_go(void)
{
	atomic_store(&ttier.hold, -1);
	atomic_store(&ttier.delay_ms, 0);
}

static void routed_expert_is_read_on_the_asking_thread_before_its_touch(void **state)
{
	struct mp_pager *p = open_caller(8, 1);
	struct mp_pager_stats st;
	const uint8_t *x;
	uint32_t e = 2;

	(void)state;
	occupy_the_fill_thread(p, 30);
	assert_int_equal(mp_pager_route(p, 0, 0, 1, &e, NULL, 1), 0);
	x = mp_pager_source_ops()->expert(p, 1, 2);
	/* In memory before anything touched it: the touch below cannot fault. */
	assert_int_equal(mp_pager_residency(p, 1, 2), MP_RES_MAPPED);
	assert_int_equal(atomic_load(&ttier.reader[geo->experts + 2]), gettid());
	assert_memory_equal(x, want(1, 2), xbytes);
	mp_pager_stats(p, &st);
	assert_int_equal(st.caller_reads, 1);
	assert_int_equal(st.faults_file, 1);
	assert_int_equal(st.fault_waits, 1);
	assert_true(st.stall_ns >= 30ull * 1000 * 1000);
	/* The whole wait was the asking thread's (the engine's others wait for it). */
	assert_int_equal(st.caller_stall_ns, st.stall_ns);
	assert_true(mp_pager_stats_quantile(&st, 0.5) > 0);
	let_go();
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	mp_pager_close(p);
}

/*
 * An eviction asked for while a prefetch reads the expert (MP_EVICT_DEFER)
 * takes effect when the read ends: the expert is not left resident for the
 * budget to push out the least recently used instead (the CoE pool's pinned
 * model, docs/coe.md). Without the flag it is -EBUSY, as before.
 */
static void deferred_eviction_takes_effect_when_the_read_ends(void **state)
{
	struct mp_pager *p = open_pager(3, NULL);
	struct mp_pager_stats st;

	(void)state;
	for (uint32_t e = 0; e < 2; e++)
		assert_memory_equal(mp_pager_expert(p, 1, e), want(1, e), xbytes);
	hold_prefetch(p, 0, 0);
	assert_int_equal(mp_pager_evict(p, 0, 0, 0), -EBUSY);
	assert_int_equal(mp_pager_evict(p, 0, 0, MP_EVICT_DEFER), 1);
	assert_int_equal(mp_pager_evict(p, 0, 0, MP_EVICT_DEFER | MP_EVICT_KEEP_HOST), 1);
	assert_int_equal(mp_pager_residency(p, 0, 0), MP_RES_FILLING);
	let_go();
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	/* Dropped (the stronger of the two asked for), its share of the budget back. */
	assert_int_equal(mp_pager_residency(p, 0, 0), MP_RES_NONE);
	mp_pager_stats(p, &st);
	assert_int_equal(st.evictions, 1);
	assert_int_equal(st.prefetch_wasted, 1);
	assert_int_equal(st.resident_experts, 2);
	assert_int_equal(st.resident_bytes, 2 * xbytes);
	assert_true(st.memory_bytes <= st.budget_bytes + p->mem.spare_bytes +
				       3 * (p->data_bytes - xbytes));
	/* The next expert fits beside the two without evicting either. */
	assert_memory_equal(mp_pager_expert(p, 0, 1), want(0, 1), xbytes);
	for (uint32_t e = 0; e < 2; e++)
		assert_int_equal(mp_pager_residency(p, 1, e), MP_RES_MAPPED);
	/* Kept in host memory when that is all that was asked for. */
	assert_int_equal(evict_soon(p, 0, 1, 0), 0);
	hold_prefetch(p, 0, 2);
	assert_int_equal(mp_pager_evict(p, 0, 2, MP_EVICT_DEFER | MP_EVICT_KEEP_HOST), 1);
	let_go();
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_pager_residency(p, 0, 2), MP_RES_HOST);
	mp_pager_close(p);
}

struct one_read {
	struct mp_pager *p;
	uint32_t layer, expert;
	int same;
};

static void *read_one(void *arg)
{
	struct one_read *r = arg;

	r->same = !memcmp(mp_pager_expert(r->p, r->layer, r->expert),
			  want(r->layer, r->expert), xbytes);
	return NULL;
}

/* Waits (5 s at most) until a thread waits on a fault. */
static void wait_for_a_fault(struct mp_pager *p)
{
	struct mp_pager_stats st;

	for (int i = 0; i < 5000; i++) {
		mp_pager_stats(p, &st);
		if (st.fault_waits)
			return;
		usleep(1000);
	}
	fail_msg("no thread faulted on the expert in 5 s");
}

/*
 * A thread that faults on the expert after the deferred eviction was asked
 * for is woken with the read's bytes; the eviction follows, so its access
 * may fault once more and read it again (a second read at most): right
 * bytes either way, and no hang.
 */
static void deferred_eviction_serves_a_fault_on_the_read_first(void **state)
{
	struct mp_pager *p = open_pager(4, NULL);
	struct one_read r = { .p = p, .layer = 2, .expert = 3 };
	struct mp_pager_stats st;
	pthread_t th;
	int reads;

	(void)state;
	hold_prefetch(p, 2, 3);
	reads = atomic_load(&ttier.reads);
	assert_int_equal(mp_pager_evict(p, 2, 3, MP_EVICT_DEFER), 1);
	assert_int_equal(pthread_create(&th, NULL, read_one, &r), 0);
	wait_for_a_fault(p);
	let_go();
	pthread_join(th, NULL);
	assert_int_equal(r.same, 1);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	mp_pager_stats(p, &st);
	assert_int_equal(st.evictions, 1);
	assert_true(atomic_load(&ttier.reads) - reads <= 1);
	assert_int_equal(mp_pager_residency(p, 2, 3),
			 atomic_load(&ttier.reads) > reads ? MP_RES_MAPPED : MP_RES_NONE);
	mp_pager_close(p);
}

/*
 * The room a prefetch reserved before its read is the room a deferred drop
 * of it gives back: a fill needing room while that read runs waits for it,
 * and does not evict the budget's least recently used expert (1.0) instead
 * (the CoE pool's pinned model, whose load follows the eviction at once).
 * The 30 ms only give the fill time to reach its reserve: later, the room
 * is back anyway and this passes without showing anything.
 */
static void deferred_eviction_room_is_waited_for_not_taken_from_the_lru(void **state)
{
	struct mp_pager_config cfg;
	struct one_read r = { .layer = 2, .expert = 0 };
	struct mp_pager_stats st;
	struct mp_pager *p;
	pthread_t th;

	(void)state;
	mp_pager_config_init(&cfg);
	/* Two fill threads: one held on 0.0, one for 2.0; no grace at 4 experts. */
	cfg.fill_threads = 2;
	p = open_pager_cfg(4, &(struct mode){ "lru", MP_RESOLVE_FAULT }, &cfg);
	r.p = p;
	for (uint32_t e = 0; e < 3; e++)
		assert_memory_equal(mp_pager_expert(p, 1, e), want(1, e), xbytes);
	hold_prefetch(p, 0, 0);
	assert_int_equal(mp_pager_evict(p, 0, 0, MP_EVICT_DEFER), 1);
	assert_int_equal(p->mem.pending_drop, xbytes);
	assert_int_equal(pthread_create(&th, NULL, read_one, &r), 0);
	wait_for_a_fault(p);
	usleep(30 * 1000);
	let_go();
	pthread_join(th, NULL);
	assert_int_equal(r.same, 1);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	for (uint32_t e = 0; e < 3; e++)
		assert_int_equal(mp_pager_residency(p, 1, e), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, 0, 0), MP_RES_NONE);
	assert_int_equal(mp_pager_residency(p, 2, 0), MP_RES_MAPPED);
	mp_pager_stats(p, &st);
	assert_int_equal(st.evictions, 1);
	assert_int_equal(p->mem.pending_drop, 0);
	mp_pager_close(p);
}

/*
 * A read that fails with a deferred drop marked leaves nothing to evict: the
 * mark and its room are cleared, and the next read of the expert stays.
 */
static void deferred_eviction_of_a_failed_read_is_forgotten(void **state)
{
	struct mp_pager *p = open_pager(3, NULL);
	struct mp_pager_stats st;

	(void)state;
	atomic_store(&ttier.fail_layer, 0);
	atomic_store(&ttier.fail_expert, 0);
	atomic_store(&ttier.mode, FAIL_EIO);
	hold_prefetch(p, 0, 0);
	assert_int_equal(mp_pager_evict(p, 0, 0, MP_EVICT_DEFER), 1);
	assert_int_equal(p->mem.pending_drop, xbytes);
	let_go();
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	/* An unwanted prefetch that failed: left out, not poisoned. */
	assert_int_equal(mp_pager_residency(p, 0, 0), MP_RES_NONE);
	assert_int_equal(p->mem.pending_drop, 0);
	assert_int_equal(p->slots[mp_pager_slot(p, 0, 0)].evict_pending, PENDING_NONE);
	mp_pager_stats(p, &st);
	assert_int_equal(st.resident_bytes, 0);
	atomic_store(&ttier.mode, PASS);
	assert_memory_equal(mp_pager_expert(p, 0, 0), want(0, 0), xbytes);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_pager_residency(p, 0, 0), MP_RES_MAPPED);
	mp_pager_stats(p, &st);
	assert_int_equal(st.evictions, 0);
	mp_pager_close(p);
}

/* What the refused-prefetch seam did: a reader began to wait, then a deferred drop. */
struct refusal {
	struct one_read r;
	pthread_t th;
	uint32_t slot;
	uint64_t waits;		/* fault_waits before the reader */
	atomic_int calls;
	int started, waited, evicted;
	atomic_bool done;	/* the seam returned */
};

static void start_reader_and_defer_a_drop(struct mp_pager *p, uint32_t slot, void *arg)
{
	struct refusal *f = arg;
	struct mp_pager_stats st;

	if (slot != f->slot || atomic_fetch_add(&f->calls, 1))
		return;
	f->started = !pthread_create(&f->th, NULL, read_one, &f->r);
	for (int i = 0; f->started && !f->waited && i < 10000; i++) {
		mp_pager_stats(p, &st);
		f->waited = st.fault_waits > f->waits;
		usleep(1000);
	}
	f->evicted = mp_pager_evict(p, f->r.layer, f->r.expert, MP_EVICT_DEFER);
	atomic_store(&f->done, true);
}

/*
 * A prefetch refused its room (the only victim is likelier to be needed)
 * that a thread began to wait for, with a deferred drop asked for meanwhile,
 * becomes a demand fill that keeps the mark: the reader gets the bytes, the
 * drop follows, and the room counted as coming (pending_drop) is back to 0.
 */
static void deferred_eviction_of_a_refused_prefetch_a_thread_waits_for(void **state)
{
	struct mp_pager *p = open_pager(1, NULL);
	/* Static: the seam runs on a fill thread, which a failed assert here would outlive. */
	static struct refusal f;
	static struct mp_evict_hints h;
	struct mp_pager_stats st;
	uint32_t a, b;
	float *pr;

	(void)state;
	memset(&f, 0, sizeof(f));
	f.r = (struct one_read){ .p = p, .layer = 2, .expert = 1 };
	assert_memory_equal(mp_pager_expert(p, 1, 0), want(1, 0), xbytes);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	a = mp_pager_slot(p, 1, 0);
	b = mp_pager_slot(p, 2, 1);
	pr = malloc(p->nslots * sizeof(*pr));
	for (uint32_t i = 0; i < p->nslots; i++)
		pr[i] = -1;
	pr[a] = 0.9f;
	pr[b] = 0.1f;
	h = (struct mp_evict_hints){ .p = pr };
	mp_pager_set_hints(p, &h);
	f.slot = b;
	mp_pager_stats(p, &st);
	f.waits = st.fault_waits;
	p->refused_arg = &f;
	p->refused = start_reader_and_defer_a_drop;
	assert_int_equal(mp_pager_prefetch(p, 2, 1, 0), 1);
	for (int i = 0; i < 10000 && !atomic_load(&f.done); i++)
		usleep(1000);
	assert_true(atomic_load(&f.done));
	assert_int_equal(atomic_load(&f.calls), 1);
	assert_true(f.started);
	pthread_join(f.th, NULL);
	assert_true(f.waited);
	assert_int_equal(f.evicted, 1);
	assert_int_equal(f.r.same, 1);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	p->refused = NULL;
	assert_int_equal(p->mem.pending_drop, 0);
	assert_int_equal(p->slots[b].evict_pending, PENDING_NONE);
	/* 1.0 made the room; 2.1 was dropped (or read again by the reader's next access). */
	assert_int_equal(mp_pager_residency(p, 1, 0), MP_RES_NONE);
	mp_pager_stats(p, &st);
	assert_int_equal(st.evictions, 2);
	assert_true(st.resident_bytes <= xbytes);
	mp_pager_set_hints(p, NULL);
	mp_pager_close(p);
	free(pr);
}

/* A prefetch still queued would bring the expert back after the eviction: dropped. */
static void deferred_eviction_drops_a_queued_prefetch(void **state)
{
	struct mp_pager *p = open_caller(8, 1);
	int reads;

	(void)state;
	occupy_the_fill_thread(p, 0);
	reads = atomic_load(&ttier.reads);
	assert_int_equal(mp_pager_prefetch(p, 1, 1, 0), 1);
	assert_int_equal(mp_pager_evict(p, 1, 1, MP_EVICT_DEFER), -ENOENT);
	let_go();
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(atomic_load(&ttier.reads), reads);
	assert_int_equal(mp_pager_residency(p, 1, 1), MP_RES_NONE);
	mp_pager_close(p);
}

/* Lets the held read go 20 ms after a thread began to wait for it. */
static void *release_after_a_wait(void *arg)
{
	struct mp_pager *p = arg;
	struct mp_pager_stats st;

	do {
		usleep(1000);
		mp_pager_stats(p, &st);
	} while (!st.fault_waits);
	usleep(20 * 1000);
	atomic_store(&ttier.hold, -1);
	return NULL;
}

static void expert_a_fill_thread_reads_is_waited_for_not_read_twice(void **state)
{
	struct mp_pager *p = open_caller(8, 2);
	struct mp_pager_stats st;
	pthread_t th;
	uint32_t e = 5;

	(void)state;
	atomic_store(&ttier.hold, (int)(2 * geo->experts + 5));
	assert_int_equal(mp_pager_route(p, 0, 0, 2, &e, NULL, 1), 0);
	while (atomic_load(&ttier.reads) == 0)
		usleep(100);
	pthread_create(&th, NULL, release_after_a_wait, p);
	assert_memory_equal(mp_pager_source_ops()->expert(p, 2, 5), want(2, 5), xbytes);
	pthread_join(th, NULL);
	mp_pager_stats(p, &st);
	assert_int_equal(atomic_load(&ttier.reads), 1);
	assert_int_not_equal(atomic_load(&ttier.reader[2 * geo->experts + 5]), gettid());
	assert_int_equal(st.caller_reads, 0);
	assert_int_equal(st.faults_file, 1);
	assert_int_equal(st.fault_waits, 1);
	assert_true(st.stall_ns >= 10ull * 1000 * 1000);
	assert_int_equal(st.caller_stall_ns, st.stall_ns);
	mp_pager_close(p);
}

static int get_and_read_fn(void *arg)
{
	struct guarded *g = arg;

	g->same = !memcmp(get(g->p, g->layer, g->expert), want(g->layer, g->expert), xbytes);
	return 0;
}

/* Whoever read it, the request that waited for a failed read gets its error, once. */
static void failed_read_of_a_request_errors_through_guard_once(void **state)
{
	for (uint32_t fill_threads = 1; fill_threads <= 2; fill_threads++) {
		struct mp_pager *p = open_caller(4, fill_threads);
		struct guarded g = { .p = p, .layer = 1, .expert = 1 };
		struct mp_pager_stats st;

		(void)state;
		atomic_store(&ttier.fail_layer, 1);
		atomic_store(&ttier.fail_expert, 1);
		atomic_store(&ttier.mode, FAIL_EIO);
		t_log_reset();
		assert_int_equal(mp_pager_guard(p, get_and_read_fn, &g), -EIO);
		assert_true(t_log_contains("layer 1 expert 1"));
		mp_pager_stats(p, &st);
		assert_int_equal(st.poisoned, 1);
		assert_int_equal(st.read_errors, MP_PAGER_DEFAULT_READ_ATTEMPTS);
		/* The tier recovers: the next request reads it again, right. */
		atomic_store(&ttier.mode, PASS);
		g.same = 0;
		assert_int_equal(mp_pager_guard(p, get_and_read_fn, &g), 0);
		assert_int_equal(g.same, 1);
		mp_pager_close(p);
	}
}

static void *guarded_getter(void *arg)
{
	struct guarded *g = arg;

	g->ret = mp_pager_guard(g->p, get_and_read_fn, g);
	return NULL;
}

static void close_releases_a_thread_reading_its_own_expert(void **state)
{
	struct mp_pager *p = open_caller(8, 1);
	struct guarded g = { .p = p, .layer = 3, .expert = 4, .ret = 1 };
	pthread_t th;

	(void)state;
	occupy_the_fill_thread(p, 10000);
	pthread_create(&th, NULL, guarded_getter, &g);
	while (atomic_load(&ttier.reads) < 2)
		usleep(1000);
	usleep(50 * 1000);
	mp_pager_close(p);
	pthread_join(th, NULL);
	/* Its own read was cancelled, and so was the fill thread's. */
	assert_int_equal(g.ret, -ESHUTDOWN);
	assert_int_equal(atomic_load(&ttier.cancelled), 2);
	let_go();
}

/* Auto: on the asking thread below a 2 MiB chunk, the fault path from there up. */
static void resolution_follows_the_expert_size_unless_configured(void **state)
{
	static const struct { uint32_t ffn, resolve; bool caller; } cases[] = {
		{ 256, MP_RESOLVE_AUTO, true },		/* 0.375 MiB experts */
		{ 256, MP_RESOLVE_FAULT, false },
		{ 1536, MP_RESOLVE_AUTO, false },	/* 2.25 MiB experts */
		{ 1536, MP_RESOLVE_CALLER, true },
	};
	const char *path = t_path("wide.mpk");
	struct mp_geometry g;

	(void)state;
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	g.layers = 1;
	g.experts = 2;
	for (size_t i = 0; i < MP_ARRAY_SIZE(cases); i++) {
		struct mp_pager_config cfg;
		struct mp_store *s;
		struct mp_pager *p;

		g.ffn = cases[i].ffn;
		assert_int_equal(mp_gen_model(path, &g, 3, "wide", NULL, NULL), 0);
		assert_int_equal(mp_store_open(path, &s), 0);
		mp_pager_config_init(&cfg);
		cfg.resolve = cases[i].resolve;
		assert_int_equal(mp_pager_open(s, &cfg, &p), 0);
		assert_int_equal(p->caller_resolves, cases[i].caller);
		mp_pager_close(p);
		/* The environment chooses when the config leaves it to auto. */
		setenv("MOEPAGER_RESOLVE", cases[i].caller ? "fault" : "caller", 1);
		assert_int_equal(mp_pager_open(s, &cfg, &p), 0);
		assert_int_equal(p->caller_resolves,
				 cases[i].resolve ? cases[i].caller : !cases[i].caller);
		mp_pager_close(p);
		unsetenv("MOEPAGER_RESOLVE");
		mp_store_close(s);
	}
}

static void bad_config_is_refused_with_a_message(void **state)
{
	struct mp_pager_config cfg;
	struct mp_pager *p;

	(void)state;
	mp_pager_config_init(&cfg);
	cfg.budget_bytes = xbytes - 1;
	t_log_reset();
	assert_int_equal(mp_pager_open(store, &cfg, &p), -EINVAL);
	assert_null(p);
	assert_true(t_log_contains("below one expert"));
	mp_pager_config_init(&cfg);
	cfg.eviction = "belady-next-year";
	assert_int_equal(mp_pager_open(store, &cfg, &p), -EINVAL);
	assert_true(t_log_contains("unknown eviction policy 'belady-next-year' (lru, fifo"));
	mp_pager_config_init(&cfg);
	cfg.slots_per_layer = geo->experts - 1;
	assert_int_equal(mp_pager_open(store, &cfg, &p), -EINVAL);
	assert_true(t_log_contains("slots_per_layer"));
	mp_pager_config_init(&cfg);
	cfg.budget = "12 parsecs";
	assert_int_equal(mp_pager_open(store, &cfg, &p), -EINVAL);
	assert_true(t_log_contains("budget '12 parsecs'"));
	mp_pager_config_init(&cfg);
	cfg.resolve = MP_RESOLVE_CALLER + 1;
	assert_int_equal(mp_pager_open(store, &cfg, &p), -EINVAL);
	assert_true(t_log_contains("resolve 3 is not one of auto (0), fault (1), caller (2)"));
	mp_pager_config_init(&cfg);
	cfg.reserved0 = 1;
	assert_int_equal(mp_pager_open(store, &cfg, &p), -EINVAL);
	assert_true(t_log_contains("reserved0 is not zero"));
	mp_pager_config_init(&cfg);
	setenv("MOEPAGER_RESOLVE", "sideways", 1);
	assert_int_equal(mp_pager_open(store, &cfg, &p), -EINVAL);
	assert_true(t_log_contains("MOEPAGER_RESOLVE 'sideways' is not auto, fault or caller"));
	unsetenv("MOEPAGER_RESOLVE");
}

static void budget_env_accepts_percent_of_the_model(void **state)
{
	struct mp_pager_config cfg;
	struct mp_pager *p = NULL;
	uint64_t total = mp_store_total_expert_bytes(store);

	(void)state;
	mp_pager_config_init(&cfg);
	setenv("MOEPAGER_BUDGET", "25%", 1);
	assert_int_equal(mp_pager_open(store, &cfg, &p), 0);
	assert_int_equal(mp_pager_budget(p), total / 4);
	mp_pager_close(p);
	/* An explicit config wins over the environment. */
	cfg.budget = "1M";
	assert_int_equal(mp_pager_open(store, &cfg, &p), 0);
	assert_int_equal(mp_pager_budget(p), 1u << 20);
	mp_pager_close(p);
	unsetenv("MOEPAGER_BUDGET");
}

static void out_of_range_ids_are_errors(void **state)
{
	struct mp_pager *p = open_pager(2, NULL);
	uint32_t bad = geo->experts;

	(void)state;
	t_log_reset();
	assert_null(mp_pager_expert(p, geo->layers, 0));
	assert_true(t_log_contains("out of range"));
	assert_int_equal(mp_pager_prefetch(p, 0, geo->experts, 0), -EINVAL);
	assert_int_equal(mp_pager_route(p, 0, 0, 0, &bad, NULL, 1), -EINVAL);
	assert_int_equal(mp_pager_evict(p, 0, 0, 0x80), -EINVAL);
	assert_int_equal(mp_pager_residency(p, 0, geo->experts), -EINVAL);
	assert_null(mp_pager_expert_proj(p, 0, 0, (enum mp_proj)7));
	mp_pager_close(p);
}

static void projections_point_into_the_expert(void **state)
{
	struct mp_pager *p = open_pager(2, NULL);
	uint64_t mat = (uint64_t)geo->ffn * geo->hidden * mp_dtype_size(geo->dtype);
	const uint8_t *x;

	(void)state;
	x = mp_pager_expert(p, 3, 3);
	assert_ptr_equal(mp_pager_expert_proj(p, 3, 3, MP_PROJ_GATE), x);
	assert_ptr_equal(mp_pager_expert_proj(p, 3, 3, MP_PROJ_UP), x + mat);
	assert_ptr_equal(mp_pager_expert_proj(p, 3, 3, MP_PROJ_DOWN), x + 2 * mat);
	assert_memory_equal(mp_pager_expert_proj(p, 3, 3, MP_PROJ_DOWN), want(3, 3) + 2 * mat,
			    mat);
	mp_pager_close(p);
}

static void route_fill_reads_routed_experts_before_the_touch(void **state)
{
	struct mp_pager_config cfg;
	struct mp_pager *p;
	struct mp_pager_stats st;
	uint32_t ids[2] = { 6, 7 };

	(void)state;
	mp_pager_config_init(&cfg);
	cfg.budget_bytes = 8 * xbytes;
	assert_int_equal(mp_pager_open_hooked(store, &cfg, &hooks, &p), 0);
	assert_int_equal(mp_pager_route(p, 0, 0, 2, ids, NULL, 2), 0);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_pager_residency(p, 2, 6), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, 2, 7), MP_RES_MAPPED);
	assert_memory_equal(mp_pager_expert(p, 2, 7), want(2, 7), xbytes);
	mp_pager_stats(p, &st);
	assert_int_equal(st.misses, 2);
	assert_int_equal(st.faults_file, 0);
	assert_int_equal(st.prefetch_issued, 0);
	mp_pager_close(p);
}

/*
 * Rows from several sources: a variant of the tiny model (another seed) and
 * an adapter whose experts come from a third one.
 */
static const uint32_t adapter_picks[][2] = { { 0, 1 }, { 1, 2 }, { 2, 5 }, { 3, 0 } };

static void open_sources(void)
{
	struct mp_store *third;

	if (variant)
		return;
	assert_int_equal(t_gen_tiny(t_path("variant.mpk"), MP_DTYPE_F32, 43), 0);
	assert_int_equal(mp_store_open(t_path("variant.mpk"), &variant), 0);
	assert_int_equal(t_gen_tiny(t_path("third.mpk"), MP_DTYPE_F32, 44), 0);
	assert_int_equal(mp_store_open(t_path("third.mpk"), &third), 0);
	assert_int_equal(t_write_adapter(t_path("a.mpa"), store, third, adapter_picks,
					 MP_ARRAY_SIZE(adapter_picks), "a"), 0);
	mp_store_close(third);
	assert_int_equal(mp_adapter_open(t_path("a.mpa"), &adapter), 0);
}

/* Row experts + e of every layer: variant expert e; row 2 x experts - 1: the adapter's, if any. */
static uint32_t bind_sources(struct mp_pager *p, int *src_v, int *src_a)
{
	uint32_t E = geo->experts, bound = 0;

	open_sources();
	*src_v = mp_pager_add_store(p, variant);
	*src_a = mp_pager_add_adapter(p, adapter);
	assert_true(*src_v >= 1 && *src_a >= 1 && *src_v != *src_a);
	for (uint32_t l = 0; l < geo->layers; l++) {
		for (uint32_t e = 0; e + 1 < E; e++, bound++)
			assert_int_equal(mp_pager_bind(p, l, E + e, *src_v, e), 0);
		for (size_t i = 0; i < MP_ARRAY_SIZE(adapter_picks); i++)
			if (adapter_picks[i][0] == l) {
				assert_int_equal(mp_pager_bind(p, l, 2 * E - 1, *src_a,
							       adapter_picks[i][1]), 0);
				bound++;
			}
	}
	return bound;
}

/* What row r of layer l must hold (bind_sources()), read from its own file. */
static void row_bytes(uint32_t l, uint32_t r, uint8_t *buf)
{
	uint32_t E = geo->experts;

	if (r < E) {
		memcpy(buf, want(l, r), xbytes);
	} else if (r + 1 < 2 * E) {
		assert_int_equal(mp_store_read_expert(variant, l, r - E, buf), 0);
	} else {
		uint32_t n;
		const struct mp_adapter_expert *x = mp_adapter_layer(adapter, l, &n);

		assert_int_equal(n, 1);
		assert_int_equal(mp_adapter_read_expert(adapter, l, x->expert, buf), 0);
	}
}

static void rows_of_three_sources_read_back_their_bytes_under_one_budget(void **state)
{
	struct mp_pager *p = open_pager(2, *state);
	uint8_t *buf = malloc(xbytes);
	struct mp_pager_stats st;
	uint32_t reads = 0, bound;
	int src_v, src_a;

	bound = bind_sources(p, &src_v, &src_a);
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t l = 0; l < geo->layers; l++) {
			for (uint32_t r = 0; r < 2 * geo->experts; r++) {
				if (r == 2 * geo->experts - 1 && !mp_adapter_layer(adapter, l,
										    &(uint32_t){ 0 }))
					continue;
				row_bytes(l, r, buf);
				assert_memory_equal(get(p, l, r), buf, xbytes);
				mp_pager_stats(p, &st);
				assert_true(st.resident_bytes <= 2 * xbytes);
				reads++;
			}
		}
	}
	assert_int_equal(reads, 2 * (geo->layers * geo->experts + bound));
	mp_pager_stats(p, &st);
	assert_true(st.resident_peak <= 2 * xbytes);
	/* Every row was read from its file at least once per pass: the budget evicted across sources. */
	assert_true(st.faults_file + st.faults_host >= reads / 2);
	assert_true(st.evictions > 0);
	mp_pager_close(p);
	free(buf);
}

static void routed_and_prefetched_rows_are_read_by_row_id(void **state)
{
	struct mp_pager_config cfg;
	struct mp_pager *p;
	struct mp_pager_stats st;
	uint32_t ids[2] = { geo->experts + 1, 2 * geo->experts - 1 };
	uint8_t *buf = malloc(xbytes);
	int src_v, src_a;

	(void)state;
	mp_pager_config_init(&cfg);
	cfg.budget_bytes = 8 * xbytes;
	assert_int_equal(mp_pager_open_hooked(store, &cfg, &hooks, &p), 0);
	bind_sources(p, &src_v, &src_a);
	/* Layer 0's routed rows (a variant's and the adapter's) are read as demand. */
	assert_int_equal(mp_pager_route(p, 0, 0, 0, ids, NULL, 2), 0);
	assert_int_equal(mp_pager_prefetch(p, 1, geo->experts + 2, 1), 1);
	assert_int_equal(mp_pager_wait_idle(p, 5000), 0);
	assert_int_equal(mp_pager_residency(p, 0, ids[0]), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, 0, ids[1]), MP_RES_MAPPED);
	assert_int_equal(mp_pager_residency(p, 1, geo->experts + 2), MP_RES_MAPPED);
	row_bytes(1, geo->experts + 2, buf);
	assert_memory_equal(mp_pager_expert(p, 1, geo->experts + 2), buf, xbytes);
	row_bytes(0, ids[1], buf);
	assert_memory_equal(mp_pager_expert(p, 0, ids[1]), buf, xbytes);
	mp_pager_stats(p, &st);
	assert_int_equal(st.faults_file, 0);
	assert_int_equal(st.misses, 2);
	assert_int_equal(st.prefetch_issued, 1);
	/* Unbound: its memory goes back, the row is spare again, the source can go. */
	assert_int_equal(mp_pager_remove_source(p, src_a), -EBUSY);
	for (uint32_t l = 0; l < geo->layers; l++)
		if (mp_pager_residency(p, l, 2 * geo->experts - 1) >= 0)
			assert_int_equal(mp_pager_unbind(p, l, 2 * geo->experts - 1), 0);
	assert_int_equal(mp_pager_residency(p, 0, ids[1]), -EINVAL);
	assert_int_equal(mp_pager_route(p, 0, 0, 0, ids, NULL, 2), -EINVAL);
	assert_int_equal(mp_pager_remove_source(p, src_a), 0);
	mp_pager_stats(p, &st);
	assert_true(st.resident_bytes <= 2 * xbytes);
	mp_pager_close(p);
	free(buf);
}

static void bad_sources_and_bindings_are_refused(void **state)
{
	struct mp_pager *p = open_pager(2, NULL);
	struct mp_store *small, *third;
	struct mp_adapter *other;
	uint32_t E = geo->experts;
	int src_v, src_a;

	(void)state;
	open_sources();
	assert_int_equal(t_gen_small(t_path("small.mpk"), MP_DTYPE_F32, 1), 0);
	assert_int_equal(mp_store_open(t_path("small.mpk"), &small), 0);
	assert_int_equal(mp_store_open(t_path("third.mpk"), &third), 0);
	/* An adapter made for the variant, not for this pager's model. */
	assert_int_equal(t_write_adapter(t_path("other.mpa"), variant, third, adapter_picks, 1,
					 "other"), 0);
	assert_int_equal(mp_adapter_open(t_path("other.mpa"), &other), 0);
	t_log_reset();
	assert_int_equal(mp_pager_add_store(p, small), -EMEDIUMTYPE);
	assert_true(t_log_contains("not a variant"));
	assert_int_equal(mp_pager_add_adapter(p, other), -EMEDIUMTYPE);
	src_v = mp_pager_add_store(p, variant);
	src_a = mp_pager_add_adapter(p, adapter);
	assert_true(src_v > 0 && src_a > 0);
	t_log_reset();
	assert_int_equal(mp_pager_bind(p, 0, 1, src_v, 1), -EINVAL);	/* the model's own row */
	assert_true(t_log_contains("not a spare row"));
	assert_int_equal(mp_pager_bind(p, 0, 2 * E, src_v, 1), -EINVAL);
	assert_int_equal(mp_pager_bind(p, geo->layers, E, src_v, 1), -EINVAL);
	assert_int_equal(mp_pager_bind(p, 0, E, 77, 1), -EINVAL);
	assert_int_equal(mp_pager_bind(p, 0, E, src_v, E), -EINVAL);
	assert_int_equal(mp_pager_bind(p, 0, E, src_a, 3), -ENOENT);	/* not replaced */
	assert_true(t_log_contains("does not replace layer 0 expert 3"));
	assert_int_equal(mp_pager_bind(p, 0, E, src_a, 1), 0);
	assert_int_equal(mp_pager_bind(p, 0, E, src_v, 1), -EEXIST);
	assert_null(mp_pager_expert(p, 0, E + 1));			/* not bound */
	assert_int_equal(mp_pager_unbind(p, 0, E + 1), -EINVAL);
	assert_int_equal(mp_pager_remove_source(p, src_v), 0);
	assert_int_equal(mp_pager_remove_source(p, src_v), -EINVAL);
	assert_int_equal(mp_pager_unbind(p, 0, E), 0);
	assert_int_equal(mp_pager_remove_source(p, src_a), 0);
	mp_pager_close(p);
	mp_adapter_close(other);
	mp_store_close(small);
	mp_store_close(third);
}

/* A read:rate= cap is the device's: a variant row's reads pass it as the model's own do. */
static void rows_of_other_files_pass_the_fault_rules(void **state)
{
	struct mp_pager_config cfg;
	struct mp_fault_counts c;
	struct mp_pager *p;
	uint8_t *buf = malloc(xbytes);
	int src_v, src_a;

	(void)state;
	mp_pager_config_init(&cfg);
	cfg.fault = "read:rate=1G";
	p = open_pager_cfg(4, NULL, &cfg);
	assert_true(mp_tier_is_fault(p->fault_tier));
	bind_sources(p, &src_v, &src_a);
	assert_memory_equal(get(p, 0, 0), want(0, 0), xbytes);
	row_bytes(1, geo->experts + 2, buf);
	assert_memory_equal(get(p, 1, geo->experts + 2), buf, xbytes);
	row_bytes(1, 2 * geo->experts - 1, buf);
	assert_memory_equal(get(p, 1, 2 * geo->experts - 1), buf, xbytes);
	mp_tier_inject_counts(p->fault_tier, &c);
	assert_int_equal(c.reads, 3);
	assert_int_equal(c.rate_waits, 3);
	mp_pager_close(p);
	free(buf);
}

static void corrupt_adapter_row_errors_through_guard(void **state)
{
	struct mp_pager *p = open_pager(2, NULL);
	const struct mp_adapter_expert *x;
	struct mp_adapter *bad;
	struct guarded g = { .p = p, .layer = 1, .expert = geo->experts };
	int src;

	(void)state;
	open_sources();
	assert_int_equal(t_write_adapter(t_path("bad.mpa"), store, variant, adapter_picks,
					 MP_ARRAY_SIZE(adapter_picks), "bad"), 0);
	assert_int_equal(mp_adapter_open(t_path("bad.mpa"), &bad), 0);
	x = mp_adapter_find(bad, 1, 2);
	assert_non_null(x);
	/* The table is checked at open, the bytes at read: damage the expert's bytes. */
	assert_int_equal(t_flip_byte(t_path("bad.mpa"), x->offset + 5), 0);
	src = mp_pager_add_adapter(p, bad);
	assert_true(src > 0);
	assert_int_equal(mp_pager_bind(p, 1, geo->experts, src, 2), 0);
	t_log_reset();
	assert_int_equal(mp_pager_guard(p, read_expert_fn, &g), -EBADMSG);
	assert_true(t_log_contains("checksum mismatch"));
	mp_pager_close(p);
	mp_adapter_close(bad);
}

static void budget_strings_parse(void **state)
{
	uint64_t v;

	(void)state;
	assert_int_equal(mp_budget_parse("8G", 0, &v), 0);
	assert_int_equal(v, 8ull << 30);
	assert_int_equal(mp_budget_parse("512M", 0, &v), 0);
	assert_int_equal(v, 512ull << 20);
	assert_int_equal(mp_budget_parse("1.5G", 0, &v), 0);
	assert_int_equal(v, 3ull << 29);
	assert_int_equal(mp_budget_parse("64KiB", 0, &v), 0);
	assert_int_equal(v, 64ull << 10);
	assert_int_equal(mp_budget_parse("4096", 0, &v), 0);
	assert_int_equal(v, 4096);
	assert_int_equal(mp_budget_parse("40%", 1000, &v), 0);
	assert_int_equal(v, 400);
	t_log_reset();
	assert_int_equal(mp_budget_parse("40%", 0, &v), -EINVAL);
	assert_int_equal(mp_budget_parse("150%", 1000, &v), -EINVAL);
	assert_int_equal(mp_budget_parse("-3G", 0, &v), -EINVAL);
	assert_int_equal(mp_budget_parse("0", 0, &v), -EINVAL);
	assert_int_equal(mp_budget_parse("8Q", 0, &v), -EINVAL);
	assert_int_equal(mp_budget_parse("", 0, &v), -EINVAL);
	assert_int_equal(mp_budget_parse("8GG", 0, &v), -EINVAL);
	assert_true(t_log_contains("budget '8GG'"));
}

static void latency_quantiles_interpolate_log2_buckets(void **state)
{
	struct mp_pager_stats st;

	(void)state;
	memset(&st, 0, sizeof(st));
	assert_int_equal(mp_pager_stats_quantile(&st, 0.5), 0);
	st.fault_latency_hist[10] = 50;		/* [1024, 2048) ns */
	st.fault_latency_hist[20] = 50;		/* [1 Mi, 2 Mi) ns */
	assert_true(mp_pager_stats_quantile(&st, 0.25) >= 1024);
	assert_true(mp_pager_stats_quantile(&st, 0.25) < 2048);
	assert_true(mp_pager_stats_quantile(&st, 0.99) >= 1u << 20);
	assert_true(mp_pager_stats_quantile(&st, 0.99) < 2u << 20);
	assert_int_equal(mp_pager_hist_bucket(0), 0);
	assert_int_equal(mp_pager_hist_bucket(1500), 10);
	assert_int_equal(mp_pager_hist_bucket(UINT64_MAX), MP_PAGER_HIST_BUCKETS - 1);
}

/*
 * The pager's core behaviours, each run over every eviction policy and both
 * ways of resolving a demanded expert (as the kernel's userfaultfd unit
 * tests run each behaviour over every memory type): whatever the policy
 * picks and whoever reads, the bytes are right and the budget holds.
 */
#define BEHAVIOUR(fn) { #fn, fn }
static const struct {
	const char *name;
	CMUnitTestFunction fn;
} behaviours[] = {
	BEHAVIOUR(every_expert_reads_back_under_two_expert_budget),
	BEHAVIOUR(threads_reading_overlapping_experts_see_file_bytes),
	BEHAVIOUR(budget_is_never_exceeded_while_threads_read),
	BEHAVIOUR(prefetch_then_read_causes_no_demand_fault),
	BEHAVIOUR(host_tier_refault_returns_right_bytes),
	BEHAVIOUR(evicting_an_expert_being_read_refaults_right_bytes),
	BEHAVIOUR(racing_faults_on_one_expert_read_it_once),
	BEHAVIOUR(application_zap_of_a_mapped_expert_reads_it_again),
	BEHAVIOUR(a_fill_whose_map_loses_the_pages_reads_it_again),
	BEHAVIOUR(shrinking_the_budget_evicts_down_to_it),
	BEHAVIOUR(rows_of_three_sources_read_back_their_bytes_under_one_budget),
};

int main(void)
{
	static const struct CMUnitTest singles[] = {
		cmocka_unit_test(lru_and_fifo_pick_their_victims),
		cmocka_unit_test(demand_fault_goes_before_queued_prefetches),
		cmocka_unit_test(poisoned_expert_errors_through_guard_then_retries),
		cmocka_unit_test(a_later_sigbus_handler_is_put_behind_the_guard),
		cmocka_unit_test(our_handler_put_back_by_signal_still_chains_to_the_one_before),
		cmocka_unit_test(corrupt_read_is_caught_by_checksum_never_served),
		cmocka_unit_test(close_with_faults_in_flight_releases_every_thread),
		cmocka_unit_test(close_leaves_no_fd_thread_or_mapping),
		cmocka_unit_test(access_outside_any_expert_is_an_error_not_a_hang),
		cmocka_unit_test(bad_config_is_refused_with_a_message),
		cmocka_unit_test(budget_env_accepts_percent_of_the_model),
		cmocka_unit_test(out_of_range_ids_are_errors),
		cmocka_unit_test(projections_point_into_the_expert),
		cmocka_unit_test(route_fill_reads_routed_experts_before_the_touch),
		cmocka_unit_test(demand_fill_evicts_while_its_read_is_in_flight),
		cmocka_unit_test(evictions_keep_spares_within_the_memory_bound),
		cmocka_unit_test(a_smaller_budget_gives_spares_back),
		cmocka_unit_test(concurrent_shrinks_each_return_within_the_budget),
		cmocka_unit_test(concurrent_fills_never_exceed_the_memory_bound),
		cmocka_unit_test(idle_workers_create_spares_ahead_of_the_next_fill),
		cmocka_unit_test(routed_expert_is_read_on_the_asking_thread_before_its_touch),
		cmocka_unit_test(deferred_eviction_takes_effect_when_the_read_ends),
		cmocka_unit_test(deferred_eviction_serves_a_fault_on_the_read_first),
		cmocka_unit_test(deferred_eviction_drops_a_queued_prefetch),
		cmocka_unit_test(deferred_eviction_room_is_waited_for_not_taken_from_the_lru),
		cmocka_unit_test(deferred_eviction_of_a_failed_read_is_forgotten),
		cmocka_unit_test(deferred_eviction_of_a_refused_prefetch_a_thread_waits_for),
		cmocka_unit_test(expert_a_fill_thread_reads_is_waited_for_not_read_twice),
		cmocka_unit_test(failed_read_of_a_request_errors_through_guard_once),
		cmocka_unit_test(close_releases_a_thread_reading_its_own_expert),
		cmocka_unit_test(resolution_follows_the_expert_size_unless_configured),
		cmocka_unit_test(routed_and_prefetched_rows_are_read_by_row_id),
		cmocka_unit_test(bad_sources_and_bindings_are_refused),
		cmocka_unit_test(rows_of_other_files_pass_the_fault_rules),
		cmocka_unit_test(corrupt_adapter_row_errors_through_guard),
		cmocka_unit_test(budget_strings_parse),
		cmocka_unit_test(latency_quantiles_interpolate_log2_buckets),
	};
	static const struct { uint32_t resolve; const char *name; } paths[] = {
		{ MP_RESOLVE_FAULT, "fault" },
		{ MP_RESOLVE_CALLER, "caller" },
	};
	char *names = strdup(mp_eviction_policy_names()), *save = NULL;
	struct mode modes[16 * MP_ARRAY_SIZE(paths)];
	const char *policies[16];
	struct CMUnitTest *tests;
	size_t npol = 0, nmodes = 0, n = 0;
	int failed;

	for (char *tok = strtok_r(names, ", ", &save); tok && npol < 16;
	     tok = strtok_r(NULL, ", ", &save))
		policies[npol++] = tok;
	for (size_t r = 0; r < MP_ARRAY_SIZE(paths); r++)
		for (size_t k = 0; k < npol; k++)
			modes[nmodes++] = (struct mode){ policies[k], paths[r].resolve };
	tests = calloc(MP_ARRAY_SIZE(behaviours) * nmodes + MP_ARRAY_SIZE(singles),
		       sizeof(*tests));
	if (!names || !tests || npol < 2)
		return 1;
	for (size_t b = 0; b < MP_ARRAY_SIZE(behaviours); b++) {
		for (size_t k = 0; k < nmodes; k++) {
			char *name;

			if (asprintf(&name, "%s on %s, %s path", behaviours[b].name,
				     modes[k].policy, paths[k / npol].name) < 0)
				return 1;
			tests[n++] = (struct CMUnitTest){ .name = name,
							  .test_func = behaviours[b].fn,
							  .initial_state = &modes[k] };
		}
	}
	for (size_t i = 0; i < MP_ARRAY_SIZE(singles); i++)
		tests[n++] = singles[i];
	t_test_filter();
	failed = _cmocka_run_group_tests("test_pager", tests, n, group_setup, group_teardown);
	for (size_t i = 0; i < MP_ARRAY_SIZE(behaviours) * nmodes; i++)
		free((char *)tests[i].name);
	free(tests);
	free(names);
	return failed;
}
