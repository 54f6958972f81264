// SPDX-License-Identifier: MIT
/* The completion API's requests, generated text and JSON (see api.h). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "serve/api.h"

#define DEFAULT_MAX_TOKENS 16u
#define MAX_MAX_TOKENS (1u << 20)

int api_fail(struct api_error *err, int status, const char *param, const char *fmt, ...)
{
	va_list ap;

	err->status = status;
	snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
	/*
	 * Messages quote the body (a parser's excerpt, a name), which may not
	 * be UTF-8 or may be cut mid-character: JSON needs valid text.
	 */
	for (char *c = err->message; *c; c++)
		if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
			*c = '?';
	return -EINVAL;
}

void api_request_free(struct api_request *r)
{
	free(r->prompt_text);
	free(r->prompt_ids);
	for (uint32_t i = 0; i < r->nstop; i++)
		free(r->stop[i]);
	memset(r, 0, sizeof(*r));
}

/* The prompt: a string, an array of token ids, or an array of one string. */
static int parse_prompt(json_t *v, struct api_request *r, struct api_error *err)
{
	size_t n;

	if (!v)
		return api_fail(err, 400, "prompt", "prompt is required");
	if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)))
		v = json_array_get(v, 0);
	if (json_is_string(v)) {
		r->prompt_text = strndup(json_string_value(v), json_string_length(v));
		if (!r->prompt_text)
			return api_fail(err, 500, NULL, "out of memory");
		if (strlen(r->prompt_text) != json_string_length(v))
			return api_fail(err, 400, "prompt", "prompt holds a NUL character");
		return 0;
	}
	if (!json_is_array(v) || !(n = json_array_size(v)))
		return api_fail(err, 400, "prompt", "prompt must be a string or a non-empty array "
				"of token ids (one prompt per request)");
	if (n > API_MAX_PROMPT_IDS)
		return api_fail(err, 400, "prompt", "prompt has %zu token ids, at most %u", n,
				API_MAX_PROMPT_IDS);
	r->prompt_ids = malloc(n * sizeof(*r->prompt_ids));
	if (!r->prompt_ids)
		return api_fail(err, 500, NULL, "out of memory");
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(v, i);

		if (!json_is_integer(e) || json_integer_value(e) < 0 ||
		    json_integer_value(e) > UINT32_MAX)
			return api_fail(err, 400, "prompt", "prompt[%zu] is not a token id (a "
					"non-negative integer; several prompts need several "
					"requests)", i);
		r->prompt_ids[i] = (uint32_t)json_integer_value(e);
	}
	r->nprompt_ids = (uint32_t)n;
	return 0;
}

static int parse_stop(json_t *v, struct api_request *r, struct api_error *err)
{
	size_t n;

	if (!v || json_is_null(v))
		return 0;
	if (json_is_string(v)) {
		n = 1;
	} else if (json_is_array(v)) {
		n = json_array_size(v);
		if (n > API_MAX_STOP)
			return api_fail(err, 400, "stop", "stop has %zu strings, at most %u", n,
					API_MAX_STOP);
	} else {
		return api_fail(err, 400, "stop", "stop must be a string or an array of strings");
	}
	for (size_t i = 0; i < n; i++) {
		json_t *s = json_is_string(v) ? v : json_array_get(v, i);
		size_t len;

		if (!json_is_string(s))
			return api_fail(err, 400, "stop", "stop[%zu] is not a string", i);
		len = json_string_length(s);
		if (!len || len > API_MAX_STOP_LEN || strlen(json_string_value(s)) != len)
			return api_fail(err, 400, "stop", "stop[%zu] must be 1 to %u bytes, no NUL",
					i, API_MAX_STOP_LEN);
		r->stop[r->nstop] = strndup(json_string_value(s), len);
		if (!r->stop[r->nstop])
			return api_fail(err, 500, NULL, "out of memory");
		r->nstop++;
	}
	return 0;
}

/* A number field in [lo, hi], or absent/null (then *out is left). */
static int get_number(json_t *o, const char *key, double lo, double hi, double *out,
		      struct api_error *err)
{
	json_t *v = json_object_get(o, key);
	double d;

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v))
		return api_fail(err, 400, key, "%s must be a number", key);
	d = json_number_value(v);
	if (!(d >= lo && d <= hi))
		return api_fail(err, 400, key, "%s must be in [%g, %g], not %g", key, lo, hi, d);
	*out = d;
	return 0;
}

/* An integer field in [lo, hi], or absent/null (then *out is left). */
static int get_int(json_t *o, const char *key, json_int_t lo, json_int_t hi, json_int_t *out,
		   struct api_error *err)
{
	json_t *v = json_object_get(o, key);

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v))
		return api_fail(err, 400, key, "%s must be an integer", key);
	if (json_integer_value(v) < lo || json_integer_value(v) > hi)
		return api_fail(err, 400, key, "%s must be in [%lld, %lld], not %lld", key,
				(long long)lo, (long long)hi, (long long)json_integer_value(v));
	*out = json_integer_value(v);
	return 0;
}

static int get_bool(json_t *o, const char *key, bool *out, struct api_error *err)
{
	json_t *v = json_object_get(o, key);

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return api_fail(err, 400, key, "%s must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

/* OpenAI fields this server takes only at their defaults: anything else is refused. */
static int check_unsupported(json_t *o, struct api_error *err)
{
	static const char *const zero[] = { "presence_penalty", "frequency_penalty" };
	static const char *const null[] = { "logprobs", "suffix" };
	json_t *v;

	if ((v = json_object_get(o, "n")) && !json_is_null(v) &&
	    !(json_is_integer(v) && json_integer_value(v) == 1))
		return api_fail(err, 400, "n", "n must be 1: one completion per request");
	if ((v = json_object_get(o, "best_of")) && !json_is_null(v) &&
	    !(json_is_integer(v) && json_integer_value(v) == 1))
		return api_fail(err, 400, "best_of", "best_of must be 1");
	if ((v = json_object_get(o, "echo")) && !json_is_null(v) && !json_is_false(v))
		return api_fail(err, 400, "echo", "echo is not supported");
	for (size_t i = 0; i < 2; i++)
		if ((v = json_object_get(o, zero[i])) && !json_is_null(v) &&
		    !(json_is_number(v) && json_number_value(v) == 0))
			return api_fail(err, 400, zero[i], "%s is not supported (only 0)", zero[i]);
	for (size_t i = 0; i < 2; i++)
		if ((v = json_object_get(o, null[i])) && !json_is_null(v))
			return api_fail(err, 400, null[i], "%s is not supported", null[i]);
	if ((v = json_object_get(o, "logit_bias")) && !json_is_null(v) &&
	    !(json_is_object(v) && !json_object_size(v)))
		return api_fail(err, 400, "logit_bias", "logit_bias is not supported");
	return 0;
}

static int parse_fields(json_t *o, struct api_request *r, struct api_error *err)
{
	json_t *model = json_object_get(o, "model");
	json_int_t mt = DEFAULT_MAX_TOKENS, topk = 0, seed = 0;
	int e;

	if (model && !json_is_null(model)) {
		if (!json_is_string(model) || json_string_length(model) >= sizeof(r->model))
			return api_fail(err, 400, "model", "model must be a string shorter than "
					"%zu bytes", sizeof(r->model));
		snprintf(r->model, sizeof(r->model), "%s", json_string_value(model));
	}
	r->temperature = 1.0;
	r->top_p = 1.0;
	if ((e = parse_prompt(json_object_get(o, "prompt"), r, err)) ||
	    (e = get_int(o, "max_tokens", 1, MAX_MAX_TOKENS, &mt, err)) ||
	    (e = get_number(o, "temperature", 0, 2, &r->temperature, err)) ||
	    (e = get_number(o, "top_p", 1e-9, 1, &r->top_p, err)) ||
	    (e = get_int(o, "top_k", 0, UINT32_MAX, &topk, err)) ||
	    (e = get_int(o, "seed", INT64_MIN, INT64_MAX, &seed, err)) ||
	    (e = get_bool(o, "stream", &r->stream, err)) ||
	    (e = get_bool(o, "ignore_eos", &r->ignore_eos, err)) ||
	    (e = parse_stop(json_object_get(o, "stop"), r, err)) ||
	    (e = check_unsupported(o, err)))
		return e;
	r->max_tokens = (uint32_t)mt;
	r->top_k = (uint32_t)topk;
	r->seed = (uint64_t)seed;
	r->seed_set = json_object_get(o, "seed") && !json_is_null(json_object_get(o, "seed"));
	return 0;
}

/* A body that must be one JSON object: *o (json_decref() it), or -EINVAL saying why. */
static int load_object(const char *body, size_t len, json_t **o, struct api_error *err)
{
	json_error_t jerr;

	*o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!*o)
		return api_fail(err, 400, NULL, "the body is not JSON: %s (at byte %d)", jerr.text,
				jerr.position);
	if (!json_is_object(*o)) {
		json_decref(*o);
		return api_fail(err, 400, NULL, "the body must be a JSON object");
	}
	return 0;
}

int api_parse_completion(const char *body, size_t len, struct api_request *out,
			 struct api_error *err)
{
	json_t *o;
	int e;

	memset(out, 0, sizeof(*out));
	if (load_object(body, len, &o, err))
		return -EINVAL;
	e = parse_fields(o, out, err);
	json_decref(o);
	if (e)
		api_request_free(out);
	return e;
}

/* A string field of at most cap - 1 bytes, not empty, into out; absent leaves out "". */
static int string_field(json_t *o, const char *key, bool required, char *out, size_t cap,
			struct api_error *err)
{
	json_t *v = json_object_get(o, key);

	if (!v)
		return required ? api_fail(err, 400, key, "'%s' is required", key) : 0;
	if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) >= cap ||
	    strlen(json_string_value(v)) != json_string_length(v))
		return api_fail(err, 400, key, "'%s' must be a string of 1 to %zu bytes", key,
				cap - 1);
	memcpy(out, json_string_value(v), json_string_length(v) + 1);
	return 0;
}

int api_parse_adapter_load(const char *body, size_t len, struct api_adapter_load *out,
			   struct api_error *err)
{
	const char *key;
	json_t *o, *v;
	int e = 0;

	memset(out, 0, sizeof(*out));
	if (load_object(body, len, &o, err))
		return -EINVAL;
	json_object_foreach(o, key, v)
		if (strcmp(key, "file") && strcmp(key, "name") && !e)
			e = api_fail(err, 400, key, "unknown field '%.40s' (file, name)", key);
	if (!e)
		e = string_field(o, "file", true, out->file, sizeof(out->file), err);
	if (!e)
		e = string_field(o, "name", false, out->name, sizeof(out->name), err);
	json_decref(o);
	return e;
}

int api_parse_threads(const char *body, size_t len, uint32_t *threads, struct api_error *err)
{
	json_int_t n = 0;
	const char *key;
	json_t *o, *v;
	int e = 0;

	if (load_object(body, len, &o, err))
		return -EINVAL;
	json_object_foreach(o, key, v)
		if (strcmp(key, "threads") && !e)
			e = api_fail(err, 400, key, "unknown field '%.40s' (threads)", key);
	if (!e)
		e = get_int(o, "threads", 1, API_MAX_THREADS, &n, err);
	if (!e && !n)
		e = api_fail(err, 400, "threads", "threads is required");
	json_decref(o);
	*threads = (uint32_t)n;
	return e;
}

/*
 * Generated text
 */

static int decode_new(struct textgen *g);

int textgen_init(struct textgen *g, const struct mp_tokenizer *tok, const char *const *stop,
		 uint32_t nstop, uint32_t prefix)
{
	int err;

	memset(g, 0, sizeof(*g));
	g->anchor = UINT32_MAX;
	g->tok = tok;
	g->stop = stop;
	g->nstop = nstop;
	for (uint32_t i = 0; i < nstop; i++)
		if (strlen(stop[i]) > g->hold + 1)
			g->hold = strlen(stop[i]) - 1;
	if (prefix == UINT32_MAX || !tok)
		return 0;
	err = ids_append(&g->ids, &g->n, &g->cap, prefix);
	if (!err)
		err = decode_new(g);
	g->start = g->emitted = g->len;
	return err == -EINVAL ? 0 : err;	/* a prefix the tokenizer does not know: none */
}

void textgen_fini(struct textgen *g)
{
	free(g->ids);
	free(g->text);
	memset(g, 0, sizeof(*g));
}

static int text_room(struct textgen *g, size_t need)
{
	size_t cap = need + 256;
	char *t;

	if (need < g->text_cap)
		return 0;
	t = realloc(g->text, cap);
	if (!t)
		return -ENOMEM;
	g->text = t;
	g->text_cap = cap;
	return 0;
}

/* Decodes ids[from..n) into the text at `at`, after a space when `space`. */
static int decode_from(struct textgen *g, uint32_t from, size_t at, bool space)
{
	int n = 0;

	for (int pass = 0; pass < 2; pass++) {
		if (text_room(g, at + (size_t)n))
			return -ENOMEM;
		if (space)
			g->text[at - 1] = ' ';
		n = mp_tokenizer_decode(g->tok, g->ids + from, g->n - from, g->text + at,
					g->text_cap - at);
		if (n < 0 || at + (size_t)n < g->text_cap)
			break;
	}
	if (n < 0)
		return n;
	g->dlen = at + (size_t)n;
	return 0;
}

/*
 * The text of every id so far after the last one came: decoded from the
 * anchor on (or from the start before there is one), as decoding all of
 * them would give it. A text piece (not a byte, control or unknown one)
 * becomes the anchor: the text before it is final, and decoding from it
 * drops only its leading space, which the whole text keeps after text.
 */
static int decode_new(struct textgen *g)
{
	size_t before = g->dlen;
	uint32_t last = g->ids[g->n - 1];
	struct mp_piece pc;
	int err;

	if (g->anchor == UINT32_MAX)
		err = decode_from(g, 0, 0, false);
	else
		err = decode_from(g, g->anchor, g->anchor_at + g->anchor_space, g->anchor_space);
	if (err)
		return err;
	g->len = g->dlen;
	/* The prefix's own text never changes (pieces only add); should it, hand out none of it. */
	if (g->len < g->start)
		g->len = g->start;
	if (mp_tokenizer_piece(g->tok, last, &pc))
		return 0;
	if (pc.type != MP_PIECE_BYTE && pc.type != MP_PIECE_CONTROL &&
	    pc.type != MP_PIECE_UNKNOWN) {
		g->anchor = g->n - 1;
		g->anchor_at = before;
		g->anchor_space = g->visible && pc.len >= 3 && !memcmp(pc.text, "\xE2\x96\x81", 3);
	}
	if (pc.type != MP_PIECE_CONTROL)
		g->visible = true;
	return 0;
}

/* Where the text may end for now: before trailing U+FFFD (bytes of a character still coming). */
static size_t settled(const struct textgen *g)
{
	size_t end = g->len;

	while (end >= 3 && !memcmp(g->text + end - 3, "\xEF\xBF\xBD", 3))
		end -= 3;
	return end;
}

/* Cuts the text at the first stop string that starts at or after `from`. */
static bool find_stop(struct textgen *g, size_t from)
{
	size_t cut = SIZE_MAX;

	for (uint32_t i = 0; i < g->nstop; i++) {
		const char *p = memmem(g->text + from, g->len - from, g->stop[i], strlen(g->stop[i]));

		if (p && (size_t)(p - g->text) < cut)
			cut = (size_t)(p - g->text);
	}
	if (cut == SIZE_MAX)
		return false;
	g->len = cut;
	g->stopped = true;
	return true;
}

int ids_append(uint32_t **ids, uint32_t *n, uint32_t *cap, uint32_t id)
{
	if (*n == *cap) {
		uint32_t c = *cap ? 2 * *cap : 64;
		uint32_t *p = realloc(*ids, c * sizeof(*p));

		if (!p)
			return -ENOMEM;
		*ids = p;
		*cap = c;
	}
	(*ids)[(*n)++] = id;
	return 0;
}

int textgen_push(struct textgen *g, uint32_t id, const char **delta, size_t *dlen)
{
	size_t end, from;
	int err;

	/* Never NULL: a caller copies dlen bytes from it, 0 included. */
	*delta = "";
	*dlen = 0;
	if (g->stopped)
		return 1;
	err = ids_append(&g->ids, &g->n, &g->cap, id);
	/* Without a tokenizer there is no text, only the ids. */
	if (!err && !g->tok)
		return 0;
	if (!err)
		err = decode_new(g);
	if (err)
		return err;
	/* A stop string may begin in what was held back, never in what was handed out. */
	from = g->emitted;
	if (g->nstop && find_stop(g, from))
		end = g->len;
	else
		end = settled(g) > g->hold ? settled(g) - g->hold : 0;
	if (end > g->emitted) {
		*delta = g->text + g->emitted;
		*dlen = end - g->emitted;
		g->emitted = end;
	}
	return g->stopped ? 1 : 0;
}

void textgen_flush(struct textgen *g, const char **delta, size_t *dlen)
{
	*delta = g->text ? g->text + g->emitted : "";
	*dlen = g->len > g->emitted ? g->len - g->emitted : 0;
	g->emitted += *dlen;
}

/*
 * JSON
 */

static char *dump(json_t *o)
{
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	return s;
}

char *api_error_json(const struct api_error *err, const char *type)
{
	return dump(json_pack("{s:{s:s, s:s, s:s?, s:n}}", "error", "message", err->message,
			      "type", type, "param", err->param[0] ? err->param : NULL, "code"));
}

static json_t *usage(uint32_t prompt_tokens, uint32_t tokens)
{
	return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)prompt_tokens,
			 "completion_tokens", (json_int_t)tokens, "total_tokens",
			 (json_int_t)prompt_tokens + tokens);
}

static json_t *choice(const char *text, size_t len, const char *finish, const uint32_t *ids,
		      uint32_t n)
{
	json_t *c = json_pack("{s:s%, s:i, s:n, s:s?}", "text", text ? text : "", text ? len : 0,
			      "index", 0, "logprobs", "finish_reason", finish);
	json_t *a = ids ? json_array() : NULL;

	for (uint32_t i = 0; a && i < n; i++)
		json_array_append_new(a, json_integer(ids[i]));
	if (c && a)
		json_object_set_new(c, "token_ids", a);
	else
		json_decref(a);
	return c;
}

char *api_completion_json(const char *id, long created, const char *model, const char *text,
			  size_t len, const char *finish, uint32_t prompt_tokens, uint32_t tokens,
			  const uint32_t *ids, uint32_t n)
{
	return dump(json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", id, "object",
			      "text_completion", "created", (json_int_t)created, "model", model,
			      "choices", choice(text, len, finish, ids, n), "usage",
			      usage(prompt_tokens, tokens)));
}

char *api_chunk_sse(const char *id, long created, const char *model, const char *text,
		    size_t len, const char *finish, const uint32_t *ids, uint32_t n,
		    uint32_t prompt_tokens, uint32_t tokens)
{
	char *j = dump(json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o*}", "id", id, "object",
				 "text_completion", "created", (json_int_t)created, "model", model,
				 "choices", choice(text, len, finish, ids, n), "usage",
				 finish ? usage(prompt_tokens, tokens) : NULL));
	char *e = NULL;

	if (j && asprintf(&e, "data: %s\n\n", j) < 0)
		e = NULL;
	free(j);
	return e;
}

char *api_chunk_prefix(const char *id, long created, const char *model)
{
	char *j = dump(json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", "text_completion",
				 "created", (json_int_t)created, "model", model));
	char *p = NULL;

	/* The object without its closing brace, then the choice up to its text. */
	if (j && asprintf(&p, "data: %.*s,\"choices\":[{\"text\":\"", (int)strlen(j) - 1, j) < 0)
		p = NULL;
	free(j);
	return p;
}

/* Length of the UTF-8 character at s as jansson accepts it (n bytes left), or 0. */
static size_t utf8_char(const unsigned char *s, size_t n)
{
	size_t len = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] <= 0xdf ? 2 :
		     s[0] >= 0xe0 && s[0] <= 0xef ? 3 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
	uint32_t cp = len == 1 ? s[0] : s[0] & (0x7f >> len);

	if (!len || len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

/* JSON's two-character escape of c, or NULL (another control character takes \u00XX). */
static const char *short_escape(unsigned char c)
{
	switch (c) {
	case '"': return "\\\"";
	case '\\': return "\\\\";
	case '\b': return "\\b";
	case '\f': return "\\f";
	case '\n': return "\\n";
	case '\r': return "\\r";
	case '\t': return "\\t";
	default: return NULL;
	}
}

/* Appends text as the inside of a JSON string, escaped as json_dumps() escapes it. */
static int add_escaped(struct strbuf *o, const char *text, size_t len)
{
	const unsigned char *s = (const unsigned char *)text;
	size_t from = 0;

	for (size_t i = 0; i < len;) {
		size_t c = utf8_char(s + i, len - i);
		const char *esc = short_escape(s[i]);

		if (!c)
			return -EINVAL;
		if (esc || s[i] < 0x20) {
			sb_add(o, text + from, i - from);
			if (esc)
				sb_add(o, esc, 2);
			else
				sb_printf(o, "\\u%04X", s[i]);
			from = i + 1;
		}
		i += c;
	}
	sb_add(o, text + from, len - from);
	return 0;
}

int api_chunk_add(struct strbuf *o, const char *prefix, const char *text, size_t len,
		  const uint32_t *ids, uint32_t n)
{
	size_t start = o->len;

	sb_add(o, prefix, strlen(prefix));
	if (add_escaped(o, text ? text : "", text ? len : 0)) {
		o->len = start;
		return -EINVAL;
	}
	sb_add(o, "\",\"index\":0,\"logprobs\":null,\"finish_reason\":null", 48);
	for (uint32_t i = 0; ids && i < n; i++)
		sb_printf(o, "%s%u", i ? "," : ",\"token_ids\":[", ids[i]);
	if (ids)
		sb_add(o, n ? "]" : ",\"token_ids\":[]", n ? 1 : 15);
	sb_add(o, "}]}\n\n", 5);
	return 0;
}

char *api_models_json(const char *const *names, uint32_t n, long created)
{
	json_t *data = json_array(), *o;

	for (uint32_t i = 0; data && i < n; i++) {
		o = json_pack("{s:s, s:s, s:I, s:s}", "id", names[i], "object", "model", "created",
			      (json_int_t)created, "owned_by", "moepager");
		if (!o || json_array_append_new(data, o)) {
			json_decref(data);
			return NULL;
		}
	}
	return dump(json_pack("{s:s, s:o}", "object", "list", "data", data));
}

char *api_adapter_unloaded_json(const char *name)
{
	return dump(json_pack("{s:s, s:s}", "name", name, "status", "unloaded"));
}
