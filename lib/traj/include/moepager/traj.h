/* SPDX-License-Identifier: MIT */
/*
 * Expert trajectories: the feed of routing decisions and expert faults that
 * the prefetcher learns from, and the trajectory file `moepager trace` writes.
 * docs/probes.md describes the probes behind the feed, docs/trajectory-format.md the file.
 */
#ifndef MOEPAGER_TRAJ_H
#define MOEPAGER_TRAJ_H

#include <stdio.h>

#include <moepager/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Records
 *
 * The BPF ring buffer and the in-process recorder deliver the same record.
 */

/* Largest top-k a route record holds (== MP_MAX_TOPK). */
#define MP_TRAJ_MAX_K		64u
/* request/token of a record that has none (page faults, pager events). */
#define MP_TRAJ_NONE		UINT32_MAX
/* Slots of a latency histogram: slot s counts [2^s, 2^(s+1)) ns, the last is open-ended. */
#define MP_TRAJ_HIST_SLOTS	40u

enum mp_traj_kind {
	MP_TRAJ_ROUTE = 1,		/* the router chose ids[0..k) for (request, token) */
	MP_TRAJ_PGFAULT = 2,		/* user page fault at value (address) in the expert */
	MP_TRAJ_FAULT_BEGIN = 3,	/* the pager started serving (layer, expert) from tier */
	MP_TRAJ_FAULT_DONE = 4,		/* ... and finished after value ns, with err */
	MP_TRAJ_PREFETCH_ISSUE = 5,
	MP_TRAJ_PREFETCH_DONE = 6,	/* value: latency ns */
	MP_TRAJ_EVICT = 7,		/* value: bytes freed (0: unmapped, kept in host tier) */
	MP_TRAJ_PREFILL = 8,		/* prompt positions token..token+value-1 of request */
};

/* mp_traj_rec.flags */
#define MP_TRAJ_F_WEIGHTS	0x1u	/* weights[0..k) are valid */

struct mp_traj_rec {
	uint64_t ts_ns;		/* CLOCK_MONOTONIC */
	uint64_t value;		/* address, latency ns or bytes: see enum mp_traj_kind */
	uint32_t kind;		/* enum mp_traj_kind */
	uint32_t tid;		/* thread that fired the probe or faulted */
	uint32_t request;	/* MP_TRAJ_NONE unless kind is MP_TRAJ_ROUTE or MP_TRAJ_PREFILL */
	uint32_t token;		/* route: generated-token index, MP_TRAJ_NONE for a prompt
				 * token; prefill: first sequence position */
	uint32_t layer;
	uint32_t expert;	/* MP_TRAJ_NONE for routes: see ids */
	uint32_t tier;
	int32_t err;		/* negative errno of a failed fault or prefetch, else 0 */
	uint32_t k;		/* route: number of ids */
	uint32_t flags;
	uint32_t ids[MP_TRAJ_MAX_K];
	float weights[MP_TRAJ_MAX_K];
};

/*
 * The feed
 *
 * Lifecycle: mp_traj_open() -> mp_traj_start() -> mp_traj_poll()... ->
 * mp_traj_stop() -> mp_traj_poll(t, 0, ...) to drain -> mp_traj_close().
 */

enum mp_traj_source {
	MP_TRAJ_SRC_AUTO = 0,	/* BPF when it loads and attaches, else in-process */
	MP_TRAJ_SRC_BPF = 1,	/* USDT probes and page faults through a BPF ring buffer */
	MP_TRAJ_SRC_INPROC = 2,	/* records queued by mp_traj_route()/mp_traj_note() here */
};

/*
 * The expert range as the page-fault program sees it: slot s = (address -
 * base) / slot_bytes holds layer s / slots_per_layer, expert s % slots_per_layer.
 */
struct mp_traj_range {
	uint64_t base;
	uint64_t slot_bytes;		/* 0: no page-fault attribution */
	uint32_t slots_per_layer;
	uint32_t layers;
};

struct mp_traj_opts {
	enum mp_traj_source source;
	int pid;			/* process to record (BPF only); 0 = this process */
	/*
	 * File holding the moepager USDT probes, as mapped by pid. NULL: the
	 * libmoepager.so mapped by pid, else its executable (/proc/PID/exe).
	 */
	const char *binary;
	struct mp_traj_range range;
	uint32_t ring_bytes;		/* BPF ring buffer, a power of two; 0 = 4 MiB */
	uint32_t queue_records;		/* in-process queue, a power of two; 0 = 4096 */
	/* Pin the count maps under pin_dir (NULL: /sys/fs/bpf/moepager/<pid>) at start. */
	bool pin;
	bool keep_pins;			/* leave them pinned after stop/close */
	const char *pin_dir;
	/*
	 * BPF: also attribute page faults in every expert range pid's pagers
	 * open, without a range: those open at start (listed by its
	 * libmoepager, docs/probes.md) and those opened later (moepager:region).
	 */
	bool pager_ranges;
	MP_RESERVED(8);
};

struct mp_traj;

/*
 * Opens a feed: for BPF, opens, configures and loads the programs (mounting
 * bpffs first if pinning and it is absent); for the in-process recorder,
 * allocates the queue. With MP_TRAJ_SRC_AUTO a BPF failure falls back to
 * the in-process recorder. Either way one info line says which source is
 * used and why. Returns 0, -EPERM (no BPF rights), -EOPNOTSUPP (built
 * without BPF), -ESRCH (no such pid), -ENOENT (no probes in the binary),
 * -EINVAL (bad options), -ENOMEM.
 */
MP_API int mp_traj_open(const struct mp_traj_opts *opts, struct mp_traj **out);

/*
 * Attaches the probes of the target (and the page-fault program when a
 * range is set) and pins the maps. Returns 0, -EEXIST (pin directory in
 * use), -ENOENT (no moepager probe and no range: nothing to record), or
 * the attach error.
 */
MP_API int mp_traj_start(struct mp_traj *t);

/* Called once per record; a non-zero return stops this poll and is returned by it. */
typedef int (*mp_traj_fn)(const struct mp_traj_rec *r, void *arg);

/*
 * Waits up to timeout_ms (0: don't wait, -1: forever) for records and hands
 * each to fn. Returns the number of records handled, fn's non-zero return,
 * -EINTR when a signal interrupted the wait (a clean stop for a loop that
 * checks its exit flag), or another negative errno.
 */
MP_API int mp_traj_poll(struct mp_traj *t, int timeout_ms, mp_traj_fn fn, void *arg);

/* Detaches the probes, removes the pins unless keep_pins. Queued records stay pollable. */
MP_API int mp_traj_stop(struct mp_traj *t);

/* Stops if needed and frees everything. NULL is allowed. */
MP_API void mp_traj_close(struct mp_traj *t);

/* MP_TRAJ_SRC_BPF or MP_TRAJ_SRC_INPROC. */
MP_API enum mp_traj_source mp_traj_source(const struct mp_traj *t);
/* "bpf" / "inproc". */
MP_API const char *mp_traj_source_name(enum mp_traj_source s);
/* The pin directory, or NULL when not pinned. */
MP_API const char *mp_traj_pin_dir(const struct mp_traj *t);
/* The probe binary attached to (BPF), or NULL. */
MP_API const char *mp_traj_binary(const struct mp_traj *t);

struct mp_traj_stats {
	uint64_t records;	/* handed to mp_traj_poll() callbacks */
	uint64_t dropped;	/* lost because the ring or queue was full (counts stay exact) */
	uint64_t bad_args;	/* route probes with k out of range or unreadable ids */
	uint32_t probes_attached;	/* USDT probes attached (BPF) */
	bool pgfault_attached;
	MP_RESERVED(8);
};

MP_API int mp_traj_stats(const struct mp_traj *t, struct mp_traj_stats *out);

/*
 * Counts kept by the BPF programs (pinned as expert_stats, transitions and
 * fault_latency). The in-process recorder keeps none: its consumer counts
 * records. Each call walks the map and calls fn per entry.
 */
struct mp_traj_expert_stats {
	uint32_t layer;
	uint32_t expert;
	uint64_t routed;	/* route probes naming the expert */
	uint64_t page_faults;	/* user page faults in its slot */
	uint64_t demand_faults;	/* fault_done probes */
	uint64_t prefetches;	/* successful prefetch_done probes */
	uint64_t evictions;
};

struct mp_traj_transition {
	uint32_t layer;		/* `from` is at layer, `to` at layer + 1 */
	uint32_t from;
	uint32_t to;
	uint64_t routed;	/* same generated (request, token), every pair of the top-ks */
	uint64_t faulted;	/* same thread, last fault at layer -> first fault at layer + 1 */
};

struct mp_traj_hist {
	uint32_t tier;
	uint64_t slots[MP_TRAJ_HIST_SLOTS];
	uint64_t count;
	uint64_t sum_ns;
};

/* Each returns the entries visited, -EOPNOTSUPP for the in-process recorder, or fn's error. */
MP_API int mp_traj_expert_stats(const struct mp_traj *t,
				int (*fn)(const struct mp_traj_expert_stats *s, void *arg),
				void *arg);
MP_API int mp_traj_transitions(const struct mp_traj *t,
			       int (*fn)(const struct mp_traj_transition *tr, void *arg),
			       void *arg);
MP_API int mp_traj_fault_latency(const struct mp_traj *t,
				 int (*fn)(const struct mp_traj_hist *h, void *arg), void *arg);

/*
 * Reporting events
 *
 * Fires the moepager:route probe for a routing decision (weights may be
 * NULL). When t is an in-process recorder the record is also queued; the
 * queue never blocks: a full queue drops the record and counts it. t may be
 * NULL (probe only). Returns 0, -ENOSPC (dropped) or -EINVAL (k is 0 or
 * above MP_TRAJ_MAX_K).
 */
MP_API int mp_traj_route(struct mp_traj *t, uint32_t request, uint32_t token, uint32_t layer,
			 uint32_t k, const uint32_t *ids, const float *weights);

/*
 * Queues any record on an in-process recorder (ts_ns and tid are filled in
 * when 0). A no-op returning 0 for a BPF feed, whose probes carry the events.
 * Returns 0, -ENOSPC (dropped and counted) or -EINVAL.
 */
MP_API int mp_traj_note(struct mp_traj *t, const struct mp_traj_rec *r);

/*
 * Trajectory files (docs/trajectory-format.md)
 */

struct mp_traj_file_info {
	uint32_t pid;			/* recorded process */
	uint32_t source;		/* enum mp_traj_source */
	uint64_t start_ns;		/* CLOCK_MONOTONIC at the start of recording */
	uint64_t start_unix_ns;		/* CLOCK_REALTIME at the same moment */
	struct mp_traj_range range;	/* page-fault attribution, if any */
	uint32_t layers;		/* 0 when unknown */
	uint32_t experts;		/* experts per layer, 0 when unknown */
	uint64_t records;		/* filled in by the reader / the writer's finish */
	uint64_t dropped;
};

struct mp_traj_writer;

/*
 * Creates path (written under a temporary name, renamed by finish). Returns
 * 0 and sets *out, or the open error with a message.
 */
MP_API int mp_traj_writer_create(const char *path, const struct mp_traj_file_info *info,
				 struct mp_traj_writer **out);
/* Appends a record. Returns 0 or -EIO/-ENOSPC (the write error), -EINVAL for a bad record. */
MP_API int mp_traj_writer_put(struct mp_traj_writer *w, const struct mp_traj_rec *r);
/* Records dropped while recording, stored in the header. */
MP_API void mp_traj_writer_set_dropped(struct mp_traj_writer *w, uint64_t dropped);
/* Writes the header, syncs and renames into place; frees w. Returns 0 or the write error. */
MP_API int mp_traj_writer_finish(struct mp_traj_writer *w);
/* Abandons the file (removes the temporary); frees w. NULL is allowed. */
MP_API void mp_traj_writer_abort(struct mp_traj_writer *w);

/*
 * Reads a trajectory file: fills *info (may be NULL) and calls fn per record
 * in file order. Returns the number of records, fn's non-zero return, or a
 * negative errno with a message naming the file offset: -EPROTO (not a
 * trajectory file), -EPROTONOSUPPORT (version), -EBADMSG (corrupt record),
 * -ENODATA (truncated).
 */
MP_API int64_t mp_traj_file_read(const char *path, struct mp_traj_file_info *info,
				 mp_traj_fn fn, void *arg);

/*
 * Writes the route records of generated tokens (prompt tokens have no
 * index) of a trajectory file as moe-trace v1 to out; requests are numbered
 * 0.. in id order (metadata recorded_requests lists the recorded ids).
 * experts (0: the file's, else the largest id + 1) sets the metadata. Every
 * (request, token) must have every layer exactly once, with one k for all.
 * Returns the number of rows, or -ENODATA (no route records: a fault-only
 * recording has no token boundaries), -EINVAL (naming the missing or
 * duplicate request/token/layer), or the read/write error.
 */
MP_API int64_t mp_traj_export_moe_trace(const char *path, uint32_t experts, FILE *out);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_TRAJ_H */
