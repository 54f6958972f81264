/* SPDX-License-Identifier: MIT */
/* The userfaultfd ioctls the region uses (ioctl.c): opening, registering, resolving. */
#ifndef MP_UFFD_IOCTL_H
#define MP_UFFD_IOCTL_H

#include <stdbool.h>
#include <stdint.h>

struct mp_region;

/* How this process may open a userfaultfd (mp_uffd_find_how()). */
enum uffd_how { HOW_SYSCALL, HOW_DEV, HOW_USER_ONLY };

/*
 * Finds a way to open a userfaultfd: the syscall (needs CAP_SYS_PTRACE
 * unless vm.unprivileged_userfaultfd=1), /dev/userfaultfd (needs read and
 * write access to the node), or the syscall for user-mode faults only.
 * Returns 0, or -EPERM/-EOPNOTSUPP with a message naming what is missing.
 */
int mp_uffd_find_how(struct mp_region *r, enum uffd_how *how);
/* userfaultfd(flags) the given way, nothing negotiated. Returns the fd or -errno. */
int mp_uffd_open_how(enum uffd_how how, int flags);
/* Opens a userfaultfd (O_NONBLOCK) and negotiates want. Returns the fd or -errno. */
int mp_uffd_open(struct mp_region *r, enum uffd_how how, uint64_t want);
/* The kernel's features; -EOPNOTSUPP naming the first one the region needs and lacks. */
int mp_uffd_probe(struct mp_region *r, enum uffd_how how, uint64_t *features);
/* UFFDIO_REGISTER (MISSING) of [addr, addr+len); -EOPNOTSUPP when an ioctl in need is absent. */
int mp_uffd_register(struct mp_region *r, int fd, void *addr, uint64_t len, uint64_t need);

/*
 * Whether a transiently failed ioctl is tried again (after a short wait):
 * off the handler thread for about 2 s in all; on it, not past a couple of
 * tries (EAGAIN there means an event waits that only the handler reads).
 */
bool mp_uffd_retry(struct mp_region *r, int err, int tries);
/*
 * UFFDIO_MOVE of [src, src+len) to dst on fd (the destination's), riding
 * over partial progress and transient failures, and over pages the kernel
 * moved without counting them (an EEXIST on pages at dst and gone from src).
 * Returns 0 or a negative errno; *moved (may be NULL) gets the bytes moved
 * either way.
 */
int mp_uffd_move(struct mp_region *r, int fd, char *dst, char *src, uint64_t len,
		 uint64_t mode, uint64_t *moved);
/* UFFDIO_WAKE of [addr, addr+len) on the range's userfaultfd. */
int mp_uffd_wake(struct mp_region *r, char *addr, uint64_t len);
int mp_uffd_poison(struct mp_region *r, char *start, uint64_t len, uint64_t *done);
void mp_uffd_sleep_ns(uint64_t ns);

#endif /* MP_UFFD_IOCTL_H */
