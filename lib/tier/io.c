// SPDX-License-Identifier: MIT
/* io_uring reads split into requests kept in flight, delivered in order for hashing. */
#include <errno.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "tier/io.h"

/* Where one mp_io_read() stands. */
struct run {
	uint32_t nreq;		/* requests planned */
	uint32_t next;		/* first request never issued */
	uint32_t inflight;
	uint32_t prefix;	/* requests handed over in order */
	uint32_t nresubmit;
	bool told;		/* rd->issued was called */
	int err;		/* the first failure: drain, issue nothing more */
};

struct mp_io {
	struct io_uring ring;
	uint32_t depth;
	struct req *reqs;	/* reused across reads */
	uint32_t cap;
	uint32_t *resubmit;	/* stack of requests to issue again */
	struct run run;		/* the read in progress */
};

enum req_state { REQ_NEW, REQ_INFLIGHT, REQ_DONE };

struct req {
	uint64_t off;		/* file offset */
	char *buf;
	uint32_t len;		/* bytes this request covers (block-rounded) */
	uint32_t done;		/* bytes transferred so far */
	uint32_t want;		/* bytes of it that are data (the rest is rounding) */
	uint8_t state;
};

int mp_io_open(uint32_t depth, struct mp_io **out)
{
	struct io_uring_params p;
	struct mp_io *io;
	int err;

	*out = NULL;
	if (!depth || depth > 4096)
		return mp_err(-EINVAL, "io: queue depth %u out of range [1, 4096]", depth);
	io = calloc(1, sizeof(*io));
	if (!io)
		return -ENOMEM;
	memset(&p, 0, sizeof(p));
	/*
	 * Completions are reaped by the submitting thread only: no IPI needed
	 * to run them; the flag tells it when they wait for it (while it hashes).
	 */
	p.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
	err = io_uring_queue_init_params(depth, &io->ring, &p);
	if (err == -EINVAL) {
		memset(&p, 0, sizeof(p));
		err = io_uring_queue_init_params(depth, &io->ring, &p);
	}
	if (err) {
		free(io);
		return mp_err(err, "io: io_uring_queue_init(%u): %s%s", depth, strerror(-err),
			      err == -EPERM ? " (kernel.io_uring_disabled?)" : "");
	}
	io->depth = depth;
	*out = io;
	return 0;
}

void mp_io_close(struct mp_io *io)
{
	if (!io)
		return;
	io_uring_queue_exit(&io->ring);
	free(io->reqs);
	free(io->resubmit);
	free(io);
}

uint32_t mp_io_depth(const struct mp_io *io)
{
	return io->depth;
}

/* Splits the destination into requests of at most request_bytes, never across a segment. */
static int plan(struct mp_io *io, const struct mp_io_read *rd, uint32_t *nreq)
{
	uint64_t total = MP_ALIGN_UP(rd->len, rd->align), pos = 0;
	uint32_t n = 0, rb = MP_MAX(rd->request_bytes, rd->align);

	rb -= rb % rd->align;
	for (unsigned s = 0; s < rd->iovcnt && pos < total; s++) {
		uint64_t seg = MP_MIN((uint64_t)rd->iov[s].iov_len, total - pos), o = 0;

		if (seg % rd->align && pos + seg < total)
			return mp_err(-EINVAL, "io: %s: segment %u length %zu not a multiple of %u",
				      rd->what, s, rd->iov[s].iov_len, rd->align);
		while (o < seg) {
			uint32_t len = (uint32_t)MP_MIN((uint64_t)rb, seg - o);

			if (n == io->cap) {
				uint32_t cap = io->cap ? io->cap * 2 : 64;
				struct req *r = realloc(io->reqs, cap * sizeof(*r));
				uint32_t *rs = realloc(io->resubmit, cap * sizeof(*rs));

				if (r)
					io->reqs = r;
				if (rs)
					io->resubmit = rs;
				if (!r || !rs)
					return -ENOMEM;
				io->cap = cap;
			}
			io->reqs[n] = (struct req){
				.off = rd->offset + pos + o,
				.buf = (char *)rd->iov[s].iov_base + o,
				.len = len,
				.want = (uint32_t)MP_MIN((uint64_t)len, rd->len > pos + o ?
							 rd->len - pos - o : 0),
			};
			n++;
			o += len;
		}
		pos += seg;
	}
	if (pos < total)
		return mp_err(-EINVAL, "io: %s: destination holds %llu of %llu bytes", rd->what,
			      (unsigned long long)pos, (unsigned long long)total);
	*nreq = n;
	return 0;
}

/* Finishes a request with buffered preads (an O_DIRECT transfer that ended off a block). */
static int finish_buffered(const struct mp_io_read *rd, struct req *q)
{
	while (q->done < q->want) {
		ssize_t n = pread(rd->fd, q->buf + q->done, q->want - q->done,
				  (off_t)(q->off + q->done));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return mp_err(-errno, "io: %s: %s: pread at offset %llu: %s", rd->what,
				      rd->path, (unsigned long long)(q->off + q->done),
				      strerror(errno));
		}
		if (n == 0)
			return mp_err(-ENODATA, "io: %s: %s: file ends at offset %llu",
				      rd->what, rd->path, (unsigned long long)(q->off + q->done));
		q->done += (uint32_t)n;
	}
	q->state = REQ_DONE;
	return 0;
}

/*
 * Accounts one completion. Returns 0, or the request's error. A short
 * transfer is queued for resubmission of the rest, or finished buffered.
 */
static int complete(struct mp_io *io, const struct mp_io_read *rd, struct req *q, int res,
		    uint32_t *nresubmit)
{
	if (res == -EAGAIN || res == -EINTR) {
		/* The block layer had no room, or a signal: transient, issue it again. */
		q->state = REQ_NEW;
		io->resubmit[(*nresubmit)++] = (uint32_t)(q - io->reqs);
		return 0;
	}
	if (res < 0)
		return mp_err(res, "io: %s: %s: read of %u bytes at offset %llu: %s", rd->what,
			      rd->path, q->len - q->done, (unsigned long long)(q->off + q->done),
			      strerror(-res));
	if (res == 0) {
		/* End of file: fine past the data (block rounding), fatal inside it. */
		if (q->done >= q->want) {
			q->state = REQ_DONE;
			return 0;
		}
		return mp_err(-ENODATA, "io: %s: %s: file ends at offset %llu, inside the data",
			      rd->what, rd->path, (unsigned long long)(q->off + q->done));
	}
	q->done += (uint32_t)res;
	if (q->done >= q->want) {
		/* Whatever is missing past want is block rounding beyond the data. */
		q->state = REQ_DONE;
		return 0;
	}
	if (q->done % rd->align)
		return finish_buffered(rd, q);
	q->state = REQ_NEW;
	io->resubmit[(*nresubmit)++] = (uint32_t)(q - io->reqs);
	return 0;
}

/* Keeps the ring's depth of requests in flight (one while the read yields). */
static void issue(struct mp_io *io, const struct mp_io_read *rd)
{
	struct run *run = &io->run;
	uint32_t depth = rd->yield && rd->yield(rd->yield_arg) ? 1 : io->depth;
	int ret;

	while (!run->err && run->inflight < depth && (run->nresubmit || run->next < run->nreq) &&
	       io_uring_sq_space_left(&io->ring)) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
		uint32_t i = run->nresubmit ? io->resubmit[--run->nresubmit] : run->next++;
		struct req *q = &io->reqs[i];

		io_uring_prep_read(sqe, rd->fd, q->buf + q->done, q->len - q->done,
				   q->off + q->done);
		io_uring_sqe_set_data64(sqe, i);
		q->state = REQ_INFLIGHT;
		run->inflight++;
	}
	ret = io_uring_submit(&io->ring);
	if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY && !run->err)
		run->err = mp_err(ret, "io: %s: io_uring_submit: %s", rd->what, strerror(-ret));
}

/*
 * Accounts the completions the kernel has posted; with wait, blocks for
 * one first. Without wait, completions that wait for this thread to enter
 * the kernel (IORING_SQ_TASKRUN) are fetched first, so the requests they
 * free are issued again while the caller hashes.
 */
static void collect(struct mp_io *io, const struct mp_io_read *rd, bool wait)
{
	struct run *run = &io->run;
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;
	int ret;

	if (wait) {
		/* The wait's return and each cqe->res are separate answers. */
		ret = io_uring_wait_cqe(&io->ring, &cqe);
		if (ret < 0) {
			/* The ring itself failed: requests may still write our buffers. */
			if (ret != -EINTR && ret != -EAGAIN && !run->err)
				run->err = mp_err(ret, "io: %s: io_uring_wait_cqe: %s", rd->what,
						  strerror(-ret));
			return;
		}
	} else if (IO_URING_READ_ONCE(*io->ring.sq.kflags) & IORING_SQ_TASKRUN) {
		io_uring_get_events(&io->ring);
	}
	io_uring_for_each_cqe(&io->ring, head, cqe) {
		uint32_t i = (uint32_t)io_uring_cqe_get_data64(cqe);
		int r;

		seen++;
		run->inflight--;
		if (i >= run->nreq)
			continue;
		r = complete(io, rd, &io->reqs[i], cqe->res, &run->nresubmit);
		if (r && !run->err)
			run->err = r;
	}
	io_uring_cq_advance(&io->ring, seen);
}

int mp_io_read(struct mp_io *io, const struct mp_io_read *rd)
{
	struct run *run = &io->run;
	int ret;

	if (!rd->len)
		return 0;
	if (!rd->align || (rd->align & (rd->align - 1)))
		return mp_err(-EINVAL, "io: %s: alignment %u is not a power of two", rd->what,
			      rd->align);
	*run = (struct run){ 0 };
	ret = plan(io, rd, &run->nreq);
	if (ret)
		return ret;

	while (run->prefix < run->nreq || run->inflight) {
		struct req *q;

		issue(io, rd);
		if (rd->issued && !run->told && run->inflight) {
			run->told = true;
			ret = rd->issued(rd->issued_arg);
			if (ret && !run->err)
				run->err = ret;
		}
		/*
		 * Hand the next in-order request over (the caller hashes it)
		 * while the rest are in flight, one request at a time: between
		 * two, freed requests are issued again, so the device never
		 * waits for the hash.
		 */
		q = run->prefix < run->nreq ? &io->reqs[run->prefix] : NULL;
		if (!run->err && q && q->state == REQ_DONE) {
			run->prefix++;
			if (rd->ready && q->want) {
				ret = rd->ready(rd->arg, q->buf, q->want);
				if (ret)
					run->err = ret;
			}
			collect(io, rd, false);
			continue;
		}
		if (!run->inflight)
			break;
		collect(io, rd, true);
	}
	return run->err;
}

void mp_io_queue_state(const struct mp_io *io, uint32_t *inflight, uint32_t *unissued)
{
	*inflight = io->run.inflight;
	*unissued = io->run.nreq - io->run.next + io->run.nresubmit;
}
