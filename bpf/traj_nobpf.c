// SPDX-License-Identifier: MIT
/* The BPF source when the build has no BPF programs: every entry point says so. */
#include <moepager/traj.h>

#include "traj/bpf_source.h"

int bpf_feed_open(const struct mp_traj_opts *opts, enum mp_log_level fail_level,
		  struct bpf_feed **out)
{
	(void)opts;
	(void)out;
	if (fail_level == MP_LOG_ERROR)
		return mp_err(-EOPNOTSUPP, "trajectory feed: moepager was built without BPF "
			      "(needs clang, bpftool, libbpf and /sys/kernel/btf/vmlinux at "
			      "build time)");
	mp_log(fail_level, "trajectory feed: moepager was built without BPF");
	return -EOPNOTSUPP;
}

/* Unreachable: no bpf_feed is ever opened. */
int bpf_feed_start(struct bpf_feed *b)
{
	(void)b;
	return -EOPNOTSUPP;
}

int bpf_feed_poll(struct bpf_feed *b, int timeout_ms, mp_traj_fn fn, void *arg)
{
	(void)b; (void)timeout_ms; (void)fn; (void)arg;
	return -EOPNOTSUPP;
}

int bpf_feed_stop(struct bpf_feed *b)
{
	(void)b;
	return -EOPNOTSUPP;
}

void bpf_feed_close(struct bpf_feed *b)
{
	(void)b;
}

void bpf_feed_stats(const struct bpf_feed *b, struct mp_traj_stats *st)
{
	(void)b;
	(void)st;
}

const char *bpf_feed_pin_dir(const struct bpf_feed *b)
{
	(void)b;
	return NULL;
}

const char *bpf_feed_binary(const struct bpf_feed *b)
{
	(void)b;
	return NULL;
}

int bpf_feed_expert_stats(const struct bpf_feed *b,
			  int (*fn)(const struct mp_traj_expert_stats *s, void *arg), void *arg)
{
	(void)b; (void)fn; (void)arg;
	return -EOPNOTSUPP;
}

int bpf_feed_transitions(const struct bpf_feed *b,
			 int (*fn)(const struct mp_traj_transition *tr, void *arg), void *arg)
{
	(void)b; (void)fn; (void)arg;
	return -EOPNOTSUPP;
}

int bpf_feed_fault_latency(const struct bpf_feed *b,
			   int (*fn)(const struct mp_traj_hist *h, void *arg), void *arg)
{
	(void)b; (void)fn; (void)arg;
	return -EOPNOTSUPP;
}
