// SPDX-License-Identifier: MIT
/* moepager bench on the tiny trained model and its real traces: every policy and baseline runs. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"

static const char *root(const char *var)
{
	const char *v = getenv(var);

	if (!v)
		fail_msg("%s is not set (meson test sets it)", var);
	return v;
}

/* Runs cmd, returns its stdout parsed as JSON (NULL on failure). */
static json_t *run_json(const char *cmd)
{
	json_error_t jerr;
	json_t *j;
	FILE *f = popen(cmd, "r");

	assert_non_null(f);
	j = json_loadf(f, 0, &jerr);
	assert_int_equal(pclose(f), 0);
	if (!j)
		fail_msg("bench output is not JSON: %s", jerr.text);
	return j;
}

static off_t file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) ? -1 : st.st_size;
}

/*
 * A prefetch policy's row says what its policy cost: in all, per token, and
 * (measured runs) as a share of decode time; finemoe searches, so it costs
 * something. Baselines have no policy.
 */
static void check_policy_cost(json_t *row, bool policy, bool measured)
{
	const char *pol = json_string_value(json_object_get(row, "policy"));
	json_t *ms = json_object_get(row, "prefetch_policy_ms");
	json_t *per = json_object_get(row, "prefetch_policy_ms_per_token");
	json_t *share = json_object_get(row, "prefetch_policy_share");
	json_int_t tokens = json_integer_value(json_object_get(row, "tokens"));

	if (!policy) {
		assert_null(ms);
		assert_null(per);
		assert_null(share);
		return;
	}
	assert_true(json_is_real(ms) && json_is_real(per));
	/* Both printed to 6 significant digits. */
	assert_float_equal(json_real_value(per), json_real_value(ms) / (double)tokens,
			   1e-5 * json_real_value(per));
	if (!strcmp(pol, "finemoe"))
		assert_true(json_real_value(per) > 0);
	assert_int_equal(json_is_real(share), measured);
	if (measured)
		assert_true(json_real_value(share) >= 0 && json_real_value(share) < 1);
}

static void bench_runs_every_policy_and_baseline(void **state)
{
	char cmd[4096], model[1024], trace[1024];
	const char *policies;
	json_t *j, *res, *row;
	bool root_user = geteuid() == 0;
	size_t i;

	(void)state;
	snprintf(model, sizeof(model), "%s/data/models/tiny-real.mpk",
		 root("MOEPAGER_BUILD_ROOT"));
	snprintf(trace, sizeof(trace), "%s/data/traces/tiny-real/heldout-windows.csv",
		 root("MOEPAGER_SOURCE_ROOT"));
	if (!root_user && t_require_all())
		fail_msg("the mmap baseline needs root (a memory cgroup) and CI requires it");
	/* Without root there is no memory cgroup for the mmap baseline: run the others. */
	policies = root_user ? "none,finemoe,oracle,pread-lru,mmap" :
			       "none,finemoe,oracle,pread-lru";
	snprintf(cmd, sizeof(cmd), "%s/tools/moepager bench --model %s --trace %s --budget 50%% "
		 "--policies %s --max-tokens 4 --threads 1 --fill-threads 3 --repeat 2 --json --csv %s "
		 "--plot %s",
		 root("MOEPAGER_BUILD_ROOT"), model, trace, policies, t_path("out.csv"),
		 t_path("plots"));
	j = run_json(cmd);
	res = json_object_get(j, "results");
	assert_true(json_is_array(res));
	assert_int_equal(json_array_size(res), root_user ? 5 : 4);
	json_array_foreach(res, i, row) {
		const char *pol = json_string_value(json_object_get(row, "policy"));
		double hit = json_real_value(json_object_get(row, "hit_rate"));
		json_t *order = json_object_get(row, "runs_order");
		size_t n = json_array_size(res);

		assert_non_null(pol);
		/* Two rounds over the policies, the second starting at the second policy. */
		assert_int_equal(json_integer_value(json_array_get(order, 0)), i);
		assert_int_equal(json_integer_value(json_array_get(order, 1)), n + (i + n - 1) % n);
		assert_non_null(json_object_get(row, "evict"));
		assert_string_equal(json_string_value(json_object_get(row, "budget")), "50%");
		assert_true(json_real_value(json_object_get(row, "decode_tokens_per_s")) > 0);
		assert_true(hit >= 0 && hit <= 1);
		/* Two evaluated requests of the windows trace, 4 tokens each. */
		assert_int_equal(json_integer_value(json_object_get(row, "tokens")), 8);
		assert_int_equal(json_integer_value(json_object_get(row, "expert_uses")),
				 8 * 6 * 2);
		assert_true(json_integer_value(json_object_get(row, "peak_rss_bytes")) > 0);
		assert_non_null(json_object_get(row, "stall_ms_per_token"));
		assert_non_null(json_object_get(row, "prefetch_accuracy"));
		assert_non_null(json_object_get(row, "prefetch_waste"));
		if (!strcmp(pol, "none") || !strcmp(pol, "pread-lru"))
			assert_true(json_integer_value(json_object_get(row, "bytes_read")) > 0);
		if (!strcmp(pol, "oracle"))
			assert_string_equal(json_string_value(json_object_get(row, "evict")),
					    "belady");
		/* The trace has its token ids: the prefetcher gets their embeddings. */
		assert_int_equal(json_is_true(json_object_get(row, "semantic")),
				 strcmp(pol, "pread-lru") && strcmp(pol, "mmap"));
		check_policy_cost(row, strcmp(pol, "pread-lru") && strcmp(pol, "mmap"), true);
		/* --fill-threads 3 reached the pager (its own count); the baselines have none. */
		if (strcmp(pol, "pread-lru") && strcmp(pol, "mmap")) {
			assert_int_equal(json_integer_value(json_object_get(row, "fill_threads")),
					 3);
			assert_true(json_is_real(json_object_get(row, "fill_cpu_ms_per_token")));
		} else {
			assert_null(json_object_get(row, "fill_threads"));
			assert_null(json_object_get(row, "fresh_bytes"));
		}
		/* The pager starts empty: its first fills zero new chunks while measured. */
		if (!strcmp(pol, "none"))
			assert_true(json_integer_value(json_object_get(row, "fresh_bytes")) > 0);
	}
	json_decref(j);
	assert_true(file_size(t_path("out.csv")) > 100);
	assert_true(file_size(t_path("plots/throughput.svg")) > 1000);
	assert_true(file_size(t_path("plots/hit_rate.png")) > 1000);
	assert_true(file_size(t_path("plots/heatmap.png")) > 1000);
}

static void simulated_bench_needs_no_model(void **state)
{
	char cmd[4096];
	json_t *j, *res, *row;
	size_t i;

	(void)state;
	snprintf(cmd, sizeof(cmd), "%s/tools/moepager bench --simulate --trace "
		 "%s/data/traces/mixtral-8x7b/gsm8k.csv --budget 25%%,50%% "
		 "--policies none:lru,finemoe,oracle --json", root("MOEPAGER_BUILD_ROOT"),
		 root("MOEPAGER_SOURCE_ROOT"));
	j = run_json(cmd);
	res = json_object_get(j, "results");
	assert_int_equal(json_array_size(res), 6);
	json_array_foreach(res, i, row) {
		assert_string_equal(json_string_value(json_object_get(row, "mode")), "simulated");
		/* gsm8k's evaluated request 1 has 78 tokens of 32 layers, top-2. */
		assert_int_equal(json_integer_value(json_object_get(row, "expert_uses")),
				 78 * 32 * 2);
		check_policy_cost(row, true, false);
	}
	json_decref(j);
}

/* finemoe's hit rate on the trained model's trace, simulated with or without semantic vectors. */
static double semantic_hit_rate(bool semantic)
{
	char cmd[4096];
	json_t *j, *row;
	double hit;

	snprintf(cmd, sizeof(cmd), "%s/tools/moepager bench --simulate --model "
		 "%s/data/models/tiny-real.mpk --trace %s/data/traces/tiny-real/heldout-fortunes.csv "
		 "--budget 50%% --load-cost 2 --policies finemoe %s --json",
		 root("MOEPAGER_BUILD_ROOT"), root("MOEPAGER_BUILD_ROOT"),
		 root("MOEPAGER_SOURCE_ROOT"), semantic ? "" : "--no-semantic");
	j = run_json(cmd);
	row = json_array_get(json_object_get(j, "results"), 0);
	assert_non_null(row);
	assert_int_equal(json_is_true(json_object_get(row, "semantic")), semantic);
	hit = json_real_value(json_object_get(row, "hit_rate"));
	json_decref(j);
	return hit;
}

/*
 * The trained model routes its first layers much by token: the tokens'
 * embeddings predict them where the previous iteration's map cannot.
 */
static void semantic_vectors_raise_finemoes_hit_rate(void **state)
{
	double with = semantic_hit_rate(true), without = semantic_hit_rate(false);

	(void)state;
	print_message("finemoe hit rate: %.3f with semantic vectors, %.3f without\n", with,
		      without);
	assert_true(with > without + 0.01);
}

/*
 * nextlayer's and none's rows of a simulated run on the trained model's
 * windows trace; extra: more options and redirections.
 */
static void nextlayer_against_none(bool model, const char *extra, json_t **j, json_t **none,
				   json_t **next)
{
	char cmd[4096];

	snprintf(cmd, sizeof(cmd), "%s/tools/moepager bench --simulate %s%s%s --trace "
		 "%s/data/traces/tiny-real/heldout-windows.csv --budget 50%% --load-cost 2 "
		 "--policies none,nextlayer --threads 1 --json %s", root("MOEPAGER_BUILD_ROOT"),
		 model ? "--model " : "", model ? root("MOEPAGER_BUILD_ROOT") : "",
		 model ? "/data/models/tiny-real.mpk" : "", root("MOEPAGER_SOURCE_ROOT"), extra);
	*j = run_json(cmd);
	*none = json_array_get(json_object_get(*j, "results"), 0);
	*next = json_array_get(json_object_get(*j, "results"), 1);
	assert_non_null(*none);
	assert_non_null(*next);
}

/*
 * With the model, the simulator gives nextlayer the speculative gates the
 * model computes on the trace's tokens: its reads are mostly right and it
 * hits more than on-demand LRU. Without the model it has nothing to go on.
 */
static void simulated_nextlayer_speculates_with_the_model(void **state)
{
	json_t *j, *none, *next;

	(void)state;
	nextlayer_against_none(true, "", &j, &none, &next);
	print_message("nextlayer hit %.3f (accuracy %.3f), none %.3f\n",
		      json_real_value(json_object_get(next, "hit_rate")),
		      json_real_value(json_object_get(next, "prefetch_accuracy")),
		      json_real_value(json_object_get(none, "hit_rate")));
	assert_true(json_real_value(json_object_get(next, "prefetch_accuracy")) > 0.5);
	assert_true(json_real_value(json_object_get(next, "hit_rate")) >
		    json_real_value(json_object_get(none, "hit_rate")) + 0.05);
	json_decref(j);
	nextlayer_against_none(false, "", &j, &none, &next);
	assert_float_equal(json_real_value(json_object_get(next, "hit_rate")),
			   json_real_value(json_object_get(none, "hit_rate")), 0);
	assert_float_equal(json_real_value(json_object_get(next, "prefetch_accuracy")), 0, 0);
	json_decref(j);
}

/* The whole file at path as a string (free() it). */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf = calloc(1, 65536);

	assert_non_null(f);
	assert_non_null(buf);
	assert_true(fread(buf, 1, 65535, f) < 65535);
	fclose(f);
	return buf;
}

/*
 * --simulate keeps the layer inputs of speculative gates up to --gates-memory:
 * past it (0 here) each run computes them again, says so once, and gives
 * nextlayer the same gates, so the same rows.
 */
static void gates_past_the_memory_limit_are_computed_again(void **state)
{
	const char *const fields[] = { "hit_rate", "prefetch_accuracy", "prefetch_waste",
				       "decode_tokens_per_s" };
	char extra[1024], *err;
	json_t *j, *none, *next, *j0, *none0, *next0;

	(void)state;
	snprintf(extra, sizeof(extra), "--repeat 2 2>%s", t_path("gates.err"));
	nextlayer_against_none(true, extra, &j, &none, &next);
	err = slurp(t_path("gates.err"));
	assert_null(strstr(err, "computed again"));
	free(err);
	snprintf(extra, sizeof(extra), "--repeat 2 --gates-memory 0 2>%s", t_path("gates.err"));
	nextlayer_against_none(true, extra, &j0, &none0, &next0);
	err = slurp(t_path("gates.err"));
	assert_non_null(strstr(err, "past --gates-memory (0.0 of 0.0 MB held): computed again"));
	/* Said once, though both runs of nextlayer computed every request again. */
	assert_null(strstr(strstr(err, "computed again") + 1, "computed again"));
	free(err);
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
		assert_float_equal(json_real_value(json_object_get(next, fields[i])),
				   json_real_value(json_object_get(next0, fields[i])), 0);
	assert_true(json_real_value(json_object_get(next, "prefetch_accuracy")) > 0.5);
	json_decref(j);
	json_decref(j0);
}

/* The JSON's top-level speculative_gate_tokens and nextlayer's evaluated tokens. */
static void gate_tokens(const char *extra, json_int_t *ran, json_int_t *tokens)
{
	json_t *j, *none, *next;

	nextlayer_against_none(true, extra, &j, &none, &next);
	*ran = json_integer_value(json_object_get(j, "speculative_gate_tokens"));
	*tokens = json_integer_value(json_object_get(next, "tokens"));
	json_decref(j);
}

/*
 * The model runs a request's tokens for speculative gates only as far as
 * the simulator evaluates it: with --max-tokens 2 two a request (session
 * 34: every token of it), and each run again past --gates-memory.
 */
static void simulated_gates_run_only_the_evaluated_tokens(void **state)
{
	json_int_t all, all_tokens, ran, tokens;

	(void)state;
	gate_tokens("", &all, &all_tokens);
	assert_int_equal(all, all_tokens);
	gate_tokens("--max-tokens 2", &ran, &tokens);
	assert_true(tokens > 0 && tokens < all_tokens);
	assert_int_equal(ran, tokens);
	gate_tokens("--max-tokens 2 --repeat 2 --gates-memory 0 2>/dev/null", &ran, &tokens);
	assert_int_equal(ran, 2 * tokens);
}

/*
 * --repeat N runs in N rounds over the policies, round r starting at the
 * r-th (the VM host's disk cache favours whichever runs later): each row's
 * runs_order says where its runs ran in the call, and without --json each
 * run's progress line comes in that order. Budgets run one after another.
 */
static void repeats_run_in_rounds_over_the_policies(void **state)
{
	static const char *const pol[] = { "none:lru", "finemoe:finemoe", "oracle:belady" };
	static const char *const budget[] = { "25%", "50%" };
	char cmd[4096], line[512], want[512];
	json_t *j, *res, *row;
	FILE *f;
	size_t i;
	uint32_t n = 0;

	(void)state;
	snprintf(cmd, sizeof(cmd), "%s/tools/moepager bench --simulate --trace "
		 "%s/data/traces/mixtral-8x7b/gsm8k.csv --budget 25%%,50%% "
		 "--policies none:lru,finemoe,oracle --repeat 3", root("MOEPAGER_BUILD_ROOT"),
		 root("MOEPAGER_SOURCE_ROOT"));
	j = run_json(strcat(cmd, " --json"));
	res = json_object_get(j, "results");
	assert_int_equal(json_array_size(res), 6);
	json_array_foreach(res, i, row) {
		json_t *order = json_object_get(row, "runs_order");
		uint32_t b = (uint32_t)i / 3, p = (uint32_t)i % 3;

		assert_int_equal(json_array_size(order), 3);
		assert_int_equal(json_array_size(json_object_get(row, "decode_tokens_per_s_runs")),
				 3);
		/* Budget b's runs follow the earlier budgets'; round r starts at policy r. */
		for (uint32_t r = 0; r < 3; r++)
			assert_int_equal(json_integer_value(json_array_get(order, r)),
					 b * 9 + r * 3 + (p + 3 - r) % 3);
	}
	json_decref(j);

	cmd[strlen(cmd) - strlen(" --json")] = '\0';
	strcat(cmd, " 2>&1 >/dev/null");
	f = popen(cmd, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		uint32_t b = n / 9, r = n % 9 / 3, p = (r + n % 3) % 3;

		assert_true(n < 18);
		snprintf(want, sizeof(want), "moepager bench: %s budget %s run %u/3: ", pol[p],
			 budget[b], r + 1);
		if (strncmp(line, want, strlen(want)))
			fail_msg("progress line %u: '%s', expected '%s...'", n, line, want);
		n++;
	}
	assert_int_equal(pclose(f), 0);
	assert_int_equal(n, 18);
}

static void bad_arguments_fail_with_a_message(void **state)
{
	char cmd[4096];

	(void)state;
	snprintf(cmd, sizeof(cmd), "%s/tools/moepager bench --simulate --trace "
		 "%s/data/traces/mixtral-8x7b/gsm8k.csv --policies psychic 2>/dev/null",
		 root("MOEPAGER_BUILD_ROOT"), root("MOEPAGER_SOURCE_ROOT"));
	assert_int_not_equal(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s/tools/moepager bench --simulate --trace "
		 "%s/data/traces/mixtral-8x7b/gsm8k.csv --fill-threads 0 2>/dev/null",
		 root("MOEPAGER_BUILD_ROOT"), root("MOEPAGER_SOURCE_ROOT"));
	assert_int_not_equal(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s/tools/moepager bench --simulate --trace /nonexistent.csv "
		 "2>/dev/null", root("MOEPAGER_BUILD_ROOT"));
	assert_int_not_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(bench_runs_every_policy_and_baseline),
		cmocka_unit_test(simulated_bench_needs_no_model),
		cmocka_unit_test(semantic_vectors_raise_finemoes_hit_rate),
		cmocka_unit_test(simulated_nextlayer_speculates_with_the_model),
		cmocka_unit_test(simulated_gates_run_only_the_evaluated_tokens),
		cmocka_unit_test(gates_past_the_memory_limit_are_computed_again),
		cmocka_unit_test(repeats_run_in_rounds_over_the_policies),
		cmocka_unit_test(bad_arguments_fail_with_a_message),
	};
	int ret = cmocka_run_group_tests_name("bench", tests, NULL, NULL);

	t_tmpdir_cleanup();
	return ret;
}
