// SPDX-License-Identifier: MIT
/* t_ helpers shared by the cmocka tests. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

static char tmpdir[256];
static char logbuf[65536];
static size_t loglen;
/* The library logs from its worker threads too. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * Line-buffered output in every test: meson kills a test that outlives its
 * timeout, and a fully buffered stdout would lose the "[ RUN ]" line that
 * names the case that hung.
 */
__attribute__((constructor)) static void t_line_buffered(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
}

void t_test_filter(void)
{
	const char *f = getenv("T_FILTER");

	if (f && *f)
		cmocka_set_test_filter(f);
}

int t_require_all(void)
{
	const char *v = getenv("MOEPAGER_REQUIRE_BPF");

	return (v && *v && *v != '0') || getenv("CI") != NULL;
}

const char *t_tmpdir(void)
{
	if (!tmpdir[0]) {
		const char *base = getenv("TMPDIR");

		snprintf(tmpdir, sizeof(tmpdir), "%s/mptest.XXXXXX", base ? base : "/tmp");
		if (!mkdtemp(tmpdir)) {
			perror("mkdtemp");
			abort();
		}
	}
	return tmpdir;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb; (void)flag; (void)ftw;
	return remove(path);
}

void t_tmpdir_cleanup(void)
{
	if (tmpdir[0])
		nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	tmpdir[0] = 0;
}

const char *t_path(const char *name)
{
	static char bufs[4][512];
	static unsigned slot;
	char *b = bufs[slot++ % 4];

	snprintf(b, 512, "%s/%s", t_tmpdir(), name);
	return b;
}

static void capture(enum mp_log_level level, const char *msg, void *arg)
{
	int n;

	(void)level; (void)arg;
	pthread_mutex_lock(&log_lock);
	n = snprintf(logbuf + loglen, sizeof(logbuf) - loglen, "%s\n", msg);
	if (n > 0 && loglen + (size_t)n < sizeof(logbuf))
		loglen += (size_t)n;
	pthread_mutex_unlock(&log_lock);
	if (getenv("T_VERBOSE"))
		fprintf(stderr, "log: %s\n", msg);
}

void t_log_capture(void)
{
	mp_set_log_handler(capture, NULL);
}

int t_group_log_capture(void **state)
{
	(void)state;
	t_log_capture();
	return 0;
}

int t_group_tmpdir_cleanup(void **state)
{
	(void)state;
	t_tmpdir_cleanup();
	return 0;
}

void t_log_reset(void)
{
	pthread_mutex_lock(&log_lock);
	loglen = 0;
	logbuf[0] = 0;
	pthread_mutex_unlock(&log_lock);
}

int t_log_contains(const char *needle)
{
	int found;

	pthread_mutex_lock(&log_lock);
	found = strstr(logbuf, needle) != NULL;
	pthread_mutex_unlock(&log_lock);
	return found;
}

int t_gen_tiny(const char *path, enum mp_dtype dtype, uint64_t seed)
{
	struct mp_geometry g;
	int err = mp_gen_preset("tiny", &g);

	if (err)
		return err;
	g.dtype = dtype;
	return mp_gen_model(path, &g, seed, "tiny", NULL, NULL);
}

void t_read_at(const char *path, void *buf, size_t len, uint64_t off)
{
	int fd = open(path, O_RDONLY);

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, buf, len, (off_t)off), (ssize_t)len);
	close(fd);
}

void t_write_at(const char *path, const void *buf, size_t len, uint64_t off)
{
	int fd = open(path, O_WRONLY);

	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, buf, len, (off_t)off), (ssize_t)len);
	close(fd);
}

int t_gen_small(const char *path, enum mp_dtype dtype, uint64_t seed)
{
	struct mp_geometry g = {
		.layers = 2, .experts = 4, .topk = 2, .hidden = 64, .ffn = 96, .heads = 4,
		.kv_heads = 2, .head_dim = 16, .vocab = 300, .max_seq = 128, .dtype = dtype,
		.rope_theta = 10000.0f, .norm_eps = 1e-5f,
	};

	unlink(path);
	return mp_gen_model(path, &g, seed, "small", NULL, NULL);
}

void t_assert_same_model(const char *a, const char *b)
{
	struct mp_store *x, *y;
	const struct mp_geometry *g;

	assert_int_equal(mp_store_open(a, &x), 0);
	assert_int_equal(mp_store_open(b, &y), 0);
	g = mp_store_geometry(x);
	assert_memory_equal(g, mp_store_geometry(y), sizeof(*g));
	for (uint32_t i = 0; i < mp_store_tensor_count(x); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(x, i);

		if (t->checksum != mp_store_tensor(y, t->name)->checksum)
			fail_msg("%s and %s: tensor %s differs", a, b, t->name);
	}
	for (uint32_t l = 0; l < g->layers; l++)
		for (uint32_t e = 0; e < g->experts; e++)
			if (mp_store_expert(x, l, e)->checksum != mp_store_expert(y, l, e)->checksum)
				fail_msg("%s and %s: layer %u expert %u differs", a, b, l, e);
	mp_store_close(x);
	mp_store_close(y);
}

int t_flip_byte(const char *path, uint64_t off)
{
	int fd = open(path, O_RDWR);
	unsigned char c;
	int ret = -1;

	if (fd < 0)
		return -errno;
	if (pread(fd, &c, 1, (off_t)off) != 1)
		goto out;
	c ^= 0xff;
	if (pwrite(fd, &c, 1, (off_t)off) != 1)
		goto out;
	ret = 0;
out:
	close(fd);
	return ret;
}

int t_write_adapter(const char *path, struct mp_store *base, struct mp_store *from,
		    const uint32_t (*picks)[2], size_t n, const char *name)
{
	struct mp_adapter_writer *w = NULL;
	void *buf = malloc(mp_store_expert_bytes(base));
	int err = buf ? mp_adapter_writer_create(path, base, name, &w) : -ENOMEM;

	for (size_t i = 0; i < n && !err; i++) {
		err = mp_store_read_expert(from, picks[i][0], picks[i][1], buf);
		if (!err)
			err = mp_adapter_writer_put(w, picks[i][0], picks[i][1], buf);
	}
	if (!err)
		err = mp_adapter_writer_finish(w);
	else
		mp_adapter_writer_abort(w);
	free(buf);
	return err;
}
