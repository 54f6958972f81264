/* SPDX-License-Identifier: MIT */
/* File I/O shared by the store's readers and writers (.mpk, .mpa). */
#ifndef MP_STORE_FILEIO_H
#define MP_STORE_FILEIO_H

#include <stdint.h>
#include <sys/types.h>

/* pread until len bytes or EOF; returns the bytes read or -errno. */
ssize_t mpk_pread_full(int fd, void *buf, size_t len, uint64_t off);
/* pwrite all len bytes; 0 or -errno (-EIO when the file system wrote nothing). */
int mpk_pwrite_full(int fd, const void *buf, uint64_t len, uint64_t off);

/*
 * A file written under a temporary name next to path and renamed into place
 * on commit, so a failed or abandoned write never leaves a half-written file
 * at path.
 */
struct mpk_tmpfile {
	char *path;
	char *tmp_path;
	int fd;
};

/* Creates path's temporary file (mode 0644). Returns 0 or -errno, logged. */
int mpk_tmpfile_create(struct mpk_tmpfile *t, const char *path);
/* fsync, rename into place, fsync the directory; frees t. 0 or -errno, logged (t aborted). */
int mpk_tmpfile_commit(struct mpk_tmpfile *t);
/* Closes and unlinks the temporary file and frees t. */
void mpk_tmpfile_abort(struct mpk_tmpfile *t);

#endif /* MP_STORE_FILEIO_H */
