// SPDX-License-Identifier: MIT
/* Trace reader: the real Mixtral traces parse row for row; every malformed kind is refused. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

#define MAX_REQUESTS 16
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* What an independent sscanf pass over a shipped trace finds. */
struct file_counts {
	uint32_t requests;
	uint32_t tokens[MAX_REQUESTS];
	uint64_t rows;
};

static const char *trace_path(const char *file)
{
	static char path[1024];
	const char *root = getenv("MOEPAGER_SOURCE_ROOT");

	if (!root)
		fail_msg("MOEPAGER_SOURCE_ROOT is not set (meson test sets it)");
	snprintf(path, sizeof(path), "%s/data/traces/mixtral-8x7b/%s", root, file);
	return path;
}

/*
 * Reads the file with sscanf, checks every row against what the reader
 * returns for that position, and counts requests and tokens.
 */
static void compare_with_file(const struct mp_trace *t, const char *path, struct file_counts *c)
{
	FILE *f = fopen(path, "r");
	char line[256];

	assert_non_null(f);
	memset(c, 0, sizeof(*c));
	while (fgets(line, sizeof(line), f)) {
		unsigned r, tok, l, e0, e1;
		const uint32_t *ids;
		const float *w;
		float w0, w1;

		if (line[0] == '#' || !strncmp(line, "request,", 8))
			continue;
		assert_int_equal(sscanf(line, "%u,%u,%u,%u,%u,%f,%f", &r, &tok, &l, &e0, &e1,
					&w0, &w1), 7);
		assert_true(r < MAX_REQUESTS);
		assert_int_equal(mp_trace_route(t, r, tok, l, &ids, &w), 0);
		assert_int_equal(ids[0], e0);
		assert_int_equal(ids[1], e1);
		assert_non_null(w);
		/* Both sides round the same decimal to the nearest float. */
		assert_true(w[0] == w0 && w[1] == w1);
		if (r + 1 > c->requests)
			c->requests = r + 1;
		if (tok + 1 > c->tokens[r])
			c->tokens[r] = tok + 1;
		c->rows++;
	}
	fclose(f);
}

static void check_route(const struct mp_trace *t, uint32_t r, uint32_t tok, uint32_t l,
			uint32_t e0, uint32_t e1, float w0, float w1)
{
	const uint32_t *ids;
	const float *w;

	assert_int_equal(mp_trace_route(t, r, tok, l, &ids, &w), 0);
	assert_int_equal(ids[0], e0);
	assert_int_equal(ids[1], e1);
	assert_float_equal(w[0], w0, 0.0);
	assert_float_equal(w[1], w1, 0.0);
}

static void check_mixtral_trace(const char *file, const char *name, uint32_t total_tokens,
				struct mp_trace **out)
{
	const char *path = trace_path(file);
	struct file_counts c;
	struct mp_trace *t;
	uint32_t sum = 0;

	assert_int_equal(mp_trace_open(path, &t), 0);
	assert_int_equal(mp_trace_layers(t), 32);
	assert_int_equal(mp_trace_experts(t), 8);
	assert_int_equal(mp_trace_topk(t), 2);
	assert_true(mp_trace_has_weights(t));
	assert_null(mp_trace_probs(t, 0, 0, 0));
	assert_string_equal(mp_trace_meta(t, "name"), name);
	assert_string_equal(mp_trace_meta(t, "model"), "Mixtral-8x7B-Instruct-v0.1-FP8");
	assert_string_equal(mp_trace_meta(t, "requests"), "2");
	assert_null(mp_trace_meta(t, "nosuchkey"));

	compare_with_file(t, path, &c);
	assert_int_equal(mp_trace_requests(t), c.requests);
	for (uint32_t r = 0; r < c.requests; r++) {
		assert_int_equal(mp_trace_tokens(t, r), c.tokens[r]);
		sum += c.tokens[r];
	}
	assert_int_equal(c.rows, (uint64_t)sum * 32);
	/* Totals as data/traces/README.md documents them. */
	assert_int_equal(c.requests, 2);
	assert_int_equal(sum, total_tokens);
	assert_int_equal(mp_trace_tokens(t, c.requests), 0);
	*out = t;
}

static void humaneval_trace_parses_with_counts_from_the_file(void **state)
{
	struct mp_trace *t;

	(void)state;
	check_mixtral_trace("humaneval.csv", "mixtral-humaneval", 333, &t);
	assert_int_equal(mp_trace_tokens(t, 0), 81);
	assert_int_equal(mp_trace_tokens(t, 1), 252);
	/* Lines 9, 10 and the last line of the file. */
	check_route(t, 0, 0, 0, 6, 5, 0.695958f, 0.304042f);
	check_route(t, 0, 0, 1, 6, 2, 0.570810f, 0.429190f);
	check_route(t, 1, 251, 31, 0, 2, 0.531209f, 0.468791f);
	mp_trace_close(t);
}

static void gsm8k_trace_parses_with_counts_from_the_file(void **state)
{
	struct mp_trace *t;

	(void)state;
	check_mixtral_trace("gsm8k.csv", "mixtral-gsm8k", 244, &t);
	assert_int_equal(mp_trace_tokens(t, 0), 166);
	assert_int_equal(mp_trace_tokens(t, 1), 78);
	check_route(t, 0, 0, 0, 7, 0, 0.800380f, 0.199620f);
	check_route(t, 0, 0, 1, 3, 6, 0.857768f, 0.142232f);
	check_route(t, 1, 77, 31, 2, 7, 0.799442f, 0.200558f);
	mp_trace_close(t);
}

static void route_outside_the_trace_is_erange(void **state)
{
	struct mp_trace *t;
	const uint32_t *ids = NULL;

	(void)state;
	assert_int_equal(mp_trace_open(trace_path("gsm8k.csv"), &t), 0);
	assert_int_equal(mp_trace_route(t, 2, 0, 0, &ids, NULL), -ERANGE);
	assert_int_equal(mp_trace_route(t, 1, 78, 0, &ids, NULL), -ERANGE);
	assert_int_equal(mp_trace_route(t, 0, 0, 32, &ids, NULL), -ERANGE);
	assert_non_null(strstr(mp_last_error(), "request 0 token 0 layer 32 is outside"));
	assert_null(ids);
	assert_null(mp_trace_probs(t, 5, 0, 0));
	mp_trace_close(t);
}

static void parse_from_memory_matches_the_file_reader(void **state)
{
	const char *path = trace_path("humaneval.csv");
	struct mp_trace *a, *b;
	FILE *f = fopen(path, "r");
	static char buf[1 << 20];
	size_t len;

	(void)state;
	assert_non_null(f);
	len = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	assert_true(len > 0 && len < sizeof(buf));
	assert_int_equal(mp_trace_parse(buf, len, "mem", &a), 0);
	assert_int_equal(mp_trace_open(path, &b), 0);
	assert_int_equal(mp_trace_requests(a), mp_trace_requests(b));
	for (uint32_t r = 0; r < mp_trace_requests(a); r++) {
		assert_int_equal(mp_trace_tokens(a, r), mp_trace_tokens(b, r));
		for (uint32_t tok = 0; tok < mp_trace_tokens(a, r); tok++) {
			for (uint32_t l = 0; l < 32; l++) {
				const uint32_t *ia, *ib;
				const float *wa, *wb;

				assert_int_equal(mp_trace_route(a, r, tok, l, &ia, &wa), 0);
				assert_int_equal(mp_trace_route(b, r, tok, l, &ib, &wb), 0);
				assert_memory_equal(ia, ib, 2 * sizeof(*ia));
				assert_memory_equal(wa, wb, 2 * sizeof(*wa));
			}
		}
	}
	mp_trace_close(a);
	mp_trace_close(b);
}

static void geometry_check_names_the_mismatch(void **state)
{
	struct mp_geometry g = { .layers = 32, .experts = 8, .topk = 2 };
	struct mp_trace *t;

	(void)state;
	assert_int_equal(mp_trace_open(trace_path("humaneval.csv"), &t), 0);
	assert_int_equal(mp_trace_check_geometry(t, &g), 0);
	g.experts = 64;
	g.topk = 6;
	assert_int_equal(mp_trace_check_geometry(t, &g), -EINVAL);
	assert_non_null(strstr(mp_last_error(), "trace mixtral-humaneval has 32 layers x 8 experts,"
			       " top-2; the model has 32 layers x 64 experts, top-6"));
	mp_trace_close(t);
}

static void ids_only_trace_has_no_weights(void **state)
{
	static const char text[] =
		"# moe-trace v1\n# layers=2\n# experts=4\n# topk=1\n"
		"request,token,layer,e0\n0,0,0,3\n0,0,1,1\n1,0,0,2\n1,0,1,0\n1,1,0,1\n1,1,1,2\n";
	const uint32_t *ids;
	const float *w = (const float *)1;
	struct mp_trace *t;

	(void)state;
	assert_int_equal(mp_trace_parse(text, strlen(text), "ids.csv", &t), 0);
	assert_false(mp_trace_has_weights(t));
	assert_int_equal(mp_trace_requests(t), 2);
	assert_int_equal(mp_trace_tokens(t, 0), 1);
	assert_int_equal(mp_trace_tokens(t, 1), 2);
	assert_int_equal(mp_trace_route(t, 1, 1, 0, &ids, &w), 0);
	assert_int_equal(ids[0], 1);
	assert_null(w);
	/* requests is optional metadata. */
	assert_null(mp_trace_meta(t, "requests"));
	mp_trace_close(t);
}

static void probability_columns_are_exposed(void **state)
{
	static const char text[] =
		"# moe-trace v1\r\n# layers=1\r\n# experts=4\r\n# topk=2\r\n# a comment line\r\n"
		"request,token,layer,e0,e1,w0,w1,p0,p1,p2,p3\r\n"
		"0,0,0,2,0,0.6,0.4,0.3,0.1,0.45,0.15\r\n"
		"0,1,0,1,3,0.5,0.5,0.05,0.45,0.05,0.45";
	struct mp_trace *t;
	const float *p;

	(void)state;
	assert_int_equal(mp_trace_parse(text, strlen(text), "probs.csv", &t), 0);
	assert_int_equal(mp_trace_tokens(t, 0), 2);
	p = mp_trace_probs(t, 0, 0, 0);
	assert_non_null(p);
	assert_float_equal(p[0], 0.3f, 0.0);
	assert_float_equal(p[2], 0.45f, 0.0);
	p = mp_trace_probs(t, 0, 1, 0);
	assert_non_null(p);
	assert_float_equal(p[3], 0.45f, 0.0);
	assert_null(mp_trace_probs(t, 0, 2, 0));
	mp_trace_close(t);
}

/*
 * A trace bigger than the file reader's buffer, so rows straddle read
 * boundaries and the row arrays grow several times.
 */
/* tokens.R: exactly one id per routed token, else a message naming the key. */
static void token_ids_come_from_the_tokens_metadata(void **state)
{
	static const char head[] = "# moe-trace v1\n# layers=1\n# experts=4\n# topk=1\n";
	static const char rows[] = "request,token,layer,e0\n0,0,0,1\n0,1,0,2\n0,2,0,3\n"
				   "1,0,0,0\n";
	static const struct {
		const char *meta;
		int err;
		const char *msg;
	} cases[] = {
		{ "# tokens.0=7 0 4294967295\n# tokens.1= 12 \n", 0, NULL },
		{ "# tokens.1=5\n", -ENOENT, "request 0 has no tokens.0" },
		{ "# tokens.0=7 8\n", -EINVAL, "lists 2 ids for the request's 3 tokens" },
		{ "# tokens.0=7 8 9 10\n", -EINVAL, "lists more ids than the request's 3" },
		{ "# tokens.0=7 -8 9\n", -EINVAL, "'-8 9' is not a token id" },
		{ "# tokens.0=7 8x 9\n", -EINVAL, "is not a token id" },
		{ "# tokens.0=7 8 4294967296\n", -EINVAL, "'4294967296' is not a token id" },
	};
	uint32_t ids[4];

	(void)state;
	t_log_capture();
	for (size_t c = 0; c < ARRAY_SIZE(cases); c++) {
		char buf[512];
		struct mp_trace *t = NULL;
		int len = snprintf(buf, sizeof(buf), "%s%s%s", head, cases[c].meta, rows);

		assert_int_equal(mp_trace_parse(buf, (size_t)len, "ids", &t), 0);
		t_log_reset();
		assert_int_equal(mp_trace_token_ids(t, 0, ids), cases[c].err);
		if (cases[c].msg && !t_log_contains(cases[c].msg))
			fail_msg("case %zu: no message \"%s\"", c, cases[c].msg);
		if (!cases[c].err) {
			assert_int_equal(ids[0], 7);
			assert_int_equal(ids[1], 0);
			assert_int_equal(ids[2], UINT32_MAX);
			assert_int_equal(mp_trace_token_ids(t, 1, ids), 0);
			assert_int_equal(ids[0], 12);
		}
		assert_int_equal(mp_trace_token_ids(t, 2, ids), -EINVAL);
		assert_int_equal(mp_trace_token_ids(t, 0, NULL), -EINVAL);
		mp_trace_close(t);
	}
}

static void large_trace_streams_across_read_boundaries(void **state)
{
	const uint32_t requests = 3, tokens = 12000, layers = 8;
	const char *path = t_path("large.csv");
	struct mp_trace *t;
	FILE *f = fopen(path, "w");

	(void)state;
	assert_non_null(f);
	fprintf(f, "# moe-trace v1\n# layers=%u\n# experts=64\n# topk=6\n# requests=%u\n"
		   "request,token,layer,e0,e1,e2,e3,e4,e5,w0,w1,w2,w3,w4,w5\n", layers, requests);
	for (uint32_t r = 0; r < requests; r++)
		for (uint32_t tok = 0; tok < tokens; tok++)
			for (uint32_t l = 0; l < layers; l++) {
				uint32_t b = (r * 7 + tok * 3 + l) % 58;

				fprintf(f, "%u,%u,%u,%u,%u,%u,%u,%u,%u,0.25,0.25,0.125,0.125,"
					   "0.125,%u.125\n", r, tok, l, b, b + 1, b + 2, b + 3,
					b + 4, b + 5, l % 2);
			}
	assert_int_equal(fclose(f), 0);

	assert_int_equal(mp_trace_open(path, &t), 0);
	assert_int_equal(mp_trace_requests(t), requests);
	for (uint32_t r = 0; r < requests; r++) {
		assert_int_equal(mp_trace_tokens(t, r), tokens);
		for (uint32_t tok = 0; tok < tokens; tok += 997) {
			for (uint32_t l = 0; l < layers; l++) {
				uint32_t b = (r * 7 + tok * 3 + l) % 58;
				const uint32_t *ids;
				const float *w;

				assert_int_equal(mp_trace_route(t, r, tok, l, &ids, &w), 0);
				for (uint32_t i = 0; i < 6; i++)
					assert_int_equal(ids[i], b + i);
				assert_float_equal(w[5], (l % 2) + 0.125f, 0.0);
			}
		}
	}
	mp_trace_close(t);
}

/*
 * Rejections
 */

/* Lines 1-6; rows start on line 7. */
#define HEAD "# moe-trace v1\n# layers=2\n# experts=4\n# topk=2\n# requests=1\n" \
	     "request,token,layer,e0,e1,w0,w1\n"
#define TOKEN0 "0,0,0,1,2,0.75,0.25\n0,0,1,0,3,0.5,0.5\n"

struct bad_case {
	const char *name;
	const char *text;
	int err;
	const char *message;	/* must appear in mp_last_error() */
};

static const struct bad_case bad_cases[] = {
	{ "empty_file_is_refused", "", -EINVAL, "bad.csv:1: empty file" },
	{ "csv_without_magic_line_is_not_a_trace",
	  "request,token,layer,e0,e1\n0,0,0,1,2\n", -EPROTO,
	  "bad.csv:1: not a moe-trace v1 file" },
	{ "binary_data_is_not_a_trace", "\x7f" "ELF\x02\x01\x01", -EPROTO,
	  "bad.csv:1: not a moe-trace v1 file" },
	{ "other_format_version_is_refused", "# moe-trace v2\n# layers=2\n", -EPROTO,
	  "bad.csv:1: moe-trace version 'v2' is not supported" },
	{ "rows_without_header_are_refused",
	  "# moe-trace v1\n# layers=2\n# experts=4\n# topk=2\n" TOKEN0, -EINVAL,
	  "bad.csv:5: missing header" },
	{ "metadata_only_file_lacks_header",
	  "# moe-trace v1\n# layers=2\n# experts=4\n# topk=2\n", -EINVAL,
	  "bad.csv:4: missing header" },
	{ "misnamed_header_column_is_refused",
	  "# moe-trace v1\n# layers=2\n# experts=4\n# topk=2\nrequest,tok,layer,e0,e1\n",
	  -EINVAL, "bad.csv:5: header: column 2 is 'tok', expected 'token'" },
	{ "unknown_header_column_is_refused",
	  "# moe-trace v1\n# layers=2\n# experts=4\n# topk=2\nrequest,token,layer,e0,e1,w0,w1,x\n",
	  -EINVAL, "bad.csv:5: header: unknown column 'x' (column 8)" },
	{ "header_columns_out_of_order_are_refused",
	  "# moe-trace v1\n# layers=2\n# experts=4\n# topk=2\nrequest,token,layer,e0,e2\n",
	  -EINVAL, "bad.csv:5: header: column 5 is 'e2', expected 'e1'" },
	{ "topk_metadata_disagreeing_with_header_is_refused",
	  "# moe-trace v1\n# layers=2\n# experts=4\n# topk=3\nrequest,token,layer,e0,e1\n",
	  -EINVAL,
	  "bad.csv:5: header has 2 expert columns (e0...) but metadata says topk=3 (line 4)" },
	{ "weight_columns_must_match_expert_columns",
	  "# moe-trace v1\n# layers=2\n# experts=4\n# topk=2\nrequest,token,layer,e0,e1,w0\n",
	  -EINVAL, "bad.csv:5: header has 1 weight columns (w0...), expected 2" },
	{ "probability_columns_must_match_experts_metadata",
	  "# moe-trace v1\n# layers=2\n# experts=4\n# topk=2\n"
	  "request,token,layer,e0,e1,p0,p1,p2\n",
	  -EINVAL,
	  "bad.csv:5: header has 3 probability columns (p0...) but metadata says experts=4" },
	{ "missing_experts_metadata_is_refused",
	  "# moe-trace v1\n# layers=2\n# topk=2\nrequest,token,layer,e0,e1\n", -EINVAL,
	  "bad.csv:4: missing metadata 'experts'" },
	{ "non_numeric_metadata_is_refused",
	  "# moe-trace v1\n# layers=thirty-two\n", -EINVAL,
	  "bad.csv:2: metadata layers = 'thirty-two' is not a number" },
	{ "repeated_metadata_key_is_refused",
	  "# moe-trace v1\n# layers=2\n# experts=4\n# layers=2\n", -EINVAL,
	  "bad.csv:4: metadata 'layers' is given twice" },
	{ "topk_above_experts_is_refused",
	  "# moe-trace v1\n# layers=2\n# experts=4\n# topk=5\nrequest,token,layer,e0\n", -EINVAL,
	  "bad.csv:4: metadata topk=5 exceeds experts=4" },
	{ "header_without_rows_is_refused", HEAD, -EINVAL, "bad.csv:6: no rows after the header" },
	{ "short_row_is_refused", HEAD "0,0,0,1,2,0.75\n", -EINVAL,
	  "bad.csv:7: expected 7 columns, found 6" },
	{ "long_row_is_refused", HEAD "0,0,0,1,2,0.75,0.25,0\n", -EINVAL,
	  "bad.csv:7: expected 7 columns, found 8" },
	{ "expert_id_out_of_range_is_refused", HEAD "0,0,0,1,4,0.75,0.25\n", -EINVAL,
	  "bad.csv:7: e1 = 4 is out of range (experts=4, line 3)" },
	{ "non_numeric_expert_id_is_refused", HEAD "0,0,0,-1,2,0.75,0.25\n", -EINVAL,
	  "bad.csv:7: e0 '-1' is not an expert id" },
	{ "repeated_layer_is_refused", HEAD "0,0,0,1,2,0.75,0.25\n0,0,0,1,2,0.75,0.25\n",
	  -EINVAL, "bad.csv:8: request 0 token 0: layer 0 repeated or out of order (expected "
	  "layer 1)" },
	{ "same_expert_twice_in_a_row_is_refused", HEAD "0,0,0,3,3,0.75,0.25\n", -EINVAL,
	  "bad.csv:7: e1 = 3 repeats e0" },
	{ "non_numeric_weight_is_refused", HEAD "0,0,0,1,2,heavy,0.25\n", -EINVAL,
	  "bad.csv:7: w0 'heavy' is not a number" },
	{ "nan_weight_is_refused", HEAD "0,0,0,1,2,nan,0.25\n", -EINVAL,
	  "bad.csv:7: w0 'nan' is not a number" },
	{ "weight_with_trailing_junk_is_refused", HEAD "0,0,0,1,2,0.75x,0.25\n", -EINVAL,
	  "bad.csv:7: w0 '0.75x' is not a number" },
	{ "negative_weight_is_refused", HEAD "0,0,0,1,2,0.75,-0.25\n", -EINVAL,
	  "bad.csv:7: w1 = -0.25 is negative" },
	{ "negative_probability_is_refused",
	  "# moe-trace v1\n# layers=1\n# experts=2\n# topk=1\nrequest,token,layer,e0,p0,p1\n"
	  "0,0,0,1,0.5,-0.5\n", -EINVAL, "bad.csv:6: p1 = -0.5 is negative" },
	{ "non_numeric_request_is_refused", HEAD "r0,0,0,1,2,0.75,0.25\n", -EINVAL,
	  "bad.csv:7: request 'r0' is not a non-negative integer" },
	{ "layer_beyond_layers_metadata_is_refused", HEAD TOKEN0 "0,1,0,1,2,0.5,0.5\n"
	  "0,1,1,1,2,0.5,0.5\n0,1,2,1,2,0.5,0.5\n", -EINVAL,
	  "bad.csv:11: layer 2 is out of range (layers=2, line 2)" },
	{ "missing_first_layer_is_refused", HEAD "0,0,1,0,3,0.5,0.5\n", -EINVAL,
	  "bad.csv:7: request 0 token 0 starts at layer 1: layer 0 is missing" },
	{ "missing_middle_layer_is_refused",
	  "# moe-trace v1\n# layers=3\n# experts=4\n# topk=1\nrequest,token,layer,e0\n"
	  "0,0,0,1\n0,0,2,1\n", -EINVAL,
	  "bad.csv:7: request 0 token 0: layer 1 is missing (found layer 2)" },
	{ "token_with_missing_last_layers_is_refused",
	  "# moe-trace v1\n# layers=4\n# experts=4\n# topk=1\nrequest,token,layer,e0\n"
	  "0,0,0,1\n0,0,1,1\n0,1,0,1\n", -EINVAL,
	  "bad.csv:8: request 0 token 0: layers 2-3 are missing" },
	{ "trace_ending_mid_token_is_refused", HEAD TOKEN0 "0,1,0,1,2,0.5,0.5\n", -EINVAL,
	  "bad.csv:9: request 0 token 1: layer 1 is missing" },
	{ "skipped_token_is_refused", HEAD TOKEN0 "0,2,0,1,2,0.5,0.5\n", -EINVAL,
	  "bad.csv:9: request 0: token 2 follows token 0 (tokens must be consecutive)" },
	{ "token_going_back_is_refused", HEAD TOKEN0 "0,0,0,1,2,0.5,0.5\n", -EINVAL,
	  "bad.csv:9: request 0: token 0 follows token 0" },
	{ "first_token_not_zero_is_refused", HEAD "0,1,0,1,2,0.75,0.25\n", -EINVAL,
	  "bad.csv:7: request 0 starts at token 1, expected token 0" },
	{ "first_request_not_zero_is_refused", HEAD "1,0,0,1,2,0.75,0.25\n", -EINVAL,
	  "bad.csv:7: the first row is request 1, expected request 0" },
	{ "skipped_request_is_refused", HEAD TOKEN0 "2,0,0,1,2,0.5,0.5\n", -EINVAL,
	  "bad.csv:9: request 2 follows request 0 (requests must be consecutive)" },
	{ "request_starting_past_token_zero_is_refused", HEAD TOKEN0 "1,3,0,1,2,0.5,0.5\n",
	  -EINVAL, "bad.csv:9: request 1 starts at token 3, expected token 0" },
	{ "requests_metadata_disagreeing_with_rows_is_refused",
	  HEAD TOKEN0 "1,0,0,1,2,0.5,0.5\n1,0,1,1,2,0.5,0.5\n", -EINVAL,
	  "bad.csv:5: metadata says requests=1 but the rows hold 2 requests" },
	{ "empty_line_between_rows_is_refused", HEAD TOKEN0 "\n0,1,0,1,2,0.5,0.5\n", -EINVAL,
	  "bad.csv:9: empty line" },
	{ "empty_line_before_header_is_refused",
	  "# moe-trace v1\n# layers=2\n# experts=4\n# topk=2\n\nrequest,token,layer,e0,e1\n",
	  -EINVAL, "bad.csv:5: empty line where the header should be" },
	{ "metadata_after_header_is_refused", HEAD TOKEN0 "# layers=3\n", -EINVAL,
	  "bad.csv:9: metadata line after the header" },
};

static void malformed_trace_is_refused_with_line_and_reason(void **state)
{
	const struct bad_case *c = *state;
	struct mp_trace *t = (struct mp_trace *)1;

	t_log_reset();
	assert_int_equal(mp_trace_parse(c->text, strlen(c->text), "bad.csv", &t), c->err);
	assert_null(t);
	if (!strstr(mp_last_error(), c->message))
		fail_msg("expected '%s' in '%s'", c->message, mp_last_error());
	/* The same line went to the log handler. */
	assert_true(t_log_contains(c->message));
}

static void file_errors_name_the_path(void **state)
{
	const char *missing = t_path("no-such-trace.csv");
	const char *empty = t_path("empty.csv");
	const char *bad = t_path("bad-row.csv");
	char expect[600];
	struct mp_trace *t;
	FILE *f;

	(void)state;
	assert_int_equal(mp_trace_open(missing, &t), -ENOENT);
	snprintf(expect, sizeof(expect), "%s: cannot open: ", missing);
	assert_non_null(strstr(mp_last_error(), expect));

	f = fopen(empty, "w");
	assert_non_null(f);
	fclose(f);
	assert_int_equal(mp_trace_open(empty, &t), -EINVAL);
	snprintf(expect, sizeof(expect), "%s:1: empty file", empty);
	assert_non_null(strstr(mp_last_error(), expect));

	f = fopen(bad, "w");
	assert_non_null(f);
	fputs(HEAD TOKEN0 "0,1,0,1,9,0.5,0.5\n", f);
	fclose(f);
	assert_int_equal(mp_trace_open(bad, &t), -EINVAL);
	snprintf(expect, sizeof(expect), "%s:9: e1 = 9 is out of range", bad);
	assert_non_null(strstr(mp_last_error(), expect));
}

static void overlong_line_in_file_is_refused(void **state)
{
	const char *path = t_path("longline.csv");
	static char junk[5 << 20];
	struct mp_trace *t;
	FILE *f = fopen(path, "w");

	(void)state;
	assert_non_null(f);
	memset(junk, '7', sizeof(junk));
	fputs(HEAD, f);
	assert_int_equal(fwrite(junk, 1, sizeof(junk), f), sizeof(junk));
	fclose(f);
	assert_int_equal(mp_trace_open(path, &t), -EINVAL);
	assert_non_null(strstr(mp_last_error(), ":7: line longer than"));

	/* Megabytes with no line at all are not a trace. */
	f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fwrite(junk, 1, sizeof(junk), f), sizeof(junk));
	fclose(f);
	assert_int_equal(mp_trace_open(path, &t), -EPROTO);
	assert_non_null(strstr(mp_last_error(), ":1: not a moe-trace v1 file"));
}

int main(void)
{
	static const struct CMUnitTest fixed[] = {
		cmocka_unit_test(humaneval_trace_parses_with_counts_from_the_file),
		cmocka_unit_test(gsm8k_trace_parses_with_counts_from_the_file),
		cmocka_unit_test(route_outside_the_trace_is_erange),
		cmocka_unit_test(parse_from_memory_matches_the_file_reader),
		cmocka_unit_test(geometry_check_names_the_mismatch),
		cmocka_unit_test(ids_only_trace_has_no_weights),
		cmocka_unit_test(probability_columns_are_exposed),
		cmocka_unit_test(token_ids_come_from_the_tokens_metadata),
		cmocka_unit_test(large_trace_streams_across_read_boundaries),
		cmocka_unit_test(file_errors_name_the_path),
		cmocka_unit_test(overlong_line_in_file_is_refused),
	};
	struct CMUnitTest tests[ARRAY_SIZE(fixed) + ARRAY_SIZE(bad_cases)];
	size_t n = 0;
	int failed;

	for (size_t i = 0; i < ARRAY_SIZE(fixed); i++)
		tests[n++] = fixed[i];
	/* One named test per kind of malformed input. */
	for (size_t i = 0; i < ARRAY_SIZE(bad_cases); i++) {
		tests[n] = (struct CMUnitTest)cmocka_unit_test_prestate(
			malformed_trace_is_refused_with_line_and_reason, (void *)&bad_cases[i]);
		tests[n++].name = bad_cases[i].name;
	}
	t_log_capture();
	failed = _cmocka_run_group_tests("trace", tests, n, NULL, NULL);
	t_tmpdir_cleanup();
	return failed;
}
