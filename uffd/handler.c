// SPDX-License-Identifier: MIT
/* The fault handler thread: batched uffd_msg reads, one handler per event. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"
#include "uffd/region_priv.h"
#include "uffd/compat.h"

/* Messages read per read(2): one syscall drains a burst of faults from many threads. */
#define MSG_BATCH	64

/*
 * Asks the scheduler for a short slice (Linux >= 6.12 lets SCHED_OTHER
 * threads set one): the handler runs briefly and sleeps, and a short slice
 * lets its wake-up preempt a CPU-bound task instead of waiting for that
 * task's slice to end, which is most of a fault's latency on a busy
 * machine. Unprivileged; older kernels refuse it and nothing changes.
 */
void mp_thread_short_slice(void)
{
	/* struct sched_attr (SCHED_ATTR_SIZE_VER1): glibc has no wrapper; its header clashes. */
	struct {
		uint32_t size;
		uint32_t sched_policy;
		uint64_t sched_flags;
		int32_t sched_nice;
		uint32_t sched_priority;
		uint64_t sched_runtime;
		uint64_t sched_deadline;
		uint64_t sched_period;
		uint32_t sched_util_min;
		uint32_t sched_util_max;
	} a = {
		.size = sizeof(a),
		.sched_policy = SCHED_OTHER,
		.sched_runtime = 100 * 1000,	/* ns */
	};

	if (syscall(SYS_sched_setattr, 0, &a, 0))
		mp_debug("sched_setattr(short slice): %s; default slice", strerror(errno));
}

bool mp_region_on_handler(const struct mp_region *r)
{
	pid_t tid = atomic_load(&((struct mp_region *)r)->handler_tid);

	return tid && tid == (pid_t)syscall(SYS_gettid);
}

/* Faults of one batch, de-duplicated per slot (a batch touches few slots). */
struct fault_batch {
	uint32_t n;
	struct {
		uint32_t slot;
		uint32_t count;
		uint64_t offset;
	} e[MSG_BATCH];
	/* Faults the owner could not serve yet (-EAGAIN): tried again after the next read. */
	uint32_t ndeferred;
	struct {
		uint32_t slot;
		uint64_t offset;
	} deferred[MSG_BATCH];
};

static void defer(struct fault_batch *b, uint32_t slot, uint64_t offset)
{
	for (uint32_t i = 0; i < b->ndeferred; i++)
		if (b->deferred[i].slot == slot)
			return;
	/* Full: the slot's threads refault after the others are served. */
	if (b->ndeferred < MSG_BATCH) {
		b->deferred[b->ndeferred].slot = slot;
		b->deferred[b->ndeferred].offset = offset;
		b->ndeferred++;
	}
}

/* Retries deferred faults; those still refused stay deferred. */
static void retry_deferred(struct mp_region *r, struct fault_batch *b)
{
	uint32_t n = b->ndeferred;

	b->ndeferred = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t slot = b->deferred[i].slot;
		uint64_t offset = b->deferred[i].offset;

		if (r->ops.fault(r->owner, slot, offset, 0, mp_now_ns()) == -EAGAIN)
			defer(b, slot, offset);
	}
}

static void batch_add(struct fault_batch *b, uint32_t slot, uint64_t offset)
{
	for (uint32_t i = 0; i < b->n; i++) {
		if (b->e[i].slot == slot) {
			b->e[i].count++;
			return;
		}
	}
	b->e[b->n].slot = slot;
	b->e[b->n].count = 1;
	b->e[b->n].offset = offset;
	b->n++;
}

static void batch_flush(struct mp_region *r, struct fault_batch *b, uint64_t now)
{
	for (uint32_t i = 0; i < b->n; i++)
		if (r->ops.fault(r->owner, b->e[i].slot, b->e[i].offset, b->e[i].count,
				 now) == -EAGAIN)
			defer(b, b->e[i].slot, b->e[i].offset);
	b->n = 0;
}

static void handle_pagefault(struct mp_region *r, const struct uffd_msg *m,
			     struct fault_batch *b)
{
	uint64_t addr = m->arg.pagefault.address, base = (uint64_t)(uintptr_t)r->base;

	if (addr < base || addr >= base + r->bytes) {
		rlog_warn(r, "fault at %#llx outside the range", (unsigned long long)addr);
		return;
	}
	batch_add(b, (uint32_t)((addr - base) / r->slot_bytes), (addr - base) % r->slot_bytes);
}

/* REMOVE (madvise DONTNEED/REMOVE) and UNMAP (munmap, mremap shrink) of part of the range. */
static void handle_remove(struct mp_region *r, uint64_t start, uint64_t end, bool unmapped)
{
	uint64_t base = (uint64_t)(uintptr_t)r->base;

	if (end <= base || start >= base + r->bytes)
		return;
	start = MP_MAX(start, base);
	end = MP_MIN(end, base + r->bytes);
	r->ops.removed(r->owner, (uint32_t)((start - base) / r->slot_bytes),
		       (uint32_t)((end - 1 - base) / r->slot_bytes), unmapped);
}

/*
 * Reads what is queued. Returns 1 when messages were handled, 0 when none
 * were waiting, or a negative errno when the fd is unusable.
 */
static int drain(struct mp_region *r, struct fault_batch *b)
{
	struct uffd_msg msgs[MSG_BATCH];
	ssize_t n = read(r->uffd, msgs, sizeof(msgs));
	uint64_t now = mp_now_ns();

	if (n < 0) {
		/* Another reader took them, or a signal: nothing lost either way. */
		if (errno == EAGAIN || errno == EINTR)
			return 0;
		return rlog_err(r, -errno, "reading uffd %d: %s", r->uffd, strerror(errno));
	}
	if (n == 0)
		return rlog_err(r, -EPIPE, "uffd %d: end of file", r->uffd);
	if (n % (ssize_t)sizeof(msgs[0]))
		rlog_warn(r, "uffd %d: short message (%zd bytes)", r->uffd, n);
	for (ssize_t i = 0; i < n / (ssize_t)sizeof(msgs[0]); i++) {
		const struct uffd_msg *m = &msgs[i];

		switch (m->event) {
		case UFFD_EVENT_PAGEFAULT:
			handle_pagefault(r, m, b);
			break;
		case UFFD_EVENT_REMOVE:
			/* Faults read before the event are served first, in order. */
			batch_flush(r, b, now);
			handle_remove(r, m->arg.remove.start, m->arg.remove.end, false);
			break;
		case UFFD_EVENT_UNMAP:
			batch_flush(r, b, now);
			handle_remove(r, m->arg.remove.start, m->arg.remove.end, true);
			break;
		default:
			/* FORK and REMAP were not requested; anything else is new to us. */
			rlog_warn(r, "uffd %d: unexpected event %#x", r->uffd, m->event);
			break;
		}
	}
	batch_flush(r, b, now);
	return 1;
}

static void *handler_main(void *arg)
{
	struct mp_region *r = arg;
	struct fault_batch batch = { .n = 0, .ndeferred = 0 };
	struct pollfd pfd[2] = {
		{ .fd = r->uffd, .events = POLLIN },
		{ .fd = r->stop_efd, .events = POLLIN },
	};
	sigset_t all;
	int err = 0;

	/*
	 * Cancellation would skip the stopped() callback and leave every later
	 * fault (and any madvise of the range, which waits for its REMOVE event)
	 * blocked forever: the handler stops only through stop_efd.
	 */
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	/* The application's signal handlers run on its own threads, not here. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	mp_thread_short_slice();
	atomic_store(&r->handler_tid, (pid_t)syscall(SYS_gettid));
	for (;;) {
		/* With faults deferred, look again soon even if nothing new arrives. */
		int n = poll(pfd, 2, batch.ndeferred ? 1 : -1);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			err = rlog_err(r, -errno, "poll: %s", strerror(errno));
			break;
		}
		if (pfd[1].revents)
			break;
		if (pfd[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
			err = rlog_err(r, -EPIPE, "uffd %d: poll error %#x", r->uffd,
				       pfd[0].revents);
			break;
		}
		if (pfd[0].revents & POLLIN) {
			err = drain(r, &batch);
			if (err < 0)
				break;
			err = 0;
		}
		if (batch.ndeferred)
			retry_deferred(r, &batch);
	}
	/* Nobody reads faults any more: the owner must fail them rather than let them hang. */
	if (err && r->ops.stopped)
		r->ops.stopped(r->owner, err);
	atomic_store(&r->handler_tid, 0);
	return NULL;
}

int mp_region_handler_start(struct mp_region *r)
{
	int err;

	r->stop_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (r->stop_efd < 0)
		return rlog_err(r, -errno, "eventfd: %s", strerror(errno));
	err = pthread_create(&r->thread, NULL, handler_main, r);
	if (err)
		return rlog_err(r, -err, "starting the fault handler: %s", strerror(err));
	pthread_setname_np(r->thread, "mp-fault");
	r->thread_started = true;
	return 0;
}

void mp_region_handler_stop(struct mp_region *r)
{
	uint64_t one = 1;

	if (r->thread_started) {
		if (write(r->stop_efd, &one, sizeof(one)) != sizeof(one))
			rlog_warn(r, "stopping the handler: %s", strerror(errno));
		pthread_join(r->thread, NULL);
		r->thread_started = false;
	}
	if (r->stop_efd >= 0) {
		close(r->stop_efd);
		r->stop_efd = -1;
	}
}
