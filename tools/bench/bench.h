/* SPDX-License-Identifier: MIT */
/* The pieces of `moepager bench`: options, one run's result, the real runs, the plots. */
#ifndef MP_BENCH_H
#define MP_BENCH_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <moepager.h>
#include <moepager/sim.h>

#include "cli.h"

#define BENCH_MAX_LIST 32
#define BENCH_MAX_REPEAT 16

struct bench_opts {
	const char *model;
	char *traces[BENCH_MAX_LIST];
	uint32_t ntraces;
	char *budgets[BENCH_MAX_LIST];
	uint32_t nbudgets;
	char *policies[BENCH_MAX_LIST];
	uint32_t npolicies;
	const char *evict;
	struct cli_engine_opts eng;
	const char *csv;
	const char *plot;
	double train_fraction;
	double load_cost;
	uint32_t distance;
	uint32_t emap_capacity;
	uint32_t max_tokens;
	uint32_t io_channels;
	uint32_t fill_threads;	/* real runs: the pager's fill threads; 0: its default */
	uint64_t gates_memory;	/* --simulate: bytes of layer inputs kept for speculative gates */
	uint32_t repeat;
	bool no_drop;
	bool no_admit;
	bool no_semantic;
	bool simulate;
	bool json;
};

enum bench_baseline { BENCH_POLICY = 0, BENCH_MMAP, BENCH_PREAD };

struct bench_spec {
	char prefetch[32];	/* prefetch policy or baseline name */
	char evict[32];
	enum bench_baseline baseline;
};

struct bench_result {
	uint64_t tokens;		/* decode tokens measured */
	double seconds;			/* wall time of those tokens */
	double stall_seconds;		/* time the engine waited for expert bytes */
	uint64_t uses;			/* routed experts touched */
	uint64_t hits;			/* resident when touched */
	uint64_t prefetch_issued;
	uint64_t prefetch_used;
	uint64_t prefetch_wasted;
	uint64_t prefetch_late;		/* still being read when routed or touched */
	/* --simulate: misses by cause (mp_sim_result), for comparing with real runs. */
	uint64_t miss_queued, miss_predicted, miss_predicted_wasted;
	uint64_t bytes_read;		/* from the model file */
	uint64_t peak_rss;
	/* The prefetcher's own figures (policy runs). */
	uint64_t events_dropped;	/* gate events lost to a full queue */
	uint64_t expired;		/* queued prefetches dropped after their layer ran */
	uint64_t policy_ns;		/* time the prefetch thread spent in the policy */
	uint64_t emap_bytes;		/* finemoe: memory of the map store */
	uint32_t emap_records;
	float load_ratio;		/* the prefetcher's measured read/layer ratio (last trace) */
	bool semantic;			/* the prefetcher had semantic vectors */
	uint32_t fill_threads;		/* the pager's fill threads (pager runs) */
	uint64_t fresh_bytes;		/* new (kernel-zeroed) chunk bytes while measured */
	uint64_t fill_cpu_ns;		/* the fill threads' CPU while measured */
	char cache_note[96];		/* how the page cache started */
};

struct bench_row {
	struct bench_spec spec;
	const char *budget;
	uint64_t budget_bytes;
	struct bench_result r;		/* the median run (by tokens/s) */
	double tps[BENCH_MAX_REPEAT];	/* tokens/s of every run */
	uint32_t order[BENCH_MAX_REPEAT];	/* where each run ran in the call (0: first) */
	uint32_t reps;
};

/* What a baseline expert source counted (the pager counts for itself). */
struct bench_source_stats {
	uint64_t uses;			/* routed experts */
	uint64_t hits;			/* fully in memory when routed */
	uint64_t bytes_read;		/* from the file; mmap: pages missing when routed */
	uint64_t stall_ns;		/* time the routing thread waited for expert bytes */
};

/*
 * The mmap baseline: the whole model file mapped read-only, experts read
 * through the kernel's page cache. Routing touches every page of the routed
 * experts (as the engine's first pass would) so faults are timed there; a
 * hit is an expert whose pages mincore() reports resident before that.
 */
struct bench_mmap;
int bench_mmap_open(struct mp_store *s, struct bench_mmap **out);
void bench_mmap_close(struct bench_mmap *m);
const struct mp_expert_source_ops *bench_mmap_ops(void);
void bench_mmap_stats(const struct bench_mmap *m, struct bench_source_stats *out);

/*
 * The pread-lru baseline: an LRU cache of budget / expert bytes buffers,
 * each miss one O_DIRECT pread of the whole expert (no prefetch, no
 * checksum), as the expert-streaming patches of CPU engines do.
 */
struct bench_pread;
int bench_pread_open(struct mp_store *s, uint64_t budget, struct bench_pread **out);
void bench_pread_close(struct bench_pread *p);
const struct mp_expert_source_ops *bench_pread_ops(void);
void bench_pread_stats(const struct bench_pread *p, struct bench_source_stats *out);

/*
 * A trace's token ids (its tokens.R metadata) and the model's embeddings of
 * them: the semantic vector of a trace token (bench_sem_fn(), an
 * mp_sem_source fn) is the one the runner gives the prefetcher when it runs
 * that token. Open returns 0, -ENOENT when the trace has no token ids (no
 * message), or another -errno (printed: a request without ids, an id outside
 * the vocabulary, no embedding tensor, a read error).
 */
struct bench_sem;
int bench_sem_open(struct mp_store *s, const struct mp_trace *t, const char *trace_path,
		   struct bench_sem **out);
void bench_sem_close(struct bench_sem *b);
uint32_t bench_sem_dim(const struct bench_sem *b);
uint32_t bench_sem_token(const struct bench_sem *b, uint32_t request, uint32_t token);
int bench_sem_fn(void *arg, uint32_t request, uint32_t token, float *out);

/*
 * The speculative gates of a trace's positions for --simulate (struct
 * mp_spec_source): a later layer's router on layer l's FFN input, as the model
 * computes it running the trace's own tokens (sem: its token ids) with
 * every expert in memory. Computed a request at a time when first asked,
 * and kept up to limit bytes of layer inputs; a request past it is computed
 * again in every run (said once). bench_look_fn() returns 0, or -errno
 * (printed).
 */
struct bench_look;
/*
 * train_fraction and max_tokens as the simulator is given them: a request
 * runs to the end of its evaluated part only.
 */
int bench_look_open(struct mp_store *s, const struct mp_trace *t, const struct bench_sem *sem,
		    const struct cli_engine_opts *eng, uint64_t limit, double train_fraction,
		    uint32_t max_tokens, struct bench_look **out);
void bench_look_close(struct bench_look *b);
/* Tokens the model ran for speculative gates so far (b may be NULL: 0). */
uint64_t bench_look_tokens(const struct bench_look *b);
int bench_look_fn(void *arg, uint32_t request, uint32_t token, uint32_t layer, uint32_t target,
		  float *out);

/*
 * Runs one policy or baseline over one trace's evaluation part. With sem
 * (may be NULL) the runner decodes the trace's own tokens, and the
 * prefetcher gets their semantic vectors unless o->no_semantic. Returns 0 or
 * -errno (printed).
 */
int bench_run_real(const struct bench_opts *o, const struct bench_spec *spec,
		   struct mp_store *store, const struct mp_trace *t, const char *trace_path,
		   const struct bench_sem *sem, uint64_t budget_bytes, struct bench_result *out);

/* Writes DIR/{throughput,hit_rate,heatmap}.{svg,png} with gnuplot. Returns 0 or -errno. */
int bench_plot(const struct bench_opts *o, const struct bench_row *rows, uint32_t n,
	       struct mp_trace *const *traces);

/*
 * Memory cgroups (memcg.c)
 */

struct memcg {
	char dir[PATH_MAX];
	bool v2;
};

/* This process's memory cgroup directory (v1 memory controller, else the v2 unified one). */
int memcg_base(struct memcg *cg);
/* The directory memcg_enter() makes for process pid under base. */
void memcg_child_dir(const struct memcg *base, pid_t pid, char *dir, size_t len);
/* Creates a child memory cgroup under this process's own and moves this process into it. */
int memcg_enter(struct memcg *cg);
/* Writes / reads a number in one of the cgroup's files. 0 or -errno. */
int memcg_write(const struct memcg *cg, const char *file, uint64_t v);
int memcg_read(const struct memcg *cg, const char *file, uint64_t *v);

#endif /* MP_BENCH_H */
