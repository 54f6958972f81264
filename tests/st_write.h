/* SPDX-License-Identifier: MIT */
/* Writes an .mpk model as a Hugging Face directory (config.json, safetensors shards), for tests. */
#ifndef MP_TEST_ST_WRITE_H
#define MP_TEST_ST_WRITE_H

#include <stdbool.h>

#include <moepager.h>

struct st_write_opts {
	const char *model_type;		/* "mixtral" (default), "qwen3_moe", "qwen2_moe" */
	unsigned shards;		/* 1 (default) or more: tensors dealt round-robin */
	const char *extra_tensor;	/* a 1-D F32 tensor of hidden values to add */
	const char *extra_config;	/* JSON object merged into config.json */
	const char *retype;		/* a tensor written with dtype `type` (zeros of its size) */
	const char *type;
};

/*
 * Writes the model at mpk (f32, f16 or bf16) into dir, which must exist,
 * under the model type's tensor names. Returns 0 or -errno.
 */
int st_write_dir(const char *mpk, const char *dir, const struct st_write_opts *o);

/*
 * Writes dir/config.json for geometry g and a model type, extra (a JSON
 * object, may be NULL) merged in. Returns 0 or -errno.
 */
int st_write_config(const char *dir, const struct mp_geometry *g, const char *type,
		    const char *extra);

#endif
