// SPDX-License-Identifier: MIT
/*
 * XXH3 compiled for AVX2 (xxhash's own AVX2 path, inlined here): the packaged
 * libxxhash is built for SSE2 and hashes a 2.3 MiB expert just read from the
 * device in about 0.43 ms against 0.23 ms here (docs/region.md), on the fill
 * threads that share the cores with the engine. Called only when the CPU
 * has AVX2 (hash.c).
 */
#include <stddef.h>
#include <stdint.h>
#include <immintrin.h>

#include "base/hash.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

size_t mp_hash_avx2_size(void)
{
	return sizeof(XXH3_state_t);
}

void mp_hash_avx2_reset(void *st)
{
	XXH3_64bits_reset(st);
}

void mp_hash_avx2_update(void *st, const void *buf, size_t len)
{
	XXH3_64bits_update(st, buf, len);
}

uint64_t mp_hash_avx2_digest(const void *st)
{
	return XXH3_64bits_digest(st);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
