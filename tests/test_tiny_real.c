// SPDX-License-Identifier: MIT
/* The trained model: C tokenizer = sentencepiece, C runner perplexity and routing = PyTorch. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "helpers.h"

#define MODEL_NAME	"tiny-real"
#define MAX_IDS		4096
/* Rows where the k-th and (k+1)-th gate probabilities are this close may route either way. */
#define NEAR_TIE	1e-4f

static const char *src_path(const char *rel)
{
	static char path[4][1024];
	static int slot;
	const char *root = getenv("MOEPAGER_SOURCE_ROOT");
	char *p = path[slot++ % 4];

	if (!root)
		fail_msg("MOEPAGER_SOURCE_ROOT is not set (meson test sets it)");
	snprintf(p, sizeof(path[0]), "%s/%s", root, rel);
	return p;
}

/* The build unpacks the model (data/models/meson.build) and copies its tokenizer beside it. */
static const char *build_path(const char *rel)
{
	static char path[2][1024];
	static int slot;
	const char *root = getenv("MOEPAGER_BUILD_ROOT");
	char *p = path[slot++ % 2];

	if (!root)
		fail_msg("MOEPAGER_BUILD_ROOT is not set (meson test sets it)");
	snprintf(p, sizeof(path[0]), "%s/%s", root, rel);
	return p;
}

static struct mp_tokenizer *open_tokenizer(void)
{
	struct mp_tokenizer *t = NULL;

	assert_int_equal(mp_tokenizer_open(build_path("data/models/" MODEL_NAME ".tok"), &t), 0);
	return t;
}

static size_t unhex(const char *s, size_t len, char *out)
{
	for (size_t i = 0; i + 1 < len; i += 2) {
		unsigned v;

		assert_int_equal(sscanf(s + i, "%2x", &v), 1);
		out[i / 2] = (char)v;
	}
	return len / 2;
}

static void tokenizer_matches_sentencepiece_ids(void **state)
{
	FILE *f = fopen(src_path("tests/data/" MODEL_NAME "/tokenizer.tsv"), "r");
	struct mp_tokenizer *t = open_tokenizer();
	static char line[1 << 16], text[1 << 15];
	static uint32_t want[MAX_IDS], got[MAX_IDS];
	unsigned cases = 0, total_ids = 0;

	(void)state;
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		char *tab = strchr(line, '\t'), *p, *end;
		size_t len, nwant = 0;
		int n;

		if (line[0] == '#')
			continue;
		assert_non_null(tab);
		len = unhex(line, tab - line, text);
		for (p = tab + 1;; p = end) {
			unsigned long v = strtoul(p, &end, 10);

			if (end == p)
				break;
			assert_true(nwant < MAX_IDS);
			want[nwant++] = (uint32_t)v;
		}
		n = mp_tokenizer_encode(t, text, len, got, MAX_IDS);
		assert_int_equal(n, nwant);
		for (size_t i = 0; i < nwant; i++) {
			if (got[i] != want[i])
				fail_msg("case %u: id %zu is %u, sentencepiece gives %u", cases, i,
					 got[i], want[i]);
		}
		/* Held-out text round-trips: decode(encode(text)) == text for valid UTF-8. */
		if (n && !memchr(text, '\xff', len)) {
			static char back[1 << 15];
			int m = mp_tokenizer_decode(t, got, n, back, sizeof(back));

			assert_true(m >= 0);
			if (m == (int)len)
				assert_memory_equal(back, text, len);
		}
		cases++;
		total_ids += n;
	}
	fclose(f);
	/* The fixture holds 200 held-out fortunes and the edge cases. */
	assert_true(cases >= 200);
	assert_true(total_ids > 5000);
	mp_tokenizer_close(t);
}

static void tokenizer_encode_reports_needed_length(void **state)
{
	struct mp_tokenizer *t = open_tokenizer();
	const char *s = "A fool and his money are soon parted.";
	uint32_t ids[64], few[3];
	int n, m;

	(void)state;
	n = mp_tokenizer_encode(t, s, strlen(s), ids, 64);
	assert_true(n > 3);
	m = mp_tokenizer_encode(t, s, strlen(s), few, 3);
	assert_int_equal(m, n);
	assert_memory_equal(few, ids, sizeof(few));
	assert_int_equal(mp_tokenizer_encode(t, "", 0, ids, 64), 0);
	mp_tokenizer_close(t);
}

static void tokenizer_decode_drops_controls_and_dummy_space(void **state)
{
	struct mp_tokenizer *t = open_tokenizer();
	const char *s = "Hello world";
	uint32_t ids[66];
	char buf[64];
	int n;

	(void)state;
	ids[0] = mp_tokenizer_bos(t);
	n = mp_tokenizer_encode(t, s, strlen(s), ids + 1, 64);
	assert_true(n > 0);
	ids[n + 1] = mp_tokenizer_eos(t);
	assert_int_equal(mp_tokenizer_decode(t, ids, n + 2, buf, sizeof(buf)), strlen(s));
	assert_string_equal(buf, s);
	/* Truncation still terminates the buffer and reports the full length. */
	assert_int_equal(mp_tokenizer_decode(t, ids, n + 2, buf, 6), strlen(s));
	assert_string_equal(buf, "Hello");
	t_log_capture();
	ids[0] = mp_tokenizer_vocab(t);
	assert_int_equal(mp_tokenizer_decode(t, ids, 1, buf, sizeof(buf)), -EINVAL);
	assert_true(t_log_contains("outside the vocabulary"));
	mp_tokenizer_close(t);
}

static void write_file(const char *path, const char *s)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(s, f);
	fclose(f);
}

static void tokenizer_rejects_bad_files_naming_the_line(void **state)
{
	struct mp_tokenizer *t = NULL;
	const char *p = t_path("v.tok");

	(void)state;
	t_log_capture();
	assert_int_equal(mp_tokenizer_open(t_path("missing.tok"), &t), -ENOENT);
	assert_true(t_log_contains("cannot open"));
	write_file(p, "# moe-trace v1\n");
	assert_int_equal(mp_tokenizer_open(p, &t), -EPROTO);
	assert_true(t_log_contains("v.tok:1: not a moepager-spm-unigram v1"));
	write_file(p, "# moepager-spm-unigram v1\n# pieces=2 unk=0 bos=1 eos=1\n"
		      "0 unknown 0.0 3c756e6b3e\n1 control 0.0 zz\n");
	assert_int_equal(mp_tokenizer_open(p, &t), -EINVAL);
	assert_true(t_log_contains("v.tok:4: malformed piece 1"));
	/* Byte fallback needs all 256 byte pieces. */
	write_file(p, "# moepager-spm-unigram v1\n# pieces=2 unk=0 bos=1 eos=1\n"
		      "0 unknown 0.0 3c756e6b3e\n1 control 0.0 3c733e\n");
	assert_int_equal(mp_tokenizer_open(p, &t), -EINVAL);
	assert_true(t_log_contains("no byte piece <0x00>"));
	assert_null(t);
	t_tmpdir_cleanup();
}

struct model {
	struct mp_store *store;
	struct mp_engine *engine;
	struct mp_resident *resident;
	struct mp_runner *runner;
};

/* Records the routing the runner reports for each (position, layer). */
struct route_log {
	struct mp_resident *resident;
	uint32_t layers, k;
	uint32_t ids[MAX_IDS][8][4];
	uint32_t max_pos;
};

static const void *log_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	struct route_log *rl = ctx;

	return mp_resident_source_ops()->expert(rl->resident, layer, expert);
}

static int log_route(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		     const uint32_t *ids, const float *weights, uint32_t k)
{
	struct route_log *rl = ctx;

	(void)request;
	(void)weights;
	if (token >= MAX_IDS || layer >= 8 || k > 4)
		return -ERANGE;
	memcpy(rl->ids[token][layer], ids, k * sizeof(*ids));
	if (token + 1 > rl->max_pos)
		rl->max_pos = token + 1;
	return 0;
}

static const struct mp_expert_source_ops log_ops = {
	.expert = log_expert,
	.route = log_route,
};

static void open_model(struct model *m, uint32_t max_seq, const struct mp_expert_source_ops *ops,
		       struct route_log *rl)
{
	struct mp_engine_config ecfg = { .threads = 2 };
	struct mp_runner_config rcfg = { 0 };

	memset(m, 0, sizeof(*m));
	assert_int_equal(mp_store_open(build_path("data/models/" MODEL_NAME ".mpk"), &m->store), 0);
	assert_int_equal(mp_engine_open("ref", &ecfg, &m->engine), 0);
	assert_int_equal(mp_resident_open(m->store, NULL, NULL, &m->resident), 0);
	rcfg.engine = m->engine;
	rcfg.source = ops ? ops : mp_resident_source_ops();
	rcfg.source_ctx = ops ? (void *)rl : (void *)m->resident;
	if (rl)
		rl->resident = m->resident;
	rcfg.max_seq = max_seq;
	assert_int_equal(mp_runner_open(m->store, &rcfg, &m->runner), 0);
}

static void close_model(struct model *m)
{
	mp_runner_close(m->runner);
	mp_resident_close(m->resident);
	mp_engine_close(m->engine);
	mp_store_close(m->store);
}

static void runner_perplexity_matches_pytorch_within_1pct(void **state)
{
	json_error_t jerr;
	json_t *fx = json_load_file(src_path("tests/data/" MODEL_NAME "/ppl-slice.json"), 0, &jerr);
	const struct mp_geometry *g;
	struct mp_eval_result res;
	struct model m;
	uint32_t *ids, window;
	size_t n;
	double torch_ppl, c_ppl;

	(void)state;
	if (!fx)
		fail_msg("ppl-slice.json: %s", jerr.text);
	window = json_integer_value(json_object_get(fx, "window"));
	torch_ppl = json_real_value(json_object_get(fx, "torch_perplexity"));
	n = json_array_size(json_object_get(fx, "ids"));
	assert_true(window >= 2 && n >= window && torch_ppl > 1.0);
	ids = calloc(n, sizeof(*ids));
	assert_non_null(ids);
	for (size_t i = 0; i < n; i++)
		ids[i] = json_integer_value(json_array_get(json_object_get(fx, "ids"), i));

	open_model(&m, window, NULL, NULL);
	g = mp_store_geometry(m.store);
	assert_int_equal(mp_eval_nll(m.runner, g->vocab, ids, n, window, 0, &res), 0);
	assert_int_equal(res.predicted, json_integer_value(json_object_get(fx, "predicted")));
	c_ppl = exp(res.nll / res.predicted);
	if (fabs(c_ppl / torch_ppl - 1.0) >= 0.01)
		fail_msg("C runner perplexity %.4f vs PyTorch %.4f", c_ppl, torch_ppl);
	/* A trained model, not a random one: far below the uniform perplexity (the vocabulary). */
	assert_true(c_ppl < g->vocab / 20.0);
	close_model(&m);
	free(ids);
	json_decref(fx);
}

static bool near_tie(const float *p, uint32_t experts, uint32_t k)
{
	float sorted[64];

	memcpy(sorted, p, experts * sizeof(*p));
	for (uint32_t i = 0; i < k + 1 && i < experts; i++)
		for (uint32_t j = i + 1; j < experts; j++)
			if (sorted[j] > sorted[i]) {
				float x = sorted[i];

				sorted[i] = sorted[j];
				sorted[j] = x;
			}
	for (uint32_t i = 0; i < k && i + 1 < experts; i++)
		if (sorted[i] - sorted[i + 1] < NEAR_TIE)
			return true;
	return false;
}

static void trace_routing_is_the_c_runners_routing(void **state)
{
	struct mp_trace *t = NULL;
	static struct route_log rl;
	static uint32_t ids[MAX_IDS];
	uint32_t rows = 0, differ = 0, ties = 0;
	struct model m;

	(void)state;
	assert_int_equal(mp_trace_open(src_path("data/traces/" MODEL_NAME "/heldout-fortunes.csv"),
				       &t), 0);
	open_model(&m, 256, &log_ops, &rl);
	assert_int_equal(mp_trace_check_geometry(t, mp_store_geometry(m.store)), 0);
	assert_int_equal(mp_trace_experts(t), 16);
	for (uint32_t r = 0; r < 8 && r < mp_trace_requests(t); r++) {
		uint32_t n = mp_trace_tokens(t, r);

		assert_true(n <= MAX_IDS);
		assert_int_equal(mp_trace_token_ids(t, r, ids), 0);
		mp_runner_reset(m.runner);
		memset(&rl.ids, 0xff, sizeof(rl.ids));
		for (uint32_t i = 0; i < n; i++)
			assert_int_equal(mp_runner_step(m.runner, ids[i]), 0);
		for (uint32_t tok = 0; tok < n; tok++) {
			for (uint32_t l = 0; l < mp_trace_layers(t); l++) {
				const uint32_t *tid;
				const float *tw, *p;
				bool same = true;

				assert_int_equal(mp_trace_route(t, r, tok, l, &tid, &tw), 0);
				p = mp_trace_probs(t, r, tok, l);
				assert_non_null(p);
				for (uint32_t i = 0; i < mp_trace_topk(t); i++)
					same &= rl.ids[tok][l][i] == tid[i];
				rows++;
				if (same)
					continue;
				differ++;
				ties += near_tie(p, mp_trace_experts(t), mp_trace_topk(t));
			}
		}
	}
	/* Both sides compute the same function: only a near-tie may flip an expert. */
	if (differ != ties)
		fail_msg("%u of %u rows route differently, %u of them near ties", differ, rows,
			 ties);
	assert_true(rows > 1000);
	close_model(&m);
	mp_trace_close(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(tokenizer_matches_sentencepiece_ids),
		cmocka_unit_test(tokenizer_encode_reports_needed_length),
		cmocka_unit_test(tokenizer_decode_drops_controls_and_dummy_space),
		cmocka_unit_test(tokenizer_rejects_bad_files_naming_the_line),
		cmocka_unit_test(runner_perplexity_matches_pytorch_within_1pct),
		cmocka_unit_test(trace_routing_is_the_c_runners_routing),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
