/* SPDX-License-Identifier: MIT */
/*
 * The pieces of `moepager bench-adapters`: the request stream every setup
 * serves, the setups (runners and schedulers over a base, its adapters or
 * their merged models), and the phases that time them.
 */
#ifndef MP_ADAPTERBENCH_H
#define MP_ADAPTERBENCH_H

#include <stdbool.h>
#include <stdint.h>

#include <moepager.h>
#include <moepager/adapters.h>
#include <moepager/membw.h>

#include "cli.h"

#define AB_MAX_ADAPTERS 256
#define AB_MAX_REPEAT 15

enum ab_kind { AB_WEAVE, AB_BASE, AB_PADDED, AB_MERGED, AB_KINDS };

extern const char *const ab_kind_names[AB_KINDS];

struct ab_opts {
	const char *model;
	const char *adapters;		/* the directory of .mpa files */
	const char *budget;		/* NULL: resident */
	const char *prefetch;		/* paged: a prefetch policy over each pager; NULL: none */
	bool paged_rows;		/* paged: weave's adapter rows are pager rows (one budget) */
	bool no_row_prefetch;		/* paged rows: the prefetcher is not told requests' maps */
	bool warm_rows;			/* paged rows: read at a request's admission */
	struct cli_engine_opts eng;
	uint32_t replicate;		/* adapters to reach (0: one per file) */
	uint32_t requests, alone, max_tokens, prompt_tokens, max_batch, e_max, repeat;
	double rate, mix_alpha;
	uint64_t seed;
	unsigned setups;		/* 1 << enum ab_kind for each setup to run */
	bool json;
};

/* An .mpa file of the directory. */
struct ab_file {
	char *path;
	char *merged;			/* its merged model, once the merged setup made it */
	char name[MP_ADAPTER_NAME_MAX];
	uint32_t experts;		/* replaced, over all layers */
	uint32_t max_per_layer;
};

/* An adapter requests ask for: a file, under its own name ("legal#2" for a replica). */
struct ab_adapter {
	char name[MP_ADAPTER_NAME_MAX];
	uint32_t file;
};

/* A request of the stream: the same in every setup. */
struct ab_req {
	double t_arrive;		/* s from the start of the mixed phase */
	uint32_t adapter;
	uint32_t *prompt;		/* prompt_tokens ids */
};

struct ab_bench {
	const struct ab_opts *o;
	struct mp_store *base;
	struct mp_engine *engine;	/* the membw probe's, and the one-instance setups' */
	struct mp_membw *membw;
	/* The base's experts in memory, shared by base, weave and padded when resident. */
	struct mp_resident *resident;
	uint64_t budget;		/* expert bytes every setup lives in; 0: resident */
	uint32_t e_max;
	struct ab_file *files;
	uint32_t n_files;
	struct ab_adapter *adapters;
	uint32_t n_adapters;
	struct ab_req *reqs;
	/* The prefetcher's source without seq_map (--no-row-prefetch): adapter rows on demand. */
	struct mp_expert_source_ops pf_no_rows;
	char tmpdir[256];		/* the merged models; "" until made */
};

/* Reads the directory, names the adapters and draws the request stream. 0 or -errno. */
int ab_bench_open(struct ab_bench *b, const struct ab_opts *o);
void ab_bench_close(struct ab_bench *b);

/* One runner and its scheduler: the only one of a setup, or a merged model's. */
struct ab_inst {
	struct mp_store *store;		/* a merged model (owned), or the bench's base */
	struct mp_engine *engine;	/* owned by merged instances but the first */
	struct mp_resident *resident;	/* a merged model's */
	struct mp_pager *pager;
	struct mp_prefetcher *prefetcher;	/* over pager, with --prefetch */
	struct mp_runner *runner;
	struct mp_sched *sched;
	const struct mp_expert_source_ops *source;	/* what the runner reads through */
	void *source_ctx;
};

struct ab_setup {
	enum ab_kind kind;
	struct ab_bench *b;
	struct ab_inst *inst;
	uint32_t n_inst;
	struct mp_adapters *set;	/* weave, padded */
	int slot[AB_MAX_ADAPTERS];	/* acquired for the whole run */
	const uint32_t *const *map[AB_MAX_ADAPTERS];
	uint64_t memory;		/* expert bytes held: base (or budget) and adapters */
	struct mp_adapters_stats stats;
};

/*
 * Deploys a setup, its schedulers started: 0 or -errno (message printed).
 * Close it whatever happened. Setups may be open together: their steps
 * never overlap (the phases run one setup at a time).
 */
int ab_setup_open(struct ab_bench *b, enum ab_kind kind, struct ab_setup *s);
void ab_setup_close(struct ab_setup *s);
/* The instance that serves adapter a's requests, and its maps (NULL: the base's experts). */
struct ab_inst *ab_setup_inst(struct ab_setup *s, uint32_t a);
const uint32_t *const *ab_setup_map(const struct ab_setup *s, uint32_t a);

/*
 * What one round of a setup measured; times in ms, rates per second. The
 * _X figures are the median over the alone requests of the ratio to the
 * same request's on base, served just before or after it.
 */
enum ab_fig {
	F_ALONE_TTFT, F_ALONE_TPOT, F_ALONE_TTFT_X, F_ALONE_TPOT_X,
	F_TTFT50, F_TTFT90, F_TPOT50, F_TPOT90,
	F_TOK_S, F_MEAN_BATCH, F_STEP_MS, F_BYTES_STEP, F_MEMBW, F_BOUND_MS,
	/* Per request: bytes per step of its decode, their bound, its TPOT over it (medians). */
	F_DECODE_BYTES, F_TPOT_BOUND,
	F_PROBE_STEP_MS, F_PROBE_BYTES, F_PROBE_MEMBW, F_REROUTE_NS, F_LOOKUP_NS, F_ERRORS,
	/* Paged, over the mixed run: routed experts found mapped, prefetches queued and used. */
	F_HIT_RATE, F_PF_ISSUED, F_PF_ROW_ISSUED, F_PF_USED,
	F_COUNT
};

/*
 * Phase 1 over n open setups: each of the stream's first --alone requests
 * on every setup in turn, each waited for. fig[i] is setup i's; base is the
 * index of the base setup, or -1.
 */
int ab_run_alone(struct ab_setup **s, uint32_t n, int base, double (*fig)[F_COUNT]);
/* Phase 2: the whole stream at its arrival times, batched by the setup's schedulers. */
int ab_run_mixed(struct ab_setup *s, double *fig);
/* The memory read bandwidth now (GB/s): the median of AB_MEMBW_SAMPLES passes. */
#define AB_MEMBW_SAMPLES 3
int ab_membw(struct mp_membw *m, double *gbps);
/* Phase 3: rerouting and slot lookups against a step (one-instance setups). */
int ab_run_probe(struct ab_setup *s, double *fig);

#endif /* MP_ADAPTERBENCH_H */
