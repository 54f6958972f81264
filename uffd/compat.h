/* SPDX-License-Identifier: MIT */
/* userfaultfd uapi pieces newer than the 6.1 headers we build against (values from Linux 6.8). */
#ifndef MP_UFFD_COMPAT_H
#define MP_UFFD_COMPAT_H

#include <linux/types.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY		1
#endif

/* /dev/userfaultfd (Linux 6.1): the fallback when the syscall is refused. */
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC			0xAA
#define USERFAULTFD_IOC_NEW		_IO(USERFAULTFD_IOC, 0x00)
#endif

#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED	(1 << 13)
#endif

/* UFFDIO_POISON (Linux 6.6): install PTE markers that raise SIGBUS on access. */
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON		(1 << 14)
#define _UFFDIO_POISON			(0x08)
struct uffdio_poison {
	struct uffdio_range range;
#define UFFDIO_POISON_MODE_DONTWAKE	((__u64)1 << 0)
	__u64 mode;
	/* Written by the kernel: bytes poisoned, or a negative errno. */
	__s64 updated;
};
#define UFFDIO_POISON			_IOWR(UFFDIO, _UFFDIO_POISON, struct uffdio_poison)
#endif

#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC		(1 << 15)
#endif

/* UFFDIO_MOVE (Linux 6.8): move exclusive anonymous pages between two private mappings. */
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE		(1 << 16)
#define _UFFDIO_MOVE			(0x05)
struct uffdio_move {
	__u64 dst;
	__u64 src;
	__u64 len;
#define UFFDIO_MOVE_MODE_DONTWAKE		((__u64)1 << 0)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES	((__u64)1 << 1)
	__u64 mode;
	/* Written by the kernel: bytes moved, or a negative errno. */
	__s64 move;
};
#define UFFDIO_MOVE			_IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#endif

#endif /* MP_UFFD_COMPAT_H */
