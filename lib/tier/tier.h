/* SPDX-License-Identifier: MIT */
/* Backing tiers: where expert bytes come from when they are not in host memory. */
#ifndef MP_TIER_H
#define MP_TIER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include <moepager/store.h>

#include "tier/io.h"

struct mp_store;

/*
 * A tier reads one expert into the destination chunks the pager gives it.
 * A new tier (a second SSD, a remote store, a fault-injection wrapper) is a
 * struct mp_tier_ops and a constructor; nothing under uffd/ changes.
 *
 * The pager verifies the expert's checksum over the bytes a tier passes to
 * rd->ready, on every read from every tier, so a wrapper that corrupts,
 * shortens, delays or fails reads exercises the same checks a real
 * failure would. A wrapper embeds struct mp_tier, keeps the tier it wraps,
 * and calls it with a copy of rd whose ready/arg are its own.
 */
struct mp_tier;

struct mp_tier_read {
	uint32_t layer;
	uint32_t expert;
	uint64_t offset;		/* the expert's offset in the store file */
	uint64_t bytes;			/* expert bytes */
	uint64_t checksum;		/* expected XXH3-64 (verified by the pager) */
	const struct iovec *iov;	/* destination chunks, in order, page-sized multiples */
	unsigned iovcnt;
	struct mp_io *io;		/* the calling worker's ring (others ignore it) */
	/* Must be called in order over every byte read (buf lies inside iov). */
	mp_io_ready_fn ready;
	void *arg;
	/* Set when the pager closes: a slow tier should stop with -ECANCELED. */
	const atomic_bool *cancel;
	/* May be NULL: see struct mp_io_read (a tier without a queue ignores it). */
	bool (*yield)(void *arg);
	void *yield_arg;
	/*
	 * May be NULL: see struct mp_io_read. A tier that does not read through
	 * a queue (or fails before reading) may never call it; the caller then
	 * does that work after the read.
	 */
	int (*issued)(void *arg);
	void *issued_arg;
};

struct mp_tier_ops {
	const char *name;
	/*
	 * Reads the expert rd describes into rd->iov. Returns 0, or -EIO (the
	 * device failed), -ENODATA (the file is shorter than the store says),
	 * -ENOMEM, -ECANCELED, or what rd->ready returned. Called by several
	 * fill workers at once, each with its own rd->io.
	 */
	int (*read)(struct mp_tier *t, const struct mp_tier_read *rd);
	/* Frees the tier, and a wrapper the tier it wraps. */
	void (*destroy)(struct mp_tier *t);
};

struct mp_tier {
	const struct mp_tier_ops *ops;
	char name[48];			/* for messages: "file /data/m.mpk (O_DIRECT)" */
	uint32_t number;		/* probe tier number: 1 file, 2+ stacked after it */
};

static inline int mp_tier_read(struct mp_tier *t, const struct mp_tier_read *rd)
{
	return t->ops->read(t, rd);
}

static inline void mp_tier_destroy(struct mp_tier *t)
{
	if (t)
		t->ops->destroy(t);
}

/*
 * The file tier
 */

struct mp_tier_file_config {
	uint32_t request_bytes;		/* bytes per io_uring request; 0: 512 KiB */
	bool no_direct;			/* buffered reads even where O_DIRECT works */
};

/*
 * Reads experts from the store's file with io_uring, O_DIRECT where the
 * file system allows it (it says once when it falls back). Returns 0 and
 * sets *out, or the open error.
 */
int mp_tier_file_open(const struct mp_store *s, const struct mp_tier_file_config *cfg,
		      struct mp_tier **out);
/* The same over any file whose expert extents the caller knows (an adapter, a variant). */
int mp_tier_file_open_path(const char *path, const struct mp_tier_file_config *cfg,
			   struct mp_tier **out);
/* True when the file tier reads with O_DIRECT (it may have fallen back since open). */
bool mp_tier_file_direct(const struct mp_tier *t);

#endif /* MP_TIER_H */
