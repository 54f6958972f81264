// SPDX-License-Identifier: MIT
/* The published list of open expert ranges, read back the way a tracer reads another process. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"
#include "base/ranges.h"
#include "bpf/target_ranges.h"

/* This test's own executable holds the list (the library is linked in statically). */
static uint64_t locate_self(void)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	uint64_t addr = 0;

	assert_true(n > 0);
	exe[n] = 0;
	assert_int_equal(target_ranges_locate(getpid(), exe, &addr), 0);
	/* The symbol resolved through the ELF file is the variable itself. */
	assert_int_equal(addr, (uintptr_t)&mp_pager_ranges);
	return addr;
}

static void the_list_is_found_through_the_symbol_table(void **state)
{
	struct target_range r[4];
	uint64_t addr = locate_self(), gen = 1;

	(void)state;
	assert_int_equal(target_ranges_read(getpid(), addr, r, 4, &gen), 0);
	assert_int_equal(gen % 2, 0);
}

static void added_ranges_are_listed_with_unique_ids_until_removed(void **state)
{
	struct target_range r[4];
	uint64_t addr = locate_self(), g0, g1, g2;

	(void)state;
	assert_int_equal(target_ranges_read(getpid(), addr, r, 4, &g0), 0);
	assert_int_equal(mp_pager_ranges_add(0x7f0000000000ull, 2 << 20, 16, 4, 8), 0);
	assert_int_equal(mp_pager_ranges_add(0x7f1000000000ull, 4 << 20, 8, 32, 8), 0);
	assert_int_equal(target_ranges_read(getpid(), addr, r, 4, &g1), 2);
	assert_int_equal(g1, g0 + 4);
	/* Newest first. */
	assert_int_equal(r[0].base, 0x7f1000000000ull);
	assert_int_equal(r[0].slot_bytes, 4 << 20);
	assert_int_equal(r[0].slots_per_layer, 8);
	assert_int_equal(r[0].layers, 32);
	assert_int_equal(r[0].experts, 8);
	assert_int_equal(r[1].base, 0x7f0000000000ull);
	assert_int_equal(r[1].slot_bytes, 2 << 20);
	assert_int_equal(r[1].slots_per_layer, 16);
	assert_int_equal(r[1].layers, 4);
	assert_true(r[1].id >= 1);
	assert_int_equal(r[0].id, r[1].id + 1);

	mp_pager_ranges_remove(0x7f0000000000ull);
	mp_pager_ranges_remove(0x1234000);	/* not listed: no change */
	assert_int_equal(target_ranges_read(getpid(), addr, r, 4, &g2), 1);
	assert_int_equal(g2, g1 + 2);
	assert_int_equal(r[0].base, 0x7f1000000000ull);
	/* A range opened again gets a new id: a tracer never confuses the two. */
	assert_int_equal(mp_pager_ranges_add(0x7f0000000000ull, 2 << 20, 16, 4, 8), 0);
	assert_int_equal(target_ranges_read(getpid(), addr, r, 1, &g2), 2);
	assert_int_equal(r[0].base, 0x7f0000000000ull);
	assert_true(r[0].id > r[1].id + 1);
	mp_pager_ranges_remove(0x7f0000000000ull);
	mp_pager_ranges_remove(0x7f1000000000ull);
	assert_int_equal(target_ranges_read(getpid(), addr, r, 4, &g2), 0);
}

static atomic_bool churn_stop;

/*
 * Opens and closes ranges whose fields are all derived from the base, far
 * faster than pagers do (a reader must find a quiet moment of a few
 * microseconds to finish a walk).
 */
static void *churn(void *arg)
{
	struct timespec pause = { 0, 20000 };
	uint64_t i = 0;

	(void)arg;
	while (!atomic_load(&churn_stop)) {
		nanosleep(&pause, NULL);
		uint64_t base = 0x7e0000000000ull + (i % 7) * 0x100000000ull;

		if (mp_pager_ranges_add(base, base >> 20, (uint32_t)(base >> 32), 3, 5))
			break;
		if (i % 3)
			mp_pager_ranges_remove(base);
		if (i % 7 == 6)
			for (uint64_t k = 0; k < 7; k++)
				mp_pager_ranges_remove(0x7e0000000000ull + k * 0x100000000ull);
		i++;
	}
	for (uint64_t k = 0; k < 7; k++)
		mp_pager_ranges_remove(0x7e0000000000ull + k * 0x100000000ull);
	return NULL;
}

/* Every snapshot taken while another thread rewrites the list is one the list really held. */
static void reads_under_concurrent_changes_are_consistent(void **state)
{
	struct target_range r[64];
	uint64_t addr = locate_self(), gen, last = 0;
	pthread_t th;

	(void)state;
	atomic_store(&churn_stop, false);
	assert_int_equal(pthread_create(&th, NULL, churn, NULL), 0);
	for (int i = 0; i < 2000; i++) {
		int n = target_ranges_read(getpid(), addr, r, 64, &gen);

		if (n < 0 || n > 64)
			fail_msg("read %d: %s", n, mp_last_error());
		assert_int_equal(gen % 2, 0);
		assert_true(gen >= last);
		last = gen;
		for (int k = 0; k < n; k++) {
			assert_int_equal(r[k].slot_bytes, r[k].base >> 20);
			assert_int_equal(r[k].slots_per_layer, (uint32_t)(r[k].base >> 32));
			assert_int_equal(r[k].layers, 3);
			assert_int_equal(r[k].experts, 5);
			/* Newest first: ids strictly decrease along the list. */
			if (k)
				assert_true(r[k].id < r[k - 1].id);
		}
	}
	atomic_store(&churn_stop, true);
	pthread_join(th, NULL);
	assert_int_equal(target_ranges_read(getpid(), addr, r, 64, &gen), 0);
}

static void bad_targets_fail_with_a_message(void **state)
{
	char junk[64];
	struct target_range r[1];
	uint64_t addr, gen;

	(void)state;
	t_log_capture();
	/* A file this process does not map: nothing listed, not an error. */
	assert_int_equal(target_ranges_locate(getpid(), "/bin/true", &addr), -ENOENT);
	assert_int_equal(target_ranges_locate(getpid(), "/nonexistent/lib.so", &addr), -ENOENT);
	assert_true(t_log_contains("/nonexistent/lib.so"));
	t_log_reset();
	assert_int_equal(target_ranges_locate(getpid(), "/etc/passwd", &addr), -ENOEXEC);
	assert_true(t_log_contains("/etc/passwd is not an ELF file"));
	/* Memory that is not a list of this version. */
	memset(junk, 0x5a, sizeof(junk));
	assert_int_equal(target_ranges_read(getpid(), (uintptr_t)junk, r, 1, &gen), -EPROTO);
	assert_true(t_log_contains("is not a range list of version 1"));
	assert_int_equal(target_ranges_read(1 << 30, (uintptr_t)junk, r, 1, &gen), -ENOENT);
	assert_true(t_log_contains("/proc/1073741824/mem"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(the_list_is_found_through_the_symbol_table),
		cmocka_unit_test(added_ranges_are_listed_with_unique_ids_until_removed),
		cmocka_unit_test(reads_under_concurrent_changes_are_consistent),
		cmocka_unit_test(bad_targets_fail_with_a_message),
	};

	return cmocka_run_group_tests_name("pager_ranges", tests, NULL, NULL);
}
