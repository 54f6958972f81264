/* SPDX-License-Identifier: MIT */
/* t_ helpers shared by the cmocka tests. */
#ifndef MP_TEST_HELPERS_H
#define MP_TEST_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <moepager.h>

/* Exit code meson counts as a skipped test. */
#define T_EXIT_SKIP 77

/*
 * True when tests must not skip for lack of a privilege or feature
 * (CI sets MOEPAGER_REQUIRE_BPF=1 and runs as root).
 */
int t_require_all(void);

/* A fresh directory under $TMPDIR (or /tmp) for this test; removed by t_tmpdir_cleanup(). */
const char *t_tmpdir(void);
void t_tmpdir_cleanup(void);
/* path = t_tmpdir()/name, in a static buffer per call slot (4 slots). */
const char *t_path(const char *name);

/* Captures library log lines; t_log_contains() searches what was captured since t_log_reset(). */
void t_log_capture(void);
void t_log_reset(void);
int t_log_contains(const char *needle);

/*
 * Runs only the tests whose names match $T_FILTER (cmocka's pattern: * and ?),
 * so one racy test can be looped alone: T_FILTER='demand_fault*' build/tests/test_pager.
 */
void t_test_filter(void);

/* cmocka group setup and teardown: t_log_capture() and t_tmpdir_cleanup(). */
int t_group_log_capture(void **state);
int t_group_tmpdir_cleanup(void **state);

/* Writes a model of the tiny preset with the given weight type and seed. */
int t_gen_tiny(const char *path, enum mp_dtype dtype, uint64_t seed);

/*
 * Writes an adapter of base named name replacing the (layer, expert) pairs
 * of picks[0..n) with from's experts at the same places. 0 or -errno.
 */
int t_write_adapter(const char *path, struct mp_store *base, struct mp_store *from,
		    const uint32_t (*picks)[2], size_t n, const char *name);

/* Reads / writes exactly len bytes of a file at off, failing the test otherwise. */
void t_read_at(const char *path, void *buf, size_t len, uint64_t off);
void t_write_at(const char *path, const void *buf, size_t len, uint64_t off);
/*
 * Writes (replacing) a smaller model: 2 layers x 4 experts, hidden 64, ffn 96,
 * 4 heads (2 KV) of 16, 300 tokens; rows are whole blocks of every type.
 */
int t_gen_small(const char *path, enum mp_dtype dtype, uint64_t seed);

/* Fails the test unless the two .mpk files have one geometry and every tensor and expert alike. */
void t_assert_same_model(const char *a, const char *b);

/* Flips one byte of a file at off (xor 0xff). */
int t_flip_byte(const char *path, uint64_t off);

#endif
