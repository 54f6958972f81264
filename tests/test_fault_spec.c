// SPDX-License-Identifier: MIT
/* Description: the fault spec grammar and the fault tier's injections, over an in-memory tier. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "base/base.h"
#include "tier/inject.h"

#define XBYTES		(300u * 1024 + 100)	/* not a page multiple */
#define PIECE		(64u * 1024)		/* bytes handed over per ready call */
#define LAYERS		4u
#define EXPERTS		8u

/* An in-memory tier: expert (l, e) is a fixed pseudo-random byte pattern. */
struct mem_tier {
	struct mp_tier t;
	atomic_int reads;
	bool destroyed;
};

static uint8_t pattern(uint32_t l, uint32_t e, uint64_t i)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)l << 40 | (uint64_t)e << 20);

	return (uint8_t)(x >> 29);
}

static int mem_read(struct mp_tier *t, const struct mp_tier_read *rd)
{
	struct mem_tier *m = container_of(t, struct mem_tier, t);
	uint64_t done = 0;

	atomic_fetch_add(&m->reads, 1);
	for (unsigned s = 0; s < rd->iovcnt && done < rd->bytes; s++) {
		uint8_t *dst = rd->iov[s].iov_base;
		uint64_t seg = MP_MIN((uint64_t)rd->iov[s].iov_len, rd->bytes - done);

		for (uint64_t o = 0; o < seg; o += PIECE) {
			uint64_t len = MP_MIN((uint64_t)PIECE, seg - o);
			int err;

			if (rd->cancel && atomic_load(rd->cancel))
				return -ECANCELED;
			for (uint64_t i = 0; i < len; i++)
				dst[o + i] = pattern(rd->layer, rd->expert, done + o + i);
			err = rd->ready(rd->arg, dst + o, len);
			if (err)
				return err;
		}
		done += seg;
	}
	return 0;
}

static void mem_destroy(struct mp_tier *t)
{
	container_of(t, struct mem_tier, t)->destroyed = true;
}

static const struct mp_tier_ops mem_ops = { .name = "mem", .read = mem_read,
					    .destroy = mem_destroy };

static struct mem_tier mem;

/* What the caller of a read saw: the bytes handed to ready, in order. */
struct sink {
	uint8_t *got;
	uint64_t n;
};

static int sink_ready(void *arg, const void *buf, size_t len)
{
	struct sink *k = arg;

	memcpy(k->got + k->n, buf, len);
	k->n += len;
	return 0;
}

static uint8_t dest[2][256 * 1024];	/* two destination chunks */
static uint8_t got[XBYTES];
static atomic_bool cancel;

static int read_one(struct mp_tier *t, uint32_t l, uint32_t e, struct sink *k)
{
	struct iovec iov[2] = { { dest[0], sizeof(dest[0]) }, { dest[1], sizeof(dest[1]) } };
	struct mp_tier_read rd = {
		.layer = l, .expert = e, .offset = 0, .bytes = XBYTES, .iov = iov, .iovcnt = 2,
		.ready = sink_ready, .arg = k, .cancel = &cancel,
	};

	k->got = got;
	k->n = 0;
	return mp_tier_read(t, &rd);
}

static void reset_mem(void)
{
	memset(&mem, 0, sizeof(mem));
	mem.t.ops = &mem_ops;
	mem.t.number = 1;
	snprintf(mem.t.name, sizeof(mem.t.name), "mem");
}

static struct mp_tier *wrap_mem(const char *spec, uint64_t seed)
{
	struct mp_tier *t = NULL;

	reset_mem();
	assert_int_equal(mp_tier_inject_open(&mem.t, spec, seed, &t), 0);
	assert_non_null(t);
	assert_true(mp_tier_is_fault(t));
	return t;
}

static bool matches_pattern(uint32_t l, uint32_t e, const uint8_t *b, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		if (b[i] != pattern(l, e, i))
			return false;
	return true;
}

/*
 * Grammar
 */

static void issue_examples_parse(void **state)
{
	static const char *const ok[] = {
		"read:eio:p=0.01", "read:eio:expert=3.7", "read:short:every=7",
		"read:corrupt:expert=0.2", "read:delay=50ms:p=0.1", "alloc:enomem:after=10",
		"read:enomem:layer=2:count=3", "read:delay=1.5s", "read:delay=200us:every=2",
		"read:eio:p=1", "read:eio:p=0", "read:eio:after=0:count=1",
		"read:rate=32M", "read:rate=500K:layer=1", "read:rate=1.5G", "read:rate=4096",
	};

	(void)state;
	for (size_t i = 0; i < MP_ARRAY_SIZE(ok); i++)
		assert_int_equal(mp_fault_spec_check(ok[i]), 1);
	assert_int_equal(mp_fault_spec_check("read:eio:p=0.2;read:short:every=7;"
					     "alloc:enomem:after=10"), 3);
	assert_int_equal(mp_fault_spec_check("read:eio;"), 1);
	assert_int_equal(mp_fault_spec_check(""), 0);
	assert_int_equal(mp_fault_spec_check(NULL), 0);
}

static void bad_specs_name_the_rule_and_position(void **state)
{
	static const struct { const char *spec; const char *msg; } bad[] = {
		{ "read:eio:p=1.5", "rule 1 'read:eio:p=1.5', position 12: p=1.5 is not a "
				    "probability in [0, 1]" },
		{ "read:eio;write:eio", "rule 2 'write:eio', position 10: unknown operation "
					"'write' (read, alloc)" },
		{ "read:bogus", "rule 1 'read:bogus', position 6: unknown read fault 'bogus'" },
		{ "alloc:eio", "position 7: unknown alloc fault 'eio' (enomem)" },
		{ "read:delay=50", "position 14: delay '50' needs a unit: ns, us, ms or s" },
		{ "read:delay=2h", "position 13: delay '2h' needs a unit" },
		{ "read:delay=fast", "position 12: delay 'fast' is not a duration" },
		{ "read:delay=5000s", "delay '5000s' is longer than an hour" },
		{ "read:eio:expert=1", "position 17: expert=1 is not LAYER.EXPERT" },
		{ "read:eio:expert=1.x", "expert=1.x is not LAYER.EXPERT" },
		{ "read:eio:p=0.1:p=0.2", "position 16: p= given twice" },
		{ "read:eio:every=0", "every=0 is not a count >= 1" },
		{ "read:eio:count=0", "count=0 is not a count >= 1" },
		{ "read:eio:after=-1", "after=-1 is not a count" },
		{ "read:eio:p=inf", "p=inf is not a probability" },
		{ "read:eio:p=-0.1", "p=-0.1 is not a probability" },
		{ "read:eio:p=.5", "p=.5 is not a probability" },
		{ "read:eio:q=1", "position 10: unknown parameter 'q' (p, every, after, count, "
				  "expert, layer)" },
		{ "read:eio:every", "'every' is not key=value" },
		{ "read:eio:expert=1.1:layer=2", "expert=L.E already names the layer" },
		{ "read", "rule 1 'read', position 5: 'read' names no fault (e.g. read:eio)" },
		{ "read::eio", "position 6: empty field" },
		{ ";read:eio", "rule 1 '', position 1: empty rule" },
		{ "read:eio;;read:short", "rule 2 '', position 10: empty rule" },
		{ "read:eio:every=99999999999999999999", "is not a count >= 1" },
		{ "read:eio:layer=4294967296", "is not a layer number" },
		{ " read:eio", "unknown operation ' read'" },
		{ "read:rate=", "position 11: rate '' is not bytes per second" },
		{ "read:rate=fast", "rate 'fast' is not bytes per second (e.g. 64M, 500K)" },
		{ "read:rate=8X", "position 12: rate '8X': unknown unit (K, M, G or T)" },
		{ "read:rate=8MB", "rate '8MB': unknown unit" },
		{ "read:rate=0.5", "rate '0.5' is below one byte per second" },
		{ "read:rate=0", "rate '0' is below one byte per second" },
		{ "alloc:rate=8M", "unknown alloc fault 'rate=8M' (enomem)" },
	};

	(void)state;
	for (size_t i = 0; i < MP_ARRAY_SIZE(bad); i++) {
		int err;

		t_log_reset();
		err = mp_fault_spec_check(bad[i].spec);
		if (err != -EINVAL || !t_log_contains(bad[i].msg))
			fail_msg("spec '%s': got %d, message '%s', wanted '%s'", bad[i].spec, err,
				 mp_last_error(), bad[i].msg);
	}
}

static void bad_spec_leaves_the_inner_tier_alone(void **state)
{
	struct mp_tier *t = (struct mp_tier *)0x1;

	(void)state;
	reset_mem();
	assert_int_equal(mp_tier_inject_open(&mem.t, "read:eio:p=2", 1, &t), -EINVAL);
	assert_null(t);
	assert_false(mem.destroyed);
}

/*
 * Injections
 */

static void no_rule_passes_bytes_through(void **state)
{
	struct mp_tier *t = wrap_mem("", 1);
	struct mp_fault_counts c;
	struct sink k;

	(void)state;
	assert_int_equal(read_one(t, 2, 5, &k), 0);
	assert_int_equal(k.n, XBYTES);
	assert_true(matches_pattern(2, 5, k.got, k.n));
	mp_tier_inject_counts(t, &c);
	assert_int_equal(c.reads, 1);
	assert_int_equal(c.eio + c.short_reads + c.corrupt + c.delays, 0);
	mp_tier_destroy(t);
	assert_true(mem.destroyed);
}

static void eio_delivers_a_prefix_then_fails_naming_the_expert(void **state)
{
	struct mp_tier *t = wrap_mem("read:eio:expert=1.3", 7);
	struct mp_fault_counts c;
	struct sink k;

	(void)state;
	for (int i = 0; i < 5; i++) {
		t_log_reset();
		assert_int_equal(read_one(t, 1, 3, &k), -EIO);
		assert_true(k.n < XBYTES);
		assert_int_equal(k.n % 4096, 0);
		assert_true(matches_pattern(1, 3, k.got, k.n));
		assert_true(t_log_contains("fault injection: layer 1 expert 3: EIO after"));
		assert_true(t_log_contains("(rule 'read:eio:expert=1.3')"));
	}
	/* Only that expert. */
	assert_int_equal(read_one(t, 1, 2, &k), 0);
	assert_int_equal(read_one(t, 0, 3, &k), 0);
	assert_true(matches_pattern(0, 3, k.got, XBYTES));
	mp_tier_inject_counts(t, &c);
	assert_int_equal(c.reads, 7);
	assert_int_equal(c.eio, 5);
	mp_tier_destroy(t);
}

/* Runs n reads spread over every expert; returns the bitmap of failures. */
static void outcomes(const char *spec, uint64_t seed, int n, uint8_t *failed, int *nfailed)
{
	struct mp_tier *t = wrap_mem(spec, seed);
	struct sink k;

	*nfailed = 0;
	for (int i = 0; i < n; i++) {
		int err = read_one(t, (uint32_t)i % LAYERS, (uint32_t)(i / LAYERS) % EXPERTS, &k);

		assert_true(err == 0 || err == -EIO);
		failed[i] = err != 0;
		*nfailed += err != 0;
		if (!err)
			assert_true(matches_pattern((uint32_t)i % LAYERS,
						    (uint32_t)(i / LAYERS) % EXPERTS, k.got, k.n));
	}
	mp_tier_destroy(t);
}

static void probability_is_honoured_and_repeats_with_the_seed(void **state)
{
	enum { N = 2000 };
	static uint8_t a[N], b[N], c[N];
	int na, nb, nc;

	(void)state;
	mp_set_log_handler(NULL, NULL);
	outcomes("read:eio:p=0.25", 42, N, a, &na);
	outcomes("read:eio:p=0.25", 42, N, b, &nb);
	outcomes("read:eio:p=0.25", 43, N, c, &nc);
	t_log_capture();
	/* Binomial(2000, 0.25): mean 500, sd 19; any seed lands well inside +-100. */
	assert_in_range(na, 400, 600);
	assert_in_range(nc, 400, 600);
	assert_int_equal(na, nb);
	assert_memory_equal(a, b, N);
	assert_memory_not_equal(a, c, N);
}

static void every_after_and_count_select_reads_by_order(void **state)
{
	struct mp_tier *t;
	struct sink k;
	char fails[16];

	(void)state;
	t = wrap_mem("read:eio:every=3", 1);
	for (int i = 0; i < 10; i++)
		fails[i] = read_one(t, 0, (uint32_t)i % EXPERTS, &k) ? 'x' : '.';
	fails[10] = 0;
	assert_string_equal(fails, "..x..x..x.");
	mp_tier_destroy(t);

	t = wrap_mem("read:eio:after=2:count=3", 1);
	for (int i = 0; i < 10; i++)
		fails[i] = read_one(t, 0, 0, &k) ? 'x' : '.';
	assert_string_equal(fails, "..xxx.....");
	mp_tier_destroy(t);

	/* Selectors count only the operations they match. */
	t = wrap_mem("read:eio:layer=1:every=2", 1);
	for (int i = 0; i < 10; i++)
		fails[i] = read_one(t, (uint32_t)i % 2, 0, &k) ? 'x' : '.';
	assert_string_equal(fails, "...x...x..");
	mp_tier_destroy(t);
}

static void short_read_reports_success_with_fewer_bytes(void **state)
{
	struct mp_tier *t = wrap_mem("read:short:expert=2.2", 3);
	struct mp_fault_counts c;
	struct sink k;

	(void)state;
	for (int i = 0; i < 8; i++) {
		assert_int_equal(read_one(t, 2, 2, &k), 0);
		assert_true(k.n < XBYTES);
		assert_true(matches_pattern(2, 2, k.got, k.n));
	}
	mp_tier_inject_counts(t, &c);
	assert_int_equal(c.short_reads, 8);
	mp_tier_destroy(t);
}

static void corrupt_flips_one_bit_the_checksum_sees(void **state)
{
	struct mp_tier *t = wrap_mem("read:corrupt:expert=0.2", 9);
	static uint8_t want[XBYTES];
	struct mp_fault_counts c;
	struct sink k;

	(void)state;
	for (uint64_t i = 0; i < XBYTES; i++)
		want[i] = pattern(0, 2, i);
	for (int r = 0; r < 16; r++) {
		int bits = 0;

		assert_int_equal(read_one(t, 0, 2, &k), 0);
		assert_int_equal(k.n, XBYTES);
		for (uint64_t i = 0; i < XBYTES; i++)
			bits += __builtin_popcount(k.got[i] ^ want[i]);
		assert_int_equal(bits, 1);
		assert_true(mp_checksum(k.got, k.n) != mp_checksum(want, XBYTES));
	}
	mp_tier_inject_counts(t, &c);
	assert_int_equal(c.corrupt, 16);
	mp_tier_destroy(t);
}

static void delay_waits_then_reads_and_stops_on_cancel(void **state)
{
	struct mp_tier *t = wrap_mem("read:delay=30ms", 1);
	struct mp_fault_counts c;
	struct sink k;
	uint64_t t0 = mp_now_ns();

	(void)state;
	assert_int_equal(read_one(t, 0, 0, &k), 0);
	assert_true(mp_now_ns() - t0 >= 30ull * 1000 * 1000);
	assert_true(matches_pattern(0, 0, k.got, XBYTES));
	/* A closing pager sets cancel: the delay ends without reading. */
	atomic_store(&cancel, true);
	assert_int_equal(read_one(t, 0, 1, &k), -ECANCELED);
	atomic_store(&cancel, false);
	assert_int_equal(atomic_load(&mem.reads), 1);
	mp_tier_inject_counts(t, &c);
	assert_int_equal(c.delays, 2);
	mp_tier_destroy(t);
}

static void read_enomem_refuses_without_reading(void **state)
{
	struct mp_tier *t = wrap_mem("read:enomem:count=1", 1);
	struct sink k;

	(void)state;
	t_log_reset();
	assert_int_equal(read_one(t, 3, 1, &k), -ENOMEM);
	assert_true(t_log_contains("layer 3 expert 1: read refused for lack of memory"));
	assert_int_equal(atomic_load(&mem.reads), 0);
	assert_int_equal(read_one(t, 3, 1, &k), 0);
	mp_tier_destroy(t);
}

static void alloc_rules_fire_after_n_allocations(void **state)
{
	struct mp_tier *t = wrap_mem("alloc:enomem:after=3;read:eio:p=0", 1);
	struct mp_fault_counts c;

	(void)state;
	for (uint32_t i = 0; i < 3; i++)
		assert_int_equal(mp_tier_inject_alloc(t, 0, i), 0);
	t_log_reset();
	assert_int_equal(mp_tier_inject_alloc(t, 1, 4), -ENOMEM);
	assert_true(t_log_contains("fault injection: layer 1 expert 4: memory for the expert "
				   "refused (rule 'alloc:enomem:after=3')"));
	assert_int_equal(mp_tier_inject_alloc(t, 0, 0), -ENOMEM);
	mp_tier_inject_counts(t, &c);
	assert_int_equal(c.alloc_enomem, 2);
	/* Alloc rules never touch reads, and other tiers have no alloc faults. */
	assert_int_equal(mp_tier_inject_alloc(&mem.t, 0, 0), 0);
	mp_tier_destroy(t);
}

static void first_failure_in_spec_order_decides_and_delays_add(void **state)
{
	struct mp_tier *t = wrap_mem("read:delay=10ms;read:short;read:eio;read:delay=10ms", 1);
	struct mp_fault_counts c;
	struct sink k;
	uint64_t t0 = mp_now_ns();

	(void)state;
	assert_int_equal(read_one(t, 0, 0, &k), 0);
	assert_true(k.n < XBYTES);
	assert_true(mp_now_ns() - t0 >= 20ull * 1000 * 1000);
	mp_tier_inject_counts(t, &c);
	assert_int_equal(c.short_reads, 1);
	assert_int_equal(c.eio, 0);
	mp_tier_destroy(t);
}

/*
 * read:rate=: each read waits its turn through a device of that many bytes/s.
 * Back to back, a read starts once the one before is through, so each
 * waits exactly its own bytes' time (the counters add the reservations,
 * not measured sleeps); the bytes are the file's, and other layers pass.
 */
static void rate_cap_holds_each_read_for_its_bytes(void **state)
{
	struct mp_tier *t = wrap_mem("read:rate=64M:layer=2", 1);
	uint64_t cost = (uint64_t)llround((double)XBYTES * 1e9 / (64.0 * 1024 * 1024));
	struct mp_fault_counts c;
	struct sink k;

	(void)state;
	for (int i = 0; i < 3; i++) {
		assert_int_equal(read_one(t, 2, (uint32_t)i, &k), 0);
		assert_int_equal(k.n, XBYTES);
		assert_true(matches_pattern(2, (uint32_t)i, k.got, k.n));
	}
	assert_int_equal(read_one(t, 1, 0, &k), 0);
	mp_tier_inject_counts(t, &c);
	assert_int_equal(c.reads, 4);
	assert_int_equal(c.rate_waits, 3);
	assert_int_equal(c.rate_wait_ns, 3 * cost);
	assert_int_equal(c.eio + c.short_reads + c.corrupt + c.delays, 0);
	mp_tier_destroy(t);
}

/*
 * A tier sharing another's rules reads its own file through the same
 * device: one reservation chain (a read of each file back to back waits
 * its own bytes' time after the other's), one set of counters; the rules
 * outlive the tier they were opened on; a tier without rules shares none.
 */
static void shared_rules_put_two_files_behind_one_device(void **state)
{
	static struct mem_tier other;
	struct mp_tier *t = wrap_mem("read:rate=64M", 1), *s = &other.t, *plain = &other.t;
	uint64_t cost = (uint64_t)llround((double)XBYTES * 1e9 / (64.0 * 1024 * 1024));
	struct mp_fault_counts c;
	struct sink k;

	(void)state;
	other.t.ops = &mem_ops;
	other.t.number = 1;
	snprintf(other.t.name, sizeof(other.t.name), "other");
	assert_int_equal(mp_tier_inject_share(&mem.t, &plain), 0);
	assert_ptr_equal(plain, &other.t);
	assert_int_equal(mp_tier_inject_share(t, &s), 0);
	assert_ptr_not_equal(s, &other.t);
	assert_string_equal(s->name, "other with faults");
	assert_int_equal(read_one(t, 0, 0, &k), 0);
	assert_int_equal(read_one(s, 0, 1, &k), 0);
	assert_int_equal(k.n, XBYTES);
	assert_true(matches_pattern(0, 1, k.got, k.n));
	assert_int_equal(atomic_load(&other.reads), 1);
	mp_tier_inject_counts(t, &c);
	assert_int_equal(c.reads, 2);
	assert_int_equal(c.rate_waits, 2);
	assert_int_equal(c.rate_wait_ns, 2 * cost);
	mp_tier_destroy(t);
	assert_true(mem.destroyed);
	assert_int_equal(read_one(s, 0, 2, &k), 0);
	assert_true(matches_pattern(0, 2, k.got, k.n));
	mp_tier_destroy(s);
	assert_true(other.destroyed);
}

/*
 * The environment
 */

static void wrap_reads_the_environment(void **state)
{
	struct mp_tier *t = &mem.t;

	(void)state;
	reset_mem();
	unsetenv(MP_FAULT_ENV);
	assert_int_equal(mp_tier_inject_wrap(&t, NULL, 0), 0);
	assert_ptr_equal(t, &mem.t);

	setenv(MP_FAULT_ENV, "", 1);
	assert_int_equal(mp_tier_inject_wrap(&t, NULL, 0), 0);
	assert_ptr_equal(t, &mem.t);

	setenv(MP_FAULT_ENV, "read:eio:every=2;read:slow", 1);
	t_log_reset();
	assert_int_equal(mp_tier_inject_wrap(&t, NULL, 0), -EINVAL);
	assert_true(t_log_contains("MOEPAGER_FAULT: rule 2 'read:slow', position 23: unknown "
				   "read fault 'slow'"));
	assert_ptr_equal(t, &mem.t);

	setenv(MP_FAULT_ENV, "read:eio:p=0.5", 1);
	setenv(MP_FAULT_SEED_ENV, "12x", 1);
	t_log_reset();
	assert_int_equal(mp_tier_inject_wrap(&t, NULL, 0), -EINVAL);
	assert_true(t_log_contains("MOEPAGER_FAULT_SEED: '12x' is not a decimal number"));

	setenv(MP_FAULT_SEED_ENV, "12", 1);
	assert_int_equal(mp_tier_inject_wrap(&t, NULL, 0), 0);
	assert_true(mp_tier_is_fault(t));
	assert_string_equal(t->name, "mem with faults");
	assert_int_equal(t->number, mem.t.number);
	mp_tier_destroy(t);
	assert_true(mem.destroyed);

	/* A spec from the caller wins over the environment. */
	reset_mem();
	t = &mem.t;
	assert_int_equal(mp_tier_inject_wrap(&t, "", 0), 0);
	assert_ptr_equal(t, &mem.t);
	unsetenv(MP_FAULT_ENV);
	unsetenv(MP_FAULT_SEED_ENV);
}

/* The same seed from the environment and from the caller gives the same injections. */
static void env_seed_equals_api_seed(void **state)
{
	enum { N = 200 };
	uint8_t a[N], b[N];
	struct mp_tier *t;
	struct sink k;
	int na, nb = 0;

	(void)state;
	mp_set_log_handler(NULL, NULL);
	outcomes("read:eio:p=0.5", 77, N, a, &na);
	reset_mem();
	t = &mem.t;
	setenv(MP_FAULT_SEED_ENV, "77", 1);
	assert_int_equal(mp_tier_inject_wrap(&t, "read:eio:p=0.5", 0), 0);
	unsetenv(MP_FAULT_SEED_ENV);
	for (int i = 0; i < N; i++) {
		b[i] = read_one(t, (uint32_t)i % LAYERS, (uint32_t)(i / LAYERS) % EXPERTS, &k) != 0;
		nb += b[i];
	}
	mp_tier_destroy(t);
	t_log_capture();
	assert_int_equal(na, nb);
	assert_memory_equal(a, b, N);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(issue_examples_parse),
		cmocka_unit_test(bad_specs_name_the_rule_and_position),
		cmocka_unit_test(bad_spec_leaves_the_inner_tier_alone),
		cmocka_unit_test(no_rule_passes_bytes_through),
		cmocka_unit_test(eio_delivers_a_prefix_then_fails_naming_the_expert),
		cmocka_unit_test(probability_is_honoured_and_repeats_with_the_seed),
		cmocka_unit_test(every_after_and_count_select_reads_by_order),
		cmocka_unit_test(short_read_reports_success_with_fewer_bytes),
		cmocka_unit_test(corrupt_flips_one_bit_the_checksum_sees),
		cmocka_unit_test(delay_waits_then_reads_and_stops_on_cancel),
		cmocka_unit_test(read_enomem_refuses_without_reading),
		cmocka_unit_test(alloc_rules_fire_after_n_allocations),
		cmocka_unit_test(first_failure_in_spec_order_decides_and_delays_add),
		cmocka_unit_test(rate_cap_holds_each_read_for_its_bytes),
		cmocka_unit_test(shared_rules_put_two_files_behind_one_device),
		cmocka_unit_test(wrap_reads_the_environment),
		cmocka_unit_test(env_seed_equals_api_seed),
	};

	t_log_capture();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
