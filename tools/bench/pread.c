// SPDX-License-Identifier: MIT
/* The pread-lru baseline's expert source: whole experts read with O_DIRECT into an LRU cache. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define DIRECT_ALIGN 4096u

struct bench_pread {
	struct mp_store *store;
	int fd;
	bool direct;
	uint32_t experts;	/* per layer */
	uint32_t nslots;
	uint64_t slot_bytes;
	uint8_t *mem;		/* nslots x slot_bytes */
	int32_t *slot_of;	/* key -> slot, -1 */
	uint32_t *key_of;	/* slot -> key, UINT32_MAX */
	uint64_t *last_use;	/* slot -> tick */
	uint64_t tick;
	struct bench_source_stats st;
};

int bench_pread_open(struct mp_store *s, uint64_t budget, struct bench_pread **out)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	struct bench_pread *p = calloc(1, sizeof(*p));
	uint32_t nkeys = g->layers * g->experts;
	int err = -ENOMEM;

	if (!p)
		return -ENOMEM;
	p->store = s;
	p->experts = g->experts;
	p->slot_bytes = (mp_store_expert_bytes(s) + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
	p->nslots = (uint32_t)(budget / mp_store_expert_bytes(s));
	if (p->nslots < g->topk) {
		cli_error(0, "pread-lru: budget %llu holds fewer than top-%u "
			"experts", (unsigned long long)budget, g->topk);
		free(p);
		return -EINVAL;
	}
	p->fd = open(mp_store_path(s), O_RDONLY | O_DIRECT | O_CLOEXEC);
	p->direct = p->fd >= 0;
	if (p->fd < 0)
		p->fd = open(mp_store_path(s), O_RDONLY | O_CLOEXEC);
	if (p->fd < 0) {
		err = -errno;
		cli_error(0, "%s: %s", mp_store_path(s), strerror(errno));
		free(p);
		return err;
	}
	p->mem = aligned_alloc(DIRECT_ALIGN, (size_t)p->nslots * p->slot_bytes);
	p->slot_of = malloc(nkeys * sizeof(*p->slot_of));
	p->key_of = malloc(p->nslots * sizeof(*p->key_of));
	p->last_use = calloc(p->nslots, sizeof(*p->last_use));
	if (!p->mem || !p->slot_of || !p->key_of || !p->last_use) {
		bench_pread_close(p);
		return err;
	}
	for (uint32_t k = 0; k < nkeys; k++)
		p->slot_of[k] = -1;
	for (uint32_t i = 0; i < p->nslots; i++)
		p->key_of[i] = UINT32_MAX;
	*out = p;
	return 0;
}

void bench_pread_close(struct bench_pread *p)
{
	if (!p)
		return;
	if (p->fd >= 0)
		close(p->fd);
	free(p->mem);
	free(p->slot_of);
	free(p->key_of);
	free(p->last_use);
	free(p);
}

static const void *pr_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	struct bench_pread *p = ctx;
	int32_t slot = p->slot_of[layer * p->experts + expert];

	/* route() read every routed expert; anything else is the runner's bug. */
	return slot >= 0 ? p->mem + (uint64_t)slot * p->slot_bytes : NULL;
}

static int read_expert(struct bench_pread *p, uint32_t layer, uint32_t expert, uint8_t *dst)
{
	const struct mp_expert_info *x = mp_store_expert(p->store, layer, expert);
	uint64_t want = p->direct ? p->slot_bytes : x->bytes, got = 0;

	while (got < x->bytes) {
		ssize_t n = pread(p->fd, dst + got, want - got, (off_t)(x->offset + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return cli_error(n < 0 ? -errno : -ENODATA,
					 "pread-lru: layer %u expert %u at offset %llu: %s", layer,
					 expert, (unsigned long long)(x->offset + got),
					 n < 0 ? strerror(errno) : "end of file");
		got += (uint64_t)n;
	}
	p->st.bytes_read += got;
	return 0;
}

static int pr_route(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		    const uint32_t *ids, const float *weights, uint32_t k)
{
	struct bench_pread *p = ctx;

	(void)request;
	(void)token;
	(void)weights;
	for (uint32_t i = 0; i < k; i++) {
		uint32_t key = layer * p->experts + ids[i], victim = 0;
		uint64_t t0;
		int err;

		p->st.uses++;
		if (p->slot_of[key] >= 0) {
			p->st.hits++;
			p->last_use[p->slot_of[key]] = ++p->tick;
			continue;
		}
		/* The least recently used slot; this layer's experts were just stamped, so stay. */
		for (uint32_t s = 1; s < p->nslots; s++)
			if (p->last_use[s] < p->last_use[victim])
				victim = s;
		if (p->key_of[victim] != UINT32_MAX)
			p->slot_of[p->key_of[victim]] = -1;
		p->key_of[victim] = UINT32_MAX;
		t0 = cli_now_ns();
		err = read_expert(p, layer, ids[i], p->mem + (uint64_t)victim * p->slot_bytes);
		p->st.stall_ns += cli_now_ns() - t0;
		if (err)
			return err;
		p->key_of[victim] = key;
		p->slot_of[key] = (int32_t)victim;
		p->last_use[victim] = ++p->tick;
	}
	return 0;
}

const struct mp_expert_source_ops *bench_pread_ops(void)
{
	static const struct mp_expert_source_ops ops = {
		.expert = pr_expert,
		.route = pr_route,
	};

	return &ops;
}

void bench_pread_stats(const struct bench_pread *p, struct bench_source_stats *out)
{
	*out = p->st;
}
