// SPDX-License-Identifier: MIT
/*
 * The userfaultfd itself: finding a way to open one, the UFFDIO_API
 * handshake, registration, and the resolving ioctls (MOVE, WAKE, POISON)
 * with their outcomes classified in one place and their retries.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "uffd/compat.h"
#include "uffd/ioctl.h"
#include "uffd/region_priv.h"

#define PAGE		4096ull
/* Bounded retry of a transiently failing ioctl off the handler thread: 2 s in all. */
#define RETRY_SPIN	64
#define RETRY_SLEEP_NS	200000ull
#define RETRY_MAX	10000

enum mp_uffd_outcome mp_uffd_classify(int err)
{
	switch (err) {
	case 0:
		return MP_UFFD_DONE;
	case EEXIST:
		/*
		 * The destination already has a page (or a poison marker):
		 * another resolution got there first. The faulting thread
		 * only needs a wake, which the caller does.
		 */
		return MP_UFFD_PRESENT;
	case EAGAIN:
		/*
		 * mmap_changing: a REMOVE/UNMAP/fork event has not been read
		 * yet, or a source folio was locked or being split. Read the
		 * pending events, then retry the rest (the ioctl reported what
		 * it already did).
		 */
		return MP_UFFD_RETRY;
	case EBUSY:
		/*
		 * MOVE refuses pages that are pinned (an O_DIRECT transfer in
		 * flight) or not exclusive (shared after a fork). Pins drop
		 * soon; sharing does not, so callers bound their retries.
		 */
		return MP_UFFD_BUSY;
	case ENOENT:
		/*
		 * MOVE found no source page: the data we meant to move is not
		 * where we left it (zapped behind our back). The slot's data
		 * is gone: the caller discards it and refills.
		 */
	case ESRCH:
		/* The mm is going away (process exit): nothing left to serve. */
		return MP_UFFD_GONE;
	default:
		/*
		 * EINVAL (bad range or mode: a bug), ENOMEM (page tables),
		 * EFAULT (bad address): not recoverable here; log and fail.
		 */
		return MP_UFFD_FAIL;
	}
}

const char *mp_uffd_outcome_name(enum mp_uffd_outcome o)
{
	static const char *const names[] = {
		[MP_UFFD_DONE] = "done",
		[MP_UFFD_PRESENT] = "already present",
		[MP_UFFD_RETRY] = "retry",
		[MP_UFFD_BUSY] = "pages busy",
		[MP_UFFD_GONE] = "range or owner gone",
		[MP_UFFD_FAIL] = "failed",
	};

	return (unsigned)o < MP_ARRAY_SIZE(names) ? names[o] : "?";
}

void mp_uffd_sleep_ns(uint64_t ns)
{
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ull),
			       .tv_nsec = (long)(ns % 1000000000ull) };

	nanosleep(&ts, NULL);
}

/*
 * Opening the userfaultfd
 */

int mp_uffd_open_how(enum uffd_how how, int flags)
{
	int dev, fd;

	switch (how) {
	case HOW_SYSCALL:
		fd = (int)syscall(SYS_userfaultfd, flags);
		return fd < 0 ? -errno : fd;
	case HOW_DEV:
		dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
		if (dev < 0)
			return -errno;
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
		fd = fd < 0 ? -errno : fd;
		close(dev);
		return fd;
	case HOW_USER_ONLY:
		fd = (int)syscall(SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY);
		return fd < 0 ? -errno : fd;
	}
	return -EINVAL;
}

static int read_sysctl(const char *path)
{
	char buf[16] = "";
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? atoi(buf) : -1;
}

/*
 * Finds a way to open a userfaultfd: the syscall (needs CAP_SYS_PTRACE
 * unless vm.unprivileged_userfaultfd=1), /dev/userfaultfd (needs read and
 * write access to the node), or the syscall for user-mode faults only
 * (always allowed; kernel-mode accesses to the range then fail with
 * EFAULT instead of faulting in). Returns the method or a negative errno
 * with a message naming what is missing.
 */
int mp_uffd_find_how(struct mp_region *r, enum uffd_how *how)
{
	int e_sys, e_dev, e_user, fd, unpriv;

	fd = mp_uffd_open_how(HOW_SYSCALL, O_CLOEXEC | O_NONBLOCK);
	if (fd >= 0) {
		*how = HOW_SYSCALL;
		goto found;
	}
	e_sys = fd;
	if (e_sys == -ENOSYS)
		return rlog_err(r, -EOPNOTSUPP, "userfaultfd(2): the kernel has no userfaultfd "
				"(CONFIG_USERFAULTFD); the pager cannot work without it");
	fd = mp_uffd_open_how(HOW_DEV, O_CLOEXEC | O_NONBLOCK);
	if (fd >= 0) {
		*how = HOW_DEV;
		rlog_info(r, "userfaultfd(2) refused (%s); using /dev/userfaultfd",
			  strerror(-e_sys));
		goto found;
	}
	e_dev = fd;
	fd = mp_uffd_open_how(HOW_USER_ONLY, O_CLOEXEC | O_NONBLOCK);
	if (fd >= 0) {
		*how = HOW_USER_ONLY;
		rlog_info(r, "userfaultfd(2) refused (%s), /dev/userfaultfd: %s; handling "
			  "user-mode faults only (a kernel access to expert memory, e.g. "
			  "write(2) from it, fails with EFAULT)", strerror(-e_sys),
			  strerror(-e_dev));
		goto found;
	}
	e_user = fd;
	unpriv = read_sysctl("/proc/sys/vm/unprivileged_userfaultfd");
	return rlog_err(r, -EPERM, "no userfaultfd permission: userfaultfd(2): %s "
			"(vm.unprivileged_userfaultfd=%d and no CAP_SYS_PTRACE), "
			"/dev/userfaultfd: %s, user-mode-only: %s; allow one of them "
			"(sysctl vm.unprivileged_userfaultfd=1, access to /dev/userfaultfd, "
			"or CAP_SYS_PTRACE; a seccomp filter may also refuse the syscall)",
			strerror(-e_sys), unpriv, strerror(-e_dev), strerror(-e_user));
found:
	close(fd);
	return 0;
}

/* UFFDIO_API on a fresh fd: checks the API number and returns what the kernel granted. */
static int uffd_handshake(struct mp_region *r, int fd, uint64_t want, uint64_t *got)
{
	struct uffdio_api api = { .api = UFFD_API, .features = want };

	if (ioctl(fd, UFFDIO_API, &api))
		return rlog_err(r, -errno, "UFFDIO_API (features %#llx): %s",
				(unsigned long long)want, strerror(errno));
	if (api.api != UFFD_API)
		return rlog_err(r, -EPROTO, "UFFDIO_API: kernel answered API %#llx, want %#llx",
				(unsigned long long)api.api, (unsigned long long)UFFD_API);
	if (got)
		*got = api.features;
	return 0;
}

/* Opens a userfaultfd the found way and negotiates `want`. Returns the fd or -errno. */
int mp_uffd_open(struct mp_region *r, enum uffd_how how, uint64_t want)
{
	int fd = mp_uffd_open_how(how, O_CLOEXEC | O_NONBLOCK);
	int err;

	if (fd < 0)
		return rlog_err(r, fd, "userfaultfd: %s", strerror(-fd));
	err = uffd_handshake(r, fd, want, NULL);
	if (err) {
		close(fd);
		return err;
	}
	return fd;
}

/* Probes the kernel's features once and fails clearly when a needed one is missing. */
int mp_uffd_probe(struct mp_region *r, enum uffd_how how, uint64_t *features)
{
	static const struct { uint64_t bit; const char *name; const char *since; } need[] = {
		{ UFFD_FEATURE_MOVE, "UFFD_FEATURE_MOVE", "6.8" },
		{ UFFD_FEATURE_POISON, "UFFD_FEATURE_POISON", "6.6" },
		{ UFFD_FEATURE_EVENT_REMOVE, "UFFD_FEATURE_EVENT_REMOVE", "4.11" },
		{ UFFD_FEATURE_EVENT_UNMAP, "UFFD_FEATURE_EVENT_UNMAP", "4.11" },
		{ UFFD_FEATURE_SIGBUS, "UFFD_FEATURE_SIGBUS", "4.14" },
	};
	int fd = mp_uffd_open_how(how, O_CLOEXEC | O_NONBLOCK);
	int err;

	if (fd < 0)
		return rlog_err(r, fd, "userfaultfd: %s", strerror(-fd));
	err = uffd_handshake(r, fd, 0, features);
	close(fd);
	if (err)
		return err;
	for (size_t i = 0; i < MP_ARRAY_SIZE(need); i++)
		if (!(*features & need[i].bit))
			return rlog_err(r, -EOPNOTSUPP, "userfaultfd lacks %s (Linux >= %s); "
					"kernel features %#llx", need[i].name, need[i].since,
					(unsigned long long)*features);
	return 0;
}

int mp_uffd_register(struct mp_region *r, int fd, void *addr, uint64_t len, uint64_t need)
{
	struct uffdio_register reg = {
		.range = { .start = (uint64_t)(uintptr_t)addr, .len = len },
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};

	if (ioctl(fd, UFFDIO_REGISTER, &reg))
		return rlog_err(r, -errno, "UFFDIO_REGISTER %p+%llu: %s", addr,
				(unsigned long long)len, strerror(errno));
	if ((reg.ioctls & need) != need)
		return rlog_err(r, -EOPNOTSUPP, "UFFDIO_REGISTER %p: range ioctls %#llx lack %#llx",
				addr, (unsigned long long)reg.ioctls,
				(unsigned long long)(need & ~reg.ioctls));
	return 0;
}

/*
 * Decides whether a transiently failed ioctl is tried again, and waits a
 * little before it is. Off the handler thread a retry waits up to about
 * 2 s in all; on the handler thread the error is returned at once instead:
 * EAGAIN there usually means a REMOVE/UNMAP event waits to be read, and
 * only the handler reads it.
 */
bool mp_uffd_retry(struct mp_region *r, int err, int tries)
{
	switch (mp_uffd_classify(err)) {
	case MP_UFFD_RETRY:
		if (mp_region_on_handler(r) ? tries > 2 : tries > RETRY_MAX)
			return false;
		if (tries > RETRY_SPIN)
			mp_uffd_sleep_ns(RETRY_SLEEP_NS);
		else
			sched_yield();
		return true;
	case MP_UFFD_BUSY:
		/* Pinned pages (a DMA in flight) unpin soon; give them a few tries. */
		if (mp_region_on_handler(r) || tries > RETRY_SPIN)
			return false;
		mp_uffd_sleep_ns(RETRY_SLEEP_NS);
		return true;
	default:
		return false;
	}
}

/*
 * Resolving ioctls
 */

/*
 * Bytes from the start of [dst, dst+len) whose pages are at dst and gone
 * from src: pages a move put in place without counting them. Linux 6.18's
 * move_pages() keeps a step's EAGAIN while it retries the same address, so
 * the retry's batch moves uncounted and the next try ends in EEXIST on it
 * (docs/region.md, sessions 29-33). A stray page at dst over a page still
 * at src is not counted: that EEXIST is real.
 */
static uint64_t moved_uncounted(const char *dst, const char *src, uint64_t len)
{
	unsigned char in_dst[64], in_src[64];
	uint64_t n = 0;

	while (n < len) {
		uint64_t step = MP_MIN(len - n, (uint64_t)sizeof(in_dst) * PAGE);

		if (mincore((void *)(dst + n), step, in_dst) ||
		    mincore((void *)(src + n), step, in_src))
			break;
		for (uint64_t i = 0; i < step / PAGE; i++, n += PAGE)
			if (!(in_dst[i] & 1) || (in_src[i] & 1))
				return n;
	}
	return n;
}

/*
 * UFFDIO_MOVE of [src, src+len) to dst, issued on fd (the destination's
 * userfaultfd), riding over partial progress and transient failures.
 * Returns 0 or a negative errno; *moved gets the bytes moved either way.
 */
int mp_uffd_move(struct mp_region *r, int fd, char *dst, char *src, uint64_t len,
		      uint64_t mode, uint64_t *moved)
{
	uint64_t done = 0;
	int tries = 0, err = 0;

	while (done < len) {
		struct uffdio_move m = {
			.dst = (uint64_t)(uintptr_t)(dst + done),
			.src = (uint64_t)(uintptr_t)(src + done),
			.len = len - done,
			.mode = mode,
		};

		if (ioctl(fd, UFFDIO_MOVE, &m) == 0) {
			done = len;
			break;
		}
		err = errno;
		if (m.move > 0)
			done += (uint64_t)m.move;
		if (err == EEXIST) {
			uint64_t more = moved_uncounted(dst + done, src + done, len - done);

			if (more) {
				rlog_info(r, "UFFDIO_MOVE to %p: %llu bytes past the %llu it reported "
					  "had moved; counted", (void *)(dst + done),
					  (unsigned long long)more, (unsigned long long)done);
				done += more;
				err = 0;
				continue;
			}
		}
		if (!mp_uffd_retry(r, err, ++tries))
			break;
		err = 0;
	}
	if (moved)
		*moved = done;
	return -err;
}

int mp_uffd_wake(struct mp_region *r, char *addr, uint64_t len)
{
	struct uffdio_range wr = { .start = (uint64_t)(uintptr_t)addr, .len = len };

	/* EINVAL is the one documented failure (a bad range): a bug, so log it. */
	if (ioctl(r->uffd, UFFDIO_WAKE, &wr))
		return rlog_err(r, -errno, "UFFDIO_WAKE %p+%llu: %s", addr,
				(unsigned long long)len, strerror(errno));
	return 0;
}

/*
 * UFFDIO_POISON over [start, start+len) of the range, stepping over pages
 * that are present (data, not holes) and riding over partial progress and
 * transient failures. Returns 0 or a negative errno; *done gets the bytes
 * covered either way.
 */
int mp_uffd_poison(struct mp_region *r, char *start, uint64_t len, uint64_t *donep)
{
	uint64_t done = 0;
	int tries = 0;

	while (done < len) {
		struct uffdio_poison p = {
			.range = { .start = (uint64_t)(uintptr_t)(start + done),
				   .len = len - done },
		};
		int err;

		if (ioctl(r->uffd, UFFDIO_POISON, &p) == 0) {
			done = len;
			break;
		}
		err = errno;
		if (p.updated > 0)
			done += (uint64_t)p.updated;
		switch (mp_uffd_classify(err)) {
		case MP_UFFD_PRESENT:
			/* A page is mapped there: it is data, not a hole; poison around it. */
			done += PAGE;
			continue;
		case MP_UFFD_RETRY:
			if (mp_uffd_retry(r, err, ++tries))
				continue;
			/* fall through */
		default:
			*donep = done;
			return -err;
		}
	}
	*donep = done;
	return 0;
}
