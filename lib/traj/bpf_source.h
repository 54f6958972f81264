/* SPDX-License-Identifier: MIT */
/* The BPF source of the trajectory feed (bpf/traj.c), as traj/feed.c drives it. */
#ifndef MP_BPF_FEED_H
#define MP_BPF_FEED_H

#include "base/base.h"
#include <moepager/traj.h>

struct bpf_feed;

/*
 * Opens, configures and loads the programs for opts->pid (already resolved,
 * never 0). Failures are logged at fail_level (a fallback makes them warnings).
 */
int bpf_feed_open(const struct mp_traj_opts *opts, enum mp_log_level fail_level,
		  struct bpf_feed **out);
int bpf_feed_start(struct bpf_feed *b);
/* Records handled, fn's non-zero return, -EINTR, or a negative errno. */
int bpf_feed_poll(struct bpf_feed *b, int timeout_ms, mp_traj_fn fn, void *arg);
int bpf_feed_stop(struct bpf_feed *b);
void bpf_feed_close(struct bpf_feed *b);

void bpf_feed_stats(const struct bpf_feed *b, struct mp_traj_stats *st);
const char *bpf_feed_pin_dir(const struct bpf_feed *b);
const char *bpf_feed_binary(const struct bpf_feed *b);

int bpf_feed_expert_stats(const struct bpf_feed *b,
			  int (*fn)(const struct mp_traj_expert_stats *s, void *arg), void *arg);
int bpf_feed_transitions(const struct bpf_feed *b,
			 int (*fn)(const struct mp_traj_transition *tr, void *arg), void *arg);
int bpf_feed_fault_latency(const struct bpf_feed *b,
			   int (*fn)(const struct mp_traj_hist *h, void *arg), void *arg);

#endif /* MP_BPF_FEED_H */
