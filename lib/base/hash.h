/* SPDX-License-Identifier: MIT */
/* XXH3-64 of a byte stream, the .mpk checksums: vectorised for the CPU at run time; never installed. */
#ifndef MP_BASE_HASH_H
#define MP_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

struct mp_hash;

/* A new streaming state (NULL when out of memory); the same digests as libxxhash's XXH3_64bits. */
struct mp_hash *mp_hash_new(void);

enum mp_hash_build {
	MP_HASH_BEST,		/* what mp_hash_new() picks for this CPU */
	MP_HASH_LIB,		/* libxxhash's, as packaged */
	MP_HASH_AVX2,
};

/* A state of that build: NULL when out of memory or not in this library or CPU (tests). */
struct mp_hash *mp_hash_new_build(enum mp_hash_build b);
/* "lib" or "avx2": the build h runs. */
const char *mp_hash_build_name(const struct mp_hash *h);
void mp_hash_free(struct mp_hash *h);
void mp_hash_reset(struct mp_hash *h);
void mp_hash_update(struct mp_hash *h, const void *buf, size_t len);
uint64_t mp_hash_digest(const struct mp_hash *h);

/* The AVX2 build of XXH3 (hash_avx2.c): state size and steps, for hash.c only. */
size_t mp_hash_avx2_size(void);
void mp_hash_avx2_reset(void *st);
void mp_hash_avx2_update(void *st, const void *buf, size_t len);
uint64_t mp_hash_avx2_digest(const void *st);

#endif /* MP_BASE_HASH_H */
