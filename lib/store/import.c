// SPDX-License-Identifier: MIT
/* The common step of every import: a source's tensors and experts streamed into an .mpk. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "store/convert.h"
#include "store/import.h"

/* The runner rotates halves: a source in adjacent-pair order gets its Q and K rows reordered. */
static int fix_rope(const struct import_src *src, const struct mp_tensor_info *t, void *buf)
{
	const struct mp_geometry *g = &src->g;
	const char *dot = strrchr(t->name, '.');
	uint32_t heads;

	if (!src->rope_pairs || !dot || (strcmp(dot, ".attn_q") && strcmp(dot, ".attn_k")))
		return 0;
	heads = !strcmp(dot, ".attn_q") ? g->heads : g->kv_heads;
	return mpk_rope_permute(buf, heads, g->head_dim, mp_dtype_bytes(t->dtype, t->dims[1]),
				false);
}

static int put_tensors(struct mp_store_writer *w, const struct import_src *src,
		       const struct mp_import_config *cfg, uint64_t *done, uint64_t total)
{
	uint32_t n = mp_store_writer_tensor_count(w);
	uint64_t max = 0;
	void *buf;
	int err = 0;

	for (uint32_t i = 0; i < n; i++)
		max = MP_MAX(max, mp_store_writer_tensor_at(w, i)->bytes);
	buf = malloc(max ? max : 1);
	if (!buf)
		return mp_err(-ENOMEM, "%s: out of memory for a %llu-byte tensor", src->path,
			      (unsigned long long)max);
	for (uint32_t i = 0; i < n && !err; i++) {
		const struct mp_tensor_info *t = mp_store_writer_tensor_at(w, i);

		err = src->tensor(src->ctx, t, buf);
		if (!err)
			err = fix_rope(src, t, buf);
		if (!err)
			err = mp_store_writer_put_tensor(w, t->name, buf);
		*done += t->bytes;
		if (!err && cfg && cfg->progress)
			cfg->progress(*done, total, cfg->arg);
	}
	free(buf);
	return err;
}

static int put_experts(struct mp_store_writer *w, const struct import_src *src,
		       const struct mp_import_config *cfg, uint64_t *done, uint64_t total)
{
	const struct mp_geometry *g = &src->g;
	uint64_t eb = mp_geometry_expert_bytes(g);
	void *buf = NULL;
	int err = 0;

	/* page-aligned: the writer hands it to O_DIRECT without a copy */
	if (posix_memalign(&buf, 4096, eb))
		return mp_err(-ENOMEM, "%s: out of memory for a %llu-byte expert", src->path,
			      (unsigned long long)eb);
	for (uint32_t l = 0; l < g->layers && !err; l++) {
		for (uint32_t e = 0; e < g->experts && !err; e++) {
			err = src->expert(src->ctx, l, e, buf);
			if (!err)
				err = mp_store_writer_put_expert(w, l, e, buf);
			*done += eb;
			if (!err && cfg && cfg->progress)
				cfg->progress(*done, total, cfg->arg);
		}
	}
	free(buf);
	return err;
}

int mpk_import_args(const char *fn, const char *src, const char *out,
		    const struct mp_import_config *cfg)
{
	int err;

	if (!src || !out)
		return mp_err(-EINVAL, "%s: NULL path", fn);
	if (cfg && (err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved),
					    "import config")))
		return err;
	if (cfg && cfg->dtype >= (int)MP_DTYPE_COUNT)
		return mp_err(-EINVAL, "%s: unknown weight type %d", src, cfg->dtype);
	return 0;
}

int mpk_import_geometry(const struct import_src *src)
{
	char why[512];
	int err = mp_geometry_check(&src->g);

	if (!err)
		return 0;
	snprintf(why, sizeof(why), "%s", mp_last_error());
	return mp_err(err, "%s: the model does not fit the runner: %s", src->path, why);
}

int mpk_import_write(const char *path, const struct import_src *src,
		     const struct mp_import_config *cfg)
{
	struct mp_store_writer *w;
	uint64_t done = 0, total;
	int err;

	err = mp_store_writer_create(path, &src->g, src->name, &w);
	if (err)
		return err;
	total = (uint64_t)src->g.layers * src->g.experts * mp_geometry_expert_bytes(&src->g);
	for (uint32_t i = 0; i < mp_store_writer_tensor_count(w); i++)
		total += mp_store_writer_tensor_at(w, i)->bytes;
	err = put_tensors(w, src, cfg, &done, total);
	if (!err)
		err = put_experts(w, src, cfg, &done, total);
	if (err) {
		mp_store_writer_abort(w);
		return err;
	}
	return mp_store_writer_finish(w);
}
