/* SPDX-License-Identifier: MIT */
/*
 * A host tier shared by processes: a pager daemon owns the expert pages (in
 * a memfd) and the budget; engine processes attach over a UNIX socket, map
 * the memfd into their expert range and hand the daemon their userfaultfd,
 * which it resolves (UFFDIO_CONTINUE) and evicts from (holes punched in the
 * memfd, so every process loses the page at once). The daemon also holds
 * the model's dense weights once, in a sealed memfd the engines map
 * read-only. docs/region.md, "Sharing the host tier", describes it.
 */
#ifndef MOEPAGER_SHARE_H
#define MOEPAGER_SHARE_H

#include <moepager/common.h>
#include <moepager/source.h>
#include <moepager/store.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The daemon
 */

struct mp_pagerd;

/* What pages hold the host tier (mp_pagerd_config.pages). */
enum mp_pagerd_pages {
	MP_PAGERD_PAGES_SMALL = 0,	/* 4 KiB shmem pages */
	MP_PAGERD_PAGES_THP,		/* shmem asked for THP (MADV_HUGEPAGE): the kernel's
					 * shmem_enabled setting decides */
	MP_PAGERD_PAGES_HUGETLB,	/* MFD_HUGETLB 2 MiB pages (vm.nr_hugepages must hold
					 * the budget); an expert's tail padding then reads as
					 * zeros instead of raising SIGBUS */
};

struct mp_pagerd_config {
	const char *socket_path;	/* the UNIX socket engines attach to (required) */
	uint64_t budget_bytes;		/* expert bytes in memory across every process */
	const char *budget;		/* or a mp_budget_parse() string; both 0: half of RAM */
	uint32_t max_clients;		/* 0: 64 */
	uint32_t pages;			/* enum mp_pagerd_pages */
	MP_RESERVED(6);
};

struct mp_pagerd_stats {
	uint64_t budget_bytes;
	uint64_t resident_bytes;	/* expert bytes in the memfd now */
	uint64_t resident_peak_bytes;
	uint64_t memfd_bytes;		/* pages the memfd holds (st_blocks), all processes' */
	uint64_t disk_bytes_read;	/* bytes read from the file tier */
	uint64_t fills;			/* experts read into the memfd */
	uint64_t evictions;		/* experts dropped (holes punched) */
	uint64_t faults;		/* fault messages served, every client */
	uint64_t continues;		/* experts mapped into a client with UFFDIO_CONTINUE */
	uint64_t fill_failures;		/* fills that failed (the faulting thread got SIGBUS) */
	uint32_t clients;		/* attached now */
	uint32_t clients_total;		/* attached since open */
	uint32_t refused;		/* handshakes refused (version, model, full) */
	uint32_t dropped;		/* clients gone: detached, died, refused or failed */
	uint64_t dense_bytes;		/* the dense weights' memfd, read once at open */
	MP_RESERVED(7);
};

/*
 * Opens a daemon over a store (borrowed: it must outlive the daemon):
 * creates the memfd (sparse, one stride per expert), the file tier and the
 * listening socket (refused with -EADDRINUSE when a live daemon answers on
 * socket_path; a stale socket file is replaced), then reads every dense
 * tensor into a second memfd, checking its checksum, and seals it. Returns
 * 0 and sets *out, -EINVAL for a bad config (the message names the field),
 * the read's error (-EBADMSG naming the tensor), or -errno.
 */
MP_API int mp_pagerd_open(struct mp_store *store, const struct mp_pagerd_config *cfg,
			  struct mp_pagerd **out);
/*
 * Serves handshakes, faults and requests on the calling thread until
 * mp_pagerd_stop(). Returns 0, or -errno when polling itself failed.
 */
MP_API int mp_pagerd_run(struct mp_pagerd *d);
/* Makes mp_pagerd_run() return soon. Async-signal-safe. */
MP_API void mp_pagerd_stop(struct mp_pagerd *d);
/* A snapshot of the counters (from any thread). */
MP_API void mp_pagerd_stats(struct mp_pagerd *d, struct mp_pagerd_stats *out);
/* Closes the socket (removing its file), every client and the memfd. NULL is allowed. */
MP_API void mp_pagerd_close(struct mp_pagerd *d);

/*
 * The engine side
 */

struct mp_attach;

/*
 * Attaches to the daemon at socket_path for the model in store (borrowed):
 * the daemon refuses another protocol, another library version or another
 * model (mp_store_identity()) with a message, returned here as -EPROTO
 * (version) or -ESTALE (model) with that message logged. On success the
 * experts are readable through mp_attach_expert(), faulted in by the
 * daemon, and the dense weights through mp_attach_tensor(). Returns 0 and
 * sets *out, -ECONNREFUSED/-ENOENT when nothing listens, -EPERM/-EOPNOTSUPP
 * (userfaultfd), or -errno.
 */
MP_API int mp_attach_open(struct mp_store *store, const char *socket_path,
			  struct mp_attach **out);
/*
 * The expert's bytes as the .mpk lays them out, valid until close. Read
 * them inside mp_attach_guard(): a failed fill, or the daemon's death,
 * becomes an error there instead of SIGBUS. NULL for an id out of range.
 */
MP_API const void *mp_attach_expert(struct mp_attach *a, uint32_t layer, uint32_t expert);
/*
 * The bytes of t (an entry of the attached store: mp_store_tensor_at() or
 * mp_store_tensor()) in the daemon's memfd of dense weights, as the .mpk
 * holds them, checked by the daemon when it read them: read-only, 4 KiB
 * aligned, valid until close, readable without a guard (they never fault
 * to the daemon, and stay readable after its death). NULL for a tensor of
 * another store.
 */
MP_API const void *mp_attach_tensor(struct mp_attach *a, const struct mp_tensor_info *t);
/*
 * Runs fn(arg) and returns its result, or -EIO (the daemon could not read
 * the expert: the next access asks again) or -ENOTCONN (the daemon is gone:
 * every later fault fails the same way) with a message naming the expert.
 */
MP_API int mp_attach_guard(struct mp_attach *a, int (*fn)(void *arg), void *arg);
/*
 * The expert source over an attachment (ctx: the struct mp_attach); it
 * lends the runner the dense weights (the tensor op).
 */
MP_API const struct mp_expert_source_ops *mp_attach_source_ops(void);
/*
 * Changes the daemon's budget, for every process attached: a smaller one
 * evicts down to it before this returns. Returns 0, -EINVAL (below one
 * expert, with the daemon's message), -ENOTCONN when it is gone, or -errno.
 */
MP_API int mp_attach_set_budget(struct mp_attach *a, uint64_t bytes);
/*
 * Moves the daemon's host tier (the experts' and the dense weights' memfds)
 * to NUMA node `node` in place: its pages migrate (mbind() MPOL_MF_MOVE_ALL;
 * the pages other processes map need CAP_SYS_NICE, else they stay), every
 * mapping follows, nothing is copied or remapped, and later fills land
 * there. msg (may be NULL) gets the daemon's account (pages on the node).
 * Returns 0, -ENODEV (no such node, with the daemon's message), -ENOTCONN
 * when it is gone, or -errno.
 */
MP_API int mp_attach_set_node(struct mp_attach *a, int node, char *msg, size_t len);
/*
 * Warms the attachment: maps every expert the daemon's memfd holds now
 * into this process (one fault each, served without reading the disk), and
 * the dense weights, so the first requests do not fault on them. *touched
 * (may be NULL) gets how many experts. Returns 0, or the guard's error
 * (-ENOTCONN when the daemon is gone).
 */
MP_API int mp_attach_warm(struct mp_attach *a, uint32_t *touched);
/* Asks the daemon for its counters. Returns 0, -ENOTCONN when it is gone, or -errno. */
MP_API int mp_attach_daemon_stats(struct mp_attach *a, struct mp_pagerd_stats *out);
/*
 * Detaches: unmaps the range and closes the socket (the daemon drops the
 * client's userfaultfd). No thread may touch expert memory any more. NULL
 * is allowed.
 */
MP_API void mp_attach_close(struct mp_attach *a);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_SHARE_H */
