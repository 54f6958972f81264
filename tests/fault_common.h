/* SPDX-License-Identifier: MIT */
/* Shared by the fault tests: the tiny model, pagers over a fault tier, guarded checked reads. */
#ifndef MP_FAULT_COMMON_H
#define MP_FAULT_COMMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "helpers.h"
#include "base/base.h"
#include "pager/pager_priv.h"
#include "tier/inject.h"

struct fx {
	char path[512];			/* the model file (tiny preset, f32, seed 42) */
	struct mp_store *store;
	const struct mp_geometry *geo;
	uint64_t xbytes;		/* bytes of one expert */
};

extern struct fx fx;

/* Generates the model into the test's tmpdir (or uses path when non-NULL) and opens it. */
void fx_setup(const char *path);
void fx_teardown(void);
/* cmocka group fixtures: log capture and fx_setup(NULL); fx_teardown() and the tmpdir. */
int fx_group_setup(void **state);
int fx_group_teardown(void **state);

/*
 * Opens a pager over fx.store (or s when non-NULL) whose file tier is
 * wrapped by a fault tier with spec and seed. cfg may be NULL (budget
 * `budget_experts` experts, no route fill). Exits 77 (or 1 under CI) when
 * userfaultfd is unavailable.
 */
struct mp_pager *fx_open(struct mp_store *s, const char *spec, uint64_t seed,
			 uint32_t budget_experts, struct mp_pager_config *cfg);

/* What the fault tier of p injected. */
void fx_counts(struct mp_pager *p, struct mp_fault_counts *out);

/*
 * Reads the whole expert inside mp_pager_guard() and checks it against the
 * store's checksum. Returns 0 (right bytes), -EILSEQ when wrong bytes were
 * served (the one outcome no fault may cause), or the guard's error.
 */
int fx_read(struct mp_pager *p, uint32_t layer, uint32_t expert);

/*
 * Log capture safe against the pager's threads logging at once (the
 * fault tests' lines come from fill workers and the fault handler).
 */
void fx_log_capture(void);
void fx_log_reset(void);
bool fx_log_contains(const char *needle);

/* Joins th within ms; false (and th left running) when it did not end in time. */
bool fx_join(pthread_t th, uint32_t ms);

#endif /* MP_FAULT_COMMON_H */
