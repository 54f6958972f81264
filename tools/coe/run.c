// SPDX-License-Identifier: MIT
/* The policies the CoE benchmarks compare, and one run of a board under one of them. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "coe/coe_tool.h"

/* The paper's baselines (§5.1) and ablation (§5.3), over the same executors and budget. */
const struct coe_policy coe_policies[] = {
	{ "coserve", "CoServe: assign, arrange, two-stage eviction, prefetch", false,
	  MP_COE_ASSIGN_SPAN, true, MP_COE_EVICT_TWO_STAGE, true },
	{ "samba", "Samba-CoE: one executor, first come first served, LRU", true,
	  MP_COE_ASSIGN_RR, false, MP_COE_EVICT_LRU, false },
	{ "fifo", "Samba-CoE FIFO: one executor, FCFS, FIFO replacement", true,
	  MP_COE_ASSIGN_RR, false, MP_COE_EVICT_FIFO, false },
	{ "parallel", "Samba-CoE Parallel: the executors, round robin, LRU", false,
	  MP_COE_ASSIGN_RR, false, MP_COE_EVICT_LRU, false },
	{ "none", "ablation None: round robin, FIFO execution and replacement", false,
	  MP_COE_ASSIGN_RR, false, MP_COE_EVICT_FIFO, false },
	{ "em", "ablation EM: + expert management (two-stage eviction, prefetch)", false,
	  MP_COE_ASSIGN_RR, false, MP_COE_EVICT_TWO_STAGE, true },
	{ "em-ra", "ablation EM+RA: + request arranging", false,
	  MP_COE_ASSIGN_RR, true, MP_COE_EVICT_TWO_STAGE, true },
};
const uint32_t coe_n_policies = sizeof(coe_policies) / sizeof(coe_policies[0]);

const struct coe_policy *coe_policy_find(const char *name)
{
	for (uint32_t i = 0; i < coe_n_policies; i++)
		if (!strcmp(coe_policies[i].name, name))
			return &coe_policies[i];
	return NULL;
}

int coe_parse_budget(const struct mp_coe *c, const char *s, uint64_t *out)
{
	int err = mp_budget_parse(s, mp_coe_total_bytes(c), out);

	if (err)
		cli_fail(err, "--budget");
	return err;
}

/* The largest model's bytes. */
static uint64_t largest_model(const struct mp_coe *c)
{
	uint64_t largest = 0;

	for (uint32_t m = 0; m < mp_coe_model_count(c); m++) {
		struct mp_coe_model_info mi;

		mp_coe_model(c, m, &mi);
		largest = mi.bytes > largest ? mi.bytes : largest;
	}
	return largest;
}

static int open_pager(struct mp_coe *c, const struct coe_run_opts *o, struct mp_pager **p)
{
	struct mp_store *cs = mp_coe_container(c);
	struct mp_pager_config pc = {
		.budget_bytes = o->budget,
		.eviction = "lru",
		/* No spare slots: the container has no adapters. */
		.slots_per_layer = mp_store_geometry(cs)->experts,
		/* A whole-model load reads many experts at once. */
		.fill_threads = 4,
		/* An evicted model's pages are the next load's: recycled, not freed and refaulted. */
		.spare_bytes = 2 * largest_model(c),
	};
	int err = mp_pager_open(cs, &pc, p);

	if (err)
		cli_fail(err, "pager over %s", mp_store_path(cs));
	return err;
}

int coe_run(struct mp_coe *c, struct coe_run_opts *o, const struct mp_coe_request *reqs,
	    uint32_t n, struct mp_coe_sched_stats *st, struct mp_pager_stats *pst)
{
	const struct coe_policy *pol = o->pol;
	struct mp_coe_sched_config sc = {
		.executors = pol->single ? 1 : o->executors,
		.threads = pol->single ? o->executors * o->threads : o->threads,
		.engine = o->engine, .assign = pol->assign, .evict = pol->evict,
		.arrange = pol->arrange, .prefetch = pol->prefetch, .max_batch = o->max_batch,
		.budget = o->budget, .batch_memory = o->batch_memory, .tokens = o->tokens,
		.profile = o->profile,
	};
	struct mp_coe_sched *s = NULL;
	struct mp_pager *p = NULL;
	int err;

	o->cache_mode = o->drop_cache ? cli_drop_caches(mp_store_fd(mp_coe_container(c))) : "warm";
	err = open_pager(c, o, &p);
	if (err)
		return err;
	err = mp_coe_sched_open(c, p, &sc, &s);
	if (err) {
		cli_fail(err, "%s", pol->name);
		goto close_pager;
	}
	mp_pager_stats_reset(p);
	err = mp_coe_sched_run(s, reqs, n);
	if (err)
		cli_fail(err, "%s: the run failed", pol->name);
	mp_coe_sched_stats(s, st);
	mp_pager_stats(p, pst);
	mp_coe_sched_close(s);
close_pager:
	mp_pager_close(p);
	return err;
}
