// SPDX-License-Identifier: MIT
/* Adapters (.mpa): write, open, pack, merge, and every damaged field refused by name. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"

/* The replaced experts of the test adapter: (layer, expert) put out of order on purpose. */
static const uint32_t picks[][2] = { { 1, 3 }, { 0, 5 }, { 0, 1 }, { 1, 0 } };
#define N_PICKS (sizeof(picks) / sizeof(picks[0]))

struct fixture {
	struct mp_store *base;
	struct mp_store *other;		/* another seed: where the adapter's experts come from */
	uint64_t expert_bytes;
};

static struct fixture fx;

static int setup(void **state)
{
	(void)state;
	t_log_capture();
	if (t_gen_tiny(t_path("base.mpk"), MP_DTYPE_BF16, 1) ||
	    t_gen_tiny(t_path("other.mpk"), MP_DTYPE_BF16, 2) ||
	    mp_store_open(t_path("base.mpk"), &fx.base) ||
	    mp_store_open(t_path("other.mpk"), &fx.other))
		return -1;
	fx.expert_bytes = mp_store_expert_bytes(fx.base);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	mp_store_close(fx.base);
	mp_store_close(fx.other);
	t_tmpdir_cleanup();
	return 0;
}

/* Writes an adapter of base named name with other's experts at picks. */
static void write_adapter(const char *path, const char *name)
{
	assert_int_equal(t_write_adapter(path, fx.base, fx.other, picks, N_PICKS, name), 0);
}

static bool picked(uint32_t layer, uint32_t expert)
{
	for (size_t i = 0; i < N_PICKS; i++)
		if (picks[i][0] == layer && picks[i][1] == expert)
			return true;
	return false;
}

static void adapter_lists_its_experts_sorted_with_their_bytes(void **state)
{
	struct mp_adapter *a;
	const struct mp_adapter_expert *e;
	uint8_t *got = malloc(fx.expert_bytes), *want = malloc(fx.expert_bytes);
	uint32_t n;

	(void)state;
	write_adapter(t_path("a.mpa"), "legal");
	assert_int_equal(mp_adapter_open(t_path("a.mpa"), &a), 0);
	assert_string_equal(mp_adapter_name(a), "legal");
	assert_string_equal(mp_adapter_base_name(a), mp_store_name(fx.base));
	assert_true(mp_adapter_base_identity(a) == mp_store_identity(fx.base));
	assert_int_equal(mp_adapter_count(a), N_PICKS);
	assert_int_equal(mp_adapter_max_per_layer(a), 2);
	e = mp_adapter_layer(a, 0, &n);
	assert_int_equal(n, 2);
	assert_int_equal(e[0].expert, 1);
	assert_int_equal(e[1].expert, 5);
	e = mp_adapter_layer(a, 1, &n);
	assert_int_equal(n, 2);
	assert_int_equal(e[0].expert, 0);
	assert_int_equal(e[1].expert, 3);
	assert_null(mp_adapter_layer(a, mp_adapter_layers(a), &n));
	assert_int_equal(n, 0);
	for (size_t i = 0; i < N_PICKS; i++) {
		assert_int_equal(mp_adapter_read_expert(a, picks[i][0], picks[i][1], got), 0);
		assert_int_equal(mp_store_read_expert(fx.other, picks[i][0], picks[i][1], want), 0);
		assert_memory_equal(got, want, fx.expert_bytes);
	}
	assert_null(mp_adapter_find(a, 0, 0));
	assert_int_equal(mp_adapter_read_expert(a, 0, 0, got), -ENOENT);
	assert_int_equal(mp_adapter_verify(a), 0);
	mp_adapter_close(a);
	free(got);
	free(want);
}

static void adapter_for_another_base_is_refused_naming_both(void **state)
{
	struct mp_adapter *a;

	(void)state;
	write_adapter(t_path("a.mpa"), "legal");
	assert_int_equal(mp_adapter_open(t_path("a.mpa"), &a), 0);
	assert_int_equal(mp_adapter_check_base(a, fx.base), 0);
	t_log_reset();
	assert_int_equal(mp_adapter_check_base(a, fx.other), -EMEDIUMTYPE);
	assert_true(t_log_contains("adapter 'legal' was made for model"));
	assert_true(t_log_contains("other.mpk"));
	assert_int_equal(mp_adapter_merge(fx.other, a, NULL, t_path("m.mpk")), -EMEDIUMTYPE);
	assert_int_equal(access(t_path("m.mpk"), F_OK), -1);
	mp_adapter_close(a);
}

/* merge(base, a) is the fine-tune; pack(base, fine-tune) gives a's experts back. */
static void merge_then_pack_round_trips(void **state)
{
	struct mp_adapter *a, *b;
	struct mp_store *m;
	uint8_t *x = malloc(fx.expert_bytes), *y = malloc(fx.expert_bytes);
	const struct mp_geometry *g = mp_store_geometry(fx.base);

	(void)state;
	write_adapter(t_path("a.mpa"), "legal");
	assert_int_equal(mp_adapter_open(t_path("a.mpa"), &a), 0);
	assert_int_equal(mp_adapter_merge(fx.base, a, "merged", t_path("m.mpk")), 0);
	assert_int_equal(mp_store_open(t_path("m.mpk"), &m), 0);
	assert_int_equal(mp_store_verify(m, NULL, 0, NULL, NULL), 0);
	for (uint32_t l = 0; l < g->layers; l++)
		for (uint32_t e = 0; e < g->experts; e++) {
			struct mp_store *src = picked(l, e) ? fx.other : fx.base;

			assert_int_equal(mp_store_read_expert(m, l, e, x), 0);
			assert_int_equal(mp_store_read_expert(src, l, e, y), 0);
			assert_memory_equal(x, y, fx.expert_bytes);
		}
	assert_int_equal(mp_adapter_pack(fx.base, m, "again", t_path("b.mpa")), (int)N_PICKS);
	assert_int_equal(mp_adapter_open(t_path("b.mpa"), &b), 0);
	assert_int_equal(mp_adapter_count(b), N_PICKS);
	for (size_t i = 0; i < N_PICKS; i++) {
		assert_int_equal(mp_adapter_read_expert(b, picks[i][0], picks[i][1], x), 0);
		assert_int_equal(mp_adapter_read_expert(a, picks[i][0], picks[i][1], y), 0);
		assert_memory_equal(x, y, fx.expert_bytes);
	}
	mp_adapter_close(b);
	mp_store_close(m);
	mp_adapter_close(a);
	free(x);
	free(y);
}

static void pack_refuses_a_fine_tune_of_more_than_experts(void **state)
{
	(void)state;
	t_log_reset();
	assert_int_equal(mp_adapter_pack(fx.base, fx.other, "x", t_path("x.mpa")), -EINVAL);
	assert_true(t_log_contains("changed more than experts"));
	assert_int_equal(mp_adapter_pack(fx.base, fx.base, "x", t_path("x.mpa")), -ENODATA);
	assert_int_equal(access(t_path("x.mpa"), F_OK), -1);
}

static void writer_refuses_bad_ids_duplicates_and_names(void **state)
{
	struct mp_adapter_writer *w;
	void *buf = calloc(1, fx.expert_bytes);
	const struct mp_geometry *g = mp_store_geometry(fx.base);
	char longname[MP_ADAPTER_NAME_MAX + 1];

	(void)state;
	memset(longname, 'n', MP_ADAPTER_NAME_MAX);
	longname[MP_ADAPTER_NAME_MAX] = 0;
	assert_int_equal(mp_adapter_writer_create(t_path("w.mpa"), fx.base, "", &w), -EINVAL);
	assert_int_equal(mp_adapter_writer_create(t_path("w.mpa"), fx.base, longname, &w),
			 -EINVAL);
	assert_int_equal(mp_adapter_writer_create(t_path("w.mpa"), fx.base, "w", &w), 0);
	assert_int_equal(mp_adapter_writer_put(w, g->layers, 0, buf), -ERANGE);
	assert_int_equal(mp_adapter_writer_put(w, 0, g->experts, buf), -ERANGE);
	assert_int_equal(mp_adapter_writer_put(w, 0, 2, buf), 0);
	assert_int_equal(mp_adapter_writer_put(w, 0, 2, buf), -EEXIST);
	mp_adapter_writer_abort(w);
	assert_int_equal(access(t_path("w.mpa"), F_OK), -1);
	/* An adapter that replaces nothing is refused and leaves no file. */
	assert_int_equal(mp_adapter_writer_create(t_path("w.mpa"), fx.base, "w", &w), 0);
	assert_int_equal(mp_adapter_writer_finish(w), -ENODATA);
	assert_int_equal(access(t_path("w.mpa"), F_OK), -1);
	free(buf);
}

/* Header field offsets (docs/mpa-format.md). */
#define OFF_VERSION	8
#define OFF_FILE_BYTES	16
#define OFF_TABLE_OFF	64
#define OFF_N_ENTRIES	72
#define OFF_TABLE_SUM	80
#define OFF_HEADER_SUM	4088

/* Rewrites the table and header checksums so only the field under test is wrong. */
static void reseal(const char *path)
{
	uint8_t *h = malloc(4096), *t;
	uint64_t table_off, sum;
	uint32_t n;

	t_read_at(path, h, 4096, 0);
	memcpy(&table_off, h + OFF_TABLE_OFF, 8);
	memcpy(&n, h + OFF_N_ENTRIES, 4);
	t = malloc((size_t)n * 64);
	t_read_at(path, t, (size_t)n * 64, table_off);
	sum = mp_checksum(t, (size_t)n * 64);
	memcpy(h + OFF_TABLE_SUM, &sum, 8);
	sum = mp_checksum(h, OFF_HEADER_SUM);
	memcpy(h + OFF_HEADER_SUM, &sum, 8);
	t_write_at(path, h, 4096, 0);
	free(t);
	free(h);
}

static uint64_t table_off(const char *path)
{
	uint64_t off;

	t_read_at(path, &off, 8, OFF_TABLE_OFF);
	return off;
}

struct damage {
	const char *what;
	int err;
	const char *message;
};

/* Opens path, expects err and a message containing msg. */
static void expect_refused(const char *path, const struct damage *d)
{
	struct mp_adapter *a = NULL;

	t_log_reset();
	assert_int_equal(mp_adapter_open(path, &a), d->err);
	assert_null(a);
	if (!t_log_contains(d->message))
		fail_msg("%s: the message does not say '%s'", d->what, d->message);
}

static void damaged_fields_are_refused_by_name(void **state)
{
	const char *p = t_path("d.mpa");
	uint32_t u32;
	uint64_t u64, toff;

	(void)state;
	write_adapter(p, "d");
	toff = table_off(p);

	assert_int_equal(t_flip_byte(p, 0), 0);
	expect_refused(p, &(struct damage){ "magic", -EPROTO, "not a moepager adapter" });

	write_adapter(p, "d");
	u32 = 9;
	t_write_at(p, &u32, 4, OFF_VERSION);
	expect_refused(p, &(struct damage){ "version", -EPROTONOSUPPORT, "unknown adapter version 9" });

	write_adapter(p, "d");
	assert_int_equal(t_flip_byte(p, 100), 0);
	expect_refused(p, &(struct damage){ "name byte", -EBADMSG, "header checksum mismatch" });

	write_adapter(p, "d");
	assert_int_equal(t_flip_byte(p, toff + 3), 0);
	expect_refused(p, &(struct damage){ "table byte", -EBADMSG, "table checksum mismatch" });

	write_adapter(p, "d");
	assert_int_equal(truncate(p, (off_t)toff), 0);
	expect_refused(p, &(struct damage){ "truncated", -ENODATA, "truncated" });

	write_adapter(p, "d");
	u64 = 4096 * 1000;
	t_write_at(p, &u64, 8, OFF_FILE_BYTES);
	reseal(p);
	expect_refused(p, &(struct damage){ "file_bytes", -ENODATA, "header says 4096000" });

	/* Entry 0 (layer 0 expert 1) named layer 99: out of the base. */
	write_adapter(p, "d");
	u32 = 99;
	t_write_at(p, &u32, 4, toff);
	reseal(p);
	expect_refused(p, &(struct damage){ "layer", -EINVAL, "names layer 99 expert 1" });

	/* Entry 1 (layer 0 expert 5) made expert 1 again: a duplicate, out of order. */
	write_adapter(p, "d");
	u32 = 1;
	t_write_at(p, &u32, 4, toff + 64 + 4);
	reseal(p);
	expect_refused(p, &(struct damage){ "order", -EINVAL, "is not after the one before it" });

	/* Entry 1 pointed at entry 0's bytes. */
	write_adapter(p, "d");
	t_read_at(p, &u64, 8, toff + 8);
	t_write_at(p, &u64, 8, toff + 64 + 8);
	reseal(p);
	expect_refused(p, &(struct damage){ "overlap", -EINVAL, "overlaps" });

	/* Entry 0 pointed into the table. */
	write_adapter(p, "d");
	t_write_at(p, &toff, 8, toff + 8);
	reseal(p);
	expect_refused(p, &(struct damage){ "extent", -EINVAL, "over the header or table" });

	/* An .mpk is not an adapter. */
	expect_refused(t_path("base.mpk"), &(struct damage){ "mpk", -EPROTO, "not a moepager adapter" });
}

static void damaged_expert_bytes_fail_verify_and_read(void **state)
{
	const char *p = t_path("e.mpa");
	struct mp_adapter *a;
	const struct mp_adapter_expert *e;
	void *buf = malloc(fx.expert_bytes);
	uint32_t n;

	(void)state;
	write_adapter(p, "e");
	assert_int_equal(mp_adapter_open(p, &a), 0);
	e = mp_adapter_layer(a, 1, &n);
	assert_int_equal(t_flip_byte(p, e[1].offset + 17), 0);
	assert_int_equal(mp_adapter_verify(a), 1);
	t_log_reset();
	assert_int_equal(mp_adapter_read_expert(a, 1, 3, buf), -EBADMSG);
	assert_true(t_log_contains("layer 1 expert 3: checksum mismatch"));
	assert_int_equal(mp_adapter_read_expert(a, 0, 1, buf), 0);
	mp_adapter_close(a);
	free(buf);
}

int main(void)
{
	static const struct CMUnitTest tests[] = {
		cmocka_unit_test(adapter_lists_its_experts_sorted_with_their_bytes),
		cmocka_unit_test(adapter_for_another_base_is_refused_naming_both),
		cmocka_unit_test(merge_then_pack_round_trips),
		cmocka_unit_test(pack_refuses_a_fine_tune_of_more_than_experts),
		cmocka_unit_test(writer_refuses_bad_ids_duplicates_and_names),
		cmocka_unit_test(damaged_fields_are_refused_by_name),
		cmocka_unit_test(damaged_expert_bytes_fail_verify_and_read),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
