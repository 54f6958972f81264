/* SPDX-License-Identifier: MIT */
/* Private helpers every layer of the library shares: logging, time, small utilities; never installed. */
#ifndef MP_BASE_H
#define MP_BASE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include <moepager/common.h>

#ifndef container_of
#define container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))
#endif

#define MP_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MP_ALIGN_UP(x, a) (((x) + ((a) - 1)) & ~((uint64_t)(a) - 1))
#define MP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MP_MAX(a, b) ((a) > (b) ? (a) : (b))

#define __mp_cold __attribute__((cold))
#define __mp_printf(a, b) __attribute__((format(printf, a, b)))

/*
 * Formats a line, stores it as this thread's mp_last_error() when level is
 * MP_LOG_ERROR, and passes it to the installed handler.
 */
void mp_log(enum mp_log_level level, const char *fmt, ...) __mp_printf(2, 3);

/* Logs an error and returns err (a negative errno), for `return mp_err(...)`. */
int mp_err(int err, const char *fmt, ...) __mp_printf(2, 3) __mp_cold;

#define mp_warn(...)  mp_log(MP_LOG_WARN, __VA_ARGS__)
#define mp_info(...)  mp_log(MP_LOG_INFO, __VA_ARGS__)
#define mp_debug(...) mp_log(MP_LOG_DEBUG, __VA_ARGS__)

/* Current CLOCK_MONOTONIC time in nanoseconds. */
uint64_t mp_now_ns(void);

/*
 * Reads the whole file at path into a new NUL-terminated buffer (*buf, free()
 * it; *len excludes the NUL). what names the reader in messages ("tokenizer").
 * Returns 0, or -errno / -ENOMEM with a message naming the file.
 */
int mp_read_file(const char *what, const char *path, char **buf, size_t *len);

/*
 * A public config's reserved words (MP_RESERVED) must be zero: -EINVAL with
 * a message naming what (e.g. "pager config") when one is not.
 */
int mp_check_reserved(const uint64_t *words, size_t n, const char *what);
/* The same for an ops table's reserved slots (MP_RESERVED_OPS), which must be NULL. */
int mp_check_reserved_ops(void (*const *slots)(void), size_t n, const char *what);

/* Sorts v (n > 0 values); returns its median by nearest rank (the lower middle of an even n). */
double mp_median(double *v, size_t n);

/*
 * len bytes (rounded up to 4 KiB) of zeroed anonymous memory starting on a
 * 2 MiB boundary and advised MADV_HUGEPAGE, for memory the engine streams;
 * NULL when out of memory. Free with mp_huge_unmap(p, len).
 */
void *mp_huge_map(size_t len);
void mp_huge_unmap(void *p, size_t len);
/*
 * The share of the resident memory of the mapping holding p that sits on
 * transparent huge pages (AnonHugePages / Rss of its /proc/self/smaps entry,
 * so of the whole VMA when the kernel merged p's mapping with a neighbour):
 * 0..1, or -1 when smaps cannot be read or has no such mapping.
 */
double mp_huge_share(const void *p);

#endif /* MP_BASE_H */
