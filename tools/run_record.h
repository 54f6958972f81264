/* SPDX-License-Identifier: MIT */
/* Recording this process's trajectory during some of `moepager run`'s repetitions. */
#ifndef MP_RUN_RECORD_H
#define MP_RUN_RECORD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <moepager.h>

struct run_record {
	struct mp_traj *traj;
	pthread_t poller;
	atomic_bool stop;
	bool polling;
	uint64_t records;	/* summed over every recorded repetition */
	uint64_t dropped;
	enum mp_traj_source source;
};

/*
 * Starts recording this process through BPF (USDT probes, pinned maps) with
 * a thread draining the ring buffer, as `moepager trace` would. Returns 0
 * or a negative errno (message printed); -EPERM without BPF rights.
 */
int run_record_begin(struct run_record *rr);
/* Stops recording and adds its counts to rr. Safe when not recording. */
void run_record_end(struct run_record *rr);

#endif
