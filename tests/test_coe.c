// SPDX-License-Identifier: MIT
/*
 * Collaboration of Experts: the manifest and its errors, the dependency
 * graph, two-stage eviction, request assigning, the decay window, the
 * profiler's fits, the generator's container, boards, and the scheduler
 * over a real pager: every policy runs every chain to the same outputs.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "helpers.h"
#include "base/base.h"
#include "coe/coe_priv.h"
#include "coe/queue.h"
#include "store/gen.h"

/* A manifest with three classifiers and a detector; {P0} etc. are filled in. */
static const char manifest_fmt[] =
	"{\"format\": \"moepager-coe\", \"version\": 1, \"container\": \"%s\",\n"
	" \"architectures\": [{\"name\": \"clf\", \"trunk\": \"%s\"},"
	" {\"name\": \"det\", \"trunk\": \"%s\"}],\n"
	" \"models\": [\n"
	"  {\"name\": \"a\", \"arch\": \"clf\", \"slot\": 0, \"p\": %s},\n"
	"  {\"name\": \"b\", \"arch\": \"clf\", \"slot\": %s, \"p\": 0.3},\n"
	"  {\"name\": \"c\", \"arch\": \"clf\", \"slot\": 16, \"p\": 0.2},\n"
	"  {\"name\": \"d\", \"arch\": \"det\", \"slot\": 24}],\n"
	" \"dependencies\": [{\"preliminary\": \"a\", \"subsequent\": \"d\", \"p\": 0.5},\n"
	"  {\"preliminary\": \"b\", \"subsequent\": \"d\", \"p\": 0.25}%s]}\n";

static int parse(const char *p_a, const char *slot_b, const char *extra, bool stores,
		 struct mp_coe **out)
{
	char buf[4096];

	snprintf(buf, sizeof(buf), manifest_fmt, "experts.mpk", "trunk-clf-s.mpk",
		 "trunk-det-m.mpk", p_a, slot_b, extra);
	return mp_coe_parse(buf, strlen(buf), t_tmpdir(), !stores, out);
}

static void usage_flows_through_the_graph(void **state)
{
	struct mp_coe_model_info mi;
	struct mp_coe *c;

	(void)state;
	assert_int_equal(parse("0.5", "8", "", false, &c), 0);
	assert_int_equal(mp_coe_model_count(c), 4);
	assert_int_equal(mp_coe_model(c, 3, &mi), 0);
	/* d runs after a (0.5 x 0.5) or b (0.3 x 0.25). */
	assert_true(fabs(mi.usage - (0.25 + 0.075)) < 1e-12);
	assert_int_equal(mi.n_pre, 2);
	assert_int_equal(mp_coe_model_find(c, "c"), 2);
	assert_int_equal(mp_coe_model_find(c, "zz"), -ENOENT);
	mp_coe_close(c);
}

static void cyclic_graph_is_refused_naming_the_cycle(void **state)
{
	struct mp_coe *c = NULL;

	(void)state;
	t_log_reset();
	assert_int_equal(parse("0.5", "8", ", {\"preliminary\": \"d\", \"subsequent\": \"b\", "
			       "\"p\": 0.1}", false, &c), -ELOOP);
	assert_null(c);
	assert_true(t_log_contains("cycle"));
	assert_true(t_log_contains("b <- d") || t_log_contains("d <- b"));
}

static void start_probabilities_must_sum_to_one(void **state)
{
	struct mp_coe *c = NULL;

	(void)state;
	t_log_reset();
	assert_int_equal(parse("0.4", "8", "", false, &c), -EINVAL);
	assert_true(t_log_contains("sum to 0.9"));
	/* A model's edges past 1: more than one subsequent model at once. */
	t_log_reset();
	assert_int_equal(parse("0.5", "8", ", {\"preliminary\": \"a\", \"subsequent\": \"c\", "
			       "\"p\": 0.6}", false, &c), -EINVAL);
	assert_true(t_log_contains("model \"a\""));
}

static void bad_fields_are_refused_naming_them(void **state)
{
	static const char *const bad[] = {
		"{\"format\": \"x\", \"version\": 1}",
		"{\"format\": \"moepager-coe\", \"version\": 2}",
		"[1, 2]",
		"{\"format\": \"moepager-coe\", \"version\": 1, \"container\": \"e\", "
		"\"architectures\": [{\"name\": \"a\", \"trunk\": \"t\"}], \"models\": "
		"[{\"name\": \"m\", \"arch\": \"nope\", \"slot\": 0, \"p\": 1}]}",
		"{\"format\": \"moepager-coe\", \"version\": 1, \"container\": \"e\", "
		"\"architectures\": [{\"name\": \"a\", \"trunk\": \"t\"}], \"models\": "
		"[{\"name\": \"m\", \"arch\": \"a\", \"slot\": -1, \"p\": 1}]}",
		"{\"format\": \"moepager-coe\", \"version\": 1, \"container\": \"e\", "
		"\"architectures\": [{\"name\": \"a\", \"trunk\": \"t\"}], \"models\": "
		"[{\"name\": \"m\", \"arch\": \"a\", \"slot\": 0, \"p\": 1.5}]}",
		"{\"format\": \"moepager-coe\"",
	};
	static const char *const why[] = { "format", "version", "object", "unknown architecture",
					   "slot", "probability", "line" };

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct mp_coe *c = NULL;

		t_log_reset();
		assert_true(mp_coe_parse(bad[i], strlen(bad[i]), ".", true, &c) < 0);
		assert_null(c);
		if (!t_log_contains(why[i]))
			fail_msg("case %zu: no \"%s\" in the message", i, why[i]);
	}
}

/*
 * With the generated tiny CoE (group setup): files, slots, the scheduler
 */

static const struct mp_coe_gen_arch tiny_archs[] = {
	{ "clf-s", { .layers = 2, .experts = 4, .topk = 2, .hidden = 64, .ffn = 128, .heads = 2,
		     .kv_heads = 1, .head_dim = 32, .vocab = 32, .max_seq = 16,
		     .dtype = MP_DTYPE_F32, .rope_theta = 1e4f, .norm_eps = 1e-5f }, false, 1 },
	{ "det-m", { .layers = 2, .experts = 4, .topk = 1, .hidden = 128, .ffn = 64, .heads = 2,
		     .kv_heads = 1, .head_dim = 64, .vocab = 32, .max_seq = 16,
		     .dtype = MP_DTYPE_F32, .rope_theta = 1e4f, .norm_eps = 1e-5f }, true, 0 },
};

static int gen_tiny(void **state)
{
	struct mp_coe_gen_config cfg = { .archs = tiny_archs, .n_archs = 2, .components = 10,
					 .zipf = 1.0, .detector_share = 0.6, .clean = 0.9,
					 .seed = 3 };

	(void)state;
	t_log_capture();
	return mp_coe_gen(t_tmpdir(), &cfg, NULL, NULL);
}

static int cleanup(void **state)
{
	(void)state;
	t_tmpdir_cleanup();
	return 0;
}

static void missing_files_are_refused_naming_them(void **state)
{
	struct mp_coe *c = NULL;
	char buf[4096];

	(void)state;
	snprintf(buf, sizeof(buf), manifest_fmt, "nothere.mpk", "trunk-clf-s.mpk",
		 "trunk-det-m.mpk", "0.5", "8", "");
	t_log_reset();
	assert_int_equal(mp_coe_parse(buf, strlen(buf), t_tmpdir(), false, &c), -ENOENT);
	assert_true(t_log_contains("container") && t_log_contains("nothere.mpk"));
	snprintf(buf, sizeof(buf), manifest_fmt, "experts.mpk", "trunk-gone.mpk",
		 "trunk-det-m.mpk", "0.5", "8", "");
	t_log_reset();
	assert_int_equal(mp_coe_parse(buf, strlen(buf), t_tmpdir(), false, &c), -ENOENT);
	assert_true(t_log_contains("trunk") && t_log_contains("trunk-gone.mpk"));
	assert_null(c);
}

static void overlapping_slots_are_refused(void **state)
{
	struct mp_coe *c = NULL;

	(void)state;
	t_log_reset();
	assert_int_equal(parse("0.5", "4", "", true, &c), -EINVAL);
	assert_true(t_log_contains("share container slot"));
	assert_int_equal(parse("0.5", "8", "", true, &c), 0);
	mp_coe_close(c);
}

static void open_gen(struct mp_coe **c)
{
	assert_int_equal(mp_coe_open(t_path("coe.json"), c), 0);
}

/* A model's container slots hold what `moepager gen` writes for its geometry and seed. */
static void container_holds_each_models_generated_experts(void **state)
{
	struct mp_store *trunk;
	struct mp_coe *c;
	void *a, *b;

	(void)state;
	open_gen(&c);
	a = malloc(mp_store_expert_bytes(mp_coe_container(c)));
	b = malloc(mp_store_expert_bytes(mp_coe_container(c)));
	assert_int_equal(mp_store_open(t_path("trunk-clf-s.mpk"), &trunk), 0);
	for (uint32_t m = 0; m < mp_coe_model_count(c); m++) {
		struct mp_coe_model_info mi;
		struct mp_coe_arch_info ai;

		mp_coe_model(c, m, &mi);
		mp_coe_arch(c, mi.arch, &ai);
		for (uint32_t l = 0; l < ai.geometry->layers; l++) {
			for (uint32_t e = 0; e < ai.geometry->experts; e++) {
				uint32_t cl, ce;

				assert_int_equal(mp_coe_slot(c, m, l, e, &cl, &ce), 0);
				assert_int_equal(mp_store_read_expert(mp_coe_container(c), cl, ce, a),
						 0);
				mpk_gen_expert(ai.geometry, l, e, mi.seed, b);
				assert_memory_equal(a, b, mp_store_expert_bytes(mp_coe_container(c)));
			}
		}
	}
	/* The architecture's trunk is its first model, whole. */
	assert_int_equal(mp_store_read_expert(trunk, 1, 3, b), 0);
	assert_int_equal(mp_store_read_expert(mp_coe_container(c), 0, 7, a), 0);
	assert_memory_equal(a, b, mp_store_expert_bytes(trunk));
	mp_store_close(trunk);
	free(a);
	free(b);
	mp_coe_close(c);
}

static void boards_follow_the_start_probabilities(void **state)
{
	struct mp_coe_workload_config wc = { .requests = 4000, .interval_ns = 4000000, .seed = 9 };
	struct mp_coe_request *r, *r2;
	uint32_t counts[64] = { 0 }, n;
	struct mp_coe *c;

	(void)state;
	open_gen(&c);
	n = mp_coe_model_count(c);
	assert_int_equal(mp_coe_workload(c, &wc, &r), 4000);
	assert_int_equal(mp_coe_workload(c, &wc, &r2), 4000);
	assert_memory_equal(r, r2, 4000 * sizeof(*r));
	for (uint32_t i = 0; i < 4000; i++) {
		struct mp_coe_model_info mi;

		assert_int_equal(r[i].arrival_ns, (uint64_t)i * 4000000);
		mp_coe_model(c, r[i].model, &mi);
		assert_true(mi.p_first > 0);	/* detectors are never first */
		counts[r[i].model]++;
	}
	for (uint32_t m = 0; m < n; m++) {
		struct mp_coe_model_info mi;
		double want;

		mp_coe_model(c, m, &mi);
		want = mi.p_first * 4000;
		/* Within 5 standard deviations of the binomial count. */
		assert_true(fabs(counts[m] - want) <= 5 * sqrt(want + 1));
	}
	free(r);
	free(r2);
	mp_coe_close(c);
}

/*
 * Two-stage eviction, assigning, the decay window, the fits: pure functions
 */

/* a (p .5), b (.3), c (.2) classifiers of 8 slots; d (usage .325) a detector of 16. */
static void open_eviction_graph(struct mp_coe **c)
{
	assert_int_equal(parse("0.5", "8", "", false, c), 0);
	(*c)->archs[0].slots = 8;
	(*c)->archs[1].slots = 16;
	(*c)->slot_bytes = 1;
}

static void two_stage_evicts_orphaned_successors_largest_first_then_least_used(void **state)
{
	struct mp_coe *c;
	uint32_t resident[4] = { 0, 1, 2, 3 };
	bool in_use[4] = { false }, mask[4] = { true, true, true, true };

	(void)state;
	open_eviction_graph(&c);
	/* d's preliminaries a and b are resident: stage 2, the lowest usage (c, .2). */
	assert_int_equal(coe_evict_pick(c, resident, in_use, 4, mask, NULL), 2);
	/* Without a and b, d cannot run: stage 1 takes it though its usage is higher. */
	mask[0] = mask[1] = false;
	assert_int_equal(coe_evict_pick(c, (uint32_t[]){ 2, 3 }, in_use, 2, mask, NULL), 3);
	/* In use: never. */
	in_use[3] = true;
	assert_int_equal(coe_evict_pick(c, (uint32_t[]){ 2, 3 }, in_use, 2, mask, NULL), 2);
	in_use[2] = true;
	assert_int_equal(coe_evict_pick(c, (uint32_t[]){ 2, 3 }, in_use, 2, mask, NULL), -ENOENT);
	mp_coe_close(c);
}

/* A model with queued requests goes only when every other model is in use or queued too. */
static void two_stage_keeps_queued_models_until_no_other_may_go(void **state)
{
	struct mp_coe *c;
	uint32_t resident[4] = { 0, 1, 2, 3 }, queued[4] = { 0 };
	bool in_use[4] = { false }, mask[4] = { true, true, true, true };

	(void)state;
	open_eviction_graph(&c);
	/* c (usage .2) is the least used, but requests wait for it: b (.3 + ...) goes. */
	queued[2] = 1;
	assert_int_equal(coe_evict_pick(c, resident, in_use, 4, mask, queued), 1);
	/* Stage 1 among the idle ones first: d is orphaned without a and b. */
	mask[0] = mask[1] = false;
	assert_int_equal(coe_evict_pick(c, (uint32_t[]){ 2, 3 }, in_use, 2, mask, queued), 3);
	/* Every candidate queued for: the two stages among them, as without queues. */
	queued[3] = 2;
	mask[0] = mask[1] = true;
	assert_int_equal(coe_evict_pick(c, (uint32_t[]){ 2, 3 }, in_use, 2, mask, queued), 2);
	/* In use still never, queued or not. */
	in_use[2] = true;
	assert_int_equal(coe_evict_pick(c, (uint32_t[]){ 2, 3 }, in_use, 2, mask, queued), 3);
	mp_coe_close(c);
}

/*
 * A prefetch takes only the room of a model no request wants and less used
 * than its own; what a request of a model wants goes to its subsequent ones.
 */
static void prefetch_evicts_only_unwanted_less_used_models(void **state)
{
	uint32_t wanted[4] = { 0 };
	struct mp_coe *c;

	(void)state;
	open_eviction_graph(&c);
	/* a (.5) for b (.3): no; c (.2) for b: yes; c for c: no (not less used). */
	assert_false(coe_prefetch_may_evict(c, 0, 1, wanted));
	assert_true(coe_prefetch_may_evict(c, 2, 1, wanted));
	assert_false(coe_prefetch_may_evict(c, 2, 2, wanted));
	assert_true(coe_prefetch_may_evict(c, 2, 1, NULL));
	/* A request of b waits: d, b's subsequent model, is wanted; a, c are not. */
	coe_want_next(c, wanted, 1, 1);
	assert_int_equal(wanted[3], 1);
	assert_int_equal(wanted[0] + wanted[1] + wanted[2], 0);
	wanted[2] = 1;
	assert_false(coe_prefetch_may_evict(c, 2, 1, wanted));
	assert_false(coe_prefetch_may_evict(c, 3, 0, wanted));
	/* Done with b: d is not wanted any more; c (no subsequent model) changes nothing. */
	coe_want_next(c, wanted, 1, -1);
	coe_want_next(c, wanted, 2, 1);
	assert_int_equal(wanted[3], 0);
	assert_true(coe_prefetch_may_evict(c, 3, 0, wanted));
	mp_coe_close(c);
}

/* A group's load starts when the compute ahead of it no longer covers the load. */
static void prefetch_starts_the_groups_whose_load_the_work_ahead_does_not_cover(void **state)
{
	double work[4] = { 4, 4, 4, 4 }, load[4] = { 10, 10, 10, 10 };

	(void)state;
	/* 2, 6, 10 ahead of the first three (<= 10): due; 14 ahead of the fourth: later. */
	assert_int_equal(coe_prefetch_due(work, load, 4, 2), 3);
	/* A batch longer than every load: none is due yet. */
	assert_int_equal(coe_prefetch_due(work, load, 4, 11), 0);
	/* It stops at the first group not due, though a later one's load is longer. */
	load[1] = 5;
	load[2] = 100;
	assert_int_equal(coe_prefetch_due(work, load, 4, 2), 1);
	/* Loads that take no time: only a group with no work ahead of it is due. */
	assert_int_equal(coe_prefetch_due(work, (double[]){ 0, 0, 0, 0 }, 4, 0), 1);
	assert_int_equal(coe_prefetch_due(work, load, 0, 0), 0);
}

/* Queues requests of models; those of in_memory (NULL: none) have their model in memory. */
static void queue_in(struct coe_queue *q, const uint32_t *models, uint32_t n, bool arrange,
		     const bool *in_memory)
{
	for (uint32_t i = 0; i < n; i++) {
		struct creq *r = calloc(1, sizeof(*r));

		assert_non_null(r);
		r->id = i;
		r->model = models[i];
		r->pred = 1;
		coe_queue_add(q, r, arrange, in_memory && in_memory[models[i]]);
	}
}

static void queue_models(struct coe_queue *q, const uint32_t *models, uint32_t n, bool arrange)
{
	queue_in(q, models, n, arrange, NULL);
}

/* The queue's models in order, popping every request. */
static void assert_order(struct coe_queue *q, const uint32_t *models, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		struct creq *r = coe_queue_pop(q);

		assert_int_equal(r->model, models[i]);
		free(r);
	}
	assert_null(q->head);
	assert_null(q->tail);
}

/* Arranged, each model's requests are one group (one load); in first-come order otherwise. */
static void arranging_makes_one_group_per_model(void **state)
{
	uint32_t queued[4] = { 0 };
	struct coe_queue q;

	(void)state;
	assert_int_equal(coe_queue_init(&q, 4, queued), 0);
	queue_models(&q, (uint32_t[]){ 0, 1, 0, 2, 1, 0 }, 6, true);
	/* Groups keep the order their first requests came in; every count is kept. */
	assert_int_equal(queued[0], 3);
	assert_true(q.T == 6);
	assert_order(&q, (uint32_t[]){ 0, 0, 0, 1, 1, 2 }, 6);
	assert_int_equal(queued[0] + queued[1] + queued[2], 0);
	assert_true(q.T == 0);
	/* The batch running on model 3 is its group's last part: a request of 3 goes first. */
	q.running = 3;
	queue_models(&q, (uint32_t[]){ 1, 2, 3, 2 }, 4, true);
	assert_order(&q, (uint32_t[]){ 3, 1, 2, 2 }, 4);
	/* Without arranging: the order they came in, whatever runs. */
	queue_models(&q, (uint32_t[]){ 0, 1, 0, 3 }, 4, false);
	assert_order(&q, (uint32_t[]){ 0, 1, 0, 3 }, 4);
	q.running = -1;
	/*
	 * Models 2 and 3 in memory: their groups go before those that need a
	 * load, first come first served among them, and grow there.
	 */
	queue_in(&q, (uint32_t[]){ 0, 3, 1, 2, 3, 0, 2 }, 7, true, (bool[]){ 0, 0, 1, 1 });
	assert_order(&q, (uint32_t[]){ 3, 3, 2, 2, 0, 0, 1 }, 7);
	/* The front part empties from the head: a new in-memory group starts it again. */
	queue_in(&q, (uint32_t[]){ 0, 2 }, 2, true, (bool[]){ 0, 0, 1, 1 });
	free(coe_queue_pop(&q));
	queue_in(&q, (uint32_t[]){ 3, 0 }, 2, true, (bool[]){ 0, 0, 1, 1 });
	assert_order(&q, (uint32_t[]){ 3, 0, 0 }, 3);
	/* Not arranged, being in memory changes nothing. */
	queue_in(&q, (uint32_t[]){ 0, 2 }, 2, false, (bool[]){ 0, 0, 1, 1 });
	assert_order(&q, (uint32_t[]){ 0, 2 }, 2);
	/* Requests left are freed with the queue. */
	queue_models(&q, (uint32_t[]){ 2, 2 }, 2, true);
	coe_queue_fini(&q);
}

/* CoServe Fig. 8: queue 3 sets the total; queues 1 and 2 keep it; 2 adds less. */
static void assign_keeps_the_longest_queue_lowest_then_adds_least(void **state)
{
	double T[3] = { 40, 30, 100 }, add[3] = { 30, 20, 5 };

	(void)state;
	assert_int_equal(coe_assign_pick(T, add, 3), 1);
	/* When every choice raises the total, the one that raises it least. */
	add[0] = add[1] = 90;
	assert_int_equal(coe_assign_pick(T, add, 3), 2);
	/* One queue: it. */
	assert_int_equal(coe_assign_pick(T, add, 1), 0);
}

struct curve {
	double peak;		/* throughput rises until here, then falls */
	uint32_t calls;
	uint32_t at[32];
};

static int rising_then_falling(void *arg, uint32_t n, double *thr)
{
	struct curve *cv = arg;

	cv->at[cv->calls++] = n;
	*thr = n <= cv->peak ? 10.0 * n : 10.0 * cv->peak - 20.0 * (n - cv->peak);
	return 0;
}

static void decay_window_slides_as_the_paper_says(void **state)
{
	struct mp_coe_window_result r;
	struct curve cv = { .peak = 30 };

	(void)state;
	assert_int_equal(mp_coe_decay_window(15, 0.05, 352, 7, rising_then_falling, &cv, &r), 0);
	/* W0 = 15, d = 0.85: [0, 15], [15, 27.75], [27.75, 38.5875]. */
	assert_int_equal(r.n_steps, 3);
	assert_true(fabs(r.steps[0].hi - 15) < 1e-9 && r.steps[0].lo == 0);
	assert_true(fabs(r.steps[1].lo - 15) < 1e-9 && fabs(r.steps[1].hi - 27.75) < 1e-9);
	assert_true(fabs(r.steps[2].lo - 27.75) < 1e-9 && fabs(r.steps[2].hi - 38.5875) < 1e-9);
	assert_int_equal(cv.at[0], 15);
	assert_int_equal(cv.at[1], 28);
	assert_int_equal(cv.at[2], 39);
	assert_true(r.stopped);
	assert_true(fabs(r.lo - 27.75) < 1e-9 && fabs(r.hi - 38.5875) < 1e-9);
	/* The paper's "28 to 39". */
	assert_true(r.choice >= 28 && r.choice <= 39);
	/* The line through 150 and 280 predicts 410 at the third; 340 falls 17% short. */
	assert_true(fabs(r.steps[2].predicted - 410) < 1e-9);
}

/* The same gain at every window (Eq. 2's line is over the windows' numbers). */
static int steady_per_window(void *arg, uint32_t n, double *thr)
{
	struct curve *cv = arg;

	(void)n;
	*thr = 100.0 * ++cv->calls;
	return 0;
}

static void decay_window_keeps_sliding_while_throughput_keeps_its_line(void **state)
{
	struct mp_coe_window_result r;
	struct curve cv = { .peak = 1e9 };

	(void)state;
	assert_int_equal(mp_coe_decay_window(15, 0.05, 60, 1, steady_per_window, &cv, &r), 0);
	assert_false(r.stopped);
	assert_true(r.hi == 60 && r.choice <= 60 && r.choice >= (uint32_t)ceil(r.lo));
	assert_int_equal(mp_coe_decay_window(0, 0.05, 60, 1, rising_then_falling, &cv, &r),
			 -EINVAL);
	assert_int_equal(mp_coe_decay_window(15, 1.5, 60, 1, rising_then_falling, &cv, &r),
			 -EINVAL);
}

static void fits_find_k_b_and_the_plateau(void **state)
{
	double x[8], y[8], lat[8], k, b, r2;

	(void)state;
	for (int i = 0; i < 8; i++) {
		x[i] = i + 1;
		y[i] = 3.0 * x[i] + 7.0;
	}
	assert_int_equal(coe_fit_line(x, y, 8, &k, &b, &r2), 0);
	assert_true(fabs(k - 3) < 1e-9 && fabs(b - 7) < 1e-9 && fabs(r2 - 1) < 1e-9);
	assert_int_equal(coe_fit_line(x, y, 1, &k, &b, NULL), -EINVAL);
	/* Per-request latency 10, 6, 4.67, 4, then flat: the plateau starts at 4. */
	for (int i = 0; i < 8; i++)
		lat[i] = i < 4 ? 8.0 + 2.0 * (i + 1) : 4.0 * (i + 1);
	assert_int_equal(coe_max_batch(lat, 8, 0.05), 4);
	/* Always improving: the largest measured. */
	for (int i = 0; i < 8; i++)
		lat[i] = 100.0 + i;
	assert_int_equal(coe_max_batch(lat, 8, 0.05), 8);
}

static void profile_round_trips_and_bad_files_are_refused(void **state)
{
	struct mp_coe_perf e[2] = {
		{ .threads = 1, .arch = 0, .k_ns = 1500.5, .b_ns = 800, .max_batch = 6,
		  .load_file_ns = 2e7, .load_host_ns = 3e6, .model_bytes = 12u << 20,
		  .item_bytes = 4096, .r2 = 0.99 },
		{ .threads = 2, .arch = 1, .k_ns = 900, .b_ns = 100, .max_batch = 3 },
	};
	struct mp_coe_profile pr = { .n = 2, .perf = e, .tokens = 4 }, back;
	FILE *f;

	(void)state;
	assert_int_equal(mp_coe_profile_save(&pr, t_path("p.json")), 0);
	assert_int_equal(mp_coe_profile_load(t_path("p.json"), &back), 0);
	assert_int_equal(back.n, 2);
	assert_int_equal(back.tokens, 4);
	assert_true(mp_coe_profile_find(&back, 1, 0)->k_ns == 1500.5);
	assert_int_equal(mp_coe_profile_find(&back, 2, 1)->max_batch, 3);
	assert_null(mp_coe_profile_find(&back, 2, 0));
	mp_coe_profile_free(&back);
	f = fopen(t_path("bad.json"), "w");
	fputs("{\"tokens\": 4, \"perf\": [{\"threads\": 1}]}", f);
	fclose(f);
	t_log_reset();
	assert_int_equal(mp_coe_profile_load(t_path("bad.json"), &back), -EINVAL);
	assert_true(t_log_contains("perf[0]"));
}

/*
 * The scheduler over a real pager
 */

static void zero_executors_are_refused(void **state)
{
	struct mp_coe_sched_config sc = { .executors = 0 };
	struct mp_pager_config pc = { .budget = "50%" };
	struct mp_coe_sched *s = NULL;
	struct mp_pager *p;
	struct mp_coe *c;

	(void)state;
	open_gen(&c);
	assert_int_equal(mp_pager_open(mp_coe_container(c), &pc, &p), 0);
	t_log_reset();
	assert_int_equal(mp_coe_sched_open(c, p, &sc, &s), -EINVAL);
	assert_null(s);
	assert_true(t_log_contains("zero executors"));
	/* A budget that cannot hold what the executors use at once. */
	sc.executors = 2;
	sc.budget = mp_store_expert_bytes(mp_coe_container(c)) * 8;
	t_log_reset();
	assert_int_equal(mp_coe_sched_open(c, p, &sc, &s), -EINVAL);
	assert_true(t_log_contains("cannot hold"));
	mp_pager_close(p);
	mp_coe_close(c);
}

struct outcome {
	struct mp_coe_sched_stats st;
	uint64_t resident_peak;
};

static void run_policy(struct mp_coe *c, const struct mp_coe_request *reqs, uint32_t n,
		       struct mp_coe_sched_config *sc, struct outcome *out)
{
	/* Five models of the eleven: paging while the executors hold four. */
	uint64_t budget = 40ull * mp_store_expert_bytes(mp_coe_container(c));
	struct mp_pager_config pc = { .budget_bytes = budget, .fill_threads = 4 };
	struct mp_pager_stats ps;
	struct mp_coe_sched *s;
	struct mp_pager *p;

	assert_int_equal(mp_pager_open(mp_coe_container(c), &pc, &p), 0);
	sc->budget = budget;
	assert_int_equal(mp_coe_sched_open(c, p, sc, &s), 0);
	assert_int_equal(mp_coe_sched_run(s, reqs, n), 0);
	mp_coe_sched_stats(s, &out->st);
	mp_coe_sched_close(s);
	mp_pager_stats(p, &ps);
	out->resident_peak = ps.resident_peak;
	assert_true(ps.resident_peak <= budget);
	assert_int_equal(ps.poisoned, 0);
	mp_pager_close(p);
}

/* Every policy runs every chain; batched, paged and reordered, the outputs are the same bits. */
static void every_policy_runs_every_chain_to_the_same_outputs(void **state)
{
	struct mp_coe_workload_config wc = { .requests = 120, .interval_ns = 200000, .seed = 5 };
	struct mp_coe_sched_config base = { .executors = 2, .tokens = 3, .max_batch = 4 };
	struct mp_coe_request *reqs;
	struct outcome o[4];
	struct mp_coe *c;
	int n;

	(void)state;
	open_gen(&c);
	n = mp_coe_workload(c, &wc, &reqs);
	assert_int_equal(n, 120);
	for (int i = 0; i < 4; i++) {
		struct mp_coe_sched_config sc = base;

		/* samba-like, round robin + LRU, em-ra, coserve */
		sc.executors = i == 0 ? 1 : 2;
		sc.evict = i < 2 ? MP_COE_EVICT_LRU : MP_COE_EVICT_TWO_STAGE;
		sc.arrange = i >= 2;
		sc.prefetch = i >= 2;
		sc.assign = i == 3 ? MP_COE_ASSIGN_SPAN : MP_COE_ASSIGN_RR;
		sc.no_warm = i == 1;
		run_policy(c, reqs, (uint32_t)n, &sc, &o[i]);
		assert_int_equal(o[i].st.requests, 120);
		assert_int_equal(o[i].st.failed, 0);
		assert_true(o[i].st.runs > 120);	/* some chains went on to a detector */
		assert_true(o[i].st.batches <= o[i].st.runs);
		assert_int_equal(o[i].st.loads_file + o[i].st.loads_host, o[i].st.switches);
		/* Prefetches and first loads are switches; without prefetch no load is one. */
		assert_true(o[i].st.distinct_loads <= o[i].st.switches);
		/* Every model run that was not in memory at the start was loaded. */
		assert_true(o[i].st.cold_models > 0);
		assert_true(o[i].st.cold_models <= o[i].st.distinct_loads);
		assert_true(o[i].st.prefetched <= o[i].st.switches);
		if (!sc.prefetch)
			assert_int_equal(o[i].st.prefetched, 0);
	}
	for (int i = 1; i < 4; i++) {
		assert_int_equal(o[i].st.runs, o[0].st.runs);
		assert_true(o[i].st.output_hash == o[0].st.output_hash);
	}
	/* Without the warm start every model is loaded at least once while running. */
	assert_int_equal(o[1].st.warm_loads, 0);
	assert_true(o[0].st.warm_loads > 0);
	/* The same warm start and the same chains: the same models to load, whatever the policy. */
	assert_int_equal(o[2].st.cold_models, o[0].st.cold_models);
	assert_int_equal(o[3].st.cold_models, o[0].st.cold_models);
	assert_true(o[1].st.cold_models > o[0].st.cold_models);
	free(reqs);
	mp_coe_close(c);
}

/* A pinned model is loaded before the run and never leaves, however little it is used. */
static void pinned_model_stays_in_memory(void **state)
{
	struct mp_coe_workload_config wc = { .requests = 80, .interval_ns = 100000, .seed = 2 };
	struct mp_coe_sched_config sc = { .executors = 2, .tokens = 2, .max_batch = 2,
					  .evict = MP_COE_EVICT_TWO_STAGE, .arrange = true,
					  .prefetch = true, .assign = MP_COE_ASSIGN_SPAN };
	uint64_t budget;
	struct mp_pager_config pc = { .fill_threads = 4 };
	struct mp_coe_request *reqs;
	struct mp_coe_model_info mi;
	struct mp_coe_sched_stats st;
	struct mp_coe_sched *s;
	struct mp_pager *p;
	struct mp_coe *c;
	char *json, *at, *out;
	size_t len;
	FILE *f;
	int n, least = 0;

	(void)state;
	open_gen(&c);
	/* Pin the least used classifier. */
	for (uint32_t m = 0; m < mp_coe_model_count(c); m++) {
		struct mp_coe_model_info a, b;

		mp_coe_model(c, m, &a);
		mp_coe_model(c, (uint32_t)least, &b);
		if (a.p_first > 0 && a.p_first < b.p_first)
			least = (int)m;
	}
	mp_coe_model(c, (uint32_t)least, &mi);
	assert_false(mi.pinned);
	assert_int_equal(mp_read_file("manifest", t_path("coe.json"), &json, &len), 0);
	out = malloc(len + 64);
	if (!out) {
		/* (a return gcc sees: the sanitizer build's snprintf check wants one) */
		fail_msg("out of memory");
		return;
	}
	snprintf(out, len + 64, "\"name\": \"%s\",", mi.name);
	at = strstr(json, out);
	assert_non_null(at);
	snprintf(out, len + 64, "%.*s\"pin\": true, %s", (int)(at - json), json, at);
	f = fopen(t_path("coe-pin.json"), "w");
	fputs(out, f);
	fclose(f);
	free(out);
	free(json);
	mp_coe_close(c);

	assert_int_equal(mp_coe_open(t_path("coe-pin.json"), &c), 0);
	mp_coe_model(c, (uint32_t)least, &mi);
	assert_true(mi.pinned);
	budget = 40ull * mp_store_expert_bytes(mp_coe_container(c));
	pc.budget_bytes = budget;
	sc.budget = budget;
	n = mp_coe_workload(c, &wc, &reqs);
	assert_int_equal(mp_pager_open(mp_coe_container(c), &pc, &p), 0);
	assert_int_equal(mp_coe_sched_open(c, p, &sc, &s), 0);
	assert_int_equal(mp_coe_sched_run(s, reqs, (uint32_t)n), 0);
	mp_coe_sched_stats(s, &st);
	assert_true(st.evictions > 0);
	for (uint32_t l = 0; l < 2; l++) {
		for (uint32_t e = 0; e < 4; e++) {
			uint32_t cl, ce;

			assert_int_equal(mp_coe_slot(c, (uint32_t)least, l, e, &cl, &ce), 0);
			assert_int_equal(mp_pager_residency(p, cl, ce), MP_RES_MAPPED);
		}
	}
	mp_coe_sched_close(s);
	mp_pager_close(p);
	free(reqs);
	mp_coe_close(c);
}

int main(void)
{
	const struct CMUnitTest pure[] = {
		cmocka_unit_test(usage_flows_through_the_graph),
		cmocka_unit_test(cyclic_graph_is_refused_naming_the_cycle),
		cmocka_unit_test(start_probabilities_must_sum_to_one),
		cmocka_unit_test(bad_fields_are_refused_naming_them),
		cmocka_unit_test(two_stage_evicts_orphaned_successors_largest_first_then_least_used),
		cmocka_unit_test(two_stage_keeps_queued_models_until_no_other_may_go),
		cmocka_unit_test(prefetch_evicts_only_unwanted_less_used_models),
		cmocka_unit_test(prefetch_starts_the_groups_whose_load_the_work_ahead_does_not_cover),
		cmocka_unit_test(arranging_makes_one_group_per_model),
		cmocka_unit_test(assign_keeps_the_longest_queue_lowest_then_adds_least),
		cmocka_unit_test(decay_window_slides_as_the_paper_says),
		cmocka_unit_test(decay_window_keeps_sliding_while_throughput_keeps_its_line),
		cmocka_unit_test(fits_find_k_b_and_the_plateau),
	};
	const struct CMUnitTest files[] = {
		cmocka_unit_test(missing_files_are_refused_naming_them),
		cmocka_unit_test(overlapping_slots_are_refused),
		cmocka_unit_test(container_holds_each_models_generated_experts),
		cmocka_unit_test(boards_follow_the_start_probabilities),
		cmocka_unit_test(profile_round_trips_and_bad_files_are_refused),
		cmocka_unit_test(zero_executors_are_refused),
		cmocka_unit_test(every_policy_runs_every_chain_to_the_same_outputs),
		cmocka_unit_test(pinned_model_stays_in_memory),
	};
	int failed;

	t_log_capture();
	failed = cmocka_run_group_tests_name("coe", pure, NULL, NULL);
	failed += cmocka_run_group_tests_name("coe files", files, gen_tiny, cleanup);
	return failed;
}
