// SPDX-License-Identifier: MIT
/* Reader for moe-trace v1 routing traces (docs/moe-trace.md): one pass, checked line by line. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <moepager/trace.h>

#include "base/base.h"

/*
 * The file reader parses whole lines out of a buffer of this size, so it
 * bounds the longest line: a row carrying p0..p4095 at ~12 bytes a value
 * is about 50 KiB.
 */
#define TRACE_BUF_BYTES		(4u << 20)
/* Rows the arrays start with; they double from there (no per-row allocation). */
#define TRACE_INIT_ROWS		4096u
#define TRACE_INIT_REQUESTS	16u
/* Bounds the metadata block of a corrupt file. */
#define TRACE_MAX_META		256u
/* A weight or probability longer than this is not a number we wrote. */
#define TRACE_MAX_NUMBER	47u

struct trace_meta {
	char *key;
	char *value;
};

struct mp_trace {
	uint32_t layers;
	uint32_t experts;
	uint32_t topk;
	uint32_t requests;
	uint64_t rows;
	uint32_t *tokens;	/* [requests]: tokens of each request */
	uint64_t *first_row;	/* [requests]: row of (request, 0, 0) */
	uint32_t *ids;		/* [rows][topk] */
	float *weights;		/* [rows][topk], or NULL */
	float *probs;		/* [rows][experts], or NULL */
	struct trace_meta *meta;
	uint32_t nmeta;
};

enum parse_stage {
	STAGE_MAGIC,	/* expecting "# moe-trace v1" */
	STAGE_META,	/* "# key=value" lines, then the header */
	STAGE_ROWS,
};

/* Metadata keys the reader interprets; their lines are kept for messages. */
enum meta_num {
	META_LAYERS,
	META_EXPERTS,
	META_TOPK,
	META_REQUESTS,
	META_NUM_COUNT
};

static const struct {
	const char *key;
	uint32_t lo, hi;
} meta_nums[META_NUM_COUNT] = {
	[META_LAYERS] = { "layers", 1, MP_MAX_LAYERS },
	[META_EXPERTS] = { "experts", 1, MP_MAX_EXPERTS },
	[META_TOPK] = { "topk", 1, MP_MAX_TOPK },
	[META_REQUESTS] = { "requests", 1, UINT32_MAX - 1 },
};

struct parser {
	const char *name;
	uint64_t line;			/* 1-based number of the line being parsed */
	enum parse_stage stage;
	struct mp_trace *t;
	locale_t c_locale;		/* numbers use '.' whatever the application's locale */
	uint32_t meta_val[META_NUM_COUNT];
	uint64_t meta_line[META_NUM_COUNT];	/* 0: key not given */
	uint32_t ncols;			/* columns of every row, from the header */
	bool has_weights, has_probs;
	uint64_t cap_rows;
	uint32_t cap_requests;
	uint64_t *seen;			/* [experts]: 1 + the last row using the id */
	uint64_t last_row_line;
	uint32_t req, tok, layer;	/* position of the previous row */
};

static int __mp_printf(3, 4) __mp_cold perr_at(const struct parser *p, uint64_t line,
					       const char *fmt, ...)
{
	char reason[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	return mp_err(-EINVAL, "%s:%" PRIu64 ": %s", p->name, line, reason);
}

#define perr(p, ...) perr_at(p, (p)->line, __VA_ARGS__)

/* Copies a field for a message: at most 24 bytes, non-printable bytes as '?'. */
static const char *show(const char *s, size_t len, char buf[32])
{
	size_t n = MP_MIN(len, 24), i;

	for (i = 0; i < n; i++)
		buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
	if (len > n) {
		memcpy(buf + n, "...", 3);
		n += 3;
	}
	buf[n] = 0;
	return buf;
}

static bool is_space(char c)
{
	return c == ' ' || c == '\t';
}

static void trim(const char **s, size_t *len)
{
	while (*len && is_space(**s)) {
		(*s)++;
		(*len)--;
	}
	while (*len && is_space((*s)[*len - 1]))
		(*len)--;
}

static bool field_is(const char *s, size_t len, const char *word)
{
	return strlen(word) == len && !memcmp(s, word, len);
}

/* A decimal in [0, UINT32_MAX]: digits only (no sign, no spaces). */
static bool parse_u32(const char *s, size_t len, uint32_t *out)
{
	uint64_t v = 0;

	if (!len || len > 10)
		return false;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	if (v > UINT32_MAX)
		return false;
	*out = (uint32_t)v;
	return true;
}

/* A finite decimal float (strtof in the C locale, whole field consumed). */
static bool parse_float(const struct parser *p, const char *s, size_t len, float *out)
{
	char buf[TRACE_MAX_NUMBER + 1];
	char *end;
	float v;

	/* strtof would skip leading blanks and accept "inf"/"nan"; we accept neither. */
	if (!len || len > TRACE_MAX_NUMBER ||
	    !((s[0] >= '0' && s[0] <= '9') || s[0] == '.' || s[0] == '-' || s[0] == '+'))
		return false;
	memcpy(buf, s, len);
	buf[len] = 0;
	v = strtof_l(buf, &end, p->c_locale);
	if (end != buf + len || !isfinite(v))
		return false;
	*out = v;
	return true;
}

/*
 * Metadata
 */

static int parse_magic(struct parser *p, const char *s, size_t len)
{
	static const char word[] = "moe-trace";
	const size_t wlen = sizeof(word) - 1;
	char buf[32];

	if (len && s[0] == '#') {
		s++;
		len--;
		trim(&s, &len);
		if (len >= wlen && !memcmp(s, word, wlen) && (len == wlen || is_space(s[wlen]))) {
			s += wlen;
			len -= wlen;
			trim(&s, &len);
			if (field_is(s, len, "v1")) {
				p->stage = STAGE_META;
				return 0;
			}
			return mp_err(-EPROTO, "%s:%" PRIu64 ": moe-trace version '%s' is not "
				      "supported (this reader reads v1)", p->name, p->line,
				      show(s, len, buf));
		}
	}
	return mp_err(-EPROTO, "%s:%" PRIu64 ": not a moe-trace v1 file (the first line must be "
		      "'# moe-trace v1')", p->name, p->line);
}

static bool is_key_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '-' || c == '.';
}

static int add_meta(struct parser *p, const char *key, size_t klen, const char *val, size_t vlen)
{
	struct mp_trace *t = p->t;
	struct trace_meta *m;
	char buf[32];

	for (uint32_t i = 0; i < t->nmeta; i++)
		if (field_is(key, klen, t->meta[i].key))
			return perr(p, "metadata '%s' is given twice", t->meta[i].key);
	if (t->nmeta == TRACE_MAX_META)
		return perr(p, "more than %u metadata lines", TRACE_MAX_META);
	for (unsigned i = 0; i < META_NUM_COUNT; i++) {
		if (!field_is(key, klen, meta_nums[i].key))
			continue;
		if (!parse_u32(val, vlen, &p->meta_val[i]) || p->meta_val[i] < meta_nums[i].lo ||
		    p->meta_val[i] > meta_nums[i].hi)
			return perr(p, "metadata %s = '%s' is not a number in [%u, %u]",
				    meta_nums[i].key, show(val, vlen, buf), meta_nums[i].lo,
				    meta_nums[i].hi);
		p->meta_line[i] = p->line;
	}
	m = realloc(t->meta, (t->nmeta + 1) * sizeof(*m));
	if (!m)
		return mp_err(-ENOMEM, "%s:%" PRIu64 ": out of memory", p->name, p->line);
	t->meta = m;
	m += t->nmeta;
	m->key = strndup(key, klen);
	m->value = strndup(val, vlen);
	if (!m->key || !m->value) {
		free(m->key);
		free(m->value);
		return mp_err(-ENOMEM, "%s:%" PRIu64 ": out of memory", p->name, p->line);
	}
	t->nmeta++;
	return 0;
}

/* "# key=value" is metadata; any other '#' line is a comment. */
static int parse_meta(struct parser *p, const char *s, size_t len)
{
	const char *end = s + len, *key = s + 1, *eq, *val;
	size_t klen, vlen;

	eq = memchr(key, '=', (size_t)(end - key));
	if (!eq)
		return 0;
	klen = (size_t)(eq - key);
	trim(&key, &klen);
	val = eq + 1;
	vlen = (size_t)(end - val);
	trim(&val, &vlen);
	if (!klen)
		return 0;
	for (size_t i = 0; i < klen; i++)
		if (!is_key_char(key[i]))
			return 0;
	return add_meta(p, key, klen, val, vlen);
}

/*
 * Header
 */

/* Splits "e12" into its letter and index; false for anything else. */
static bool column_index(const char *s, size_t len, char *letter, uint32_t *idx)
{
	if (len < 2 || len > 6)
		return false;
	*letter = s[0];
	return parse_u32(s + 1, len - 1, idx) && (len == 2 || s[1] != '0');
}

static int check_meta(struct parser *p)
{
	static const enum meta_num required[] = { META_LAYERS, META_EXPERTS, META_TOPK };

	for (unsigned i = 0; i < MP_ARRAY_SIZE(required); i++)
		if (!p->meta_line[required[i]])
			return perr(p, "missing metadata '%s' (a '# %s=N' line must come before "
				    "the header)", meta_nums[required[i]].key,
				    meta_nums[required[i]].key);
	if (p->meta_val[META_TOPK] > p->meta_val[META_EXPERTS])
		return perr_at(p, p->meta_line[META_TOPK], "metadata topk=%u exceeds experts=%u",
			       p->meta_val[META_TOPK], p->meta_val[META_EXPERTS]);
	p->t->layers = p->meta_val[META_LAYERS];
	p->t->experts = p->meta_val[META_EXPERTS];
	p->t->topk = p->meta_val[META_TOPK];
	return 0;
}

/*
 * request,token,layer,e0..e{k-1}[,w0..w{k-1}][,p0..p{E-1}]: the groups in
 * this order, each numbered from 0.
 */
static int parse_header(struct parser *p, const char *s, size_t len)
{
	static const char *const fixed[] = { "request", "token", "layer" };
	static const char groups[] = "ewp";
	uint32_t count[3] = { 0 }, col = 0, idx;
	unsigned g = 0;
	const char *end = s + len;
	char buf[32], letter;
	int err;

	if (!len)
		return perr(p, "empty line where the header should be");
	if (s[0] >= '0' && s[0] <= '9')
		return perr(p, "missing header: expected 'request,token,layer,e0,...' before the "
			    "first row");
	err = check_meta(p);
	if (err)
		return err;
	for (;;) {
		const char *comma = memchr(s, ',', (size_t)(end - s));
		size_t flen = (size_t)((comma ? comma : end) - s);

		col++;
		if (col <= MP_ARRAY_SIZE(fixed)) {
			if (!field_is(s, flen, fixed[col - 1]))
				return perr(p, "header: column %u is '%s', expected '%s'", col,
					    show(s, flen, buf), fixed[col - 1]);
		} else {
			const char *at;

			if (!column_index(s, flen, &letter, &idx) ||
			    !(at = memchr(groups, letter, 3)))
				return perr(p, "header: unknown column '%s' (column %u)",
					    show(s, flen, buf), col);
			if ((unsigned)(at - groups) < g)
				return perr(p, "header: column '%s' comes after the '%c' columns",
					    show(s, flen, buf), groups[g]);
			g = (unsigned)(at - groups);
			if (idx != count[g])
				return perr(p, "header: column %u is '%s', expected '%c%u'", col,
					    show(s, flen, buf), letter, count[g]);
			count[g]++;
		}
		if (!comma)
			break;
		s = comma + 1;
	}
	if (col < MP_ARRAY_SIZE(fixed))
		return perr(p, "header: %u columns, expected 'request,token,layer,e0,...'", col);
	if (count[0] != p->t->topk)
		return perr(p, "header has %u expert columns (e0...) but metadata says topk=%u "
			    "(line %" PRIu64 ")", count[0], p->t->topk, p->meta_line[META_TOPK]);
	if (count[1] && count[1] != count[0])
		return perr(p, "header has %u weight columns (w0...), expected %u (one per expert "
			    "column) or none", count[1], count[0]);
	if (count[2] && count[2] != p->t->experts)
		return perr(p, "header has %u probability columns (p0...) but metadata says "
			    "experts=%u (line %" PRIu64 ")", count[2], p->t->experts,
			    p->meta_line[META_EXPERTS]);
	p->ncols = col;
	p->has_weights = count[1] != 0;
	p->has_probs = count[2] != 0;
	p->seen = calloc(p->t->experts, sizeof(*p->seen));
	if (!p->seen)
		return mp_err(-ENOMEM, "%s:%" PRIu64 ": out of memory", p->name, p->line);
	p->stage = STAGE_ROWS;
	return 0;
}

/*
 * Rows
 */

static int grow_rows(struct parser *p)
{
	struct mp_trace *t = p->t;
	uint64_t cap = p->cap_rows ? p->cap_rows * 2 : TRACE_INIT_ROWS;
	size_t per_row = MP_MAX(t->topk, t->experts) * sizeof(float);
	void *n;

	if (cap > SIZE_MAX / per_row)
		goto nomem;
	n = realloc(t->ids, cap * t->topk * sizeof(*t->ids));
	if (!n)
		goto nomem;
	t->ids = n;
	if (p->has_weights) {
		n = realloc(t->weights, cap * t->topk * sizeof(*t->weights));
		if (!n)
			goto nomem;
		t->weights = n;
	}
	if (p->has_probs) {
		n = realloc(t->probs, cap * t->experts * sizeof(*t->probs));
		if (!n)
			goto nomem;
		t->probs = n;
	}
	p->cap_rows = cap;
	return 0;
nomem:
	return mp_err(-ENOMEM, "%s:%" PRIu64 ": out of memory for %" PRIu64 " rows", p->name,
		      p->line, cap);
}

static int add_request(struct parser *p)
{
	struct mp_trace *t = p->t;

	if (t->requests == p->cap_requests) {
		uint32_t cap = p->cap_requests ? p->cap_requests * 2 : TRACE_INIT_REQUESTS;
		uint32_t *tokens;
		uint64_t *first;

		if (cap <= p->cap_requests)
			goto nomem;
		tokens = realloc(t->tokens, cap * sizeof(*tokens));
		if (!tokens)
			goto nomem;
		t->tokens = tokens;
		first = realloc(t->first_row, cap * sizeof(*first));
		if (!first)
			goto nomem;
		t->first_row = first;
		p->cap_requests = cap;
	}
	t->tokens[t->requests] = 0;
	t->first_row[t->requests] = t->rows;
	t->requests++;
	return 0;
nomem:
	return mp_err(-ENOMEM, "%s:%" PRIu64 ": out of memory", p->name, p->line);
}

static int missing_layers(struct parser *p, uint64_t line)
{
	uint32_t from = p->layer + 1, to = p->t->layers - 1;

	if (from == to)
		return perr_at(p, line, "request %u token %u: layer %u is missing", p->req, p->tok,
			       from);
	return perr_at(p, line, "request %u token %u: layers %u-%u are missing", p->req, p->tok,
		       from, to);
}

/* Rows come request by request, token by token, with layers 0..L-1 of each token. */
static int check_position(struct parser *p, uint32_t r, uint32_t tok, uint32_t l)
{
	const uint32_t L = p->t->layers;

	if (l >= L)
		return perr(p, "layer %u is out of range (layers=%u, line %" PRIu64 ")", l, L,
			    p->meta_line[META_LAYERS]);
	if (!p->t->rows) {
		if (r != 0)
			return perr(p, "the first row is request %u, expected request 0", r);
		if (tok != 0)
			return perr(p, "request 0 starts at token %u, expected token 0", tok);
	} else if (p->layer + 1 < L) {
		if (r != p->req || tok != p->tok)
			return missing_layers(p, p->line);
		if (l > p->layer + 1)
			return perr(p, "request %u token %u: layer %u is missing (found layer %u)",
				    r, tok, p->layer + 1, l);
		if (l != p->layer + 1)
			return perr(p, "request %u token %u: layer %u repeated or out of order "
				    "(expected layer %u)", r, tok, l, p->layer + 1);
		return 0;
	} else if (r == p->req) {
		if (tok != p->tok + 1)
			return perr(p, "request %u: token %u follows token %u (tokens must be "
				    "consecutive)", r, tok, p->tok);
	} else if (r == p->req + 1) {
		if (tok != 0)
			return perr(p, "request %u starts at token %u, expected token 0", r, tok);
	} else {
		return perr(p, "request %u follows request %u (requests must be consecutive)", r,
			    p->req);
	}
	if (l != 0)
		return perr(p, "request %u token %u starts at layer %u: layer 0 is missing", r,
			    tok, l);
	return 0;
}

/* Walks the fields of a row whose column count is already checked. */
struct fields {
	const char *next;
	const char *end;
};

static void next_field(struct fields *it, const char **f, size_t *flen)
{
	const char *c = memchr(it->next, ',', (size_t)(it->end - it->next));

	*f = it->next;
	*flen = (size_t)((c ? c : it->end) - it->next);
	it->next = c ? c + 1 : it->end;
}

static int parse_weights(struct parser *p, struct fields *it, char letter, float *v, uint32_t n)
{
	const char *f;
	size_t flen;
	char buf[32];

	for (uint32_t i = 0; i < n; i++) {
		next_field(it, &f, &flen);
		if (!parse_float(p, f, flen, &v[i]))
			return perr(p, "%c%u '%s' is not a number", letter, i, show(f, flen, buf));
		if (v[i] < 0.0f)
			return perr(p, "%c%u = %s is negative", letter, i, show(f, flen, buf));
	}
	return 0;
}

static int parse_ids(struct parser *p, struct fields *it, uint32_t *ids)
{
	const struct mp_trace *t = p->t;
	const uint64_t stamp = t->rows + 1;
	const char *f;
	size_t flen;
	char buf[32];

	for (uint32_t i = 0; i < t->topk; i++) {
		next_field(it, &f, &flen);
		if (!parse_u32(f, flen, &ids[i]))
			return perr(p, "e%u '%s' is not an expert id", i, show(f, flen, buf));
		if (ids[i] >= t->experts)
			return perr(p, "e%u = %u is out of range (experts=%u, line %" PRIu64 ")",
				    i, ids[i], t->experts, p->meta_line[META_EXPERTS]);
		if (p->seen[ids[i]] == stamp) {
			uint32_t j = 0;

			while (ids[j] != ids[i])
				j++;
			return perr(p, "e%u = %u repeats e%u (an expert is selected once per "
				    "row)", i, ids[i], j);
		}
		p->seen[ids[i]] = stamp;
	}
	return 0;
}

static int parse_row(struct parser *p, const char *s, size_t len)
{
	static const char *const names[] = { "request", "token", "layer" };
	struct mp_trace *t = p->t;
	struct fields it = { s, s + len };
	uint32_t pos[3], ncols = 1;
	const char *f;
	size_t flen;
	char buf[32];
	int err;

	if (!len)
		return perr(p, "empty line");
	if (s[0] == '#')
		return perr(p, "metadata line after the header (metadata must come before it)");
	for (const char *c = s; (c = memchr(c, ',', (size_t)(it.end - c))); c++)
		ncols++;
	if (ncols != p->ncols)
		return perr(p, "expected %u columns, found %u", p->ncols, ncols);
	if (t->rows == p->cap_rows && (err = grow_rows(p)))
		return err;

	for (unsigned i = 0; i < 3; i++) {
		next_field(&it, &f, &flen);
		if (!parse_u32(f, flen, &pos[i]))
			return perr(p, "%s '%s' is not a non-negative integer", names[i],
				    show(f, flen, buf));
	}
	err = check_position(p, pos[0], pos[1], pos[2]);
	if (err)
		return err;
	err = parse_ids(p, &it, t->ids + t->rows * t->topk);
	if (!err && p->has_weights)
		err = parse_weights(p, &it, 'w', t->weights + t->rows * t->topk, t->topk);
	if (!err && p->has_probs)
		err = parse_weights(p, &it, 'p', t->probs + t->rows * t->experts, t->experts);
	if (err)
		return err;

	if (!t->rows || pos[0] != p->req) {
		err = add_request(p);
		if (err)
			return err;
	}
	t->tokens[pos[0]] = pos[1] + 1;
	t->rows++;
	p->req = pos[0];
	p->tok = pos[1];
	p->layer = pos[2];
	p->last_row_line = p->line;
	return 0;
}

static int parse_line(struct parser *p, const char *s, size_t len)
{
	if (len && s[len - 1] == '\r')
		len--;
	switch (p->stage) {
	case STAGE_MAGIC:
		return parse_magic(p, s, len);
	case STAGE_META:
		if (len && s[0] == '#')
			return parse_meta(p, s, len);
		return parse_header(p, s, len);
	case STAGE_ROWS:
		return parse_row(p, s, len);
	}
	return -EINVAL;
}

/*
 * Parses every complete line of buf; with eof, also a last line without
 * '\n'. Sets *used to the bytes consumed.
 */
static int parse_lines(struct parser *p, const char *buf, size_t len, bool eof, size_t *used)
{
	const char *s = buf, *end = buf + len;
	int err;

	while (s < end) {
		const char *nl = memchr(s, '\n', (size_t)(end - s));

		if (!nl && !eof)
			break;
		p->line++;
		err = parse_line(p, s, (size_t)((nl ? nl : end) - s));
		if (err)
			return err;
		s = nl ? nl + 1 : end;
	}
	*used = (size_t)(s - buf);
	return 0;
}

/* Checks what can only be checked at the end of the file. */
static int parse_finish(struct parser *p, uint64_t total_bytes)
{
	struct mp_trace *t = p->t;

	if (!total_bytes)
		return perr_at(p, 1, "empty file");
	switch (p->stage) {
	case STAGE_MAGIC:
	case STAGE_META:
		return perr(p, "missing header: the file ends before 'request,token,layer,e0,...'");
	case STAGE_ROWS:
		break;
	}
	if (!t->rows)
		return perr(p, "no rows after the header");
	if (p->layer + 1 < t->layers)
		return missing_layers(p, p->last_row_line);
	if (p->meta_line[META_REQUESTS] && p->meta_val[META_REQUESTS] != t->requests)
		return perr_at(p, p->meta_line[META_REQUESTS], "metadata says requests=%u but the "
			       "rows hold %u requests", p->meta_val[META_REQUESTS], t->requests);
	return 0;
}

static int parser_init(struct parser *p, const char *name)
{
	memset(p, 0, sizeof(*p));
	p->name = name ? name : "<memory>";
	p->t = calloc(1, sizeof(*p->t));
	if (!p->t)
		return mp_err(-ENOMEM, "%s: out of memory", p->name);
	p->c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
	if (!p->c_locale) {
		free(p->t);
		return mp_err(-ENOMEM, "%s: cannot create the C locale", p->name);
	}
	return 0;
}

/* Hands the trace over on success (arrays trimmed to size), frees it on failure. */
static int parser_fini(struct parser *p, int err, struct mp_trace **out)
{
	struct mp_trace *t = p->t;

	free(p->seen);
	freelocale(p->c_locale);
	if (err) {
		mp_trace_close(t);
		return err;
	}
	/* Shrinking cannot fail in practice; keep the larger block if it does. */
	if (t->rows < p->cap_rows) {
		void *n = realloc(t->ids, t->rows * t->topk * sizeof(*t->ids));

		if (n)
			t->ids = n;
		if (t->weights && (n = realloc(t->weights, t->rows * t->topk * sizeof(float))))
			t->weights = n;
		if (t->probs && (n = realloc(t->probs, t->rows * t->experts * sizeof(float))))
			t->probs = n;
	}
	*out = t;
	return 0;
}

int mp_trace_parse(const char *buf, size_t len, const char *name, struct mp_trace **out)
{
	struct parser p;
	size_t used;
	int err;

	if (!out || (!buf && len))
		return mp_err(-EINVAL, "trace: NULL argument");
	*out = NULL;
	err = parser_init(&p, name);
	if (err)
		return err;
	err = parse_lines(&p, buf, len, true, &used);
	if (!err)
		err = parse_finish(&p, len);
	return parser_fini(&p, err, out);
}

/*
 * Streams the file through a fixed buffer with read(): a file truncated
 * under us cannot fault the reader (as an mmap would), and memory stays
 * bounded by the parsed arrays.
 */
int mp_trace_open(const char *path, struct mp_trace **out)
{
	uint64_t total = 0;
	size_t have = 0, used;
	struct parser p;
	char *buf;
	int fd, err;

	if (!path || !out)
		return mp_err(-EINVAL, "trace: NULL argument");
	*out = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		return mp_err(err, "%s: cannot open: %s", path, strerror(-err));
	}
	buf = malloc(TRACE_BUF_BYTES);
	if (!buf) {
		err = mp_err(-ENOMEM, "%s: out of memory", path);
		goto close_fd;
	}
	err = parser_init(&p, path);
	if (err)
		goto free_buf;
	for (;;) {
		ssize_t n = read(fd, buf + have, TRACE_BUF_BYTES - have);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			err = -errno;
			mp_err(err, "%s: read failed after line %" PRIu64 ": %s", path, p.line,
			       strerror(-err));
			break;
		}
		total += (uint64_t)n;
		have += (size_t)n;
		err = parse_lines(&p, buf, have, n == 0, &used);
		if (err || n == 0)
			break;
		memmove(buf, buf + used, have - used);
		have -= used;
		if (have == TRACE_BUF_BYTES) {
			p.line++;
			/* Megabytes without a newline are more likely not a trace at all. */
			if (p.stage == STAGE_MAGIC && (err = parse_magic(&p, buf, have)))
				break;
			err = perr(&p, "line longer than %u bytes", TRACE_BUF_BYTES);
			break;
		}
	}
	if (!err)
		err = parse_finish(&p, total);
	err = parser_fini(&p, err, out);
free_buf:
	free(buf);
close_fd:
	close(fd);
	return err;
}

void mp_trace_close(struct mp_trace *t)
{
	if (!t)
		return;
	for (uint32_t i = 0; i < t->nmeta; i++) {
		free(t->meta[i].key);
		free(t->meta[i].value);
	}
	free(t->meta);
	free(t->tokens);
	free(t->first_row);
	free(t->ids);
	free(t->weights);
	free(t->probs);
	free(t);
}

/*
 * Queries
 */

uint32_t mp_trace_layers(const struct mp_trace *t)
{
	return t->layers;
}

uint32_t mp_trace_experts(const struct mp_trace *t)
{
	return t->experts;
}

uint32_t mp_trace_topk(const struct mp_trace *t)
{
	return t->topk;
}

uint32_t mp_trace_requests(const struct mp_trace *t)
{
	return t->requests;
}

uint32_t mp_trace_tokens(const struct mp_trace *t, uint32_t request)
{
	return request < t->requests ? t->tokens[request] : 0;
}

bool mp_trace_has_weights(const struct mp_trace *t)
{
	return t->weights != NULL;
}

const char *mp_trace_meta(const struct mp_trace *t, const char *key)
{
	for (uint32_t i = 0; key && i < t->nmeta; i++)
		if (!strcmp(t->meta[i].key, key))
			return t->meta[i].value;
	return NULL;
}

/* The trace's name for messages. */
static const char *name_of(const struct mp_trace *t)
{
	return mp_trace_meta(t, "name") ?: "(unnamed)";
}

int mp_trace_token_ids(const struct mp_trace *t, uint32_t r, uint32_t *ids)
{
	const char *name = name_of(t);
	char key[32];
	const char *s;
	uint32_t n = 0;

	if (!ids || r >= t->requests)
		return mp_err(-EINVAL, "trace %s: token ids of request %u: %s", name, r,
			      ids ? "no such request" : "no buffer");
	snprintf(key, sizeof(key), "tokens.%u", r);
	s = mp_trace_meta(t, key);
	if (!s)
		return mp_err(-ENOENT, "trace %s: request %u has no %s metadata", name, r, key);
	for (;;) {
		unsigned long long v;
		char *end;

		while (*s == ' ' || *s == '\t')
			s++;
		if (!*s)
			break;
		errno = 0;
		v = strtoull(s, &end, 10);
		if (*s < '0' || *s > '9' || end == s || errno || v > UINT32_MAX ||
		    (*end && *end != ' ' && *end != '\t'))
			return mp_err(-EINVAL, "trace %s: %s: '%.20s' is not a token id", name,
				      key, s);
		if (n == t->tokens[r])
			return mp_err(-EINVAL, "trace %s: %s lists more ids than the request's "
				      "%u tokens", name, key, t->tokens[r]);
		ids[n++] = (uint32_t)v;
		s = end;
	}
	if (n != t->tokens[r])
		return mp_err(-EINVAL, "trace %s: %s lists %u ids for the request's %u tokens",
			      name, key, n, t->tokens[r]);
	return 0;
}

/* Row index of a position, or -1 when it is outside the trace. */
static int64_t row_of(const struct mp_trace *t, uint32_t request, uint32_t token, uint32_t layer)
{
	if (request >= t->requests || token >= t->tokens[request] || layer >= t->layers)
		return -1;
	return (int64_t)(t->first_row[request] + (uint64_t)token * t->layers + layer);
}

int mp_trace_route(const struct mp_trace *t, uint32_t request, uint32_t token, uint32_t layer,
		   const uint32_t **ids, const float **weights)
{
	int64_t row = row_of(t, request, token, layer);

	if (row < 0)
		return mp_err(-ERANGE, "trace: request %u token %u layer %u is outside the trace "
			      "(%u requests, %u layers)", request, token, layer, t->requests,
			      t->layers);
	if (ids)
		*ids = t->ids + (uint64_t)row * t->topk;
	if (weights)
		*weights = t->weights ? t->weights + (uint64_t)row * t->topk : NULL;
	return 0;
}

const float *mp_trace_probs(const struct mp_trace *t, uint32_t request, uint32_t token,
			    uint32_t layer)
{
	int64_t row = row_of(t, request, token, layer);

	if (row < 0 || !t->probs)
		return NULL;
	return t->probs + (uint64_t)row * t->experts;
}

int mp_trace_check_geometry(const struct mp_trace *t, const struct mp_geometry *g)
{
	if (!g)
		return mp_err(-EINVAL, "trace: NULL geometry");
	if (t->layers != g->layers || t->experts != g->experts || t->topk != g->topk)
		return mp_err(-EINVAL, "trace %s has %u layers x %u experts, top-%u; the model has "
			      "%u layers x %u experts, top-%u", name_of(t),
			      t->layers, t->experts, t->topk, g->layers, g->experts, g->topk);
	return 0;
}
