/* SPDX-License-Identifier: MIT */
/* Fault injection: a tier that wraps another and fails, shortens, corrupts or delays its reads. */
#ifndef MP_TIER_FAULT_H
#define MP_TIER_FAULT_H

#include <stdint.h>

#include "tier/tier.h"

/*
 * A spec is a list of rules separated by ';' (docs/fault-injection.md):
 *
 *   read:eio:p=0.01            every read fails with EIO with probability 0.01
 *   read:eio:expert=1.1        every read of layer 1 expert 1 fails
 *   read:short:every=7         every 7th read delivers a prefix and reports success
 *   read:corrupt:expert=0.2    reads of layer 0 expert 2 deliver one flipped byte
 *   read:delay=50ms:p=0.1      a tenth of the reads wait 50 ms first
 *   alloc:enomem:after=10      memory for an expert is refused after the first 10 times
 *
 * Decisions depend only on the seed, the rule, the expert and how many
 * times that expert was read (or allocated) before, so a single-threaded
 * run repeats exactly; every= / after= / count= count a rule's matching
 * operations in the order they happen.
 */

#define MP_FAULT_ENV		"MOEPAGER_FAULT"
#define MP_FAULT_SEED_ENV	"MOEPAGER_FAULT_SEED"
/* Seed when neither the caller nor $MOEPAGER_FAULT_SEED gives one. */
#define MP_FAULT_DEFAULT_SEED	1ull

/* What a fault tier injected so far (every field counts injections, not reads). */
struct mp_fault_counts {
	uint64_t reads;		/* reads that went through the wrapper */
	uint64_t eio;
	uint64_t enomem;	/* read:enomem */
	uint64_t short_reads;
	uint64_t corrupt;
	uint64_t delays;
	uint64_t alloc_enomem;
	uint64_t rate_waits;	/* reads read:rate= held back */
	uint64_t rate_wait_ns;	/* their waits, summed */
};

/*
 * Checks a spec without building anything. Returns the number of rules
 * (0 for NULL or an empty spec), or -EINVAL with a message naming the rule
 * and the 1-based position of the problem in spec.
 */
int mp_fault_spec_check(const char *spec);

/*
 * Wraps inner in a tier that applies the spec's rules, seeded with seed.
 * On success the wrapper owns inner (destroying it destroys both) and
 * *out is set; on failure inner is untouched. Returns 0, -EINVAL for a
 * bad spec, or -ENOMEM.
 */
int mp_tier_inject_open(struct mp_tier *inner, const char *spec, uint64_t seed,
		       struct mp_tier **out);

/*
 * For a pager opening its tier: spec (else $MOEPAGER_FAULT when spec is
 * NULL) with seed (else $MOEPAGER_FAULT_SEED when seed is 0, else
 * MP_FAULT_DEFAULT_SEED). Replaces *tier with a wrapper around it when
 * there are rules; leaves it alone for an unset or empty spec. Returns 0,
 * -EINVAL (bad spec or seed, naming the variable when it came from the
 * environment; *tier untouched), or -ENOMEM.
 */
int mp_tier_inject_wrap(struct mp_tier **tier, const char *spec, uint64_t seed);

/*
 * Puts *tier (another file's: a pager's row source) behind the rules of
 * fault tier `with`: the same rules, draws, counters and read:rate= caps,
 * so the reads of several files pass through one device. Replaces *tier
 * with the wrapper (which then owns it); leaves it alone when `with` is
 * no fault tier. Either may be destroyed first. Returns 0 or -ENOMEM.
 */
int mp_tier_inject_share(struct mp_tier *with, struct mp_tier **tier);

/* True when t is a fault-injection tier. */
bool mp_tier_is_fault(const struct mp_tier *t);

/*
 * The allocation hook: call it before taking memory for (layer, expert).
 * Returns 0, or -ENOMEM (with a message naming the expert and the rule)
 * when an alloc rule of t fires. 0 for any tier that is not a fault tier.
 */
int mp_tier_inject_alloc(struct mp_tier *t, uint32_t layer, uint32_t expert);

/* A snapshot of what t injected; zeroes when t is not a fault tier. */
void mp_tier_inject_counts(const struct mp_tier *t, struct mp_fault_counts *out);

#endif /* MP_TIER_FAULT_H */
