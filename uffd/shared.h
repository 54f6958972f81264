/* SPDX-License-Identifier: MIT */
/*
 * A userfaultfd over a shared (memfd) mapping, for a host tier several
 * processes map (shared.c): the engine side registers its mapping MISSING +
 * MINOR, the pager daemon resolves it with UFFDIO_CONTINUE from another
 * process. Every call takes the fd, not a region: the range is not a
 * region's, and the caller may not own the address space it resolves.
 */
#ifndef MP_UFFD_SHARED_H
#define MP_UFFD_SHARED_H

#include <stdbool.h>
#include <stdint.h>

/*
 * Opens a userfaultfd (O_CLOEXEC, O_NONBLOCK) with the features a shared
 * range needs: MINOR faults on shmem (and on hugetlbfs with hugetlb) and
 * POISON. Returns the fd, -EPERM naming the missing permission, or
 * -EOPNOTSUPP naming the missing feature.
 */
int mp_uffd_shared_open(bool hugetlb, const char *who);
/* Registers [addr, addr+len) MISSING + MINOR; -EOPNOTSUPP without CONTINUE/POISON ioctls. */
int mp_uffd_shared_register(int fd, void *addr, uint64_t len, const char *who);
/*
 * UFFDIO_CONTINUE of [addr, addr+len) (aligned to the mapping's page size,
 * `page`) in fd's address space, then a wake over all of it. Pages already
 * mapped are skipped (a page at a time: cheap only when few are); *mapped
 * gets the bytes newly mapped. Returns 0, -ESRCH when the address space is
 * gone, or -errno.
 */
int mp_uffd_continue(int fd, uint64_t addr, uint64_t len, uint64_t page, uint64_t *mapped);
/* Poison markers over the unmapped pages of [addr, addr+len) (SIGBUS on access), and a wake. */
int mp_uffd_poison_fd(int fd, uint64_t addr, uint64_t len, uint64_t page);
/* Wakes threads waiting on [addr, addr+len). */
int mp_uffd_wake_fd(int fd, uint64_t addr, uint64_t len);

#endif /* MP_UFFD_SHARED_H */
