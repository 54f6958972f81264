// SPDX-License-Identifier: MIT
/*
 * Description: the ABI's growing structs: config and stats structs keep their
 * size and end in reserved words; a non-zero reserved word in a config is
 * refused by the call that takes it; stats calls zero theirs.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <moepager/sim.h>

#include "helpers.h"

/* The reserved words end the struct: a field added later takes one of them. */
#define ENDS_IN_RESERVED(type) \
	(offsetof(struct type, reserved) + sizeof(((struct type *)0)->reserved) == \
	 sizeof(struct type))

#define ALL_ONES(a) memset((a), 0xff, sizeof(a))
#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static void structs_end_in_reserved_words(void **state)
{
	(void)state;
	assert_true(ENDS_IN_RESERVED(mp_pager_config));
	assert_true(ENDS_IN_RESERVED(mp_pager_stats));
	assert_true(ENDS_IN_RESERVED(mp_prefetcher_config));
	assert_true(ENDS_IN_RESERVED(mp_prefetcher_stats));
	assert_true(ENDS_IN_RESERVED(mp_runner_config));
	assert_true(ENDS_IN_RESERVED(mp_runner_stats));
	assert_true(ENDS_IN_RESERVED(mp_seq_config));
	assert_true(ENDS_IN_RESERVED(mp_engine_config));
	assert_true(ENDS_IN_RESERVED(mp_traj_opts));
	assert_true(ENDS_IN_RESERVED(mp_traj_stats));
	assert_true(ENDS_IN_RESERVED(mp_sim_config));
	assert_true(ENDS_IN_RESERVED(mp_sim_result));
	assert_true(ENDS_IN_RESERVED(mp_import_config));
	assert_true(ENDS_IN_RESERVED(mp_expert_source_ops));
	assert_true(ENDS_IN_RESERVED(mp_row_ops));
	assert_true(ENDS_IN_RESERVED(mp_export_config));
	assert_true(ENDS_IN_RESERVED(mp_image_config));
	assert_true(ENDS_IN_RESERVED(mp_image_stats));
}

/*
 * The sizes released binaries were built with (LP64). A change here breaks
 * them: add fields by taking reserved words, never by growing a struct.
 */
static void struct_sizes_are_those_released(void **state)
{
	(void)state;
	if (sizeof(void *) != 8 || sizeof(long) != 8)
		skip();
	assert_int_equal(sizeof(struct mp_pager_config), 152);
	assert_int_equal(sizeof(struct mp_pager_stats), 568);
	assert_int_equal(sizeof(struct mp_prefetcher_config), 128);
	assert_int_equal(sizeof(struct mp_prefetcher_stats), 144);
	assert_int_equal(sizeof(struct mp_runner_config), 112);
	assert_int_equal(sizeof(struct mp_expert_source_ops), 128);
	assert_int_equal(sizeof(struct mp_row_ops), 80);
	assert_int_equal(sizeof(struct mp_runner_stats), 112);
	assert_int_equal(sizeof(struct mp_runner_layer_times), 1088);
	assert_int_equal(sizeof(struct mp_seq_config), 72);
	assert_int_equal(sizeof(struct mp_engine_config), 48);
	assert_int_equal(sizeof(struct mp_traj_opts), 136);
	assert_int_equal(sizeof(struct mp_traj_stats), 96);
	assert_int_equal(sizeof(struct mp_sim_config), 168);
	assert_int_equal(sizeof(struct mp_sim_result), 160);
	assert_int_equal(sizeof(struct mp_import_config), 64);
	assert_int_equal(sizeof(struct mp_export_config), 88);
	assert_int_equal(sizeof(struct mp_image_config), 88);
	assert_int_equal(sizeof(struct mp_image_stats), 160);
}

struct fixture {
	struct mp_store *store;
	struct mp_engine *engine;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	t_log_capture();
	if (!f || t_gen_tiny(t_path("tiny.mpk"), MP_DTYPE_F32, 3) ||
	    mp_store_open(t_path("tiny.mpk"), &f->store) ||
	    mp_engine_open("ref", &(struct mp_engine_config){ .threads = 1 }, &f->engine))
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	mp_engine_close(f->engine);
	mp_store_close(f->store);
	free(f);
	t_tmpdir_cleanup();
	return 0;
}

static void expect_refused(int ret, const char *what)
{
	assert_int_equal(ret, -EINVAL);
	assert_true(t_log_contains(what));
	assert_true(t_log_contains("reserved word 5 is not zero"));
	t_log_reset();
}

static void nonzero_reserved_config_words_are_refused(void **state)
{
	struct fixture *f = *state;
	struct mp_pager_config pc = { .budget = "100%" };
	struct mp_runner_config rc = { .engine = f->engine, .source = mp_resident_source_ops() };
	struct mp_engine_config ec = { .threads = 1 };
	struct mp_traj_opts to = { .source = MP_TRAJ_SRC_INPROC };
	struct mp_pager *p = NULL;
	struct mp_runner *r = NULL;
	struct mp_engine *e = NULL;
	struct mp_traj *t = NULL;

	pc.reserved[5] = 1;
	expect_refused(mp_pager_open(f->store, &pc, &p), "pager config");
	assert_null(p);
	rc.reserved[5] = 1;
	expect_refused(mp_runner_open(f->store, &rc, &r), "runner config");
	assert_null(r);
	rc.reserved[5] = 0;
	assert_int_equal(mp_runner_open(f->store, &rc, &r), 0);
	{
		struct mp_seq_config sc = { .request = 1 };
		struct mp_seq *s = NULL;

		sc.reserved[3] = 1;
		assert_int_equal(mp_seq_open(r, &sc, &s), -EINVAL);
		assert_true(t_log_contains("sequence config: reserved word 3"));
		t_log_reset();
		assert_null(s);
	}
	mp_runner_close(r);
	ec.reserved[1] = 7;
	assert_int_equal(mp_engine_open("ref", &ec, &e), -EINVAL);
	assert_true(t_log_contains("engine config: reserved word 1"));
	t_log_reset();
	to.reserved[5] = 1;
	expect_refused(mp_traj_open(&to, &t), "trajectory options");
	assert_null(t);
	{
		struct mp_image_config ic = { .path = t_path("x.gguf") };
		struct mp_image *img = NULL;

		ic.reserved[5] = 1;
		expect_refused(mp_image_open(&ic, &img), "image config");
		assert_null(img);
	}
}

static void noop(void)
{
}

/* An ops table built for a newer library (an op this one does not know) is refused. */
static void ops_with_a_reserved_slot_set_are_refused(void **state)
{
	struct fixture *f = *state;
	struct mp_expert_source_ops src = *mp_resident_source_ops();
	struct mp_runner_config rc = { .engine = f->engine, .source = &src };
	struct mp_adapters_config ac = { .base = f->store, .source = &src };
	struct mp_row_ops rows = *mp_pager_row_ops();
	struct mp_adapters *set = NULL;
	struct mp_runner *r = NULL;

	src.reserved[6] = noop;
	assert_int_equal(mp_runner_open(f->store, &rc, &r), -EINVAL);
	assert_true(t_log_contains("runner source: reserved op 6 is set"));
	assert_null(r);
	assert_int_equal(mp_adapters_open(&ac, &set), -EINVAL);
	assert_true(t_log_contains("adapters source: reserved op 6"));
	assert_null(set);
	t_log_reset();
	src.reserved[6] = NULL;
	rows.reserved[3] = noop;
	ac.rows = &rows;
	assert_int_equal(mp_adapters_open(&ac, &set), -EINVAL);
	assert_true(t_log_contains("adapters row ops: reserved op 3"));
	assert_null(set);
	t_log_reset();
	assert_int_equal(mp_runner_open(f->store, &rc, &r), 0);
	mp_runner_close(r);
}

static void nonzero_reserved_words_of_import_and_export_are_refused(void **state)
{
	struct fixture *f = *state;
	struct mp_import_config ic = { .dtype = -1 };
	struct mp_export_config xc = { .dtype = -1, .dense_dtype = -1 };

	ic.reserved[3] = 1;
	assert_int_equal(mp_gguf_import(t_path("x.gguf"), t_path("x.mpk"), &ic), -EINVAL);
	assert_true(t_log_contains("import config: reserved word 3 is not zero"));
	assert_int_equal(mp_safetensors_import(t_tmpdir(), t_path("x.mpk"), &ic), -EINVAL);
	t_log_reset();
	xc.reserved[3] = 1;
	assert_int_equal(mp_gguf_export(f->store, t_path("x.gguf"), &xc), -EINVAL);
	assert_true(t_log_contains("export config: reserved word 3 is not zero"));
	t_log_reset();
	assert_int_equal(access(t_path("x.gguf"), F_OK), -1);
}

static void nonzero_reserved_words_of_prefetcher_and_simulator_are_refused(void **state)
{
	struct fixture *f = *state;
	struct mp_prefetcher_config fc = { .policy = "none" };
	struct mp_pager_config pc = { .budget = "100%" };
	struct mp_prefetcher *pf = NULL;
	struct mp_sim_config sc = { .capacity = 4, .prefetch = "none", .evict = "lru" };
	struct mp_sim_result sr;
	struct mp_trace *tr;
	struct mp_pager *p;
	static const char trace[] = "#moe-trace v1\n#layers=1\n#experts=4\n#topk=1\n"
				    "request,token,layer,e0\n0,0,0,1\n0,1,0,2\n1,0,0,3\n";

	assert_int_equal(mp_pager_open(f->store, &pc, &p), 0);
	fc.reserved[5] = 1;
	expect_refused(mp_prefetcher_open(p, &fc, &pf), "prefetcher config");
	assert_null(pf);
	mp_pager_close(p);

	assert_int_equal(mp_trace_parse(trace, sizeof(trace) - 1, "t", &tr), 0);
	sc.trace = tr;
	sc.reserved[5] = 1;
	expect_refused(mp_prefetch_simulate(&sc, &sr), "simulator config");
	sc.reserved[5] = 0;
	ALL_ONES(sr.reserved);
	assert_int_equal(mp_prefetch_simulate(&sc, &sr), 0);
	for (size_t i = 0; i < LEN(sr.reserved); i++)
		assert_int_equal(sr.reserved[i], 0);
	mp_trace_close(tr);
}

static void stats_calls_zero_their_reserved_words(void **state)
{
	struct fixture *f = *state;
	struct mp_pager_config pc = { .budget = "100%" };
	struct mp_prefetcher_config fc = { .policy = "none" };
	struct mp_traj_opts to = { .source = MP_TRAJ_SRC_INPROC };
	struct mp_runner_config rc = { .engine = f->engine };
	struct mp_pager_stats ps;
	struct mp_prefetcher_stats fs;
	struct mp_runner_stats rs;
	struct mp_traj_stats ts;
	struct mp_prefetcher *pf;
	struct mp_runner *r;
	struct mp_traj *t;
	struct mp_pager *p;

	assert_int_equal(mp_pager_open(f->store, &pc, &p), 0);
	assert_int_equal(mp_prefetcher_open(p, &fc, &pf), 0);
	rc.source = mp_prefetcher_source_ops();
	rc.source_ctx = pf;
	assert_int_equal(mp_runner_open(f->store, &rc, &r), 0);
	assert_int_equal(mp_runner_step(r, 1), 0);
	assert_int_equal(mp_traj_open(&to, &t), 0);

	ALL_ONES(ps.reserved);
	ALL_ONES(fs.reserved);
	ALL_ONES(rs.reserved);
	ALL_ONES(ts.reserved);
	mp_pager_stats(p, &ps);
	mp_prefetcher_stats(pf, &fs);
	mp_runner_stats(r, &rs);
	assert_int_equal(mp_traj_stats(t, &ts), 0);
	for (size_t i = 0; i < LEN(ps.reserved); i++)
		assert_int_equal(ps.reserved[i], 0);
	for (size_t i = 0; i < LEN(fs.reserved); i++)
		assert_int_equal(fs.reserved[i], 0);
	for (size_t i = 0; i < LEN(rs.reserved); i++)
		assert_int_equal(rs.reserved[i], 0);
	for (size_t i = 0; i < LEN(ts.reserved); i++)
		assert_int_equal(ts.reserved[i], 0);
	/* The step read the routed experts: the figures around the reserved words are real. */
	assert_true(rs.tokens == 1 && rs.expert_calls > 0);
	assert_true(ps.faults_file > 0);

	mp_traj_close(t);
	mp_runner_close(r);
	mp_prefetcher_close(pf);
	mp_pager_close(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(structs_end_in_reserved_words),
		cmocka_unit_test(struct_sizes_are_those_released),
		cmocka_unit_test_setup_teardown(nonzero_reserved_config_words_are_refused, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			nonzero_reserved_words_of_prefetcher_and_simulator_are_refused, setup,
			teardown),
		cmocka_unit_test_setup_teardown(ops_with_a_reserved_slot_set_are_refused, setup,
						teardown),
		cmocka_unit_test_setup_teardown(nonzero_reserved_words_of_import_and_export_are_refused,
						setup, teardown),
		cmocka_unit_test_setup_teardown(stats_calls_zero_their_reserved_words, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
