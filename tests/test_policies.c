// SPDX-License-Identifier: MIT
/*
 * Eviction policies' decisions on hand-made sequences (lfu, finemoe, ema, coserve,
 * belady, prefetch admission), and the simulator: belady and oracle against
 * known optima, and the ranking of policies on a synthetic trace of another
 * geometry than the shipped ones.
 */
#include <errno.h>
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/sim.h>

#include "helpers.h"
#include "evict/evict.h"

#define NK 16

static bool all_ok(void *arg, uint32_t key)
{
	(void)arg;
	(void)key;
	return true;
}

static bool not_key3(void *arg, uint32_t key)
{
	(void)arg;
	return key != 3;
}

static void open_policy(struct mp_evict *pol, const char *name, uint32_t layers,
			uint32_t experts, const struct mp_evict_hints *h)
{
	struct mp_evict_env env = { .nkeys = layers * experts, .layers = layers,
				     .experts = experts, .slots_per_layer = experts, .hints = h };

	assert_non_null(mp_evict_find(name));
	assert_int_equal(mp_evict_init(pol, mp_evict_find(name), &env), 0);
}

static void lfu_evicts_the_least_used(void **state)
{
	struct mp_evict pol;

	(void)state;
	open_policy(&pol, "lfu", 1, NK, NULL);
	for (uint32_t k = 0; k < 4; k++)
		pol.ops->on_insert(&pol, k);
	/* Uses: 0 x3, 1 x1, 2 x2, 3 x0 -> 3, then (3 not evictable) 1. */
	for (int i = 0; i < 3; i++)
		pol.ops->on_access(&pol, 0);
	pol.ops->on_access(&pol, 1);
	pol.ops->on_access(&pol, 2);
	pol.ops->on_access(&pol, 2);
	assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 3);
	assert_int_equal(pol.ops->pick_victim(&pol, not_key3, NULL), 1);
	/* Counts survive eviction: 0 comes back with its 3 uses. */
	pol.ops->on_remove(&pol, 0);
	pol.ops->on_insert(&pol, 0);
	pol.ops->on_remove(&pol, 3);
	assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 1);
	mp_evict_fini(&pol);
}

static void finemoe_evicts_the_lowest_p_times_freq(void **state)
{
	float p[NK];
	struct mp_evict_hints h = { .p = p };
	struct mp_evict pol;

	(void)state;
	for (uint32_t k = 0; k < NK; k++)
		p[k] = -1.0f;
	open_policy(&pol, "finemoe", 2, 8, &h);
	for (uint32_t k = 0; k < 4; k++) {
		pol.ops->on_insert(&pol, k);
		pol.ops->on_access(&pol, k);
	}
	/* freq: 0:4 1:1 2:2 3:1 ; p: 0:0.1 1:0.9 2:0.3 3:0.5 -> p*freq 0.4 0.9 0.6 0.5 */
	for (int i = 0; i < 3; i++)
		pol.ops->on_access(&pol, 0);
	pol.ops->on_access(&pol, 2);
	p[0] = 0.1f;
	p[1] = 0.9f;
	p[2] = 0.3f;
	p[3] = 0.5f;
	assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 0);
	/* p = 0 goes first whatever its frequency. */
	p[2] = 0.0f;
	assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 2);
	mp_evict_fini(&pol);
}

static void report(struct mp_evict *pol, uint32_t token, uint32_t layer, uint32_t experts,
		   uint32_t e)
{
	uint32_t key = layer * experts + e;
	struct mp_evict_route r = { 0, token, layer, 1, &key, NULL };

	pol->ops->on_route(pol, &r);
}

static void coserve_evicts_unrunnable_successors_first(void **state)
{
	const uint32_t J = 4;
	struct mp_evict pol;

	(void)state;
	open_policy(&pol, "coserve", 2, J, NULL);
	/* History: layer 0 expert 0 is always followed by layer 1 expert 1; 2 by 3. */
	for (uint32_t t = 0; t < 6; t++) {
		report(&pol, t, 0, J, t % 2 ? 2 : 0);
		report(&pol, t, 1, J, t % 2 ? 3 : 1);
	}
	/* Layer 1 expert 3 is used as often as 1, and more than layer 0's 0. */
	pol.ops->on_insert(&pol, 0 * J + 0);
	pol.ops->on_insert(&pol, 1 * J + 3);
	pol.ops->on_insert(&pol, 1 * J + 1);
	/* The current token just ran layer 0 expert 0: layer 1 expert 3 cannot follow it. */
	report(&pol, 6, 0, J, 0);
	assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 1 * J + 3);
	/* Without an unrunnable successor, the lowest usage probability goes. */
	pol.ops->on_remove(&pol, 1 * J + 3);
	pol.ops->on_insert(&pol, 0 * J + 1);	/* never used: probability 0 */
	assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 0 * J + 1);
	mp_evict_fini(&pol);
}

static void belady_evicts_the_farthest_next_use(void **state)
{
	uint64_t next[NK];
	struct mp_evict_hints h = { .next_use = next };
	struct mp_evict pol;

	(void)state;
	open_policy(&pol, "belady", 1, NK, &h);
	for (uint32_t k = 0; k < 4; k++) {
		pol.ops->on_insert(&pol, k);
		next[k] = 10 + k * 5;
	}
	next[1] = UINT64_MAX;	/* never again */
	assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 1);
	next[1] = 5;
	assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 3);
	assert_int_equal(pol.ops->pick_victim(&pol, not_key3, NULL), 2);
	mp_evict_fini(&pol);
}

static void prefetch_never_evicts_an_expert_needed_sooner(void **state)
{
	uint64_t next[4] = { 20, 30, UINT64_MAX, 5 };
	struct mp_evict_hints h = { .next_use = next, .now = 10 };

	(void)state;
	/* incoming 0 (at 20) may evict 1 (at 30) and 2 (unknown), not 1 for 0 reversed. */
	assert_true(mp_evict_admit(&h, 0, 1));
	assert_true(mp_evict_admit(&h, 0, 2));
	assert_false(mp_evict_admit(&h, 1, 0));
	/* A victim whose predicted use has passed (5 < now) is fair game. */
	assert_true(mp_evict_admit(&h, 1, 3));
	/* An incoming expert with no known use never displaces one with a known use. */
	assert_false(mp_evict_admit(&h, 2, 1));
	assert_true(mp_evict_admit(NULL, 2, 1));
}

static void prefetch_never_evicts_an_expert_more_likely_used(void **state)
{
	float p[4] = { 0.6f, 0.4f, -1.0f, 0.6f };
	struct mp_evict_hints h = { .p = p };

	(void)state;
	assert_true(mp_evict_admit(&h, 0, 1));
	assert_false(mp_evict_admit(&h, 1, 0));
	/* Equal probabilities: not worth the read. */
	assert_false(mp_evict_admit(&h, 0, 3));
	/* Either side without a probability: the other rules decide. */
	assert_true(mp_evict_admit(&h, 2, 0));
	assert_true(mp_evict_admit(&h, 0, 2));
}

static void policy_names_are_listed(void **state)
{
	(void)state;
	assert_non_null(strstr(mp_evict_names(), "coserve"));
	assert_non_null(strstr(mp_evict_names(), "belady"));
	assert_null(mp_evict_find("random"));
}

/*
 * The simulator
 */

static struct mp_trace *parse(const char *text)
{
	struct mp_trace *t = NULL;

	assert_int_equal(mp_trace_parse(text, strlen(text), "handmade", &t), 0);
	return t;
}

/* One layer, 4 experts, top-1: request 1 (evaluated) is the given sequence. */
static struct mp_trace *one_layer_trace(const uint32_t *seq, uint32_t n)
{
	static char buf[8192];
	size_t len = (size_t)snprintf(buf, sizeof(buf), "# moe-trace v1\n# layers=1\n"
				      "# experts=4\n# topk=1\nrequest,token,layer,e0\n0,0,0,0\n");

	for (uint32_t i = 0; i < n; i++)
		len += (size_t)snprintf(buf + len, sizeof(buf) - len, "1,%u,0,%u\n", i, seq[i]);
	return parse(buf);
}

/* Fewest misses any replacement can have with `cap` slots (exhaustive search). */
static uint32_t opt_misses(const uint32_t *seq, uint32_t n, uint32_t i, uint32_t cache,
			   uint32_t cap)
{
	uint32_t best = UINT32_MAX, used = (uint32_t)__builtin_popcount(cache);

	if (i == n)
		return 0;
	if (cache & (1u << seq[i]))
		return opt_misses(seq, n, i + 1, cache, cap);
	if (used < cap)
		return 1 + opt_misses(seq, n, i + 1, cache | (1u << seq[i]), cap);
	for (uint32_t v = 0; v < 4; v++) {
		uint32_t m;

		if (!(cache & (1u << v)))
			continue;
		m = opt_misses(seq, n, i + 1, (cache & ~(1u << v)) | (1u << seq[i]), cap);
		if (m < best)
			best = m;
	}
	return 1 + best;
}

static uint64_t lru_hits(const uint32_t *seq, uint32_t n)
{
	int32_t mru = -1, lru = -1;
	uint64_t hits = 0;

	for (uint32_t i = 0; i < n; i++) {
		int32_t e = (int32_t)seq[i];

		if (e == mru) {
			hits++;
		} else if (e == lru) {
			hits++;
			lru = mru;
			mru = e;
		} else {
			lru = mru;
			mru = e;
		}
	}
	return hits;
}

static void belady_reaches_the_on_demand_optimum(void **state)
{
	const uint32_t seq[] = { 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 3, 2, 1, 0, 2, 0, 3, 1, 2, 3 };
	const uint32_t n = sizeof(seq) / sizeof(seq[0]);
	struct mp_trace *t = one_layer_trace(seq, n);
	struct mp_sim_config c = { .trace = t, .train_fraction = 0.5, .capacity = 2,
				   .prefetch = "none", .evict = "belady" };
	struct mp_sim_result r, lru;

	(void)state;
	assert_int_equal(mp_prefetch_simulate(&c, &r), 0);
	assert_int_equal(r.uses, n);
	assert_int_equal(r.uses - r.hits, opt_misses(seq, n, 0, 0, 2));
	/* LRU gets what a two-slot LRU written out here gets, fewer than the optimum. */
	c.evict = "lru";
	assert_int_equal(mp_prefetch_simulate(&c, &lru), 0);
	assert_int_equal(lru.hits, lru_hits(seq, n));
	assert_true(lru.hits < r.hits);
	mp_trace_close(t);
}

/* A structured synthetic trace: request topics, per-layer preferences, layer-to-layer links. */
static struct mp_trace *synthetic(uint32_t L, uint32_t J, uint32_t K, uint32_t R, uint32_t T,
				  uint64_t seed)
{
	size_t cap = (size_t)R * T * L * (16 + 8 * K) + 4096, len = 0;
	char *buf = malloc(cap);
	float *pref = malloc((size_t)8 * L * J * sizeof(float));
	uint64_t x = seed;
	struct mp_trace *t;

#define RND() (x = x * 6364136223846793005ull + 1442695040888963407ull, \
	       (double)(x >> 11) / 9007199254740992.0)
	assert_non_null(buf);
	assert_non_null(pref);
	for (size_t i = 0; i < (size_t)8 * L * J; i++)
		pref[i] = (float)(RND() * 6.0);
	len += (size_t)snprintf(buf + len, cap - len, "# moe-trace v1\n# layers=%u\n"
				"# experts=%u\n# topk=%u\nrequest,token,layer", L, J, K);
	for (uint32_t i = 0; i < K; i++)
		len += (size_t)snprintf(buf + len, cap - len, ",e%u", i);
	len += (size_t)snprintf(buf + len, cap - len, "\n");
	for (uint32_t r = 0; r < R; r++) {
		uint32_t topic = (uint32_t)(RND() * 8);

		for (uint32_t tok = 0; tok < T; tok++) {
			uint32_t prev = 0;

			if (RND() < 0.1)
				topic = (uint32_t)(RND() * 8);
			for (uint32_t l = 0; l < L; l++) {
				float score[64];
				uint32_t ids[8];

				for (uint32_t j = 0; j < J; j++)
					score[j] = pref[((size_t)topic * L + l) * J + j] +
						   (float)(RND() * 3.0) +
						   ((j + prev) % 5 == 0 ? 2.0f : 0.0f);
				for (uint32_t i = 0; i < K; i++) {
					uint32_t b = 0;

					while (score[b] < -1e29f)
						b++;
					for (uint32_t j = 0; j < J; j++)
						if (score[j] > score[b])
							b = j;
					ids[i] = b;
					score[b] = -1e30f;
				}
				prev = ids[0];
				len += (size_t)snprintf(buf + len, cap - len, "%u,%u,%u", r,
							tok, l);
				for (uint32_t i = 0; i < K; i++)
					len += (size_t)snprintf(buf + len, cap - len, ",%u",
								ids[i]);
				len += (size_t)snprintf(buf + len, cap - len, "\n");
			}
		}
	}
#undef RND
	assert_int_equal(mp_trace_parse(buf, len, "synthetic", &t), 0);
	free(buf);
	free(pref);
	return t;
}

static double hit_rate(const struct mp_trace *t, const char *prefetch, const char *evict,
		       uint32_t capacity)
{
	struct mp_sim_config c = { .trace = t, .capacity = capacity, .prefetch = prefetch,
				   .evict = evict, .load_cost = 2.0, .dense_cost = 0.25,
				   .io_channels = 2 };
	struct mp_sim_result r;

	assert_int_equal(mp_prefetch_simulate(&c, &r), 0);
	assert_true(r.uses > 0);
	return (double)r.hits / (double)r.uses;
}

static void oracle_prefetch_misses_only_what_it_cannot_reach(void **state)
{
	struct mp_trace *t = synthetic(8, 16, 2, 4, 20, 7);
	struct mp_sim_config c = { .trace = t, .capacity = 64, .prefetch = "oracle",
				   .evict = "belady", .load_cost = 0.2, .io_channels = 2 };
	struct mp_sim_result r;

	(void)state;
	assert_int_equal(mp_prefetch_simulate(&c, &r), 0);
	/* Loads are fast and the cache large: only the very first layers can be late. */
	assert_true(r.uses - r.hits <= 2 * 3);
	assert_int_equal(r.prefetch_wasted, 0);
	mp_trace_close(t);
}

static void ranking_holds_on_a_synthetic_geometry(void **state)
{
	/* 24 layers x 32 experts, top-4: neither shipped trace's geometry. */
	struct mp_trace *t = synthetic(24, 32, 4, 10, 40, 11);
	uint32_t half = 24 * 32 / 2;
	double none = hit_rate(t, "none", "lru", half);
	double fine = hit_rate(t, "finemoe", "finemoe", half);
	double orac = hit_rate(t, "oracle", "belady", half);

	(void)state;
	print_message("hit rates at 50%%: none+lru %.3f finemoe %.3f oracle %.3f\n", none, fine,
		      orac);
	assert_true(fine > none);
	assert_true(orac > fine);
	mp_trace_close(t);
}

/* One pass of layer 0 (experts J) routing the k experts in ids. */
static void pass(struct mp_evict *pol, const uint32_t *ids, uint32_t k)
{
	struct mp_evict_route r = { 0, 0, 0, k, ids, NULL };

	pol->ops->on_route(pol, &r);
}

static void ema_evicts_the_fewest_expected_uses(void **state)
{
	const uint32_t J = 8, hot[1] = { 0 }, warm[2] = { 0, 1 }, rare[2] = { 0, 2 };
	float p[8];
	struct mp_evict_hints h = { .p = p };
	struct mp_evict pol;

	(void)state;
	for (uint32_t k = 0; k < J; k++)
		p[k] = -1.0f;
	open_policy(&pol, "ema", 1, J, &h);
	for (uint32_t k = 0; k < 4; k++)
		pol.ops->on_insert(&pol, k);
	/* 40 passes: 0 every pass, 1 every other, 2 every eighth, 3 never. */
	for (uint32_t i = 0; i < 40; i++)
		pass(&pol, i % 8 == 7 ? rare : i % 2 ? warm : hot, i % 8 == 7 || i % 2 ? 2 : 1);
	/* Touched last, 3 would be LRU's keeper; its rate says it goes first. */
	pol.ops->on_access(&pol, 3);
	assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 3);
	assert_int_equal(pol.ops->pick_victim(&pol, not_key3, NULL), 2);
	/* Predicted for the next pass, the rare ones stay and the warm one goes. */
	p[2] = 0.9f;
	p[3] = 0.9f;
	assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 1);
	/* Predicted unused, even the hottest expert goes before a likely one. */
	p[0] = 0.0f;
	p[1] = 0.95f;
	assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 0);
	mp_evict_fini(&pol);
}

/*
 * ema and finemoe weigh each key by its layer's miss weight (hints
 * miss_w): of two equally likely experts, the one in a layer no prefetch
 * brings back in time stays.
 */
static void eviction_keeps_the_layer_no_prefetch_reaches(void **state)
{
	const char *names[] = { "ema", "finemoe" };
	float p[4] = { 0.5f, 0.5f, 0.5f, 0.5f }, w[2] = { 1.0f, 1.0f };
	struct mp_evict_hints h = { .p = p, .miss_w = w };

	(void)state;
	for (uint32_t i = 0; i < 2; i++) {
		struct mp_evict pol;

		/* Layers 0 and 1 of 2 experts; keys 0 (layer 0) and 2 (layer 1), 0 the older. */
		open_policy(&pol, names[i], 2, 2, &h);
		pol.ops->on_insert(&pol, 0);
		pol.ops->on_insert(&pol, 2);
		pol.ops->on_access(&pol, 0);
		pol.ops->on_access(&pol, 2);
		w[0] = w[1] = 1.0f;
		assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 0);
		w[0] = 2.0f;
		assert_int_equal(pol.ops->pick_victim(&pol, all_ok, NULL), 2);
		mp_evict_fini(&pol);
	}
}

/*
 * A popular expert between a rotation of rarer ones: two slots, LRU always
 * keeps the last two and misses everything; the routing rate keeps the
 * popular one resident.
 */
static void ema_keeps_the_popular_expert_that_lru_drops(void **state)
{
	const uint32_t seq[] = { 0, 1, 2, 0, 3, 1, 0, 2, 3, 0, 1, 2, 0, 3, 1, 0, 2, 3,
				 0, 1, 2, 0, 3, 1, 0, 2, 3 };
	const uint32_t n = sizeof(seq) / sizeof(seq[0]);
	struct mp_trace *t = one_layer_trace(seq, n);
	struct mp_sim_config c = { .trace = t, .train_fraction = 0.5, .capacity = 2,
				   .prefetch = "none", .evict = "ema" };
	struct mp_sim_result ema, lru;
	uint32_t zeros = 0;

	(void)state;
	for (uint32_t i = 0; i < n; i++)
		zeros += seq[i] == 0;
	assert_int_equal(mp_prefetch_simulate(&c, &ema), 0);
	c.evict = "lru";
	assert_int_equal(mp_prefetch_simulate(&c, &lru), 0);
	assert_int_equal(lru.hits, lru_hits(seq, n));
	print_message("hits of %u uses (%u of expert 0): lru %llu ema %llu\n", n, zeros,
		      (unsigned long long)lru.hits, (unsigned long long)ema.hits);
	/* Once the rates part (a few passes), expert 0 stays: most of its uses hit. */
	assert_true(ema.hits >= 2 * zeros / 3);
	assert_true(ema.hits > lru.hits);
	mp_trace_close(t);
}

static struct mp_sim_result simulate(const struct mp_trace *t, const char *prefetch,
				     const char *evict, uint32_t capacity, double load_cost)
{
	struct mp_sim_config c = { .trace = t, .capacity = capacity, .prefetch = prefetch,
				   .evict = evict, .load_cost = load_cost, .dense_cost = 0.5,
				   .io_channels = 1 };
	struct mp_sim_result r;

	assert_int_equal(mp_prefetch_simulate(&c, &r), 0);
	assert_true(r.tokens > 0 && r.time > 0);
	return r;
}

/*
 * When reads are the bottleneck (one channel, a read ten times an expert's
 * compute), finemoe still beats on-demand LRU in time, not only in hits,
 * because it reads only what is worth a read: its prefetches are wasted
 * less often than when reads are cheap and it may speculate.
 */
static void finemoe_wins_when_reads_are_the_bottleneck(void **state)
{
	struct mp_trace *t = synthetic(24, 32, 4, 10, 40, 11);
	uint32_t half = 24 * 32 / 2;
	struct mp_sim_result none = simulate(t, "none", "lru", half, 10.0);
	struct mp_sim_result slow = simulate(t, "finemoe", "finemoe", half, 10.0);
	struct mp_sim_result fast = simulate(t, "finemoe", "finemoe", half, 1.0);
	double waste_slow = (double)slow.prefetch_wasted / (double)slow.prefetch_loads;
	double waste_fast = (double)fast.prefetch_wasted / (double)fast.prefetch_loads;

	(void)state;
	print_message("tokens/unit none+lru %.5f finemoe %.5f; waste slow %.3f fast %.3f\n",
		      none.tokens / none.time, slow.tokens / slow.time, waste_slow, waste_fast);
	assert_true(slow.tokens / slow.time > none.tokens / none.time);
	assert_true(slow.prefetch_loads > 0 && fast.prefetch_loads > slow.prefetch_loads);
	assert_true(waste_slow < waste_fast);
	mp_trace_close(t);
}

/*
 * The misses' causes add up to no more than the misses, and slow reads
 * turn predictions into late ones (being read, or still queued at use).
 */
static void simulator_splits_the_misses_by_cause(void **state)
{
	struct mp_trace *t = synthetic(24, 32, 4, 10, 40, 11);
	uint32_t half = 24 * 32 / 2;
	struct mp_sim_result slow = simulate(t, "finemoe", "finemoe", half, 10.0);
	struct mp_sim_result fast = simulate(t, "finemoe", "finemoe", half, 1.0);
	const struct mp_sim_result *rs[] = { &slow, &fast };

	(void)state;
	for (uint32_t i = 0; i < 2; i++) {
		const struct mp_sim_result *r = rs[i];

		print_message("late %" PRIu64 " queued %" PRIu64 " predicted %" PRIu64
			      " (wasted %" PRIu64 ") of %" PRIu64 " misses\n", r->late,
			      r->miss_queued, r->miss_predicted, r->miss_predicted_wasted,
			      r->uses - r->hits);
		assert_true(r->late + r->miss_queued + r->miss_predicted <= r->uses - r->hits);
		assert_true(r->miss_predicted_wasted <= r->miss_predicted);
	}
	assert_true(slow.late + slow.miss_queued > fast.late + fast.miss_queued);
	assert_true(slow.miss_queued > 0);
	mp_trace_close(t);
}

/* Semantic vectors for the simulator: counts its calls, fails on cue. */
struct sem_calls {
	uint32_t calls;
	uint32_t fail_at;	/* 0: never */
};

static int sem_counted(void *arg, uint32_t r, uint32_t t, float *out)
{
	struct sem_calls *c = arg;

	(void)r;
	if (++c->calls == c->fail_at)
		return -EIO;
	for (uint32_t i = 0; i < 4; i++)
		out[i] = i == t % 4 ? 1.0f : 0.0f;
	return 0;
}

static void simulator_gives_every_iteration_its_semantic_vector(void **state)
{
	struct mp_trace *t = synthetic(4, 8, 2, 4, 10, 5);
	struct sem_calls calls = { 0 };
	struct mp_sim_config c = { .trace = t, .capacity = 16, .prefetch = "finemoe",
				   .evict = "finemoe", .sem = { 4, sem_counted, &calls } };
	struct mp_sim_result r;

	(void)state;
	t_log_capture();
	assert_int_equal(mp_prefetch_simulate(&c, &r), 0);
	/* Every token of the 4 requests (3 learnt, 1 evaluated), once each. */
	assert_int_equal(calls.calls, 4 * 10);
	assert_int_equal(r.tokens, 10);
	assert_true(r.prefetch_emitted > 0);
	/* A source that fails is the simulation's error, naming the token. */
	calls = (struct sem_calls){ .fail_at = 35 };
	t_log_reset();
	assert_int_equal(mp_prefetch_simulate(&c, &r), -EIO);
	assert_true(t_log_contains("semantic vector of request 3 token 4: Input/output error"));
	mp_trace_close(t);
}

/* Speculative gates for the simulator: the trace's own target layer, counted, failing on cue. */
struct spec_calls {
	const struct mp_trace *t;
	uint32_t calls;
	uint32_t fail_at;	/* 0: never */
};

static int spec_true(void *arg, uint32_t r, uint32_t tok, uint32_t layer, uint32_t target,
		     float *out)
{
	struct spec_calls *c = arg;
	uint32_t J = mp_trace_experts(c->t), K = mp_trace_topk(c->t);
	const uint32_t *ids;
	const float *w;

	if (++c->calls == c->fail_at)
		return -EIO;
	assert_true(target > layer);
	assert_int_equal(mp_trace_route(c->t, r, tok, target, &ids, &w), 0);
	memset(out, 0, J * sizeof(float));
	for (uint32_t i = 0; i < K; i++)
		out[ids[i]] = 1.0f / K;
	return 0;
}

/*
 * nextlayer in the simulator reads the speculative gate of every evaluated
 * position but the last layer's: given the true next layer, every read it
 * issues is used. A policy that takes no layer input never asks; a source
 * that fails is the simulation's error, naming the position.
 */
static void simulator_gives_nextlayer_its_speculative_gates(void **state)
{
	struct mp_trace *t = synthetic(4, 8, 2, 4, 10, 5);
	struct spec_calls calls = { .t = t };
	struct mp_sim_config c = { .trace = t, .capacity = 16, .prefetch = "nextlayer",
				   .evict = "lru", .load_cost = 0.5,
				   .spec = { spec_true, &calls } };
	struct mp_sim_result r;

	(void)state;
	t_log_capture();
	assert_int_equal(mp_prefetch_simulate(&c, &r), 0);
	/* The evaluated request's 10 tokens, layers 0..2. */
	assert_int_equal(calls.calls, 10 * 3);
	assert_true(r.prefetch_loads > 0);
	assert_int_equal(r.prefetch_used, r.prefetch_loads);
	calls.calls = 0;
	c.prefetch = "finemoe";
	assert_int_equal(mp_prefetch_simulate(&c, &r), 0);
	assert_int_equal(calls.calls, 0);
	c.prefetch = "nextlayer";
	calls = (struct spec_calls){ .t = t, .fail_at = 8 };
	t_log_reset();
	assert_int_equal(mp_prefetch_simulate(&c, &r), -EIO);
	assert_true(t_log_contains("speculative gate of request 3 token 2 layer 1 for layer 2"));
	mp_trace_close(t);
}

static void unknown_policies_are_refused(void **state)
{
	struct mp_trace *t = synthetic(4, 8, 2, 2, 4, 3);
	struct mp_sim_config c = { .trace = t, .capacity = 8, .prefetch = "psychic",
				   .evict = "lru" };
	struct mp_sim_result r;

	(void)state;
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_prefetch_simulate(&c, &r), -EINVAL);
	assert_true(t_log_contains("unknown prefetch policy 'psychic'"));
	c.prefetch = "none";
	c.capacity = 2;
	t_log_reset();
	assert_int_equal(mp_prefetch_simulate(&c, &r), -EINVAL);
	assert_true(t_log_contains("cannot hold top-2"));
	mp_trace_close(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(lfu_evicts_the_least_used),
		cmocka_unit_test(finemoe_evicts_the_lowest_p_times_freq),
		cmocka_unit_test(finemoe_wins_when_reads_are_the_bottleneck),
		cmocka_unit_test(simulator_splits_the_misses_by_cause),
		cmocka_unit_test(ema_evicts_the_fewest_expected_uses),
		cmocka_unit_test(eviction_keeps_the_layer_no_prefetch_reaches),
		cmocka_unit_test(ema_keeps_the_popular_expert_that_lru_drops),
		cmocka_unit_test(coserve_evicts_unrunnable_successors_first),
		cmocka_unit_test(belady_evicts_the_farthest_next_use),
		cmocka_unit_test(prefetch_never_evicts_an_expert_needed_sooner),
		cmocka_unit_test(prefetch_never_evicts_an_expert_more_likely_used),
		cmocka_unit_test(policy_names_are_listed),
		cmocka_unit_test(belady_reaches_the_on_demand_optimum),
		cmocka_unit_test(oracle_prefetch_misses_only_what_it_cannot_reach),
		cmocka_unit_test(ranking_holds_on_a_synthetic_geometry),
		cmocka_unit_test(simulator_gives_every_iteration_its_semantic_vector),
		cmocka_unit_test(simulator_gives_nextlayer_its_speculative_gates),
		cmocka_unit_test(unknown_policies_are_refused),
	};

	return cmocka_run_group_tests_name("policies", tests, NULL, NULL);
}
