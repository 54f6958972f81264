/* SPDX-License-Identifier: MIT */
/* Shared by the CoE commands: the policies compared, and one run of a board under one. */
#ifndef MP_COE_TOOL_H
#define MP_COE_TOOL_H

#include <stdbool.h>
#include <stdint.h>

#include <moepager.h>

/* A scheduling policy as the paper's baselines and ablations name it. */
struct coe_policy {
	const char *name;
	const char *what;
	bool single;			/* one executor with every thread (Samba-CoE) */
	enum mp_coe_assign assign;
	bool arrange;
	enum mp_coe_evict evict;
	bool prefetch;
};

/* The policy called name, or NULL. */
const struct coe_policy *coe_policy_find(const char *name);
/* Every policy, NULL-terminated by name. */
extern const struct coe_policy coe_policies[];
extern const uint32_t coe_n_policies;

struct coe_run_opts {
	const struct coe_policy *pol;
	uint32_t executors;		/* CoServe's; a single-executor policy gets one */
	uint32_t threads;		/* per executor */
	uint32_t tokens;
	uint64_t budget;
	uint64_t batch_memory;
	uint32_t max_batch;		/* 0: the profile's */
	const struct mp_coe_profile *profile;
	const char *engine;
	bool drop_cache;		/* drop the page cache before the run (cold file tier) */
	const char *cache_mode;		/* out: how it was dropped, or "warm" */
};

/*
 * Runs the board reqs under opts->pol on a fresh pager (budget, fill
 * threads for whole-model loads) and scheduler. Returns 0 or -errno
 * (printed). st gets the scheduler's counters, pst the pager's.
 */
int coe_run(struct mp_coe *c, struct coe_run_opts *opts, const struct mp_coe_request *reqs,
	    uint32_t n, struct mp_coe_sched_stats *st, struct mp_pager_stats *pst);

/* Parses "10%" of the CoE's model bytes, or "512M"; prints what is wrong. */
int coe_parse_budget(const struct mp_coe *c, const char *s, uint64_t *out);

#endif
