// SPDX-License-Identifier: MIT
/* The file image: a GGUF file's bytes through a paged range, shared pages, budgets, bad files. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "store/gguf.h"

#define PG 4096u

/* A GGUF of the small model: experts in dtype, tensors aligned to align. */
static const char *small_gguf(enum mp_dtype dtype, uint32_t align)
{
	static char path[600];
	const char *mpk = t_path("small.mpk");
	struct mp_export_config cfg = { .dtype = -1, .dense_dtype = -1, .alignment = align };
	struct mp_store *s;

	assert_int_equal(t_gen_small(mpk, dtype, 11), 0);
	snprintf(path, sizeof(path), "%s", t_path("small.gguf"));
	assert_int_equal(mp_store_open(mpk, &s), 0);
	if (mp_gguf_export(s, path, &cfg))
		fail_msg("export: %s", mp_last_error());
	mp_store_close(s);
	return path;
}

static char *read_whole(const char *path, uint64_t *size)
{
	struct stat st;
	char *buf;

	assert_int_equal(stat(path, &st), 0);
	buf = malloc(st.st_size);
	assert_non_null(buf);
	t_read_at(path, buf, st.st_size, 0);
	*size = st.st_size;
	return buf;
}

static struct mp_image *open_image(const char *path, uint64_t budget, uint32_t prefetch)
{
	struct mp_image_config cfg = { .path = path, .budget_bytes = budget, .prefetch = prefetch };
	struct mp_image *img;
	int err = mp_image_open(&cfg, &img);

	if (err == -EPERM && !t_require_all()) {
		fprintf(stderr, "skip: no userfaultfd: %s\n", mp_last_error());
		exit(T_EXIT_SKIP);
	}
	if (err)
		fail_msg("mp_image_open %s: %s", path, mp_last_error());
	return img;
}

struct reader {
	const char *base, *file;
	struct gguf_file *g;
	uint32_t layers, experts;
	unsigned seed;
	int rounds;
	struct mp_image *img;
	uint64_t budget;
	int bad;
};

/* Compares random experts' three slices with the file's bytes, checking the budget each time. */
static void *read_experts(void *arg)
{
	struct reader *r = arg;
	static const char *const proj[3] = { "gate", "up", "down" };

	for (int i = 0; i < r->rounds; i++) {
		uint32_t L = rand_r(&r->seed) % r->layers, e = rand_r(&r->seed) % r->experts;
		struct mp_image_stats st;

		for (int k = 0; k < 3; k++) {
			char name[64];
			const struct gguf_tensor *t;
			uint64_t slice, off;

			snprintf(name, sizeof(name), "blk.%u.ffn_%s_exps.weight", L, proj[k]);
			t = gguf_find_tensor(r->g, name);
			slice = t->bytes / r->experts;
			off = t->off + e * slice;
			r->bad += memcmp(r->base + off, r->file + off, slice) != 0;
		}
		mp_image_stats(r->img, &st);
		r->bad += st.resident_bytes > r->budget;
	}
	return NULL;
}

/* Every byte through the range is the file's, experts read in any order by two threads. */
static void check_budget(const char *path, int which)
{
	uint64_t size, budget;
	char *file = read_whole(path, &size);
	struct mp_image_stats st;
	struct mp_image *img = open_image(path, 0, 0);
	struct reader r[2];
	pthread_t th[2];

	mp_image_stats(img, &st);
	mp_image_close(img);
	budget = which == 0 ? st.expert_max_bytes : which == 1 ? st.expert_bytes / 2 :
		 st.expert_bytes;
	img = open_image(path, budget, which == 1 ? 2 : 0);
	for (int i = 0; i < 2; i++) {
		r[i] = (struct reader){ .base = mp_image_base(img), .file = file,
					.layers = st.layers, .experts = st.experts, .seed = 7 + i,
					.rounds = 200, .img = img, .budget = budget };
		assert_int_equal(gguf_open(path, &r[i].g), 0);
		assert_int_equal(pthread_create(&th[i], NULL, read_experts, &r[i]), 0);
	}
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(r[i].bad, 0);
		gguf_close(r[i].g);
	}
	assert_memory_equal(mp_image_base(img), file, size);
	mp_image_stats(img, &st);
	assert_true(st.resident_peak <= budget);
	assert_true(st.fills >= st.layers * st.experts);
	if (which < 2)
		assert_true(st.evictions > 0);
	else
		assert_int_equal(st.evictions, 0);
	mp_image_close(img);
	free(file);
}

static void bytes_read_through_the_range_are_the_files_at_every_budget(void **state)
{
	static const enum mp_dtype types[] = { MP_DTYPE_F32, MP_DTYPE_Q8_0 };
	static const uint32_t aligns[] = { 32, 4096 };

	(void)state;
	for (size_t t = 0; t < 2; t++)
		for (size_t a = 0; a < 2; a++) {
			const char *path = small_gguf(types[t], aligns[a]);

			for (int which = 0; which < 3; which++)
				check_budget(path, which);
		}
}

/* Marks the pages that expert (L, e)'s three slices touch, fixed ones (in memory from open) aside. */
static void expert_pages(struct gguf_file *g, uint32_t L, uint32_t e, uint32_t experts,
			 const uint8_t *fixed, uint8_t *mark)
{
	static const char *const proj[3] = { "gate", "up", "down" };

	for (int k = 0; k < 3; k++) {
		char name[64];
		const struct gguf_tensor *t;
		uint64_t slice, off;

		snprintf(name, sizeof(name), "blk.%u.ffn_%s_exps.weight", L, proj[k]);
		t = gguf_find_tensor(g, name);
		slice = t->bytes / experts;
		off = t->off + e * slice;
		for (uint64_t p = off / PG; p * PG < off + slice; p++)
			mark[p] |= !(fixed[p] & 1);
	}
}

/* Which pages of the range are in memory (mincore). */
static void present(struct mp_image *img, uint8_t *vec)
{
	assert_int_equal(mincore((void *)mp_image_base(img), mp_image_bytes(img), vec), 0);
}

static uint64_t count(const uint8_t *a, const uint8_t *b, uint64_t n)
{
	uint64_t c = 0;

	for (uint64_t p = 0; p < n; p++)
		c += a[p] && (!b || b[p]);
	return c;
}

/* A page holding bytes of two neighbouring experts is charged once, and stays while one needs it. */
static void shared_pages_are_charged_once(void **state)
{
	const char *path = small_gguf(MP_DTYPE_Q8_0, 32);
	struct gguf_file *g;
	struct mp_image *img;
	struct mp_image_stats st;
	uint8_t *fixed, *one, *two, *now;
	uint64_t np, size;
	char *file = read_whole(path, &size);

	(void)state;
	assert_int_equal(gguf_open(path, &g), 0);
	np = (g->size + PG - 1) / PG;
	fixed = calloc(np, 1);
	one = calloc(np, 1);
	two = calloc(np, 1);
	now = calloc(np, 1);
	img = open_image(path, 0, 0);
	present(img, fixed);			/* the non-expert pages, filled at open */
	mp_image_stats(img, &st);
	assert_int_equal(count(fixed, NULL, np) * PG, st.fixed_bytes);
	expert_pages(g, 0, 0, st.experts, fixed, one);
	expert_pages(g, 0, 1, st.experts, fixed, two);
	/* the first two experts of layer 0 share pages (6528-byte q8_0 slices) */
	assert_true(count(one, two, np) > 0);
	assert_int_equal(mp_image_fetch(img, 0, 0), 0);
	mp_image_stats(img, &st);
	assert_int_equal(st.resident_bytes, count(one, NULL, np) * PG);
	assert_int_equal(mp_image_fetch(img, 0, 1), 0);
	mp_image_stats(img, &st);
	assert_int_equal(st.resident_bytes,
			 (count(one, NULL, np) + count(two, NULL, np) - count(one, two, np)) * PG);
	mp_image_close(img);
	/* room for one expert: reading the neighbour evicts the first but keeps the shared pages */
	img = open_image(path, st.expert_max_bytes, 0);
	assert_int_equal(mp_image_fetch(img, 0, 0), 0);
	assert_int_equal(mp_image_fetch(img, 0, 1), 0);
	present(img, now);
	for (uint64_t p = 0; p < np; p++)
		if ((now[p] & 1) != ((fixed[p] & 1) || two[p]))
			fail_msg("page %" PRIu64 ": in memory %d, fixed %d, of expert 1 %d", p,
				 now[p] & 1, fixed[p] & 1, two[p]);
	mp_image_stats(img, &st);
	assert_int_equal(st.resident_bytes, count(two, NULL, np) * PG);
	assert_int_equal(st.evictions, 1);
	assert_memory_equal(mp_image_base(img), file, size);
	assert_int_equal(mp_image_fetch(img, st.layers, 0), -ERANGE);
	mp_image_close(img);
	gguf_close(g);
	free(file);
	free(fixed);
	free(one);
	free(two);
	free(now);
}

/* Layer 0's expert e is always followed by layer 1's expert 3 - e: after learning, routing to
 * (0, e) reads (1, 3 - e) ahead, and routing to it finds it in memory. */
static void read_ahead_learns_the_order_of_use(void **state)
{
	const char *path = small_gguf(MP_DTYPE_F32, 4096);
	struct mp_image *img = open_image(path, 0, 0);
	struct mp_image_stats st;
	uint32_t e;

	(void)state;
	mp_image_stats(img, &st);
	mp_image_close(img);
	img = open_image(path, 3 * st.expert_max_bytes, 1);
	for (int round = 0; round < 3; round++)
		for (e = 0; e < 4; e++) {
			uint32_t next = 3 - e;

			assert_true(mp_image_route(img, 0, &e, 1) >= 0);
			assert_true(mp_image_route(img, 1, &next, 1) >= 0);
		}
	for (e = 0; e < 4; e++) {
		uint32_t next = 3 - e;

		assert_true(mp_image_route(img, 0, &e, 1) >= 0);
		/* the engine's work on layer 0 would run now: the read-ahead has its time */
		do {
			usleep(1000);
			mp_image_stats(img, &st);
		} while (st.prefetch_pending);
		usleep(1000);
		assert_int_equal(mp_image_route(img, 1, &next, 1), 1);
	}
	mp_image_stats(img, &st);
	assert_true(st.prefetches >= 4);
	assert_true(st.resident_peak <= st.budget_bytes);
	assert_int_equal(mp_image_route(img, 2, &e, 1), -ERANGE);
	mp_image_close(img);
}

static sigjmp_buf bus_jump;

static void on_bus(int sig)
{
	(void)sig;
	siglongjmp(bus_jump, 1);
}

/* The file shrinks under an open image: touching an expert past its end is SIGBUS, not a hang. */
static void an_expert_that_cannot_be_read_raises_sigbus(void **state)
{
	const char *path = small_gguf(MP_DTYPE_F32, 4096);
	struct sigaction sa = { .sa_handler = on_bus }, old;
	const struct gguf_tensor *t;
	struct gguf_file *g;
	struct mp_image *img;
	volatile int bus = 0;
	uint64_t slice;

	(void)state;
	assert_int_equal(gguf_open(path, &g), 0);
	t = gguf_find_tensor(g, "blk.1.ffn_down_exps.weight");
	slice = t->bytes / 4;
	img = open_image(path, 0, 0);
	assert_int_equal(truncate(path, t->off), 0);
	t_log_reset();
	assert_int_equal(sigaction(SIGBUS, &sa, &old), 0);
	if (!sigsetjmp(bus_jump, 1))
		(void)*(volatile const char *)((const char *)mp_image_base(img) + t->off + slice);
	else
		bus = 1;
	sigaction(SIGBUS, &old, NULL);
	assert_true(bus);
	assert_true(t_log_contains("expert 1 of layer 1 not read"));
	mp_image_close(img);
	gguf_close(g);
}

static void refused(const char *path, uint64_t budget, int want, const char *says)
{
	struct mp_image_config cfg = { .path = path, .budget_bytes = budget };
	struct mp_image *img = (void *)1;
	int err;

	t_log_reset();
	err = mp_image_open(&cfg, &img);
	if (err != want)
		fail_msg("%s: %d, want %d (%s)", path, err, want, mp_last_error());
	assert_null(img);
	if (!t_log_contains(says))
		fail_msg("%s: the error '%s' does not say '%s'", path, mp_last_error(), says);
}

/* A GGUF without expert tensors. */
static const char *dense_gguf(void)
{
	const char *path = t_path("dense.gguf");
	static const float row[32];
	const uint64_t ne[1] = { 32 };
	struct gguf_writer *w;
	int t;

	assert_int_equal(gguf_writer_create(path, 32, &w), 0);
	assert_int_equal(gguf_writer_str(w, "general.architecture", "llama"), 0);
	t = gguf_writer_tensor(w, "output_norm.weight", GGML_F32, 1, ne);
	assert_true(t >= 0);
	assert_int_equal(gguf_writer_begin_data(w), 0);
	assert_int_equal(gguf_writer_data(w, t, 0, row, sizeof(row)), 0);
	assert_int_equal(gguf_writer_finish(w), 0);
	return path;
}

static void bad_or_truncated_file_is_refused_with_a_clear_error(void **state)
{
	const char *path = small_gguf(MP_DTYPE_F32, 32), *cut = t_path("cut.gguf");
	uint64_t size;
	char *file = read_whole(path, &size);
	FILE *f = fopen(cut, "wb");

	(void)state;
	assert_non_null(f);
	assert_int_equal(fwrite(file, 1, size - 100, f), size - 100);
	fclose(f);
	refused(cut, 0, -ENODATA, "runs past the end of the file");
	f = fopen(cut, "wb");
	assert_int_equal(fwrite("GGUF\x02\0\0\0", 1, 8, f), 8);
	fclose(f);
	refused(cut, 0, -EPROTONOSUPPORT, "cut.gguf");
	refused(path, 4096, -EINVAL, "below one expert");
	refused(dense_gguf(), 0, -EINVAL, "not a MoE model");
	refused(t_path("absent.gguf"), 0, -ENOENT, "absent.gguf");
	free(file);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(bytes_read_through_the_range_are_the_files_at_every_budget),
		cmocka_unit_test(shared_pages_are_charged_once),
		cmocka_unit_test(read_ahead_learns_the_order_of_use),
		cmocka_unit_test(an_expert_that_cannot_be_read_raises_sigbus),
		cmocka_unit_test(bad_or_truncated_file_is_refused_with_a_clear_error),
	};

	return cmocka_run_group_tests(tests, t_group_log_capture, t_group_tmpdir_cleanup);
}
