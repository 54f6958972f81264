/* SPDX-License-Identifier: MIT */
/* Text in and out of the trained models: tokenizer lookup and fortune-format corpora. */
#ifndef MP_CLI_TEXT_H
#define MP_CLI_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include <moepager.h>

/* MODEL.tok for MODEL.mpk, where the training recipe puts it (malloc()ed, NULL: no memory). */
char *text_tokenizer_beside(const char *model_path);

/*
 * Opens the tokenizer at path, or when path is NULL the one beside the
 * model: MODEL with its ".mpk" suffix replaced by ".tok" (the training
 * recipe's export writes it there). Checks that its vocabulary equals the
 * model's. Returns 0 or a negative errno (message printed).
 */
int text_tokenizer_open(const char *path, const char *model_path, uint32_t model_vocab,
			struct mp_tokenizer **out);

/*
 * Encodes a prompt as the model was trained to see text: BOS, then the
 * pieces of text. *ids is malloc()ed. Returns 0 or a negative errno.
 */
int text_encode_prompt(const struct mp_tokenizer *t, const char *text, uint32_t **ids,
		       uint32_t *n);

/*
 * Reads a corpus in fortune(6) format (texts separated by lines holding
 * only "%") and encodes it as the recipe's token streams are built
 * (tools/train/corpus.py: encode_stream): BOS text EOS for every text.
 * *ids is malloc()ed. Returns 0 or a negative errno (message printed).
 */
int text_encode_fortunes(const struct mp_tokenizer *t, const char *path, uint32_t **ids,
			 size_t *n, uint32_t *texts);

/* Reads a token stream of little-endian uint16 ids (the recipe's .ids files). */
int text_read_ids(const char *path, uint32_t **ids, size_t *n);

#endif
