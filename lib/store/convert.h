/* SPDX-License-Identifier: MIT */
/* What an import or export changes between formats: weight types, RoPE row order, tensor names. */
#ifndef MP_STORE_CONVERT_H
#define MP_STORE_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <moepager/common.h>

/*
 * Converts n values (whole blocks of both types) of type from at src to
 * type to at dst, through f32 when the types differ (a copy when they do
 * not). Returns 0 or -ENOMEM.
 */
int mpk_convert(enum mp_dtype from, const void *src, enum mp_dtype to, void *dst, uint64_t n);

/*
 * Reorders the rows of a Q or K matrix (heads x head_dim rows of row_bytes
 * each) between the runner's rotate-half RoPE and llama.cpp's adjacent-pair
 * RoPE (architecture "llama"). to_pairs moves half-layout row j of a head to
 * 2j and row head_dim/2 + j to 2j + 1 (what llama.cpp's converter does to
 * Hugging Face weights); !to_pairs undoes it. Returns 0 or -ENOMEM.
 */
int mpk_rope_permute(void *rows, uint32_t heads, uint32_t head_dim, uint64_t row_bytes,
		     bool to_pairs);

/*
 * The GGUF name of an .mpk tensor ("blk.3.attn_o" -> "blk.3.attn_output.weight",
 * "tok_embd" -> "token_embd.weight", "blk.3.router" -> "blk.3.ffn_gate_inp.weight").
 */
void mpk_gguf_name(const char *mpk, char *out, size_t len);

#endif /* MP_STORE_CONVERT_H */
