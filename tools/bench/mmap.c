// SPDX-License-Identifier: MIT
/* The mmap baseline's expert source: the model file mapped, the kernel's page cache decides. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

struct bench_mmap {
	struct mp_store *store;
	const uint8_t *base;
	uint64_t len;
	uint64_t page;
	unsigned char *vec;	/* mincore() result for one expert */
	struct bench_source_stats st;
};

int bench_mmap_open(struct mp_store *s, struct bench_mmap **out)
{
	struct bench_mmap *m = calloc(1, sizeof(*m));
	void *base;

	if (!m)
		return -ENOMEM;
	m->store = s;
	m->len = mp_store_file_bytes(s);
	m->page = (uint64_t)sysconf(_SC_PAGESIZE);
	base = mmap(NULL, m->len, PROT_READ, MAP_SHARED, mp_store_fd(s), 0);
	if (base == MAP_FAILED) {
		int err = -errno;

		cli_error(0, "mmap %s: %s", mp_store_path(s), strerror(errno));
		free(m);
		return err;
	}
	m->base = base;
	m->vec = malloc(mp_store_expert_bytes(s) / m->page + 2);
	if (!m->vec) {
		munmap(base, m->len);
		free(m);
		return -ENOMEM;
	}
	*out = m;
	return 0;
}

void bench_mmap_close(struct bench_mmap *m)
{
	if (!m)
		return;
	munmap((void *)m->base, m->len);
	free(m->vec);
	free(m);
}

static const void *mm_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	struct bench_mmap *m = ctx;
	const struct mp_expert_info *x = mp_store_expert(m->store, layer, expert);

	return x ? m->base + x->offset : NULL;
}

static int mm_route(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		    const uint32_t *ids, const float *weights, uint32_t k)
{
	struct bench_mmap *m = ctx;

	(void)request;
	(void)token;
	(void)weights;
	for (uint32_t i = 0; i < k; i++) {
		const struct mp_expert_info *x = mp_store_expert(m->store, layer, ids[i]);
		uint64_t npages, missing = 0, t0;
		volatile uint8_t sink = 0;
		const uint8_t *p;

		if (!x)
			return -EINVAL;
		p = m->base + x->offset;
		npages = (x->bytes + m->page - 1) / m->page;
		if (mincore((void *)p, npages * m->page, m->vec))
			return -errno;
		for (uint64_t j = 0; j < npages; j++)
			missing += !(m->vec[j] & 1);
		m->st.uses++;
		m->st.hits += !missing;
		m->st.bytes_read += missing * m->page;
		/* The engine's first read of each page: faults (and readahead) happen here. */
		t0 = cli_now_ns();
		for (uint64_t j = 0; missing && j < npages; j++)
			sink ^= p[j * m->page];
		m->st.stall_ns += missing ? cli_now_ns() - t0 : 0;
		(void)sink;
	}
	return 0;
}

const struct mp_expert_source_ops *bench_mmap_ops(void)
{
	static const struct mp_expert_source_ops ops = {
		.expert = mm_expert,
		.route = mm_route,
	};

	return &ops;
}

void bench_mmap_stats(const struct bench_mmap *m, struct bench_source_stats *out)
{
	*out = m->st;
}
