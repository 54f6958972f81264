// SPDX-License-Identifier: MIT
/* Description: io_uring reads of lib/tier/io.c: in-order delivery, O_DIRECT tails, EOF, errors; the checksum hash; the log level gate. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "helpers.h"
#include "base/base.h"
#include "base/hash.h"
#include "tier/io.h"

#define FILE_BYTES	((3u << 20) + 1000)	/* ends off a block */

static struct mp_io *io;
static uint8_t *content;

struct delivery {
	const uint8_t *dst;	/* where the segments start when contiguous */
	uint64_t got;
	int calls;
	int out_of_order;
	int abort_at;		/* call number that returns -ECANCELED, 0: never */
};

static int ready(void *arg, const void *buf, size_t len)
{
	struct delivery *d = arg;

	if (d->dst && (const uint8_t *)buf != d->dst + d->got)
		d->out_of_order++;
	d->got += len;
	if (++d->calls == d->abort_at)
		return -ECANCELED;
	return 0;
}

static int setup(void **state)
{
	int fd;

	(void)state;
	t_log_capture();
	content = malloc(FILE_BYTES);
	for (uint32_t i = 0; i < FILE_BYTES; i++)
		content[i] = (uint8_t)(i * 2654435761u >> 13);
	fd = open(t_path("data"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, content, FILE_BYTES), FILE_BYTES);
	close(fd);
	if (mp_io_open(8, &io)) {
		print_message("io_uring unavailable: %s\n", mp_last_error());
		exit(t_require_all() ? 1 : T_EXIT_SKIP);
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	mp_io_close(io);
	free(content);
	t_tmpdir_cleanup();
	return 0;
}

/* A page-aligned destination with room for len rounded up to 4 KiB. */
static uint8_t *dest(uint64_t len)
{
	uint8_t *p = mmap(NULL, MP_ALIGN_UP(len, 4096), PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	assert_true(p != MAP_FAILED);
	memset(p, 0xee, MP_ALIGN_UP(len, 4096));
	return p;
}

static void direct_read_delivers_every_byte_in_order(void **state)
{
	uint64_t len = FILE_BYTES - 4096;	/* the last block is read past the data, to EOF */
	uint8_t *buf = dest(len);
	struct iovec iov[2] = { { buf, 1u << 20 }, { buf + (1u << 20), MP_ALIGN_UP(len, 4096) -
						       (1u << 20) } };
	struct delivery d = { .dst = buf };
	int fd = open(t_path("data"), O_RDONLY | O_DIRECT);
	struct mp_io_read rd = {
		.fd = fd, .offset = 4096, .len = len, .iov = iov, .iovcnt = 2,
		.request_bytes = 64u << 10, .align = 4096, .ready = ready, .arg = &d,
		.what = "test", .path = "data",
	};

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(mp_io_read(io, &rd), 0);
	assert_int_equal(d.got, len);
	assert_int_equal(d.out_of_order, 0);
	assert_true(d.calls >= 48);	/* 64 KiB requests, delivered as they complete */
	assert_memory_equal(buf, content + 4096, len);
	close(fd);
	munmap(buf, MP_ALIGN_UP(len, 4096));
}

struct yielder {
	int calls;
	int until;		/* yield for this many calls, then let the read run at depth */
};

static bool yield_for_a_while(void *arg)
{
	struct yielder *y = arg;

	return y->calls++ < y->until;
}

/*
 * A read that yields (one request in flight) for a while, then runs at depth,
 * delivers the same bytes in order, asking before every submission round.
 */
static void yielding_read_delivers_every_byte_in_order(void **state)
{
	uint64_t len = 2u << 20;
	uint8_t *buf = dest(len);
	struct iovec iov = { buf, len };
	int fd = open(t_path("data"), O_RDONLY | O_DIRECT);

	(void)state;
	assert_true(fd >= 0);
	for (int until = 0; until <= 1000; until += 1000) {	/* never; then all along */
		struct delivery d = { .dst = buf };
		struct yielder y = { .until = until };
		struct mp_io_read rd = {
			.fd = fd, .offset = 0, .len = len, .iov = &iov, .iovcnt = 1,
			.request_bytes = 64u << 10, .align = 4096, .ready = ready, .arg = &d,
			.what = "test", .path = "data", .yield = yield_for_a_while,
			.yield_arg = &y,
		};

		memset(buf, 0xee, len);
		assert_int_equal(mp_io_read(io, &rd), 0);
		assert_int_equal(d.got, len);
		assert_int_equal(d.out_of_order, 0);
		assert_memory_equal(buf, content, len);
		if (until) {
			/* 32 requests of 64 KiB, each submitted in a round of its own. */
			assert_true(y.calls >= 32);
			assert_int_equal(d.calls, 32);
		}
	}
	close(fd);
	munmap(buf, len);
}

struct slow_hash {
	struct delivery d;
	int calls_short;	/* calls that found the ring below depth with requests waiting */
};

/* A hash slower than the device: the ring must stay full meanwhile. */
static int slow_ready(void *arg, const void *buf, size_t len)
{
	struct slow_hash *h = arg;
	struct timespec ts = { 0, 300 * 1000 };
	uint32_t inflight, unissued;

	mp_io_queue_state(io, &inflight, &unissued);
	if (unissued && inflight < mp_io_depth(io))
		h->calls_short++;
	nanosleep(&ts, NULL);
	return ready(&h->d, buf, len);
}

/*
 * While the caller hashes one request's bytes, the requests that completed
 * meanwhile are issued again: the device never waits for the hash.
 */
static void ring_stays_full_while_the_caller_hashes(void **state)
{
	uint64_t len = 3u << 20;
	uint8_t *buf = dest(len);
	struct iovec iov = { buf, len };
	struct slow_hash h = { .d = { .dst = buf } };
	int fd = open(t_path("data"), O_RDONLY | O_DIRECT);
	struct mp_io_read rd = {
		.fd = fd, .offset = 0, .len = len, .iov = &iov, .iovcnt = 1,
		.request_bytes = 32u << 10, .align = 4096, .ready = slow_ready, .arg = &h,
		.what = "test", .path = "data",
	};

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(mp_io_read(io, &rd), 0);
	assert_int_equal(h.d.got, len);
	assert_int_equal(h.d.out_of_order, 0);
	assert_int_equal(h.d.calls, 96);
	assert_int_equal(h.calls_short, 0);
	assert_memory_equal(buf, content, len);
	close(fd);
	munmap(buf, len);
}

static void buffered_read_of_odd_length_is_exact(void **state)
{
	uint64_t len = 12345;
	uint8_t *buf = dest(len);
	struct iovec iov = { buf, MP_ALIGN_UP(len, 4096) };
	struct delivery d = { .dst = buf };
	int fd = open(t_path("data"), O_RDONLY);
	struct mp_io_read rd = {
		.fd = fd, .offset = 777, .len = len, .iov = &iov, .iovcnt = 1,
		.request_bytes = 4096, .align = 1, .ready = ready, .arg = &d,
		.what = "test", .path = "data",
	};

	(void)state;
	assert_int_equal(mp_io_read(io, &rd), 0);
	assert_int_equal(d.got, len);
	assert_memory_equal(buf, content + 777, len);
	/* Nothing written past the data. */
	assert_int_equal(buf[len], 0xee);
	close(fd);
	munmap(buf, 16384);
}

static void file_ending_inside_the_data_is_enodata(void **state)
{
	uint64_t len = 1u << 20;
	uint8_t *buf = dest(len);
	struct iovec iov = { buf, len };
	struct delivery d = { .dst = buf };
	int fd = open(t_path("data"), O_RDONLY);
	struct mp_io_read rd = {
		.fd = fd, .offset = FILE_BYTES - 5000, .len = len, .iov = &iov, .iovcnt = 1,
		.request_bytes = 256u << 10, .align = 1, .ready = ready, .arg = &d,
		.what = "layer 9 expert 9", .path = "data",
	};

	(void)state;
	t_log_reset();
	assert_int_equal(mp_io_read(io, &rd), -ENODATA);
	assert_true(t_log_contains("layer 9 expert 9: data: file ends at offset"));
	/* The ring is clean: the next read works. */
	rd.offset = 0;
	d = (struct delivery){ .dst = buf };
	assert_int_equal(mp_io_read(io, &rd), 0);
	assert_memory_equal(buf, content, len);
	close(fd);
	munmap(buf, len);
}

static void ready_abort_stops_the_read_with_its_value(void **state)
{
	uint64_t len = 2u << 20;
	uint8_t *buf = dest(len);
	struct iovec iov = { buf, len };
	struct delivery d = { .dst = buf, .abort_at = 3 };
	int fd = open(t_path("data"), O_RDONLY | O_DIRECT);
	struct mp_io_read rd = {
		.fd = fd, .offset = 0, .len = len, .iov = &iov, .iovcnt = 1,
		.request_bytes = 128u << 10, .align = 4096, .ready = ready, .arg = &d,
		.what = "test", .path = "data",
	};

	(void)state;
	assert_int_equal(mp_io_read(io, &rd), -ECANCELED);
	assert_int_equal(d.calls, 3);
	close(fd);
	munmap(buf, len);
}

static void bad_fd_fails_with_its_errno_and_a_message(void **state)
{
	uint8_t *buf = dest(4096);
	struct iovec iov = { buf, 4096 };
	struct mp_io_read rd = {
		.fd = 12345, .offset = 0, .len = 4096, .iov = &iov, .iovcnt = 1,
		.request_bytes = 4096, .align = 1, .what = "layer 1 expert 2", .path = "gone",
	};

	(void)state;
	t_log_reset();
	assert_int_equal(mp_io_read(io, &rd), -EBADF);
	assert_true(t_log_contains("layer 1 expert 2: gone: read of 4096 bytes at offset 0"));
	munmap(buf, 4096);
}

static void short_destination_is_refused(void **state)
{
	uint8_t *buf = dest(4096);
	struct iovec iov = { buf, 4096 };
	struct mp_io_read rd = {
		.fd = 0, .offset = 0, .len = 8192, .iov = &iov, .iovcnt = 1,
		.request_bytes = 4096, .align = 4096, .what = "test", .path = "x",
	};

	(void)state;
	assert_int_equal(mp_io_read(io, &rd), -EINVAL);
	rd.len = 100;
	rd.align = 3;
	assert_int_equal(mp_io_read(io, &rd), -EINVAL);
	munmap(buf, 4096);
}

/* The streaming hash the fills verify with gives libxxhash's one-shot XXH3 however it is fed. */
static void hash_build_matches_xxh3_in_any_pieces(struct mp_hash *h)
{
	static const size_t lens[] = { 0, 1, 63, 64, 65, 240, 241, 1000, 4096, 65537,
				       FILE_BYTES - 3 };
	static const size_t pieces[] = { 1, 7, 64, 4096, 524288 };

	assert_non_null(h);
	for (size_t i = 0; i < MP_ARRAY_SIZE(lens); i++) {
		uint64_t want = XXH3_64bits(content + 3, lens[i]);

		for (size_t j = 0; j < MP_ARRAY_SIZE(pieces); j++) {
			size_t step = lens[i] > 100000 && pieces[j] < 64 ? 65521 : pieces[j];

			mp_hash_reset(h);
			for (size_t o = 0; o < lens[i]; o += step)
				mp_hash_update(h, content + 3 + o, MP_MIN(step, lens[i] - o));
			assert_int_equal(mp_hash_digest(h), want);
		}
	}
	/* A different byte gives a different digest. */
	mp_hash_reset(h);
	mp_hash_update(h, content, 4096);
	content[100] ^= 1;
	assert_int_not_equal(mp_hash_digest(h), XXH3_64bits(content, 4096));
	content[100] ^= 1;
	mp_hash_free(h);
}

/* Every build the library has for this CPU, and the one it picks: x86-64 with AVX2 gets it. */
static void hash_matches_xxh3_in_any_pieces(void **state)
{
	struct mp_hash *best = mp_hash_new();
	bool avx2 = false;

	(void)state;
#if defined(__x86_64__)
	avx2 = __builtin_cpu_supports("avx2");
#endif
	assert_non_null(best);
	assert_string_equal(mp_hash_build_name(best), avx2 ? "avx2" : "lib");
	print_message("hash builds: lib%s\n", avx2 ? ", avx2 (picked)" : "");
	hash_build_matches_xxh3_in_any_pieces(best);
	hash_build_matches_xxh3_in_any_pieces(mp_hash_new_build(MP_HASH_LIB));
	if (avx2)
		hash_build_matches_xxh3_in_any_pieces(mp_hash_new_build(MP_HASH_AVX2));
	else
		assert_null(mp_hash_new_build(MP_HASH_AVX2));
}

static int lines_at[MP_LOG_DEBUG + 1];

static void count_lines(enum mp_log_level level, const char *msg, void *arg)
{
	(void)msg; (void)arg;
	lines_at[level]++;
}

/* The fill path's debug lines are not even formatted when the handler takes warnings only. */
static void log_lines_past_the_level_are_dropped_and_errors_kept(void **state)
{
	(void)state;
	memset(lines_at, 0, sizeof(lines_at));
	mp_set_log_handler(count_lines, NULL);
	mp_set_log_level(MP_LOG_WARN);
	mp_debug("debug %d", 1);
	mp_info("info %d", 2);
	mp_warn("warn %d", 3);
	assert_int_equal(lines_at[MP_LOG_DEBUG], 0);
	assert_int_equal(lines_at[MP_LOG_INFO], 0);
	assert_int_equal(lines_at[MP_LOG_WARN], 1);
	/* Errors reach the handler and mp_last_error() whatever the level, or no handler. */
	mp_set_log_level(MP_LOG_ERROR);
	mp_warn("warn %d", 4);
	assert_int_equal(mp_err(-EIO, "error %d", 5), -EIO);
	assert_int_equal(lines_at[MP_LOG_WARN], 1);
	assert_int_equal(lines_at[MP_LOG_ERROR], 1);
	assert_string_equal(mp_last_error(), "error 5");
	mp_set_log_handler(NULL, NULL);
	mp_err(-EIO, "error %d", 6);
	assert_string_equal(mp_last_error(), "error 6");
	/* Back to every line. */
	mp_set_log_level(MP_LOG_DEBUG);
	mp_set_log_handler(count_lines, NULL);
	mp_debug("debug %d", 7);
	assert_int_equal(lines_at[MP_LOG_DEBUG], 1);
	t_log_capture();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(direct_read_delivers_every_byte_in_order),
		cmocka_unit_test(yielding_read_delivers_every_byte_in_order),
		cmocka_unit_test(ring_stays_full_while_the_caller_hashes),
		cmocka_unit_test(buffered_read_of_odd_length_is_exact),
		cmocka_unit_test(file_ending_inside_the_data_is_enodata),
		cmocka_unit_test(ready_abort_stops_the_read_with_its_value),
		cmocka_unit_test(bad_fd_fails_with_its_errno_and_a_message),
		cmocka_unit_test(short_destination_is_refused),
		cmocka_unit_test(hash_matches_xxh3_in_any_pieces),
		cmocka_unit_test(log_lines_past_the_level_are_dropped_and_errors_kept),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
