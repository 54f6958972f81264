// SPDX-License-Identifier: MIT
/* XXH3 streaming: libxxhash, or its AVX2 build (hash_avx2.c) when the CPU has AVX2. */
#include <stdbool.h>
#include <stdlib.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "base/base.h"
#include "base/hash.h"

#define STATE_ALIGN 64u

struct hash_ops {
	const char *name;
	size_t (*size)(void);
	void (*reset)(void *st);
	void (*update)(void *st, const void *buf, size_t len);
	uint64_t (*digest)(const void *st);
};

struct mp_hash {
	const struct hash_ops *ops;
	void *st;	/* an XXH3_state_t of the build in use */
};

static size_t lib_size(void)
{
	return sizeof(XXH3_state_t);
}

static void lib_reset(void *st)
{
	XXH3_64bits_reset(st);
}

static void lib_update(void *st, const void *buf, size_t len)
{
	XXH3_64bits_update(st, buf, len);
}

static uint64_t lib_digest(const void *st)
{
	return XXH3_64bits_digest(st);
}

static const struct hash_ops *pick(enum mp_hash_build b)
{
	static const struct hash_ops lib = { "lib", lib_size, lib_reset, lib_update,
					     lib_digest };
#if defined(MP_HAVE_HASH_AVX2)
	static const struct hash_ops avx2 = { "avx2", mp_hash_avx2_size, mp_hash_avx2_reset,
					      mp_hash_avx2_update, mp_hash_avx2_digest };

	/* Also checks that the OS saves the vector state. */
	if (b != MP_HASH_LIB && __builtin_cpu_supports("avx2"))
		return &avx2;
#endif
	return b == MP_HASH_AVX2 ? NULL : &lib;
}

struct mp_hash *mp_hash_new(void)
{
	return mp_hash_new_build(MP_HASH_BEST);
}

const char *mp_hash_build_name(const struct mp_hash *h)
{
	return h->ops->name;
}

struct mp_hash *mp_hash_new_build(enum mp_hash_build b)
{
	const struct hash_ops *ops = pick(b);
	struct mp_hash *h = ops ? calloc(1, sizeof(*h)) : NULL;

	if (!h)
		return NULL;
	h->ops = ops;
	h->st = aligned_alloc(STATE_ALIGN, MP_ALIGN_UP(h->ops->size(), STATE_ALIGN));
	if (!h->st) {
		free(h);
		return NULL;
	}
	h->ops->reset(h->st);
	return h;
}

void mp_hash_free(struct mp_hash *h)
{
	if (!h)
		return;
	free(h->st);
	free(h);
}

void mp_hash_reset(struct mp_hash *h)
{
	h->ops->reset(h->st);
}

void mp_hash_update(struct mp_hash *h, const void *buf, size_t len)
{
	h->ops->update(h->st, buf, len);
}

uint64_t mp_hash_digest(const struct mp_hash *h)
{
	return h->ops->digest(h->st);
}
