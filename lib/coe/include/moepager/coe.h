/* SPDX-License-Identifier: MIT */
/*
 * Collaboration of Experts (CoE): many whole models ("experts") under one
 * memory budget, a dependency graph between them (a preliminary model's
 * output picks the subsequent one), and CoServe's dependency-aware
 * scheduling (Suo et al., ASPLOS'25): several executors with their own
 * queues, request assigning and arranging, a batch splitter, prefetch of a
 * queued request's model, two-stage eviction, the profiler and the
 * decay-window memory split. docs/coe.md describes the files and figures.
 *
 * A CoE is a manifest (coe.json) naming a container .mpk that holds every
 * model's expert weights as the container's experts (one pager range, one
 * budget), and a trunk .mpk per architecture holding its dense weights.
 */
#ifndef MOEPAGER_COE_H
#define MOEPAGER_COE_H

#include <moepager/common.h>
#include <moepager/pager.h>
#include <moepager/store.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mp_coe;

/*
 * The CoE model
 */

/* One architecture: a shape of model, its dense weights in a trunk .mpk. */
struct mp_coe_arch_info {
	const char *name;
	const char *trunk;			/* path of the trunk .mpk */
	const struct mp_geometry *geometry;
	uint32_t slots;				/* container experts a model holds: layers x experts */
};

/* One model (a CoE "expert"). */
struct mp_coe_model_info {
	const char *name;
	uint32_t arch;				/* index into the architectures */
	uint32_t first_slot;			/* its first container expert (flat index) */
	uint64_t bytes;				/* its expert bytes: what a load reads */
	uint64_t seed;				/* generator seed of its weights */
	double p_first;				/* probability a request starts here (the router) */
	double usage;				/* probability a request uses it (through the graph) */
	uint32_t n_pre;				/* preliminary models (edges into it) */
	uint32_t n_next;			/* subsequent models (edges out of it) */
	bool pinned;				/* "pin": loaded first, never evicted */
};

/* preliminary -> subsequent: the subsequent model runs with probability p after it. */
struct mp_coe_edge {
	uint32_t from;
	uint32_t to;
	double p;
};

/*
 * Opens a CoE manifest: parses it, opens the container and every trunk and
 * checks them (see docs/coe.md). Returns 0 and sets *out, or -errno with a
 * message naming the file and the field: -ENOENT (a missing container or
 * trunk), -EINVAL (bad JSON, an unknown name, a slot range outside the
 * container or overlapping another model, an expert size that differs from
 * the container's, start probabilities that do not sum to 1, an edge
 * probability outside (0, 1], a model's edges summing past 1), -ELOOP (a
 * cyclic dependency graph, naming the cycle), or the store's open error.
 */
MP_API int mp_coe_open(const char *manifest, struct mp_coe **out);
/*
 * The same from a manifest held in memory (len bytes); relative paths are
 * taken from dir. With no_stores, the container and trunks are not opened
 * (nor checked against the manifest): for parsing only.
 */
MP_API int mp_coe_parse(const char *json, size_t len, const char *dir, bool no_stores,
			struct mp_coe **out);
MP_API void mp_coe_close(struct mp_coe *c);

/* The container store (experts of every model): open the pager over it. */
MP_API struct mp_store *mp_coe_container(const struct mp_coe *c);
MP_API uint32_t mp_coe_arch_count(const struct mp_coe *c);
MP_API int mp_coe_arch(const struct mp_coe *c, uint32_t i, struct mp_coe_arch_info *out);
MP_API uint32_t mp_coe_model_count(const struct mp_coe *c);
MP_API int mp_coe_model(const struct mp_coe *c, uint32_t i, struct mp_coe_model_info *out);
/* The model called name, or -ENOENT. */
MP_API int mp_coe_model_find(const struct mp_coe *c, const char *name);
MP_API uint32_t mp_coe_edge_count(const struct mp_coe *c);
MP_API const struct mp_coe_edge *mp_coe_edges(const struct mp_coe *c);
/* Sum of every model's bytes. */
MP_API uint64_t mp_coe_total_bytes(const struct mp_coe *c);
/* The container (layer, expert) of a model's (layer, expert). Returns 0 or -EINVAL. */
MP_API int mp_coe_slot(const struct mp_coe *c, uint32_t model, uint32_t layer, uint32_t expert,
		       uint32_t *c_layer, uint32_t *c_expert);

/*
 * The next model after `model` ran on a request whose output's argmax is
 * `token`: a uniform draw from (request, token) walked through the model's
 * edges. Returns the model, or -ENOENT when the chain ends here.
 */
MP_API int mp_coe_next(const struct mp_coe *c, uint32_t model, uint64_t request, uint32_t token);

/*
 * Generator
 */

/* One architecture to generate: a geometry and how many classifiers have it. */
struct mp_coe_gen_arch {
	const char *name;
	struct mp_geometry g;
	bool detector;				/* a shared subsequent model (one per arch) */
	uint32_t share;				/* classifiers: relative share of the components */
};

struct mp_coe_gen_config {
	const struct mp_coe_gen_arch *archs;
	uint32_t n_archs;
	uint32_t components;			/* classifiers: one per component type */
	double zipf;				/* skew of the component frequencies (s of Zipf) */
	double detector_share;			/* components with a detector (after a clean result) */
	double clean;				/* P(clean result): the detector runs then */
	uint64_t seed;
	MP_RESERVED(4);
};

/*
 * Writes a CoE into dir (created if needed): coe.json, experts.mpk (every
 * model's experts, each as `moepager gen` writes the model's geometry and
 * seed would), and one trunk .mpk per architecture. Returns 0 or -errno.
 */
MP_API int mp_coe_gen(const char *dir, const struct mp_coe_gen_config *cfg,
		      void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg);

/*
 * Workload
 */

/* A board: component images in arrival order, each a request to its classifier. */
struct mp_coe_request {
	uint32_t id;
	uint32_t model;				/* the first model (the router's choice) */
	uint64_t arrival_ns;			/* from the start of the board */
};

struct mp_coe_workload_config {
	uint32_t requests;			/* 0: 2500 */
	uint64_t interval_ns;			/* 0: 4 ms */
	uint64_t seed;				/* 0: 1 */
	MP_RESERVED(4);
};

/*
 * Draws a board: requests' first models from the start probabilities, one
 * every interval. *out is malloc()ed (free() it). Returns the count or -errno.
 */
MP_API int mp_coe_workload(const struct mp_coe *c, const struct mp_coe_workload_config *cfg,
			   struct mp_coe_request **out);

/*
 * Profile: per executor kind (threads) and architecture
 */

struct mp_coe_perf {
	uint32_t threads;			/* the executor's engine threads */
	uint32_t arch;
	double k_ns;				/* batch latency = k_ns * n + b_ns (least squares) */
	double b_ns;
	uint32_t max_batch;			/* largest batch before latency stops improving */
	double load_file_ns;			/* loading the whole model from the file tier */
	double load_host_ns;			/* ... from host memory */
	uint64_t model_bytes;			/* memory footprint of the weights */
	uint64_t item_bytes;			/* memory of one batch item (KV, activations) */
	double r2;				/* of the fit */
	MP_RESERVED(4);
};

struct mp_coe_profile {
	uint32_t n;
	struct mp_coe_perf *perf;
	uint32_t tokens;			/* tokens per request it was measured with */
};

struct mp_coe_profile_config {
	const uint32_t *threads;		/* executor kinds to profile */
	uint32_t n_threads;
	uint32_t max_batch;			/* batches 1..max_batch measured; 0: 16 */
	uint32_t tokens;			/* tokens per request; 0: 4 */
	uint32_t repeat;			/* runs per point (the fastest counts); 0: 5 */
	const char *engine;			/* NULL: "ref" */
	/* Called before each load from the file tier (e.g. to drop the page cache); may be NULL. */
	void (*before_file_load)(void *arg);
	void *arg;
	MP_RESERVED(4);
};

/*
 * Measures one model of each architecture through pager p (over the
 * container): loads from each tier, batch latency for 1..max_batch. out->perf
 * is malloc()ed (mp_coe_profile_free()). Returns 0 or -errno.
 */
MP_API int mp_coe_profile_run(struct mp_coe *c, struct mp_pager *p,
			      const struct mp_coe_profile_config *cfg, struct mp_coe_profile *out);
/* Saves / loads a profile as JSON. Load returns -EINVAL naming a bad field. */
MP_API int mp_coe_profile_save(const struct mp_coe_profile *pr, const char *path);
MP_API int mp_coe_profile_load(const char *path, struct mp_coe_profile *out);
MP_API void mp_coe_profile_free(struct mp_coe_profile *pr);
/* The entry for (threads, arch), or NULL. */
MP_API const struct mp_coe_perf *mp_coe_profile_find(const struct mp_coe_profile *pr,
						     uint32_t threads, uint32_t arch);

/*
 * The decay-window memory split (CoServe §4.4)
 */

struct mp_coe_window_step {
	double lo, hi;				/* the window; measured at round(hi) experts */
	double throughput;
	double predicted;			/* the line through the earlier points, 0: none */
};

struct mp_coe_window_result {
	struct mp_coe_window_step steps[32];
	uint32_t n_steps;
	double lo, hi;				/* the window chosen */
	uint32_t choice;			/* experts to load: drawn within it */
	bool stopped;				/* the throughput fell short of the line (Eq. 3) */
};

/*
 * Slides a window over the experts sorted by usage: [0, w0], then each next
 * window starts at the last one's end with its size times 1 - w0/100
 * (Eq. 1); measure(arg, n, &thr) runs the sample set with n experts loaded.
 * From the third window on, the throughput predicted by a line through the
 * earlier ones (Eq. 2, x = the window's number) is compared with the
 * measured one; the slide stops when (predicted - measured) / predicted >
 * margin (Eq. 3), or when hi passes max_experts. choice is drawn
 * uniformly in the last window from seed. Returns 0, -EINVAL (bad w0 or
 * margin), or measure's error.
 */
MP_API int mp_coe_decay_window(double w0, double margin, uint32_t max_experts, uint64_t seed,
			       int (*measure)(void *arg, uint32_t n, double *thr), void *arg,
			       struct mp_coe_window_result *out);

/*
 * The scheduler: executors, queues, the model pool
 */

enum mp_coe_assign {
	MP_COE_ASSIGN_RR = 0,			/* round robin over the executors */
	MP_COE_ASSIGN_SPAN,			/* CoServe: the least longest-queue finish time */
};

enum mp_coe_evict {
	MP_COE_EVICT_LRU = 0,
	MP_COE_EVICT_FIFO,
	MP_COE_EVICT_TWO_STAGE,			/* CoServe: dependency, then usage probability */
};

struct mp_coe_sched_config {
	uint32_t executors;			/* executor threads, each with its own queue */
	uint32_t threads;			/* engine threads per executor; 0: 1 */
	const char *engine;			/* NULL: "ref" */
	enum mp_coe_assign assign;
	enum mp_coe_evict evict;
	bool arrange;				/* same-model requests adjacent in a queue */
	bool prefetch;				/* load queued groups' models during work */
	uint32_t max_batch;			/* cap of the batch splitter; 0: the profile's, else 8 */
	uint64_t budget;			/* model bytes in memory; 0: the pager's budget */
	uint64_t batch_memory;			/* bytes for batch items; 0: no memory cap */
	uint32_t tokens;			/* tokens per request; 0: 4 */
	bool no_warm;				/* do not preload models by usage before the run */
	const struct mp_coe_profile *profile;	/* K, B, loads, max batch; NULL: unit costs */
	MP_RESERVED(8);
};

struct mp_coe_sched_stats {
	uint64_t requests;			/* boards' requests finished (whole chains) */
	uint64_t runs;				/* model runs (a chain's models) */
	uint64_t switches;			/* model loads while running (not the warm start) */
	uint64_t loads_file;			/* of which from the file tier */
	uint64_t loads_host;			/* ... from host memory */
	uint64_t bytes_loaded;
	uint64_t warm_loads;			/* models preloaded before the run */
	uint64_t evictions;
	uint64_t batches;
	uint64_t sched_ns;			/* assigning, arranging, picking batches and victims */
	uint64_t manage_ns;			/* expert management in the pager: evictions, loads */
	uint64_t infer_ns;			/* runner batches, summed over executors */
	uint64_t stall_ns;			/* waiting for a model's weights before a batch */
	uint64_t wait_room_ns;			/* waiting for memory to load a model */
	uint64_t makespan_ns;			/* first arrival to last completion */
	uint64_t output_hash;			/* every run's output token, order-independent */
	uint64_t failed;			/* runs that failed (their chains end) */
	uint64_t idle_ns;			/* executors with an empty queue, summed */
	uint64_t prefetched;			/* of the switches, loads started as prefetches */
	uint64_t distinct_loads;		/* of the switches, first loads of a model */
	uint64_t cold_models;			/* models run that were not in memory at the
						 * start: loads any schedule must make */
	MP_RESERVED(4);
};

struct mp_coe_sched;

/*
 * Opens the executors over pager p (the container's): an engine and a
 * runner per architecture each, and warms the pool (models by usage until
 * the budget is full) unless no_warm. Returns 0 and sets *out, or -EINVAL
 * (no executors; a budget below what the executors may hold at once),
 * -ENOMEM, or an engine or runner error.
 */
MP_API int mp_coe_sched_open(struct mp_coe *c, struct mp_pager *p,
			     const struct mp_coe_sched_config *cfg, struct mp_coe_sched **out);
/*
 * Runs the board (once per open: the counters and the clock start with it):
 * submits each request at its arrival time, waits for every chain. Returns 0,
 * -EINVAL (a request's model out of range), or the first failed batch's error
 * (its chains end; the others run).
 */
MP_API int mp_coe_sched_run(struct mp_coe_sched *s, const struct mp_coe_request *reqs, uint32_t n);
MP_API void mp_coe_sched_stats(struct mp_coe_sched *s, struct mp_coe_sched_stats *out);
MP_API void mp_coe_sched_close(struct mp_coe_sched *s);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_COE_H */
