// SPDX-License-Identifier: MIT
/* The resident expert source: every expert read into anonymous memory, no paging. */
#include <stdlib.h>
#include <string.h>

#include <moepager/engine.h>
#include <moepager/store.h>
#include <moepager/runner.h>
#include <moepager/source.h>

#include "base/base.h"

struct mp_resident {
	void *mem;
	size_t len;
	uint64_t stride;	/* expert bytes rounded up to a page */
	uint64_t bytes;		/* of an expert */
	uint32_t layers;
	uint32_t experts;
	uint32_t hidden, ffn;
	enum mp_dtype dtype;
	bool packed;		/* every expert in the engine's packed layout (mp_resident_pack()) */
	bool broken;		/* a pack failed part way: experts of both layouts */
};

int mp_resident_open(struct mp_store *s,
		     void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg,
		     struct mp_resident **out)
{
	const struct mp_geometry *g;
	struct mp_resident *r;
	uint64_t total;
	int err;

	if (!s || !out)
		return mp_err(-EINVAL, "resident source: NULL %s", s ? "out" : "store");
	g = mp_store_geometry(s);
	r = calloc(1, sizeof(*r));
	if (!r)
		return mp_err(-ENOMEM, "resident source: out of memory");
	r->layers = g->layers;
	r->experts = g->experts;
	r->hidden = g->hidden;
	r->ffn = g->ffn;
	r->dtype = g->dtype;
	r->bytes = mp_store_expert_bytes(s);
	r->stride = MP_ALIGN_UP(mp_store_expert_bytes(s), 4096);
	r->len = (size_t)r->stride * g->layers * g->experts;
	total = mp_store_expert_bytes(s) * g->layers * g->experts;
	/* Huge pages: the engine streams whole experts, TLB misses would cost bandwidth. */
	r->mem = mp_huge_map(r->len);
	if (!r->mem) {
		err = mp_err(-ENOMEM, "resident source: cannot map %zu bytes for the experts of %s",
			     r->len, mp_store_path(s));
		goto free_source;
	}
	for (uint32_t l = 0; l < g->layers; l++) {
		for (uint32_t e = 0; e < g->experts; e++) {
			uint64_t idx = (uint64_t)l * g->experts + e;

			err = mp_store_read_expert(s, l, e, (char *)r->mem + idx * r->stride);
			if (err)
				goto unmap;
			if (progress)
				progress((idx + 1) * mp_store_expert_bytes(s), total, arg);
		}
	}
	*out = r;
	return 0;

unmap:
	mp_huge_unmap(r->mem, r->len);
free_source:
	free(r);
	return err;
}

int mp_resident_pack(struct mp_resident *r, struct mp_engine *e)
{
	uint64_t i;
	void *tmp;
	int err = 0;

	if (!r || !e)
		return mp_err(-EINVAL, "resident source: pack: NULL %s", r ? "engine" : "source");
	if (r->broken)
		return mp_err(-EIO, "resident source: pack: a pack failed part way before");
	if (r->packed)
		return 0;
	if (!mp_engine_packs(e, r->dtype))
		return -EOPNOTSUPP;
	tmp = malloc(r->bytes);
	if (!tmp)
		return mp_err(-ENOMEM, "resident source: pack: out of memory");
	/* Each expert whole or not at all: packed aside, copied back only once done. */
	for (i = 0; i < (uint64_t)r->layers * r->experts && !err; i++) {
		char *x = (char *)r->mem + i * r->stride;

		err = mp_engine_pack_expert(e, r->dtype, x, r->hidden, r->ffn, tmp);
		if (!err)
			memcpy(x, tmp, r->bytes);
	}
	free(tmp);
	if (!err) {
		r->packed = true;
		return 0;
	}
	/* Past the first expert some are packed and some not: no reader may have either. */
	r->broken = i > 1;
	return mp_err(err, "resident source: pack failed at expert %llu of %llu%s: %s",
		      (unsigned long long)(i - 1), (unsigned long long)r->layers * r->experts,
		      r->broken ? " (the source serves no expert now)" : "", strerror(-err));
}

void mp_resident_close(struct mp_resident *r)
{
	if (!r)
		return;
	mp_huge_unmap(r->mem, r->len);
	free(r);
}

static const void *resident_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	struct mp_resident *r = ctx;

	if (r->broken) {
		mp_err(-EIO, "resident source: experts left half packed by a failed pack");
		return NULL;
	}
	if (layer >= r->layers || expert >= r->experts) {
		mp_err(-ERANGE, "resident source: no layer %u expert %u (%u x %u)", layer, expert,
		       r->layers, r->experts);
		return NULL;
	}
	return (const char *)r->mem + ((uint64_t)layer * r->experts + expert) * r->stride;
}

/* Every expert is in memory. */
static int resident_resident(void *ctx, uint32_t layer, uint32_t expert)
{
	(void)ctx;
	(void)layer;
	(void)expert;
	return 1;
}

static int resident_packed(void *ctx)
{
	const struct mp_resident *r = ctx;

	return r && r->packed;
}

static const struct mp_expert_source_ops resident_ops = {
	.expert = resident_expert,
	.resident = resident_resident,
	.packed = resident_packed,
};

const struct mp_expert_source_ops *mp_resident_source_ops(void)
{
	return &resident_ops;
}
