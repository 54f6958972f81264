/* SPDX-License-Identifier: MIT */
/* moepager bench-elastic's pieces: the engines without load, and the servers under load. */
#ifndef MP_BENCH_ELASTIC_H
#define MP_BENCH_ELASTIC_H

#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

/* The number the first line of /proc/PID/file matching fmt ("key: %llu") holds; 0 if none. */
uint64_t eb_proc_number(pid_t pid, const char *file, const char *fmt);
/*
 * A process's memory, in bytes, such that summing it over processes counts
 * every page once: its proportional set size (smaps_rollup) without shared
 * memory pages, plus the memfds it holds open, whole (st_blocks). Shared
 * memory is the daemon's memfds, held by the daemon alone: their pages count
 * once, mapped or not, however many processes map them, at any instant
 * (PSS sums taken a process at a time over- or under-count pages that a
 * process maps or unmaps in between). 0 when unreadable.
 */
uint64_t eb_memory_of(pid_t pid);
/* Has a process attached to the daemon on sock touch the first fit experts, then leave. */
int eb_warm_tier(const char *sock);

struct el_config {
	const char *model;
	uint64_t budget;		/* expert bytes of each setup */
	double rate;			/* requests per second (Poisson) */
	double phase;			/* seconds before, during and after the change */
	uint32_t threads;		/* engine threads of each server */
	uint32_t threads_to;		/* el_run_threads(): the count changed to and back */
	uint32_t max_tokens, prompt_ids;
	double slo_ttft_ms, slo_tpot_ms, retry_s;
	uint64_t seed;
	const char *pages;		/* the shared setup's daemon: pagerd --pages */
	int fd;				/* the model file, for dropping its cached pages */
};

/*
 * The three setups under load (shared, second_copy, cold_restart), served
 * by `moepager serve` processes behind loadgen's epoch pool. Returns 0 and
 * the JSON object, or -errno.
 */
int el_run_loaded(const struct el_config *cfg, json_t **out);

/*
 * Engine threads changed in place under load: setups fixed (threads never
 * change) and in_place (threads -> threads_to -> threads at the second and
 * third phases, POST /admin/threads). Returns 0 and the JSON object, or -errno.
 */
int el_run_threads(const struct el_config *cfg, json_t **out);

#endif /* MP_BENCH_ELASTIC_H */
