/* SPDX-License-Identifier: MIT */
/*
 * What the file-format fuzz targets share: the input as a file (a memfd
 * opened by path), and each input run twice, the second time with its
 * checksums recomputed so mutations reach the checks behind them.
 */
#ifndef MP_FUZZ_FILE_H
#define MP_FUZZ_FILE_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The path of this process's fuzz file, created on first use; *fd gets its descriptor. */
static inline const char *fuzz_file(const char *name, int *fd)
{
	static char path[64];

	if (*fd < 0) {
		*fd = memfd_create(name, MFD_CLOEXEC);
		if (*fd < 0) {
			perror("memfd_create");
			abort();
		}
		snprintf(path, sizeof(path), "/proc/self/fd/%d", *fd);
	}
	return path;
}

/* Makes d[0..n) the whole of the file behind fd. 0 or -errno. */
static inline int fuzz_put_file(int fd, const uint8_t *d, size_t n)
{
	if (ftruncate(fd, 0))
		return -errno;
	for (size_t off = 0; off < n;) {
		ssize_t w = pwrite(fd, d + off, n - off, (off_t)off);

		if (w <= 0)
			return -EIO;
		off += (size_t)w;
	}
	return 0;
}

/*
 * run(data) then, for inputs of at least min bytes, run(a copy whose
 * checksums fix() recomputed) when that changed anything.
 */
static inline void fuzz_twice(const uint8_t *data, size_t size, size_t min,
			      void (*run)(const uint8_t *, size_t),
			      void (*fix)(uint8_t *, size_t))
{
	uint8_t *copy;

	run(data, size);
	if (size < min || !(copy = malloc(size)))
		return;
	memcpy(copy, data, size);
	fix(copy, size);
	if (memcmp(copy, data, size))
		run(copy, size);
	free(copy);
}

#endif /* MP_FUZZ_FILE_H */
