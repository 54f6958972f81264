/* SPDX-License-Identifier: MIT */
/*
 * Text <-> token ids for the trained models: a SentencePiece unigram model
 * (identity normalization, dummy prefix, byte fallback) read from the
 * vocabulary file the training recipe exports (tools/train/corpus.py).
 * Encoding gives exactly the ids of SentencePiece's Viterbi segmentation.
 */
#ifndef MOEPAGER_TOKENIZER_H
#define MOEPAGER_TOKENIZER_H

#include <moepager/common.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mp_tokenizer;

/*
 * Reads a vocabulary file ("# moepager-spm-unigram v1", then one
 * "id type score hex-bytes" line per piece). Returns 0 and sets *out, or a
 * negative errno with a message naming the line: -EPROTO (not such a file),
 * -EINVAL (malformed line, ids out of order, duplicate piece, missing byte
 * pieces), -ENOMEM, or the open/read error.
 */
MP_API int mp_tokenizer_open(const char *path, struct mp_tokenizer **out);
/* Frees the tokenizer. NULL is allowed. */
MP_API void mp_tokenizer_close(struct mp_tokenizer *t);

MP_API uint32_t mp_tokenizer_vocab(const struct mp_tokenizer *t);
/* Ids of the begin- and end-of-text control pieces (<s>, </s>). */
MP_API uint32_t mp_tokenizer_bos(const struct mp_tokenizer *t);
MP_API uint32_t mp_tokenizer_eos(const struct mp_tokenizer *t);

/* Piece types, numbered as SentencePiece (and GGUF's tokenizer.ggml.token_type) number them. */
enum mp_piece_type {
	MP_PIECE_NORMAL = 1,
	MP_PIECE_UNKNOWN = 2,
	MP_PIECE_CONTROL = 3,
	MP_PIECE_USER = 4,
	MP_PIECE_UNUSED = 5,
	MP_PIECE_BYTE = 6,		/* "<0xAB>": the byte 0xAB, for byte fallback */
};

struct mp_piece {
	const char *text;		/* the piece's bytes, len long (not NUL-terminated) */
	uint32_t len;
	float score;
	enum mp_piece_type type;
};

/* Piece id of the vocabulary (valid while t is open). Returns 0, or -EINVAL for an id beyond it. */
MP_API int mp_tokenizer_piece(const struct mp_tokenizer *t, uint32_t id, struct mp_piece *out);

/*
 * Encodes len bytes of text (no BOS/EOS added) into at most cap ids.
 * Returns the number of ids the text needs, which may exceed cap (then
 * only the first cap are stored: call again with a bigger buffer), or
 * -EINVAL (NULL argument), -EOVERFLOW (text longer than 256 MiB), -ENOMEM.
 * Malformed UTF-8 is read as U+FFFD, as SentencePiece does.
 */
MP_API int mp_tokenizer_encode(const struct mp_tokenizer *t, const char *text, size_t len,
			       uint32_t *ids, size_t cap);

/*
 * Decodes n ids into buf as NUL-terminated text, as SentencePiece's
 * DecodeIds does: control pieces are dropped, the leading space of the
 * first piece is removed, byte pieces are joined and invalid UTF-8 becomes
 * U+FFFD. Returns the text length (without the NUL), which may be >= cap
 * (then buf holds a truncated, NUL-terminated prefix when cap > 0), or
 * -EINVAL for a NULL argument or an id outside the vocabulary.
 */
MP_API int mp_tokenizer_decode(const struct mp_tokenizer *t, const uint32_t *ids, size_t n,
			       char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_TOKENIZER_H */
