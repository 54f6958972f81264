// SPDX-License-Identifier: MIT
/* SentencePiece unigram tokenizer: vocabulary file, Viterbi encoding, decoding. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/tokenizer.h>

#include "base/base.h"

#define TOK_MAGIC	"# moepager-spm-unigram v1"
#define TOK_MAX_PIECE	256u		/* bytes of the longest piece we accept */
#define TOK_MAX_TEXT	(256u << 20)
/* SentencePiece's penalty for an unknown character (unigram_model.h: kUnkPenalty). */
#define TOK_UNK_PENALTY	10.0f

/* U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's escaped space. */
static const char SPACE_SYMBOL[] = "\xe2\x96\x81";
static const char REPLACEMENT[] = "\xef\xbf\xbd";	/* U+FFFD */
static const char UNK_SURFACE[] = " \xe2\x81\x87 ";	/* " ⁇ " */

enum piece_type {
	PIECE_NORMAL,
	PIECE_UNKNOWN,
	PIECE_CONTROL,
	PIECE_USER,
	PIECE_UNUSED,
	PIECE_BYTE,
};

_Static_assert(PIECE_NORMAL + 1 == MP_PIECE_NORMAL && PIECE_USER + 1 == MP_PIECE_USER &&
	       PIECE_BYTE + 1 == MP_PIECE_BYTE, "the public piece types are these plus one");

static const char *const piece_type_names[] = {
	[PIECE_NORMAL] = "normal", [PIECE_UNKNOWN] = "unknown", [PIECE_CONTROL] = "control",
	[PIECE_USER] = "user", [PIECE_UNUSED] = "unused", [PIECE_BYTE] = "byte",
};

struct piece {
	uint32_t off;		/* into mp_tokenizer.bytes */
	uint32_t len;
	float score;
	enum piece_type type;
	uint8_t byte;		/* the value of a byte piece */
};

struct mp_tokenizer {
	uint32_t n;
	struct piece *pieces;
	char *bytes;
	/* Open addressing: id + 1 of each piece the segmentation may use, 0 = empty. */
	uint32_t *table;
	uint32_t table_mask;
	uint32_t max_len;
	uint32_t unk, bos, eos;
	uint32_t byte_id[256];
	float min_score, max_score;
};

#define FNV_BASIS 2166136261u

/* FNV-1a, one byte on: a prefix's hash extends to the next length in one step. */
static uint32_t hash_step(uint32_t h, char c)
{
	return (h ^ (uint8_t)c) * 16777619u;
}

static uint32_t hash_bytes(const char *s, uint32_t len)
{
	uint32_t h = FNV_BASIS;

	for (uint32_t i = 0; i < len; i++)
		h = hash_step(h, s[i]);
	return h;
}

/* Piece id of these bytes (of hash h) among the matchable pieces, or UINT32_MAX. */
static uint32_t lookup_hashed(const struct mp_tokenizer *t, const char *s, uint32_t len,
			      uint32_t h)
{
	for (uint32_t i = h & t->table_mask;; i = (i + 1) & t->table_mask) {
		uint32_t v = t->table[i];
		const struct piece *p;

		if (!v)
			return UINT32_MAX;
		p = &t->pieces[v - 1];
		if (p->len == len && !memcmp(t->bytes + p->off, s, len))
			return v - 1;
	}
}

static uint32_t lookup(const struct mp_tokenizer *t, const char *s, uint32_t len)
{
	return lookup_hashed(t, s, len, hash_bytes(s, len));
}

/* Length of the valid UTF-8 character at s (n bytes left), or 0 when malformed. */
static uint32_t utf8_len(const uint8_t *s, size_t n)
{
	uint32_t len, cp;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		len = 2, cp = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		len = 3, cp = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		len = 4, cp = s[0] & 0x07;
	else
		return 0;
	if (n < len)
		return 0;
	for (uint32_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	/* Overlong forms, surrogates and code points past U+10FFFF. */
	if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

static int hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Parses "# pieces=N unk=U bos=B eos=E ..." (unknown keys are ignored). */
static int parse_meta(struct mp_tokenizer *t, const char *line, uint32_t *pieces)
{
	static const char *const keys[] = { "pieces=", "unk=", "bos=", "eos=" };
	uint32_t *dst[] = { pieces, &t->unk, &t->bos, &t->eos };

	for (size_t k = 0; k < MP_ARRAY_SIZE(keys); k++) {
		const char *p = strstr(line, keys[k]);
		char *end;
		unsigned long v;

		if (!p)
			return -EINVAL;
		errno = 0;
		v = strtoul(p + strlen(keys[k]), &end, 10);
		if (errno || v >= UINT32_MAX || (*end && *end != ' '))
			return -EINVAL;
		*dst[k] = (uint32_t)v;
	}
	return 0;
}

static int parse_piece(struct mp_tokenizer *t, char *line, uint32_t id, size_t *bytes_used)
{
	struct piece *p = &t->pieces[id];
	char *save = NULL, *f_id, *f_type, *f_score, *f_hex, *end;
	size_t hexlen;
	unsigned long v;

	f_id = strtok_r(line, " ", &save);
	f_type = strtok_r(NULL, " ", &save);
	f_score = strtok_r(NULL, " ", &save);
	f_hex = strtok_r(NULL, " ", &save);
	if (!f_hex || strtok_r(NULL, " ", &save))
		return -EINVAL;
	errno = 0;
	v = strtoul(f_id, &end, 10);
	if (errno || *end || v != id)
		return -EINVAL;
	p->type = MP_ARRAY_SIZE(piece_type_names);
	for (size_t i = 0; i < MP_ARRAY_SIZE(piece_type_names); i++)
		if (!strcmp(f_type, piece_type_names[i]))
			p->type = i;
	if (p->type == MP_ARRAY_SIZE(piece_type_names))
		return -EINVAL;
	errno = 0;
	p->score = strtof(f_score, &end);
	if (errno || *end)
		return -EINVAL;
	hexlen = strlen(f_hex);
	if (!hexlen || hexlen % 2 || hexlen / 2 > TOK_MAX_PIECE)
		return -EINVAL;
	p->off = *bytes_used;
	p->len = hexlen / 2;
	for (size_t i = 0; i < p->len; i++) {
		int hi = hex_value(f_hex[2 * i]), lo = hex_value(f_hex[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -EINVAL;
		t->bytes[p->off + i] = (char)(hi << 4 | lo);
	}
	*bytes_used += p->len;
	return 0;
}

/* Byte pieces are spelled "<0xAB>"; fills byte_id[0xAB]. */
static int index_byte_piece(struct mp_tokenizer *t, uint32_t id)
{
	const struct piece *p = &t->pieces[id];
	const char *s = t->bytes + p->off;
	int hi, lo;

	if (p->len != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
		return -EINVAL;
	hi = hex_value(s[3]);
	lo = hex_value(s[4]);
	if (hi < 0 || lo < 0 || t->byte_id[hi << 4 | lo] != UINT32_MAX)
		return -EINVAL;
	t->byte_id[hi << 4 | lo] = id;
	t->pieces[id].byte = (uint8_t)(hi << 4 | lo);
	return 0;
}

static int build_table(struct mp_tokenizer *t, const char *path)
{
	uint32_t size = 16;

	while (size < 2 * t->n)
		size *= 2;
	t->table = calloc(size, sizeof(*t->table));
	if (!t->table)
		return mp_err(-ENOMEM, "tokenizer %s: out of memory", path);
	t->table_mask = size - 1;
	t->min_score = FLT_MAX;
	/* SentencePiece starts its maximum at FLT_MIN, not -FLT_MAX (unigram_model.cc). */
	t->max_score = FLT_MIN;
	for (uint32_t id = 0; id < t->n; id++) {
		const struct piece *p = &t->pieces[id];
		const char *s = t->bytes + p->off;
		uint32_t i;

		if (p->type == PIECE_NORMAL) {
			t->min_score = MP_MIN(t->min_score, p->score);
			t->max_score = MP_MAX(t->max_score, p->score);
		}
		/* Only these are in SentencePiece's trie; unused ones match but are skipped. */
		if (p->type != PIECE_NORMAL && p->type != PIECE_USER && p->type != PIECE_UNUSED)
			continue;
		if (lookup(t, s, p->len) != UINT32_MAX)
			return mp_err(-EINVAL, "tokenizer %s: piece %u repeats piece %u", path, id,
				      lookup(t, s, p->len));
		for (i = hash_bytes(s, p->len) & t->table_mask; t->table[i];
		     i = (i + 1) & t->table_mask)
			;
		t->table[i] = id + 1;
		t->max_len = MP_MAX(t->max_len, p->len);
	}
	return 0;
}

/* Parsing state of a vocabulary file. */
struct tok_parser {
	struct mp_tokenizer *t;
	const char *path;
	size_t file_len;
	uint32_t lineno;
	uint32_t pieces;	/* from the metadata line; 0 until it is read */
	uint32_t next_id;
	size_t bytes_used;
};

static int parse_meta_line(struct tok_parser *p, const char *line)
{
	struct mp_tokenizer *t = p->t;

	if (parse_meta(t, line, &p->pieces) || !p->pieces || p->pieces > MP_MAX_VOCAB)
		return mp_err(-EINVAL, "tokenizer %s:%u: bad metadata line", p->path, p->lineno);
	t->pieces = calloc(p->pieces, sizeof(*t->pieces));
	/* A piece is half its hex field: the file's length bounds all of them. */
	t->bytes = malloc(p->file_len);
	if (!t->pieces || !t->bytes)
		return mp_err(-ENOMEM, "tokenizer %s: out of memory", p->path);
	t->n = p->pieces;
	return 0;
}

static int parse_line(struct tok_parser *p, char *line)
{
	struct mp_tokenizer *t = p->t;
	uint32_t id = p->next_id;

	if (p->lineno == 1) {
		if (strcmp(line, TOK_MAGIC))
			return mp_err(-EPROTO, "tokenizer %s:1: not a moepager-spm-unigram v1 "
				      "vocabulary", p->path);
		return 0;
	}
	if (line[0] == '#') {
		/* The first "pieces=" line is the metadata; other '#' lines are comments. */
		if (p->pieces || !strstr(line, "pieces="))
			return 0;
		return parse_meta_line(p, line);
	}
	if (!p->pieces || id >= p->pieces)
		return mp_err(-EINVAL, "tokenizer %s:%u: %s", p->path, p->lineno, !p->pieces ?
			      "piece before the metadata line" : "more pieces than pieces=");
	if (parse_piece(t, line, id, &p->bytes_used) ||
	    (t->pieces[id].type == PIECE_BYTE && index_byte_piece(t, id)))
		return mp_err(-EINVAL, "tokenizer %s:%u: malformed piece %u (want \"id type "
			      "score hex\")", p->path, p->lineno, id);
	p->next_id++;
	return 0;
}

static int check_complete(const struct tok_parser *p)
{
	const struct mp_tokenizer *t = p->t;

	if (!p->pieces || p->next_id != p->pieces)
		return mp_err(-EINVAL, "tokenizer %s: %u pieces, metadata says %u", p->path,
			      p->next_id, p->pieces);
	if (t->unk >= t->n || t->bos >= t->n || t->eos >= t->n ||
	    t->pieces[t->unk].type != PIECE_UNKNOWN)
		return mp_err(-EINVAL, "tokenizer %s: unk/bos/eos ids %u/%u/%u are not valid "
			      "pieces", p->path, t->unk, t->bos, t->eos);
	for (uint32_t b = 0; b < 256; b++)
		if (t->byte_id[b] == UINT32_MAX)
			return mp_err(-EINVAL, "tokenizer %s: no byte piece <0x%02X> (byte "
				      "fallback needs all 256)", p->path, b);
	return 0;
}

int mp_tokenizer_open(const char *path, struct mp_tokenizer **out)
{
	struct tok_parser p = { .path = path };
	char *buf = NULL, *line, *next;
	int err;

	if (!path || !out)
		return mp_err(-EINVAL, "tokenizer open: NULL %s", !path ? "path" : "out");
	err = mp_read_file("tokenizer", path, &buf, &p.file_len);
	if (err)
		return err;
	p.t = calloc(1, sizeof(*p.t));
	if (!p.t) {
		err = mp_err(-ENOMEM, "tokenizer %s: out of memory", path);
		goto free_buf;
	}
	memset(p.t->byte_id, 0xff, sizeof(p.t->byte_id));
	for (line = buf; !err && line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		p.lineno++;
		err = parse_line(&p, line);
	}
	if (!err)
		err = check_complete(&p);
	if (!err)
		err = build_table(p.t, path);
	if (err)
		goto free_tok;
	free(buf);
	*out = p.t;
	return 0;

free_tok:
	mp_tokenizer_close(p.t);
free_buf:
	free(buf);
	return err;
}

void mp_tokenizer_close(struct mp_tokenizer *t)
{
	if (!t)
		return;
	free(t->table);
	free(t->bytes);
	free(t->pieces);
	free(t);
}

uint32_t mp_tokenizer_vocab(const struct mp_tokenizer *t)
{
	return t->n;
}

int mp_tokenizer_piece(const struct mp_tokenizer *t, uint32_t id, struct mp_piece *out)
{
	const struct piece *p;

	if (!t || !out || id >= t->n)
		return mp_err(-EINVAL, "tokenizer: piece %u is outside a vocabulary of %u", id,
			      t ? t->n : 0);
	p = &t->pieces[id];
	*out = (struct mp_piece){
		.text = t->bytes + p->off, .len = p->len, .score = p->score,
		/* the file's order of types is SentencePiece's, from 1 */
		.type = (enum mp_piece_type)(p->type + 1),
	};
	return 0;
}

uint32_t mp_tokenizer_bos(const struct mp_tokenizer *t)
{
	return t->bos;
}

uint32_t mp_tokenizer_eos(const struct mp_tokenizer *t)
{
	return t->eos;
}

/*
 * The identity normalizer: a dummy-prefix space, every space escaped to
 * U+2581, malformed UTF-8 bytes replaced by U+FFFD. Returns the length.
 */
static size_t normalize(const char *text, size_t len, char *out)
{
	size_t o = 0;

	memcpy(out, SPACE_SYMBOL, 3);
	o += 3;
	for (size_t i = 0; i < len;) {
		uint32_t n = utf8_len((const uint8_t *)text + i, len - i);

		if (!n) {
			memcpy(out + o, REPLACEMENT, 3);
			o += 3;
			i++;
		} else if (text[i] == ' ') {
			memcpy(out + o, SPACE_SYMBOL, 3);
			o += 3;
			i++;
		} else {
			memcpy(out + o, text + i, n);
			o += n;
			i += n;
		}
	}
	return o;
}

struct best_node {
	float score;
	int32_t starts_at;	/* -1: no path ends here yet */
	uint32_t id;
};

static void consider(struct best_node *node, double cand, int32_t starts_at, uint32_t id)
{
	/* Strictly better only: the first (shortest, leftmost) candidate wins ties. */
	if (node->starts_at == -1 || cand > (double)node->score) {
		node->score = (float)cand;
		node->starts_at = starts_at;
		node->id = id;
	}
}

/* SentencePiece's EncodeOptimized: best-scoring segmentation, one lattice pass. */
static void viterbi(const struct mp_tokenizer *t, const char *s, size_t size,
		    struct best_node *best)
{
	const float unk_score = t->min_score - TOK_UNK_PENALTY;

	for (size_t i = 0; i <= size; i++)
		best[i] = (struct best_node){ .score = 0.0f, .starts_at = -1, .id = 0 };
	for (size_t at = 0; at < size;) {
		/* The normalized text is valid UTF-8. */
		const uint32_t mblen = MP_MAX(1u, utf8_len((const uint8_t *)s + at, size - at));
		const float base = best[at].score;
		const uint32_t maxl = (uint32_t)MP_MIN((size_t)t->max_len, size - at);
		uint32_t h = FNV_BASIS;
		bool single = false;

		/* Every length from here: the hash grows with it, not computed afresh. */
		for (uint32_t l = 1; l <= maxl; l++) {
			const struct piece *p;
			double score;
			uint32_t id;

			h = hash_step(h, s[at + l - 1]);
			id = lookup_hashed(t, s + at, l, h);
			if (id == UINT32_MAX)
				continue;
			p = &t->pieces[id];
			if (p->type == PIECE_UNUSED)
				continue;
			/* User-defined symbols get a bonus so they are always chosen. */
			score = p->type == PIECE_USER ? l * t->max_score - 0.1 : p->score;
			consider(&best[at + l], score + base, at, id);
			if (l == mblen)
				single = true;
		}
		if (!single)
			consider(&best[at + mblen], (float)(unk_score + base), at, t->unk);
		at += mblen;
	}
}

int mp_tokenizer_encode(const struct mp_tokenizer *t, const char *text, size_t len,
			uint32_t *ids, size_t cap)
{
	struct best_node *best = NULL;
	char *norm = NULL;
	uint32_t *rev = NULL;
	size_t size, n = 0, out = 0;
	int err = 0;

	if (!t || (!text && len) || (!ids && cap))
		return mp_err(-EINVAL, "tokenizer encode: NULL argument");
	if (len > TOK_MAX_TEXT)
		return mp_err(-EOVERFLOW, "tokenizer encode: %zu bytes of text (at most %u)", len,
			      TOK_MAX_TEXT);
	if (!len)
		return 0;
	norm = malloc(3 * len + 3);
	best = malloc((3 * len + 4) * sizeof(*best));
	if (!norm || !best) {
		err = mp_err(-ENOMEM, "tokenizer encode: out of memory for %zu bytes", len);
		goto free_bufs;
	}
	size = normalize(text, len, norm);
	viterbi(t, norm, size, best);
	/* Backtrack: pieces come out last first; count bytes of unknown ones. */
	for (size_t end = size; end > 0; end = best[end].starts_at)
		n += best[end].id == t->unk ? end - best[end].starts_at : 1;
	rev = malloc(n * sizeof(*rev));
	if (!rev) {
		err = mp_err(-ENOMEM, "tokenizer encode: out of memory for %zu ids", n);
		goto free_bufs;
	}
	for (size_t end = size; end > 0; end = best[end].starts_at) {
		size_t start = best[end].starts_at;

		if (best[end].id != t->unk) {
			rev[out++] = best[end].id;
			continue;
		}
		/* Byte fallback: an unknown character becomes its UTF-8 bytes. */
		for (size_t b = end; b > start; b--)
			rev[out++] = t->byte_id[(uint8_t)norm[b - 1]];
	}
	for (size_t i = 0; i < n && i < cap; i++)
		ids[i] = rev[n - 1 - i];
	err = n > INT32_MAX ? mp_err(-EOVERFLOW, "tokenizer encode: %zu ids", n) : (int)n;
free_bufs:
	free(rev);
	free(best);
	free(norm);
	return err;
}

struct text_out {
	char *buf;
	size_t cap, len;
};

static void put(struct text_out *o, const char *s, size_t n)
{
	if (o->len < o->cap)
		memcpy(o->buf + o->len, s, MP_MIN(n, o->cap - o->len));
	o->len += n;
}

/* Appends bytes that byte pieces spelled, each malformed byte as U+FFFD. */
static void put_bytes(struct text_out *o, const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n;) {
		uint32_t l = utf8_len(b + i, n - i);

		if (!l) {
			put(o, REPLACEMENT, 3);
			i++;
		} else {
			put(o, (const char *)b + i, l);
			i += l;
		}
	}
}

int mp_tokenizer_decode(const struct mp_tokenizer *t, const uint32_t *ids, size_t n, char *buf,
			size_t cap)
{
	struct text_out o = { .buf = buf, .cap = cap ? cap - 1 : 0 };
	bool first = true;
	uint8_t *run;

	if (!t || (!ids && n) || (!buf && cap))
		return mp_err(-EINVAL, "tokenizer decode: NULL argument");
	for (size_t i = 0; i < n; i++)
		if (ids[i] >= t->n)
			return mp_err(-EINVAL, "tokenizer decode: id %u at %zu is outside the "
				      "vocabulary of %u", ids[i], i, t->n);
	run = malloc(n ? n : 1);
	if (!run)
		return mp_err(-ENOMEM, "tokenizer decode: out of memory for %zu ids", n);
	for (size_t i = 0; i < n; i++) {
		const struct piece *p = &t->pieces[ids[i]];
		const char *s = t->bytes + p->off;
		size_t len = p->len, nrun = 0;

		if (p->type == PIECE_BYTE) {
			/* A run of byte pieces spells UTF-8 text (or not: then U+FFFD). */
			while (i < n && t->pieces[ids[i]].type == PIECE_BYTE)
				run[nrun++] = t->pieces[ids[i++]].byte;
			put_bytes(&o, run, nrun);
			first = false;
			i--;
			continue;
		}
		/* Control pieces are invisible and keep the dummy prefix pending. */
		if (p->type == PIECE_CONTROL)
			continue;
		if (p->type == PIECE_UNKNOWN) {
			put(&o, UNK_SURFACE, strlen(UNK_SURFACE));
			first = false;
			continue;
		}
		/* The dummy prefix: the text's first piece loses its leading space. */
		if (first && len >= 3 && !memcmp(s, SPACE_SYMBOL, 3))
			s += 3, len -= 3;
		first = false;
		for (size_t j = 0; j < len;) {
			if (len - j >= 3 && !memcmp(s + j, SPACE_SYMBOL, 3)) {
				put(&o, " ", 1);
				j += 3;
			} else {
				put(&o, s + j, 1);
				j++;
			}
		}
	}
	free(run);
	if (cap)
		buf[MP_MIN(o.len, cap - 1)] = '\0';
	if (o.len > INT32_MAX)
		return mp_err(-EOVERFLOW, "tokenizer decode: %zu bytes of text", o.len);
	return (int)o.len;
}
