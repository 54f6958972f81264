// SPDX-License-Identifier: MIT
/*
 * Opens a pager on a model and reads every expert, layer by layer, expert by
 * expert, under a small budget (each read faults), for the bpf tests that
 * record its page faults with `moepager trace --pid`. Links the shared
 * library, as an engine does.
 *
 * usage: pager_touch MODEL BUDGET_EXPERTS ROUNDS [--open-late]
 *   prints "range BASE SLOT_BYTES SLOTS_PER_LAYER LAYERS" once the pager is open
 *   and "ready" when it waits for one byte on stdin (the tracer attaches
 *   meanwhile): after opening, or before with --open-late.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <moepager.h>

static int open_pager(struct mp_store *s, uint64_t budget, struct mp_pager **p)
{
	struct mp_pager_config cfg;
	const char *e00, *e01, *e10;
	int err;

	mp_pager_config_init(&cfg);
	cfg.budget_bytes = budget;
	err = mp_pager_open(s, &cfg, p);
	if (err)
		return err;
	/* Pointers only: nothing is read yet. */
	e00 = mp_pager_expert(*p, 0, 0);
	e01 = mp_pager_expert(*p, 0, 1);
	e10 = mp_pager_expert(*p, 1, 0);
	if (!e00 || !e01 || !e10)
		return -EINVAL;
	printf("range 0x%llx %llu %llu %u\n", (unsigned long long)(uintptr_t)e00,
	       (unsigned long long)(e01 - e00), (unsigned long long)((e10 - e00) / (e01 - e00)),
	       mp_store_geometry(s)->layers);
	fflush(stdout);
	return 0;
}

static int wait_go(void)
{
	char c;

	printf("ready\n");
	fflush(stdout);
	return read(0, &c, 1) == 1 ? 0 : -EPIPE;
}

int main(int argc, char **argv)
{
	const struct mp_geometry *g;
	struct mp_pager *p = NULL;
	struct mp_store *s;
	bool late;
	uint64_t bytes, sum = 0;
	unsigned long budget, rounds;
	int err;

	if (argc < 4 || (argc == 5 && strcmp(argv[4], "--open-late")) || argc > 5) {
		fprintf(stderr, "usage: pager_touch MODEL BUDGET_EXPERTS ROUNDS [--open-late]\n");
		return 2;
	}
	late = argc == 5;
	budget = strtoul(argv[2], NULL, 10);
	rounds = strtoul(argv[3], NULL, 10);
	err = mp_store_open(argv[1], &s);
	if (err)
		goto fail;
	g = mp_store_geometry(s);
	bytes = mp_store_expert_bytes(s);
	err = late ? wait_go() : open_pager(s, budget * bytes, &p);
	if (!err)
		err = late ? open_pager(s, budget * bytes, &p) : wait_go();
	if (err)
		goto fail;
	for (unsigned long r = 0; r < rounds; r++)
		for (uint32_t l = 0; l < g->layers; l++)
			for (uint32_t e = 0; e < g->experts; e++) {
				const volatile char *x = mp_pager_expert(p, l, e);

				for (uint64_t off = 0; x && off < bytes; off += 4096)
					sum += (unsigned char)x[off];
			}
	mp_pager_close(p);
	mp_store_close(s);
	printf("done %llu\n", (unsigned long long)sum);
	return 0;
fail:
	fprintf(stderr, "pager_touch: %s (%s)\n", mp_last_error(), strerror(-err));
	mp_pager_close(p);
	return 1;
}
