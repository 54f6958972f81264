// SPDX-License-Identifier: MIT
/*
 * Description: `moepager serve`'s completion API without HTTP: request
 * parsing and its defaults, and the generated text handed out as tokens
 * come (with the trained model's tokenizer): it joins into the text decoded
 * at once, never ends inside a UTF-8 character or inside what may become a
 * stop string, keeps the first piece's leading space after a prompt, and is
 * cut before a stop string spread over several tokens; decoding each token
 * from the last text piece on gives the whole decode after every token
 * (random ids: split and stray UTF-8 bytes, control pieces, stop strings);
 * and a stream's token
 * events, written without building JSON, are the bytes jansson's give.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "serve/api.h"

static struct mp_tokenizer *tok;

static int group_setup(void **state)
{
	const char *root = getenv("MOEPAGER_BUILD_ROOT");
	char path[4096];

	(void)state;
	t_log_capture();
	snprintf(path, sizeof(path), "%s/data/models/tiny-real.tok", root ? root : "build");
	return mp_tokenizer_open(path, &tok);
}

static int group_teardown(void **state)
{
	(void)state;
	mp_tokenizer_close(tok);
	return 0;
}

static void parse(const char *body, struct api_request *r)
{
	struct api_error e;

	if (api_parse_completion(body, strlen(body), r, &e))
		fail_msg("%s: %d %s: %s", body, e.status, e.param, e.message);
}

static void requests_take_openai_defaults(void **state)
{
	struct api_request r;

	(void)state;
	parse("{\"prompt\": \"hi\"}", &r);
	assert_string_equal(r.prompt_text, "hi");
	assert_int_equal(r.max_tokens, 16);
	assert_true(r.temperature == 1.0 && r.top_p == 1.0);
	assert_false(r.stream);
	assert_false(r.seed_set);
	assert_int_equal(r.nstop, 0);
	api_request_free(&r);
	parse("{\"prompt\": [3, 4], \"stop\": \"x\", \"seed\": -1, \"model\": null}", &r);
	assert_int_equal(r.nprompt_ids, 2);
	assert_int_equal(r.prompt_ids[1], 4);
	assert_int_equal(r.nstop, 1);
	assert_true(r.seed_set);
	assert_string_equal(r.model, "");
	api_request_free(&r);
}

static void duplicate_keys_and_nul_in_text_are_refused(void **state)
{
	static const char dup[] = "{\"prompt\": \"a\", \"prompt\": \"b\"}";
	static const char nul[] = "{\"prompt\": \"a\\u0000b\"}";
	struct api_request r;
	struct api_error e;

	(void)state;
	assert_int_equal(api_parse_completion(dup, sizeof(dup) - 1, &r, &e), -EINVAL);
	assert_int_equal(e.status, 400);
	assert_int_equal(api_parse_completion(nul, sizeof(nul) - 1, &r, &e), -EINVAL);
	assert_int_equal(e.status, 400);
	/* The body is a buffer of len bytes, not a string: nothing past it is read. */
	assert_int_equal(api_parse_completion("{\"prompt\": \"a\"}XXXX", 15, &r, &e), 0);
	api_request_free(&r);
}

/* A body that is not UTF-8 is refused with an error that is still JSON (the fuzzer's find). */
static void an_error_quoting_bad_bytes_is_still_json(void **state)
{
	static const char body[] = "{\"model\": \"tiny-r\", \"prompt\": \"\\\xdf\x96\x8c\xd5, "
				   "\"re\":0.7, \"top_p\": [\"\", \".\"]}";
	struct api_request r;
	struct api_error e;
	char *j;

	(void)state;
	assert_int_equal(api_parse_completion(body, sizeof(body) - 1, &r, &e), -EINVAL);
	assert_int_equal(e.status, 400);
	j = api_error_json(&e, "invalid_request_error");
	assert_non_null(j);
	assert_non_null(strstr(j, "the body is not JSON"));
	free(j);
}

/* Feeds the ids of text one by one; returns what was handed out, flushed at the end. */
static char *stream(const char *text, const char *const *stop, uint32_t nstop, uint32_t prefix,
		    int *stopped)
{
	uint32_t ids[512];
	int n = mp_tokenizer_encode(tok, text, strlen(text), ids, 512);
	struct textgen g;
	static char out[4096];
	size_t len = 0, dlen;
	const char *d;

	assert_true(n > 0 && n < 512);
	assert_int_equal(textgen_init(&g, tok, stop, nstop, prefix), 0);
	*stopped = 0;
	for (int i = 0; i < n && !*stopped; i++) {
		*stopped = textgen_push(&g, ids[i], &d, &dlen);
		assert_true(*stopped >= 0);
		/* A delta never ends inside a UTF-8 character. */
		if (dlen) {
			unsigned char last = (unsigned char)d[dlen - 1];

			assert_true(last < 0x80 || (last & 0xc0) == 0x80);
		}
		if (dlen)
			memcpy(out + len, d, dlen);
		len += dlen;
	}
	textgen_flush(&g, &d, &dlen);
	if (dlen)
		memcpy(out + len, d, dlen);
	out[len + dlen] = '\0';
	textgen_fini(&g);
	return out;
}

static void streamed_text_joins_into_the_whole_text(void **state)
{
	static const char text[] = "Déjà vu, naïve café: 日本語 and emoji 🎉 — all at once.";
	int stopped;

	(void)state;
	/* After BOS (a control piece: no text) the first piece's space is dropped, as at a start. */
	assert_string_equal(stream(text, NULL, 0, mp_tokenizer_bos(tok), &stopped), text);
	assert_int_equal(stopped, 0);
}

static void text_after_a_prompt_keeps_its_leading_space(void **state)
{
	uint32_t prompt[8];
	int stopped, n = mp_tokenizer_encode(tok, "Hello", 5, prompt, 8);

	(void)state;
	assert_true(n > 0);
	/* "world" alone encodes with SentencePiece's dummy prefix space: after Hello it shows. */
	assert_string_equal(stream("world", NULL, 0, prompt[n - 1], &stopped), " world");
	assert_string_equal(stream("world", NULL, 0, UINT32_MAX, &stopped), "world");
}

static void a_stop_string_over_several_tokens_cuts_the_text_before_it(void **state)
{
	static const char *const stop[] = { "STOP here", "never" };
	int stopped;

	(void)state;
	assert_string_equal(stream("the first part STOP here and the rest", stop, 2,
				   mp_tokenizer_bos(tok), &stopped), "the first part ");
	assert_int_equal(stopped, 1);
	/* What merely starts like a stop string is handed out once it cannot be one. */
	assert_string_equal(stream("STOP there", stop, 2, mp_tokenizer_bos(tok), &stopped),
			    "STOP there");
	assert_int_equal(stopped, 0);
}

static uint64_t next_rand(uint64_t *x)
{
	*x = *x * 6364136223846793005ull + 1442695040888963407ull;
	return *x >> 33;
}

/* A random id: often a character's UTF-8 bytes as byte pieces, or a stray byte, or control. */
static uint32_t random_ids(uint64_t *x, const uint32_t *byte_id, uint32_t *out)
{
	static const uint32_t cps[] = { 0xE9, 0x65E5, 0x1F389, 0x3B1, 0x20AC };
	uint64_t r = next_rand(x);
	uint32_t cp;

	switch (r % 8) {
	case 0:
	case 1:
		cp = r % 16 < 8 ? 0xE9 : cps[(r >> 8) % 5];	/* é often: a stop string below */
		if (cp < 0x800) {
			out[0] = byte_id[0xC0 | cp >> 6];
			out[1] = byte_id[0x80 | (cp & 0x3F)];
			return 2;
		}
		if (cp < 0x10000) {
			out[0] = byte_id[0xE0 | cp >> 12];
			out[1] = byte_id[0x80 | ((cp >> 6) & 0x3F)];
			out[2] = byte_id[0x80 | (cp & 0x3F)];
			return 3;
		}
		out[0] = byte_id[0xF0 | cp >> 18];
		out[1] = byte_id[0x80 | ((cp >> 12) & 0x3F)];
		out[2] = byte_id[0x80 | ((cp >> 6) & 0x3F)];
		out[3] = byte_id[0x80 | (cp & 0x3F)];
		return 4;
	case 2:
		out[0] = byte_id[(r >> 8) & 0xFF];		/* often not UTF-8: U+FFFD */
		return 1;
	case 3:
		out[0] = r & 256 ? mp_tokenizer_bos(tok) : mp_tokenizer_eos(tok);
		return 1;
	default:
		out[0] = (uint32_t)((r >> 4) % mp_tokenizer_vocab(tok));
		return 1;
	}
}

/*
 * Decoding each token only from the last text piece on gives, after every
 * token, the text decoding all ids at once gives, over random ids rich in
 * byte pieces (characters split over tokens, stray bytes), control pieces
 * and pieces with a leading space; what is handed out is that text cut
 * before the first stop string (é may come as two byte pieces).
 */
static void incremental_text_is_the_whole_decode_after_every_token(void **state)
{
	static const char *const stops[][2] = { { NULL }, { "e" }, { "\xC3\xA9", "th" } };
	static char full[16384], out[16384];
	uint32_t byte_id[256], vocab = mp_tokenizer_vocab(tok), nbytes = 0;
	uint64_t x = 12345;
	struct mp_piece pc;

	(void)state;
	for (uint32_t id = 0; id < vocab; id++) {
		char t[16];
		unsigned b;

		if (mp_tokenizer_piece(tok, id, &pc) || pc.type != MP_PIECE_BYTE || pc.len > 15)
			continue;
		memcpy(t, pc.text, pc.len);
		t[pc.len] = '\0';
		if (sscanf(t, "<0x%2X>", &b) == 1 && b < 256) {
			byte_id[b] = id;
			nbytes++;
		}
	}
	assert_int_equal(nbytes, 256);
	for (int round = 0; round < 60; round++) {
		const char *const *stop = stops[round % 3];
		uint32_t nstop = stop[0] ? (stop[1] ? 2 : 1) : 0, prefix, ids[4];
		size_t olen = 0, dlen, cut;
		const char *d;
		struct textgen g;
		int stopped = 0, n = 0;

		random_ids(&x, byte_id, ids);
		prefix = ids[0];
		assert_int_equal(textgen_init(&g, tok, stop, nstop, prefix), 0);
		for (int i = 0; i < 120 && !stopped; i++) {
			uint32_t k = random_ids(&x, byte_id, ids);

			for (uint32_t j = 0; j < k && !stopped; j++) {
				stopped = textgen_push(&g, ids[j], &d, &dlen);
				assert_true(stopped >= 0);
				memcpy(out + olen, d, dlen);
				olen += dlen;
				n = mp_tokenizer_decode(tok, g.ids, g.n, full, sizeof(full));
				assert_true(n >= 0 && (size_t)n < sizeof(full));
				assert_int_equal(g.dlen, n);
				assert_memory_equal(g.text, full, (size_t)n);
			}
		}
		textgen_flush(&g, &d, &dlen);
		memcpy(out + olen, d, dlen);
		olen += dlen;
		/* The spec: the whole text after the prefix's, before the first stop string. */
		cut = (size_t)n;
		for (uint32_t s = 0; s < nstop; s++) {
			const char *p = memmem(full + g.start, (size_t)n - g.start, stop[s],
					       strlen(stop[s]));

			if (p && (size_t)(p - full) < cut)
				cut = (size_t)(p - full);
		}
		assert_int_equal(stopped, cut < (size_t)n);
		assert_int_equal(olen, cut - g.start);
		assert_memory_equal(out, full + g.start, olen);
		textgen_fini(&g);
	}
}

/* The token event api_chunk_add() writes, or NULL when it refuses the text. */
static char *fast_event(const char *prefix, const char *text, size_t len, const uint32_t *ids)
{
	struct strbuf o;
	char *s;

	sb_init(&o);
	sb_add(&o, "before|", 7);
	if (api_chunk_add(&o, prefix, text, len, ids, 1)) {
		assert_int_equal(o.len, 7);	/* left as it was */
		sb_free(&o);
		return NULL;
	}
	sb_add(&o, "", 1);
	assert_false(o.oom);
	assert_memory_equal(o.s, "before|", 7);
	s = strdup(o.s + 7);
	sb_free(&o);
	return s;
}

static void token_events_are_the_bytes_jansson_writes(void **state)
{
	static const char model[] = "a \"quoted\\ model\" \xc3\xa9";
	static const char *const texts[] = {
		"plain", "", "quote \" backslash \\ slash / tab \t nl \n cr \r bs \b ff \f",
		"\x01\x02\x1f\x7f control", "Déjà vu 日本語 🎉 \xef\xbf\xbd",
		"bad \xc3", "bad \xe2\x82", "overlong \xc0\xaf", "surrogate \xed\xa0\x80",
		"past \xf4\x90\x80\x80",
	};
	uint32_t id = 4095;
	char *prefix = api_chunk_prefix("cmpl-7", 1700000000, model);

	(void)state;
	assert_non_null(prefix);
	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++)
		for (int with_ids = 0; with_ids < 2; with_ids++) {
			const uint32_t *ids = with_ids ? &id : NULL;
			char *want = api_chunk_sse("cmpl-7", 1700000000, model, texts[i],
						   strlen(texts[i]), NULL, ids, 1, 0, 0);
			char *got = fast_event(prefix, texts[i], strlen(texts[i]), ids);

			/* The first five are UTF-8; the rest both refuse. */
			if (i < 5) {
				assert_non_null(want);
				assert_non_null(got);
				assert_string_equal(got, want);
			} else {
				assert_null(want);
				assert_null(got);
			}
			free(want);
			free(got);
		}
	free(prefix);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(requests_take_openai_defaults),
		cmocka_unit_test(duplicate_keys_and_nul_in_text_are_refused),
		cmocka_unit_test(an_error_quoting_bad_bytes_is_still_json),
		cmocka_unit_test(streamed_text_joins_into_the_whole_text),
		cmocka_unit_test(text_after_a_prompt_keeps_its_leading_space),
		cmocka_unit_test(a_stop_string_over_several_tokens_cuts_the_text_before_it),
		cmocka_unit_test(incremental_text_is_the_whole_decode_after_every_token),
		cmocka_unit_test(token_events_are_the_bytes_jansson_writes),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
