// SPDX-License-Identifier: MIT
/* File I/O shared by the store's readers and writers. */
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "store/fileio.h"

ssize_t mpk_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (ssize_t)done;
}

int mpk_pwrite_full(int fd, const void *buf, uint64_t len, uint64_t off)
{
	uint64_t done = 0;

	while (done < len) {
		ssize_t n = pwrite(fd, (const char *)buf + done, (size_t)(len - done),
				   (off_t)(off + done));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		done += (uint64_t)n;
	}
	return 0;
}

static void tmpfile_free(struct mpk_tmpfile *t)
{
	if (t->fd >= 0)
		close(t->fd);
	free(t->tmp_path);
	free(t->path);
	*t = (struct mpk_tmpfile){ .fd = -1 };
}

int mpk_tmpfile_create(struct mpk_tmpfile *t, const char *path)
{
	int err;

	*t = (struct mpk_tmpfile){ .fd = -1 };
	t->path = strdup(path);
	if (!t->path || asprintf(&t->tmp_path, "%s.tmp.XXXXXX", path) < 0) {
		t->tmp_path = NULL;
		err = mp_err(-ENOMEM, "%s: out of memory", path);
		goto free_tmp;
	}
	t->fd = mkostemp(t->tmp_path, O_CLOEXEC);
	if (t->fd < 0) {
		err = mp_err(-errno, "%s: cannot create %s: %s", path, t->tmp_path,
			     strerror(errno));
		goto free_tmp;
	}
	/* mkostemp makes it 0600; a model is a plain data file. */
	if (fchmod(t->fd, 0644)) {
		err = mp_err(-errno, "%s: chmod %s: %s", path, t->tmp_path, strerror(errno));
		mpk_tmpfile_abort(t);
		return err;
	}
	return 0;
free_tmp:
	tmpfile_free(t);
	return err;
}

/* Makes the rename durable; failure here only loses durability, not data. */
static void sync_parent_dir(const char *path)
{
	char *copy = strdup(path);
	int fd;

	if (!copy)
		return;
	fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		if (fsync(fd))
			mp_warn("%s: fsync of the directory failed: %s", path, strerror(errno));
		close(fd);
	}
	free(copy);
}

int mpk_tmpfile_commit(struct mpk_tmpfile *t)
{
	int err;

	if (fsync(t->fd)) {
		err = mp_err(-errno, "%s: fsync: %s", t->tmp_path, strerror(errno));
		goto abort_tmp;
	}
	if (rename(t->tmp_path, t->path)) {
		err = mp_err(-errno, "%s: renaming %s into place: %s", t->path, t->tmp_path,
			     strerror(errno));
		goto abort_tmp;
	}
	sync_parent_dir(t->path);
	tmpfile_free(t);
	return 0;
abort_tmp:
	mpk_tmpfile_abort(t);
	return err;
}

void mpk_tmpfile_abort(struct mpk_tmpfile *t)
{
	if (t->fd >= 0)
		unlink(t->tmp_path);
	tmpfile_free(t);
}
