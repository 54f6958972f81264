// SPDX-License-Identifier: MIT
/* The file tier: experts read from the .mpk with io_uring, O_DIRECT when the file system allows. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <moepager/store.h>

#include "base/base.h"
#include "tier/tier.h"

#define DEFAULT_REQUEST_BYTES	(512u << 10)
#define DIRECT_ALIGN		4096u

struct tier_file {
	struct mp_tier t;
	char *path;
	int direct_fd;		/* -1 when O_DIRECT is refused */
	int buffered_fd;
	uint32_t align;
	uint32_t request_bytes;
	atomic_bool direct;	/* cleared once if an O_DIRECT read is refused */
};

static uint32_t dio_align(int fd)
{
#ifdef STATX_DIOALIGN
	struct statx stx;

	if (!statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) &&
	    (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_offset_align)
		return MP_MAX(MP_MAX(stx.stx_dio_offset_align, stx.stx_dio_mem_align),
			      DIRECT_ALIGN);
#else
	(void)fd;
#endif
	return DIRECT_ALIGN;
}

static int file_read(struct mp_tier *t, const struct mp_tier_read *rd)
{
	struct tier_file *f = container_of(t, struct tier_file, t);
	char what[48];
	bool direct = atomic_load(&f->direct);
	struct mp_io_read r = {
		.fd = direct ? f->direct_fd : f->buffered_fd,
		.offset = rd->offset,
		.len = rd->bytes,
		.iov = rd->iov,
		.iovcnt = rd->iovcnt,
		.request_bytes = f->request_bytes,
		.align = direct ? f->align : 1,
		.ready = rd->ready,
		.arg = rd->arg,
		.what = what,
		.path = f->path,
		.yield = rd->yield,
		.yield_arg = rd->yield_arg,
		.issued = rd->issued,
		.issued_arg = rd->issued_arg,
	};
	int err;

	if (rd->cancel && atomic_load(rd->cancel))
		return -ECANCELED;
	snprintf(what, sizeof(what), "layer %u expert %u", rd->layer, rd->expert);
	err = mp_io_read(rd->io, &r);
	if (err == -EINVAL && direct && atomic_exchange(&f->direct, false))
		/*
		 * Some file systems accept O_DIRECT at open and refuse the
		 * reads. The bytes already handed to ready are spent, so fail
		 * this attempt; the pager's retry reads buffered.
		 */
		mp_info("file tier %s: O_DIRECT read refused (%s); reading buffered from now on",
			f->path, strerror(EINVAL));
	return err;
}

static void file_destroy(struct mp_tier *t)
{
	struct tier_file *f = container_of(t, struct tier_file, t);

	if (f->direct_fd >= 0)
		close(f->direct_fd);
	if (f->buffered_fd >= 0)
		close(f->buffered_fd);
	free(f->path);
	free(f);
}

static const struct mp_tier_ops file_ops = {
	.name = "file",
	.read = file_read,
	.destroy = file_destroy,
};

bool mp_tier_file_direct(const struct mp_tier *t)
{
	const struct tier_file *f = container_of(t, const struct tier_file, t);

	return t->ops == &file_ops && atomic_load(&f->direct);
}

int mp_tier_file_open(const struct mp_store *s, const struct mp_tier_file_config *cfg,
		      struct mp_tier **out)
{
	return mp_tier_file_open_path(mp_store_path(s), cfg, out);
}

int mp_tier_file_open_path(const char *path, const struct mp_tier_file_config *cfg,
			   struct mp_tier **out)
{
	struct tier_file *f;
	int err;

	*out = NULL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->t.ops = &file_ops;
	f->t.number = 1;
	f->direct_fd = -1;
	f->path = strdup(path);
	f->request_bytes = cfg && cfg->request_bytes ? cfg->request_bytes : DEFAULT_REQUEST_BYTES;
	f->buffered_fd = open(path, O_RDONLY | O_CLOEXEC);
	if (!f->path || f->buffered_fd < 0) {
		err = f->path ? mp_err(-errno, "file tier: %s: %s", path, strerror(errno)) :
				-ENOMEM;
		goto destroy;
	}
	if (!cfg || !cfg->no_direct) {
		f->direct_fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
		if (f->direct_fd < 0)
			mp_info("file tier %s: O_DIRECT refused by the file system (%s); reading "
				"buffered (cold-cache figures then need dropped caches)", path,
				strerror(errno));
	}
	if (f->direct_fd >= 0) {
		f->align = dio_align(f->direct_fd);
		atomic_store(&f->direct, true);
	}
	if (f->request_bytes % DIRECT_ALIGN) {
		err = mp_err(-EINVAL, "file tier: request size %u is not a multiple of %u",
			     f->request_bytes, DIRECT_ALIGN);
		goto destroy;
	}
	snprintf(f->t.name, sizeof(f->t.name), "file%s", f->direct_fd >= 0 ? " (O_DIRECT)" : "");
	mp_debug("file tier %s: %s, %u-byte requests", path,
		 f->direct_fd >= 0 ? "O_DIRECT" : "buffered", f->request_bytes);
	*out = &f->t;
	return 0;

destroy:
	file_destroy(&f->t);
	return err;
}
