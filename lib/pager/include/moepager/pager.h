/* SPDX-License-Identifier: MIT */
/*
 * The pager: every expert of a model behind a plain const pointer, paged in
 * by a userfaultfd handler from host memory or the model file, under a
 * memory budget. docs/region.md describes the mechanism and its figures.
 */
#ifndef MOEPAGER_PAGER_H
#define MOEPAGER_PAGER_H

#include <moepager/adapter.h>
#include <moepager/common.h>
#include <moepager/store.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mp_pager;

/*
 * Configuration
 */

/* Read attempts per expert when mp_pager_config.read_attempts is 0. */
#define MP_PAGER_DEFAULT_READ_ATTEMPTS 8u

/*
 * Who resolves an expert the engine asks for through mp_pager_source_ops()
 * while it is routed but not yet in memory (docs/region.md, "Small experts"):
 */
enum mp_pager_resolve {
	/* The asking thread for experts below 2 MiB, the fault path above. */
	MP_RESOLVE_AUTO = 0,
	/*
	 * The fault path: the engine touches the expert, the fault handler
	 * records the waiting thread, a fill thread reads and maps it.
	 */
	MP_RESOLVE_FAULT = 1,
	/*
	 * The asking thread: it reads (or maps from host memory) an expert no
	 * fill thread has started, and waits for one a fill thread is reading;
	 * no fault, no hand-off to other threads. Faults on experts asked for
	 * otherwise still take the fault path.
	 */
	MP_RESOLVE_CALLER = 2,
};

struct mp_pager_config {
	/*
	 * Bytes of expert data held in memory, mapped or not. 0: the budget
	 * string, else $MOEPAGER_BUDGET, else every expert (capped at half the
	 * machine's memory). Must hold at least one expert.
	 */
	uint64_t budget_bytes;
	/* "8G", "512M", "40%" (of the model's expert bytes): see mp_budget_parse(). May be NULL. */
	const char *budget;
	/*
	 * Eviction policy: "lru" (default), "fifo", "lfu", "finemoe", "coserve"
	 * or "belady" (mp_eviction_policy_names(); docs/prefetch.md). NULL:
	 * $MOEPAGER_EVICTION, else "lru".
	 */
	const char *eviction;
	/* Expert slots per layer (>= experts; the rest wait for adapters). 0: 2 x experts. */
	uint32_t slots_per_layer;
	/* Threads reading experts from the file tier. 0: 2. */
	uint32_t fill_threads;
	/* io_uring requests in flight per expert read. 0: 32. */
	uint32_t io_depth;
	/* Bytes per io_uring request. 0: 512 KiB. */
	uint32_t io_request_bytes;
	/*
	 * Read attempts before an expert is poisoned (its readers get an error).
	 * 0: MP_PAGER_DEFAULT_READ_ATTEMPTS, so a device failing one read in
	 * five still serves every expert (0.2^8 per expert) while a dead one
	 * fails within ~60 ms of pauses.
	 */
	uint32_t read_attempts;
	/* Place host memory on numa_node (only when the machine has more than one node). */
	bool numa_bind;
	int numa_node;
	/* Buffered reads even where the file system allows O_DIRECT. */
	bool no_direct;
	/*
	 * Do not start reading routed experts when mp_pager_route() reports
	 * them. By default a routed expert that is not resident is read at
	 * once, as demand (ahead of prefetches), so the k experts of a token
	 * are read in parallel rather than one fault at a time.
	 */
	bool no_route_fill;
	/*
	 * Under a budget of fewer than fill_threads + 2 experts, microseconds
	 * an expert that threads faulted on stays in memory before it may be
	 * evicted, so concurrent fills do not evict each other's experts
	 * before their readers read them. 0: 2000. UINT32_MAX: none.
	 */
	uint32_t min_resident_us;
	/* Spare chunk bytes kept for recycling beyond the budget. 0: two experts' worth. */
	uint64_t spare_bytes;
	/*
	 * Fault injection (docs/fault-injection.md), e.g. "read:eio:p=0.01;
	 * alloc:enomem:after=10": the file tier's reads and the pager's memory
	 * fail as the rules say. NULL: $MOEPAGER_FAULT; "": none. A bad spec
	 * fails the open with -EINVAL naming the rule and the position.
	 */
	const char *fault;
	/* Seed of the rules' random draws. 0: $MOEPAGER_FAULT_SEED, else 1. */
	uint64_t fault_seed;
	/*
	 * enum mp_pager_resolve; anything else is refused with -EINVAL. 0:
	 * $MOEPAGER_RESOLVE ("auto", "fault", "caller"), else auto.
	 */
	uint32_t resolve;
	uint32_t reserved0;		/* must be zero */
	MP_RESERVED(7);
};

/* Fills cfg with the defaults: all zero (a zeroed struct means the same). */
MP_API void mp_pager_config_init(struct mp_pager_config *cfg);

/*
 * Parses a budget: bytes with an optional K/M/G/T suffix (powers of 1024,
 * "8G", "512M", "1.5G"), or a percentage of model_bytes ("40%"). Returns 0
 * and sets *out, or -EINVAL with a message naming the bad string.
 */
MP_API int mp_budget_parse(const char *s, uint64_t model_bytes, uint64_t *out);

/*
 * Lifetime
 */

/*
 * Opens a pager over a store (borrowed: it must outlive the pager):
 * reserves the expert range, opens the userfaultfd and starts the handler
 * and fill threads. No expert is read yet. Returns 0 and sets *out, or
 * -EPERM (no userfaultfd permission: the message says what is missing),
 * -EOPNOTSUPP (kernel too old), -EINVAL (bad config: budget below one
 * expert, unknown policy), -ENOMEM, or the file tier's open error.
 */
MP_API int mp_pager_open(struct mp_store *store, const struct mp_pager_config *cfg,
			 struct mp_pager **out);

/*
 * Closes the pager. Threads blocked in a fault on its range are released
 * with SIGBUS (an error from mp_pager_guard()); threads inside
 * mp_pager_guard() on this pager are waited for. No other thread may touch
 * expert memory once close has started. NULL is allowed.
 */
MP_API void mp_pager_close(struct mp_pager *p);

MP_API struct mp_store *mp_pager_store(const struct mp_pager *p);

/*
 * Expert memory
 */

/*
 * The expert's gate|up|down bytes as the .mpk lays them out
 * (mp_store_expert_bytes() long). The pointer is valid until close and
 * never changes; the bytes fault in on first touch. Read it only inside
 * mp_pager_guard() when a failing tier must not kill the process. Returns
 * NULL (with a message) for an id out of range. An expert poisoned by
 * failed reads is cleared, so the next access reads it again.
 */
MP_API const void *mp_pager_expert(struct mp_pager *p, uint32_t layer, uint32_t expert);

enum mp_proj {
	MP_PROJ_GATE = 0,	/* [ffn x hidden] */
	MP_PROJ_UP = 1,		/* [ffn x hidden] */
	MP_PROJ_DOWN = 2,	/* [hidden x ffn] */
};

/* One projection of the expert (see mp_pager_expert()). */
MP_API const void *mp_pager_expert_proj(struct mp_pager *p, uint32_t layer, uint32_t expert,
					enum mp_proj proj);

/*
 * Reports the routing of (request, token) in layer: the k experts ids
 * with gate weights (may be NULL), before the engine reads them. Feeds the
 * eviction policy and the hit statistics and, with route_fill, starts
 * reading routed experts that are not resident. Returns 0 or -EINVAL.
 */
MP_API int mp_pager_route(struct mp_pager *p, uint32_t request, uint32_t token, uint32_t layer,
			  const uint32_t *ids, const float *weights, uint32_t k);

/*
 * Queues an asynchronous read of the expert (higher priority first; demand
 * faults always go ahead of every prefetch) and maps it when done, so a
 * later read does not fault. Returns 1 when queued, 0 when it is already
 * resident, being read or queued (its priority raised if lower), or
 * -EINVAL.
 */
MP_API int mp_pager_prefetch(struct mp_pager *p, uint32_t layer, uint32_t expert, int priority);

/* Waits until no read is queued or running, or timeout_ms passes. Returns 0 or -ETIMEDOUT. */
MP_API int mp_pager_wait_idle(struct mp_pager *p, uint32_t timeout_ms);

enum mp_evict_flags {
	/* Unmap only: the data stays in host memory (the next touch is a host-tier fault). */
	MP_EVICT_KEEP_HOST = 1u << 0,
	/*
	 * An expert being read from a tier is evicted when its read ends
	 * instead of -EBUSY; one being mapped or unmapped is evicted once that
	 * ends (microseconds); a prefetch of it that is queued is dropped.
	 */
	MP_EVICT_DEFER = 1u << 1,
};

/*
 * Evicts the expert now (an access afterwards faults it back in, with the
 * right bytes). Returns 0, -ENOENT when it is not resident, -EBUSY when it
 * is being read, mapped or unmapped, or its pages are pinned, or -EINVAL.
 *
 * With MP_EVICT_DEFER: returns 1 when it is being read (the read maps it,
 * wakes the threads that faulted on it meanwhile, then evicts it, so one of
 * them may fault once more and read it again, as when a mapped expert a
 * thread reads is evicted), 0 once evicted, -ENOENT when it is not resident
 * (a queued prefetch of it dropped), and -EBUSY for pinned pages, or a map,
 * unmap or clearing of its poison still running after a second (waited for
 * with the pager's lock released).
 */
MP_API int mp_pager_evict(struct mp_pager *p, uint32_t layer, uint32_t expert, unsigned flags);

enum mp_residency {
	MP_RES_NONE = 0,	/* not in memory */
	MP_RES_FILLING,		/* being read from a tier */
	MP_RES_HOST,		/* in host memory, unmapped: a touch is a host-tier fault */
	MP_RES_MAPPED,		/* mapped: a touch does not fault */
	MP_RES_POISONED,	/* reads failed: a touch raises SIGBUS until cleared */
};

/* Where the expert is now (a snapshot), or -EINVAL. */
MP_API int mp_pager_residency(struct mp_pager *p, uint32_t layer, uint32_t expert);

/*
 * Rows from other sources
 *
 * The range has slots_per_layer rows per layer; rows below the model's
 * experts hold its own. A spare row can be bound to an expert of another
 * file: an adapter's fine-tuned expert, or another variant's expert at the
 * same layer. A bound row is paged like the model's own (same budget,
 * eviction, prefetch, routing by row id, mp_pager_expert(p, layer, row));
 * its bytes are read from its file and checked against that file's
 * checksum. docs/region.md, "Rows from several sources".
 */

/* Sources a pager can hold at once besides its own store. */
#define MP_PAGER_MAX_SOURCES 255u

/*
 * Adds another variant of the model (borrowed until removed or the pager
 * closes) whose experts may back rows. Returns its source id (>= 1), or
 * -EMEDIUMTYPE when its geometry or expert size differs from the pager's
 * store, -ENOSPC (MP_PAGER_MAX_SOURCES in use), or the file's open error.
 */
MP_API int mp_pager_add_store(struct mp_pager *p, struct mp_store *s);
/*
 * Adds an adapter (borrowed likewise) whose experts may back rows. Returns
 * its source id, -EMEDIUMTYPE when it was made for another base, -ENOSPC,
 * or the open error.
 */
MP_API int mp_pager_add_adapter(struct mp_pager *p, struct mp_adapter *a);
/* Removes a source no row is bound to. Returns 0, -EBUSY (rows bound) or -EINVAL. */
MP_API int mp_pager_remove_source(struct mp_pager *p, int source);

/*
 * Binds spare row (layer, row) (experts <= row < slots_per_layer, not
 * bound) to source's expert: for a variant, its expert `expert` of the
 * same layer; for an adapter, the base expert `expert` it replaces there.
 * Nothing is read yet. Returns 0, -EINVAL (bad ids or source), -EEXIST
 * (the row is bound), -ENOENT (the adapter does not replace that expert).
 */
MP_API int mp_pager_bind(struct mp_pager *p, uint32_t layer, uint32_t row, int source,
			 uint32_t expert);
/*
 * Unbinds a bound row: waits for a read of it to end, drops its memory,
 * and makes it spare again (a later touch raises SIGBUS). No thread may
 * read it meanwhile. Returns 0 or -EINVAL (not a bound row).
 */
MP_API int mp_pager_unbind(struct mp_pager *p, uint32_t layer, uint32_t row);

/*
 * Budget
 */

/*
 * Changes the budget. Shrinking evicts down to it before returning (an
 * expert being read when this is called may keep the total above it until
 * its read ends). Returns 0, or -EINVAL when bytes is below one expert.
 */
MP_API int mp_pager_set_budget(struct mp_pager *p, uint64_t bytes);
MP_API uint64_t mp_pager_budget(const struct mp_pager *p);

/*
 * Guard
 */

/*
 * Runs fn(arg) on the calling thread and returns its result, or, when fn
 * touches a poisoned expert of any open pager (the reads failed, or the
 * pager closed while the thread waited), the recorded cause (-EIO,
 * -EBADMSG for a checksum mismatch, -ENODATA for a truncated file,
 * -ESHUTDOWN after close) with a message naming layer, expert and cause.
 * fn is abandoned with siglongjmp(): it must hold no locks and own no
 * memory at that point. The expert is then cleared, so a later access
 * reads it again. Nests; a SIGBUS elsewhere goes to the handler that was
 * installed before.
 */
MP_API int mp_pager_guard(struct mp_pager *p, int (*fn)(void *arg), void *arg);

/*
 * Statistics
 */

#define MP_PAGER_HIST_BUCKETS 40

struct mp_pager_stats {
	uint64_t hits;			/* routed experts that were mapped when reported */
	uint64_t misses;		/* routed experts that were not */
	/*
	 * Demand faults served from the file tier and from host memory; an
	 * engine request resolved on the asking thread (MP_RESOLVE_CALLER)
	 * counts as one.
	 */
	uint64_t faults_file;
	uint64_t faults_host;
	/* Blocked threads, counted per fault message and per engine request that waited. */
	uint64_t fault_waits;
	uint64_t stall_ns;		/* time threads spent blocked in them, summed */
	/* Fault service latency (first fault to mapped): bucket i counts [2^i, 2^(i+1)) ns. */
	uint64_t fault_latency_hist[MP_PAGER_HIST_BUCKETS];
	uint64_t prefetch_issued;	/* prefetches queued */
	uint64_t prefetch_used;		/* prefetched experts used before eviction */
	uint64_t prefetch_wasted;	/* prefetched experts evicted unused */
	uint64_t prefetch_late;		/* prefetches a thread faulted on while read */
	uint64_t bytes_file;		/* bytes read from the file tier */
	uint64_t bytes_host;		/* bytes mapped back from host memory */
	uint64_t evictions;		/* experts dropped from memory */
	uint64_t evictions_view;	/* experts unmapped but kept in host memory */
	uint64_t read_errors;		/* failed read attempts (I/O error, checksum, short) */
	uint64_t poisoned;		/* experts poisoned after their attempts ran out */
	uint64_t resident_bytes;	/* expert bytes in memory now, mapped or not */
	uint64_t resident_peak;		/* the most resident_bytes ever was */
	uint64_t memory_bytes;		/* pages held, spare chunks and rounding included */
	uint64_t budget_bytes;
	uint32_t resident_experts;
	uint32_t mapped_experts;
	/*
	 * Demand reads from the file tier and their read and checksum time,
	 * summed (prefetch reads make way for demand ones, so their times say
	 * little about the device).
	 */
	uint64_t file_reads;
	uint64_t file_read_ns;
	/* Of the demand reads, those done by the asking engine thread (MP_RESOLVE_CALLER). */
	uint64_t caller_reads;
	/*
	 * Of stall_ns, the waits of engine requests resolved on the asking
	 * thread (read there or waited for): one thread counted, yet the
	 * engine's other threads wait for it too (a fault blocks each of them).
	 */
	uint64_t caller_stall_ns;
	uint64_t fill_threads;		/* config.fill_threads, or the default */
	/* Of misses, those of experts evicted before: what an eviction cost later. */
	uint64_t refaults;
	/*
	 * Since the pager opened (mp_pager_stats_reset() leaves them): chunk
	 * bytes newly allocated (pages the kernel zeroed, then a read
	 * overwrote; recycled chunks are not counted), spare chunk bytes given
	 * back to the kernel, and the fill threads' CPU time (reads, checksums,
	 * moves, new chunks; fills on the asking thread are the engine's).
	 */
	uint64_t fresh_bytes;
	uint64_t released_bytes;
	uint64_t fill_cpu_ns;
	MP_RESERVED(1);
};

/* A snapshot of the counters. */
MP_API void mp_pager_stats(struct mp_pager *p, struct mp_pager_stats *out);
/* Zeroes the counters (not the resident/budget figures). */
MP_API void mp_pager_stats_reset(struct mp_pager *p);
/*
 * The q-quantile (0..1) of the fault latency histogram in ns, interpolated
 * within its log2 bucket; 0 when no fault was recorded.
 */
MP_API uint64_t mp_pager_stats_quantile(const struct mp_pager_stats *s, double q);

/*
 * Engine glue
 */

struct mp_expert_source_ops;
/* The runner's expert source backed by a pager (ctx = the struct mp_pager *). */
MP_API const struct mp_expert_source_ops *mp_pager_source_ops(void);

struct mp_row_ops;
/* The row calls above as <moepager/source.h>'s struct mp_row_ops (ctx = the pager). */
MP_API const struct mp_row_ops *mp_pager_row_ops(void);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_PAGER_H */
