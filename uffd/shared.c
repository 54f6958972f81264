// SPDX-License-Identifier: MIT
/*
 * userfaultfd over a shared memfd mapping: MINOR + MISSING registration and
 * the CONTINUE/POISON/WAKE ioctls, usable on another process's userfaultfd
 * (the ioctls act on the fd's address space, whoever calls them).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "uffd/compat.h"
#include "uffd/ioctl.h"
#include "uffd/shared.h"

#define PAGE		4096ull
/* EAGAIN (mmap changing, a busy folio) is retried this many times, 200 us apart. */
#define RETRY_MAX	1000

int mp_uffd_shared_open(bool hugetlb, const char *who)
{
	static const enum uffd_how hows[] = { HOW_SYSCALL, HOW_DEV, HOW_USER_ONLY };
	uint64_t want = UFFD_FEATURE_MINOR_SHMEM | UFFD_FEATURE_POISON;
	struct uffdio_api api = { .api = UFFD_API };
	int fd = -EPERM, first = 0;

	for (size_t i = 0; i < MP_ARRAY_SIZE(hows); i++) {
		fd = mp_uffd_open_how(hows[i], O_CLOEXEC | O_NONBLOCK);
		if (fd >= 0)
			break;
		if (!first)
			first = fd;
	}
	if (fd < 0)
		return mp_err(-EPERM, "%s: no userfaultfd permission (userfaultfd(2): %s; allow "
			      "vm.unprivileged_userfaultfd=1, /dev/userfaultfd or CAP_SYS_PTRACE)",
			      who, strerror(-first));
	/* Ask for nothing first: the answer lists what the kernel has. */
	if (ioctl(fd, UFFDIO_API, &api)) {
		int err = -errno;

		close(fd);
		return mp_err(err, "%s: UFFDIO_API: %s", who, strerror(-err));
	}
	close(fd);
	if (hugetlb)
		want |= UFFD_FEATURE_MINOR_HUGETLBFS;
	if ((api.features & want) != want)
		return mp_err(-EOPNOTSUPP, "%s: userfaultfd lacks %s (kernel features %#llx)", who,
			      !(api.features & UFFD_FEATURE_MINOR_SHMEM) ?
			      "UFFD_FEATURE_MINOR_SHMEM (Linux >= 5.14)" :
			      !(api.features & UFFD_FEATURE_POISON) ?
			      "UFFD_FEATURE_POISON (Linux >= 6.6)" :
			      "UFFD_FEATURE_MINOR_HUGETLBFS (Linux >= 5.13)",
			      (unsigned long long)api.features);
	for (size_t i = 0; i < MP_ARRAY_SIZE(hows); i++) {
		fd = mp_uffd_open_how(hows[i], O_CLOEXEC | O_NONBLOCK);
		if (fd >= 0)
			break;
	}
	if (fd < 0)
		return mp_err(fd, "%s: userfaultfd: %s", who, strerror(-fd));
	api = (struct uffdio_api){ .api = UFFD_API, .features = want };
	if (ioctl(fd, UFFDIO_API, &api)) {
		int err = -errno;

		close(fd);
		return mp_err(err, "%s: UFFDIO_API (features %#llx): %s", who,
			      (unsigned long long)want, strerror(-err));
	}
	return fd;
}

int mp_uffd_shared_register(int fd, void *addr, uint64_t len, const char *who)
{
	uint64_t need = (1ull << _UFFDIO_CONTINUE) | (1ull << _UFFDIO_POISON) |
			(1ull << _UFFDIO_WAKE);
	struct uffdio_register reg = {
		.range = { .start = (uint64_t)(uintptr_t)addr, .len = len },
		.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR,
	};

	if (ioctl(fd, UFFDIO_REGISTER, &reg))
		return mp_err(-errno, "%s: UFFDIO_REGISTER (MISSING|MINOR) %p+%llu: %s", who, addr,
			      (unsigned long long)len, strerror(errno));
	if ((reg.ioctls & need) != need)
		return mp_err(-EOPNOTSUPP, "%s: UFFDIO_REGISTER %p: range ioctls %#llx lack %#llx",
			      who, addr, (unsigned long long)reg.ioctls,
			      (unsigned long long)(need & ~reg.ioctls));
	return 0;
}

int mp_uffd_wake_fd(int fd, uint64_t addr, uint64_t len)
{
	struct uffdio_range range = { .start = addr, .len = len };

	return ioctl(fd, UFFDIO_WAKE, &range) ? -errno : 0;
}

/*
 * One resolving ioctl over [start, end), riding over partial progress (the
 * ioctl writes bytes done, or -errno, to *res inside arg), pages already
 * there (skipped a page at a time) and transient EAGAIN. Wakes nobody.
 */
static int ioctl_range(int fd, unsigned long req, void *arg, struct uffdio_range *range,
		       __s64 *res, uint64_t end, uint64_t page, uint64_t *done)
{
	int tries = 0;

	*done = 0;
	while (range->start < end) {
		range->len = end - range->start;
		*res = 0;
		if (!ioctl(fd, req, arg)) {
			*done += range->len;
			break;
		}
		if (*res > 0) {
			*done += (uint64_t)*res;
			range->start += (uint64_t)*res;
			continue;
		}
		if (errno == EEXIST) {
			range->start += page;
			continue;
		}
		if (errno == EAGAIN && ++tries < RETRY_MAX) {
			usleep(200);
			continue;
		}
		return -errno;
	}
	return 0;
}

int mp_uffd_continue(int fd, uint64_t addr, uint64_t len, uint64_t page, uint64_t *mapped)
{
	struct uffdio_continue c = { .range = { .start = addr },
				     .mode = UFFDIO_CONTINUE_MODE_DONTWAKE };
	int err = ioctl_range(fd, UFFDIO_CONTINUE, &c, &c.range, &c.mapped, addr + len, page,
				mapped);

	if (err)
		return err;
	return mp_uffd_wake_fd(fd, addr, len);
}

int mp_uffd_poison_fd(int fd, uint64_t addr, uint64_t len, uint64_t page)
{
	struct uffdio_poison p = { .range = { .start = addr },
				   .mode = UFFDIO_POISON_MODE_DONTWAKE };
	uint64_t done;
	int err = ioctl_range(fd, UFFDIO_POISON, &p, &p.range, &p.updated, addr + len, page,
				&done);

	if (err)
		return err;
	return mp_uffd_wake_fd(fd, addr, len);
}
