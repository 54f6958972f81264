// SPDX-License-Identifier: MIT
/* What import and export change between formats: weight types through f32, RoPE row order, names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "store/convert.h"

/* Values converted per step: whole blocks of every type, 256 KiB of f32 scratch. */
#define STEP	(64u << 10)

int mpk_convert(enum mp_dtype from, const void *src, enum mp_dtype to, void *dst, uint64_t n)
{
	float *f;

	if (from == to) {
		memcpy(dst, src, mp_dtype_bytes(from, n));
		return 0;
	}
	f = malloc(STEP * sizeof(*f));
	if (!f)
		return mp_err(-ENOMEM, "out of memory converting %s to %s", mp_dtype_name(from),
			      mp_dtype_name(to));
	for (uint64_t i = 0; i < n; i += STEP) {
		uint64_t k = MP_MIN((uint64_t)STEP, n - i);

		mp_dtype_to_f32(from, (const char *)src + mp_dtype_bytes(from, i), f, k);
		mp_dtype_from_f32(to, f, (char *)dst + mp_dtype_bytes(to, i), k);
	}
	free(f);
	return 0;
}

int mpk_rope_permute(void *rows, uint32_t heads, uint32_t head_dim, uint64_t row_bytes,
		     bool to_pairs)
{
	const uint32_t half = head_dim / 2;
	const uint64_t head_bytes = head_dim * row_bytes;
	char *copy = malloc(head_bytes);

	if (!copy)
		return mp_err(-ENOMEM, "out of memory permuting RoPE rows");
	for (uint32_t h = 0; h < heads; h++) {
		char *head = (char *)rows + h * head_bytes;

		memcpy(copy, head, head_bytes);
		for (uint32_t j = 0; j < head_dim; j++) {
			/* half layout: row j < half pairs with row j + half */
			uint32_t pair = j < half ? 2 * j : 2 * (j - half) + 1;
			uint32_t to = to_pairs ? pair : j, from = to_pairs ? j : pair;

			memcpy(head + to * row_bytes, copy + from * row_bytes, row_bytes);
		}
	}
	free(copy);
	return 0;
}

void mpk_gguf_name(const char *mpk, char *out, size_t len)
{
	static const char *const map[][2] = {
		{ "tok_embd", "token_embd" }, { "attn_o", "attn_output" },
		{ "router", "ffn_gate_inp" },
	};
	const char *dot = strrchr(mpk, '.');
	const char *base = dot ? dot + 1 : mpk;
	int prefix = dot ? (int)(dot + 1 - mpk) : 0;

	for (size_t i = 0; i < MP_ARRAY_SIZE(map); i++)
		if (!strcmp(base, map[i][0]))
			base = map[i][1];
	snprintf(out, len, "%.*s%s.weight", prefix, mpk, base);
}
