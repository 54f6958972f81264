// SPDX-License-Identifier: MIT
/* Text in and out of the trained models: tokenizer lookup and fortune-format corpora. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "text.h"

char *text_tokenizer_beside(const char *model_path)
{
	size_t len = strlen(model_path);
	char *p = malloc(len + 5);

	if (!p)
		return NULL;
	memcpy(p, model_path, len + 1);
	if (len > 4 && !strcmp(p + len - 4, ".mpk"))
		p[len - 4] = '\0';
	strcat(p, ".tok");
	return p;
}

int text_tokenizer_open(const char *path, const char *model_path, uint32_t model_vocab,
			struct mp_tokenizer **out)
{
	char *guess = NULL;
	int err;

	if (!path) {
		guess = text_tokenizer_beside(model_path);
		if (!guess)
			return -ENOMEM;
		path = guess;
	}
	/* A guess that is not there is one line naming the option, not the library's open error. */
	if (guess && access(path, F_OK) && errno == ENOENT) {
		err = cli_error(-ENOENT, "%s: no tokenizer beside the model; give --tokenizer FILE",
				path);
		goto free_guess;
	}
	err = mp_tokenizer_open(path, out);
	if (err)
		goto free_guess;
	if (mp_tokenizer_vocab(*out) != model_vocab) {
		cli_error(0, "tokenizer %s has %u pieces, the model %u", path,
			mp_tokenizer_vocab(*out), model_vocab);
		mp_tokenizer_close(*out);
		*out = NULL;
		err = -EINVAL;
	}
free_guess:
	free(guess);
	return err;
}

/* Appends text's ids after ids[*n], growing the array. */
static int append_encoded(const struct mp_tokenizer *t, const char *text, size_t len,
			  uint32_t **ids, size_t *n, size_t *cap)
{
	int need = mp_tokenizer_encode(t, text, len, NULL, 0);
	uint32_t *nb;

	if (need < 0)
		return need;
	if (*n + need + 2 > *cap) {
		size_t ncap = (*n + need + 2) * 2;

		nb = realloc(*ids, ncap * sizeof(*nb));
		if (!nb)
			return -ENOMEM;
		*ids = nb;
		*cap = ncap;
	}
	need = mp_tokenizer_encode(t, text, len, *ids + *n, *cap - *n);
	if (need < 0)
		return need;
	*n += need;
	return 0;
}

int text_encode_prompt(const struct mp_tokenizer *t, const char *text, uint32_t **ids,
		       uint32_t *n)
{
	size_t cap = 16, cnt = 1;
	uint32_t *a = malloc(cap * sizeof(*a));
	int err;

	if (!a)
		return -ENOMEM;
	a[0] = mp_tokenizer_bos(t);
	err = append_encoded(t, text, strlen(text), &a, &cnt, &cap);
	if (err) {
		free(a);
		return err;
	}
	*ids = a;
	*n = (uint32_t)cnt;
	return 0;
}

int text_encode_fortunes(const struct mp_tokenizer *t, const char *path, uint32_t **ids,
			 size_t *n, uint32_t *texts)
{
	size_t len, cap = 0, cnt = 0;
	uint32_t *a = NULL, count = 0;
	char *buf, *p, *end;
	int err;

	err = cli_read_file(path, &buf, &len);
	if (err)
		return err;
	/* The file is text "\n%\n" text ... "\n": drop the final newline, split on "\n%\n". */
	if (len && buf[len - 1] == '\n')
		buf[--len] = '\0';
	for (p = buf; len && p <= buf + len; p = end + 3) {
		end = strstr(p, "\n%\n");
		if (!end)
			end = buf + len;
		if (cnt + 1 > cap || !a) {
			uint32_t *nb = realloc(a, (cap = cap * 2 + 64) * sizeof(*a));

			if (!nb) {
				err = -ENOMEM;
				goto fail;
			}
			a = nb;
		}
		a[cnt++] = mp_tokenizer_bos(t);
		err = append_encoded(t, p, end - p, &a, &cnt, &cap);
		if (err)
			goto fail;
		a[cnt++] = mp_tokenizer_eos(t);
		count++;
		if (end == buf + len)
			break;
	}
	free(buf);
	if (!count) {
		cli_error(0, "%s: no text", path);
		free(a);
		return -EINVAL;
	}
	*ids = a;
	*n = cnt;
	*texts = count;
	return 0;
fail:
	cli_fail(err, "%s: encoding failed", path);
	free(a);
	free(buf);
	return err;
}

int text_read_ids(const char *path, uint32_t **ids, size_t *n)
{
	size_t len;
	char *buf;
	uint32_t *a;
	int err = cli_read_file(path, &buf, &len);

	if (err)
		return err;
	if (len % 2) {
		cli_error(0, "%s: %zu bytes is not a whole number of uint16 ids", path, len);
		free(buf);
		return -EINVAL;
	}
	a = malloc((len / 2 + 1) * sizeof(*a));
	if (!a) {
		free(buf);
		return -ENOMEM;
	}
	for (size_t i = 0; i < len / 2; i++)
		a[i] = (uint8_t)buf[2 * i] | (uint32_t)(uint8_t)buf[2 * i + 1] << 8;
	free(buf);
	*ids = a;
	*n = len / 2;
	return 0;
}
