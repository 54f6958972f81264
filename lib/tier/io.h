/* SPDX-License-Identifier: MIT */
/* io_uring reads for the tiers: the one place that owns an io_uring ring. */
#ifndef MP_IO_H
#define MP_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* One ring; used by one thread at a time (each fill worker owns one). */
struct mp_io;

/* Creates a ring for up to depth requests in flight. Returns 0 or -errno. */
int mp_io_open(uint32_t depth, struct mp_io **out);
void mp_io_close(struct mp_io *io);
uint32_t mp_io_depth(const struct mp_io *io);

/*
 * Called in order as the data grows: buf..buf+len are the next bytes, now
 * complete, while later requests are still in flight (hash them here).
 * A nonzero return aborts the read with that value.
 */
typedef int (*mp_io_ready_fn)(void *arg, const void *buf, size_t len);

struct mp_io_read {
	int fd;
	uint64_t offset;		/* file offset of the first byte */
	uint64_t len;			/* bytes wanted */
	const struct iovec *iov;	/* destination, in order: len rounded up to align */
	unsigned iovcnt;
	uint32_t request_bytes;		/* bytes per request (split at segment ends) */
	uint32_t align;			/* O_DIRECT block size, or 1 for a buffered fd */
	mp_io_ready_fn ready;		/* may be NULL */
	void *arg;
	const char *what;		/* names the data in messages ("layer 3 expert 5") */
	const char *path;		/* names the file in messages */
	/*
	 * May be NULL. While it returns true, one request stays in flight
	 * rather than the ring's depth: a read that can wait (a prefetch)
	 * leaves the device to one that cannot (a demand read).
	 */
	bool (*yield)(void *arg);
	void *yield_arg;
	/*
	 * May be NULL. Called once, on the reading thread, as soon as the first
	 * requests are in flight (before any byte is handed to ready): the
	 * caller's work that can overlap the device goes there. A nonzero
	 * return aborts the read with that value.
	 */
	int (*issued)(void *arg);
	void *issued_arg;
};

/*
 * Reads rd->len bytes with up to the ring's depth of requests in flight.
 * Requests that come back short are continued (an O_DIRECT one that ends
 * off the block size is finished with a buffered pread); -EAGAIN/-EINTR
 * completions are resubmitted. Returns 0, -ENODATA when the file ends
 * first, the first failed request's -errno (-EIO, ...), or what ready
 * returned. Never returns with a request in flight.
 */
int mp_io_read(struct mp_io *io, const struct mp_io_read *rd);

/*
 * For tests, from a ready callback: the read's requests in flight (issued,
 * completion not yet accounted) and those not issued yet.
 */
void mp_io_queue_state(const struct mp_io *io, uint32_t *inflight, uint32_t *unissued);

#endif /* MP_IO_H */
